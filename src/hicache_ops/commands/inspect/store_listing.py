"""`hicache inspect store`: what a Mooncake master holds, grouped the way SGLang names objects.

SGLang writes `{prefix}{page_key}_{rank}_{k|v}` (docs/keys.md#object-keys): prefix "" or
"{tag}_", "{model}_", "{tag}_{model}_" (0.5.23 writes '/' in the model name as '-'); page_key 64
hex; rank "{tp}" or "{tp}_{pp}" for MHA, "" (so `__k`) or "{pp}" for MLA. A 0.5.23 DCP deployment
ends its prefix with `tp{t}_dcp{d}_page{p}_pp{q}_cp{c}_` and names each DCP shard
`dcp{r}_cp{s}[_{pp}]` (docs/keys.md#dcp). Keys are grouped by prefix; within a group every page key
is checked for K/V completeness (each rank that writes a V wrote its K and V) and rank completeness
(every rank seen in the group wrote the page; for a DCP prefix, every shard its topology names).
Side-pool objects (docs/side-pools.md#side-pool-object-keys: `_{rank}_temporal`, `_{rank}_conv_{i}`,
`_{rank}_draft_k`, `__indexer`, `_{rank}_swa_k`, ...) are grouped with their prefix, page and pool;
each pool reports its completeness and the KV pages it lacks entirely.
SGLang's warm-up objects (`sglang_mooncake_store_warmup_key<uuid>`, one per client start) are
counted apart, and so are keys of the unified key scheme (docs/keys.md#unified-key-scheme), which
no 0.5.23 flag selects, and the namespace markers hicache serves leave on the master (one per
extra_key/cache_salt, docs/serve-api.md#namespaces-on-the-master), each named with its namespace;
keys of any other shape are "other".
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hicache_ops.commands.inspect.segments import check_segments
from hicache_ops.errors import SettingError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.sglang.l3_layout import FROM_LAYOUT, L3Layout, flat_suffixes, parse_l3_layout
from hicache_ops.sglang.page_keys import WARMUP_KEY_PREFIX, dcp_topology

if TYPE_CHECKING:
    from hicache_ops.commands.inspect.results import StoreResult

_HEX64 = re.compile(r"[0-9a-f]{64}")
_RANK_PART = re.compile(r"[A-Za-z0-9]+")
# {page_key}_ukv{schema}-{16 hex}_L{start}-{end}[_H{head_group}], after any prefix.
_UNIFIED_KEY = re.compile(r"[0-9a-f]{64}_ukv\d+-[0-9a-f]{16}_L\d+-\d+(?:_H\d+)?$")
# A side-pool object after its page key: a rank part as SGLang writes it (MHA `{tp}[_{pp}]`, MLA
# ``, `{pp}` or `dcp{d}_cp{c}[_{pp}]`), then the pool's component.
_SIDE_OBJECT = re.compile(
    r"_(?P<rank>(?:\d+(?:_\d+)?|dcp\d+_cp\d+(?:_\d+)?)?)_"
    r"(?P<component>temporal|conv_\d+|draft_swa_[kv]|draft_swa|draft_indexer|draft_[kv]|swa_[kv]|swa|indexer|deepseek_v4_[a-z0-9_]+)$"
)
_SIDE_POOL_OF = {"temporal": "mamba", "conv": "mamba", "draft": "draft", "swa": "swa", "indexer": "indexer"}

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
    kv: str  # "k" or "v"; for a side pool its component ("temporal", "conv_0", "draft_k", "indexer", ...)
    pool: str = "kv"

    @property
    def suffix(self) -> str:
        return f"_{self.rank}_{self.kv}"


def _pool_of(component: str) -> str:
    if component.startswith("deepseek_v4_"):
        return component
    if component.startswith(("draft_swa", "draft_indexer")):
        return component.removesuffix("_k").removesuffix("_v")
    return _SIDE_POOL_OF[component.split("_")[0]]


def _split_side_key(key: str, parts: list[str]) -> tuple[str, str, str, str, str] | None:
    """(prefix, page key, rank, component, pool) of a side-pool object; None for any other shape."""
    for i in range(len(parts) - 2, -1, -1):
        part = parts[i]
        if len(part) == 64 and _HEX64.fullmatch(part):
            match = _SIDE_OBJECT.fullmatch("_" + "_".join(parts[i + 1 :]))
            if match is None:
                return None
            component = match["component"]
            return ("_".join(parts[:i]) + "_" if i else "", part, match["rank"], component, _pool_of(component))
    return None


def _split_any(key: str) -> tuple[str, ...] | None:
    """A KV split (prefix, page key, rank, k|v) or a side-pool split (..., component, pool)."""
    parts = key.split("_")
    if len(parts) >= 3 and (parts[-1] not in ("k", "v") or parts[-2] in ("draft", "swa")):
        side = _split_side_key(key, parts)
        if side is not None:
            return side
    return _split_key(key)


def _split_key(key: str) -> tuple[str, str, str, str] | None:
    parts = key.split("_")
    n = len(parts)
    if n < 3 or parts[-1] not in ("k", "v"):
        return None
    for i in range(n - 3, -1, -1):  # the page key is the last 64-hex part followed by rank and k/v
        part = parts[i]
        if len(part) == 64 and _HEX64.fullmatch(part):
            if i == n - 3:  # the common case: one rank part
                rank = parts[i + 1]
                if rank and not _RANK_PART.fullmatch(rank):
                    return None
            else:
                rank_parts = parts[i + 1 : -1]
                if not all(_RANK_PART.fullmatch(r) for r in rank_parts):
                    return None
                rank = "_".join(rank_parts)
            return ("_".join(parts[:i]) + "_" if i else "", part, rank, parts[-1])
    return None


def parse_object_key(key: str) -> ObjectKeyParts | None:
    """Split an SGLang object key into prefix, page key, rank part and k/v; None for other shapes.

    Side-pool objects come back with their pool and component (docs/side-pools.md).
    Shape: {prefix}{64 hex}_{rank}_{k|v}; the prefix is empty or ends with "_", the rank is
    "_"-joined alphanumeric parts or empty (MLA `__k`). Split on "_" (no backtracking regex:
    this runs over every key a master lists).
    """
    split = _split_any(key)
    return None if split is None else ObjectKeyParts(*split)


def is_warmup_key(key: str) -> bool:
    return key.startswith(WARMUP_KEY_PREFIX)


@dataclass
class PrefixGroup:
    prefix: str
    objects: int = 0
    pages: dict[str, set[str]] = field(default_factory=dict)  # page key -> suffixes present
    suffix_counts: Counter[str] = field(default_factory=Counter)
    pools: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # pool -> page key -> suffixes

    def pool_summaries(self, limit: int) -> list[dict[str, Any]]:
        """Per side pool: its suffixes, pages complete (every suffix the pool shows in this group), the
        pages it holds without KV and the KV pages it lacks entirely."""
        out = []
        for name in sorted(self.pools):
            pages = self.pools[name]
            counts = Counter(s for suffixes in pages.values() for s in suffixes)
            want = len(counts)
            incomplete = [
                {"page_key": k, "present": sorted(v), "missing": sorted(set(counts) - v)}
                for k, v in pages.items()
                if len(v) != want
            ]
            without_pool = [k for k in self.pages if k not in pages]
            out.append(
                {
                    "pool": name,
                    "objects": sum(counts.values()),
                    "pages": len(pages),
                    "suffixes": dict(sorted(counts.items())),
                    "complete_pages": len(pages) - len(incomplete),
                    "incomplete_pages": len(incomplete),
                    "incomplete": incomplete[:limit],
                    "pages_without_kv": sum(1 for k in pages if k not in self.pages),
                    "kv_pages_without_pool": len(without_pool),
                    "kv_pages_without_pool_keys": heapq.nsmallest(limit, without_pool),
                }
            )
        return out

    def summary(self, limit: int) -> dict[str, Any]:
        ranks_with_v: set[str] = set()
        ranks: set[str] = set()
        for suffix in self.suffix_counts:
            rank, kv = suffix[1:-2], suffix[-1]
            ranks.add(rank)
            if kv == "v":
                ranks_with_v.add(rank)
        topology = dcp_topology(self.prefix)
        if topology is not None:
            ranks |= _dcp_shards(topology)  # a shard that never wrote is missing from every page
        expected = sorted({f"_{r}_k" for r in ranks} | {f"_{r}_v" for r in ranks_with_v}, key=_suffix_order)
        want = len(expected)
        complete = kv_incomplete = 0
        incomplete: list[dict[str, Any]] = []
        for page_key, suffixes in self.pages.items():
            if len(suffixes) == want:  # every suffix seen is an expected one
                complete += 1
                continue
            if any((f"_{r}_k" in suffixes) != (f"_{r}_v" in suffixes) for r in ranks_with_v):
                kv_incomplete += 1
            if len(incomplete) < limit:
                incomplete.append(
                    {
                        "page_key": page_key,
                        "present": sorted(suffixes, key=_suffix_order),
                        "missing": [s for s in expected if s not in suffixes],
                    }
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
            "dcp": topology,
            "objects": self.objects,
            "pages": len(self.pages),
            "suffixes": {s: self.suffix_counts[s] for s in sorted(self.suffix_counts, key=_suffix_order)},
            "complete_pages": complete,
            "incomplete_pages": len(self.pages) - complete,
            "kv_incomplete_pages": kv_incomplete,
            "incomplete": incomplete,
            "page_keys": heapq.nsmallest(limit, self.pages),
            "pools": self.pool_summaries(limit),
        }


def _dcp_shards(topology: dict[str, Any]) -> set[str]:
    """The rank parts of every object a DCP deployment writes per page: one per DCP/CP shard and stage."""
    pp = topology["pp_size"]
    return {
        f"dcp{d}_cp{c}" + (f"_{p}" if pp > 1 else "")
        for d in range(topology["dcp_size"])
        for c in range(topology["attn_cp_size"])
        for p in range(pp)
    }


def _suffix_order(suffix: str) -> tuple[int, list[str], str]:
    rank = suffix[1:-2]
    parts = tuple(int(p) if p.isdigit() else p for p in rank.split("_")) if rank else ()
    return (len(parts), [str(p).zfill(8) for p in parts], suffix[-1])


def group_keys(keys: list[str], *, prefix_filter: str | None = None, limit: int = 20) -> dict[str, Any]:
    """Group object keys by SGLang prefix; warm-up keys, namespace markers and other keys counted apart."""
    from hicache_ops.server.namespaces import parse_marker

    groups: dict[str, PrefixGroup] = {}
    warmup = unified = 0
    other: list[str] = []
    namespaces: list[tuple[str | None, str | None]] = []
    matched = 0
    for key in keys:
        if prefix_filter and not key.startswith(prefix_filter):
            continue
        matched += 1
        if is_warmup_key(key):
            warmup += 1
            continue
        namespace = parse_marker(key)
        if namespace is not None:
            namespaces.append(namespace)
            continue
        split = _split_any(key)
        if split is None:
            if _UNIFIED_KEY.search(key):
                unified += 1
            else:
                other.append(key)
            continue
        prefix, page_key, rank, kv = split[:4]
        group = groups.get(prefix)
        if group is None:
            group = groups[prefix] = PrefixGroup(prefix)
        group.objects += 1
        if len(split) == 5:
            group.pools.setdefault(split[4], {}).setdefault(page_key, set()).add(f"_{rank}_{kv}")
            continue
        suffixes = group.pages.get(page_key)
        if suffixes is None:
            suffixes = group.pages[page_key] = set()
        suffix = f"_{rank}_{kv}"
        if suffix not in suffixes:
            suffixes.add(suffix)
            group.suffix_counts[suffix] += 1
    ordered = sorted(groups.values(), key=lambda g: (-g.objects, g.prefix))
    return {
        "prefix_filter": prefix_filter,
        "matched_keys": matched,
        "warmup_keys": warmup,
        "unified_scheme_keys": unified,
        "namespace_marker_keys": len(namespaces),
        "namespaces": [
            {"extra_key": extra_key, "cache_salt": cache_salt}
            for extra_key, cache_salt in sorted(namespaces, key=lambda ns: (ns[0] or "", ns[1] or ""))[:limit]
        ],
        "other_keys": len(other),
        "groups": [g.summary(limit) for g in ordered[:limit]],
        "group_count": len(ordered),
        "other_key_samples": sorted(other)[:limit],
        "truncated": len(ordered) > limit
        or len(other) > limit
        or len(namespaces) > limit
        or any(len(g.pages) > limit for g in ordered[:limit]),
    }


def _segment_row(seg: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": seg.get("segment_name"),
        "protocol": seg.get("protocol"),
        "status": seg.get("status"),
        "te_endpoint": seg.get("te_endpoint"),
        "size_bytes": int(seg.get("size_bytes") or seg.get("allocator_capacity_bytes") or 0),
        "used_bytes": int(seg.get("allocator_used_bytes") or 0),
        "usage_percent": float(seg.get("allocator_usage_percent") or 0.0),
    }


def served_pools(keys: list[str], layout: L3Layout, limit: int = 20) -> dict[str, Any]:
    """The pools of a server's enabled L3 layout, checked against a key listing.

    Under the layout's key prefix, per pool (KV first): the pages holding any of its objects, those
    holding all (every suffix the layout lists, every pipeline stage), and for a side pool the
    pages whose KV objects are all there while none of its own are.
    """
    prefix = f"{layout.key_prefix}_" if layout.key_prefix else ""
    pages: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        if not key.startswith(prefix):
            continue
        page_key, suffix = key[len(prefix) : len(prefix) + 64], key[len(prefix) + 64 :]
        if suffix.startswith("_") and _HEX64.fullmatch(page_key):
            pages[page_key].add(suffix)
    kv = set(flat_suffixes(layout.kv_suffixes))
    # (pool, its suffixes, hit policy, trailing pages)
    entries: list[tuple[str, list[str], str, int | None]] = (
        [("kv", flat_suffixes(layout.kv_suffixes), "all_pages", None)] if kv else []
    )
    entries += [(p.name, flat_suffixes(p.served or ()), p.hit_policy, p.trailing_pages) for p in layout.side_pools]
    out = []
    for name, suffixes, policy, trailing in entries:
        want = set(suffixes)
        holding = {k: v & want for k, v in pages.items() if v & want}
        incomplete = sorted(k for k, v in holding.items() if v != want)
        row = {
            "pool": name,
            "suffixes": suffixes,
            "hit_policy": policy,
            "trailing_pages": trailing,
            "pages": len(holding),
            "complete_pages": len(holding) - len(incomplete),
            "incomplete_pages": len(incomplete),
            "incomplete": [{"page_key": k, "missing": sorted(want - holding[k])} for k in incomplete[:limit]],
        }
        if name != "kv" and kv:
            row["kv_pages_without_pool"] = sum(1 for k, v in pages.items() if kv <= v and k not in holding)
        out.append(row)
    return {"key_prefix": layout.key_prefix, "pools": out}


def _server_layout(url: str, timeout: float) -> tuple[L3Layout | None, str | None]:
    """The enabled layout of the SGLang server at `url`, else None and why."""
    from hicache_ops.sglang.server_info import read_server

    info = read_server(url, timeout=timeout)
    if info.l3_layout is None:
        return None, f"the SGLang server at {info.url} (SGLang {info.version}) publishes no L3 layout."
    layout = parse_l3_layout(info.l3_layout)
    if not layout.enabled:
        return layout, f"the server's L3 layout is disabled ({layout.reason}); no pools to check."
    return layout, None


def inspect_store(
    master: str, *, prefix: str | None = None, limit: int = 20, timeout: float = 3.0, sglang_url: str | None = None
) -> StoreResult:
    """Health, segments, key counts and SGLang key groups of the master at HOST:METRICS_PORT.

    With `sglang_url`, the pools of that server's L3 layout (docs/side-pools.md#l3-layout-endpoint)
    are checked against the listing too (`server_pools`). Raises InputError for a malformed address
    or layout, UnreachableError when the master or the server does not answer.
    """

    if limit < 0:
        raise SettingError("limit", f"{limit} must be >= 0.")
    layout, layout_note = _server_layout(sglang_url, timeout) if sglang_url else (None, None)
    with AdminClient(master, timeout=timeout) as admin:
        health = admin.health()
        segments = [_segment_row(s) for s in admin.segments_detail()]
        metrics = admin.metrics()
        keys = admin.get_all_keys()
    check_segments(segments, master_host=admin.host)
    grouped = group_keys(keys, prefix_filter=prefix or None, limit=limit)
    ready = bool(health.get("service_ready", health.get("status") == "ok"))
    capacity = sum(s["size_bytes"] for s in segments)
    used = sum(s["used_bytes"] for s in segments)
    from hicache_ops.commands.inspect.results import SegmentProblem, StoreResult

    return StoreResult(
        master=admin.address,
        ready=ready,
        health=health,
        segments=segments,
        segment_problems=[
            SegmentProblem(
                segment=s["name"],
                te_endpoint=s["te_endpoint"],
                problem=s["endpoint_problem"],
                host=s["host"],
                host_candidates=s["host_candidates"],
                note=s["endpoint_note"],
            )
            for s in segments
            if s["endpoint_problem"]
        ],
        capacity_bytes=capacity,
        used_bytes=used,
        used_fraction=used / capacity if capacity else None,
        key_count=len(keys),
        metrics={name: metrics[name] for name in _METRIC_NAMES if name in metrics},
        limit=limit,
        **grouped,
        with_server=sglang_url is not None,
        pool_source=FROM_LAYOUT if sglang_url is not None and layout_note is None else None,
        l3_layout=None if layout is None else layout.view(),
        l3_layout_note=layout_note,
        server_pools=served_pools(keys, layout, limit) if layout is not None and layout_note is None else None,
    )


def pages_by_prefix(keys: list[str], page_keys: set[str]) -> dict[str, dict[str, set[str]]]:
    """For the given page keys only: page key -> {prefix -> KV suffixes present}, from a key listing."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    disjoint = page_keys.isdisjoint
    for key in keys:
        if disjoint(key.split("_")):  # cheap filter before parsing: holds no wanted page key
            continue
        split = _split_any(key)
        if split is not None and len(split) == 4 and split[1] in page_keys:  # KV objects only
            out[split[1]][split[0]].add(f"_{split[2]}_{split[3]}")
    return out
