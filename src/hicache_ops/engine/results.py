"""What a TieredCache reports: per request (PrefillResult, with its PrefetchInfo) and in total (CacheStats)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PrefetchInfo:
    """What the storage step did for one request."""

    considered_tokens: int = 0  # the unmatched page-aligned suffix
    threshold: int = 0
    issued: bool = False
    reason: str = ""  # why not issued / revoked / cut, naming the rule and version
    rate_limited: bool = False  # refused by the in-flight limit
    # Set when the local match ends in a node with no host copy (l3_prefetch.prefetch_anchor):
    # 0.5.23 issues nothing, 0.5.14 looks up keys chained from the wrong prior.
    anchor_note: str = ""
    requested_tokens: int = 0  # the span the prefetch asked for (what the in-flight limit counts)
    allocated_pages: int = 0  # host pages it got (may be partial)
    rank_hits: list[int] = field(default_factory=list)  # contiguous pages per rank
    hit_pages: int = 0  # min over ranks
    completed_pages: int = 0  # arrived before the stop policy's deadline
    budget_s: float = 0.0  # the `timeout` budget for this prefetch
    deadline_s: float = 0.0  # the deadline the configured policy applied
    elapsed_s: float = 0.0  # when the last hit page arrived
    timeout_would_cut: bool = False
    mismatched_pages: int = 0
    # Objects that read a byte count other than this deployment's: another dtype, head count or
    # page size wrote under the same keys.
    size_mismatched_objects: int = 0
    bytes: int = 0


@dataclass
class PrefillResult:
    prompt_tokens: int
    device_hit: int = 0
    host_hit: int = 0
    storage_hit: int = 0
    computed: int = 0
    pages: int = 0
    trailing_tokens: int = 0
    bytes_loaded_from_host: int = 0
    bytes_backed_up_to_host: int = 0
    bytes_written_to_l3: int = 0
    bytes_read_from_l3: int = 0
    mismatched_pages: int = 0
    backed_up_pages: int = 0
    stored_pages: int = 0
    device_evicted_pages: int = 0  # pages this request's allocations took off the device
    host_evicted_pages: int = 0  # host pages freed by its allocations (eviction and 0.5.23 reclaim)
    output_pages: int = 0  # pages the finish insert added (request() only)
    prefetch: PrefetchInfo = field(default_factory=PrefetchInfo)
    timings_ms: dict[str, float] = field(default_factory=dict)
    page_keys: list[str] = field(default_factory=list)

    @property
    def cached(self) -> int:
        return self.device_hit + self.host_hit + self.storage_hit

    def to_json(self, with_keys: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_keys:
            data.pop("page_keys")
        data["cached"] = self.cached
        return data


@dataclass
class CacheStats:
    requests: int = 0
    prompt_tokens: int = 0
    device_hit: int = 0
    host_hit: int = 0
    storage_hit: int = 0
    computed: int = 0
    device_evictions: int = 0  # pages
    host_evictions: int = 0  # pages
    device_evicted_nodes: int = 0
    host_evicted_nodes: int = 0
    host_reclaimed_nodes: int = 0  # 0.5.23 write_back: host copies of device-resident nodes
    write_back_backups: int = 0
    dropped_pages: int = 0  # evicted from every tier
    backup_failures: int = 0  # host copies that got no host page, and L3 pages whose write failed
    mismatched_pages: int = 0  # each corrupt page once: at its L3 read, else at its load-back
    size_mismatched_objects: int = 0  # L3 objects read with another deployment's byte count
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    bytes_l3_write: int = 0
    bytes_l3_read: int = 0
    l3_objects_written: int = 0
    l3_objects_skipped: int = 0
    l3_side_objects_written: int = 0  # of l3_objects_written, side-pool objects
    l3_side_objects_read: int = 0
    prefetches_issued: int = 0
    prefetches_revoked: int = 0
    prefetches_rate_limited: int = 0
