"""Commands without a stop-aware loop end on a real SIGINT or SIGTERM with one line and exit 130,
taking down what they started (here: `trace write --step` waiting for Enter, master running)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from serve_process import HICACHE, pid_alive


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_trace_step_stops_on_a_signal(sig):
    tokens = ",".join(str(t) for t in range(1000, 1064))
    proc = subprocess.Popen([HICACHE, "trace", "write", "--tokens", tokens, "--step"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        line = ""
        while "Enter" not in line and time.monotonic() < deadline:
            line += proc.stderr.read(1)  # the first "Enter for the next step" prompt
            assert proc.poll() is None, line
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        proc.send_signal(sig)
        sent = time.monotonic()
        code = proc.wait(timeout=60)
        assert time.monotonic() - sent < 10
        assert code == 130
        err = proc.stderr.read()
        assert "interrupted" in err and "Traceback" not in err
        for child in children:  # the embedded master went down with it
            stop = time.monotonic() + 10
            while pid_alive(int(child)) and time.monotonic() < stop:
                time.sleep(0.1)
            assert not pid_alive(int(child))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
