"""`hicache upgrade check`: what moving a deployment from one SGLang release to another changes.

Every rule that differs between the two releases is listed with the release it changed in
(docs/releases.md): the object key prefix and the namespace seed (either one changing makes L3
cold: no object written before the upgrade is read after it; with a master, the objects under
the old prefix are counted), the prefetch limit, budget and retry rule, eviction policies, tree
family, the host-pool ratio default and the start-up rewrites of the deployment's flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field

from hicache_ops.results import Result
from hicache_ops.sglang import policy
from hicache_ops.sglang.deployment import DeploymentSettings
from hicache_ops.sglang.page_keys import (
    MODEL_PREFIX_SINCE,
    NAMESPACE_SEED_SINCE,
    WIDE_TOKENS_SINCE,
    Deployment,
    namespace_seed,
)
from hicache_ops.sglang.rewrites import resolve_layout
from hicache_ops.sglang.versions import UNIFIED_TREE_SINCE, VersionChoice, parse, resolve_version, since

# The Rust tree core is the UnifiedRadixCache default since 0.5.21 (srt/environ.py).
RUST_TREE_SINCE = "0.5.21"
# The hicache_ratio field default becomes None, resolved at start-up (server_args.py), and
# buffer_only gets 1.2 (arg_groups/hicache_hook.py).
RATIO_RESOLVED_SINCE = "0.5.18"
BUFFER_ONLY_RATIO_SINCE = "0.5.19"


@dataclass
class UpgradeDeployment:
    """The deployment flags an upgrade is judged for (SGLang's names)."""

    model_name: str | None = None
    extra_backend_tag: str | None = None
    extra_key: str | None = None
    cache_salt: str | None = None
    page_size: int = 64
    tp_size: int = 1
    pp_size: int = 1
    mla: bool = False
    layout: str = "page_first"
    io_backend: str = "kernel"
    hicache_ratio: float | None = None
    host_memory_mode: str | None = None
    disaggregation_decode: bool = False

    @classmethod
    def of(
        cls, settings: DeploymentSettings, *, extra_key: str | None = None, cache_salt: str | None = None
    ) -> UpgradeDeployment:
        """The deployment's settings, judged for no release in particular (each rule takes its own)."""
        dep, sizing = settings.topology, settings.sizing
        return cls(
            model_name=dep.model_name,
            extra_backend_tag=dep.extra_backend_tag,
            extra_key=extra_key,
            cache_salt=cache_salt,
            page_size=dep.page_size or 64,
            tp_size=dep.tp_size,
            pp_size=dep.pp_size,
            mla=dep.mla,
            layout=dep.layout,
            io_backend=sizing.io_backend,
            hicache_ratio=sizing.hicache_ratio,
            host_memory_mode=sizing.host_memory_mode,
        )


def tree_family(version: str) -> str:
    if not since(version, UNIFIED_TREE_SINCE):
        return "HiRadixCache"
    core = "rust" if since(version, RUST_TREE_SINCE) else "python"
    return f"UnifiedRadixCache ({core} tree core)"


def ratio_default(version: str, dep: UpgradeDeployment) -> str:
    """What the host pool is sized by when --hicache-ratio is not given."""
    if dep.hicache_ratio is not None:
        return f"{dep.hicache_ratio:g} (given)"
    if not since(version, RATIO_RESOLVED_SINCE):
        return "2.0"
    if dep.disaggregation_decode:
        return "resolved by the decode server's retraction backup (1.0 host_pool, else 2.0)"
    if dep.host_memory_mode == "buffer_only" and since(version, BUFFER_ONLY_RATIO_SINCE):
        return "1.2 (buffer_only)"
    return "2.0"


@dataclass(frozen=True)
class Rule:
    name: str
    since: tuple[str, ...]
    source: str
    value: Callable[[str, UpgradeDeployment], object]


def _prefix(version: str, dep: UpgradeDeployment) -> str:
    deployment = Deployment(
        version=version,
        model_name=dep.model_name,
        extra_backend_tag=dep.extra_backend_tag,
        tp_size=dep.tp_size,
        pp_size=dep.pp_size,
        mla=dep.mla,
        page_size=dep.page_size,
    )
    return deployment.schemes()[0].prefix


def _rewrites(version: str, dep: UpgradeDeployment) -> dict:
    res = resolve_layout(dep.layout, dep.io_backend, True, version=version)
    return {"layout": res.layout, "io_backend": res.io_backend, "notes": res.notes}


RULES: tuple[Rule, ...] = (
    Rule(
        "object key prefix",
        (MODEL_PREFIX_SINCE,),
        "srt/mem_cache/storage/mooncake_store/mooncake_store.py",
        _prefix,
    ),
    Rule(
        "namespace seed",
        (NAMESPACE_SEED_SINCE,),
        "srt/mem_cache/utils.py",
        lambda v, d: namespace_seed(v, d.extra_key, d.cache_salt),
    ),
    Rule(
        "token ids above 2**32",
        (WIDE_TOKENS_SINCE,),
        "srt/mem_cache/cpp_utils/native_hash.py",
        lambda v, d: "hashed as tagged 8-byte pages" if since(v, WIDE_TOKENS_SINCE) else "refused (raise)",
    ),
    Rule(
        "prefetch in-flight limit",
        (policy.HOST_HALF_LIMIT_SINCE,),
        "srt/managers/cache_controller.py",
        lambda v, d: policy.prefetch_limit_rule(v).split(": ", 1)[1],
    ),
    Rule(
        "prefetch host allocation",
        (policy.HOST_AT_HIT_SINCE,),
        "srt/mem_cache/hiradix_cache.py",
        lambda v, d: (
            "at hit time, sized to the hit" if policy.allocates_host_at_hit(v) else "the requested span at issue"
        ),
    ),
    Rule(
        "timeout budget",
        (policy.UNIFIED_BUDGET_SINCE, policy.REQUESTED_BUDGET_SINCE),
        "srt/mem_cache/hiradix_cache.py, srt/mem_cache/unified_radix_cache.py",
        lambda v, d: policy.budget_rule(v).split(": ", 1)[1],
    ),
    Rule(
        "rate-limited prefetch retry",
        (policy.RETRY_FLAGS_SINCE, policy.RETRY_DEFAULT_ON_SINCE),
        "srt/server_args.py, srt/arg_groups/fields/memory.py, srt/managers/scheduler.py",
        lambda v, d: policy.retry_rule(v).split(" ", 1)[1],
    ),
    Rule(
        "radix eviction policies",
        (policy.TLRU_SINCE,),
        "srt/mem_cache/utils.py",
        lambda v, d: ", ".join(policy.eviction_policies(v)),
    ),
    Rule(
        "tree",
        (UNIFIED_TREE_SINCE, RUST_TREE_SINCE),
        "srt/mem_cache/registry.py, srt/environ.py",
        lambda v, d: tree_family(v),
    ),
    Rule(
        "host eviction size",
        (policy.SHORTFALL_EVICTION_SINCE,),
        "srt/mem_cache/unified_radix_cache.py",
        lambda v, d: "the shortfall" if policy.backs_up_unbacked_ancestors(v) else "the whole allocation",
    ),
    Rule(
        "device eviction for a KV allocation",
        (policy.SHORTFALL_EXTEND_EVICTION_SINCE,),
        "srt/mem_cache/common.py",
        lambda v, d: (
            "the shortfall of the demand"
            if since(v, policy.SHORTFALL_EXTEND_EVICTION_SINCE)
            else "the whole demand once short"
        ),
    ),
    Rule(
        "write_back drop of a leaf its backup cannot place",
        (policy.WRITE_BACK_DROP_SINCE,),
        "srt/mem_cache/hiradix_cache.py, srt/mem_cache/unified_radix_cache.py",
        lambda v, d: (
            "dropped with its host-only subtree" if policy.drops_unbacked_write_back(v) else "kept on the device"
        ),
    ),
    Rule(
        "write_back victims of an eviction pass",
        (policy.WRITE_BACK_VICTIMS_HELD_UNTIL,),
        "srt/mem_cache/hiradix_cache.py, srt/mem_cache/unified_radix_cache.py",
        lambda v, d: (
            "held from host eviction until the pass ends"
            if policy.defers_write_back_victims(v)
            else "demoted one at a time"
        ),
    ),
    Rule(
        "write_back host reclaim",
        (policy.WRITE_BACK_RECLAIM_SINCE,),
        "srt/mem_cache/unified_radix_cache.py",
        lambda v, d: "yes" if since(v, policy.WRITE_BACK_RECLAIM_SINCE) else "no",
    ),
    Rule(
        "hits counted",
        (policy.HIT_ONCE_SINCE,),
        "srt/mem_cache/unified_radix_cache.py",
        lambda v, d: "every insert" if policy.counts_every_insert(v) else "once per request (inserted_len)",
    ),
    Rule(
        "hicache ratio default",
        (RATIO_RESOLVED_SINCE, BUFFER_ONLY_RATIO_SINCE),
        "srt/server_args.py, srt/arg_groups/hicache_hook.py",
        ratio_default,
    ),
    Rule("start-up rewrites", ("0.5.16",), "srt/server_args.py, srt/arg_groups/hicache_hook.py", _rewrites),
)


@dataclass
class UpgradeReport:
    source: VersionChoice
    target: VersionChoice
    changes: list[dict] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    cold: bool = False
    old_prefix: str = ""
    new_prefix: str = ""
    objects_under_old_prefix: int | None = None
    master: str | None = None
    verdict: str = ""
    notes: list[str] = field(default_factory=list)

    def result(self) -> UpgradeResult:
        return UpgradeResult(
            from_=ReleaseRules(**self.source.to_dict()),
            to=ReleaseRules(**self.target.to_dict()),
            cold=self.cold,
            old_prefix=self.old_prefix,
            new_prefix=self.new_prefix,
            master=self.master,
            objects_under_old_prefix=self.objects_under_old_prefix,
            verdict=self.verdict,
            changes=[UpgradeChange.model_validate(c) for c in self.changes],
            unchanged=self.unchanged,
            notes=self.notes,
        )


class ReleaseRules(Result):
    version: str = Field(description="the release whose rules apply")
    requested: str | None = Field(description="the release asked for")
    reason: str = Field(description="the option that asked for it")
    notes: list[str] = Field(description="why other rules apply than the release asked for (unknown, newer)")


class UpgradeChange(Result):
    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True)

    rule: str = Field(description="what changes (`key prefix`, `namespace seed`, `prefetch limit`, ...)")
    from_: Any = Field(alias="from", description="its value under the old release")
    to: Any = Field(description="its value under the new release")
    since: list[str] = Field(description="the releases between them that change it")
    sglang_file: str = Field(description="the SGLang file the rule comes from")


