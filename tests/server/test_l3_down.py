"""`hicache serve` with a dead or silent L3: a real master killed by PID (embedded) or frozen
(an existing master, --l3 mooncake://). The serve reaps it, logs it, says so on /health, /v1/stats
and /metrics, and still stops in seconds."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from hicache_ops.engine.builder import EngineSpec
from hicache_ops.errors import UnreachableError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.server.runtime import L3Target, Runtime
from serve_process import Serve, pid_alive

# Bounds are loose upper limits for a loaded 2-core machine, not performance figures.
NOTICE_S = 10.0
STOP_S = 10.0


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()


def health(serve: Serve) -> httpx.Response:
    return httpx.get(serve.url + "/health", timeout=5)


def timed_stop(serve: Serve) -> tuple[int, float]:
    start = time.monotonic()
    serve.proc.send_signal(signal.SIGTERM)
    code = serve.proc.wait(timeout=60)
    return code, time.monotonic() - start


def test_embedded_master_killed(tmp_path):
    serve = Serve(tmp_path, "--device-tokens", "256", "--page-size", "16")
    try:
        assert health(serve).json() == {"status": "ok", "l3": "up"}
        master_pid = serve.info["master_pid"]
        os.kill(master_pid, signal.SIGKILL)

        degraded = wait_for(lambda: health(serve).status_code == 503, NOTICE_S)
        assert degraded, health(serve).text
        body = health(serve).json()
        assert body["status"] == "degraded" and body["l3"] == "down" and "SIGKILL" in body["reason"]
        # How to recover, in one sentence: the serve does not restart its master (docs/serve-api.md).
        assert body["recover"].startswith("this serve does not restart its embedded master: stop the serve")
        assert f"the dead master's log is {serve.info['master_log']}." in body["recover"]
        assert wait_for(lambda: f"to recover: {body['recover']}" in serve.output.read_text(), NOTICE_S)
        # Reaped, not a zombie: a zombie still answers kill(pid, 0).
        assert wait_for(lambda: not pid_alive(master_pid), NOTICE_S)
        assert "L3 is down" in serve.output.read_text()

        with pytest.raises(UnreachableError, match="down"):
            serve.client.prefill(list(range(64)))
        l3 = serve.client.stats()["l3"]
        assert l3["state"] == "down" and l3["errors"] >= 1 and "down" in l3["last_error"]
        metrics = serve.client.metrics()
        assert "hicache_l3_up 0.0" in metrics and "hicache_l3_errors_total 1.0" in metrics
    finally:
        serve.client.close()
        code, seconds = timed_stop(serve)
    assert code == 0 and seconds < STOP_S


def test_existing_master_that_stops_answering(tmp_path, fresh_mooncake_master, freeze_process):
    master = fresh_mooncake_master
    l3 = f"mooncake://{master.rpc_address}?metrics={master.metrics_address.rsplit(':', 1)[1]}"
    serve = Serve(tmp_path, "--device-tokens", "256", "--page-size", "16", "--l3", l3)
    try:
        assert health(serve).json()["l3"] == "up"
        freeze_process(master.pid)
        assert wait_for(lambda: health(serve).status_code == 503, NOTICE_S), health(serve).text
        body = health(serve).json()
        assert body["l3"] == "down" and master.metrics_address in body["reason"]
        assert body["recover"].startswith(f"bring the Mooncake master at {master.metrics_address} back")
        assert serve.client.stats()["l3"]["failed_probes"] >= 1

        os.kill(master.pid, signal.SIGCONT)
        assert wait_for(lambda: health(serve).status_code == 200, NOTICE_S), health(serve).text
        assert "L3 is up again" in serve.output.read_text()

        freeze_process(master.pid)  # stop the serve while its master is silent
        assert wait_for(lambda: health(serve).status_code == 503, NOTICE_S)
    finally:
        serve.client.close()
        code, seconds = timed_stop(serve)
    assert code == 0 and seconds < STOP_S


def test_a_stop_decides_on_a_fresh_probe_and_unmounts(fresh_mooncake_master):
    """One slow answer on a loaded machine marks L3 down; if the master answers at the stop, the
    client is closed (its segment leaves the master now), not abandoned (listed for the TTL, and
    puts a peer places there fail)."""
    master = fresh_mooncake_master
    runtime = Runtime(
        EngineSpec(page_size=16, device_tokens=256),
        l3=L3Target("mooncake", master.rpc_address, master.metrics_address),
    ).start()
    try:
        health = runtime.l3_health
        assert health is not None
        with AdminClient(master.metrics_address) as admin:
            assert len(admin.get_all_segments()) == 1
            health._set("down", "no answer within 1 s")  # what a missed probe leaves behind
            assert runtime.stop() is True
            assert admin.get_all_segments() == []
    finally:
        runtime.stop()  # a no-op once stopped
