"""`hicache bench multiturn`: the published run's mechanism at the published scale, the JSON shape, the two
modes agreeing, and bad input. The published-scale run happens once (module fixture)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.bench.multiturn import run_multiturn
from hicache_ops.commands.bench.multiturn_config_run import run_config
from hicache_ops.commands.bench.multiturn_workload import CONFIGS, MultiturnSpec


def invoke(*args: str):
    return hicache(["bench", "multiturn", *args])


def first_round_over(spec_pages: int, clients: int, turn: int, page: int, rounds: int) -> int | None:
    """The first round whose clients' histories (prompt + answer but its last token, whole pages)
    exceed a pool."""
    for r in range(rounds):
        if clients * (((r + 1) * turn - 1) // page) > spec_pages:
            return r
    return None


# ---------------------------------------------------------------------------------------------
# The published scale: 48 clients x 60 rounds x (4,096 + 16) tokens, accounting only
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published() -> dict:
    result = invoke("--accounting-only", "--json", "--quiet")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_published_pools_follow_sglang_rules(published):
    pools = published["pools"]
    device = 48 * 18 * 4112 // 64  # 18 rounds of every client's history, in 64-token pages
    assert pools["device_pages"] == device == 55512
    assert pools["host_pages"] == int(device * 64 * 2.0) // 64 + 1  # ratio 2, plus one page
    assert pools["write_policy"] == "write_through"


def test_published_ceiling_is_the_h_max_of_docs_workloads(published):
    for entry in published["rounds"]:
        r = entry["round"]
        assert entry["ceiling"] == pytest.approx(4112 * r / (4096 * (r + 1) + 16 * r), abs=1e-12)
    by_round = {e["round"]: e["ceiling"] for e in published["rounds"]}
    # The published run: "at round 5 that is 83.3%, at round 10 it is 90.9%, at round 55 it is 98.2%".
    assert by_round[5] == pytest.approx(0.833, abs=1e-3) and by_round[10] == pytest.approx(0.909, abs=1e-3)
    assert by_round[55] == pytest.approx(0.982, abs=1e-3)
    assert published["prompt_tokens"] == 361_152_000  # the published run's total


def test_published_cliffs_where_the_pools_put_them(published):
    pools, rounds = published["pools"], published["rounds"]
    l1_cliff = first_round_over(pools["device_pages"], 48, 4112, 64, 60)
    l2_cliff = first_round_over(pools["host_pages"], 48, 4112, 64, 60)
    assert (l1_cliff, l2_cliff) == (18, 36)  # the published run: L1+L2 falls at twice the L1 round
    cliffs = published["cliffs"]
    assert cliffs["l1"] == {"predicted": l1_cliff, "leaves_ceiling": l1_cliff, "zero_from": l1_cliff + 1}
    assert cliffs["l1_l2"] == {"predicted": l2_cliff, "leaves_ceiling": l2_cliff, "zero_from": l2_cliff + 1}
    assert cliffs["l1_l2_l3"] == {"predicted": None, "leaves_ceiling": None, "zero_from": None}

    for entry in rounds:
        r, paged = entry["round"], entry["ceiling_paged"]
        # On the ceiling (whole pages of the history) until the cliff; L3 to the end.
        assert entry["l1_l2_l3"] == pytest.approx(paged, abs=1e-12)
        if r < l1_cliff:
            assert entry["l1"] == pytest.approx(paged, abs=1e-12)
        if r < l2_cliff:
            assert entry["l1_l2"] == pytest.approx(paged, abs=1e-12)
        # A cliff, not a slope: partial in the cliff round, nothing after it.
        if r == l1_cliff:
            assert 0 < entry["l1"] < paged
        if r > l1_cliff:
            assert entry["l1"] == 0
        if r == l2_cliff:
            assert 0 < entry["l1_l2"] < paged
        if r > l2_cliff:
            assert entry["l1_l2"] == 0


def test_published_prefilled_tokens(published):
    prefilled = published["prefilled_tokens"]
    # L3 keeps everything: it prefills exactly what no cache can avoid (the new questions, plus
    # the history's trailing partial page).
    assert prefilled["l1_l2_l3"] == prefilled["ceiling"]
    assert prefilled["l1"] > prefilled["l1_l2"] > prefilled["l1_l2_l3"]
    # The published run measured 330.3M and 11.9M with its simulation, 27.8x.
    assert prefilled["l1"] / 1e6 == pytest.approx(330.3, abs=0.1)
    assert prefilled["l1_l2_l3"] / 1e6 == pytest.approx(11.9, abs=0.1)
    assert prefilled["l1"] / prefilled["l1_l2_l3"] == pytest.approx(27.8, abs=0.1)
    for entry in published["rounds"]:
        for name in CONFIGS:
            assert entry["prefilled_tokens"][name] == round(entry["prompt_tokens"] * (1 - entry[name]))


# ---------------------------------------------------------------------------------------------
# Small runs
# ---------------------------------------------------------------------------------------------

SMALL = [
    "--clients",
    "4",
    "--rounds",
    "6",
    "--new-tokens",
    "256",
    "--output-tokens",
    "16",
    "--page-size",
    "16",
    "--l1-rounds",
    "2",
    "--accounting-only",
    "--workers",
    "1",
    "--quiet",
]


def test_small_run_json_shape(tmp_path):
    plot = tmp_path / "hit.png"
    result = invoke(*SMALL, "--json", "--plot", str(plot))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"rounds", "prefilled_tokens", "cliffs", "pools", "workload", "configurations", "mode"} <= set(data)
    assert data["mode"] == "accounting"
    assert len(data["rounds"]) == 6
    for i, entry in enumerate(data["rounds"]):
        assert {"round", "ceiling", "l1", "l1_l2", "l1_l2_l3"} <= set(entry)
        assert entry["round"] == i
        assert all(0 <= entry[name] <= entry["ceiling"] for name in CONFIGS)
    assert set(data["prefilled_tokens"]) == {*CONFIGS, "ceiling"}
    assert data["rounds"][0]["ceiling"] == 0 and data["rounds"][0]["l1"] == 0
    assert data["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_small_run_renders_a_table():
    result = invoke(*SMALL)
    assert result.exit_code == 0, result.output
    assert "hit rate by round" in result.stdout and "L1+L2+L3" in result.stdout and "ceiling" in result.stdout


def test_ceiling_for_any_turn_shape():
    # Inkling-Small in the published run: 1,216 new and 64 output tokens, the last of 30 rounds: 96.8%.
    spec = MultiturnSpec(new_tokens=1216, output_tokens=64, rounds=30, clients=64)
    assert spec.ceiling(29) == pytest.approx(37120 / 38336)
    assert round(100 * spec.ceiling(29), 1) == 96.8
    assert spec.ceiling(0) == 0


def test_processes_and_one_process_agree():
    spec = MultiturnSpec(clients=6, rounds=8, new_tokens=128, output_tokens=8, page_size=8, l1_rounds=2.5)
    one = run_multiturn(spec, workers=1).result().model_dump(mode="json")
    three = run_multiturn(spec, workers=3).result().model_dump(mode="json")
    assert one["rounds"] == three["rounds"] and one["prefilled_tokens"] == three["prefilled_tokens"]
    assert three["workers"] == 3


def test_write_back_keeps_l3_on_the_ceiling_and_pools_consistent():
    # write_back used to leak device pages here (a load-back's host pages were evictable while
    # write_back made host room): CapacityError at round 12. Every page leaving L1 is backed up.
    spec = MultiturnSpec(
        clients=8, rounds=20, new_tokens=1024, output_tokens=16, l1_rounds=6, write_policy="write_back"
    )
    result = run_multiturn(spec, workers=1)
    assert result.cliffs()["l1"]["leaves_ceiling"] == 6
    assert result.cliffs()["l1_l2_l3"]["leaves_ceiling"] is None
    for name in ("l1_l2", "l1_l2_l3"):
        occupancy = result.runs[name].occupancy
        assert occupancy["device_pages_used"] == occupancy["pages_on_device"]
        assert occupancy["host_pages_used"] == occupancy["pages_on_host"]


def test_write_through_selective_never_backs_up_what_l1_loses_first():
    # Backup on the second hit, one hit per request (SGLang 0.5.23 does not count a request's own
    # second insert): after the L1 cliff a new turn leaves L1 before its next request, so it never
    # reaches host or L3, and even L1+L2+L3 falls below the ceiling from that round.
    spec = MultiturnSpec(
        clients=8, rounds=12, new_tokens=1024, output_tokens=16, l1_rounds=6, write_policy="write_through_selective"
    )
    result = run_multiturn(spec, workers=1)
    cliffs = result.cliffs()
    assert cliffs["l1"]["leaves_ceiling"] == cliffs["l1_l2_l3"]["leaves_ceiling"] == 6
    assert cliffs["l1_l2"]["predicted"] is None  # predicted for write_through only
    rates = [result.hit_rate("l1_l2_l3", r) for r in range(6, 12)]
    assert rates == sorted(rates, reverse=True) and rates[-1] > 0


def test_real_bytes_and_accounting_make_the_same_decisions():
    pytest.importorskip("torch")
    args = dict(clients=3, rounds=5, new_tokens=64, output_tokens=16, page_size=16, l1_rounds=2)
    accounting = run_multiturn(MultiturnSpec(accounting_only=True, **args), workers=1)
    real = run_multiturn(MultiturnSpec(accounting_only=False, **args))
    assert real.workers == 1
    for name in CONFIGS:
        assert real.runs[name].cached == accounting.runs[name].cached
        assert real.runs[name].stats["mismatched_pages"] == 0
    assert real.result().model_dump(mode="json")["configurations"]["l1_l2_l3"]["bytes"]["host_to_l3"] > 0
    assert real.cliffs() == accounting.cliffs()


def test_workload_histories_differ_and_are_seeded():
    from hicache_ops.commands.bench.multiturn_workload import workload_tokens

    spec = MultiturnSpec(clients=3, rounds=2, new_tokens=32, output_tokens=4, page_size=16)
    a, b = workload_tokens(spec), workload_tokens(spec)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[0, :32], a[1, :32])
    run = run_config(spec, "l1")
    assert run.cached == [0, 3 * 32]  # round 1 hits each client's first turn in whole pages: 36 -> 32


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2 with one sentence
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["--clients", "0"], "--clients"),
        (["--rounds", "-1"], "--rounds"),
        (["--new-tokens", "0"], "--new-tokens"),
        (["--output-tokens", "-1"], "--output-tokens"),
        (["--page-size", "0"], "--page-size"),
        (["--l1-tokens", "100000", "--l1-rounds", "2"], "not both"),
        (["--l1-rounds", "0"], "--l1-rounds"),
        (["--l1-tokens", "64"], "cannot hold"),
        (["--hicache-ratio", "1"], "--hicache-ratio"),
        (["--hicache-write-policy", "write_sometimes"], "'write_sometimes'"),
        (["--seed", "-3"], "--seed"),
        (["--workers", "0"], "--workers"),
        (["--plot", "hit.svg"], ".png"),
        (["--plot", "/nonexistent-folder/hit.png"], "does not exist"),
        (["--sglang-version", "0.4"], "0.4"),
        (["--preset", "nope"], "nope"),
    ],
)
def test_bad_input_exits_2(args, words):
    result = invoke("--accounting-only", "--quiet", *args)
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert "Traceback" not in result.output


def test_bad_input_json_error_shape():
    result = invoke("--accounting-only", "--json", "--clients", "0")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "input_error" and "--clients" in error["message"]


def test_real_bytes_refuses_the_published_scale():
    result = invoke("--quiet")
    assert result.exit_code == 2
    assert "--accounting-only" in result.output


# ---------------------------------------------------------------------------------------------
# A stop request (Ctrl-C): the rounds finished are kept, the totals compare like with like
# ---------------------------------------------------------------------------------------------


def test_a_stop_request_keeps_the_rounds_finished(tmp_path):
    from hicache_ops import interrupt
    from hicache_ops.commands.bench.multiturn_plot import plot_hit_rates

    spec = MultiturnSpec(clients=4, rounds=6, new_tokens=256, output_tokens=16, page_size=16, l1_rounds=2)

    def stop_during_l1_l2(name: str, r: int, rounds: int) -> None:
        if name == "l1_l2" and r == 2:
            interrupt.request("a test")

    with interrupt.stop_on_signals():  # clears the request when the block ends
        stopped = run_multiturn(spec, progress=stop_during_l1_l2, workers=1)
    whole = run_multiturn(spec, workers=1)
    assert stopped.interrupted and not whole.interrupted
    # serial: L1 ran whole, L1+L2 stopped after round 2, L1+L2+L3 never started
    assert {name: run.rounds_done for name, run in stopped.runs.items()} == {"l1": 6, "l1_l2": 3}
    assert stopped.runs["l1"].cached == whole.runs["l1"].cached
    assert stopped.runs["l1_l2"].cached == whole.runs["l1_l2"].cached[:3]
    data, full = stopped.result().model_dump(mode="json"), whole.result().model_dump(mode="json")
    assert data["interrupted"] is True and data["rounds_totalled"] == 3 and len(data["rounds"]) == 6
    assert [entry["l1_l2"] for entry in data["rounds"][3:]] == [None] * 3
    assert [entry["l1"] for entry in data["rounds"]] == [entry["l1"] for entry in full["rounds"]]
    # totals over the three rounds both configurations finished
    assert data["prefilled_tokens"]["l1"] == sum(entry["prefilled_tokens"]["l1"] for entry in full["rounds"][:3])
    assert plot_hit_rates(stopped, str(tmp_path / "partial.png")) and (tmp_path / "partial.png").stat().st_size > 0
