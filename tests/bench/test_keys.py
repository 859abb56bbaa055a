"""`hicache bench keys`: a tiny run, ours beside SGLang's get_hash_str."""

from __future__ import annotations

import json

from cli_runner import hicache

TINY = ["bench", "keys", "--tokens", "512", "--page-size", "64", "--repeats", "1"]


def test_tiny_run_measures_both_sides_and_finds_the_same_keys():
    result = hicache([*TINY, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["tokens"], data["page_size"], data["repeats"]) == (512, 64, 1)
    assert data["sglang_error"] is None and data["same_keys"] is True
    assert data["ours_tokens_per_s"] > 0 and data["sglang_tokens_per_s"] > 0
    assert data["ratio"] == data["ours_tokens_per_s"] / data["sglang_tokens_per_s"]


def test_human_rendering_and_bad_sizes():
    human = hicache(TINY)
    assert human.exit_code == 0, human.output
    assert "ratio" in human.stdout and "same keys    True" in human.stdout
    bad = hicache(["bench", "keys", "--tokens", "32", "--page-size", "64", "--json"])
    assert bad.exit_code == 2 and "at least one page" in json.loads(bad.stdout)["error"]["message"]
