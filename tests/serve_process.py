"""A real `hicache serve` process on loopback for tests (started and stopped by PID)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hicache_ops.errors import UnreachableError
from hicache_ops.mooncake.net import free_port
from hicache_ops.server.client import ServeClient

HICACHE = str(Path(sys.executable).with_name("hicache"))


class Serve:
    def __init__(self, tmp: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.output = tmp / "serve.out"  # a file, not a pipe: a full pipe would block the server
        with open(self.output, "w") as out:
            self.proc = subprocess.Popen(
                [HICACHE, "serve", "--port", str(self.port), "--log-dir", str(tmp), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self.client = ServeClient(self.url)
        deadline = time.monotonic() + 90
        while True:
            try:
                self.client.health()
                break
            except UnreachableError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"serve did not start: {self.output.read_text()}") from None
                time.sleep(0.2)
        self.info = self.client.stats()["config"]

    def stop(self) -> int:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
