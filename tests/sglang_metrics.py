"""SGLang's own metric definitions, as the oracle for the serve's `sglang:` families.

`COLLECTORS_SCRIPT` instantiates the installed version's tokenizer, scheduler (HiCache on),
storage and radix-cache collectors on prometheus_client's default registry and returns every
`sglang:` metric they define: {exposition name: [type, sorted label names]}. It runs in this
process for 0.5.23 (`collector_definitions`) and in a child for 0.5.14 (`run_0_5_14`).
"""

from __future__ import annotations

COLLECTORS_SCRIPT = """
from prometheus_client import REGISTRY
from sglang.srt.observability import metrics_collector as mc
from sglang.srt.server_args import prepare_server_args

server_args = prepare_server_args(["--model-path", PAYLOAD["model"], "--device", "cpu", "--enable-metrics",
                                   "--enable-hierarchical-cache"])
try:  # 0.5.23 reads process-wide configuration published from the arguments
    from sglang.srt.runtime_context import publish
    publish(server_args, role="scheduler")
except ImportError:
    pass
labels = {"model_name": "m", "engine_type": "unified"}
ranked = {**labels, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
try:
    mc.SchedulerMetricsCollector(ranked, enable_hierarchical_cache=True, server_args=server_args)
except TypeError:
    mc.SchedulerMetricsCollector(server_args, enable_hierarchical_cache=True, labels=ranked)
mc.TokenizerMetricsCollector(server_args=server_args, labels=labels)
mc.StorageMetricsCollector(labels=ranked)
mc.RadixCacheMetricsCollector(labels=ranked)
RESULT = {}
for collector in list(REGISTRY._collector_to_names):
    name = getattr(collector, "_name", "")
    if name.startswith("sglang:"):
        kind = collector._type
        exposed = name + "_total" if kind == "counter" and not name.endswith("_total") else name
        RESULT[exposed] = [kind, sorted(collector._labelnames)]
"""


def collector_definitions(model: str) -> dict:
    """0.5.23's definitions, computed in this process."""
    scope = {"PAYLOAD": {"model": model}}
    exec(COLLECTORS_SCRIPT, scope)  # noqa: S102 (our own script, shared with the 0.5.14 child)
    return scope["RESULT"]
