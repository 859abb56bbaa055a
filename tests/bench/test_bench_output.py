"""What a bench prints on a real process: the verdict of an interrupted run first (SIGTERM named as
SIGTERM), and no native log lines (Mooncake's glog, torch's warnings) on the user's stderr."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

from serve_process import HICACHE

DATA = Path(__file__).resolve().parents[1] / "data" / "mooncake_fast25_synthetic_head300.jsonl"
GUARD_S = 300  # hang guard only
# glog's prefix (severity, MMDD, time, thread, file:line) and its pre-initialisation notice
GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]|Logging before InitGoogleLogging", re.M)


def leftovers() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "hicache-*")))


def test_bench_multiturn_keeps_mooncake_glog_off_stderr():
    before = leftovers()
    for workers in ("1", "3"):
        env = {k: v for k, v in os.environ.items() if k != "HICACHE_DEBUG"}
        proc = subprocess.run(
            [HICACHE, "bench", "multiturn", "--clients", "2", "--rounds", "2", "--workers", workers, "--json"],
            capture_output=True,
            text=True,
            timeout=GUARD_S,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["interrupted"] is False
        assert not GLOG.search(proc.stderr), proc.stderr
        assert "Local segment descriptor" not in proc.stderr and "No CUDA runtime" not in proc.stderr
        assert "rounds done" in proc.stderr  # its own progress still shows
    assert leftovers() == before  # the native log's temporary folder went with the run


def test_bench_multiturn_with_hicache_debug_shows_the_native_lines():
    proc = subprocess.run(
        [HICACHE, "bench", "multiturn", "--clients", "2", "--rounds", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env={**os.environ, "HICACHE_DEBUG": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert GLOG.search(proc.stderr), proc.stderr  # the redirect is what keeps them off, not their absence


def _stop_after(argv: list[str], marker: str, sig: signal.Signals) -> tuple[str, str]:
    proc = subprocess.Popen(
        [HICACHE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        seen = []
        while not any(marker in line for line in seen):
            line = proc.stderr.readline()
            assert line, f"exited with {proc.wait()} before {marker!r}: {''.join(seen)}"
            seen.append(line)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=GUARD_S)
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        return out, "".join(seen) + err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_bench_replay_on_sigterm_says_sigterm_first(tmp_path):
    lines = [json.loads(line) for line in DATA.read_text().splitlines()]
    span = lines[-1]["timestamp"] + 1
    trace = tmp_path / "long.jsonl"
    with open(trace, "w") as f:  # the sample 100 times over, swept over 50 capacities: long enough to stop mid-way
        for r in range(100):
            for line in lines:
                f.write(json.dumps({**line, "timestamp": line["timestamp"] + r * span}) + "\n")
    out, _ = _stop_after(
        ["bench", "replay", str(trace), "--sweep", "l1", "375000:24000000:50"], "replayed ", signal.SIGTERM
    )
    first = out.splitlines()[0]
    assert first == "interrupted: the figures cover the requests replayed before SIGTERM", out
    assert "Ctrl-C" not in out


def test_bench_keys_interrupted_says_so_first():
    out, _ = _stop_after(["bench", "keys", "--tokens", "1048576", "--repeats", "100000"], "run 1/", signal.SIGINT)
    first = out.splitlines()[0]
    finished = re.fullmatch(r"interrupted after (\d+) of 100000 runs: the medians cover those runs", first)
    assert finished, out
    assert f"median of {finished.group(1)} interleaved runs" in out and "same keys    yes" in out


MULTITURN = ["bench", "multiturn", "--accounting-only", "--clients", "16", "--rounds", "1000", "--new-tokens", "256",
             "--output-tokens", "16", "--l1-rounds", "100", "--workers", "1"]  # fmt: skip


def test_bench_multiturn_interrupted_says_so_first():
    out, _ = _stop_after(MULTITURN, "rounds done", signal.SIGINT)
    first = out.splitlines()[0]
    assert first.startswith("interrupted after rounds L1 ") and "L1+L2+L3 not run" in first, out
    assert first.endswith("the figures cover the rounds finished") and "prompt-token hit rate by round" in out


def test_bench_store_interrupted_says_so_first():
    out, _ = _stop_after(
        ["bench", "store", "--case", "4x64K", "--case", "8x1M", "--repeats", "100000"], "put round 1/", signal.SIGINT
    )
    first = out.splitlines()[0]
    assert first.startswith("interrupted after 4 x 64 KiB") and first.endswith("the figures cover the rounds finished")
    assert "store client vs raw Mooncake" in out.splitlines()[1], out


def test_bench_replay_prose_wraps_at_the_terminal_width():
    """A real process at 80 columns (issue 26: the header line was 184 characters): every prose line
    wraps, nothing is cut, the first line is the header and the run leaves nothing behind."""
    before = leftovers()
    proc = subprocess.run(
        [HICACHE, "bench", "replay", str(DATA), "--quiet"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert lines[0].startswith("300 of 300 requests (mooncake format"), lines[0]
    text = " ".join(proc.stdout.split())
    for whole in ("accounting mode", "in/out = KV bytes moved into / out of the tier", "(SGLang pages, same requests)"):
        assert whole in text, text
    assert leftovers() == before
