"""Side pools: the objects SGLang's v2 storage calls write per page besides the main KV
(docs/side-pools.md), their hit policies and presets for real hybrid models.

A pool is named as SGLang's `PoolName` value and described by a `PoolSpec`; `pool_suffixes`
gives what follows the page key for one rank (`ObjectKeyScheme`), in the order SGLang's
Mooncake store zips them with the pool's buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .keys import ObjectKeyScheme
from .versions import V0_5_14, V0_5_23

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
    V0_5_23: ("mamba", "swa", "indexer", *_DEEPSEEK_V4_BOTH, *_DEEPSEEK_V4_0_5_23, "draft", "draft_indexer", "draft_swa"),
}
# One page-packed object per page under the MLA suffix (docs/side-pools.md#side-pool-object-keys).
_PAGE_PACKED = {"indexer", "draft_indexer", *_DEEPSEEK_V4_BOTH, *_DEEPSEEK_V4_0_5_23}
# Pools SGLang registers with the trailing-pages policy (docs/side-pools.md#hit-policies): Mamba
# needs the state of the last page; SWA (and what takes its indices from SWA) its window.
_TRAILING = {"mamba", "swa", "draft_swa", "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state", "deepseek_v4_c128_state"}
ALL_PAGES = "all_pages"
TRAILING_PAGES = "trailing_pages"


@dataclass(frozen=True)
class PoolSpec:
    """One side pool of a deployment.

    `attention` is the pool's own attention kind where SGLang picks suffixes from the pool's
    class (`draft`, `draft_swa`); None means the deployment's. `conv` / `temporal` describe a
    Mamba pool (conv states, whether the temporal state has elements); `window` is the
    trailing-pages window of an SWA-indexed pool (Mamba always 1).
    """

    name: str
    attention: str | None = None
    conv: int = 1
    temporal: bool = True
    window: int = 1

    @property
    def hit_policy(self) -> str:
        return TRAILING_PAGES if self.name in _TRAILING else ALL_PAGES

    @property
    def trailing_pages(self) -> int | None:
        if self.hit_policy != TRAILING_PAGES:
            return None
        return 1 if self.name == "mamba" else self.window

    def to_text(self) -> str:
        """The `--pool` text that gives this spec back (parse_pool)."""
        options = [f"attention={self.attention}"] if self.attention else []
        if self.name == "mamba":
            options += [f"conv={self.conv}", f"temporal={int(self.temporal)}"]
        if self.hit_policy == TRAILING_PAGES and self.name != "mamba":
            options.append(f"window={self.window}")
        return self.name + (":" + ",".join(options) if options else "")

    def to_json(self, suffixes: list[str]) -> dict:
        return {
            "name": self.name,
            "suffixes": suffixes,
            "hit_policy": self.hit_policy,
            "trailing_pages": self.trailing_pages,
        }


def parse_pool(text: str) -> PoolSpec:
    """`NAME[:k=v,...]` as `--pool` takes it: attention=mla|mha, conv=N, temporal=0|1, window=PAGES."""
    name, _, options = text.partition(":")
    name = name.strip()
    if not name:
        raise InputError(f"--pool {text!r} has no pool name.")
    fields: dict = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--pool {text!r}: option {item!r} is not KEY=VALUE.")
        if key == "attention":
            if value not in ("mla", "mha"):
                raise InputError(f"--pool {text!r}: attention is mla or mha, not {value!r}.")
            fields["attention"] = value
        elif key in ("conv", "window"):
            if not value.isdigit() or (key == "window" and int(value) < 1):
                raise InputError(f"--pool {text!r}: {key} must be a {'positive' if key == 'window' else 'non-negative'} integer.")
            fields[key] = int(value)
        elif key == "temporal":
            if value not in ("0", "1"):
                raise InputError(f"--pool {text!r}: temporal is 0 or 1, not {value!r}.")
            fields["temporal"] = value == "1"
        else:
            raise InputError(f"--pool {text!r}: unknown option {key!r} (attention, conv, temporal, window).")
    return PoolSpec(name, **fields)


def check_pool(spec: PoolSpec, version: str, mla: bool) -> None:
    """InputError when SGLang `version` has no such pool or would refuse to key it."""
    if spec.name == "kv":
        raise InputError("kv is the main pool: its objects are always listed; --pool names side pools.")
    if spec.name == "auxiliary_swa":
        raise InputError(
            "auxiliary_swa has no Mooncake key rule: SGLang's Mooncake store refuses it "
            "(docs/side-pools.md#side-pool-object-keys)."
        )
    if spec.name not in SIDE_POOLS[version]:
        known = [v for v, names in SIDE_POOLS.items() if spec.name in names]
        raise InputError(
            f"SGLang {version} has no pool {spec.name!r}"
            + (f" (it exists in {', '.join(known)})." if known else f"; its side pools: {', '.join(SIDE_POOLS[version])}."),
        )
    if spec.attention is not None and spec.name not in ("draft", "draft_swa"):
        raise InputError(f"pool {spec.name}: attention= applies to draft and draft_swa, whose class picks the suffixes.")
    if spec.name == "swa" and not mla and spec.attention == "mla":
        raise InputError("pool swa: an MHA deployment keys SWA as K/V; SGLang has no rule for an MLA SWA pool there.")
    if spec.name == "mamba":
        if spec.conv == 0 and not spec.temporal:
            raise InputError("pool mamba: with conv=0 and temporal=0 there is nothing to store.")
        if version == V0_5_14 and not spec.temporal:
            raise InputError(
                "pool mamba: SGLang 0.5.14 always writes the temporal object (0.5.23 drops it when empty); "
                "temporal=0 applies to 0.5.23."
            )


def pool_suffixes(spec: PoolSpec, scheme: ObjectKeyScheme) -> list[str]:
    """What follows the page key in each of `spec`'s objects for one rank, in SGLang's order."""
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
    """The side pools of a real hybrid model, so an operator need not know the suffixes."""

    name: str
    model: str
    mla: bool
    pools: tuple[PoolSpec, ...]
    sliding_window_tokens: int | None = None  # SWA presets: the window, converted to pages per page size
    versions: tuple[str, ...] = (V0_5_14, V0_5_23)

    def specs(self, page_size: int) -> list[PoolSpec]:
        if self.sliding_window_tokens is None:
            return list(self.pools)
        # SGLang's full_window_pages: the window rounded up to whole pages.
        window = -(-self.sliding_window_tokens // page_size)
        return [
            PoolSpec(p.name, p.attention, p.conv, p.temporal, window) if p.hit_policy == TRAILING_PAGES and p.name != "mamba" else p
            for p in self.pools
        ]


PRESETS = {
    p.name: p
    for p in (
        PoolPreset("deepseek-v3-mtp", "DeepSeek V3/R1 with EAGLE/MTP speculative decoding (MLA draft)", True,
                   (PoolSpec("draft", attention="mla"),)),
        PoolPreset("eagle3-mha-on-mla", "An EAGLE3 MHA draft model on an MLA target", True,
                   (PoolSpec("draft", attention="mha"),)),
        PoolPreset("gpt-oss", "gpt-oss (sliding window 128 tokens, MHA)", False,
                   (PoolSpec("swa"),), sliding_window_tokens=128),
        PoolPreset("qwen3-next", "Qwen3-Next (gated DeltaNet linear attention: one conv state and a temporal state)",
                   False, (PoolSpec("mamba", conv=1, temporal=True),)),
        PoolPreset("deepseek-v3.2", "DeepSeek V3.2 (DSA sparse attention: an indexer object per page, MLA)", True,
                   (PoolSpec("indexer"),)),
        PoolPreset("deepseek-v3.2-mtp", "DeepSeek V3.2 with MTP (indexer plus MLA draft and draft indexer)", True,
                   (PoolSpec("indexer"), PoolSpec("draft", attention="mla"), PoolSpec("draft_indexer")),
                   versions=(V0_5_23,)),
    )
}


def preset(name: str, version: str) -> PoolPreset:
    if name not in PRESETS:
        raise InputError(f"unknown pool preset {name!r}; presets: {', '.join(PRESETS)}.")
    found = PRESETS[name]
    if version not in found.versions:
        raise InputError(f"pool preset {name} needs SGLang {', '.join(found.versions)} (its pools do not exist in {version}).")
    return found


def side_pools_for(pool_texts, preset_name: str | None, version: str, mla: bool, page_size: int) -> tuple[PoolSpec, ...]:
    """The side pools `--pool` / `--pool-preset` give a deployment whose attention kind is fixed
    (the engine's geometry): a preset of the other kind is refused rather than followed. The
    engine checks each pool against the version (EngineSpec.check_side_pools)."""
    pools = [parse_pool(text) for text in pool_texts or ()]
    if preset_name is not None:
        chosen = preset(preset_name, version)
        if chosen.mla != mla:
            want, have = ("MLA", "MHA") if chosen.mla else ("MHA", "MLA")
            raise InputError(
                f"pool preset {preset_name} is for an {want} model but the engine's geometry is {have}.",
                hint="Pick a geometry (--preset) of the same attention kind, e.g. tiny-mla for MLA presets, tiny for MHA ones.",
            )
        pools = chosen.specs(page_size) + pools
    return tuple(pools)
