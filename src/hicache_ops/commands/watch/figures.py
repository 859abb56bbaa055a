"""Figures per instance, per rank and for the master, from a target's window of samples.

A figure is {"total", "delta", "rate"}: the newest value, its growth over the window and that
growth per second (None with one sample only). Which release's meanings apply decides how L2
counters are read (docs/metrics.md#l2-counters-and-tp-ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hicache_ops.commands.watch.catalog import BY_NAME, RANK_LABELS, SGLANG_METRICS
from hicache_ops.commands.watch.sampler import Labels, Sample, Target
from hicache_ops.sglang.versions import SUPPORTED_VERSIONS, V0_5_14, V0_5_23

TIERS = ("device", "host", "storage")


def _grew(old: float | None, new: float) -> float:
    if old is None:
        return new
    return new - old if new >= old else new  # a counter that went down was reset


def figure(first: Sample | None, last: Sample, name: str, combine=sum, scale: float = 1.0, **match: str) -> dict:
    """The figure of the series `name` (matching `match`), its label sets combined by `combine`."""
    new = last.series(name, **match)
    total = combine(new.values()) / scale if new else 0.0
    if first is None or first is last:
        return {"total": total, "delta": None, "rate": None}
    old = first.series(name, **match)
    deltas = [_grew(old.get(k), v) for k, v in new.items()]
    delta = combine(deltas) / scale if deltas else 0.0
    seconds = last.at - first.at
    return {"total": total, "delta": delta, "rate": delta / seconds if seconds > 0 else None}


def _is_storage(source: str | None) -> bool:
    return source is not None and (source == "storage" or source.startswith("storage_"))


def _max(values) -> float:
    values = list(values)
    return max(values) if values else 0.0


def rank_of(labels: Labels) -> dict[str, str]:
    have = dict(labels)
    return {k: have[k] for k in RANK_LABELS if k in have}


def _rank_key(rank: dict[str, str]) -> str:
    return ",".join(f"{k}={rank[k]}" for k in RANK_LABELS if k in rank) or "all"


def meanings(target: Target, given: str | None) -> tuple[str, str]:
    """(release whose meanings apply, where that came from)."""
    info = target.info or {}
    version = str(info.get("version") or "")
    for supported in SUPPORTED_VERSIONS:
        if version == supported or version.startswith(supported + "."):
            return supported, f"/server_info version {version}"
    if given:
        return given, "--sglang-version"
    last = target.last
    if last is not None and any(last.has(m.name) for m in SGLANG_METRICS if m.since == V0_5_23):
        return V0_5_23, "inferred: metrics that exist only from 0.5.23 are exported"
    return V0_5_14, "inferred: no metric that exists only from 0.5.23 is exported"


def _hist_mean(first: Sample | None, last: Sample, name: str) -> float | None:
    s = figure(first, last, name + "_sum")
    c = figure(first, last, name + "_count")
    use = "delta" if s["delta"] is not None else "total"
    return s[use] / c[use] if c[use] else None


def instance_figures(target: Target, sglang_version: str | None = None) -> dict:
    """Everything `watch` shows for one SGLang server."""
    first, last = target.first, target.last
    version, source = meanings(target, sglang_version)
    if first is last:
        first = None
    out: dict = {"url": target.url, "meanings": version, "meanings_from": source, "error": target.error}
    if last is None:
        return out
    tp_size = int((target.info or {}).get("tp_size") or 0) or None
    out["seconds"] = (last.at - first.at) if first is not None else None

    def fig(name, combine=sum, scale=1.0, **match):
        return figure(first, last, name, combine, scale, **match)

    prompt = fig("sglang:prompt_tokens_total")
    tiers = {tier: fig("sglang:cached_tokens_total", cache_source=tier) for tier in ("device", "host")}
    # 0.5.14 labels the L3 tier storage_<backend> (storage_mooncake), 0.5.23 storage.
    tiers["storage"] = fig("sglang:cached_tokens_total", cache_source=_is_storage)
    basis = "window" if prompt["delta"] is not None else "since start"
    key = "delta" if basis == "window" else "total"
    for tier in TIERS:
        tiers[tier]["share"] = tiers[tier][key] / prompt[key] if prompt[key] else None
    cached = sum(tiers[t][key] for t in TIERS)
    out["tokens"] = {
        "prompt": prompt,
        **tiers,
        "computed_share": (1 - cached / prompt[key]) if prompt[key] else None,
        "basis": basis,
    }

    # L3 counters carry rank labels in both releases: the instance figure is the leading rank's.
    unfulfilled: dict[str, dict] = {}
    for labels in last.series("sglang:storage_prefetch_unfulfilled_tokens_total"):
        reason = dict(labels).get("reason", "")
        unfulfilled.setdefault(reason, fig("sglang:storage_prefetch_unfulfilled_tokens_total", _max, reason=reason))
    deferred: dict[str, dict] = {}
    for labels in last.series("sglang:storage_prefetch_deferred_tokens_total"):
        reason = dict(labels).get("reason", "")
        deferred.setdefault(reason, fig("sglang:storage_prefetch_deferred_tokens_total", _max, reason=reason))
    out["prefetch"] = {
        "issued": fig("sglang:storage_prefetch_hit_tokens_total", _max)
        if last.has("sglang:storage_prefetch_hit_tokens_total")
        else None,
        "fetched": fig("sglang:prefetched_tokens_total", _max),
        "unfulfilled": unfulfilled,
        "deferred": deferred,
        "bandwidth_gb_s": _hist_mean(first, last, "sglang:prefetch_bandwidth"),
    }
    out["backup"] = {
        "to_l3": fig("sglang:backuped_tokens_total", _max),
        "dropped_before_l3": fig("sglang:hicache_backup_dropped_tokens_total", _max)
        if last.has("sglang:hicache_backup_dropped_tokens_total")
        else None,
        "bandwidth_gb_s": _hist_mean(first, last, "sglang:backup_bandwidth"),
    }

    # L2 counters: 0.5.23 labels every rank with the same logical count (read one: the max);
    # 0.5.14 has no rank labels and the multiprocess registry sums the ranks (divide by tp_size).
    if version == V0_5_14:
        scale = float(tp_size or 1)
        out["l2_counters"] = (
            f"summed over tp ranks by 0.5.14; divided by tp_size {tp_size}"
            if tp_size
            else "summed over tp ranks by 0.5.14; tp_size unknown (no /server_info), shown as summed"
        )
        combine: Callable[[Any], float] = sum
    else:
        scale, combine = 1.0, _max
        out["l2_counters"] = "one rank's count (0.5.23 labels each rank with the same logical count)"

    def l2(name, **match):
        # 0.5.23's pool label: sum pools within a rank, then read one rank.
        new = last.series(name, **match)
        ranks: dict[str, dict] = {}
        for labels in new:
            ranks.setdefault(_rank_key(rank_of(labels)), rank_of(labels))
        if version == V0_5_14 or not ranks:
            return fig(name, combine, scale, **match)
        per = [fig(name, sum, 1.0, **match, **r) for r in ranks.values()]
        best = max(per, key=lambda f: f["total"])
        return best

    out["evicted"] = l2("sglang:evicted_tokens_total")
    out["load_back"] = l2("sglang:load_back_tokens_total")
    out["l2_backup"] = (
        l2("sglang:hicache_backup_tokens_total") if last.has("sglang:hicache_backup_tokens_total") else None
    )
    out["l2_dropped"] = (
        l2("sglang:hicache_dropped_tokens_total") if last.has("sglang:hicache_dropped_tokens_total") else None
    )

    used = last.series("sglang:hicache_host_used_tokens")
    total = last.series("sglang:hicache_host_total_tokens")
    pools: list[dict[str, Any]] = []
    for labels, cap in total.items():
        u = used.get(labels, 0.0)
        pools.append({"rank": rank_of(labels), "used": u, "total": cap, "ratio": u / cap if cap else None})
    fullest = max(pools, key=lambda p: p["ratio"] or 0.0) if pools else None
    out["host_pool"] = fullest

    # Per rank: the L3 counters of each rank side by side.
    ranks: dict[str, dict] = {}
    for name in ("sglang:prefetched_tokens_total", "sglang:backuped_tokens_total"):
        for labels in last.series(name):
            r = rank_of(labels)
            ranks.setdefault(_rank_key(r), r)
    out["ranks"] = [
        {
            "rank": r,
            "fetched": fig("sglang:prefetched_tokens_total", sum, 1.0, **r),
            "to_l3": fig("sglang:backuped_tokens_total", sum, 1.0, **r),
        }
        for _, r in sorted(ranks.items())
    ]
    out["not_exported"] = sorted(m.name for m in SGLANG_METRICS if m.exists_in(version) and not _exported(last, m))
    return out


def _exported(sample: Sample, metric) -> bool:
    if metric.kind == "histogram":
        return sample.has(metric.name + "_count")
    return sample.has(metric.name)


def master_figures(target: Target) -> dict:
    first, last = target.first, target.last
    out: dict = {"url": target.url, "error": target.error}
    if last is None:
        return out
    if first is last:
        first = None

    def fig(name):
        return figure(first, last, name)

    cap = fig("master_total_capacity_bytes")["total"]
    used = fig("master_allocated_bytes")["total"]
    out.update(
        {
            "seconds": (last.at - first.at) if first is not None else None,
            "capacity_bytes": cap,
            "used_bytes": used,
            "used_ratio": used / cap if cap else None,
            "keys": fig("master_key_count")["total"],
            "clients": fig("master_active_clients")["total"],
            "evictions": fig("master_successful_evictions_total"),
            "evicted_keys": fig("master_evicted_key_count"),
            "puts": _sum_figs(fig("master_put_start_requests_total"), fig("master_batch_put_start_requests_total")),
            "batch_puts": fig("master_batch_put_start_requests_total"),
            "put_failures": _sum_figs(
                fig("master_put_start_failures_total"), fig("master_batch_put_start_failures_total")
            ),
            "put_partial": fig("master_batch_put_start_partial_successes_total"),
            "put_failed_keys": fig("master_batch_put_start_failed_items_total"),
            "gets": _sum_figs(
                fig("master_get_replica_list_requests_total"), fig("master_batch_get_replica_list_requests_total")
            ),
            "get_failures": _sum_figs(
                fig("master_get_replica_list_failures_total"), fig("master_batch_get_replica_list_failures_total")
            ),
            "get_partial": fig("master_batch_get_replica_list_partial_successes_total"),
        }
    )
    return out


def _sum_figs(a: dict, b: dict) -> dict:
    out = {"total": a["total"] + b["total"]}
    for k in ("delta", "rate"):
        out[k] = None if a[k] is None or b[k] is None else a[k] + b[k]
    return out


__all__ = ["BY_NAME", "figure", "instance_figures", "master_figures", "meanings"]
