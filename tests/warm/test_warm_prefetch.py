"""`hicache warm` and `hicache prefetch` against real serve processes and a real Mooncake master."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.warm import warm_serve
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.server.client import ServeClient
from hicache_ops.tokens import read_prompts
from serve_process import Serve

# wait_complete: storage-hit assertions must not depend on how fast L3 reads are on a busy machine.
SERVE_ARGS = (
    "--device-tokens",
    "2048",
    "--page-size",
    "16",
    "--prefetch-threshold",
    "32",
    "--hicache-storage-prefetch-policy",
    "wait_complete",
)


def write_prompts(path, n: int, seed: int, length: int = 100) -> str:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"input_ids": rng.integers(0, 60_000, size=length).tolist()}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    s = Serve(tmp_path_factory.mktemp("warm-serve"), *SERVE_ARGS)
    yield s
    s.stop()


def warm_json(*args) -> tuple[int, dict]:
    result = hicache(["warm", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_warm_then_inspect_keys_finds_every_page_and_rerun_skips(serve, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 5, seed=1)
    code, data = warm_json(prompts, "--serve", serve.url)
    assert code == 0, data
    assert data["summary"]["written"] == 5 and data["complete"]
    metrics = serve.info["master_metrics_address"]
    for line in range(1, 6):
        result = hicache(
            [
                "inspect",
                "keys",
                "--tokens-file",
                prompts,
                "--line",
                str(line),
                "--page-size",
                "16",
                "--model-name",
                "hicache/tiny",
                "--sglang-version",
                serve.info["sglang_version"],
                "--master",
                metrics,
                "--json",
            ]
        )
        assert result.exit_code == 0, result.stdout
        assert json.loads(result.stdout)["contiguous_pages"] == 6
    code, again = warm_json(prompts, "--serve", serve.url)
    assert code == 0 and again["summary"]["present"] == 5 and again["summary"]["written"] == 0


def test_dry_run_writes_nothing_and_short_prompts_produce_no_page(serve, tmp_path):
    prompts = write_prompts(tmp_path / "dry.jsonl", 2, seed=2)
    with open(prompts, "a") as f:
        f.write(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    code, data = warm_json(prompts, "--serve", serve.url, "--dry-run")
    assert code == 0
    statuses = [p["status"] for p in data["prompts"]]
    assert statuses == ["pending", "pending", "no_page"]
    assert "produces no page" in data["prompts"][2]["reason"]
    with ServeClient(serve.url) as client:
        before = client.stats()["stats"]["requests"]
    code, data = warm_json(prompts, "--serve", serve.url, "--dry-run")
    with ServeClient(serve.url) as client:
        assert client.stats()["stats"]["requests"] == before


def test_prefetch_figures_agree_with_serve_stats(serve, tmp_path):
    prompts = write_prompts(tmp_path / "pf.jsonl", 3, seed=3, length=160)
    assert warm_json(prompts, "--serve", serve.url)[0] == 0
    with ServeClient(serve.url) as client:
        client.flush()
        before = client.stats()["stats"]
    result = hicache(["prefetch", prompts, "--serve", serve.url, "--json"])
    assert result.exit_code == 0, result.stdout
    rows = json.loads(result.stdout)["prompts"]
    with ServeClient(serve.url) as client:
        after = client.stats()["stats"]
    # 10 pages per prompt; SGLang prefetches up to input length - 1 (docs/controller.md#match-cap): 9.
    assert all(r["fetched_pages"] == 9 and r["verified"] for r in rows)
    assert after["storage_hit"] - before["storage_hit"] == sum(r["fetched_pages"] * 16 for r in rows)
    assert after["bytes_l3_read"] - before["bytes_l3_read"] == sum(r["bytes"] for r in rows)
    assert set(rows[0]["policies"]) == {"best_effort", "wait_complete", "timeout"}
    assert rows[0]["policies"]["wait_complete"]["deadline_s"] is None
    # Now the pages are local: a second prefetch fetches nothing.
    result = hicache(["prefetch", prompts, "--serve", serve.url, "--json"])
    assert all(r["local_tokens"] == 144 and r["fetched_pages"] == 0 for r in json.loads(result.stdout)["prompts"])


def test_warm_interrupted_by_killing_the_master_reports_and_a_rerun_completes(tmp_path):
    prompts = read_prompts(write_prompts(tmp_path / "kill.jsonl", 6, seed=4))
    first = Serve(tmp_path / "a", *SERVE_ARGS)
    try:
        master_pid = first.info["master_pid"]
        done = []

        def kill_after_two(outcome):
            done.append(outcome)
            if len(done) == 2:
                os.kill(master_pid, signal.SIGKILL)

        with ServeClient(first.url) as client:
            started = time.monotonic()
            report = warm_serve(prompts, client, concurrency=1, on_progress=kill_after_two)
        assert time.monotonic() - started < 60  # no hang on a dead master
        assert report.error is not None and ("master" in report.error.lower() or "mooncake" in report.error.lower())
        assert report.count("written") == 2
        assert report.count("pending") + report.count("failed") == 4
    finally:
        first.stop()
    # A fresh serve (a restarted master has lost every key): the rerun writes everything.
    second = Serve(tmp_path / "b", *SERVE_ARGS)
    try:
        with ServeClient(second.url) as client:
            report = warm_serve(prompts, client, concurrency=2)
        assert report.complete and report.count("written") == 6
    finally:
        second.stop()


def test_migrate_prefix_copies_verifies_and_removes_old(serve, tmp_path):
    from hicache_ops.mooncake.store_client import StoreClient

    rpc, metrics = serve.info["master_rpc_address"], serve.info["master_metrics_address"]
    prompts = write_prompts(tmp_path / "mig.jsonl", 1, seed=5, length=48)
    assert warm_json(prompts, "--serve", serve.url)[0] == 0
    with AdminClient(metrics) as admin:
        old = [k for k in admin.get_all_keys() if k.startswith("hicache-tiny_")]
    with StoreClient.connect(rpc) as store:
        original = {k: store.get(k) for k in old}
    result = hicache(
        ["warm", "--migrate-prefix", "hicache-tiny_", "renamed_", "--master", metrics, "--master-rpc", rpc, "--json"]
    )
    assert result.exit_code == 0, result.stdout
    data = json.loads(result.stdout)
    assert data["copied"] == len(old) and data["verified"] == len(old) and data["removed"] == 0
    with StoreClient.connect(rpc) as store:
        for key, value in original.items():
            assert store.get("renamed_" + key[len("hicache-tiny_") :]) == value  # byte for byte
    # Resumable: the second run finds the copies in place; --remove-old then drops the originals.
    result = hicache(
        [
            "warm",
            "--migrate-prefix",
            "hicache-tiny_",
            "renamed_",
            "--master",
            metrics,
            "--master-rpc",
            rpc,
            "--remove-old",
            "--json",
        ]
    )
    data = json.loads(result.stdout)
    assert data["already_there"] == len(old) and data["removed"] == len(old)
    with AdminClient(metrics) as admin:
        assert not any(k.startswith("hicache-tiny_") for k in admin.get_all_keys())


@pytest.mark.parametrize(
    "args, code, fragment",
    [
        (["--serve", "http://127.0.0.1:1"], 3, "no hicache serve answers"),
        (["--concurrency", "0"], 2, "--concurrency"),
        (["--remove-old"], 2, "--remove-old"),
        (["--sglang-url", "http://127.0.0.1:1"], 2, "--master"),
    ],
)
def test_bad_input_and_unreachable(tmp_path, args, code, fragment):
    prompts = write_prompts(tmp_path / "x.jsonl", 1, seed=6)
    started = time.monotonic()
    result = hicache(["warm", prompts, *args, "--json"])
    assert result.exit_code == code, result.stdout
    assert fragment in json.loads(result.stdout)["error"]["message"]
    assert time.monotonic() - started < 5


def test_malformed_jsonl_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2]}\n{"input_ids": [1,\n')
    for cmd in (["warm", str(bad)], ["prefetch", str(bad)]):
        result = hicache([*cmd, "--json"])
        assert result.exit_code == 2
        assert "bad.jsonl:2" in json.loads(result.stdout)["error"]["message"]


def test_existing_cluster_needs_synthetic(serve, tmp_path):
    rpc, metrics = serve.info["master_rpc_address"], serve.info["master_metrics_address"]
    other = Serve(tmp_path, *SERVE_ARGS, "--l3", f"mooncake://{rpc}?metrics={metrics.split(':')[1]}")
    try:
        prompts = write_prompts(tmp_path / "syn.jsonl", 1, seed=7)
        code, data = warm_json(prompts, "--serve", other.url)
        assert code == 2 and "--synthetic" in data["error"]["hint"]
        code, data = warm_json(prompts, "--serve", other.url, "--synthetic")
        assert code == 0 and data["summary"]["written"] == 1
    finally:
        other.stop()


def test_prefetch_cut_to_zero_is_not_verified(tmp_path):
    slow = Serve(
        tmp_path,
        "--device-tokens",
        "2048",
        "--page-size",
        "16",
        "--prefetch-threshold",
        "32",
        "--hicache-storage-prefetch-policy",
        "best_effort",
        "--inject-l3-latency-ms",
        "500",
    )
    try:
        prompts = write_prompts(tmp_path / "cut.jsonl", 1, seed=8, length=160)
        assert warm_json(prompts, "--serve", slow.url)[0] == 0
        slow.client.flush()
        result = hicache(["prefetch", prompts, "--serve", slow.url, "--json"])
        row = json.loads(result.stdout)["prompts"][0]
        # 10 pages in L3; the prefetch span ends at input length - 1 tokens, 9 whole pages
        # (docs/controller.md#match-cap).
        assert row["hit_pages"] == 9 and row["fetched_pages"] == 0
        assert row["bytes"] == 0 and not row["verified"] and "cut to zero" in row["reason"]
        assert result.exit_code == 1
    finally:
        slow.stop()


def test_warm_summary_names_statuses_as_the_table_and_never_ends_a_line_on_a_separator(serve, tmp_path):
    """The real process at 60 columns: the summary line after the verdict counts the statuses the
    table shows, with the table's words, and no wrapped line ends on `;` or `,`."""
    import subprocess

    from serve_process import HICACHE

    prompts = write_prompts(tmp_path / "mixed.jsonl", 2, seed=7)
    with open(prompts, "a") as f:
        f.write(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    env = {**os.environ, "COLUMNS": "60"}
    for expected in ("written 2", "already present 2"):
        proc = subprocess.run(
            [HICACHE, "warm", prompts, "--serve", serve.url], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == f"warm {serve.url}" and lines[1].startswith("complete:"), proc.stdout
        summary = " ".join(line.strip() for line in lines[2 : next(i for i, x in enumerate(lines) if "┏" in x)])
        assert summary.startswith("prompts: ") and expected in summary and "no page 1" in summary, summary
        assert summary.endswith("bytes written)" if expected == "written 2" else " pages)"), summary
        assert not any(line.rstrip().endswith((";", ",")) for line in lines), proc.stdout
        table = proc.stdout.split("┏", 1)[1]
        assert expected.rsplit(" ", 1)[0] in table and "no page" in table, table


def test_dry_run_summary_and_table_say_would_write(serve, tmp_path):
    import subprocess

    from serve_process import HICACHE

    prompts = write_prompts(tmp_path / "dry-words.jsonl", 1, seed=8)
    proc = subprocess.run(
        [HICACHE, "warm", prompts, "--serve", serve.url, "--dry-run"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "prompts: would write 1 (6 pages)" in proc.stdout
    assert "not reached" not in proc.stdout and "would write" in proc.stdout.split("┏", 1)[1]


def _on_a_terminal(argv: list[str]) -> tuple[int, str, str]:
    """Run `hicache ARGV` with stderr on a pseudo-terminal (as a user at a shell), stdout on a pipe."""
    import pty
    import subprocess

    from serve_process import HICACHE

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [HICACHE, *argv], stdout=subprocess.PIPE, stderr=slave, text=True, env={**os.environ, "COLUMNS": "120"}
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read()
    code = proc.wait(timeout=120)
    os.close(master)
    return code, out, seen.decode(errors="replace")


def test_warm_and_prefetch_show_progress_with_an_eta_on_a_terminal(serve, tmp_path):
    prompts = write_prompts(tmp_path / "bar.jsonl", 6, seed=11)
    for command, head in (("warm", f"warm {serve.url}"), ("prefetch", f"prefetch through {serve.url}")):
        code, out, terminal = _on_a_terminal([command, prompts, "--serve", serve.url])
        assert code == 0, out + terminal
        assert out.startswith(head), out  # the report itself stays on stdout, the bar on the terminal only
        assert command in terminal and "eta" in terminal and "/6" in terminal, terminal