class UpgradeResult(Result):
    """`hicache upgrade check --json`."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True)

    from_: ReleaseRules = Field(alias="from", description="the release upgraded from")
    to: ReleaseRules = Field(description="the release upgraded to")
    cold: bool = Field(description="the new release reads none of the old release's objects (prefix or seed changes)")
    old_prefix: str = Field(description="the object key prefix the old release writes")
    new_prefix: str = Field(description="the one the new release reads")
    master: str | None = Field(description="with --master: the admin address asked")
    objects_under_old_prefix: int | None = Field(
        description="with --master: objects under the old prefix (never read again when cold)"
    )
    verdict: str = Field(description="the answer in one sentence")
    changes: list[UpgradeChange] = Field(description="every rule whose value changes for this deployment")
    unchanged: list[str] = Field(description="the rules that stay as they are")
    notes: list[str] = Field(description="plain-language remarks (a downgrade, unknown releases)")


def count_prefix_objects(master: str, prefix: str, timeout: float) -> int:
    """Objects in the store whose SGLang key prefix is exactly `prefix` (warm-up keys excluded)."""
    from hicache_ops.commands.inspect.store_listing import group_keys
    from hicache_ops.mooncake.admin import AdminClient

    with AdminClient(master, timeout=timeout) as admin:
        keys = admin.get_all_keys()
    grouped = group_keys(keys, limit=len(keys) + 1)
    return sum(g["objects"] for g in grouped["groups"] if g["prefix"] == prefix)


def check_upgrade(
    source: str,
    target: str,
    deployment: UpgradeDeployment | None = None,
    *,
    master: str | None = None,
    timeout: float = 3.0,
) -> UpgradeReport:
    """Every rule whose value differs between `source` and `target` for `deployment`."""
    dep = deployment or UpgradeDeployment()
    a = resolve_version(source, reason="--from")
    b = resolve_version(target, reason="--to")
    report = UpgradeReport(source=a, target=b, master=master, notes=[*a.notes, *b.notes])
    if parse(a.version) > parse(b.version):
        report.notes.append(f"--from {source} is newer than --to {target}: this is a downgrade.")
    for rule in RULES:
        old, new = rule.value(a.version, dep), rule.value(b.version, dep)
        if old == new:
            report.unchanged.append(rule.name)
            continue
        between = [s for s in rule.since if parse(min(a.version, b.version, key=parse)) < parse(s)]
        between = [s for s in between if parse(s) <= parse(max(a.version, b.version, key=parse))]
        report.changes.append(
            {
                "rule": rule.name,
                "from": old,
                "to": new,
                "since": between or list(rule.since),
                "sglang_file": rule.source,
            }
        )
    report.old_prefix, report.new_prefix = _prefix(a.version, dep), _prefix(b.version, dep)
    seed_changed = any(c["rule"] == "namespace seed" for c in report.changes)
    prefix_changed = report.old_prefix != report.new_prefix
    report.cold = prefix_changed or seed_changed
    if master is not None:
        report.objects_under_old_prefix = count_prefix_objects(master, report.old_prefix, timeout)
    report.verdict = _verdict(report, prefix_changed, seed_changed)
    return report


def _verdict(report: UpgradeReport, prefix_changed: bool, seed_changed: bool) -> str:
    n = report.objects_under_old_prefix
    counted = "" if n is None else f", {n} objects will never be read again"
    old = report.old_prefix or "(no prefix)"
    new = report.new_prefix or "(no prefix)"
    if prefix_changed:
        return f"every object key changes prefix ({old} -> {new}): L3 is cold after the upgrade{counted}."
    if seed_changed:
        at_most = "" if n is None else f"; up to {n} objects under {old} are not read again"
        return (
            "the namespace seed changes: every page key of this deployment's requests changes, "
            f"L3 is cold for them after the upgrade{at_most}."
        )
    kept = "" if n is None else f" ({n} objects under {old})"
    return f"object keys stay the same: L3 stays warm across the upgrade{kept}."
