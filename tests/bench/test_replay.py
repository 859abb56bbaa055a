"""`hicache bench replay`: trace formats, arrival order, capacities, the references beside the
replay, Mooncake's L3 eviction, the sweep and its plot, bad input; the whole FAST'25 synthetic
trace once at the end.

Unit tests read tests/data/mooncake_fast25_synthetic_head300.jsonl: the first 300 lines of the
FAST'25 synthetic trace (kvcache-ai/Mooncake, FAST25-release/traces/synthetic_trace.jsonl,
Apache-2.0); the integration test reads the whole file from ../shared/traces/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.bench import replay_baseline
from hicache_ops.commands.bench.replay import MooncakeEvictingL3, ReplaySpec, replay
from hicache_ops.commands.bench.replay_report import parse_sweep
from hicache_ops.commands.bench.replay_trace import MOONCAKE_BLOCK_TOKENS, TokenSource, load_trace
from hicache_ops.sglang.page_keys import page_keys
from hicache_ops.sglang.versions import V0_5_23
from serve_process import HICACHE

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "tests" / "data" / "mooncake_fast25_synthetic_head300.jsonl"
TRACE_NAME = "mooncake_fast25_synthetic_trace.jsonl"


def invoke(*args):
    return hicache(["bench", "replay", *args])


def write_lines(path: Path, lines: list) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def mooncake_line(ts, ids, length=None, output=1):
    return {"timestamp": ts, "input_length": length or len(ids) * 512, "output_length": output, "hash_ids": ids}


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------


def test_equal_ids_give_equal_tokens_and_page_keys_up_to_the_first_different_id(tmp_path):
    trace = load_trace(
        write_lines(
            tmp_path / "t.jsonl",
            [
                mooncake_line(0, [7, 8, 9]),
                mooncake_line(1, [7, 8, 10]),
                mooncake_line(2, [8, 7, 9]),
            ],
        )
    )
    source = TokenSource(trace)
    a, b, c = (source.tokens(r) for r in trace.requests)
    assert a.size == b.size == c.size == 3 * 512
    assert np.array_equal(a[:1024], b[:1024]) and not np.array_equal(a[1024:], b[1024:])
    ka, kb, kc = (page_keys(t, 64, V0_5_23) for t in (a, b, c))
    assert ka[:16] == kb[:16] and all(x != y for x, y in zip(ka[16:], kb[16:], strict=True))
    # Same ids in another order: another prefix from the first page (the keys chain).
    assert all(x != y for x, y in zip(ka, kc, strict=True))
    # A block's tokens depend on its id only: block 8 is the same rows wherever it sits.
    assert np.array_equal(a[512:1024], c[:512])


def test_partial_last_block_is_a_prefix_of_the_full_block_and_its_partial_page_is_not_cached(tmp_path):
    trace = load_trace(
        write_lines(
            tmp_path / "t.jsonl",
            [
                mooncake_line(0, [1, 2], length=1000),
                mooncake_line(5, [1, 2], length=1024),
                mooncake_line(9, [1, 2], length=1000),
            ],
        )
    )
    source = TokenSource(trace)
    short, full, _ = (source.tokens(r) for r in trace.requests)
    assert short.size == 1000 and np.array_equal(short, full[:1000])
    run = replay(ReplaySpec(l1_tokens=4096, l2_tokens=0, l3="none", page_size=64), trace, source)
    # 1000 tokens: 15 whole pages (960 tokens) go into the tree, the last 40 never do.
    # The full request hits those 15 pages and adds page 16; the third hits 15 pages again.
    assert run.cached["l1"] == 960 + 960
    assert replay_baseline.ceiling(trace, 64).cached_tokens == 960 + 960


@pytest.mark.parametrize("page_size", [16, 64, 512])
def test_block_keys_are_the_keys_the_engine_computes(tmp_path, page_size):
    """bench replay hands the engine each prompt's page keys, hashed once per (prior key, block):
    they are exactly what the cache's keys_for gives the prompt (whole pages, partial last blocks,
    a prompt cut inside a block, blocks seen again after another prefix)."""
    from hicache_ops.commands.bench.replay import BlockKeys, _build_cache

    lines = [mooncake_line(0, [1, 2, 3]), mooncake_line(1, [1, 2, 4], length=1300), mooncake_line(2, [2])]
    lines += [mooncake_line(3, [5, 2], length=700), mooncake_line(4, [1], length=100)]
    cache, _ = _build_cache(ReplaySpec(page_size=page_size, l1_tokens=1 << 20, l3="none"))
    for trace in (load_trace(write_lines(tmp_path / "t.jsonl", lines)), load_trace(str(SLICE), limit=80)):
        source = TokenSource(trace)
        assert BlockKeys.applies(trace, page_size)
        for run in range(2):  # cold, then (a later replay over the same TokenSource) every block known
            block_keys = BlockKeys(source, page_size)
            assert bool(block_keys._first) == (run == 1)
            compared = 0
            for request in trace.requests:
                tokens = source.tokens(request)
                keys = block_keys(request, tokens.size)
                assert keys == cache.keys_for(tokens, None, None)[0]
                compared += len(keys)
            assert compared > len(trace.requests)
        assert not BlockKeys.applies(trace, 48)  # a 48-token page straddles blocks: the engine hashes


def test_mooncake_page_ids_stand_for_sglang_page_keys_exactly():
    """The ceiling's integer page identities are equal exactly where the page keys are."""
    trace = load_trace(str(SLICE))
    source = TokenSource(trace)
    for page_size in (64, 48, 1024):
        by_id: dict = {}
        for request in trace.requests[:120]:
            keys = page_keys(source.tokens(request), page_size, V0_5_23)
            ids = replay_baseline.mooncake_page_ids(request, page_size).tolist()
            assert len(keys) == len(ids)
            for pid, key in zip(ids, keys, strict=True):
                assert by_id.setdefault(pid, key) == key
        assert len(set(by_id.values())) == len(by_id)


