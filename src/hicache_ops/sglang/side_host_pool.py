"""The host (L2) pools SGLang allocates for side pools, next to one rank's KV host pool.

For a `PoolSpec` and the main `HostPoolLayout`: the pool's buffers (shapes, dtypes), its size in
slots and pages, bytes per slot and page, and the byte ranges each page hands to Mooncake
(SGLang's `get_page_buffer_meta`) tagged with the object suffix (`pool_suffixes`) they go to.

Three kinds of host pool (docs/side-pools.md#side-host-pools):
- a KV host pool of its own geometry (`swa`, `draft`, `draft_swa`): SGLang's MHA/MLA host pool
  classes, so `HostPoolLayout` computes it; only the sizing differs per pool and version;
- the Mamba state pool (`mamba`): one slot per page key, temporal and conv state buffers;
- the DSA indexer pool (`indexer`, `draft_indexer`): one packed uint8 row per page and layer,
  laid out on the slots of its anchor KV host pool.
DeepSeek V4 pools are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import ModelGeometry, positive_int
from hicache_ops.sglang.host_pool import BufferSpec, HostPoolLayout, PageObject
from hicache_ops.sglang.page_keys import ObjectKeyScheme
from hicache_ops.sglang.side_pool_specs import PoolSpec, check_pool, pool_suffixes
from hicache_ops.sglang.versions import V0_5_14, V0_5_23, family

# Layouts SGLang's Mamba host pool accepts, per version (anything else raises at start-up).
MAMBA_LAYOUTS = {V0_5_14: ("page_first_direct",), V0_5_23: ("page_first", "page_first_direct")}
_MAMBA_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# DSA indexer rows: 128 fp8 key bytes plus one fp32 scale per 128-element block, per token and layer.
DSA_INDEX_HEAD_DIM = 128
DSA_QUANT_BLOCK = 128
DSA_BYTES_PER_TOKEN_LAYER = DSA_INDEX_HEAD_DIM + DSA_INDEX_HEAD_DIM // DSA_QUANT_BLOCK * 4
DSA_PAGE_SIZE = 64
# Mamba device slots when not given: SGLang sizes that pool from free GPU memory (it logs
# max_mamba_cache_size at start-up), so any default is an assumption the report names.
DEFAULT_MAMBA_SLOTS = 256  # SGLang's DSA device pool asserts 64-token pages (CUDA)
PAGE_FIRST = ("page_first", "page_first_direct")
_KV_POOLS = ("swa", "draft", "draft_swa")
_INDEXER_POOLS = ("indexer", "draft_indexer")
# Options each pool kind reads for its buffers; any other layout option is refused.
_LAYOUT_OPTIONS = {
    "swa": {"layers", "tokens", "heads", "head_dim"},
    "draft": {"layers", "tokens", "heads", "head_dim"},
    "draft_swa": {"layers", "tokens", "heads", "head_dim"},
    "mamba": {"layers", "tokens", "conv_shapes", "temporal_shape", "conv_dtype", "temporal_dtype"},
    "indexer": {"layers"},
    "draft_indexer": {"layers"},
}
_ALL_LAYOUT_OPTIONS = (
    "layers",
    "tokens",
    "heads",
    "head_dim",
    "conv_shapes",
    "temporal_shape",
    "conv_dtype",
    "temporal_dtype",
)

if TYPE_CHECKING:
    from hicache_ops.sglang.views import SideHostPoolView, SideObjectView, SidePageMetaView


@dataclass(frozen=True)
class SideObject:
    """One byte range of a side-pool page and the object (suffix) it is written to."""

    suffix: str
    range: PageObject

    def view(self) -> SideObjectView:
        from hicache_ops.sglang.views import SideObjectView

        return SideObjectView(suffix=self.suffix, **dict(self.range.view()))


@dataclass(frozen=True)
class SidePageMeta:
    index: int
    objects: tuple[SideObject, ...]

    def view(self) -> SidePageMetaView:
        from hicache_ops.sglang.views import SidePageMetaView

        return SidePageMetaView(index=self.index, objects=[o.view() for o in self.objects])


@dataclass(frozen=True)
class SideHostPool:
    """One side pool's host buffers on one rank and what a page sends to Mooncake.

    `page_size` is slots per page (Mamba: 1); `device_slots` the device pool it mirrors (None
    when it follows another host pool's slots). `zero_copy` False: SGLang's page metadata
    raises for this layout, so no byte ranges are given.
    """

    name: str
    sglang_class: str
    layout: str
    page_size: int
    size: int
    page_num: int
    bytes_per_slot: int
    buffers: tuple[BufferSpec, ...]
    suffixes: tuple[str, ...]
    device_slots: int | None
    zero_copy: bool
    shapes: dict[str, Any]
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    _pager: Callable[[int], tuple[SideObject, ...]] | None = field(default=None, repr=False, compare=False)

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_slot * self.page_size

    @property
    def host_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def page_objects(self, page: int) -> tuple[SideObject, ...]:
        if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < self.page_num:
            raise InputError(f"page {page!r} is outside pool {self.name}'s pages 0..{self.page_num - 1}.")
        return self._pager(page) if self._pager and self.zero_copy else ()

    def page_buffer_meta(self, pages: Iterable[int]) -> list[SidePageMeta]:
        return [SidePageMeta(p, self.page_objects(p)) for p in pages]

    def flat_meta(self, pages: Iterable[int]) -> tuple[list[int], list[int]]:
        """(offsets from each range's buffer start, sizes) over pages: SGLang's (pointers, sizes)."""
        objs = [o.range for meta in self.page_buffer_meta(pages) for o in meta.objects]
        return [o.offset for o in objs], [o.size for o in objs]

    @property
    def objects_per_page(self) -> int:
        return len(self.page_objects(0)) if self.zero_copy else 0

    def view(self) -> SideHostPoolView:
        from hicache_ops.sglang.views import SideHostPoolView

        return SideHostPoolView(
            name=self.name,
            sglang_class=self.sglang_class,
            layout=self.layout,
            page_size=self.page_size,
            size_slots=self.size,
            page_num=self.page_num,
            device_slots=self.device_slots,
            bytes_per_slot=self.bytes_per_slot,
            bytes_per_page=self.bytes_per_page,
            host_bytes=self.host_bytes,
            shapes=self.shapes,
            buffers=[b.view() for b in self.buffers],
            suffixes=list(self.suffixes),
            zero_copy=self.zero_copy,
            objects_per_page=self.objects_per_page,
            notes=list(self.notes),
            warnings=list(self.warnings),
        )


def _check_options(spec: PoolSpec) -> None:
    allowed = _LAYOUT_OPTIONS.get(spec.name, set())
    given = [k for k in _ALL_LAYOUT_OPTIONS if getattr(spec, k) is not None]
    wrong = [k for k in given if k not in allowed]
    if wrong:
        raise InputError(
            f"pool {spec.name}: {', '.join(wrong)} does not describe its host pool"
            + (f" (it takes {', '.join(sorted(allowed))})." if allowed else ".")
        )


def _per_rank(dims: tuple[int, ...], tp_size: int, what: str) -> tuple[int, ...]:
    """SGLang shards a Mamba state's first dimension over the attention-TP ranks."""
    if not dims:
        return dims
    if dims[0] % tp_size:
        raise InputError(
            f"pool mamba: {what} first dimension {dims[0]} does not split evenly over tp-size {tp_size} "
            "(SGLang then pads the groups, which is not modelled)."
        )
    return (dims[0] // tp_size, *dims[1:])


# --- KV-shaped side pools (swa, draft, draft_swa) -----------------------------------------------


def _side_geometry(spec: PoolSpec, main: ModelGeometry, mla: bool, default_layers: int) -> ModelGeometry:
    layers = spec.layers or default_layers
    if mla:
        if not main.mla:
            raise InputError(f"pool {spec.name}: an MLA pool takes the model's latent row; the KV geometry is MHA.")
        if spec.heads is not None or spec.head_dim is not None:
            raise InputError(f"pool {spec.name}: heads and head_dim describe an MHA pool; this one is MLA.")
        return ModelGeometry.mla_model(layers, main.kv_lora_rank, main.qk_rope_head_dim, main.dtype)
    heads = spec.heads or (None if main.mla else main.kv_heads)
    head_dim = spec.head_dim or (None if main.mla else main.head_dim)
    if heads is None or head_dim is None:
        raise InputError(
            f"pool {spec.name}: an MHA pool on an MLA model needs its own heads and head size.",
            hint=f"Pass --pool {spec.name}:attention=mha,heads=N,head_dim=D (the draft model's KV heads and head "
            "size).",
        )
    return ModelGeometry.mha(layers, heads, head_dim, main.dtype)


def _kv_side_pool(spec: PoolSpec, kv: HostPoolLayout, suffixes: list[str], swa_tokens: int) -> SideHostPool:
    version, main = kv.sglang_version, kv.geometry
    notes: list[str] = []
    if spec.name == "swa":
        mla = main.mla
        if spec.layers is None:
            notes.append(
                f"swa layers: all {main.layers} of the model (pass swa:layers=N for the sliding-window layers only)."
            )
        geo = _side_geometry(spec, main, mla, main.layers)
        tokens = swa_tokens
        if spec.tokens is None:
            notes.append(
                f"SWA device pool: {tokens} tokens assumed (SGLang sizes it by --swa-full-tokens-ratio; "
                "pass swa:tokens=N from its start-up log)."
            )
        if family(version) == V0_5_23 and kv.hicache_size_gb > 0:
            raise InputError(
                "pool swa with --hicache-size on SGLang 0.5.23: the GB are split between the KV and SWA host pools "
                "by device-pool bytes, which is not modelled.",
                hint="Use --hicache-ratio to see the SWA host pool.",
            )
        side = HostPoolLayout(
            geo,
            kv.layout,
            kv.page_size,
            tokens,
            hicache_ratio=kv.hicache_ratio,
            hicache_size_gb=kv.hicache_size_gb,
            tp_size=kv.tp_size,
            sglang_version=version,
            mooncake=kv.mooncake,
        )
        sizing = "sized like the KV host pool from its own device pool"
    else:  # draft, draft_swa: one layer unless told, slots follow the target's host pool
        mla = (spec.attention or ("mla" if main.mla else "mha")) == "mla"
        geo = _side_geometry(spec, main, mla, 1)
        if spec.layers is None:
            notes.append(f"{spec.name} layers: 1 (EAGLE/MTP drafts have one; pass {spec.name}:layers=N).")
        tokens = spec.tokens or (kv.device_tokens if spec.name == "draft" else swa_tokens)
        if spec.name == "draft" and family(version) == V0_5_23:
            side = HostPoolLayout(
                geo,
                kv.layout,
                kv.page_size,
                tokens,
                tp_size=kv.tp_size,
                sglang_version=version,
                mooncake=kv.mooncake,
                host_tokens=kv.size,
            )
            sizing = "exactly the KV host pool's slots (host_token_capacity)"
        else:
            # 0.5.14 draft, draft_swa: ratio = the target host pool's size over the draft device pool.
            target = kv.size if spec.name == "draft" else _swa_host_size(kv, swa_tokens)
            side = HostPoolLayout(
                geo,
                kv.layout,
                kv.page_size,
                tokens,
                hicache_ratio=target / tokens,
                tp_size=kv.tp_size,
                sglang_version=version,
                mooncake=kv.mooncake,
            )
            sizing = f"int(device slots x {target} / device slots), plus one page"
    host_class = "MLATokenToKVPoolHost" if geo.mla else "MHATokenToKVPoolHost"

    def pager(page: int) -> tuple[SideObject, ...]:
        out = []
        for obj in side.page_objects(page):
            suffix = suffixes[1] if obj.part == "v" else suffixes[0]
            out.append(SideObject(suffix, obj))
        return tuple(out)

    shapes = {"layers": geo.layers, "attention": "mla" if geo.mla else "mha", "dtype": geo.dtype}
    if geo.mla:
        shapes["kv_cache_dim"] = geo.kv_cache_dim
    else:
        shapes.update(kv_heads=geo.kv_heads, heads_per_rank=side.heads_per_rank, head_dim=geo.head_dim)
    return SideHostPool(
        name=spec.name,
        sglang_class=host_class,
        layout=side.layout,
        page_size=side.page_size,
        size=side.size,
        page_num=side.page_num,
        bytes_per_slot=side.bytes_per_token,
        buffers=tuple(side.buffers),
        suffixes=tuple(suffixes),
        device_slots=tokens,
        zero_copy=side.mooncake_zero_copy,
        shapes=shapes,
        notes=(f"size: {sizing}.", *notes),
        warnings=tuple(side.warnings()),
        _pager=pager,
    )


def _swa_host_size(kv: HostPoolLayout, swa_tokens: int) -> int:
    """The target SWA host pool's slots, which a draft_swa pool follows."""
    return HostPoolLayout(
        kv.geometry,
        kv.layout,
        kv.page_size,
        swa_tokens,
        hicache_ratio=kv.hicache_ratio,
        tp_size=kv.tp_size,
        sglang_version=kv.sglang_version,
    ).size


# --- Mamba -----------------------------------------------------------------------------------------


def _mamba_pool(spec: PoolSpec, kv: HostPoolLayout, suffixes: list[str]) -> SideHostPool:
    version = kv.sglang_version
    missing = [k for k in ("layers", "conv_shapes") if getattr(spec, k) is None]
    if spec.temporal and spec.temporal_shape is None:
        missing.append("temporal_shape")
    if missing:
        raise InputError(
            f"pool mamba: inspect layout needs the Mamba state's {', '.join(missing)}.",
            hint="Use --pool-preset qwen3-next, or --pool mamba:layers=N,conv_shapes=AxB,temporal_shape=HxDxS "
            "(shapes at tp-size 1).",
        )
    assert spec.layers is not None and spec.conv_shapes is not None  # else `missing` raised above
    if len(spec.conv_shapes) != spec.conv:
        raise InputError(f"pool mamba: conv={spec.conv} but {len(spec.conv_shapes)} conv_shapes.")
    if kv.layout not in MAMBA_LAYOUTS[family(version)]:
        raise InputError(
            f"SGLang {version}'s Mamba host pool refuses the {kv.layout} layout (it takes "
            f"{' or '.join(MAMBA_LAYOUTS[family(version)])}), so the server would not start.",
            hint="Run with --hicache-mem-layout page_first_direct --hicache-io-backend direct.",
        )
    L, tp = spec.layers, kv.tp_size
    conv_shapes = [_per_rank(s, tp, f"conv_shapes[{i}]") for i, s in enumerate(spec.conv_shapes)]
    # spec.temporal_shape is set whenever spec.temporal is (else `missing` raised above)
    temporal_shape = (
        _per_rank(spec.temporal_shape, tp, "temporal_shape")
        if spec.temporal and spec.temporal_shape is not None
        else (0,)
    )
    conv_dtype = spec.conv_dtype or "bfloat16"
    temporal_dtype = spec.temporal_dtype or "float32"
    conv_isz, temporal_isz = _MAMBA_ITEMSIZE[conv_dtype], _MAMBA_ITEMSIZE[temporal_dtype]
    temporal_elems = math.prod(temporal_shape)
    conv_elems = [math.prod(s) for s in conv_shapes]
    per_slot = L * (temporal_elems * temporal_isz + sum(conv_elems) * conv_isz)
    device = spec.tokens or DEFAULT_MAMBA_SLOTS
    warnings: list[str] = []
    if kv.hicache_size_gb > 0:
        if family(version) == V0_5_23:
            raise InputError(
                "pool mamba with --hicache-size on SGLang 0.5.23: the GB are split between the KV and Mamba host "
                "pools by device-pool bytes, which is not modelled.",
                hint="Use --hicache-ratio to see the Mamba host pool.",
            )
        size = int(kv.hicache_size_gb * 1e9 // per_slot)
    else:
        size = int(device * kv.hicache_ratio)
    page_num = size + 1  # one slot per page, plus one
    if page_num <= device:
        if family(version) == V0_5_14:
            raise InputError(
                f"a Mamba host pool of {page_num} slots is not larger than the device pool ({device} slots), "
                "which SGLang 0.5.14 refuses at start-up.",
                hint="Raise --hicache-ratio above 1 or --hicache-size.",
            )
        warnings.append(f"the Mamba host pool ({page_num} slots) is not larger than the device pool ({device} slots).")
    buffers = [BufferSpec("temporal_buffer", (page_num, L, 1, *temporal_shape), temporal_dtype, temporal_isz)]
    buffers += [
        BufferSpec(f"conv_buffer[{i}]", (page_num, L, 1, *shape), conv_dtype, conv_isz)
        for i, shape in enumerate(conv_shapes)
    ]
    # SGLang 0.5.23 leaves an empty temporal state out of the page (and its key); 0.5.14 always lists it.
    components = (
        [("temporal", "temporal_buffer", L * temporal_elems * temporal_isz)]
        if temporal_elems or family(version) == V0_5_14
        else []
    )
    components += [(f"conv_{i}", f"conv_buffer[{i}]", L * n * conv_isz) for i, n in enumerate(conv_elems)]

    def pager(slot: int) -> tuple[SideObject, ...]:
        return tuple(
            SideObject(suffix, PageObject(buffer, slot * size_, size_, part))
            for suffix, (part, buffer, size_) in zip(suffixes, components, strict=True)
        )

    shapes = {
        "layers": L,
        "conv_shapes": [list(s) for s in conv_shapes],
        "temporal_shape": list(temporal_shape),
        "conv_dtype": conv_dtype,
        "temporal_dtype": temporal_dtype,
    }
    notes = ["one slot per page key (page size 1): a request's state at a page boundary."]
    if spec.tokens is None:
        notes.append(
            f"Mamba device pool: {device} slots assumed (SGLang sizes it from free GPU memory and logs "
            "max_mamba_cache_size at start-up; pass --pool mamba:tokens=N)."
        )
    if family(version) == V0_5_23:
        notes.append("0.5.23 MTP drafts can add layers to this pool (mtp_draft_buffer_infos); not modelled.")
    return SideHostPool(
        name="mamba",
        sglang_class="MambaPoolHost",
        layout=kv.layout,
        page_size=1,
        size=page_num,
        page_num=page_num,
        bytes_per_slot=per_slot,
        buffers=tuple(buffers),
        suffixes=tuple(suffixes),
        device_slots=device,
        zero_copy=True,
        shapes=shapes,
        notes=tuple(notes),
        warnings=tuple(warnings),
        _pager=pager,
    )


# --- DSA indexer -----------------------------------------------------------------------------------


def _indexer_pool(spec: PoolSpec, kv: HostPoolLayout, anchor: HostPoolLayout, suffixes: list[str]) -> SideHostPool:
    if not kv.geometry.mla:
        raise InputError(f"pool {spec.name}: DSA indexer pools ride on an MLA KV pool; add --mla (or an MLA --preset).")
    if kv.page_size != DSA_PAGE_SIZE:
        raise InputError(
            f"pool {spec.name}: SGLang's DSA device pool needs --page-size {DSA_PAGE_SIZE} (got {kv.page_size}).",
        )
    L = spec.layers or anchor.geometry.layers
    ps = anchor.page_size
    stride = ps * DSA_BYTES_PER_TOKEN_LAYER  # one page of one layer, bytes (uint8)
    rows = (anchor.size + ps + 1) // ps  # SGLang allocates a spare row past the pages
    layout = anchor.layout
    shape = (rows, L, 1, stride) if layout in PAGE_FIRST else (L, rows, stride)
    page_bytes = L * stride

    def pager(page: int) -> tuple[SideObject, ...]:
        return (
            SideObject(suffixes[0], PageObject("index_k_with_scale_buffer", page * page_bytes, page_bytes, "indexer")),
        )

    warnings = []
    if layout not in PAGE_FIRST:
        warnings.append(f"SGLang's indexer pool has no zero-copy page metadata for {layout}: Mooncake cannot store it.")
    follows = "the KV host pool" if spec.name == "indexer" else "the draft KV host pool"
    return SideHostPool(
        name=spec.name,
        sglang_class="DSAIndexerPoolHost",
        layout=layout,
        page_size=ps,
        size=anchor.size,
        page_num=anchor.page_num,
        bytes_per_slot=L * DSA_BYTES_PER_TOKEN_LAYER,
        buffers=(BufferSpec("index_k_with_scale_buffer", shape, "uint8", 1),),
        suffixes=tuple(suffixes),
        device_slots=None,
        zero_copy=layout in PAGE_FIRST,
        shapes={
            "layers": L,
            "index_head_dim": DSA_INDEX_HEAD_DIM,
            "bytes_per_token_per_layer": DSA_BYTES_PER_TOKEN_LAYER,
        },
        notes=(f"slots and layout follow {follows}; {rows} rows (one spare).",),
        warnings=tuple(warnings),
        _pager=pager,
    )


# --- entry point -----------------------------------------------------------------------------------


def side_host_pools(specs: Iterable[PoolSpec], kv: HostPoolLayout) -> tuple[list[SideHostPool], list[str]]:
    """The host pools of `specs` next to the KV host pool `kv` (tp rank 0's suffixes), and notes
    for pools that are not modelled (DeepSeek V4)."""
    version = kv.sglang_version
    scheme = ObjectKeyScheme(version, tp_size=kv.tp_size, mla=kv.geometry.mla, layout=kv.layout)
    pools, skipped = [], []
    specs = list(specs)
    by_name = {s.name: s for s in specs}
    swa_tokens = (by_name["swa"].tokens if "swa" in by_name else None) or kv.device_tokens
    for spec in specs:
        check_pool(spec, version, kv.geometry.mla)
        if sum(s.name == spec.name for s in specs) > 1:
            raise InputError(f"pool {spec.name} is given twice.")
        if spec.name.startswith("deepseek_v4_"):
            skipped.append(
                f"pool {spec.name}: DeepSeek V4 host pools are not shown (docs/side-pools.md#side-host-pools)."
            )
            continue
        _check_options(spec)
        for name in ("layers", "tokens"):
            if getattr(spec, name) is not None:
                positive_int(f"{spec.name} {name}", getattr(spec, name))
        suffixes = pool_suffixes(spec, scheme)
        if spec.name == "mamba":
            pools.append(_mamba_pool(spec, kv, suffixes))
        elif spec.name in _KV_POOLS:
            pools.append(_kv_side_pool(spec, kv, suffixes, swa_tokens))
        elif spec.name == "indexer":
            pools.append(_indexer_pool(spec, kv, kv, suffixes))
        elif spec.name == "draft_indexer":
            draft = by_name.get("draft", PoolSpec("draft", attention="mla"))
            anchor = _draft_anchor(draft, kv)
            pools.append(_indexer_pool(spec, kv, anchor, suffixes))
    return pools, skipped


def _draft_anchor(draft: PoolSpec, kv: HostPoolLayout) -> HostPoolLayout:
    """The draft KV host pool a draft indexer lays its rows on (0.5.23: the KV pool's slots)."""
    geo = _side_geometry(draft, kv.geometry, True, 1)
    return HostPoolLayout(
        geo,
        kv.layout,
        kv.page_size,
        draft.tokens or kv.device_tokens,
        tp_size=kv.tp_size,
        sglang_version=kv.sglang_version,
        host_tokens=kv.size,
    )
