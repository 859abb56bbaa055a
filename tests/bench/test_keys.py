"""`hicache bench keys`: a small run end to end against SGLang 0.5.23's get_hash_str, and the
refusal when the two sides' keys differ."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.bench.key_throughput import require_same_keys
from hicache_ops.errors import CheckFailed
from hicache_ops.sglang.page_keys import page_keys


def test_small_run_reports_medians_of_interleaved_runs():
    result = hicache(["bench", "keys", "--tokens", "8192", "--page-size", "64", "--repeats", "3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["tokens"], data["page_size"], data["repeats"], data["statistic"]) == (8192, 64, 3, "median")
    assert data["same_keys"] is True and data["sglang_error"] is None
    assert len(data["ours_seconds"]) == len(data["sglang_seconds"]) == 3
    ours_median = sorted(data["ours_seconds"])[1]
    theirs_median = sorted(data["sglang_seconds"])[1]
    assert data["ours_tokens_per_s"] == pytest.approx(8192 / ours_median)
    assert data["sglang_tokens_per_s"] == pytest.approx(8192 / theirs_median)
    assert data["ratio"] == pytest.approx(theirs_median / ours_median)


def test_human_output_names_the_statistic():
    result = hicache(["bench", "keys", "--tokens", "1024", "--page-size", "16", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert "median of 1 interleaved runs" in result.stdout and "same keys" in result.stdout


def test_different_keys_are_refused():
    ids = np.arange(256, dtype=np.int64)
    keys = page_keys(ids, 64, "0.5.23")
    require_same_keys(keys, list(keys))
    salted = page_keys(ids, 64, "0.5.23", extra_key="tenant")
    with pytest.raises(CheckFailed, match="different keys from page 0"):
        require_same_keys(keys, salted)
    shifted = keys[:2] + page_keys(ids + 1, 64, "0.5.23")[2:]
    with pytest.raises(CheckFailed, match="from page 2"):
        require_same_keys(keys, shifted)
    with pytest.raises(CheckFailed, match="4 page keys and SGLang 3"):
        require_same_keys(keys, keys[:3])


def test_bad_input_exits_2():
    result = hicache(["bench", "keys", "--tokens", "10", "--page-size", "64"])
    assert result.exit_code == 2 and "at least one page" in result.output


def test_bench_keys_quiet_stderr_is_empty():
    """--quiet: nothing on stderr at all (no torch CUDA warning, no native log line, no progress)."""
    import os
    import subprocess

    from serve_process import HICACHE

    proc = subprocess.run(
        [HICACHE, "bench", "keys", "--tokens", "65536", "--repeats", "1", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
