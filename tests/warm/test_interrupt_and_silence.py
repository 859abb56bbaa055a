"""`hicache warm` and `prefetch` stopped by a real SIGINT / SIGTERM, and against a real silent
socket (accepts, never answers): bounded, exit 130 or 3, and nothing reported done that is not."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.inspect.key_listing import expected_keys
from hicache_ops.commands.warm import deployment_of_serve
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.tokens import read_prompts
from serve_process import HICACHE

SERVE_ARGS = ("--device-tokens", "2048", "--page-size", "16", "--prefetch-threshold", "32")


def write_prompts(path, n: int, seed: int, length: int = 100) -> str:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": rng.integers(0, 60_000, size=length).tolist()}) + "\n")
    return str(path)


TIMEOUT = 2.0
SLACK = 5.0  # loose upper bound over --timeout for a loaded 2-core machine, not a performance figure


@pytest.fixture(scope="module")
def serve(shared_serve):
    # The session's serve for these arguments (tests/cli/test_width.py and
    # tests/warm/test_interrupt_and_silence.py share it): each test's prompts have seeds of its own.
    return shared_serve(*SERVE_ARGS)


def requests_served(serve) -> int:
    return serve.client.stats()["stats"]["requests"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_warm_with_an_honest_summary_and_a_rerun_resumes(serve, tmp_path, sig):
    path = write_prompts(tmp_path / "many.jsonl", 1500, seed=11 + sig, length=48)
    before = requests_served(serve)
    out = tmp_path / "warm.json"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [HICACHE, "warm", path, "--serve", serve.url, "--json", "--timeout", str(TIMEOUT)],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
    deadline = time.monotonic() + 60
    while requests_served(serve) - before < 20 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, "warm finished before it could be interrupted"
    proc.send_signal(sig)
    sent = time.monotonic()
    code = proc.wait(timeout=60)
    assert time.monotonic() - sent < TIMEOUT + SLACK
    assert code == 130, proc.stderr.read()
    data = json.loads(out.read_text())
    assert data["interrupted"] == sig.name and not data["complete"]
    summary = data["summary"]
    assert summary["written"] > 0 and summary["pending"] > 0
    assert (
        summary["written"] + summary["present"] + summary["pending"] + summary["failed"] + summary["not_landed"] == 1500
    )

    # Every prompt reported written is in L3, object by object.
    deployment = deployment_of_serve(serve.info)
    prompts = read_prompts(path)
    written = [p["index"] for p in data["prompts"] if p["status"] == "written"]
    keys = [k for i in written for k in expected_keys(prompts[i].input_ids, 16, deployment).object_keys]
    with AdminClient(serve.info["master_metrics_address"]) as admin:
        assert all(admin.exists(keys))

    # A rerun resumes: what was written is skipped.
    result = hicache(["warm", path, "--serve", serve.url, "--dry-run", "--json"])
    again = json.loads(result.stdout)
    assert result.exit_code == 0
    assert again["summary"]["present"] >= len(written)
    assert again["summary"]["present"] + again["summary"]["pending"] == 1500


def test_sigint_stops_prefetch(serve, tmp_path):
    path = write_prompts(tmp_path / "pf.jsonl", 3000, seed=21, length=48)
    head = tmp_path / "head.jsonl"
    head.write_text("".join(open(path).readlines()[:20]))
    assert hicache(["warm", str(head), "--serve", serve.url, "--json"]).exit_code == 0
    serve.client.flush()
    before = serve.client.stats()["stats"]["storage_hit"]
    out = tmp_path / "pf.json"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [HICACHE, "prefetch", path, "--serve", serve.url, "--json"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
    deadline = time.monotonic() + 60
    while (
        serve.client.stats()["stats"]["storage_hit"] == before and time.monotonic() < deadline and proc.poll() is None
    ):
        time.sleep(0.05)
    assert proc.poll() is None, "prefetch finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    code = proc.wait(timeout=60)
    assert time.monotonic() - sent < 3.0 + SLACK
    assert code == 130, proc.stderr.read()
    data = json.loads(out.read_text())
    assert data["interrupted"] == "SIGINT" and 0 < len(data["prompts"]) < 3000


@pytest.mark.parametrize(
    "command",
    [
        ["warm", "{prompts}", "--serve", "http://{silent}"],
        ["warm", "{prompts}", "--sglang-url", "http://{silent}", "--master", "127.0.0.1:1"],
        ["prefetch", "{prompts}", "--serve", "http://{silent}"],
        ["trace", "read", "--tokens", "1,2,3", "--serve", "http://{silent}"],
        ["trace", "write", "--tokens", "1,2,3", "--serve", "http://{silent}"],
        ["playbook", "run", "short-storage-hit", "--serve", "http://{silent}", "--prompt", "{prompts}"],
    ],
    ids=["warm-serve", "warm-sglang", "prefetch", "trace-read", "trace-write", "playbook"],
)
def test_silent_server_is_exit_3_within_timeout(silent_server, tmp_path, command):
    prompts = write_prompts(tmp_path / "one.jsonl", 1, seed=31)
    args = [a.format(prompts=prompts, silent=silent_server) for a in command]
    started = time.monotonic()
    result = hicache([*args, "--timeout", str(TIMEOUT), "--json"])
    assert time.monotonic() - started < TIMEOUT + SLACK
    assert result.exit_code == 3, result.stdout
    assert silent_server in json.loads(result.stdout)["error"]["message"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--serve", "http://127.0.0.1:notaport"], "--serve"),
        (["--timeout", "-1"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--page-size", "0"], "--page-size"),
        (["--serve", "http://127.0.0.1:1", "--sglang-url", "http://127.0.0.1:2"], "two targets"),
        (["--master", "127.0.0.1:9003"], "--master"),
    ],
)
def test_flags_that_cannot_apply_are_exit_2(tmp_path, args, fragment):
    prompts = write_prompts(tmp_path / "x.jsonl", 1, seed=41)
    result = hicache(["warm", prompts, *args, "--json"])
    assert result.exit_code == 2, result.stdout
    assert fragment in json.loads(result.stdout)["error"]["message"]


def test_interrupted_prefetch_never_claims_every_page_verified(serve, tmp_path):
    path = write_prompts(tmp_path / "pf2.jsonl", 3000, seed=22, length=48)
    head = tmp_path / "head2.jsonl"
    head.write_text("".join(open(path).readlines()[:20]))
    assert hicache(["warm", str(head), "--serve", serve.url, "--json"]).exit_code == 0
    serve.client.flush()
    before = serve.client.stats()["stats"]["storage_hit"]
    out = tmp_path / "pf2.txt"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            [HICACHE, "prefetch", path, "--serve", serve.url], stdout=stdout, stderr=subprocess.PIPE, text=True
        )
    deadline = time.monotonic() + 60  # hang guard
    while (
        serve.client.stats()["stats"]["storage_hit"] == before and time.monotonic() < deadline and proc.poll() is None
    ):
        time.sleep(0.05)
    assert proc.poll() is None, "prefetch finished before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130, proc.stderr.read()
    text = out.read_text()
    verdict = " ".join(text.split("\n", 1)[1].split())  # the verdict follows the one header line
    assert verdict.startswith("interrupted (SIGTERM):") and "the rest were not reached" in verdict, text
    assert "verified: every page" not in text
