"""scripts/bench_vs_simulator.py: the page-reference stream it builds, and its refusals (the
simulator itself is SGLang's file, outside the repository: docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from hicache_ops.commands.bench.replay_trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_vs_simulator.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_vs_simulator", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 5, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [7]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_page_stream_is_every_block_as_one_request_in_arrival_order(tmp_path):
    stream = _script().page_stream(load_trace(str(_trace(tmp_path))))
    assert [(r.timestamp, r.hash_ids, r.input_length, r.line) for r in stream.requests] == [
        (0.0, [7], 512, 1),
        (5.0, [7], 512, 2),
        (5.0, [8], 512, 3),
        (5.0, [9], 512, 4),
    ]
    assert stream.format == "mooncake"


def test_missing_simulator_is_one_sentence_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--simulator", str(tmp_path / "absent.py"), "--trace", str(_trace(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --simulator {tmp_path / 'absent.py'} is not a file "
        "(SGLang's benchmark/hicache/hicache_policy_simulator.py)."
    ]
    assert proc.stdout == ""
