"""`hicache inspect store`: what a Mooncake master holds, grouped the way SGLang names objects.

SGLang writes `{prefix}{page_key}_{rank}_{k|v}` (FACTS §2): prefix "" or "{tag}_", "{model}_",
"{tag}_{model}_" (0.5.23 writes '/' in the model name as '-'); page_key 64 hex; rank "{tp}" or
"{tp}_{pp}" for MHA, "" (so `__k`) or "{pp}" for MLA. Keys are grouped by prefix; within a group
every page key is checked for K/V completeness (each rank that writes a V wrote its K and V) and
rank completeness (every rank seen in the group wrote the page). SGLang's warm-up objects
(`sglang_mooncake_store_warmup_key<uuid>`, one per client start) are counted apart; keys of any
other shape are "other".
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .keys import WARMUP_KEY_PREFIX
from .mooncake.admin import AdminClient

# {prefix}{64 hex}_{rank}_{k|v}; prefix is empty or ends with "_"; rank may be empty (MLA `__k`).
_OBJECT_KEY = re.compile(r"^(?P<prefix>(?:.*_)?)(?P<page>[0-9a-f]{64})_(?P<rank>[A-Za-z0-9_]*?)_(?P<kv>[kv])$")

_METRIC_NAMES = (
    "master_key_count",
    "master_active_clients",
    "master_allocated_bytes",
    "master_total_capacity_bytes",
    "master_evicted_key_count",
)


@dataclass(frozen=True)
class ObjectKeyParts:
    """One object key split the way SGLang composed it."""

    prefix: str
    page_key: str
    rank: str  # "0", "0_1", "" (MLA without PP), "dcp0_cp0", ...
    kv: str  # "k" or "v"

    @property
    def suffix(self) -> str:
        return f"_{self.rank}_{self.kv}"


def parse_object_key(key: str) -> ObjectKeyParts | None:
    """Split an SGLang object key into prefix, page key, rank part and k/v; None for other shapes."""
    m = _OBJECT_KEY.match(key)
    if m is None:
        return None
    return ObjectKeyParts(m["prefix"], m["page"], m["rank"], m["kv"])


def is_warmup_key(key: str) -> bool:
    return key.startswith(WARMUP_KEY_PREFIX)


@dataclass
class PrefixGroup:
    prefix: str
    objects: int = 0
    pages: dict[str, set[str]] = field(default_factory=dict)  # page key -> suffixes present

    def summary(self, limit: int) -> dict:
        suffix_counts: Counter[str] = Counter()
        ranks_with_v: set[str] = set()
        ranks: set[str] = set()
        for suffixes in self.pages.values():
            suffix_counts.update(suffixes)
        for suffix in suffix_counts:
            rank, kv = suffix[1:-2], suffix[-1]
            ranks.add(rank)
            if kv == "v":
                ranks_with_v.add(rank)
        expected = sorted({f"_{r}_k" for r in ranks} | {f"_{r}_v" for r in ranks_with_v}, key=_suffix_order)
        complete = kv_incomplete = 0
        incomplete: list[dict] = []
        for page_key, suffixes in self.pages.items():
            missing = [s for s in expected if s not in suffixes]
            if not missing:
                complete += 1
                continue
            if any((f"_{r}_k" in suffixes) != (f"_{r}_v" in suffixes) for r in ranks_with_v):
                kv_incomplete += 1
            if len(incomplete) < limit:
                incomplete.append(
                    {"page_key": page_key, "present": sorted(suffixes, key=_suffix_order), "missing": missing}
                )
        if not ranks_with_v:
            kind = "mla"
        elif ranks_with_v == ranks:
            kind = "mha"
        else:
            kind = "mixed"
        return {
            "prefix": self.prefix,
            "kind": kind,
            "objects": self.objects,
            "pages": len(self.pages),
            "suffixes": {s: suffix_counts[s] for s in sorted(suffix_counts, key=_suffix_order)},
            "complete_pages": complete,
            "incomplete_pages": len(self.pages) - complete,
            "kv_incomplete_pages": kv_incomplete,
            "incomplete": incomplete,
            "page_keys": sorted(self.pages)[:limit],
        }


def _suffix_order(suffix: str) -> tuple:
    rank = suffix[1:-2]
    parts = tuple(int(p) if p.isdigit() else p for p in rank.split("_")) if rank else ()
    return (len(parts), [str(p).zfill(8) for p in parts], suffix[-1])


def group_keys(keys: list[str], *, prefix_filter: str | None = None, limit: int = 20) -> dict:
    """Group object keys by SGLang prefix; warm-up and other keys counted apart."""
    groups: dict[str, PrefixGroup] = {}
    warmup = 0
    other: list[str] = []
    matched = 0
    for key in keys:
        if prefix_filter and not key.startswith(prefix_filter):
            continue
        matched += 1
        if is_warmup_key(key):
            warmup += 1
            continue
        parts = parse_object_key(key)
        if parts is None:
            other.append(key)
            continue
        group = groups.get(parts.prefix)
        if group is None:
            group = groups[parts.prefix] = PrefixGroup(parts.prefix)
        group.objects += 1
        group.pages.setdefault(parts.page_key, set()).add(parts.suffix)
    ordered = sorted(groups.values(), key=lambda g: (-g.objects, g.prefix))
    return {
        "prefix_filter": prefix_filter,
        "matched_keys": matched,
        "warmup_keys": warmup,
        "other_keys": len(other),
        "groups": [g.summary(limit) for g in ordered[:limit]],
        "group_count": len(ordered),
        "other_key_samples": sorted(other)[:limit],
        "truncated": len(ordered) > limit
        or len(other) > limit
        or any(len(g.pages) > limit for g in ordered[:limit]),
    }


def _segment_row(seg: dict) -> dict:
    return {
        "name": seg.get("segment_name"),
        "protocol": seg.get("protocol"),
        "status": seg.get("status"),
        "te_endpoint": seg.get("te_endpoint"),
        "size_bytes": int(seg.get("size_bytes") or seg.get("allocator_capacity_bytes") or 0),
        "used_bytes": int(seg.get("allocator_used_bytes") or 0),
        "usage_percent": float(seg.get("allocator_usage_percent") or 0.0),
    }


def inspect_store(master: str, *, prefix: str | None = None, limit: int = 20, timeout: float = 3.0) -> dict:
    """Health, segments, key counts and SGLang key groups of the master at HOST:METRICS_PORT.

    Raises InputError for a malformed address, UnreachableError when the master does not answer.
    """
    from .errors import InputError

    if limit < 0:
        raise InputError(f"--limit {limit} must be >= 0.")
    with AdminClient(master, timeout=timeout) as admin:
        health = admin.health()
        segments = [_segment_row(s) for s in admin.segments_detail()]
        metrics = admin.metrics()
        keys = admin.get_all_keys()
    grouped = group_keys(keys, prefix_filter=prefix or None, limit=limit)
    ready = bool(health.get("service_ready", health.get("status") == "ok"))
    return {
        "master": admin.address,
        "ready": ready,
        "health": health,
        "segments": segments,
        "capacity_bytes": sum(s["size_bytes"] for s in segments),
        "used_bytes": sum(s["used_bytes"] for s in segments),
        "key_count": len(keys),
        "metrics": {name: metrics[name] for name in _METRIC_NAMES if name in metrics},
        "limit": limit,
        **grouped,
    }


def pages_by_prefix(keys: list[str], page_keys: set[str]) -> dict[str, dict[str, set[str]]]:
    """For the given page keys only: page key -> {prefix -> suffixes present}, from a key listing."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for key in keys:
        parts = parse_object_key(key)
        if parts is not None and parts.page_key in page_keys:
            out[parts.page_key][parts.prefix].add(parts.suffix)
    return out
