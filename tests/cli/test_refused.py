"""Absurd or wrong input is refused at once by the real `hicache` process: its exit code, one sentence
naming the value, nothing started (no master, nothing left in the temporary folder). The subprocess
timeout is only a guard against a hang, never a measurement."""

from __future__ import annotations

import glob
import http.server
import json
import os
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from hicache_ops.mooncake.net import free_port
from serve_process import HICACHE, Serve

DATA = Path(__file__).resolve().parents[1] / "data" / "mooncake_fast25_synthetic_head300.jsonl"
HUGE = "1000000000000"
GUARD_S = 120  # hang guard only


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HICACHE, *args],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def one_sentence(proc: subprocess.CompletedProcess) -> str:
    """The error line of a failed command: exactly one `error:` line, no traceback, no internal error."""
    text = proc.stderr + proc.stdout
    assert "Traceback" not in text and "internal error" not in text, text
    errors = [line for line in text.splitlines() if "error" in line.lower() and not line.startswith("hint:")]
    assert errors, text
    return " ".join(text.split())


def leftovers() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "hicache-*")))


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["inspect", "keys", "--tokens", "1,2,3", "--page-size", "1", "--tp-size", HUGE], "--tp-size"),
        (["tap", "--tp-size", HUGE], "--tp-size"),
        (["inspect", "keys", "--tokens", "1,,2", "--page-size", "1"], "empty item between commas"),
        (["inspect", "keys", "--tokens", "1,2,", "--page-size", "1"], "empty item between commas"),
        (["bench", "keys", "--tokens", HUGE], "GiB of memory"),
        (["bench", "kernels", "--tokens", HUGE, "--device", "cpu"], "GiB of memory"),
        (["bench", "replay", str(DATA), "--l1-tokens", HUGE, "--quiet"], "GiB of memory"),
        (["bench", "replay", str(DATA), "--l2-tokens", "10" + HUGE, "--quiet"], "GiB of memory"),
        (["bench", "replay", str(DATA), "--sweep", "l1", f"500000:{HUGE}:3", "--quiet"], "GiB of memory"),
        (["serve", "--log-dir", "/proc/nope"], "--log-dir '/proc/nope' cannot be created"),
        (["serve", "--device-tokens", HUGE], "GiB of host memory"),
        (["serve", "--hicache-size", "1000000"], "GiB of host memory"),
        (["serve", "--tp-size", "1000000"], "--tp-size"),
        (["serve", "--prefetch-threshold", "-1"], "--prefetch-threshold"),
        (["trace", "read", "--tokens", ",".join(map(str, range(32))), "--tp-size", "1000000"], "--tp-size"),
        (["trace", "read", "--tokens", ",".join(map(str, range(32))), "--device-tokens", HUGE], "GiB of host memory"),
        (["trace", "write", "--tokens", ",".join(map(str, range(32))), "--prefetch-threshold", "-5"], "--prefetch"),
    ],
)
def test_sizes_and_values_are_refused_before_anything_starts(args, fragment):
    before = leftovers()
    if args[0] == "serve":
        args = ["serve", "--port", str(free_port()), *args[1:]]
    proc = run(*args)
    assert proc.returncode == 2, proc.stderr
    assert fragment in one_sentence(proc)
    assert leftovers() == before  # no master log folder, no serve folder


@pytest.mark.parametrize("value, fragment", [("host", "has no port"), (":50051", "has no host")])
def test_te_check_refuses_a_mooncake_master_without_host_and_port(value, fragment):
    proc = run("te", "check", env={"MOONCAKE_MASTER": value})
    assert proc.returncode == 2, proc.stdout
    assert f"MOONCAKE_MASTER '{value}' {fragment}" in one_sentence(proc)


