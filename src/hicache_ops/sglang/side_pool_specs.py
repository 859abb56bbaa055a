"""Side pools: the objects SGLang's v2 storage calls write per page besides the main KV
(docs/side-pools.md), their hit policies and presets for real hybrid models.

A pool is named as SGLang's `PoolName` value and described by a `PoolSpec`; `pool_suffixes`
gives what follows the page key for one rank (`ObjectKeyScheme`), in the order SGLang's
Mooncake store zips them with the pool's buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hicache_ops.errors import InputError, SettingError
from hicache_ops.sglang.page_keys import ObjectKeyScheme
from hicache_ops.sglang.versions import V0_5_14, V0_5_23, family

if TYPE_CHECKING:
    from hicache_ops.sglang.views import SidePoolView

_DEEPSEEK_V4_BOTH = (
    "deepseek_v4_c4",
    "deepseek_v4_c4_indexer",
    "deepseek_v4_c128",
    "deepseek_v4_c4_state",
    "deepseek_v4_c4_indexer_state",
    "deepseek_v4_c128_state",
)
_DEEPSEEK_V4_0_5_23 = (
    "deepseek_v4_c1",
    "deepseek_v4_c1_indexer",
    "deepseek_v4_c1_indexer_scale",
    "deepseek_v4_c2",
    "deepseek_v4_c2_indexer",
    "deepseek_v4_c2_indexer_scale",
    "deepseek_v4_c4_indexer_scale",
    "deepseek_v4_c4_rope",
    "deepseek_v4_c128_rope",
)
# Side pools with a Mooncake key rule, per version (docs/side-pools.md#pool-names); `kv` is the
# main pool and `auxiliary_swa` has no Mooncake key rule, so neither is a --pool.
SIDE_POOLS = {
    V0_5_14: ("mamba", "swa", "indexer", *_DEEPSEEK_V4_BOTH, "draft"),
    V0_5_23: (
        "mamba",
        "swa",
        "indexer",
        *_DEEPSEEK_V4_BOTH,
        *_DEEPSEEK_V4_0_5_23,
        "draft",
        "draft_indexer",
        "draft_swa",
    ),
}
# One page-packed object per page under the MLA suffix (docs/side-pools.md#side-pool-object-keys).
_PAGE_PACKED = {"indexer", "draft_indexer", *_DEEPSEEK_V4_BOTH, *_DEEPSEEK_V4_0_5_23}
# Pools SGLang registers with the trailing-pages policy (docs/side-pools.md#hit-policies): Mamba
# needs the state of the last page; SWA (and what takes its indices from SWA) its window.
_TRAILING = {
    "mamba",
    "swa",
    "draft_swa",
    "deepseek_v4_c4_state",
    "deepseek_v4_c4_indexer_state",
    "deepseek_v4_c128_state",
}
ALL_PAGES = "all_pages"
TRAILING_PAGES = "trailing_pages"


@dataclass(frozen=True)
class PoolSpec:
    """One side pool of a deployment.

    `attention` is the pool's own attention kind where SGLang picks suffixes from the pool's
    class (`draft`, `draft_swa`); None means the deployment's. `conv` / `temporal` describe a
    Mamba pool (conv states, whether the temporal state has elements); `window` is the
    trailing-pages window of an SWA-indexed pool (Mamba always 1).
    A pool read from a server's L3 layout (docs/side-pools.md#l3-layout-endpoint) carries that
    layout's word: `policy` overrides the hit policy the name implies, `window` is its trailing
    pages, and `served` holds its suffixes per pp stage, `((pp_rank, suffixes), ...)`, which the
    key rule then returns as they are (the server lists the objects it writes).

    The rest describe the pool's host buffers for `inspect layout` (docs/side-pools.md#side-host-pools);
    None means "from the KV geometry" where that makes sense. `layers`: the pool's layers;
    `tokens`: its device pool's slots (SWA tokens, Mamba state slots); `heads` / `head_dim`: an
    MHA pool's KV heads (before TP) and head size; `conv_shapes` / `temporal_shape`: one layer's
    Mamba states at tp-size 1 (SGLang splits the first dimension over the ranks); their dtypes.
    """

    name: str
    attention: str | None = None
    conv: int = 1
    temporal: bool = True
    window: int = 1
    policy: str | None = None
    served: tuple[tuple[int, tuple[str, ...]], ...] | None = None
    layers: int | None = None
    tokens: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    conv_shapes: tuple[tuple[int, ...], ...] | None = None
    temporal_shape: tuple[int, ...] | None = None
    conv_dtype: str | None = None
    temporal_dtype: str | None = None

    @property
    def hit_policy(self) -> str:
        if self.policy is not None:
            return self.policy
        return TRAILING_PAGES if self.name in _TRAILING else ALL_PAGES

    @property
    def trailing_pages(self) -> int | None:
        if self.hit_policy != TRAILING_PAGES:
            return None
        return 1 if self.name == "mamba" and self.served is None else self.window

    def to_text(self) -> str:
        """The `--pool` text that gives this spec back (parse_pool)."""
        options = [f"attention={self.attention}"] if self.attention else []
        if self.name == "mamba":
            options += [f"conv={self.conv}", f"temporal={int(self.temporal)}"]
        if self.hit_policy == TRAILING_PAGES and self.name != "mamba":
            options.append(f"window={self.window}")
        return self.name + (":" + ",".join(options) if options else "")

    def view(self, suffixes: list[str]) -> SidePoolView:
        """The pool as JSON, with its suffixes over the ranks a command selected."""
        from hicache_ops.sglang.views import SidePoolView

        return SidePoolView(
            name=self.name, suffixes=suffixes, hit_policy=self.hit_policy, trailing_pages=self.trailing_pages
        )


# Mamba state dtypes SGLang accepts (mamba_ssm_dtype / SGLANG_MAMBA_CONV_DTYPE).
MAMBA_DTYPES = ("float32", "bfloat16", "float16")
_INT_OPTIONS = {"conv": 0, "window": 1, "layers": 1, "tokens": 1, "heads": 1, "head_dim": 1}  # name -> least value
_OPTION_NAMES = (
    "attention, conv, temporal, window, layers, tokens, heads, head_dim, conv_shapes, temporal_shape, "
    "conv_dtype, temporal_dtype"
)


def _parse_shape(text: str, value: str, key: str) -> tuple[int, ...]:
    dims = value.lower().split("x")
    if not all(d.isdigit() and int(d) > 0 for d in dims):
        raise SettingError(
            "pool", f"{text!r}: {key} {value!r} is not a shape like 8192x3 (positive integers joined by x)."
        )
    return tuple(int(d) for d in dims)


def parse_pool(text: str) -> PoolSpec:
    """`NAME[:k=v,...]` as `--pool` takes it (see parse_pool_fields)."""
    name, fields = parse_pool_fields(text)
    return _build(text, PoolSpec(name, **fields))


def _build(text: str, spec: PoolSpec) -> PoolSpec:
    """`spec` with its conv count taken from its conv shapes, checked for contradictions."""
    if spec.conv_shapes is not None:
        spec = replace(spec, conv=len(spec.conv_shapes))
    if spec.temporal_shape is not None and not spec.temporal:
        raise SettingError("pool", f"{text!r}: temporal=0 means the temporal state is empty; drop temporal_shape.")
    return spec


def parse_pool_fields(text: str) -> tuple[str, dict[str, Any]]:
    """The pool name and the options given in `NAME[:k=v,...]`: attention=mla|mha, conv=N,
    temporal=0|1, window=PAGES, and for `inspect layout` layers=N, tokens=N, heads=N, head_dim=N,
    conv_shapes=AxB[+CxD...], temporal_shape=AxBxC, conv_dtype=DTYPE, temporal_dtype=DTYPE."""
    name, _, options = text.partition(":")
    name = name.strip()
    if not name:
        raise SettingError("pool", f"{text!r} has no pool name.")
    fields: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingError("pool", f"{text!r}: option {item!r} is not KEY=VALUE.")
        if key == "attention":
            if value not in ("mla", "mha"):
                raise SettingError("pool", f"{text!r}: attention is mla or mha, not {value!r}.")
            fields["attention"] = value
        elif key in _INT_OPTIONS:
            least = _INT_OPTIONS[key]
            if not value.isdigit() or int(value) < least:
                raise SettingError(
                    "pool", f"{text!r}: {key} must be a {'positive' if least else 'non-negative'} integer."
                )
            fields[key] = int(value)
        elif key == "temporal":
            if value not in ("0", "1"):
                raise SettingError("pool", f"{text!r}: temporal is 0 or 1, not {value!r}.")
            fields["temporal"] = value == "1"
        elif key == "conv_shapes":
            fields[key] = tuple(_parse_shape(text, shape, key) for shape in value.split("+"))
        elif key == "temporal_shape":
            fields[key] = _parse_shape(text, value, key)
        elif key in ("conv_dtype", "temporal_dtype"):
            if value not in MAMBA_DTYPES:
                raise SettingError("pool", f"{text!r}: {key} is one of {', '.join(MAMBA_DTYPES)}, not {value!r}.")
            fields[key] = value
        else:
            raise SettingError("pool", f"{text!r}: unknown option {key!r} ({_OPTION_NAMES}).")
    if "conv_shapes" in fields and "conv" in fields and fields["conv"] != len(fields["conv_shapes"]):
        raise SettingError("pool", f"{text!r}: conv={fields['conv']} but {len(fields['conv_shapes'])} conv_shapes.")
    if "conv" in fields and "conv_shapes" not in fields:
        fields["conv_shapes"] = None  # a new conv count drops shapes given for another count
    if fields.get("temporal") is False and "temporal_shape" not in fields:
        fields["temporal_shape"] = None  # likewise an emptied temporal state
    return name, fields


def check_pool(spec: PoolSpec, version: str, mla: bool) -> None:
    """InputError when SGLang `version` has no such pool or would refuse to key it.

    A pool from a server's L3 layout is not checked: the server names what it registered.
    """
    if spec.served is not None:
        return
    if spec.name == "kv":
        raise InputError("kv is the main pool: its objects are always listed; --pool names side pools.")
    if spec.name == "auxiliary_swa":
        raise InputError(
            "auxiliary_swa has no Mooncake key rule: SGLang's Mooncake store refuses it "
            "(docs/side-pools.md#side-pool-object-keys)."
        )
    if spec.name not in SIDE_POOLS[family(version)]:
        known = [v for v, names in SIDE_POOLS.items() if spec.name in names]
        raise InputError(
            f"SGLang {version} has no pool {spec.name!r}"
            + (
                f" (it exists in {', '.join(known)})."
                if known
                else f"; its side pools: {', '.join(SIDE_POOLS[family(version)])}."
            ),
        )
    if spec.attention is not None and spec.name not in ("draft", "draft_swa"):
        raise InputError(
            f"pool {spec.name}: attention= applies to draft and draft_swa, whose class picks the suffixes."
        )
    if spec.name == "swa" and not mla and spec.attention == "mla":
        raise InputError("pool swa: an MHA deployment keys SWA as K/V; SGLang has no rule for an MLA SWA pool there.")
    if spec.name == "mamba":
        if spec.conv == 0 and not spec.temporal:
            raise InputError("pool mamba: with conv=0 and temporal=0 there is nothing to store.")
        if family(version) == V0_5_14 and not spec.temporal:
            raise InputError(
                "pool mamba: SGLang 0.5.14 always writes the temporal object (0.5.23 drops it when empty); "
                "temporal=0 applies to 0.5.23."
            )


def pool_suffixes(spec: PoolSpec, scheme: ObjectKeyScheme) -> list[str]:
    """What follows the page key in each of `spec`'s objects for one rank, in SGLang's order."""
    if spec.served is not None:
        served = dict(spec.served)
        if scheme.pp_rank not in served:
            raise InputError(f"the server's L3 layout lists pool {spec.name} for no pp rank {scheme.pp_rank}.")
        return list(served[scheme.pp_rank])
    if scheme.split_heads:
        raise InputError(
            "side pools with split heads (page_head, tp_lcm_size > tp_size): SGLang formats its list of "
            "target ranks into the side-pool names; no usable key rule."
        )
    pp = scheme.pp_size > 1
    rank = f"{scheme.tp_rank}_{scheme.pp_rank}" if pp else f"{scheme.tp_rank}"
    if scheme.mla and scheme.dcp_size > 1:
        mla = f"dcp{scheme.dcp_rank}_cp{scheme.attn_cp_rank}" + (f"_{scheme.pp_rank}" if pp else "")
    else:
        mla = f"{scheme.pp_rank}" if pp else ""
    name = spec.name
    if name == "mamba":
        out = [f"_{rank}_conv_{i}" for i in range(spec.conv)]
        return [f"_{rank}_temporal", *out] if spec.temporal else out
    if name in ("draft", "draft_swa"):
        tag = "draft_k" if name == "draft" else "draft_swa"
        if (spec.attention or ("mla" if scheme.mla else "mha")) == "mla":
            return [f"_{mla}_{tag}"]
        return [f"_{rank}_{name}_k", f"_{rank}_{name}_v"]
    if name in _PAGE_PACKED:
        return [f"_{mla}_{name}"]
    if name == "swa":
        return [f"_{mla}_swa"] if scheme.mla else [f"_{rank}_swa_k", f"_{rank}_swa_v"]
    raise InputError(f"no key rule for pool {name!r}.")


@dataclass(frozen=True)
class PoolPreset:
    """The side pools of a real hybrid model, so an operator need not know the suffixes.

    The pool specs carry the model's shapes (public config.json numbers) for `inspect layout`;
    `geometry` names the `--preset` of its KV pool (the full-attention layers only), used when no
    KV geometry is given.
    """

    name: str
    model: str
    mla: bool
    pools: tuple[PoolSpec, ...]
    sliding_window_tokens: int | None = None  # SWA presets: the window, converted to pages per page size
    versions: tuple[str, ...] = (V0_5_14, V0_5_23)
    geometry: str | None = None

    def specs(self, page_size: int) -> list[PoolSpec]:
        if self.sliding_window_tokens is None:
            return list(self.pools)
        # SGLang's full_window_pages: the window rounded up to whole pages.
        window = -(-self.sliding_window_tokens // page_size)
        return [
            replace(p, window=window) if p.hit_policy == TRAILING_PAGES and p.name != "mamba" else p for p in self.pools
        ]


_QWEN3_NEXT_MAMBA = PoolSpec(
    # 36 gated-DeltaNet layers (48, every 4th full attention). Conv state: value heads x dim plus
    # 2 x key heads x dim = 32*128 + 2*16*128 = 8192 channels, kernel 4 - 1 = 3 columns; temporal
    # state: 32 value heads x 128 x 128. SGLang's default state dtypes: conv bf16, temporal fp32.
    "mamba",
    conv=1,
    temporal=True,
    layers=36,
    conv_shapes=((8192, 3),),
    temporal_shape=(32, 128, 128),
    conv_dtype="bfloat16",
    temporal_dtype="float32",
)
PRESETS = {
    p.name: p
    for p in (
        PoolPreset(
            "deepseek-v3-mtp",
            "DeepSeek V3/R1 with EAGLE/MTP speculative decoding (MLA draft, 1 layer)",
            True,
            (PoolSpec("draft", attention="mla", layers=1),),
            geometry="deepseek-v3",
        ),
        PoolPreset(
            "eagle3-mha-on-mla",
            "An EAGLE3 MHA draft model on an MLA target (draft heads: pass "
            "--pool draft:attention=mha,heads=N,head_dim=D for inspect layout)",
            True,
            (PoolSpec("draft", attention="mha", layers=1),),
            geometry="deepseek-v3",
        ),
        PoolPreset(
            "gpt-oss",
            "gpt-oss-120b (18 of 36 layers slide over 128 tokens; 8 KV heads x 64, MHA)",
            False,
            (PoolSpec("swa", layers=18, heads=8, head_dim=64),),
            sliding_window_tokens=128,
            geometry="gpt-oss-120b",
        ),
        PoolPreset(
            "qwen3-next",
            "Qwen3-Next-80B-A3B (gated DeltaNet linear attention: one conv state and a temporal state in 36 layers)",
            False,
            (_QWEN3_NEXT_MAMBA,),
            geometry="qwen3-next-80b-a3b",
        ),
        PoolPreset(
            "deepseek-v3.2",
            "DeepSeek V3.2 (DSA sparse attention: an indexer object per page, MLA, 61 layers)",
            True,
            (PoolSpec("indexer"),),
            geometry="deepseek-v3",
        ),
        PoolPreset(
            "deepseek-v3.2-mtp",
            "DeepSeek V3.2 with MTP (indexer plus a 1-layer MLA draft and draft indexer)",
            True,
            (PoolSpec("indexer"), PoolSpec("draft", attention="mla", layers=1), PoolSpec("draft_indexer")),
            versions=(V0_5_23,),
            geometry="deepseek-v3",
        ),
    )
}


def preset(name: str, version: str) -> PoolPreset:
    if name not in PRESETS:
        raise InputError(f"unknown pool preset {name!r}; presets: {', '.join(PRESETS)}.")
    found = PRESETS[name]
    if family(version) not in found.versions:
        raise InputError(
            f"pool preset {name} needs SGLang {', '.join(found.versions)} (its pools do not exist in {version})."
        )
    return found


def combine_pools(preset_pools: list[PoolSpec], texts: list[str]) -> list[PoolSpec]:
    """A preset's pools, then each `--pool`: one naming a preset pool changes only the options it
    gives (e.g. `--pool mamba:tokens=512`), any other is added (a pool given twice stays twice,
    for the caller to refuse)."""
    out = list(preset_pools)
    for text in texts:
        name, fields = parse_pool_fields(text)
        index = next((i for i, spec in enumerate(preset_pools) if spec.name == name), None)
        if index is None:
            out.append(_build(text, PoolSpec(name, **fields)))
        else:
            out[index] = _build(text, replace(out[index], **fields))
    return out


def side_pools_for(
    pool_texts: Sequence[str] | None, preset_name: str | None, version: str, mla: bool, page_size: int
) -> tuple[PoolSpec, ...]:
    """The side pools `--pool` / `--pool-preset` give a deployment whose attention kind is fixed
    (the engine's geometry): a preset of the other kind is refused rather than followed. The
    engine checks each pool against the version (EngineSpec.check_side_pools)."""
    if preset_name is None:
        return tuple(parse_pool(text) for text in pool_texts or ())
    chosen = preset(preset_name, version)
    if chosen.mla != mla:
        want, have = ("MLA", "MHA") if chosen.mla else ("MHA", "MLA")
        raise InputError(
            f"pool preset {preset_name} is for an {want} model but the engine's geometry is {have}.",
            hint="Pick a geometry (--preset) of the same attention kind, e.g. tiny-mla for MLA presets, tiny for MHA "
            "ones.",
        )
    return tuple(combine_pools(chosen.specs(page_size), list(pool_texts or ())))
