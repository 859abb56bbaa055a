"""`hicache trace write|read`: every step's check, each injected fault caught at the right step,
against the embedded engine and against a running serve."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from cli_runner import hicache
from hicache_ops.commands.trace.run import FAULTS, run_embedded
from hicache_ops.engine.builder import EngineSpec
from hicache_ops.sglang.geometry import ModelGeometry, preset
from serve_process import Serve

TOKENS = list(range(2000, 2200))  # 12 whole pages of 16 and 8 trailing tokens
# wait_complete: a test that expects every L3 page must not depend on how fast reads are here
# (best_effort takes what arrived by admission); the stop-policy fault sets its own policy.
SPEC = EngineSpec(page_size=16, device_tokens=1024, prefetch_threshold=64, stop_policy="wait_complete")

WRITE_STEPS = [
    "compute",
    "write policy",
    "device to host",
    "backed-up ack",
    "page keys",
    "object keys",
    "batch_is_exist",
    "batch_put_from",
    "verify on master",
]
READ_STEPS = [
    "local match",
    "prefetch decision",
    "batch_exists",
    "batch_get_into",
    "stop policy",
    "insert",
    "load back",
    "device bytes",
]


def test_healthy_write_path_passes_every_step():
    run = run_embedded("write", TOKENS, SPEC)
    assert [s.name for s in run.steps] == WRITE_STEPS
    assert all(s.status == "PASS" for s in run.steps)
    put = next(s for s in run.steps if s.name == "batch_put_from")
    assert len(put.detail["objects"]) == 24 and all(o["code"] == 0 for o in put.detail["objects"])


def test_healthy_read_path_reuses_the_prefix_across_instances():
    run = run_embedded("read", TOKENS, SPEC)
    assert [s.name for s in run.steps] == READ_STEPS
    assert all(s.status == "PASS" for s in run.steps), [(s.name, s.summary) for s in run.steps]
    final = run.steps[-1].detail
    assert final["storage_hit"] == 192 and final["computed"] == 8 and final["mismatched_pages"] == 0


EXPECTED_FAILURE = {
    ("read", "missing-v"): ("batch_exists", "_0_v"),
    ("read", "tp-rank-mismatch"): ("batch_exists", "_1_k"),
    ("read", "salt-mismatch"): ("batch_exists", "cache_salt='tenant-a'"),
    ("read", "version-mismatch"): ("batch_exists", "prefix"),
    ("read", "below-threshold"): ("prefetch decision", "threshold"),
    ("read", "write-back-no-eviction"): ("batch_exists", "write_back copies a page to host and L3 only when"),
    ("read", "prefetch-timeout"): ("stop policy", "budget"),
    ("read", "corrupted-object"): ("batch_get_into", "corrupted"),
    ("write", "write-back-no-eviction"): ("write policy", "evicted"),
}


# Faults that need an MLA deployment with DCP (SGLang 0.5.23): tests/trace/test_trace_dcp.py;
# faults that need side pools: tests/trace/test_side_pools.py.
DCP_FAULTS = {"missing-dcp-shard", "dcp-mismatch"}
SIDE_POOL_FAULTS = {"missing-side-object"}


def test_every_fault_has_an_expectation():
    assert {f for _, f in EXPECTED_FAILURE} | DCP_FAULTS | SIDE_POOL_FAULTS == set(FAULTS)


@pytest.mark.parametrize("kind, fault", sorted(EXPECTED_FAILURE))
def test_injected_fault_stops_at_the_right_step(kind, fault):
    step_name, cause_fragment = EXPECTED_FAILURE[(kind, fault)]
    run = run_embedded(kind, TOKENS, SPEC, inject=fault)
    failed = run.failed_step
    assert failed is not None and failed.name == step_name, [(s.name, s.status) for s in run.steps]
    assert run.steps[-1] is failed  # reporting stops at the first failing step
    assert any(cause_fragment in c for c in failed.causes) or cause_fragment in failed.summary, failed.causes


def test_cli_json_lines_and_exit_codes():
    result = hicache(["trace", "write", "--tokens", ",".join(map(str, TOKENS)), "--json"])
    assert result.exit_code == 0, result.stdout
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["name"] for r in records] == WRITE_STEPS
    assert set(records[0]) >= {"step", "name", "status", "detail", "elapsed_ms"}
    result = hicache(
        [
            "trace",
            "read",
            "--tokens",
            ",".join(map(str, TOKENS)),
            "--prefetch-threshold",
            "64",
            "--inject",
            "missing-v",
            "--json",
        ]
    )
    assert result.exit_code == 1
    assert json.loads(result.stdout.splitlines()[-1])["status"] == "FAIL"


def test_human_trace_leads_with_its_verdict_and_wraps_at_the_terminal_width():
    """A real process at 80 columns: line 1 is the answer (where the path stops, or that it
    completed), then the steps; no line wider than the terminal."""
    env = {**os.environ, "COLUMNS": "80"}
    tokens = ",".join(map(str, TOKENS))
    stops = subprocess.run(
        [
            sys.executable,
            "-m",
            "hicache_ops.cli",
            "trace",
            "read",
            "--tokens",
            tokens,
            "--prefetch-threshold",
            "64",
            "--inject",
            "missing-v",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert stops.returncode == 1, stops.stderr
    lines = stops.stdout.splitlines()
    assert re.fullmatch(r"The read path stops at step \d+ \(batch_exists\)\.", lines[0]), stops.stdout
    assert lines[1].lstrip().startswith("0. scenario"), stops.stdout
    assert all(len(line) <= 80 for line in lines), stops.stdout
    done = subprocess.run(
        [sys.executable, "-m", "hicache_ops.cli", "trace", "write", "--tokens", tokens],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "The write path completed: every step's check holds.", done.stdout
    assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout


def test_cli_step_mode_waits_for_enter():
    result = hicache(["trace", "write", "--tokens", ",".join(map(str, TOKENS)), "--step"], input="\n" * 20)
    assert result.exit_code == 0
    assert "verify on master" in result.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["read", "--inject", "nope"], "unknown"),
        (["write", "--inject", "missing-v"], "applies to"),
        (["read", "--inject", "missing-v", "--serve", "http://127.0.0.1:1"], "embedded engine only"),
        (["read", "--flush"], "--flush applies to --serve"),
        (["read", "--hicache-write-policy", "sometimes"], "'sometimes' is not one of"),
    ],
)
def test_cli_bad_input_exits_2(args, fragment):
    kind, *rest = args
    result = hicache(["trace", kind, "--tokens", ",".join(map(str, TOKENS)), *rest, "--json"])
    assert result.exit_code == 2, result.stdout
    assert fragment in json.loads(result.stdout)["error"]["message"]


def test_against_a_running_serve(tmp_path):
    serve = Serve(
        tmp_path,
        "--device-tokens",
        "1024",
        "--prefetch-threshold",
        "64",
        "--hicache-storage-prefetch-policy",
        "wait_complete",
    )
    try:
        ids = ",".join(map(str, TOKENS))
        observed = hicache(["trace", "write", "--tokens", ids, "--serve", serve.url, "--json"])
        assert [json.loads(line)["name"] for line in observed.stdout.splitlines()] == ["write policy", "L3"]
        assert serve.client.stats()["stats"]["requests"] == 0  # observed, not written
        refused = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--flush", "--json"])
        assert refused.exit_code == 2 and "--allow-writes" in json.loads(refused.stdout)["error"]["message"]
        write = hicache(["trace", "write", "--tokens", ids, "--serve", serve.url, "--allow-writes", "--json"])
        assert write.exit_code == 0, write.stdout
        local = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--json"])
        assert json.loads(local.stdout.splitlines()[0])["status"] == "INFO"  # served from L1
        read = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--flush", "--allow-writes", "--json"])
        assert read.exit_code == 0, read.stdout
        assert [json.loads(line)["name"] for line in read.stdout.splitlines()] == READ_STEPS
    finally:
        serve.stop()


def test_read_only_trace_changes_nothing(tmp_path):
    serve = Serve(tmp_path, "--device-tokens", "1024", "--prefetch-threshold", "64")
    try:
        never_written = ",".join(str(t + 7) for t in TOKENS)
        before = serve.client.stats()
        runs = [hicache(["trace", "read", "--tokens", never_written, "--serve", serve.url, "--json"]) for _ in range(2)]
        after = serve.client.stats()
        steps = [[(s["name"], s["status"]) for s in map(json.loads, r.stdout.splitlines())] for r in runs]
        assert steps[0] == steps[1] and steps[0][-1] == ("batch_exists", "FAIL"), steps  # the same diagnosis twice
        assert after["stats"] == before["stats"] and after["occupancy"] == before["occupancy"]

        ids = ",".join(map(str, TOKENS))
        assert (
            hicache(["trace", "write", "--tokens", ids, "--serve", serve.url, "--allow-writes", "--json"]).exit_code
            == 0
        )
        serve.client.flush()
        before = serve.client.stats()
        run = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--json"])
        names = [json.loads(line)["name"] for line in run.stdout.splitlines()]
        assert run.exit_code == 0 and names == [
            "local match",
            "prefetch decision",
            "batch_exists",
            "batch_get_into",
            "stop policy",
            "verdict",
        ]
        after = serve.client.stats()
        assert after["occupancy"] == before["occupancy"]  # the scratch pages were given back, nothing joined the tree
    finally:
        serve.stop()


def test_unreachable_serve_exits_3():
    result = hicache(["trace", "read", "--tokens", "1,2,3", "--serve", "http://127.0.0.1:1", "--json"])
    assert result.exit_code == 3


@pytest.mark.parametrize(
    "spec",
    [
        EngineSpec(
            geometry=preset("tiny-mla"),
            page_size=16,
            device_tokens=1024,
            prefetch_threshold=64,
            tp_size=2,
            stop_policy="wait_complete",
        ),
        EngineSpec(
            geometry=ModelGeometry.mha(2, 4, 16),
            page_size=16,
            device_tokens=512,
            prefetch_threshold=64,
            tp_size=2,
            layout="page_head",
            tp_lcm_size=4,
            stop_policy="wait_complete",
        ),
    ],
    ids=["mla-tp2", "page-head-split-heads"],
)
def test_cross_instance_read_for_mla_and_split_heads(spec):
    run = run_embedded("read", TOKENS, spec)
    assert all(s.status == "PASS" for s in run.steps), [(s.name, s.summary) for s in run.steps]
    assert run.steps[-1].detail["storage_hit"] == 192


def test_write_back_no_eviction_names_write_back_first_and_says_nothing_was_written():
    seen = []
    run = run_embedded("read", TOKENS, SPEC, inject="write-back-no-eviction", on_step=seen.append)
    assert "stored no page in L3" in seen[0].summary and "write_back" in seen[0].summary
    assert run.failed_step.causes[0].startswith("the writer (--hicache-write-policy write_back) stored no page")
    seen.clear()
    run_embedded("read", TOKENS, SPEC, on_step=seen.append)
    assert seen[0].summary.startswith(f"the writer stored {len(TOKENS) // SPEC.page_size} of")


def test_write_back_no_eviction_as_pasted_names_write_back_where_the_path_stops():
    """`trace read --inject write-back-no-eviction` as a real process: exit 1, line 1 is where the
    read path stops, and the cause under the failed step names write_back (not the prefetch)."""
    tokens = ",".join(map(str, range(640)))  # above the default prefetch threshold
    proc = subprocess.run(
        [sys.executable, "-m", "hicache_ops.cli", "trace", "read", "--tokens", tokens]
        + ["--inject", "write-back-no-eviction"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "The read path stops at step 3 (batch_exists).", lines[0]
    failed = " ".join(proc.stdout.split("batch_exists  FAIL", 1)[1].split())
    assert "the writer (--hicache-write-policy write_back) stored no page in L3" in failed, failed
    assert "Traceback" not in proc.stderr
