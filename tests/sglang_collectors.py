"""SGLang's own metrics collector classes, driven with known values, served by a real HTTP server.

`held_collectors(version, tp_size)` starts a child process whose `sglang` is that release (0.5.14
through tests/sglang_0_5_14.py, 0.5.23 the installed one). The child builds SGLang's Tokenizer,
Scheduler, Storage and RadixCache collectors in a registry of its own (SGLang's collector
injection hooks, as its Ray wrappers use them), serves it on 127.0.0.1 with a /server_info, and
applies a step of counts on POST /drive (JSON). Per rank it does what SGLang's ranks do: the
storage collector relabelled per tp_rank (SGLang's own relabel path); 0.5.23's radix collector
carries rank labels, 0.5.14's does not, so each rank's count lands on the one series (the sum the
multiprocess registry makes). Run in a child for both releases: the collectors read process-wide
configuration that SGLang's `publish` installs, which must not leak into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import httpx

from sglang_0_5_14 import _MARKER, _read_result, held_0_5_14

SCRIPT = r"""
import functools, json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import prometheus_client as pc
import sglang
from sglang.srt.observability import metrics_collector as mc
from sglang.srt.server_args import ServerArgs

version = sglang.__version__
tp_size = PAYLOAD["tp_size"]
sa = ServerArgs(model_path="dummy", enable_metrics=True, tp_size=tp_size)
try:
    from sglang.srt.runtime_context import publish
    publish(sa, role="scheduler")
except ImportError:
    from sglang.srt.server_args import set_global_server_args_for_scheduler
    set_global_server_args_for_scheduler(sa)
reg = pc.CollectorRegistry()

def bind(cls):
    hooks = {f"_{k}_cls": functools.partial(getattr(pc, k.capitalize()), registry=reg)
             for k in ("counter", "gauge", "histogram", "summary")}
    return type(cls.__name__, (cls,), hooks)

tok_labels = {"model_name": "m", "engine_type": "unified"}
tok = bind(mc.TokenizerMetricsCollector)(server_args=sa, labels=tok_labels)
sched = bind(mc.SchedulerMetricsCollector)(
    labels={**tok_labels, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0},
    enable_hierarchical_cache=True, server_args=sa)
def storage_labels(rank):
    return {"storage_backend": "mooncake", "tp_rank": rank, "dp_rank": 0, "pp_rank": 0, "pp_size": 1,
            "attn_cp_rank": 0, "attn_cp_size": 1}
storage = bind(mc.StorageMetricsCollector)(labels=storage_labels(0))
new_radix = hasattr(mc, "radix_cache_metric_labels")
def radix_labels(rank):
    base = {"cache_type": "HiRadixCache"}
    return {**base, "tp_rank": rank, "pp_rank": 0, "dp_rank": 0} if new_radix else base
radix = [bind(mc.RadixCacheMetricsCollector)(labels=radix_labels(0))]
for r in range(1, tp_size):  # 0.5.23: one collector per rank would be one process each; relabel instead
    radix.append(radix[0])

def drive(step):
    for prompt, device, host, st in step.get("requests", []):
        details = {"device": device, "host": host, "storage": st, "storage_backend": "mooncake"}
        tok.observe_one_finished_request(tok_labels, prompt, 1, device + host + st, 0.1, False,
                                         cached_tokens_details=details)
    for rank in range(tp_size):
        r = step.get("ranks", [{}] * tp_size)[rank]
        storage.labels = storage_labels(rank)
        storage.log_prefetched_tokens(r.get("fetched", 0))
        storage.log_backuped_tokens(r.get("to_l3", 0))
        if hasattr(storage, "log_storage_prefetch_hit_tokens"):
            storage.log_storage_prefetch_hit_tokens(r.get("issued", 0))
            for reason, n in r.get("unfulfilled", {}).items():
                storage.log_storage_prefetch_unfulfilled_tokens(n, reason)
            storage.log_backup_dropped_tokens(r.get("dropped", 0))
        bw = r.get("bandwidth")
        if bw:
            storage.log_storage_metrics(mc.StorageMetrics(prefetch_bandwidth=[bw], backup_bandwidth=[bw]))
        # L2: every rank counts the same logical tokens.
        c = radix[0]
        c.labels = radix_labels(rank)
        n = step.get("load_back", 0)
        if n:
            c.increment_load_back_num_tokens(n, "kv") if new_radix else c.increment_load_back_num_tokens(n)
        if step.get("evicted", 0):
            c.increment_eviction_num_tokens(step["evicted"])
    storage.labels = storage_labels(0)
    if "host_pool" in step:
        used, total = step["host_pool"]
        sched.log_stats(mc.SchedulerStats(hicache_host_used_tokens=used, hicache_host_total_tokens=total))

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, code, body, kind):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/metrics":
            self.reply(200, pc.generate_latest(reg), pc.CONTENT_TYPE_LATEST)
        elif self.path == "/server_info" and PAYLOAD["server_info"]:
            self.reply(200, json.dumps({"version": version, "tp_size": tp_size}).encode(), "application/json")
        else:
            self.reply(404, b"not found", "text/plain")
    def do_POST(self):
        step = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        drive(step)
        self.reply(200, b"{}", "application/json")

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
RESULT = {"url": f"http://127.0.0.1:{server.server_address[1]}", "version": version}
"""

_PRELUDE_NEW = "import json, sys\nPAYLOAD = json.loads(sys.stdin.readline())\nRESULT = None\n"
_EPILOGUE = (
    '\nsys.stdout.write("\\n' + _MARKER + '" + json.dumps(RESULT) + "\\n")\nsys.stdout.flush()\nsys.stdin.readline()\n'
)


@contextmanager
def _held_installed(script: str, payload, timeout: float = 300):
    # Importing SGLang sets up torch inductor: its cache folder is a temporary one, as for 0.5.14.
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryDirectory(prefix="sglang-inductor-") as inductor:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _PRELUDE_NEW + script + _EPILOGUE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=inductor),
        )
        try:
            proc.stdin.write(json.dumps(payload).encode() + b"\n")
            proc.stdin.flush()
            yield _read_result(proc, errors, time.monotonic() + timeout)
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            proc.stdout.close()


class Served:
    def __init__(self, url: str, version: str):
        self.url, self.version = url, version

    def drive(self, **step) -> None:
        httpx.post(self.url + "/drive", json=step, timeout=30).raise_for_status()


@contextmanager
def held_collectors(version: str, *, tp_size: int = 1, server_info: bool = True):
    payload = {"tp_size": tp_size, "server_info": server_info}
    held = held_0_5_14 if version == "0.5.14" else _held_installed
    with held(SCRIPT, payload) as result:
        assert result["version"] == version, result
        yield Served(result["url"], result["version"])
