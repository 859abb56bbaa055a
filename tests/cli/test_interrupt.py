"""Commands without a stop-aware loop end on a real SIGINT or SIGTERM with one line and exit 130,
taking down what they started (here: `trace write --step` waiting for Enter, master running).
Benchmarks with one (bench multiturn, keys, store) print what they measured so far, marked
interrupted, and exit 130."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from serve_process import HICACHE, pid_alive

# How long a signalled command may take to exit before the test calls it hung.
HANG_GUARD_S = 120


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_trace_step_stops_on_a_signal(sig):
    tokens = ",".join(str(t) for t in range(1000, 1064))
    proc = subprocess.Popen(
        [HICACHE, "trace", "write", "--tokens", tokens, "--step"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        line = ""
        while "Enter" not in line and time.monotonic() < deadline:
            line += proc.stderr.read(1)  # the first "Enter for the next step" prompt
            assert proc.poll() is None, line
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        proc.send_signal(sig)
        try:  # a hang guard, not a speed check: the wait is bounded, its length asserts nothing
            code = proc.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"trace write --step was still running {HANG_GUARD_S} s after {sig.name}: the signal did not stop it"
            )
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


# -- benchmarks with a stop-aware loop: the figures measured so far, marked interrupted, exit 130 --


def _start_until(argv: list[str], marker: str) -> tuple[subprocess.Popen, list[str]]:
    """Start `hicache ARGV` in its own process group; return once a stderr line contains `marker`
    (its loop is running), with the PIDs of its children at that moment."""
    proc = subprocess.Popen(
        [HICACHE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    seen = []
    while not any(marker in line for line in seen):
        line = proc.stderr.readline()  # ends: the command prints progress, or exits and closes stderr
        assert line, f"exited with {proc.wait()} before {marker!r}: {''.join(seen)}"
        seen.append(line)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    return proc, children


def _stop(
    proc: subprocess.Popen, children: list[str], *, whole_group: bool = False, sig: signal.Signals = signal.SIGINT
) -> tuple[str, str]:
    """`sig` (to the process, or to its group as a terminal's Ctrl-C does); its output once it
    exited 130, having taken down every child it had."""
    try:
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        for child in children:
            stop = time.monotonic() + 10
            while pid_alive(int(child)) and time.monotonic() < stop:
                time.sleep(0.1)
            assert not pid_alive(int(child)), f"child {child} still runs"
        return out, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


# Long enough that no configuration finishes its 1,000 rounds before the first progress line
# (5 s on a pipe): the stop must find every worker mid-run.
MULTITURN = [
    "bench",
    "multiturn",
    "--accounting-only",
    "--clients",
    "128",
    "--rounds",
    "1000",
    "--new-tokens",
    "256",
    "--output-tokens",
    "16",
    "--l1-rounds",
    "100",
]


def test_bench_multiturn_ctrl_c_reports_the_rounds_each_worker_finished():
    # Three worker processes; the signal reaches all of them, as a terminal's Ctrl-C does.
    proc, children = _start_until([*MULTITURN, "--workers", "3", "--json"], "rounds done")
    assert len(children) >= 3, children
    out, _ = _stop(proc, children, whole_group=True)
    data = json.loads(out)
    assert data["interrupted"] is True
    done = {name: conf["rounds_done"] for name, conf in data["configurations"].items()}
    assert set(done) == {"l1", "l1_l2", "l1_l2_l3"} and all(0 < n < 1000 for n in done.values()), done
    assert len(data["rounds"]) == max(done.values()) and data["rounds_totalled"] == min(done.values())
    for name, n in done.items():  # a figure for each round a configuration finished, none after
        assert all(entry[name] is not None for entry in data["rounds"][:n])
        assert all(entry[name] is None for entry in data["rounds"][n:])


def test_bench_multiturn_sigterm_to_the_group_stops_every_worker_after_its_round():
    # A service manager's SIGTERM reaches the workers too: they stop like on the parent's request.
    proc, children = _start_until([*MULTITURN, "--workers", "3", "--json"], "rounds done")
    out, _ = _stop(proc, children, whole_group=True, sig=signal.SIGTERM)
    data = json.loads(out)
    assert data["interrupted"] is True
    done = [conf["rounds_done"] for conf in data["configurations"].values()]
    assert len(done) == 3 and all(0 < n < 1000 for n in done), done


def test_bench_multiturn_ctrl_c_in_one_process_prints_the_partial_table():
    proc, children = _start_until([*MULTITURN, "--workers", "1"], "rounds done")
    out, _ = _stop(proc, children)
    assert "prompt-token hit rate by round" in out  # the table
    assert "interrupted after rounds L1 " in out
    assert "L1+L2+L3 not run" in out  # serial: the configurations after the stopped one never start


def test_bench_keys_ctrl_c_reports_the_runs_finished():
    proc, children = _start_until(["bench", "keys", "--tokens", "1048576", "--repeats", "100000"], "run 1/")
    out, _ = _stop(proc, children)
    assert "M tokens/s" in out and "same keys    yes" in out
    finished = re.search(r"interrupted after (\d+) of 100000 runs", out)
    assert finished and 1 <= int(finished.group(1)) < 100000, out
    assert f"median of {finished.group(1)} interleaved runs" in out


def test_bench_store_ctrl_c_reports_the_rounds_finished_and_stops_its_master():
    proc, children = _start_until(
        ["bench", "store", "--case", "4x64K", "--case", "8x1M", "--repeats", "100000", "--json"], "put round 1/"
    )
    assert children  # the embedded mooncake_master
    out, _ = _stop(proc, children)
    data = json.loads(out)
    assert data["interrupted"] is True
    first = data["cases"][0]
    assert (first["objects"], first["object_bytes"]) == (4, 64 * 1024)
    assert 1 <= first["rounds"] < 100000 and first["put_ratio"] > 0
    assert first["get_rounds"] < 100000
    assert data["min_ratio"] == min(r for c in data["cases"] for r in (c["put_ratio"], c["get_ratio"]) if r is not None)
