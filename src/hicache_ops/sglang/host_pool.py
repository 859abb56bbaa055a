"""The host (L2) and device (L1) KV pools one rank allocates, as SGLang lays them out.

`HostPoolLayout`: size, page count, buffer shapes per layout and the per-page zero-copy metadata
the Mooncake store hands to `batch_put_from` / `batch_get_into` (SGLang's `get_page_buffer_meta`
and `get_split_heads_page_buffer_meta`), as byte offsets. `DevicePoolLayout`: the layer-first L1
pool. Rules and their SGLang sources: docs/host-pool.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import ModelGeometry, positive_int
from hicache_ops.sglang.versions import NEWEST, V0_5_14, family, validate_version

# Symbolic dimensions of a host KV buffer, named as ModelGeometry and HostPoolLayout name them.
KV = "kv"  # K then V: 2 (MHA only)
LAYERS = "layers"
SIZE = "size"  # token slots: page_num * page_size
PAGE_NUM = "page_num"
PAGE_SIZE = "page_size"
HEADS_PER_RANK = "heads_per_rank"  # MLA: 1
HEAD_DIM = "head_dim"  # MLA: kv_cache_dim, the latent row

# One component (K, V or the MLA latent) in canonical order: token t of a layer and head sits at
# [layer, t // page_size, t % page_size, head]. A page's bytes in this order are the
# page_first_direct page, so every layout has one byte order to compare pages in.
CANONICAL_DIMS: tuple[str, ...] = (LAYERS, PAGE_NUM, PAGE_SIZE, HEADS_PER_RANK, HEAD_DIM)
CANONICAL_PAGE_DIMS: tuple[str, ...] = (LAYERS, PAGE_SIZE, HEADS_PER_RANK, HEAD_DIM)

_LABELS = {
    KV: "2", LAYERS: "L", SIZE: "size", PAGE_NUM: "page_num", PAGE_SIZE: "ps", HEADS_PER_RANK: "H", HEAD_DIM: "D"
}  # fmt: skip
_MLA_LABELS = {**_LABELS, HEADS_PER_RANK: "1", HEAD_DIM: "C"}

if TYPE_CHECKING:
    from hicache_ops.sglang.views import BufferView, DevicePoolView, HostPoolView, PageMetaView, PageObjectView


def _order(dims: tuple[str, ...], target: tuple[str, ...]) -> tuple[int, ...]:
    """The permutation of `dims` that lists them in `target`'s order."""
    return tuple(dims.index(d) for d in target)


@dataclass(frozen=True)
class HostBufferDims:
    """One host layout's KV buffer in symbolic dimensions (docs/host-pool.md#mha-buffer-shapes,
    #mla-buffer-shapes), and how it maps onto the canonical view."""

    mla: bool
    dims: tuple[str, ...]

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] for d in self.dims)

    def describe(self) -> str:
        """The shape as docs/host-pool.md writes it, e.g. (2, L, size, H, D)."""
        labels = _MLA_LABELS if self.mla else _LABELS
        return "(" + ", ".join(labels[d] for d in self.dims) + ")"

    @property
    def component_dims(self) -> tuple[str, ...]:
        """One component's dims: the buffer's without the leading K/V dim."""
        return self.dims[1:] if self.dims[0] == KV else self.dims

    @property
    def paged_dims(self) -> tuple[str, ...]:
        """`component_dims` with token slots split into (page_num, page_size)."""
        out: list[str] = []
        for d in self.component_dims:
            out.extend((PAGE_NUM, PAGE_SIZE) if d == SIZE else (d,))
        return tuple(out)

    @property
    def canonical_order(self) -> tuple[int, ...]:
        """The permutation of `paged_dims` that gives the canonical view."""
        return _order(self.paged_dims, CANONICAL_DIMS)

    @property
    def page_object_dims(self) -> tuple[str, ...] | None:
        """The dims of one page of one component when that page is one contiguous block (the
        L3 object SGLang's zero-copy path sends); None when a page is scattered (layer_first)."""
        paged = self.paged_dims
        return paged[1:] if paged[0] == PAGE_NUM else None

    @property
    def page_object_order(self) -> tuple[int, ...]:
        """The permutation of `page_object_dims` that gives one canonical page."""
        dims = self.page_object_dims
        assert dims is not None, "a scattered (layer_first) page has no one-block order"
        return _order(dims, CANONICAL_PAGE_DIMS)