def test_tokens_format_keeps_namespaces_apart(tmp_path):
    ids = list(range(100, 228))
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            {"input_ids": ids, "timestamp": 0},
            {"input_ids": ids, "timestamp": 1, "extra_key": "tenant-a"},
            {"input_ids": ids, "timestamp": 2, "extra_key": "tenant-a", "output_length": 4},
            {"input_ids": ids, "timestamp": 3},
        ],
    )
    result = invoke(
        path, "--l1-tokens", "1024", "--l2-tokens", "0", "--l3", "none", "--page-size", "16", "--json", "--quiet"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trace"]["format"] == "tokens"
    # Request 3 hits tenant-a's pages, request 4 the first request's: 7 of the 8 pages each, since
    # a match covers at most input length - 1 tokens (docs/controller.md#match-cap).
    assert data["cached_tokens"] == 224 and data["ceiling_cached_tokens"] == 224
    assert data["hit_rate"] == pytest.approx(224 / 512)


# ---------------------------------------------------------------------------------------------
# Arrival order
# ---------------------------------------------------------------------------------------------


def test_requests_replay_in_timestamp_order_and_equal_timestamps_form_one_group(tmp_path):
    trace = load_trace(
        write_lines(
            tmp_path / "t.jsonl",
            [
                mooncake_line(30, [5]),
                mooncake_line(10, [1]),
                mooncake_line(20, [2]),
                mooncake_line(10, [3]),
                mooncake_line(20.0, [4]),
            ],
        )
    )
    assert [r.line for r in trace.requests] == [2, 4, 3, 5, 1]  # stable: file order breaks ties
    assert [[r.line for r in g] for g in trace.groups()] == [[2, 4], [3, 5], [1]]


def test_slice_groups_match_the_file():
    trace = load_trace(str(SLICE))
    lines = [json.loads(x) for x in SLICE.read_text().splitlines()]
    assert len(trace.requests) == 300 and trace.format == "mooncake"
    groups = list(trace.groups())
    assert sum(map(len, groups)) == 300
    assert len(groups) == len({line["timestamp"] for line in lines})
    assert all(len({r.timestamp for r in g}) == 1 for g in groups)


# ---------------------------------------------------------------------------------------------
# Capacities
# ---------------------------------------------------------------------------------------------


def run_json(*args) -> dict:
    result = invoke(str(SLICE), "--json", "--quiet", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_capacities_become_the_pools_operators_asked_for():
    data = run_json("--l1-tokens", "300000", "--l2-tokens", "900000", "--l3", "2000000")
    tiers = data["tiers"]
    assert tiers["l1"]["capacity_tokens"] == 300000 // 64 * 64
    # SGLang's host pool: int(device x ratio) // page + 1 pages.
    assert tiers["l2"]["capacity_tokens"] == (900000 // 64 + 1) * 64
    assert tiers["l3"]["capacity_tokens"] == 2000000 // 64 * 64
    assert tiers["l1"]["capacity_bytes"] == tiers["l1"]["capacity_tokens"] * data["config"]["bytes_per_token"]
    parts = sum(tiers[t]["cached_tokens"] for t in ("l1", "l2", "l3"))
    # The totals are sums of these same tiers (no check there); what can fail: no bounded cache
    # hits more than the unbounded ceiling, computed apart from the engine (replay_baseline).
    assert 0 < parts <= data["ceiling_cached_tokens"]

    ratio = run_json("--l1-tokens", "300000", "--hicache-ratio", "3", "--l3", "none")
    assert ratio["tiers"]["l2"]["capacity_tokens"] == (300000 // 64 * 64 * 3 // 64 + 1) * 64
    assert ratio["tiers"]["l3"]["capacity_tokens"] == 0 and ratio["tiers"]["l3"]["cached_tokens"] == 0

    one_tier = run_json("--l1-tokens", "300000", "--l2-tokens", "0", "--l3", "none")
    assert one_tier["tiers"]["l2"]["capacity_tokens"] == 0
    assert one_tier["tiers"]["l2"]["cached_tokens"] == one_tier["tiers"]["l3"]["cached_tokens"] == 0


def test_an_unbounded_cache_reaches_the_ceiling_and_a_small_one_evicts():
    big = run_json("--l1-tokens", "8000000", "--l2-tokens", "0", "--l3", "none")
    assert big["cached_tokens"] == big["ceiling_cached_tokens"] > 0
    assert big["tiers"]["l1"]["evictions"] == 0
    small = run_json("--l1-tokens", "200000", "--l2-tokens", "0", "--l3", "none")
    assert 0 < small["cached_tokens"] < big["cached_tokens"]
    assert small["tiers"]["l1"]["evictions"] > 0
    # The unbounded L3 behind a small L1 keeps every page; it falls short of the ceiling only where
    # a request's L3 part is under SGLang's prefetch threshold (256 tokens), which is recomputed.
    tiered = run_json("--l1-tokens", "200000", "--l3", "unbounded")
    assert small["cached_tokens"] < tiered["cached_tokens"] <= big["ceiling_cached_tokens"]
    assert tiered["tiers"]["l3"]["cached_tokens"] > 0


def test_sweep_points_are_log_spaced_and_the_hit_rate_grows_with_capacity():
    assert parse_sweep("1000:100000:3", 64) == [960, 9984, 99968]
    data = run_json("--l2-tokens", "0", "--l3", "none", "--sweep", "l1", "150000:3000000:5")
    points = data["points"]
    capacities = [p["capacity_tokens"] for p in points]
    assert capacities == sorted(capacities) and len(capacities) == 5
    rates = [p["hit_rate"] for p in points]
    assert rates == sorted(rates) and rates[0] < rates[-1]
    assert rates[-1] == pytest.approx(data["ceiling_hit_rate"])
    baseline = [p["baseline_hit_rate"] for p in points]
    assert baseline == sorted(baseline)
    assert data["hit_rate"] == rates[-1] and data["sweep"] == "l1"


def test_a_sweep_may_add_the_tier_the_base_configuration_lacks():
    data = run_json("--l1-tokens", "200000", "--l2-tokens", "0", "--sweep", "l2", "400000:800000:2")
    assert [p["tiers"]["l2"]["capacity_tokens"] for p in data["points"]] == [400064, 800064]
    assert all(p["tiers"]["l3"]["capacity_tokens"] is None for p in data["points"])  # unbounded


def test_ctrl_c_keeps_the_whole_requests_replayed_so_far():
    trace = load_trace(str(SLICE))

    def interrupt_after_120(done, total, elapsed, run, runs):
        if done >= 120:
            raise KeyboardInterrupt

    run = replay(ReplaySpec(l1_tokens=300000, l3="none"), trace, progress=interrupt_after_120)
    assert run.interrupted and run.requests == 120
    assert run.prompt_tokens == sum(r.input_length for r in trace.requests[:120])
    whole = replay(ReplaySpec(l1_tokens=300000, l3="none"), trace.head(120))
    assert run.cached == whole.cached and not whole.interrupted


def test_sigint_prints_the_figures_so_far_and_exits_130():
    trace = shared_traces() / TRACE_NAME
    # Twenty three-tier runs over the whole trace: far longer than the 5 s to the first progress
    # line, so the signal lands midway.
    proc = subprocess.Popen(
        [
            HICACHE,
            "bench",
            "replay",
            str(trace),
            "--l1-tokens",
            "1000000",
            "--l2-tokens",
            "3000000",
            "--sweep",
            "l3",
            "3000000:48000000:20",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        progress = proc.stderr.readline()  # the first progress line, after 5 s
        assert "replayed" in progress, progress
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        data = json.loads(out)
        assert data["interrupted"] is True and "Traceback" not in err
        assert data["trace"]["requests_replayed"] == data["points"][-1]["requests"]
        assert len(data["points"]) < 20 or data["trace"]["requests_replayed"] < 3993
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_sweep_plot_is_written(tmp_path):
    png = tmp_path / "sweep.png"
    result = invoke(
        str(SLICE),
        "--quiet",
        "--l1-tokens",
        "150000",
        "--l3",
        "none",
        "--sweep",
        "l2",
        "300000:1200000:3",
        "--plot",
        str(png),
    )
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot:" in result.stdout


def _page_stream(trace, lag=0):
    """Every request of `trace` split into its blocks, one whole-block request each, in order;
    with a `lag`, every third block is asked again `lag` blocks later, and every fifth 5 later."""
    from hicache_ops.commands.bench.replay_trace import Trace, TraceRequest

    blocks = [(r.timestamp, block) for r in trace.requests for block in r.block_ids()]
    requests = []
    for i, (timestamp, block) in enumerate(blocks):
        requests.append(TraceRequest(0, timestamp, MOONCAKE_BLOCK_TOKENS, 1, hash_ids=[block]))
        if lag and i >= lag and i % 3 == 0:
            requests.append(TraceRequest(0, timestamp, MOONCAKE_BLOCK_TOKENS, 1, hash_ids=[blocks[i - lag][1]]))
        if lag and i >= 5 and i % 5 == 0:
            requests.append(TraceRequest(0, timestamp, MOONCAKE_BLOCK_TOKENS, 1, hash_ids=[blocks[i - 5][1]]))
    for number, request in enumerate(requests, 1):
        request.line = number
    return Trace("pages", "mooncake", requests)


def _mixed_stream(trace):
    """The page stream's first blocks, then the trace's requests with each one's first block
    alone before it: one-block requests on a tree that longer prompts (and partial last blocks)
    shaped, so the one-block path meets the shapes it hands back to the engine."""
    from hicache_ops.commands.bench.replay_trace import Trace, TraceRequest

    requests = list(_page_stream(trace.head(20)).requests)
    for r in trace.requests[:60]:
        requests.append(TraceRequest(0, r.timestamp, MOONCAKE_BLOCK_TOKENS, 1, hash_ids=r.block_ids()[:1]))
        requests.append(TraceRequest(0, r.timestamp, r.input_length, 1, hash_ids=r.block_ids()))
    for number, request in enumerate(requests, 1):
        request.line = number
    return Trace("mixed", "mooncake", requests)


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_one_block_path_gives_the_engine_prefills_results(version, write_policy, page_size):
    from dataclasses import asdict

    trace = load_trace(str(SLICE))
    # L1 of 40 blocks, L2 of 80: a block asked again 60 blocks on is on the host.
    pages, mixed = _page_stream(trace.head(50), lag=60), _mixed_stream(trace)
    longest = max(r.input_length for r in mixed.requests)
    for stream, l1_tokens in ((pages, 40 * MOONCAKE_BLOCK_TOKENS), (mixed, longest + 20 * MOONCAKE_BLOCK_TOKENS)):
        spec = ReplaySpec(
            page_size=page_size, l1_tokens=l1_tokens, l3="none", write_policy=write_policy, sglang_version=version
        )
        tokens = TokenSource(stream)
        fast = replay(spec, stream, tokens)
        general = replay(spec, stream, tokens, one_block_path=False)
        assert general.one_block_requests == 0
        # The one-block path served the page stream, and the mixed stream's blocks but where it
        # hands a shape back.
        one_block = sum(1 for r in stream.requests if len(r.block_ids()) == 1)
        assert fast.one_block_requests >= (one_block if stream is pages else one_block // 2) > 0
        figures = [
            (run.requests, run.prompt_tokens, run.cached, run.stats, run.tiers(1).model_dump())
            for run in (fast, general)
        ]
        assert figures[0] == figures[1]
        if stream is pages:  # the stream reached both hits, eviction from both tiers and load-back
            stats = general.stats
            assert stats["device_hit"] and stats["host_hit"] and stats["device_evictions"], stats
            assert stats["host_evictions"] and stats["bytes_h2d"], stats
    assert asdict(fast.spec) == asdict(general.spec)


# ---------------------------------------------------------------------------------------------
# The references
# ---------------------------------------------------------------------------------------------


def test_block_lru_keeps_the_most_recent_blocks(tmp_path):
    trace = load_trace(
        write_lines(
            tmp_path / "t.jsonl",
            [
                mooncake_line(0, [1, 2]),
                mooncake_line(1, [3, 4]),
                mooncake_line(2, [1, 2, 5], length=1100),
                mooncake_line(3, [3, 4]),
            ],
        )
    )
    # Capacity 4 blocks: request 3 hits [1, 2] and brings 5 in, evicting 3 (the oldest);
    # request 4 then misses on block 3 at once (block 4 is still there, but not as a prefix),
    # and bringing 3 back evicts 1.
    run = replay_baseline.block_lru(trace, 4 * MOONCAKE_BLOCK_TOKENS)
    assert run.cached_tokens == 1024 and run.evictions == 2
    unbounded = replay_baseline.block_lru(trace, None)
    # Request 4 holds both its blocks but computes its last token (docs/controller.md#match-cap).
    assert unbounded.cached_tokens == 1024 + 1023


def test_mooncake_l3_evicts_unread_puts_first_and_never_a_leased_page():
    l3 = MooncakeEvictingL3([], bytes_per_page=1, capacity_pages=10)
    assert all(l3.write([f"k{i}" for i in range(9)], list(range(9)))[0])
    l3.advance(1000.0)  # 9 of 10 is not above the 0.90 watermark: no pass
    assert len(l3) == 9 and l3.evictions == 0
    assert all(l3.read(["k0", "k1", "k2"], [0, 1, 2]).ok)  # leased until 11 s
    ok, outcome = l3.write(["k9", "k10"], [0, 1])
    assert ok == [True, False] and outcome.failed == ["k10"] and l3.failed_puts == 1
    # Full: a pass frees ceil(10 x max(0.05, 1.00 - 0.90 + 0.05)) = 2 pages, never-read puts
    # first, oldest put first.
    l3.advance(2000.0)
    assert l3.evictions == 2 and "k3" not in l3 and "k4" not in l3 and "k5" in l3
    l3.advance(3000.0)  # 8 of 10: no pass
    assert len(l3) == 8
    l3.write(["y1", "y2"], [0, 1])
    assert all(l3.read(["k5", "k6", "k7", "k8", "k9", "y1", "y2"], list(range(7))).ok)  # leased until 14 s
    assert l3.write(["z1"], [0])[0] == [False]
    l3.advance(4000.0)  # full, but every lease holds: nothing goes
    assert len(l3) == 10 and l3.evictions == 2
    l3.advance(11000.0)  # k0..k2's leases ended: the two oldest go
    assert l3.evictions == 4 and "k0" not in l3 and "k1" not in l3 and "k2" in l3
    assert l3.contiguous_hits(["k2", "k1", "k5"]) == []  # one count per rank scheme; none here


# ---------------------------------------------------------------------------------------------
# Bad input: one sentence, exit 2
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        (['{"timestamp": 0, "input_length": 512, "hash_ids": [1]}', "{not json"], "line 2 is not valid JSON"),
        ([mooncake_line(0, [1, 2], length=512)], "2 hash_ids for input_length 512"),
        ([{"timestamp": -1, "input_length": 1, "hash_ids": [1]}], "'timestamp' is -1"),
        ([{"timestamp": 0, "input_length": 512, "hash_ids": ["a"]}], "'hash_ids' must be a list of integers"),
        ([mooncake_line(0, [1]), {"timestamp": 1, "input_ids": [1, 2]}], "line 2 has no 'hash_ids'"),
        ([{"input_ids": [1, -2]}], "'input_ids' must be a non-empty list"),
        (["[1, 2]"], "line 1 is not a JSON object"),
    ],
)
def test_malformed_lines_are_named(tmp_path, lines, words):
    result = invoke(write_lines(tmp_path / "bad.jsonl", lines), "--quiet")
    assert result.exit_code == 2, result.output
    assert words in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--l3", "lots"], "--l3 'lots' must be none, unbounded"),
        (["--l2-tokens", "0"], "an L3 tier needs an L2"),
        (["--l2-tokens", "100000", "--l1-tokens", "200000", "--l3", "none"], "must be above --l1-tokens"),
        (["--l2-tokens", "900000", "--hicache-ratio", "3"], "not both"),
        (["--l1-tokens", "100000", "--l3", "none"], "longest prompt of the trace has 134,773 tokens"),
        (["--sweep", "l4", "1:2:3"], "--sweep tier 'l4'"),
        (["--sweep", "l1", "5:3:2"], "needs 64 <= FROM < TO"),
        (["--sweep", "l1", "abc"], "must be FROM:TO:STEPS"),
        (["--plot", "x.png"], "--plot draws a sweep"),
        (["--format", "csv"], "--format 'csv' is unknown"),
        (["--hicache-write-policy", "never"], "'never'"),
    ],
)
def test_bad_options_exit_2(args, words):
    result = invoke(str(SLICE), "--quiet", *args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr and "Traceback" not in result.output


def test_missing_trace_exits_2(tmp_path):
    result = invoke(str(tmp_path / "absent.jsonl"), "--json")
    assert result.exit_code == 2
    assert "does not exist" in json.loads(result.stdout)["error"]["message"]


# ---------------------------------------------------------------------------------------------
# The whole synthetic trace (no timing assertion)
# ---------------------------------------------------------------------------------------------


def shared_traces() -> Path:
    """../shared/traces beside the checkout; for a git worktree, beside its main checkout."""
    roots = [ROOT]
    dot_git = ROOT / ".git"
    if dot_git.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        gitdir = Path(dot_git.read_text().split(":", 1)[1].strip())
        roots.append(gitdir.parents[2])
    for root in roots:
        folder = root.parent / "shared" / "traces"
        if (folder / TRACE_NAME).is_file():
            return folder
    pytest.fail(f"the FAST'25 synthetic trace is missing: expected ../shared/traces/{TRACE_NAME} beside the checkout.")


def test_whole_synthetic_trace_one_tier_of_3m_tokens():
    trace = shared_traces() / TRACE_NAME
    result = invoke(str(trace), "--l1-tokens", "3000000", "--l2-tokens", "0", "--l3", "none", "--json", "--quiet")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trace"]["requests"] == data["trace"]["requests_replayed"] == 3993
    assert data["trace"]["prompt_tokens"] == 61_194_628
    # The trace's README: a block LRU gives an unbounded 0.65, and 48% of it at 3M tokens.
    baseline = data["baseline"]
    assert baseline["unbounded_hit_rate"] == pytest.approx(0.65, abs=0.005)
    assert baseline["hit_rate"] / baseline["unbounded_hit_rate"] == pytest.approx(0.48, abs=0.01)
    # SGLang's pages reach the same ceiling within a partial page per request.
    assert data["ceiling_hit_rate"] == pytest.approx(baseline["unbounded_hit_rate"], abs=0.005)
    assert 0 < data["hit_rate"] < data["ceiling_hit_rate"]
    assert data["tiers"]["l1"]["evictions"] > 0 and data["tiers"]["l2"]["capacity_tokens"] == 0
    assert data["hit_rate_of_ceiling"] == pytest.approx(data["hit_rate"] / data["ceiling_hit_rate"])
    assert data["interrupted"] is False and data["wall_s"] > 0


def test_sigterm_is_named_as_what_stopped_the_replay():
    trace = shared_traces() / TRACE_NAME
    args = ["--l1-tokens", "1000000", "--l2-tokens", "3000000", "--sweep", "l3", "3000000:48000000:20"]
    proc = subprocess.Popen(
        [HICACHE, "bench", "replay", str(trace), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        progress = proc.stderr.readline()
        assert "replayed" in progress, progress
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        flat = " ".join(out.split())
        assert "the figures cover the requests replayed before SIGTERM" in flat and "Ctrl-C" not in flat, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_l2_tokens_are_kept_exact():
    """--l2-tokens 512512 over 1,000 L1 pages of 512: SGLang sizes the host pool as
    512512 // 512 + 1 = 1,002 pages. Passing it as the ratio 1.001 lost a page to float rounding
    (int(512000 x 1.001) = 512511, so 1,001 pages)."""
    spec = ReplaySpec(l1_tokens=512_000, l2_tokens=512_512, l3="none", page_size=512).validate()
    host = spec.engine_spec().host_layout(mooncake=True)
    assert host.page_num == 512_512 // 512 + 1 == 1002
    assert spec.baseline_capacity() == 512_512


def test_tier_table_fits_80_columns_without_cutting_a_cell():
    """TiB-sized traffic on an 80-column terminal: every cell whole (rich ends a cut one with '…')."""
    trace = shared_traces() / TRACE_NAME
    out = subprocess.run(
        [HICACHE, "bench", "replay", str(trace), "--limit", "1500"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines() if "│" in line or "┃" in line]
    assert len(table) == 4 and "TiB" in out.stdout, out.stdout
    assert all("…" not in line and len(line) <= 80 for line in table), out.stdout
