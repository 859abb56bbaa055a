"""A signal must never leave a lock held. SIGINT lands at whatever bytecode the main thread is at;
a handler that raised there could land just after an HTTP library's `lock.acquire()`, before its
`with` block can release it, and the client's close then waited forever (a prefetch stopped on a
loaded machine hung for good). hicache_ops/interrupt.py's handler raises nothing on the first
signal; `interrupt.call` runs the blocking call in a worker and raises Interrupted in our own code.

Here: real prefetch and warm processes against one real serve, each stopped by one SIGINT at a
varied moment of its loop, each must exit (130, or 0 if it had finished); and the exact moment
that used to hang (the signal sent as httpcore's pool lock is taken) in a child process."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from serve_process import HICACHE

# The session's serve of tests/warm/test_interrupt_and_silence.py (its prompts use other seeds).
SERVE_ARGS = ("--device-tokens", "2048", "--page-size", "16", "--prefetch-threshold", "32")

# A hang guard, not a speed check: a process still running this long after its SIGINT is hung.
HANG_GUARD_S = 20


@pytest.fixture(scope="module")
def serve(shared_serve):
    return shared_serve(*SERVE_ARGS)


def write_prompts(path, n: int, seed: int, length: int) -> str:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": rng.integers(0, 60_000, size=length).tolist()}) + "\n")
    return str(path)


def has_socket(pid: int) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd).startswith("socket:") for fd in fds.iterdir())
    except (FileNotFoundError, ProcessLookupError):  # it exited, or closed an fd as we read
        return False


def stop_once(serve, argv: list[str], out_path, delay_s: float) -> tuple[int | None, str]:
    """Start `hicache ARGV`, SIGINT it `delay_s` after it connected to the serve (its stop handler
    is set by then); (exit code or None if it hung, stderr)."""
    with open(out_path, "w") as out:
        proc = subprocess.Popen([HICACHE, *argv], stdout=out, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not has_socket(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert proc.poll() is None, f"{argv[0]} exited before it could be stopped: {proc.stderr.read()}"
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        try:
            code: int | None = proc.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            code = None
        return code, proc.stderr.read() if code is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.mark.parametrize("command", ["prefetch", "warm"])
def test_sigint_at_varied_moments_always_ends_the_command(serve, tmp_path, command):
    rng = random.Random(7)
    path = write_prompts(tmp_path / "storm.jsonl", 2000, seed=71 if command == "warm" else 72, length=48)
    runs = 12 if command == "prefetch" else 4
    hung = []
    for run in range(runs):
        out = tmp_path / f"{command}-{run}.json"
        delay = rng.choice([0.0, rng.uniform(0, 0.01), rng.uniform(0, 0.3)])
        code, err = stop_once(serve, [command, path, "--serve", serve.url, "--json"], out, delay)
        if code is None:
            hung.append(f"run {run} (SIGINT {delay * 1e3:.1f} ms into its loop)")
            continue
        assert code in (0, 130), err
        assert "Traceback" not in err, err
        if code == 130:
            assert json.loads(out.read_text())["interrupted"] == "SIGINT"
    assert not hung, f"{command} still running {HANG_GUARD_S} s after SIGINT: {hung}"


# The signal is sent from a profile hook the moment httpcore's ThreadLock.__enter__ has acquired its
# lock, in whichever thread runs the request. A handler that raised in that thread would leave the
# pool lock held (the client's close then never returns): checked before the fix, 1 run of 1. The
# call may still finish before the stop is seen (then it is not interrupted): either way nothing hangs.
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, threading
    from hicache_ops import interrupt
    from hicache_ops.server.client import ServeClient

    client = ServeClient.open(sys.argv[1])
    fired = []

    def hook(frame, event, arg):
        if (
            not fired
            and event == "c_return"
            and getattr(arg, "__name__", "") == "acquire"
            and frame.f_code.co_name == "__enter__"
            and "httpcore" in frame.f_code.co_filename
        ):
            fired.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    interrupted = False
    with interrupt.stop_on_signals():
        threading.setprofile(hook)
        sys.setprofile(hook)
        try:
            interrupt.call(client.prefetch, list(range(5000, 5048)))
        except interrupt.Interrupted:
            interrupted = True
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    closer = threading.Thread(target=client.close, daemon=True)
    closer.start()
    closer.join(10)
    print(json.dumps({"fired": bool(fired), "interrupted": interrupted, "closed": not closer.is_alive()}))
    """
)


def test_sigint_as_the_http_pool_lock_is_taken_leaves_no_lock_held(serve):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, serve.url], capture_output=True, text=True, timeout=HANG_GUARD_S + 40
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["fired"] and seen["closed"], seen
