"""`hicache bench store`: a tiny case, our store client beside raw Mooncake on a loopback master."""

from __future__ import annotations

import json
import tempfile

import pytest

from cli_runner import hicache


@pytest.fixture
def temp_under(tmp_path, monkeypatch):
    """The run's temporary folders are made under pytest's tmp_path, not /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_tiny_case_puts_and_gets_through_both_sides(temp_under):
    result = hicache(["bench", "store", "--case", "4x64K", "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (case,) = data["cases"]
    assert (case["objects"], case["object_bytes"], case["batch_bytes"]) == (4, 64 * 1024, 4 * 64 * 1024)
    for side in ("put_ours_gbps", "put_raw_gbps", "get_ours_gbps", "get_raw_gbps"):
        assert case[side] > 0
    assert data["min_ratio"] == min(case["put_ratio"], case["get_ratio"])
    assert data["meets_goal"] == (data["min_ratio"] >= data["goal"])
    # Its temporary folders (the master's and the clients' logs) were made here, not in /tmp, and a
    # run that went well removes them.
    assert not [p.name for p in temp_under.iterdir() if p.name.startswith("hicache-")]


@pytest.mark.parametrize("case", ["4", "x64K", "4x", "4x64G"])
def test_bad_case_is_one_sentence_and_exit_2(case):
    result = hicache(["bench", "store", "--case", case, "--json"])
    assert result.exit_code == 2, result.output
    assert "COUNTxBYTES" in json.loads(result.stdout)["error"]["message"]
