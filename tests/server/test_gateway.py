"""A real gateway in front of two serves sharing one Mooncake master (docs/serve-api.md#clients).

`smg` (Shepherd Model Gateway, from PyPI; the test extra installs it) in cache-aware mode reads each
serve as an SGLang worker (its /health, /server_info and /model_info), then routes /generate: a
repeated prompt keeps landing on one worker, which hits it in L1; the other worker, never sent it,
finds the pages the first wrote in L3.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hicache_ops.mooncake.net import free_port
from serve_process import Serve

SMG = str(Path(sys.executable).with_name("smg"))
ARGS = ("--device-tokens", "1024", "--page-size", "16", "--hicache-storage-prefetch-policy", "wait_complete",
        "--prefetch-threshold", "32")  # fmt: skip


@pytest.fixture
def gateway(tmp_path):
    assert shutil.which(SMG), f"smg is not installed at {SMG} (pip install the test extra)"
    first = Serve(tmp_path / "a", *ARGS)
    rpc, metrics = first.info["master_rpc_address"], first.info["master_metrics_address"]
    second = Serve(tmp_path / "b", *ARGS, "--l3", f"mooncake://{rpc}?metrics={metrics.split(':')[1]}")
    port = free_port()
    log = open(tmp_path / "smg.log", "w")
    proc = subprocess.Popen(
        [SMG, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", first.url, second.url,
         "--policy", "cache_aware", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                workers = httpx.get(url + "/workers", timeout=5).json()
                if sum(w["is_healthy"] for w in workers["workers"]) == 2:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "smg.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url, {first.url: first, second.url: second}, workers
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        second.stop()
        first.stop()


def test_cache_aware_gateway_keeps_a_prefix_on_one_worker_and_l3_serves_the_other(gateway):
    url, serves, workers = gateway
    # The gateway read each serve as an SGLang 0.5.23 worker of the serve's model.
    assert {w["url"] for w in workers["workers"]} == set(serves)
    assert {(w["model_id"], w["labels"]["version"]) for w in workers["workers"]} == {("hicache/tiny", "0.5.23")}
    body = {"input_ids": list(range(40_000, 40_100)), "sampling_params": {"max_new_tokens": 2}}
    replies = [httpx.post(url + "/generate", json=body, timeout=60).json()["meta_info"] for _ in range(5)]
    assert replies[0]["cached_tokens"] == 0
    # every repeat hit L1 on the worker that served the first: cache-aware routing kept it there
    assert all(r["cached_tokens_details"] == {"device": 96, "host": 0, "storage": 0, "storage_backend": "MooncakeStore"}
               for r in replies[1:])  # fmt: skip
    served = {u: s.client.stats()["stats"]["requests"] for u, s in serves.items()}
    assert sorted(served.values()) == [0, 5], served
    other = next(s for u, s in serves.items() if served[u] == 0)
    meta = httpx.post(other.url + "/generate", json=body, timeout=60).json()["meta_info"]
    assert meta["cached_tokens_details"]["storage"] == 96 and meta["cached_tokens_details"]["device"] == 0
