"""The metric names `hicache watch` reads, what each means and from which SGLang release it exists.

Every entry is documented in docs/metrics.md with the collector class it comes from. The names
are the exposition names (a counter's `_total` included); `since` is the first supported release
(docs/metrics.md#releases) whose collector defines the metric.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache_ops.sglang.versions import SUPPORTED_VERSIONS, V0_5_14, V0_5_23


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # counter, gauge, histogram
    collector: str  # SGLang's collector class that defines it
    since: str
    meaning: str
    extra_labels: tuple[str, ...] = ()  # labels beyond the collector's own (rank/model) labels

    def exists_in(self, version: str) -> bool:
        return SUPPORTED_VERSIONS.index(version) >= SUPPORTED_VERSIONS.index(self.since)


TOK, SCHED, STORE, RADIX = (
    "TokenizerMetricsCollector",
    "SchedulerMetricsCollector",
    "StorageMetricsCollector",
    "RadixCacheMetricsCollector",
)

SGLANG_METRICS: tuple[Metric, ...] = (
    Metric("sglang:prompt_tokens_total", "counter", TOK, V0_5_14, "prompt tokens of finished requests"),
    Metric(
        "sglang:cached_tokens_total",
        "counter",
        TOK,
        V0_5_14,
        "prompt tokens served from a cache tier, by cache_source (device, host, storage; total when a "
        "request carried no per-tier details)",
        ("cache_source",),
    ),
    Metric("sglang:num_requests_total", "counter", TOK, V0_5_14, "finished requests"),
    Metric(
        "sglang:prefill_effective_tokens_total",
        "counter",
        SCHED,
        V0_5_23,
        "prefill tokens by mode (input, device_hit, host_hit, storage_hit), retraction re-counts excluded",
        ("mode",),
    ),
    Metric("sglang:hicache_host_used_tokens", "gauge", SCHED, V0_5_14, "host (L2) pool tokens in use"),
    Metric("sglang:hicache_host_total_tokens", "gauge", SCHED, V0_5_14, "host (L2) pool capacity in tokens"),
    Metric(
        "sglang:prefetched_tokens_total",
        "counter",
        STORE,
        V0_5_14,
        "tokens transferred from L3 into the host pool by prefetches",
    ),
    Metric("sglang:backuped_tokens_total", "counter", STORE, V0_5_14, "tokens written from the host pool to L3"),
    Metric(
        "sglang:storage_prefetch_hit_tokens_total",
        "counter",
        STORE,
        V0_5_23,
        "tokens an L3 existence query reported before a prefetch was issued for them",
    ),
    Metric(
        "sglang:storage_prefetch_unfulfilled_tokens_total",
        "counter",
        STORE,
        V0_5_23,
        "tokens an L3 query reported that did not become a usable prefetch, by reason",
        ("reason",),
    ),
    Metric(
        "sglang:storage_prefetch_deferred_tokens_total",
        "counter",
        STORE,
        V0_5_23,
        "prefetch token-attempts deferred by a transient capacity reason",
        ("reason",),
    ),
    Metric(
        "sglang:hicache_backup_dropped_tokens_total",
        "counter",
        STORE,
        V0_5_23,
        "buffer-mode L3 backup tokens that never reached L3",
    ),
    Metric("sglang:prefetch_bandwidth", "histogram", STORE, V0_5_14, "per-op L3 prefetch bandwidth, GB/s"),
    Metric("sglang:backup_bandwidth", "histogram", STORE, V0_5_14, "per-op L3 backup bandwidth, GB/s"),
    Metric("sglang:evicted_tokens_total", "counter", RADIX, V0_5_14, "device KV token slots freed by eviction"),
    Metric(
        "sglang:load_back_tokens_total",
        "counter",
        RADIX,
        V0_5_14,
        "tokens loaded back from the host pool (L2) to the device (0.5.23: by pool)",
    ),
    Metric(
        "sglang:hicache_backup_tokens_total",
        "counter",
        RADIX,
        V0_5_23,
        "tokens backed up from the device to the host pool (L2), by pool",
        ("pool",),
    ),
    Metric(
        "sglang:hicache_dropped_tokens_total",
        "counter",
        RADIX,
        V0_5_23,
        "device KV tokens destroyed without a host backup, by reason",
        ("reason", "pool"),
    ),
)
BY_NAME = {m.name: m for m in SGLANG_METRICS}

# The labels that tell one scheduler rank from another (docs/metrics.md#labels).
RANK_LABELS = ("tp_rank", "pp_rank", "dp_rank", "attn_cp_rank")

# Mooncake master (docs/metrics.md#mooncake-master), read from mooncake_master's /metrics.
MASTER_METRICS: dict[str, str] = {
    "master_total_capacity_bytes": "memory capacity of all mounted segments",
    "master_allocated_bytes": "memory allocated to objects",
    "master_key_count": "objects (keys) held",
    "master_active_clients": "clients holding a lease",
    "master_successful_evictions_total": "eviction passes that freed space",
    "master_attempted_evictions_total": "eviction passes tried",
    "master_evicted_key_count": "keys evicted",
    "master_put_start_requests_total": "single PutStart requests",
    "master_put_start_failures_total": "single PutStart requests that failed",
    "master_put_start_alloc_failures_total": "PutStart requests that found no space",
    "master_batch_put_start_requests_total": "BatchPutStart requests (SGLang's batch_set)",
    "master_batch_put_start_failures_total": "BatchPutStart requests that failed",
    "master_batch_put_start_partial_successes_total": "BatchPutStart requests with some keys failed",
    "master_batch_put_start_failed_items_total": "keys that failed inside BatchPutStart",
    "master_get_replica_list_requests_total": "single GetReplicaList requests",
    "master_get_replica_list_failures_total": "single GetReplicaList requests that failed (not-found included)",
    "master_batch_get_replica_list_requests_total": "BatchGetReplicaList requests (SGLang's batch_get)",
    "master_batch_get_replica_list_failures_total": "BatchGetReplicaList requests that failed",
    "master_batch_get_replica_list_partial_successes_total": "BatchGetReplicaList requests with some keys failed",
}
