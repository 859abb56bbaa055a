"""The Prometheus metrics SGLang defines for prompt and cache accounting, per version (docs/serve-api.md#metrics).

Source: `srt/observability/metrics_collector.py` of each version (TokenizerMetricsCollector,
SchedulerMetricsCollector with HiCache on, StorageMetricsCollector, RadixCacheMetricsCollector).
Each entry: exposition name -> (type, label names). Tokenizer-side metrics carry `model_name` and
`engine_type`; scheduler-side ones also the rank labels. 0.5.23 splits the request counters by
`is_streaming` and the load-back counter by host `pool`, and adds the prefill tokens by mode.
"""

from __future__ import annotations

from hicache_ops.sglang.versions import V0_5_14, V0_5_23

TOKENIZER_LABELS = ("model_name", "engine_type")
SCHEDULER_LABELS = (*TOKENIZER_LABELS, "tp_rank", "pp_rank", "moe_ep_rank")
# What DisaggregationMode.to_engine_type says for a server without prefill/decode disaggregation.
ENGINE_TYPE = "unified"
# sglang:prefill_effective_tokens_total's modes (0.5.23): the three hit tiers and the computed rest.
PREFILL_MODES = ("device_hit", "host_hit", "storage_hit", "input")

_COMMON = {
    "sglang:cached_tokens_total": ("counter", (*TOKENIZER_LABELS, "cache_source")),
    "sglang:prefetched_tokens_total": ("counter", SCHEDULER_LABELS),
    "sglang:backuped_tokens_total": ("counter", SCHEDULER_LABELS),
    "sglang:hicache_host_used_tokens": ("gauge", SCHEDULER_LABELS),
    "sglang:hicache_host_total_tokens": ("gauge", SCHEDULER_LABELS),
    "sglang:evicted_tokens_total": ("counter", SCHEDULER_LABELS),
    "sglang:max_total_num_tokens": ("gauge", SCHEDULER_LABELS),
}
METRICS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    V0_5_14: {
        **_COMMON,
        "sglang:prompt_tokens_total": ("counter", TOKENIZER_LABELS),
        "sglang:generation_tokens_total": ("counter", TOKENIZER_LABELS),
        "sglang:num_requests_total": ("counter", TOKENIZER_LABELS),
        "sglang:load_back_tokens_total": ("counter", SCHEDULER_LABELS),
    },
    V0_5_23: {
        **_COMMON,
        "sglang:prompt_tokens_total": ("counter", (*TOKENIZER_LABELS, "is_streaming")),
        "sglang:generation_tokens_total": ("counter", (*TOKENIZER_LABELS, "is_streaming")),
        "sglang:num_requests_total": ("counter", (*TOKENIZER_LABELS, "is_streaming")),
        "sglang:load_back_tokens_total": ("counter", (*SCHEDULER_LABELS, "pool")),
        "sglang:prefill_effective_tokens_total": ("counter", (*SCHEDULER_LABELS, "mode")),
    },
}
