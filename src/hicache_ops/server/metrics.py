"""Prometheus text for `GET /metrics`, rendered from one stats snapshot per scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# stats field -> (metric name, help); counters only grow over the process's life.
_COUNTERS = {
    "requests": ("hicache_requests", "Prefill requests served."),
    "prompt_tokens": ("hicache_prompt_tokens", "Prompt tokens received."),
    "device_hit": ("hicache_device_hit_tokens", "Prompt tokens served from the device pool (L1)."),
    "host_hit": ("hicache_host_hit_tokens", "Prompt tokens loaded back from the host pool (L2)."),
    "storage_hit": ("hicache_storage_hit_tokens", "Prompt tokens prefetched from L3."),
    "computed": ("hicache_computed_tokens", "Prompt tokens computed (prefilled)."),
    "device_evictions": ("hicache_device_evictions", "Pages evicted from the device pool."),
    "host_evictions": ("hicache_host_evictions", "Pages evicted from the host pool."),
    "write_back_backups": ("hicache_write_back_backups", "Pages backed up to host at eviction (write_back)."),
    "dropped_pages": ("hicache_dropped_pages", "Pages evicted from every tier."),
    "backup_failures": ("hicache_backup_failures", "Host or L3 backups that could not be made."),
    "mismatched_pages": (
        "hicache_verification_mismatches",
        "Pages whose bytes differed from the reference (each once).",
    ),
    "size_mismatched_objects": (
        "hicache_l3_size_mismatched_objects",
        "L3 objects read with a byte count other than this deployment's object size.",
    ),
    "bytes_h2d": ("hicache_host_to_device_bytes", "Bytes loaded back from host to device."),
    "bytes_d2h": ("hicache_device_to_host_bytes", "Bytes backed up from device to host."),
    "bytes_l3_write": ("hicache_l3_write_bytes", "Bytes written to L3."),
    "bytes_l3_read": ("hicache_l3_read_bytes", "Bytes read from L3."),
    "l3_objects_written": ("hicache_l3_objects_written", "Objects put to L3."),
    "l3_objects_skipped": ("hicache_l3_objects_skipped", "Objects not put because they already existed."),
    "l3_side_objects_written": ("hicache_l3_side_objects_written", "Side-pool objects put to L3 (of the objects put)."),
    "l3_side_objects_read": ("hicache_l3_side_objects_read", "Side-pool objects read from L3."),
    "prefetches_issued": ("hicache_prefetches_issued", "L3 prefetches issued."),
    "prefetches_revoked": (
        "hicache_prefetches_revoked",
        "L3 prefetches revoked (minimum rank hit below the threshold).",
    ),
}
_GAUGES = {
    "device_pages_used": ("hicache_device_pages_used", "Device pool pages in use."),
    "device_pages": ("hicache_device_pages", "Device pool capacity in pages."),
    "host_pages_used": ("hicache_host_pages_used", "Host pool pages in use."),
    "host_pages": ("hicache_host_pages", "Host pool capacity in pages."),
    "tree_pages": ("hicache_tree_pages", "Pages in the radix tree."),
    "pages_stored": ("hicache_tree_pages_stored", "Tree pages whose objects are in L3."),
}


class _Snapshot:
    def __init__(self, stats: dict):
        self._stats = stats

    def collect(self):
        for field, (name, help_) in _COUNTERS.items():
            family = CounterMetricFamily(name, help_)
            family.add_metric([], self._stats["stats"][field])
            yield family
        l3 = self._stats["l3"]
        if "errors" in l3:
            up = GaugeMetricFamily("hicache_l3_up", "1 while the L3 master answers, 0 while it is down.")
            up.add_metric([], 1 if l3["state"] == "up" else 0)
            yield up
            errors = CounterMetricFamily("hicache_l3_errors", "Requests that failed because L3 did not answer.")
            errors.add_metric([], l3["errors"])
            yield errors
            probes = CounterMetricFamily(
                "hicache_l3_failed_probes", "Health probes of the L3 master that got no answer."
            )
            probes.add_metric([], l3["failed_probes"])
            yield probes
        for field, (name, help_) in _GAUGES.items():
            family = GaugeMetricFamily(name, help_)
            family.add_metric([], self._stats["occupancy"][field])
            yield family


def render_metrics(stats: dict) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(stats))
    return generate_latest(registry).decode()
