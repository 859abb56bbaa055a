"""A server's L3 object layout as side pools (docs/side-pools.md#l3-layout-endpoint).

SGLang 0.5.23 publishes, per deployment, the pools its Mooncake store writes, each pool's object
suffixes, hit policy and trailing window, built by the same code that names the objects. When the
reply is enabled, its pools replace the `--pool` flags: its suffixes are what the server writes,
so lookups use them even where this toolkit's key rule says otherwise; every such difference is
reported (`rule_disagreements`), and so is every difference with pools the user also gave
(`pool_disagreements`). A disabled reply (MHA model, Mamba or MHA draft pools, another backend)
says why; the pools then come from the flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hicache_ops.errors import InputError
from hicache_ops.sglang.page_keys import Deployment, ObjectKeyScheme
from hicache_ops.sglang.side_pool_specs import ALL_PAGES, SIDE_POOLS, TRAILING_PAGES, PoolSpec, pool_suffixes
from hicache_ops.sglang.versions import V0_5_23, family

if TYPE_CHECKING:
    from hicache_ops.sglang.views import L3LayoutView

# Hit policies Mooncake's batch_exists_v2 evaluates; block_groups makes it raise.
_LOOKUP_POLICIES = (ALL_PAGES, TRAILING_PAGES)
FROM_LAYOUT = "l3_layout"
FROM_FLAGS = "flags"
SOURCE_TEXT = {FROM_LAYOUT: "from the server's L3 layout", FROM_FLAGS: "from --pool flags"}

Stages = tuple[tuple[int, tuple[str, ...]], ...]  # ((pp_rank, suffixes), ...)


@dataclass(frozen=True)
class L3Layout:
    """One `/get_hicache_l3_cache_layout` reply, read and checked."""

    enabled: bool
    reason: str | None
    backend: str | None
    page_size: int | None
    key_prefix: str | None = None
    is_mla: bool | None = None
    pp_size: int = 1
    kv_suffixes: Stages = ()
    side_pools: tuple[PoolSpec, ...] = ()

    @property
    def stages(self) -> list[int]:
        return [pp for pp, _ in self.kv_suffixes] or sorted({pp for p in self.side_pools for pp, _ in p.served or ()})

    def view(self, rule_disagreements: list[dict[str, Any]] | None = None) -> L3LayoutView:
        from hicache_ops.sglang.views import L3LayoutView

        return L3LayoutView(
            enabled=self.enabled,
            reason=self.reason,
            backend=self.backend,
            page_size=self.page_size,
            key_prefix=self.key_prefix,
            is_mla_backend=self.is_mla,
            pp_size=self.pp_size,
            kv_suffixes=flat_suffixes(self.kv_suffixes),
            pools=[spec.view(flat_suffixes(spec.served or ())) for spec in self.side_pools],
            rule_disagreements=rule_disagreements,
        )


def flat_suffixes(stages: Stages) -> list[str]:
    """Every stage's suffixes, in stage order."""
    return [s for _, suffixes in stages for s in suffixes]


def _malformed(what: str) -> InputError:
    return InputError(
        f"the server's L3 layout reply is malformed: {what}.",
        hint="Compare it with docs/side-pools.md#l3-layout-endpoint; drop --sglang-url to use flags only.",
    )


def _entry(raw: Any, at: int) -> tuple[str, list[str], str, int | None]:
    if not isinstance(raw, dict):
        raise _malformed(f"pools[{at}] is {type(raw).__name__}, not an object")
    name, suffixes, policy = raw.get("pool"), raw.get("suffixes"), raw.get("hit_policy")
    if not isinstance(name, str) or not name:
        raise _malformed(f"pools[{at}] has no pool name")
    if not isinstance(suffixes, list) or not suffixes or not all(isinstance(s, str) and s for s in suffixes):
        raise _malformed(f"pool {name} has no list of suffixes")
    if policy not in _LOOKUP_POLICIES:
        raise _malformed(f"pool {name} has hit policy {policy!r}, not one of {', '.join(_LOOKUP_POLICIES)}")
    window = raw.get("trailing_pages")
    if policy == TRAILING_PAGES and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise _malformed(f"pool {name} is trailing_pages without a positive trailing_pages count")
    return name, suffixes, policy, window if policy == TRAILING_PAGES else None


