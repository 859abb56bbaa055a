"""The embedded mooncake_master: start on free loopback ports, ready, stop by PID, no orphan."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.mooncake.master import EmbeddedMaster, find_master_binary
from hicache_ops.mooncake.net import parse_host_port


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _listening(address: str) -> bool:
    host, port = parse_host_port(address)
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _wait_dead(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def test_binary_is_the_wheels_executable():
    path = Path(find_master_binary())
    assert path.name == "mooncake_master" and os.access(path, os.X_OK)
    # The real binary, not the Python wrapper that would exec it: the PID we hold is the master's.
    assert not path.read_bytes()[:2] == b"#!"


def _wait_for_text(path: Path, text: str, seconds: float) -> bool:
    """True once `text` is in the file at `path`; False after `seconds` without it."""
    deadline = time.monotonic() + seconds
    while text not in path.read_text(errors="replace"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_start_ready_stop(tmp_path):
    log = tmp_path / "master.log"
    master = EmbeddedMaster(log_path=log)
    assert master.pid is None and not master.running
    master.start()
    try:
        pid = master.pid
        assert master.running and _alive(pid)
        assert master.rpc_address.startswith("127.0.0.1:") and master.metrics_address.startswith("127.0.0.1:")
        assert master.rpc_address != master.metrics_address
        assert master.metadata_server == "P2PHANDSHAKE" and master.client_env() == {}
        assert _listening(master.rpc_address) and _listening(master.metrics_address)
        with AdminClient(master.metrics_address) as admin:
            health = admin.health()
        assert health["service_ready"] is True and health["status"] == "ok"
        # Its own process group, so a signal to ours does not reach it and vice versa.
        assert os.getpgid(pid) == pid != os.getpgid(0)
        assert master.log_path == log and log.exists()
        # The master's own output reaches the log. Checked while it runs, with a bound: glog may
        # write the line after /health already answers, and a loaded machine can delay it.
        assert _wait_for_text(log, "Master service started", 30), log.read_text(errors="replace")
        info = master.info()
        assert info["pid"] == pid and info["log_path"] == str(log) and info["running"] is True
    finally:
        code = master.stop()
    assert code is not None
    assert not master.running and not _alive(pid)
    assert not _listening(master.rpc_address) and not _listening(master.metrics_address)
    assert master.stop() == code  # idempotent


def test_default_log_path_is_reported():
    with EmbeddedMaster() as master:
        assert master.log_path is not None and master.log_path.exists()
        text = master.log_path.read_text(errors="replace")
    assert "--rpc_address=127.0.0.1" in text


def test_two_masters_get_distinct_ports():
    with EmbeddedMaster() as a, EmbeddedMaster() as b:
        ports = {a.rpc_port, a.metrics_port, b.rpc_port, b.metrics_port}
        assert len(ports) == 4


def test_kill_is_immediate():
    master = EmbeddedMaster().start()
    pid = master.pid
    assert master.kill() == -signal.SIGKILL
    assert not _alive(pid)
    assert master.stop() == -signal.SIGKILL


def test_stop_a_silent_master():
    master = EmbeddedMaster().start()
    pid = master.pid
    os.kill(pid, signal.SIGSTOP)
    master.stop()
    assert not _alive(pid)


def test_no_orphan_when_the_parent_is_killed(tmp_path):
    """The parent dies by SIGKILL (no atexit, no finally): the master must die with it."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from hicache_ops.mooncake.master import EmbeddedMaster\n"
        "m = EmbeddedMaster().start()\n"
        "print(m.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), line
        pid = int(line)
        assert _alive(pid)
        parent.kill()
        parent.wait(timeout=10)
        assert _wait_dead(pid, 10.0), f"mooncake_master {pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_no_orphan_on_normal_exit_without_stop(tmp_path):
    script = tmp_path / "forgetful.py"
    script.write_text(
        "from hicache_ops.mooncake.master import EmbeddedMaster\n"
        "m = EmbeddedMaster().start()\n"
        "print(m.pid, flush=True)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.strip())
    assert _wait_dead(pid, 10.0)


def test_http_metadata_mode(monkeypatch):
    from hicache_ops.mooncake.store_client import StoreClient

    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    with EmbeddedMaster(http_metadata=True) as master:
        assert master.metadata_server.startswith("http://127.0.0.1:") and master.metadata_server.endswith("/metadata")
        assert master.client_env() == {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}
        owner = StoreClient.connect(master.rpc_address, segment_size=16 << 20, metadata_server=master.metadata_server)
        try:
            owner.put("http-md/x", b"payload")
            assert owner.get("http-md/x") == b"payload"
        finally:
            owner.close()


def test_missing_binary_is_an_input_error():
    with pytest.raises(InputError):
        EmbeddedMaster(binary="/nonexistent/mooncake_master").start()


# A master whose admin server says ready while its RPC port does not listen yet: Mooncake starts
# the admin server first, and a client that connects in between is refused (a race seen in
# tests/trace/test_trace.py). This stand-in answers /health and never opens the RPC port.
HEALTH_ONLY = """#!{python}
import http.server, json, sys
port = int(next(a for a in sys.argv if a.startswith("--metrics_port=")).split("=")[1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"status": "ok", "service_ready": True}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_ready_waits_for_the_rpc_port_not_only_the_admin_server(tmp_path):
    binary = tmp_path / "mooncake_master"
    binary.write_text(HEALTH_ONLY.format(python=sys.executable))
    binary.chmod(0o755)
    master = EmbeddedMaster(binary=str(binary), log_path=tmp_path / "master.log", ready_timeout=3.0)
    try:
        with pytest.raises(UnreachableError, match="not ready within"):
            master.start()
    finally:
        master.stop()
    assert master.pid is not None and not _alive(master.pid)
