"""`hicache serve` as a real process on loopback: the API, concurrency, bad input, two instances
sharing one L3, and a clean stop of everything it started."""

from __future__ import annotations

import subprocess
import threading
import time

import numpy as np
import pytest

from hicache_ops.errors import InputError
from hicache_ops.mooncake.net import free_port
from hicache_ops.server.client import ServeClient
from serve_process import HICACHE, Serve, pid_alive

# wait_complete: storage-hit assertions must not depend on how fast L3 reads are on a busy machine.
ARGS = (
    "--device-tokens",
    "1024",
    "--page-size",
    "16",
    "--prefetch-threshold",
    "32",
    "--hicache-storage-prefetch-policy",
    "wait_complete",
)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    s = Serve(tmp_path_factory.mktemp("serve"), *ARGS)
    yield s
    s.stop()


def check_breakdown(r: dict) -> None:
    assert r["device_hit"] + r["host_hit"] + r["storage_hit"] + r["computed"] == r["prompt_tokens"]
    assert r["mismatched_pages"] == 0


def test_prefill_flush_and_storage_hit(serve):
    c = serve.client
    prompt = list(range(5000, 5200))
    first = c.prefill(prompt, return_keys=True)
    check_breakdown(first)
    assert first["computed"] == 200 and first["stored_pages"] == 12 and len(first["page_keys"]) == 12
    again = c.prefill(prompt)
    assert again["device_hit"] == 192
    c.flush()
    after = c.prefill(prompt)
    check_breakdown(after)
    assert after["storage_hit"] == 192 and after["prefetch"]["issued"]


def test_concurrent_clients_exact_accounting(serve):
    c = serve.client
    before = c.stats()["stats"]
    rng = np.random.default_rng(7)
    shared = [rng.integers(0, 50_000, size=64).tolist() for _ in range(4)]
    totals = {"prompt_tokens": 0, "device_hit": 0, "host_hit": 0, "storage_hit": 0, "computed": 0}
    errors = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        local = np.random.default_rng(i)
        with ServeClient(serve.url) as client:
            for _ in range(50):
                prompt = (
                    shared[int(local.integers(4))] + local.integers(0, 50_000, size=int(local.integers(1, 40))).tolist()
                )
                try:
                    r = client.prefill(prompt)
                    check_breakdown(r)
                except Exception as exc:  # collected and asserted below
                    errors.append(exc)
                    continue
                with lock:
                    for k in totals:
                        totals[k] += r[k]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    after = c.stats()["stats"]
    for k, v in totals.items():
        assert after[k] - before[k] == v
    assert after["requests"] - before["requests"] == 800
    assert after["mismatched_pages"] == 0
    assert totals["device_hit"] > 0  # the shared prefixes were reused


@pytest.mark.parametrize(
    "body_ids, status_fragment",
    [([], "empty"), (list(range(16 * 70)), "device pool holds 64"), ([1, -1], "negative")],
)
def test_bad_requests_are_4xx(serve, body_ids, status_fragment):
    with pytest.raises(InputError, match=status_fragment):
        serve.client.prefill(body_ids)


def test_malformed_body_is_400(serve):
    import httpx

    r = httpx.post(serve.url + "/v1/prefill", json={"input_ids": "abc"})
    assert r.status_code == 400 and "input_ids" in r.json()["error"]["message"]
    r = httpx.post(serve.url + "/v1/prefill", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400


def test_layout_metrics_and_stats(serve):
    layout = serve.client.layout()
    assert layout["effective_layout"] == "page_first"
    metrics = serve.client.metrics()
    assert "hicache_requests_total" in metrics and "hicache_verification_mismatches_total 0.0" in metrics
    assert serve.info["l3"] == "embedded" and pid_alive(serve.info["master_pid"])


def test_two_instances_share_one_l3(serve, tmp_path):
    rpc, metrics = serve.info["master_rpc_address"], serve.info["master_metrics_address"]
    prompt = list(range(90_000, 90_000 + 160))
    written = serve.client.prefill(prompt)
    assert written["stored_pages"] == 10
    other = Serve(tmp_path, *ARGS, "--l3", f"mooncake://{rpc}?metrics={metrics.split(':')[1]}")
    try:
        r = other.client.prefill(prompt)
        check_breakdown(r)
        # Written by the first instance, verified byte for byte here; a match (and so a prefetch)
        # stops at input length - 1, so the last of the 10 pages is computed.
        assert r["storage_hit"] == 144
        assert other.info["master_pid"] is None  # it started no master of its own
    finally:
        assert other.stop() == 0


def test_stop_takes_down_the_master(tmp_path):
    s = Serve(tmp_path, "--device-tokens", "256")
    master_pid = s.info["master_pid"]
    assert pid_alive(master_pid)
    assert s.stop() == 0
    deadline = time.monotonic() + 10
    while pid_alive(master_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(master_pid)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--hicache-mem-layout", "page_head", "--preset", "tiny-mla"], "not supported for MLA"),
        (["--hicache-write-policy", "write_sometimes"], "'write_sometimes'"),
        (["--l3", "redis://x"], "--l3"),
        (["--device-tokens", "100"], "whole number"),
        (["--preset", "llama-3.1-70b", "--device-tokens", "4000000", "--l3", "none"], "GiB of host memory"),
    ],
)
def test_bad_flags_exit_2(args, fragment):
    proc = subprocess.run(
        [HICACHE, "serve", "--port", str(free_port()), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