def parse_l3_layout(reply: Any) -> L3Layout:
    """Read a layout reply; InputError (exit 2) when it is not the shape SGLang 0.5.23 sends.

    With pipeline parallelism the merged reply lists each stage's pools in stage order and no
    `pp_rank`; a single stage's reply names its `pp_rank`.
    """
    if not isinstance(reply, dict) or not isinstance(reply.get("enabled"), bool):
        raise _malformed("no boolean 'enabled'")
    backend, page_size = reply.get("backend"), reply.get("page_size")
    if not reply["enabled"]:
        reason = reply.get("reason")
        return L3Layout(False, reason if isinstance(reason, str) and reason else "no reason given", backend, page_size)
    inner = reply.get("hicache_object_layout")
    if not isinstance(inner, dict) or not isinstance(inner.get("pools"), list):
        raise _malformed("no hicache_object_layout with a list of pools")
    pp_size, pp_rank = inner.get("pp_size", 1), inner.get("pp_rank")
    if isinstance(pp_size, bool) or not isinstance(pp_size, int) or pp_size < 1:
        raise _malformed(f"pp_size {pp_size!r} is not a positive integer")
    if pp_rank is not None and (
        isinstance(pp_rank, bool) or not isinstance(pp_rank, int) or not 0 <= pp_rank < pp_size
    ):
        raise _malformed(f"pp_rank {pp_rank!r} is outside 0..{pp_size - 1}")
    key_prefix, mla = inner.get("key_prefix"), inner.get("is_mla_backend")
    if key_prefix is not None and not isinstance(key_prefix, str):
        raise _malformed("key_prefix is neither a string nor null")
    stages = [pp_rank] if pp_rank is not None else list(range(pp_size))
    entries = [_entry(raw, at) for at, raw in enumerate(inner["pools"])]
    by_name: dict[str, list[Any]] = {}
    for entry in entries:
        by_name.setdefault(entry[0], []).append(entry)
    for name, found in by_name.items():
        if len(found) != len(stages):
            raise _malformed(f"pool {name} is listed {len(found)} time(s) for {len(stages)} pipeline stage(s)")
        if len({(policy, window) for _, _, policy, window in found}) > 1:
            raise _malformed(f"pool {name} has another hit policy in another pipeline stage")
    if not by_name:
        raise _malformed("an enabled layout lists no pools")

    def served(name: str) -> Stages:
        return tuple((pp, tuple(suffixes)) for pp, (_, suffixes, _, _) in zip(stages, by_name[name], strict=True))

    side = tuple(
        PoolSpec(name, window=found[0][3] or 1, policy=found[0][2], served=served(name))
        for name, found in by_name.items()
        if name != "kv"
    )
    return L3Layout(
        True,
        None,
        backend,
        page_size,
        key_prefix,
        mla if isinstance(mla, bool) else None,
        pp_size,
        served("kv") if "kv" in by_name else (),
        side,
    )


def _stage_schemes(deployment: Deployment, stages: list[int]) -> dict[int, ObjectKeyScheme]:
    """The first rank (tp 0, DCP shard 0) of each pipeline stage the layout describes."""
    out: dict[int, ObjectKeyScheme] = {}
    for scheme in deployment.schemes(every_rank=True):
        out.setdefault(scheme.pp_rank, scheme)
    return {pp: out[pp] for pp in stages if pp in out}


def rule_disagreements(layout: L3Layout, deployment: Deployment) -> list[dict[str, Any]]:
    """Where the layout differs from this toolkit's key rule for `deployment`:
    `[{pool, field, server, rule}]`, field one of pool (a name we do not know), suffixes, hit_policy,
    trailing_pages, pp_size."""
    out: list[dict[str, Any]] = []
    if layout.pp_size != deployment.pp_size:
        out.append({"pool": None, "field": "pp_size", "server": layout.pp_size, "rule": deployment.pp_size})
    schemes = _stage_schemes(deployment, layout.stages)
    ours_kv = [s for pp in layout.stages if pp in schemes for s in schemes[pp].suffixes]
    if layout.kv_suffixes and ours_kv != flat_suffixes(layout.kv_suffixes):
        out.append({"pool": "kv", "field": "suffixes", "server": flat_suffixes(layout.kv_suffixes), "rule": ours_kv})
    for spec in layout.side_pools:
        if spec.name not in SIDE_POOLS[family(deployment.version)]:
            out.append({"pool": spec.name, "field": "pool", "server": spec.name, "rule": None})
            continue
        rule = PoolSpec(spec.name)
        try:
            ours = [s for pp, _ in spec.served or () if pp in schemes for s in pool_suffixes(rule, schemes[pp])]
        except InputError:
            ours = None
        if ours != flat_suffixes(spec.served or ()):
            out.append(
                {"pool": spec.name, "field": "suffixes", "server": flat_suffixes(spec.served or ()), "rule": ours}
            )
        if rule.hit_policy != spec.hit_policy:
            out.append({"pool": spec.name, "field": "hit_policy", "server": spec.hit_policy, "rule": rule.hit_policy})
        elif spec.name == "mamba" and spec.trailing_pages != rule.trailing_pages:
            out.append({"pool": spec.name, "field": "trailing_pages", "server": spec.trailing_pages, "rule": 1})
    return out


