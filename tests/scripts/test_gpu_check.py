"""`make gpu-check`'s script: says so and runs nothing without CUDA; its serve session on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine-without-CUDA path")
def test_without_cuda_runs_nothing_and_exits_0(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stdout
    assert not out.exists()


def test_serve_session_reads_every_page_back_from_l3(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    summary = json.loads(out.read_text())
    assert proc.returncode == 0, summary
    serve = summary["steps"]["serve"]
    assert serve["ok"] and serve["second"]["mismatched_pages"] == 0
    assert serve["second"]["storage_hit"] >= serve["first"]["computed"] - 16
