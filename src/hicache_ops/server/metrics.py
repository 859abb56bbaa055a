"""Prometheus text for `GET /metrics`, rendered from one stats snapshot per scrape: the serve's
`hicache_*` families, and beside them SGLang's own names for the same counts, per
`--sglang-version` (sglang/metric_names.py, docs/serve-api.md#metrics)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# One sample of a family: its label values and its value.
_Row = tuple[list[str], float]

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
    def __init__(self, stats: dict[str, Any]) -> None:  # the serve's stats snapshot (JSON-shaped)
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
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
            gauge = GaugeMetricFamily(name, help_)
            gauge.add_metric([], self._stats["occupancy"][field])
            yield gauge


class _SglangSnapshot:
    """SGLang's families for the same snapshot. Tokenizer-side counts come from /generate requests
    (as SGLang counts them at its tokenizer); the scheduler-side ones from the whole cache."""

    def __init__(self, stats: dict[str, Any], sglang: dict[str, Any]) -> None:
        self._stats, self._sglang = stats, sglang

    def _family(
        self, name: str, kind: str, help_: str, labels: tuple[str, ...]
    ) -> CounterMetricFamily | GaugeMetricFamily:
        base = name[: -len("_total")] if kind == "counter" else name
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        return cls(base, help_, labels=list(labels))

    def collect(self) -> Iterator[Metric]:
        from hicache_ops.sglang.metric_names import ENGINE_TYPE, METRICS

        sg, st, occ = self._sglang, self._stats["stats"], self._stats["occupancy"]
        api, ps = sg["api"], sg["page_size"]
        table = METRICS[sg["sglang_version"]]
        model = sg["model_name"]
        tok = [model, ENGINE_TYPE]
        ranks = [[model, ENGINE_TYPE, str(r), "0", "0"] for r in range(sg["tp_size"])]
        l3 = self._stats["config"]["l3"] != "none"

        def family(name: str, help_: str, rows: list[_Row]) -> Metric:
            kind, labels = table[name]
            fam = self._family(name, kind, help_, labels)
            for values, value in rows:
                fam.add_metric(values, value)
            return fam

        def per_rank(value: float, *extra: str) -> list[_Row]:
            return [([*r, *extra], value) for r in ranks]

        streaming = "is_streaming" in table["sglang:prompt_tokens_total"][1]
        for name, field, help_ in (
            ("sglang:prompt_tokens_total", "prompt_tokens", "Number of prefill tokens processed."),
            ("sglang:generation_tokens_total", "generation_tokens", "Number of generation tokens processed."),
            ("sglang:num_requests_total", "requests", "Number of requests processed."),
        ):
            counts = api[field]
            if streaming:
                rows = [([*tok, "true" if s else "false"], counts[s]) for s in (False, True)]
            else:
                rows = [(tok, counts[False] + counts[True])]
            yield family(name, help_, rows)
        sources = ("device", "host", "storage") if l3 else ("device", "host")
        yield family(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            [([*tok, s], api["cached_tokens"][s]) for s in sources],
        )
        yield family(
            "sglang:prefetched_tokens_total", "Prompt tokens prefetched from L3 into host memory.",
            per_rank(st["storage_hit"]),
        )  # fmt: skip
        yield family("sglang:backuped_tokens_total", "Tokens backed up to L3.", per_rank(api["backuped_tokens"]))
        yield family(
            "sglang:hicache_host_used_tokens",
            "Tokens used in the host KV cache.",
            per_rank(occ["host_pages_used"] * ps),
        )
        yield family(
            "sglang:hicache_host_total_tokens",
            "Capacity of the host KV cache in tokens.",
            per_rank(occ["host_pages"] * ps),
        )
        yield family(
            "sglang:evicted_tokens_total", "Device KV token slots freed by eviction.",
            per_rank(st["device_evictions"] * ps),
        )  # fmt: skip
        yield family(
            "sglang:max_total_num_tokens",
            "Capacity of the device KV pool in tokens.",
            per_rank(occ["device_pages"] * ps),
        )
        pool = ("kv",) if "pool" in table["sglang:load_back_tokens_total"][1] else ()
        yield family(
            "sglang:load_back_tokens_total", "Tokens loaded back from host to device.", per_rank(st["host_hit"], *pool)
        )
        if "sglang:prefill_effective_tokens_total" in table:
            modes = {"device_hit": st["device_hit"], "host_hit": st["host_hit"], "storage_hit": st["storage_hit"],
                     "input": st["computed"]}  # fmt: skip
            rows = [row for mode, value in modes.items() for row in per_rank(value, mode)]
            yield family("sglang:prefill_effective_tokens_total", "Prefill tokens by mode.", rows)


def render_metrics(stats: dict[str, Any], sglang: dict[str, Any] | None = None) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(stats))
    if sglang is not None:
        registry.register(_SglangSnapshot(stats, sglang))
    return generate_latest(registry).decode()
