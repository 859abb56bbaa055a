"""Verdicts from the window's figures, worst first, each naming what to run next.

Every verdict and its threshold is listed in docs/metrics.md#verdicts; alerts/hicache.rules.yml
holds the same conditions as Prometheus rules.
"""

from __future__ import annotations

# Thresholds (docs/metrics.md#verdicts).
PREFETCH_UNFULFILLED_SHARE = 0.2  # of the tokens an L3 query reported
DROPPED_SHARE = 0.05  # of the backup tokens (written + dropped)
HOST_POOL_FULL = 0.95
MASTER_FULL = 0.95
RANK_LAG = 0.5  # a rank below half the busiest rank's rate
# Reasons the stop policy or the threshold cut a prefetch (docs/metrics.md#unfulfilled-reasons).
POLICY_REASONS = ("deadline", "below_threshold")


def _d(fig) -> float:
    return (fig or {}).get("delta") or 0.0


def _verdict(kind: str, severity: str, where: str, message: str, next_step: str) -> dict:
    return {"kind": kind, "severity": severity, "where": where, "message": message, "next": next_step}


def instance_verdicts(inst: dict, master: dict | None) -> list[dict]:
    url = inst["url"]
    if inst.get("error"):
        return [_verdict("unreachable", "critical", url, inst["error"], "hicache playbook run master-unreachable")]
    if inst.get("seconds") is None:
        return []
    out = []
    tokens, prefetch, backup = inst["tokens"], inst["prefetch"], inst["backup"]
    prompt = _d(tokens["prompt"])
    storage_hit = _d(tokens["storage"])
    issued = _d(prefetch["issued"]) if prefetch["issued"] is not None else _d(prefetch["fetched"])
    what = "L3 queries reported" if prefetch["issued"] is not None else "prefetches fetched"
    if issued > 0 and prompt > 0 and storage_hit == 0:
        out.append(
            _verdict(
                "storage_hit_zero",
                "critical",
                url,
                f"storage hit 0% of {prompt:.0f} prompt tokens while {what} {issued:.0f} tokens.",
                "hicache playbook run short-storage-hit",
            )
        )
    unfulfilled = {r: _d(f) for r, f in prefetch["unfulfilled"].items() if _d(f) > 0}
    if (
        prefetch["issued"] is not None
        and issued > 0
        and sum(unfulfilled.values()) >= PREFETCH_UNFULFILLED_SHARE * issued
    ):
        top = max(unfulfilled, key=lambda reason: unfulfilled[reason])
        share = sum(unfulfilled.values()) / issued
        playbook = "no-l3-hit" if top in POLICY_REASONS else "recomputed-after-get"
        out.append(
            _verdict(
                "prefetch_unfulfilled",
                "warning",
                url,
                f"{share:.0%} of the {issued:.0f} tokens L3 reported were not prefetched, mostly {top} "
                f"({unfulfilled[top]:.0f} tokens).",
                f"hicache playbook run {playbook}",
            )
        )
    written, dropped = _d(backup["to_l3"]), _d(backup["dropped_before_l3"])
    if dropped > 0 and dropped >= DROPPED_SHARE * (written + dropped):
        out.append(
            _verdict(
                "backup_dropped",
                "warning",
                url,
                f"{dropped / (written + dropped):.0%} of the L3 backup tokens were dropped before reaching L3 "
                f"({dropped:.0f} of {written + dropped:.0f}).",
                "hicache playbook run no-l3-hit",
            )
        )
    pool = inst.get("host_pool")
    if pool and pool["ratio"] is not None and pool["ratio"] >= HOST_POOL_FULL:
        out.append(
            _verdict(
                "host_pool_full",
                "warning",
                url,
                f"host pool {pool['ratio']:.0%} used ({pool['used']:.0f} of {pool['total']:.0f} tokens).",
                f"hicache inspect layout --sglang-url {url}",
            )
        )
    if master and master.get("seconds") is not None and written > 0 and _d(master["puts"]) == 0:
        out.append(
            _verdict(
                "puts_not_reaching_master",
                "critical",
                url,
                f"SGLang wrote {written:.0f} tokens to L3 but the master saw no put: a Mooncake client/master "
                "version skew (puts fail silently) or the instance uses another master.",
                f"hicache inspect store --master {master['url'].split('://', 1)[1]}",
            )
        )
    ranks = [r for r in inst.get("ranks", []) if r["fetched"]["delta"] is not None]
    for key in ("fetched", "to_l3"):
        busiest = max((_d(r[key]) for r in ranks), default=0.0)
        for r in ranks:
            if len(ranks) > 1 and busiest > 0 and _d(r[key]) < RANK_LAG * busiest:
                where = ",".join(f"{k}={v}" for k, v in r["rank"].items())
                out.append(
                    _verdict(
                        "rank_lagging",
                        "warning",
                        f"{url} {where}",
                        f"rank {where} moved {_d(r[key]):.0f} tokens ({key}) while the busiest rank moved "
                        f"{busiest:.0f}.",
                        "hicache playbook run no-l3-hit",
                    )
                )
    return out


def master_verdicts(master: dict) -> list[dict]:
    url = master["url"]
    address = url.split("://", 1)[1]
    if master.get("error"):
        return [_verdict("unreachable", "critical", url, master["error"], "hicache playbook run master-unreachable")]
    out = []
    ratio = master.get("used_ratio")
    if (ratio is not None and ratio >= MASTER_FULL) or _d(master.get("evictions")) > 0:
        used = f"{ratio:.0%}" if ratio is not None else "?"
        out.append(
            _verdict(
                "master_full",
                "warning",
                url,
                f"L3 {used} used and {_d(master.get('evictions')):.0f} eviction pass(es) in the window.",
                f"hicache playbook run master-unreachable --master {address}",
            )
        )
    failed = _d(master.get("put_failures")) + _d(master.get("put_partial"))
    if failed > 0:
        out.append(
            _verdict(
                "put_failures",
                "critical",
                url,
                f"{failed:.0f} put request(s) failed or partly failed at the master in the window.",
                f"hicache inspect store --master {address}",
            )
        )
    return out


SEVERITY = {"critical": 0, "warning": 1}


def all_verdicts(instances: list[dict], master: dict | None) -> list[dict]:
    found = []
    for inst in instances:
        found += instance_verdicts(inst, master)
    if master is not None:
        found += master_verdicts(master)
    return sorted(found, key=lambda v: SEVERITY.get(v["severity"], 9))
