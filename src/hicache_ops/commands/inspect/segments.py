"""Can this host read the segments a master lists? (docs/mooncake.md#several-hosts)

A reader fetches an object by dialling the Transfer Engine endpoint of the segment that holds it,
as the master lists it. Two failures look alike from SGLang (a read error, then a recompute):
  loopback     the segment advertises a loopback address while the master is not on loopback:
               its owner set local_hostname (MOONCAKE_LOCAL_HOSTNAME, LOCAL_HOSTNAME, the config's
               local_hostname) to 127.0.0.1/localhost, so every other host dials itself;
  unreachable  no TCP connection to the endpoint from here within the probe's timeout (the owner
               died and the client TTL has not run out yet, a partition, a firewall).
Probes run in parallel, each bounded, so a listing of many segments stays quick. Where a lab is up
on this machine, a segment with a problem is also attributed to the lab host that owns it
(src/hicache_ops/commands/lab/owners.py): a loopback segment's name alone names no host.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hicache_ops.commands.lab.owners import describe, segment_owners
from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.mooncake.net import is_loopback, parse_host_port, tcp_probe

PROBE_TIMEOUT_S = 1.0
SAMPLED_OBJECTS = 512  # objects whose replicas the live diff locates: one /batch_query_keys

LOOPBACK_FIX = (
    "On the host that owns it, set MOONCAKE_LOCAL_HOSTNAME (or the config's local_hostname) to an "
    "address other hosts can reach, and restart it (docs/mooncake.md#advertised-hostname)."
)
UNREACHABLE_FIX = (
    "Check that the owner still runs (a dead client's segment stays listed until its TTL ends) and "
    "that this host can reach its address and Transfer Engine port (routes, firewall)."
)


def probe_endpoint(endpoint: str, *, master_host: str, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """{"endpoint", "loopback", "reachable", "problem", "reason"} for one HOST:PORT."""
    try:
        host, port = parse_host_port(endpoint, what="Transfer Engine endpoint")
    except InputError:
        return {
            "endpoint": endpoint,
            "loopback": False,
            "reachable": False,
            "problem": "unreachable",
            "reason": "not HOST:PORT",
        }
    loopback = is_loopback(host) and not is_loopback(master_host)
    try:
        tcp_probe(host, port, timeout=timeout, what="Transfer Engine")
        reachable, reason = True, ""
    except UnreachableError as exc:
        reachable, reason = False, exc.message
    problem = "loopback" if loopback else (None if reachable else "unreachable")
    return {"endpoint": endpoint, "loopback": loopback, "reachable": reachable, "problem": problem, "reason": reason}


def probe_endpoints(
    endpoints: Sequence[str], *, master_host: str, timeout: float = PROBE_TIMEOUT_S
) -> dict[str, dict[str, Any]]:
    unique = list(dict.fromkeys(endpoints))
    if not unique:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(unique))) as pool:
        results = pool.map(lambda e: probe_endpoint(e, master_host=master_host, timeout=timeout), unique)
        return dict(zip(unique, results, strict=True))


def check_segments(
    segments: list[dict[str, Any]], *, master_host: str, timeout: float = PROBE_TIMEOUT_S
) -> list[dict[str, Any]]:
    """Add te_reachable / endpoint_problem / endpoint_note to each segment row of inspect store, and
    for a segment with a problem the lab host owning it (host, host_candidates, host_basis; None
    and [] where no lab is up)."""
    probes = probe_endpoints(
        [s["te_endpoint"] or s["name"] or "" for s in segments], master_host=master_host, timeout=timeout
    )
    for seg in segments:
        probe = probes[seg["te_endpoint"] or seg["name"] or ""]
        seg["te_reachable"] = probe["reachable"]
        seg["endpoint_problem"] = probe["problem"]
    owners = segment_owners((s["name"], s["te_endpoint"]) for s in segments if s["endpoint_problem"])
    for seg in segments:
        probe = probes[seg["te_endpoint"] or seg["name"] or ""]
        owner = owners.get(seg["name"])
        seg["host"] = owner["host"] if owner else None
        seg["host_candidates"] = owner["candidates"] if owner else []
        seg["host_basis"] = owner["basis"] if owner else None
        on = f" It belongs to {describe(owner)}." if owner else ""
        if probe["problem"] == "loopback":
            seg["endpoint_note"] = (
                f"advertises the loopback endpoint {probe['endpoint']}: other hosts dial themselves "
                f"and cannot read its objects.{on} " + LOOPBACK_FIX
            )
        elif probe["problem"] == "unreachable":
            seg["endpoint_note"] = (
                f"this host cannot reach {probe['endpoint']} ({probe['reason']}).{on} " + UNREACHABLE_FIX
            )
        else:
            seg["endpoint_note"] = ""
    return segments


def unreachable_holders(
    admin: AdminClient, keys: Sequence[str], *, timeout: float = PROBE_TIMEOUT_S
) -> list[dict[str, Any]]:
    """Live-diff entries for present objects whose every replica sits on a segment this host cannot reach.

    Locates at most SAMPLED_OBJECTS of `keys` (the objects SGLang would read first) in one
    /batch_query_keys. Skipped for a master on loopback: its clients share this host, and a dead
    owner's segment is already flagged by inspect store.
    """
    sample = [k for k in keys if "," not in k][:SAMPLED_OBJECTS]
    if is_loopback(admin.host) or not sample:
        return []
    located: dict[str, list[str]] = {}
    for key, answer in admin.batch_query_keys(sample).items():
        replicas = answer.get("values") if isinstance(answer, dict) and answer.get("ok") else None
        reported = [r.get("transport_endpoint_") for r in replicas or [] if isinstance(r, dict)]
        named = [e for e in reported if isinstance(e, str) and e]
        if named and len(named) == len(reported):  # every replica names its endpoint
            located[key] = named
    probes = probe_endpoints([e for eps in located.values() for e in eps], master_host=admin.host, timeout=timeout)
    bad: dict[str, list[str]] = {}
    for key, endpoints in located.items():
        if all(probes[e]["problem"] for e in endpoints):
            bad.setdefault(endpoints[0], []).append(key)
    if not bad:
        return []
    segment_of = {s.get("te_endpoint"): s.get("segment_name") for s in admin.segments_detail()}
    owners = segment_owners((segment_of.get(e) or e, e) for e in bad)
    out = []
    for endpoint, held in bad.items():
        probe = probes[endpoint]
        why = (
            "a loopback endpoint, so this host dials itself"
            if probe["problem"] == "loopback"
            else f"unreachable: {probe['reason']}"
        )
        owner = owners.get(segment_of.get(endpoint) or endpoint)
        on = f", owned by {describe(owner)}" if owner else ""
        out.append(
            {
                "kind": "unreachable_segment",
                "endpoint": endpoint,
                "segment": segment_of.get(endpoint),
                "host": owner["host"] if owner else None,
                "host_candidates": owner["candidates"] if owner else [],
                "problem": probe["problem"],
                "objects": held,
                "message": f"{held[0]} is present on the master but the segment holding it is unreachable from here "
                f"(segment {segment_of.get(endpoint) or '?'}{on}, Transfer Engine endpoint {endpoint}, {why}); "
                f"{len(held)} of the {len(located)} objects located live there, so reads fail and SGLang recomputes.",
                "hint": LOOPBACK_FIX if probe["problem"] == "loopback" else UNREACHABLE_FIX,
            }
        )
    return out
