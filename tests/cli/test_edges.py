"""Bad values at the edge: exit 2 with one sentence naming the value, before anything starts or is
asked; sizes that cannot fit are not reported as an unreachable master."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from cli_runner import hicache
from hicache_ops.errors import UnreachableError
from hicache_ops.mooncake.net import free_port
from hicache_ops.server.client import ServeClient
from serve_process import HICACHE


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["inspect", "store", "--master", "127.0.0.1:9", "--timeout", "0"], "--timeout 0"),
        (["inspect", "store", "--master", "127.0.0.1:9", "--timeout", "-1"], "--timeout -1"),
        (["inspect", "keys", "--tokens", "1,2,3", "--page-size", "1", "--tp-size", "0"], "--tp-size 0"),
        (["inspect", "keys", "--tokens", "1,2,3", "--page-size", "1", "--tp-size", "-1"], "--tp-size -1"),
        (["inspect", "keys", "--tokens", "1,2,3", "--page-size", "1", "--pp-size", "0"], "--pp-size 0"),
        (["trace", "write", "--tokens", "1,2,3"], "fewer than one page"),
        (["prefetch", "{prompts}", "--serve", "http://127.0.0.1:notaport"], "--serve"),
        (["prefetch", "{prompts}", "--timeout", "-1"], "--timeout"),
        (["trace", "read", "--tokens", "1,2,3", "--serve", "http://127.0.0.1:1", "--preset", "tiny-mla"], "--preset"),
        (["bench", "store", "--case", "8x1024M"], "GiB of memory"),
    ],
)
def test_usage_errors_are_exit_2(tmp_path, args, fragment):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": list(range(64))}) + "\n")
    result = hicache([a.format(prompts=prompts) for a in args] + ["--json"])
    assert result.exit_code == 2, result.stdout
    message = json.loads(result.stdout)["error"]["message"]
    assert fragment in message and "internal error" not in message


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--device", "tpu"], "'tpu' is not one of"),
        (["--device", "cuda"], "CUDA device"),
        (["--log-dir", "{file}"], "is a file"),
        (["--host", "999.1.1.1"], "--host '999.1.1.1'"),
        (["--segment-mb", "100000000"], "GiB of memory"),
        (["--keep-logs", "--log-dir", "{folder}"], "--keep-logs"),
    ],
)
def test_serve_usage_errors_are_exit_2(tmp_path, args, fragment):
    afile = tmp_path / "a-file"
    afile.write_text("")
    args = [a.format(file=afile, folder=tmp_path) for a in args]
    proc = subprocess.run(
        [HICACHE, "serve", "--port", str(free_port()), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_serve_removes_its_temporary_logs_unless_kept(tmp_path):
    for keep in (False, True):
        port = free_port()
        proc = subprocess.Popen(
            [HICACHE, "serve", "--port", str(port), "--device-tokens", "256", *(["--keep-logs"] if keep else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    with ServeClient(f"http://127.0.0.1:{port}") as client:
                        folder = client.stats()["config"]["master_log"].rsplit("/", 1)[0]
                    break
                except UnreachableError:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.2)
            assert folder.startswith(os.path.join(tempfile.gettempdir(), "hicache-serve-"))
        finally:
            proc.terminate()
            err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 0
        if keep:
            assert os.path.isdir(folder) and f"logs kept in {folder}" in err
            shutil.rmtree(folder)
        else:
            assert not os.path.exists(folder)