# The host layouts a deployment can choose (--hicache-mem-layout), per attention kind, with their
# buffers. 0.5.23's page_unified is internal (not a CLI choice) and is not modelled;
# page_first_kv_split is Ascend-only.
MHA_HOST_BUFFERS: dict[str, HostBufferDims] = {
    "layer_first": HostBufferDims(False, (KV, LAYERS, SIZE, HEADS_PER_RANK, HEAD_DIM)),
    "page_first": HostBufferDims(False, (KV, SIZE, LAYERS, HEADS_PER_RANK, HEAD_DIM)),
    "page_first_direct": HostBufferDims(False, (KV, PAGE_NUM, LAYERS, PAGE_SIZE, HEADS_PER_RANK, HEAD_DIM)),
    "page_head": HostBufferDims(False, (KV, PAGE_NUM, HEADS_PER_RANK, PAGE_SIZE, LAYERS, HEAD_DIM)),
}
MLA_HOST_BUFFERS: dict[str, HostBufferDims] = {
    "layer_first": HostBufferDims(True, (LAYERS, SIZE, HEADS_PER_RANK, HEAD_DIM)),
    "page_first": HostBufferDims(True, (SIZE, LAYERS, HEADS_PER_RANK, HEAD_DIM)),
    "page_first_direct": HostBufferDims(True, (PAGE_NUM, LAYERS, PAGE_SIZE, HEADS_PER_RANK, HEAD_DIM)),
}
LAYOUTS: tuple[str, ...] = tuple(MHA_HOST_BUFFERS)
# The IO backends between device and host on CUDA/ROCm (kernel_ascend is Ascend-only).
# Layouts each IO backend can actually move (the transfer branches of the host pools).
KERNEL_IO_LAYOUTS: tuple[str, ...] = ("layer_first", "page_first", "page_head")
DIRECT_IO_LAYOUTS: tuple[str, ...] = ("layer_first", "page_first_direct")

DEFAULT_HICACHE_RATIO = 2.0
# The buffer name SGLang's host pools use for their one KV tensor.
KV_BUFFER = "kv_buffer"


def check_layout_for(layout: str, *, mla: bool) -> str:
    """Return `layout` if SGLang accepts it for this attention kind, else raise an InputError."""
    if layout not in LAYOUTS:
        raise InputError(f"layout {layout!r} is unknown.", hint=f"Use one of: {', '.join(LAYOUTS)}.")
    if mla and layout not in MLA_HOST_BUFFERS:
        raise InputError(
            f"layout {layout!r} is not supported for MLA models.",
            hint="Use page_first or page_first_direct for MLA.",
        )
    return layout


def host_buffer_dims(layout: str, *, mla: bool) -> HostBufferDims:
    """The buffer of `layout` for this attention kind; an InputError if SGLang refuses the pair."""
    check_layout_for(layout, mla=mla)
    return (MLA_HOST_BUFFERS if mla else MHA_HOST_BUFFERS)[layout]