def test_te_check_live_honours_master_rpc_without_a_mooncake_config():
    port = free_port()  # nothing listens there: the named address is the one dialled, not an embedded master
    env = {"MOONCAKE_MASTER": "", "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": ""}
    clean = {k: v for k, v in os.environ.items() if k not in env}
    proc = subprocess.run(
        [HICACHE, "te", "check", "--live", "--tcp", "--master-rpc", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env=clean,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"127.0.0.1:{port} (connection refused)" in one_sentence(proc)


def test_te_check_live_without_a_mooncake_config_runs_on_its_own_master():
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MOONCAKE_", "SGLANG_HICACHE_MOONCAKE"))}
    before = leftovers()
    proc = subprocess.run(
        [HICACHE, "te", "check", "--live", "--tcp", "--json"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env=clean,
    )
    data = json.loads(proc.stdout)
    assert proc.returncode in (0, 1) and "error" not in data, proc.stdout
    assert data["live"]["ok"] and data["live"]["embedded_master"]
    assert data["store_config"]["master_server_address"] == data["live"]["master"]
    assert any("stands for MOONCAKE_MASTER" in n for n in data["notes"])
    assert leftovers() == before


def test_tap_path_must_name_a_file_in_a_folder_that_exists(tmp_path):
    proc = run("tap", "--path", str(tmp_path))
    assert proc.returncode == 2 and "is a folder" in one_sentence(proc)
    proc = run("tap", "--path", str(tmp_path / "missing" / "t.jsonl"))
    assert proc.returncode == 2 and "does not exist" in one_sentence(proc)
    proc = run("tap", "--path", str(tmp_path / "t.jsonl"))
    assert proc.returncode == 0, proc.stderr


def test_trace_show_of_an_empty_recording_says_so(tmp_path):
    empty = tmp_path / "tap.jsonl"
    empty.write_text("\n")
    proc = run("trace", "show", str(empty))
    assert proc.returncode == 2 and "is empty" in one_sentence(proc)


class _NotSglang(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def other_http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotSglang)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def garbage_server():
    """A TCP server that answers every connection with bytes that are not HTTP."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(b"GARBAGE\x00\xff\xfe junk\r\n\r\n")
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        sock.close()


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"input_ids": list(range(256))}) + "\n")
    return path


def test_warm_at_a_server_that_is_not_sglang_is_exit_2(other_http_server, prompts):
    proc = run("warm", str(prompts), "--sglang-url", other_http_server, "--master", f"127.0.0.1:{free_port()}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is not an SGLang server" in one_sentence(proc)


def test_a_closed_port_reads_connection_refused(prompts):
    port = free_port()
    proc = run("warm", str(prompts), "--sglang-url", f"http://127.0.0.1:{port}", "--master", "127.0.0.1:9")
    assert proc.returncode == 3 and "(connection refused)" in one_sentence(proc)
    proc = run("warm", str(prompts), "--serve", f"http://127.0.0.1:{port}")
    assert proc.returncode == 3 and "(connection refused)" in one_sentence(proc)
    proc = run("inspect", "store", "--master", f"127.0.0.1:{port}")
    assert proc.returncode == 3 and "(connection refused)" in one_sentence(proc)


def test_bytes_that_are_not_http_are_never_quoted(garbage_server, prompts):
    for args in (
        ["warm", str(prompts), "--serve", f"http://{garbage_server}"],
        ["warm", str(prompts), "--sglang-url", f"http://{garbage_server}", "--master", "127.0.0.1:9"],
        ["inspect", "store", "--master", garbage_server],
    ):
        proc = run(*args)
        sentence = one_sentence(proc)
        assert proc.returncode == 3, sentence
        assert "not an HTTP server" in sentence
        assert "GARBAGE" not in sentence and "bytearray" not in sentence and "\\x" not in sentence


def test_warm_refuses_a_prompt_larger_than_the_serve_device_pool_before_sending(tmp_path):
    serve = Serve(tmp_path / "serve", "--device-tokens", "256")
    try:
        big = tmp_path / "big.jsonl"
        big.write_text(json.dumps({"input_ids": list(range(5_000_000))}) + "\n")
        before = serve.client.stats()
        proc = run("warm", str(big), "--serve", serve.url)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "big.jsonl has 5,000,000 tokens (312,500 pages)" in one_sentence(proc)
        after = serve.client.stats()
        assert after["stats"] == before["stats"] and after["stats"]["requests"] == 0
    finally:
        serve.stop()


def test_warm_through_sglang_refuses_a_prompt_over_its_input_limit_before_sending(tmp_path):
    """A serve stands in for the SGLang server (its /server_info carries SGLang's max_req_input_len):
    the 5M-token prompt is refused from /server_info, before a page is hashed or a request sent."""
    serve = Serve(tmp_path / "serve", "--device-tokens", "256", "--page-size", "16")
    try:
        big = tmp_path / "big.jsonl"
        big.write_text(json.dumps({"input_ids": list(range(5_000_000))}) + "\n")
        before = serve.client.stats()
        metrics = serve.info["master_metrics_address"]
        for _ in range(2):
            proc = run("warm", str(big), "--sglang-url", serve.url, "--master", metrics, "--page-size", "16")
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert (
                f"big.jsonl has 5,000,000 tokens and the SGLang server at {serve.url} takes prompts under 256 tokens "
                "(its /server_info max_req_input_len)" in one_sentence(proc)
            )
        after = serve.client.stats()
        assert after["stats"] == before["stats"] and after["stats"]["requests"] == 0
    finally:
        serve.stop()


def test_hicache_serve_in_the_environment_is_the_default_serve(prompts):
    url = f"http://127.0.0.1:{free_port()}"
    for command in ("warm", "prefetch"):
        proc = run(command, str(prompts), env={"HICACHE_SERVE": url})
        assert proc.returncode == 3 and f"no hicache serve answers at {url} (connection refused)" in one_sentence(proc)


def test_warm_against_a_serve_whose_master_died_says_the_reason_health_knows(tmp_path, prompts):
    import signal
    import time

    serve = Serve(tmp_path / "serve")
    try:
        os.kill(serve.info["master_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60  # hang guard: the serve notices the exit at once
        while serve.client.health()["status"] != "degraded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        reason = serve.client.health()["reason"]
        for _ in range(2):  # a rerun says the same
            proc = run("warm", str(prompts), "--serve", serve.url)
            sentence = one_sentence(proc)
            assert proc.returncode == 3, sentence
            assert f"has its L3 down: {reason.rstrip('.')}" in sentence
            assert "--master" not in sentence and "start `hicache serve` again" in sentence
        # the condition has a stable name in the JSON error, and the cross-host-miss playbook's
        # check 2 tests that name, not the sentence (what `playbook run` feeds its condition)
        from hicache_ops.commands.playbook import holds, load_playbook

        proc = run("warm", str(prompts), "--serve", serve.url, "--dry-run", "--json")
        error = json.loads(proc.stdout)["error"]
        assert proc.returncode == 3 and (error["code"], error["kind"]) == ("unreachable", "l3_down"), proc.stdout
        check = next(c for c in load_playbook("cross-host-miss").checks if c.title.startswith("2."))
        assert "{serve} --dry-run --json" in check.run and check.when == ['exit == 3 and error.kind == "l3_down"']
        (when,) = check.when
        assert holds(when, {**json.loads(proc.stdout), "exit": proc.returncode})
        reworded = {"error": {**error, "message": "L3 unavailable"}, "exit": 3}
        assert holds(when, reworded)  # the wording may change; the finding does not
        assert not holds(when, {"error": {**error, "kind": None}, "exit": 3})
    finally:
        serve.stop()


def test_warm_to_a_pipe_starts_with_its_output_not_a_blank_line(tmp_path, prompts):
    serve = Serve(tmp_path / "serve")
    try:
        proc = run("warm", str(prompts), "--serve", serve.url)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"warm {serve.url}") and not proc.stderr.startswith("\n"), (
            proc.stdout,
            proc.stderr,
        )
    finally:
        serve.stop()
