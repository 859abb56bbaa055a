"""`hicache watch` against SGLang's own collectors (0.5.14, 0.5.23) on loopback and a real master.

Each test drives known counts between two scrapes and checks watch's window figures equal them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import hicache
from hicache_ops.commands.watch import Sampler, report
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.results import json_data
from sglang_collectors import held_collectors

STEP = {
    "requests": [[100, 20, 10, 30], [60, 0, 0, 12]],
    "ranks": [{"fetched": 42, "to_l3": 9, "issued": 50, "bandwidth": 4.0}] * 2,
    "load_back": 7,
    "evicted": 5,
    "host_pool": [30, 100],
}


@pytest.fixture(scope="module", params=["0.5.23", "0.5.14"])
def served(request):
    with held_collectors(request.param, tp_size=2) as s:
        yield s


@pytest.fixture(scope="module")
def served_new():
    with held_collectors("0.5.23", tp_size=2) as s:
        yield s


def window(served, step, master=None, *, before=None, between=None):
    """Scrape, drive `step`, scrape again: the report of that window."""
    if before:
        served.drive(**before)
    sampler = Sampler([served.url], master, window=3600, timeout=10)
    sampler.scrape(strict=True)
    served.drive(**step)
    if between:
        between()
    sampler.scrape(strict=True)
    return json_data(report(sampler))


def kinds(rep) -> set[str]:
    return {v["kind"] for v in rep["verdicts"]}


def test_rates_equal_the_driven_counts(served):
    rep = window(served, STEP)
    inst = rep["instances"][0]
    assert inst["meanings"] == served.version and inst["meanings_from"].startswith("/server_info")
    t = inst["tokens"]
    assert t["basis"] == "window"
    assert t["prompt"]["delta"] == 160
    assert (t["device"]["delta"], t["host"]["delta"], t["storage"]["delta"]) == (20, 10, 42)
    assert t["storage"]["share"] == pytest.approx(42 / 160)
    assert t["prompt"]["rate"] == pytest.approx(160 / inst["seconds"])
    assert inst["prefetch"]["fetched"]["delta"] == 42
    assert inst["backup"]["to_l3"]["delta"] == 9
    # Both ranks count the same logical 7 tokens; 0.5.14 sums them, watch divides by tp_size.
    assert inst["load_back"]["delta"] == 7
    assert inst["evicted"]["delta"] == 5
    assert inst["host_pool"]["ratio"] == pytest.approx(0.3)
    assert [r["fetched"]["delta"] for r in inst["ranks"]] == [42, 42]
    if served.version == "0.5.23":
        assert inst["prefetch"]["issued"]["delta"] == 50
    else:
        assert inst["prefetch"]["issued"] is None  # no such counter before 0.5.23
    assert inst["prefetch"]["bandwidth_gb_s"] == pytest.approx(4.0)
    assert "sglang:prompt_tokens_total" not in inst["not_exported"]
    assert kinds(rep) == set()


def test_0_5_14_without_server_info_infers_the_release_and_shows_l2_summed():
    with held_collectors("0.5.14", tp_size=2, server_info=False) as s:
        inst = window(s, STEP)["instances"][0]
    assert inst["meanings"] == "0.5.14" and inst["meanings_from"].startswith("inferred")
    assert "tp_size unknown" in inst["l2_counters"]
    assert inst["load_back"]["delta"] == 14  # two ranks' 7 each, on one series


def test_storage_hit_zero_while_prefetches_are_issued(served):
    step = {"requests": [[100, 40, 0, 0]], "ranks": [{"fetched": 32, "issued": 32}] * 2}
    rep = window(served, step)
    (v,) = [v for v in rep["verdicts"] if v["kind"] == "storage_hit_zero"]
    assert v["next"] == "hicache playbook run short-storage-hit"
    assert rep["verdicts"][0]["severity"] == "critical"


@pytest.mark.parametrize(("reason", "playbook"), [("deadline", "no-l3-hit"), ("anchor_lost", "recomputed-after-get")])
def test_prefetch_unfulfilled_names_the_reason(served_new, reason, playbook):
    step = {"requests": [[100, 0, 0, 60]], "ranks": [{"fetched": 60, "issued": 100, "unfulfilled": {reason: 40}}] * 2}
    rep = window(served_new, step)
    (v,) = [v for v in rep["verdicts"] if v["kind"] == "prefetch_unfulfilled"]
    assert reason in v["message"] and v["next"] == f"hicache playbook run {playbook}"


def test_unfulfilled_below_the_share_is_no_verdict(served_new):
    step = {
        "requests": [[100, 0, 0, 90]],
        "ranks": [{"fetched": 90, "issued": 100, "unfulfilled": {"deadline": 10}}] * 2,
    }
    assert "prefetch_unfulfilled" not in kinds(window(served_new, step))


def test_backup_dropped(served_new):
    step = {"ranks": [{"to_l3": 10, "dropped": 10}] * 2}
    rep = window(served_new, step)
    (v,) = [v for v in rep["verdicts"] if v["kind"] == "backup_dropped"]
    assert "50%" in v["message"]


def test_host_pool_full(served):
    rep = window(served, {"host_pool": [97, 100]})
    (v,) = [v for v in rep["verdicts"] if v["kind"] == "host_pool_full"]
    assert v["next"].startswith("hicache inspect layout --sglang-url")


def test_rank_lagging(served):
    rep = window(served, {"ranks": [{"fetched": 100}, {"fetched": 10}]})
    lagging = [v for v in rep["verdicts"] if v["kind"] == "rank_lagging"]
    assert [v["where"].split()[-1] for v in lagging] == ["tp_rank=1,pp_rank=0,dp_rank=0,attn_cp_rank=0"]


def test_master_figures_under_load(served_new, fresh_mooncake_master):
    master = fresh_mooncake_master
    with StoreClient.connect(master.rpc_address, segment_size=32 << 20) as client:

        def load():
            for i in range(6):
                client.put(f"watch-{i}", b"x" * 4096)
            client.put("watch-0", b"x" * 4096)  # an existing key: the master refuses the PutStart
            for i in range(3):
                client.get(f"watch-{i}")

        rep = window(served_new, {"ranks": [{"to_l3": 7}] * 2}, master.metrics_address, between=load)
    m = rep["master"]
    assert m["keys"] == 6 and m["used_bytes"] == 6 * 4096 and m["capacity_bytes"] == 32 << 20
    assert m["puts"]["delta"] == 7 and m["put_failures"]["delta"] == 1
    assert m["gets"]["delta"] == 3
    assert "put_failures" in kinds(rep)
    assert "puts_not_reaching_master" not in kinds(rep)  # the master saw puts while SGLang backed up


def test_puts_not_reaching_master(served_new, fresh_mooncake_master):
    rep = window(served_new, {"ranks": [{"to_l3": 64}] * 2}, fresh_mooncake_master.metrics_address)
    (v,) = [v for v in rep["verdicts"] if v["kind"] == "puts_not_reaching_master"]
    assert "version skew" in v["message"] and v["next"].startswith("hicache inspect store --master 127.0.0.1:")


def test_master_full(served_new, fresh_mooncake_master):
    master = fresh_mooncake_master
    with StoreClient.connect(master.rpc_address, segment_size=32 << 20) as client:

        def fill():
            for i in range(40):
                try:
                    client.put(f"fill-{i}", b"y" * (1 << 20), retries=0)
                except Exception:
                    break

        rep = window(served_new, {}, master.metrics_address, between=fill)
    assert "master_full" in kinds(rep)


def test_cli_once_json_two_instances_and_master(served_new, mooncake_master):
    with held_collectors("0.5.14", tp_size=1) as old:
        served_new.drive(requests=[[10, 10, 0, 0]])
        old.drive(requests=[[10, 0, 0, 10]])
        result = hicache(
            [
                "watch",
                "--sglang-url",
                served_new.url,
                "--sglang-url",
                old.url,
                "--master",
                mooncake_master.metrics_address,
                "--once",
                "--interval",
                "0.2",
                "--json",
            ]
        )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [i["meanings"] for i in data["instances"]] == ["0.5.23", "0.5.14"]
    assert data["master"]["capacity_bytes"] >= 0
    # --once scrapes twice; nothing was driven between, so the shares fall back to the totals.
    assert data["instances"][1]["tokens"]["storage"]["total"] >= 10


def test_cli_human_view_leads_with_verdicts(served_new):
    result = hicache(["watch", "--sglang-url", served_new.url, "--once", "--interval", "0.1"])
    assert result.exit_code == 0, result.output
    assert "metric meanings applied: SGLang 0.5.23 (/server_info version 0.5.23)" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--sglang-url", "http://127.0.0.1:9"], 3, "nothing answers at http://127.0.0.1:9"),
        (["--sglang-url", "127.0.0.1:9"], 2, "must start with http://"),
        (["--sglang-url", "http://127.0.0.1:9", "--interval", "0"], 2, "--interval 0 must be positive"),
        (["--sglang-url", "http://127.0.0.1:9", "--sglang-version", "0.4.0"], 2, "older than 0.5.14"),
    ],
)
def test_cli_bad_input_and_unreachable(args, code, fragment):
    result = hicache(["watch", *args, "--once", "--json"])
    assert result.exit_code == code, result.output
    error = json.loads(result.stdout)["error"]
    assert fragment in error["message"] and error["message"].count(". ") == 0


def test_ctrl_c_stops_the_live_view_with_a_summary(served_new):
    """The console script in live --json mode: SIGINT after its first report ends it, exit 0, with a summary."""
    import os
    import signal
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    argv = [sys.executable, "-m", "hicache_ops.cli", "watch", "--sglang-url", served_new.url, "--interval", "0.2"]
    proc = subprocess.Popen([*argv, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = ""
        while '"rounds": 2' not in seen:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            seen += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, err
    assert '"stopped": "SIGINT"' in out, out[-500:]