# Host pool (L2)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BufferSpec:
    """One host tensor: its name, shape and stored dtype; `parts` are K/V sub-ranges."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    parts: tuple[tuple[str, int, int], ...] = ()  # (name, byte offset, nbytes)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def view(self) -> BufferView:
        from hicache_ops.sglang.views import BufferPart, BufferView

        return BufferView(
            name=self.name,
            shape=list(self.shape),
            dtype=self.dtype,
            nbytes=self.nbytes,
            parts=[BufferPart(name=n, offset=o, nbytes=b) for n, o, b in self.parts] if self.parts else None,
        )


@dataclass(frozen=True)
class PageObject:
    """One contiguous byte range that SGLang hands to Mooncake for a page.

    `part` is k or v (MHA) or kv (MLA's latent row); `layer` is set for layer_first pieces;
    `heads` ([start, end) within this rank's heads) and `split` (the target-rank offset) for
    split heads.
    """

    buffer: str
    offset: int
    size: int
    part: str
    layer: int | None = None
    heads: tuple[int, int] | None = None
    split: int | None = None

    def view(self) -> PageObjectView:
        from hicache_ops.sglang.views import PageObjectView

        return PageObjectView(
            buffer=self.buffer,
            offset=self.offset,
            size=self.size,
            part=self.part,
            layer=self.layer,
            heads=list(self.heads) if self.heads is not None else None,
            split=self.split,
        )


@dataclass(frozen=True)
class PageMeta:
    index: int
    objects: tuple[PageObject, ...]

    def view(self) -> PageMetaView:
        from hicache_ops.sglang.views import PageMetaView

        return PageMetaView(index=self.index, objects=[o.view() for o in self.objects])


@dataclass(frozen=True)
class HostPoolLayout:
    """The host KV pool one rank allocates, for a layout SGLang actually runs with.

    Size (docs/host-pool.md): hicache_size_gb * 1e9 // bytes_per_token tokens when hicache_size_gb > 0,
    else int(device_tokens * hicache_ratio); then page_num = size // page_size + 1 and
    size = page_num * page_size (one page more than asked for).

    `tp_lcm_size` (extra-config, heterogeneous TP) splits heads for MHA page_head pools when it
    exceeds tp_size: each page then goes out as tp_lcm_size // tp_size K/V pairs.
    `mooncake` says whether the L3 tier is Mooncake (for `mooncake_zero_copy` and warnings).
    `host_tokens` fixes the size instead (SGLang 0.5.23's host_token_capacity, for side pools that
    share the KV pool's slots): page aligned, no extra page (docs/side-pools.md#side-host-pools).
    """

    geometry: ModelGeometry
    layout: str
    page_size: int
    device_tokens: int
    hicache_ratio: float = DEFAULT_HICACHE_RATIO
    hicache_size_gb: float = 0
    tp_size: int = 1
    tp_lcm_size: int | None = None
    sglang_version: str = NEWEST
    mooncake: bool = True
    host_tokens: int | None = None
    # The size asked for in tokens, in place of int(device_tokens x hicache_ratio) (bench replay's
    # --l2-tokens): sized the same way (one page more), without a ratio's rounding.
    asked_tokens: int | None = None
    size: int = field(init=False)
    page_num: int = field(init=False)

    def __post_init__(self) -> None:
        validate_version(self.sglang_version)
        check_layout_for(self.layout, mla=self.geometry.mla)
        positive_int("page-size", self.page_size)
        positive_int("device-tokens", self.device_tokens)
        positive_int("tp-size", self.tp_size)
        if (
            isinstance(self.hicache_size_gb, bool)
            or not isinstance(self.hicache_size_gb, (int, float))
            or (self.hicache_size_gb < 0 or not math.isfinite(self.hicache_size_gb))
        ):
            raise InputError(
                f"hicache-size {self.hicache_size_gb!r} must be a number of GB >= 0.",
                hint="Pass --hicache-size 0 to size the pool by --hicache-ratio.",
            )
        if self.hicache_size_gb == 0 and (
            isinstance(self.hicache_ratio, bool)
            or not isinstance(self.hicache_ratio, (int, float))
            or not math.isfinite(self.hicache_ratio)
            or self.hicache_ratio <= 0
        ):
            raise InputError(
                f"hicache-ratio {self.hicache_ratio!r} must be a number above 0.",
                hint="Pass --hicache-ratio 2.0 (SGLang's default) or a --hicache-size in GB.",
            )
        if self.tp_lcm_size is not None and (
            isinstance(self.tp_lcm_size, bool)
            or not isinstance(self.tp_lcm_size, int)
            or self.tp_lcm_size < 1
            or self.tp_lcm_size % self.tp_size
        ):
            raise InputError(
                f"tp-lcm-size {self.tp_lcm_size!r} is not a positive multiple of tp-size {self.tp_size}.",
                hint="SGLang requires tp_lcm_size % tp_size == 0.",
            )
        bpt = self.geometry.bytes_per_token(self.tp_size)  # validates heads against tp_size
        if self.split_factor > 1 and self.heads_per_rank % self.split_factor:
            raise InputError(
                f"tp-lcm-size {self.tp_lcm_size} splits each rank's {self.heads_per_rank} KV heads "
                f"into {self.split_factor} parts, which does not divide evenly.",
                hint="Choose a tp-lcm-size whose factor over tp-size divides the heads per rank.",
            )
        if self.host_tokens is not None:
            positive_int("host-tokens", self.host_tokens)
            if self.host_tokens % self.page_size:
                raise InputError(
                    f"a fixed host pool of {self.host_tokens} tokens is not whole pages of {self.page_size}."
                )
            object.__setattr__(self, "page_num", self.host_tokens // self.page_size)
            object.__setattr__(self, "size", self.host_tokens)
            return
        if self.hicache_size_gb > 0:
            size = int(self.hicache_size_gb * 1e9 // bpt)
        elif self.asked_tokens is not None:
            positive_int("l2-tokens", self.asked_tokens)
            size = self.asked_tokens
        else:
            size = int(self.device_tokens * self.hicache_ratio)
        page_num = size // self.page_size + 1
        if family(self.sglang_version) == V0_5_14 and page_num * self.page_size <= self.device_tokens:
            raise InputError(
                f"a host pool of {page_num * self.page_size} tokens is not larger than the device pool "
                f"({self.device_tokens} tokens), which SGLang 0.5.14 refuses at start-up.",
                hint="Raise --hicache-ratio above 1 or --hicache-size.",
            )
        object.__setattr__(self, "page_num", page_num)
        object.__setattr__(self, "size", page_num * self.page_size)

    # --- sizes -----------------------------------------------------------------------------

    @property
    def mla(self) -> bool:
        return self.geometry.mla

    @property
    def itemsize(self) -> int:
        return self.geometry.itemsize

    @property
    def heads_per_rank(self) -> int:
        return self.geometry.heads_per_rank(self.tp_size)

    @property
    def bytes_per_token(self) -> int:
        return self.geometry.bytes_per_token(self.tp_size)

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_token * self.page_size

    @property
    def host_bytes(self) -> int:
        return self.bytes_per_token * self.size

    @property
    def split_factor(self) -> int:
        """Parts each page's heads are cut into for heterogeneous TP (1: no split)."""
        if (
            not self.mla
            and self.layout == "page_head"
            and self.tp_lcm_size is not None
            and self.tp_lcm_size > self.tp_size
        ):
            return self.tp_lcm_size // self.tp_size
        return 1

    # --- buffers ---------------------------------------------------------------------------

    @property
    def buffer_shape(self) -> tuple[int, ...]:
        sizes = {
            KV: 2,
            LAYERS: self.geometry.layers,
            SIZE: self.size,
            PAGE_NUM: self.page_num,
            PAGE_SIZE: self.page_size,
            HEADS_PER_RANK: self.heads_per_rank,
            HEAD_DIM: self.geometry.kv_cache_dim,
        }
        return host_buffer_dims(self.layout, mla=self.mla).shape(sizes)

    @property
    def v_offset(self) -> int:
        """Byte offset of V from the buffer start (MHA: K and V share one buffer); MLA: 0."""
        if self.mla:
            return 0
        return self.geometry.layers * self.size * self.heads_per_rank * self.geometry.head_dim * self.itemsize

    @property
    def buffers(self) -> list[BufferSpec]:
        spec = BufferSpec(KV_BUFFER, self.buffer_shape, self.geometry.stored_dtype, self.itemsize)
        if not self.mla:
            spec = replace(spec, parts=(("k", 0, self.v_offset), ("v", self.v_offset, self.v_offset)))
        return [spec]

    # --- zero-copy page metadata -----------------------------------------------------------

    def _check_pages(self, page_indices: Iterable[int]) -> list[int]:
        pages = []
        for p in page_indices:
            if isinstance(p, bool) or not isinstance(p, int):
                raise InputError(f"page index {p!r} is not an integer.", hint="Pass pages like 0,2,5.")
            if not 0 <= p < self.page_num:
                raise InputError(
                    f"page {p} is outside this host pool's pages 0..{self.page_num - 1}.",
                    hint=f"Pick pages below {self.page_num}.",
                )
            pages.append(p)
        return pages

    def page_objects(self, page: int) -> tuple[PageObject, ...]:
        """The byte ranges of one host page, in SGLang's order (get_page_buffer_meta, or
        get_split_heads_page_buffer_meta with split heads)."""
        (page,) = self._check_pages([page])
        isz, L, ps = self.itemsize, self.geometry.layers, self.page_size
        first = page * ps  # the page's first token slot
        if self.mla:
            C = self.geometry.kv_cache_dim
            if self.layout == "layer_first":
                return tuple(
                    PageObject(KV_BUFFER, (first + layer * self.size) * C * isz, ps * C * isz, "kv", layer=layer)
                    for layer in range(L)
                )
            return (PageObject(KV_BUFFER, first * L * C * isz, L * ps * C * isz, "kv"),)
        H, D, v_off = self.heads_per_rank, self.geometry.head_dim, self.v_offset
        out: list[PageObject] = []
        if self.layout == "layer_first":
            for layer in range(L):
                k = (first + layer * self.size) * H * D * isz
                out.append(PageObject(KV_BUFFER, k, ps * H * D * isz, "k", layer=layer))
                out.append(PageObject(KV_BUFFER, k + v_off, ps * H * D * isz, "v", layer=layer))
            return tuple(out)
        page_start = first * L * H * D * isz
        f = self.split_factor
        if f == 1:
            size = L * ps * H * D * isz
            return (
                PageObject(KV_BUFFER, page_start, size, "k"),
                PageObject(KV_BUFFER, page_start + v_off, size, "v"),
            )
        # page_head split heads: a page is (H, ps, L, D); each head group is contiguous.
        group = H // f
        size = L * ps * H * D * isz // f
        for i in range(f):
            head = i * group
            k = page_start + head * ps * L * D * isz
            heads = (head, head + group)
            out.append(PageObject(KV_BUFFER, k, size, "k", heads=heads, split=i))
            out.append(PageObject(KV_BUFFER, k + v_off, size, "v", heads=heads, split=i))
        return tuple(out)

    def page_buffer_meta(self, page_indices: Iterable[int]) -> list[PageMeta]:
        """Per page, the objects (buffer, byte offset from the buffer start, size) in SGLang's
        order: MHA [k, v] (layer_first: k, v per layer; split heads: k, v per head group),
        MLA one latent block (layer_first: one piece per layer)."""
        return [PageMeta(p, self.page_objects(p)) for p in self._check_pages(page_indices)]

    def flat_meta(self, page_indices: Iterable[int]) -> tuple[list[int], list[int]]:
        """(offsets, sizes) flattened over pages: SGLang's (pointers - data_ptr, sizes)."""
        offsets, sizes = [], []
        for meta in self.page_buffer_meta(page_indices):
            for obj in meta.objects:
                offsets.append(obj.offset)
                sizes.append(obj.size)
        return offsets, sizes

    @property
    def objects_per_page(self) -> int:
        return len(self.page_objects(0))

    @property
    def mooncake_objects_per_page(self) -> int:
        """Mooncake objects per page: MHA 2 (2 per head group when split), MLA 1."""
        return 1 if self.mla else 2 * self.split_factor

    @property
    def mooncake_zero_copy(self) -> bool:
        """Whether the Mooncake store can put/get pages straight from this pool.

        MHA layer_first is refused (a K/V object would be L scattered pieces); MLA layer_first
        goes as one multi-buffer object of L pieces.
        """
        return self.mla or self.layout != "layer_first"

    def warnings(self) -> list[str]:
        out = []
        if self.mooncake and not self.mla and self.layout == "layer_first":
            out.append(
                "Mooncake refuses MHA layer_first pools (a page's K and V are L scattered pieces "
                "each); SGLang normally rewrites layer_first to page_first for Mooncake."
            )
        if self.size <= self.device_tokens:
            out.append(
                f"the host pool ({self.size} tokens) is not larger than the device pool "
                f"({self.device_tokens} tokens): L2 can hold little that L1 does not."
            )
        return out

    def notes(self) -> list[str]:
        out = []
        if self.mooncake and self.mla and self.layout == "layer_first":
            out.append(
                f"MLA layer_first: Mooncake stores each page as one object gathered from "
                f"{self.geometry.layers} per-layer pieces (multi-buffer)."
            )
        if self.mooncake and self.mla and self.tp_size > 1:
            out.append("MLA: every rank holds the same latent rows; only tp rank 0 writes them to L3.")
        if not self.mla and self.geometry.kv_heads < self.tp_size:
            out.append(
                f"{self.geometry.kv_heads} KV heads over tp-size {self.tp_size}: each rank holds one replicated head."
            )
        if self.split_factor > 1:
            out.append(
                f"split heads: tp-lcm-size {self.tp_lcm_size} / tp-size {self.tp_size} = {self.split_factor}; "
                f"each page goes to L3 as {self.split_factor} K/V pairs of {self.heads_per_rank // self.split_factor} "
                f"heads, named for target ranks tp*{self.split_factor}+i."
            )
        elif self.tp_lcm_size is not None and self.tp_lcm_size > self.tp_size:
            out.append("tp-lcm-size only splits heads for MHA with the page_head layout; it changes nothing here.")
        return out

    def view(self) -> HostPoolView:
        from hicache_ops.sglang.views import HostPoolView

        return HostPoolView(
            sglang_version=self.sglang_version,
            geometry=self.geometry.view(),
            layout=self.layout,
            page_size=self.page_size,
            tp_size=self.tp_size,
            tp_lcm_size=self.tp_lcm_size,
            heads_per_rank=self.heads_per_rank,
            device_tokens=self.device_tokens,
            hicache_ratio=self.hicache_ratio,
            hicache_size_gb=self.hicache_size_gb,
            bytes_per_token=self.bytes_per_token,
            bytes_per_page=self.bytes_per_page,
            size_tokens=self.size,
            page_num=self.page_num,
            host_bytes=self.host_bytes,
            buffers=[b.view() for b in self.buffers],
            split_factor=self.split_factor,
            objects_per_page=self.objects_per_page,
            mooncake_objects_per_page=self.mooncake_objects_per_page,
            mooncake_zero_copy=self.mooncake_zero_copy,
        )


# ---------------------------------------------------------------------------------------------
# Device pool (L1)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePoolLayout:
    """The L1 pool one rank keeps: layer-first, per layer one (slots, H, D) tensor for K and one
    for V (MLA: one (slots, 1, kv_lora_rank + qk_rope_head_dim) tensor).

    SGLang allocates device_tokens + page_size slots: the extra page (slot 0's page) absorbs
    writes of padded tokens. `padded=False` gives exactly device_tokens slots.
    """

    geometry: ModelGeometry
    device_tokens: int
    page_size: int = 1
    tp_size: int = 1
    padded: bool = True

    def __post_init__(self) -> None:
        positive_int("device-tokens", self.device_tokens)
        positive_int("page-size", self.page_size)
        self.geometry.heads_per_rank(self.tp_size)

    @property
    def slots(self) -> int:
        return self.device_tokens + (self.page_size if self.padded else 0)

    @property
    def heads_per_rank(self) -> int:
        return self.geometry.heads_per_rank(self.tp_size)

    @property
    def k_shape(self) -> tuple[int, int, int, int]:
        """(L, slots, H, D) for K (MLA: the latent (L, slots, 1, C))."""
        g = self.geometry
        if g.mla:
            return (g.layers, self.slots, 1, g.kv_cache_dim)
        return (g.layers, self.slots, self.heads_per_rank, g.head_dim)

    @property
    def v_shape(self) -> tuple[int, int, int, int] | None:
        """(L, slots, H, D) for V; None for MLA (one latent buffer)."""
        return None if self.geometry.mla else self.k_shape

    @property
    def nbytes(self) -> int:
        return self.slots * self.geometry.bytes_per_token(self.tp_size)

    def view(self) -> DevicePoolView:
        from hicache_ops.sglang.views import DevicePoolView

        return DevicePoolView(
            slots=self.slots,
            k_shape=list(self.k_shape),
            v_shape=list(self.v_shape) if self.v_shape else None,
            dtype=self.geometry.stored_dtype,
            nbytes=self.nbytes,
        )