def flag_disagreements(layout: L3Layout, flags: list[PoolSpec], deployment: Deployment) -> list[dict[str, Any]]:
    """Where pools given by flags differ from the layout's: `[{pool, field, server, flag}]`, field one
    of pool (present on one side only: the value says which), suffixes, hit_policy, trailing_pages."""
    served = {spec.name: spec for spec in layout.side_pools}
    given = {spec.name: spec for spec in flags}
    schemes = _stage_schemes(deployment, layout.stages)
    out: list[dict[str, Any]] = []
    for name in [*served, *(n for n in given if n not in served)]:
        if name not in given or name not in served:
            out.append({"pool": name, "field": "pool", "server": name in served, "flag": name in given})
            continue
        ours, theirs = given[name], served[name]
        flag_suffixes = [s for pp, _ in theirs.served or () if pp in schemes for s in pool_suffixes(ours, schemes[pp])]
        if flag_suffixes != flat_suffixes(theirs.served or ()):
            out.append(
                {"pool": name, "field": "suffixes", "server": flat_suffixes(theirs.served or ()), "flag": flag_suffixes}
            )
        for attr in ("hit_policy", "trailing_pages"):
            if getattr(ours, attr) != getattr(theirs, attr):
                out.append({"pool": name, "field": attr, "server": getattr(theirs, attr), "flag": getattr(ours, attr)})
    return out


@dataclass
class PoolChoice:
    """The side pools a command uses, where they came from, and what disagreed on the way."""

    pools: list[PoolSpec]
    source: str  # FROM_LAYOUT or FROM_FLAGS
    layout: L3Layout | None = None
    pool_disagreements: list[dict[str, Any]] = field(default_factory=list)
    rule_disagreements: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def source_text(self) -> str:
        return SOURCE_TEXT[self.source]

    def result_fields(self) -> dict[str, Any]:
        """The fields --sglang-url's pool choice adds to a command's result: where the pools came
        from, the server's layout (with our key rule's disagreements) and the flags that differ."""
        layout = None if self.layout is None else self.layout.view(self.rule_disagreements)
        return {"pool_source": self.source, "l3_layout": layout, "pool_disagreements": self.pool_disagreements}


def choose_pools(reply: dict[str, Any] | None, flags: list[PoolSpec], deployment: Deployment) -> PoolChoice:
    """The layout's side pools when `reply` is enabled (flags compared with them), else `flags`.

    `reply` is the server's raw layout (None: it publishes none, as 0.5.14 or an older 0.5.23).
    """
    if reply is None:
        # 0.5.14 has no such route; a 0.5.23 server without one is older than the route.
        missing = ["the server publishes no L3 layout; side pools come from --pool flags."]
        return PoolChoice(list(flags), FROM_FLAGS, notes=missing if family(deployment.version) == V0_5_23 else [])
    layout = parse_l3_layout(reply)
    if not layout.enabled:
        note = f"the server's L3 layout is disabled ({layout.reason}); side pools come from --pool flags."
        return PoolChoice(list(flags), FROM_FLAGS, layout, notes=[note])
    choice = PoolChoice(
        list(layout.side_pools), FROM_LAYOUT, layout, rule_disagreements=rule_disagreements(layout, deployment)
    )
    if flags:
        choice.pool_disagreements = flag_disagreements(layout, flags, deployment)
    if deployment.dcp_size > 1:
        choice.notes.append(
            "with DCP the L3 layout names the replying DCP shard's objects; they are used for every shard."
        )
    return choice
