"""Issue 22, the oracle: SGLang 0.5.23's own `PrefillAdder` decides which waiting requests a pass
admits, compared with the engine's scheduler pass (docs/controller.md#admission-budget,
docs/oracle.md#scheduler-level-code).

Per generated pass, both sides hold the same state: prompts served earlier and finished (their
pages in the tree, evictable), running requests at the start of their decode (their prompt
inserted and locked, the partial last page held by the request, `max_new_tokens` still to come)
and a waiting queue. SGLang's side is 0.5.23's `UnifiedRadixCache` on CPU pools (the oracle
harness, tests/engine/oracle_0_5_23.py), real `Req` objects (`init_next_round_input` matches them),
a real `ScheduleBatch` as the running batch, and `PrefillAdder.add_one_req` (its
`PrefillBudget`: `CLIP_MAX_NEW_TOKENS`, the page overhead, `rem_input_tokens`). The loop around it
is `Scheduler._get_new_batch_prefill_raw`'s, repeated here (the `Scheduler` needs a model, a
tokenizer and sockets to build): the spent-input break, the batch-size break with
`get_num_allocatable_reqs` = max_running_requests - running (its pipeline budget; request slots
are not the binding limit here), and the break on any verdict but CONTINUE.

The engine's side is `engine/scheduler.py`'s `Scheduler.step` on a `TieredCache` in the same
state. Compared per pass: which requests are admitted, in order.

SGLang 0.5.14's side is the same pass in its child process (tests/sglang_0_5_14.py): 0.5.14's
`HiRadixCache` (the oracle harness's `Replay`, tests/engine/oracle_0_5_14.py), its `Req`,
`ScheduleBatch` and `PrefillAdder`, every pass of the module in one child; the engine runs with
`sglang_version="0.5.14"`.

Waiting requests of one pass may share pages the tree does not hold: SGLang matches each request
its loop reaches before any of the pass's prefills run, and so does the engine
(test_same_pass_requests_do_not_share_a_prefix_0_5_14 pins such a pass); the lists are equal.
"""

from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.page_pools import CapacityError
from hicache_ops.engine.planes import AccountingPlane
from hicache_ops.engine.scheduler import Scheduler

NO_CAP = 10**9  # rem_input_tokens when the engine has no max_prefill_tokens


@dataclass(frozen=True)
class Pass:
    page_size: int
    device_pages: int
    cached: tuple[tuple[int, ...], ...]  # served and finished earlier (output of 1 token)
    running: tuple[tuple[tuple[int, ...], int], ...]  # (prompt, max_new_tokens), at the start of decode
    waiting: tuple[tuple[tuple[int, ...], int], ...]
    max_running_requests: int | None
    max_prefill_tokens: int | None


def _pages(n: int, ps: int) -> int:
    return -(-n // ps)


@st.composite
def passes(draw) -> Pass:
    ps = draw(st.sampled_from([1, 4, 16]))
    fresh = itertools.count(100_000)
    stems = [list(range(1000 * (k + 1), 1000 * (k + 1) + draw(st.integers(1, 6)) * ps)) for k in range(3)]

    def prompt() -> tuple[int, ...]:
        stem = stems[draw(st.integers(0, 2))]
        cut = draw(st.integers(0, len(stem)))
        tail = draw(st.integers(0 if cut else 1, 3 * ps))
        return tuple(stem[:cut]) + tuple(next(fresh) for _ in range(tail))

    max_new = st.one_of(st.integers(2, 12 * ps), st.integers(4090, 4200))
    cached = tuple(prompt() for _ in range(draw(st.integers(0, 3))))
    running = tuple((prompt(), draw(max_new)) for _ in range(draw(st.integers(0, 3))))
    waiting = tuple((prompt(), draw(max_new)) for _ in range(draw(st.integers(1, 5))))
    held = sum(_pages(len(p), ps) for p in cached) + sum(_pages(len(p), ps) for p, _ in running)
    # Room for the held pages and, in tokens, for about what the running and waiting requests ask.
    asked = sum(len(p) + m for p, m in running + waiting)
    extra = draw(st.integers(0, _pages(asked, ps) + 4))
    mrr = draw(st.one_of(st.none(), st.integers(1, 6)))
    if mrr is not None and mrr < len(running):
        mrr = len(running) + draw(st.integers(0, 2))
    cap = draw(st.one_of(st.none(), st.integers(1, 12).map(lambda k: k * ps * 4)))
    return Pass(ps, held + extra + 1, cached, running, waiting, mrr, cap)


# -- SGLang's side ---------------------------------------------------------------------------


def sglang_admits(p: Pass) -> list[int]:
    """Indices (into p.waiting) of the requests SGLang 0.5.23's PrefillAdder admits this pass."""
    import torch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.sampling.sampling_params import SamplingParams

    from engine import oracle_0_5_23 as o

    ps = p.page_size
    run = o._Replay(o.OracleConfig(page_size=ps, device_tokens=p.device_pages * ps))
    try:
        for prompt in p.cached:
            served = run.serve(list(prompt), [1])
            assert served["device_evicted"] == 0
        cache = run.cache
        running = []
        for k, (prompt, max_new) in enumerate(p.running):
            # Prefill, then checkpoint_kv_cache: the prompt's aligned part is inserted and locked;
            # the request keeps its partial last page. Its decode has not written yet.
            match = cache.match_prefix(MatchPrefixParams(key=run.key(list(prompt), limit=len(prompt) - 1)))
            assert match.host_hit_length == 0
            lock = cache.lock(match.last_device_node)
            row = cache.path_device_indices(match.last_device_node)[: match.device_prefix_len].to(torch.int64)
            row = run.prefill_kv(row, len(prompt))
            run.insert(list(prompt), len(prompt), row, len(row), 0, lock)
            assert run.evicted == 0
            running.append(
                Req(f"run{k}", "", array("q", prompt), SamplingParams(max_new_tokens=max_new, ignore_eos=True))
            )
        batch = ScheduleBatch(reqs=running)
        adder = PrefillAdder(
            ps,
            cache,
            run.allocator,
            batch,
            1.0,
            p.max_prefill_tokens if p.max_prefill_tokens is not None else NO_CAP,
            None,
            max_running_requests=p.max_running_requests,
        )
        allocatable = NO_CAP if p.max_running_requests is None else p.max_running_requests - len(running)
        waiting = [
            Req(f"w{i}", "", array("q", prompt), SamplingParams(max_new_tokens=max_new, ignore_eos=True))
            for i, (prompt, max_new) in enumerate(p.waiting)
        ]
        if allocatable > 0:
            for req in waiting:  # Scheduler._get_new_batch_prefill_raw, without storage
                if adder.budget_state() == AddReqResult.OTHER:
                    break
                if len(adder.can_run_list) >= allocatable:
                    break
                req.init_next_round_input(cache)
                assert req.host_hit_length == 0
                if adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None) != AddReqResult.CONTINUE:
                    break
        return [int(req.rid[1:]) for req in adder.can_run_list]
    finally:
        run.cache.shutdown()


# -- the engine's side -----------------------------------------------------------------------


def engine_admits(p: Pass, version: str = "0.5.23") -> list[int]:
    ps = p.page_size
    cfg = CacheConfig(
        page_size=ps,
        device_pages=p.device_pages,
        host_pages=2 * p.device_pages,
        sglang_version=version,
        max_running_requests=p.max_running_requests,
        max_prefill_tokens=p.max_prefill_tokens,
    )
    cache = TieredCache(cfg, AccountingPlane(64), None)
    for prompt in p.cached:
        cache.request(np.array(prompt, dtype=np.int64), [1])
    scheduler = Scheduler(cache)
    for prompt, max_new in p.running:
        arrival = cache.arrive(np.array(prompt, dtype=np.int64), np.arange(max_new, dtype=np.int64) + 7)
        cache.admit(arrival)  # it is running: admitted on an earlier pass
        scheduler.running.append((10**9, arrival))
    try:
        waiting = [
            scheduler.submit(np.array(prompt, dtype=np.int64), np.arange(max_new, dtype=np.int64) + 7)
            for prompt, max_new in p.waiting
        ]
        scheduler.step()
    except CapacityError:
        return []
    return [i for i, a in enumerate(waiting) if a not in scheduler.waiting]


def _common_pages(a: tuple[int, ...], b: tuple[int, ...], ps: int) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n // ps


def shares_inside_the_pass(p: Pass) -> bool:
    """Whether a waiting request shares whole pages with an earlier waiting request beyond what
    the tree holds at the start of the pass (neither SGLang nor the engine lets the later one find
    them: both match before the pass's prefills run)."""
    ps = p.page_size
    held = list(p.cached) + [prompt for prompt, _ in p.running]  # their aligned pages are in the tree
    for j, (prompt, _) in enumerate(p.waiting):
        cap = (len(prompt) - 1) // ps  # the match's len - 1 limit
        in_tree = max((_common_pages(prompt, h, ps) for h in held), default=0)
        earlier = max((_common_pages(prompt, w, ps) for w, _ in p.waiting[:j]), default=0)
        if min(earlier, cap) > min(in_tree, cap):
            return True
    return False


@settings(deadline=None)
@given(passes())
def test_a_pass_admits_what_sglangs_prefill_adder_admits(p):
    assert engine_admits(p) == sglang_admits(p), p


# A smoke case that the harness reaches the batch-size break.
_BATCH_SIZE_SMOKE = Pass(
    4, 64, (), ((tuple(range(1, 10)), 4),), ((tuple(range(20, 29)), 4), (tuple(range(40, 49)), 4)), 2, None
)


def test_batch_size_cap_is_sglangs():
    assert sglang_admits(_BATCH_SIZE_SMOKE) == engine_admits(_BATCH_SIZE_SMOKE) == [0]


def _boundary_passes(ps: int):
    """Passes at the boundary of SGLang's strict `total_tokens < remaining_total` (total = prompt
    past the locked prefix + clipped decode + a page): one waiting request on an empty device;
    two (the first's charge: its page-rounded prompt, a page and its decode); one behind a
    running request (its partial last page and its decode)."""
    for device_pages in range(1, 4 + 24 // ps):
        for n in range(1, 2 * ps + 2):
            prompt = tuple(range(1, n + 1))
            other = tuple(range(500, 500 + n + 1))
            yield Pass(ps, device_pages, (), (), ((prompt, 3),), None, None)
            yield Pass(ps, device_pages, (), (), ((other, 2), (prompt, 3)), None, None)
            if -(-len(other) // ps) <= device_pages:
                yield Pass(ps, device_pages, (), ((other, 2),), ((prompt, 3),), None, None)


def _clip_passes(ps: int):
    """Passes across the room boundary for a decode longer than `CLIP_MAX_NEW_TOKENS` (4096):
    one waiting request; two (the first's pass charge); one behind a running request (its
    reservation). `max_new_tokens` 4150 puts the clipped and the unclipped totals 54 tokens
    apart, so every page size has device sizes between them."""
    n = ps + 1
    small = (tuple(range(1, n + 1)), 3)
    for max_new in (4096, 4150):
        long = (tuple(range(500, 500 + n)), max_new)
        low, high = (n + 4096 + ps) // ps - 2, (2 * n + 4150 + 3 * ps) // ps + 3
        for device_pages in range(low, high, max(1, (high - low) // 12)):
            yield Pass(ps, device_pages, (), (), (long,), None, None)
            yield Pass(ps, device_pages, (), (), (long, small), None, None)
            yield Pass(ps, device_pages, (), (long,), (small,), None, None)


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_decode_clip_at_the_room_boundary(ps):
    reached = set()
    for p in _clip_passes(ps):
        theirs = sglang_admits(p)
        assert engine_admits(p) == theirs, p
        reached.add((len(p.running), len(p.waiting), len(theirs)))
    assert {(0, 1, 0), (0, 1, 1), (0, 2, 1), (0, 2, 2), (1, 1, 0), (1, 1, 1)} <= reached


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_rounding_at_the_room_boundary(ps):
    reached = set()
    for p in _boundary_passes(ps):
        theirs = sglang_admits(p)
        assert engine_admits(p) == theirs, p
        reached.add((len(p.running), len(p.waiting), len(theirs)))
    # Each shape is seen admitted in full, in part (two waiting) and not at all.
    assert {(0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (0, 2, 2), (1, 1, 0), (1, 1, 1)} <= reached


# -- 0.5.14, in its child process -------------------------------------------------------------

# The same pass, built in 0.5.14's `HiRadixCache` (the oracle harness's `Replay`,
# tests/engine/oracle_0_5_14.py) with 0.5.14's `Req`, `ScheduleBatch` and `PrefillAdder`. The loop
# is 0.5.14's `Scheduler._get_new_batch_prefill_raw`: the batch-size break
# (`get_num_allocatable_reqs` = max_running_requests - running), `init_next_round_input`,
# `add_one_req`, the break on any verdict but CONTINUE (0.5.14 has no spent-input check before
# `add_one_req`; its verdict after an admission ends the pass instead).
_CHILD_0_5_14 = r"""
from array import array

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import get_global_server_args

NO_CAP = PAYLOAD["no_cap"]
ListKey = RadixKey


def RadixKey(token_ids, extra_key=None, **kwargs):  # the name the Replay calls
    # 0.5.14's scheduler matches and inserts `Req.origin_input_ids` (array("q")) and its key
    # match asserts one type on both sides; the Replay's own calls build lists: arrays here too.
    return ListKey(array("q", token_ids), extra_key, **kwargs)


def admits(p, tracked):
    ps = p["page_size"]
    run = Replay(dict(PAYLOAD["config"], page_size=ps, device_tokens=p["device_pages"] * ps))
    # The scheduler passes its tracker's ratio (`new_token_ratio_tracker.current`: the initial
    # one on a server that was idle); 1.0 is the state the engine's reservation stands for.
    ratio = NewTokenRatioTracker.from_server_args(get_global_server_args()).current if tracked else 1.0
    try:
        cache = run.cache
        for prompt in p["cached"]:
            assert run.serve(prompt, [1])["device_evicted"] == 0
        running = []
        for k, (prompt, max_new) in enumerate(p["running"]):
            # Prefill, then cache_unfinished_req: the prompt's aligned part is inserted and locked;
            # the request keeps its partial last page. Its decode has not written yet.
            match = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(prompt), None, limit=len(prompt) - 1)))
            assert match.host_hit_length == 0
            node = match.last_device_node
            cache.inc_lock_ref(node)
            row = run.prefill_kv(match.device_indices.to(torch.int64), len(prompt))
            run.publish(prompt, row, len(match.device_indices), node, finished=False)
            cache.check_hicache_events()
            assert run.evicted == 0
            running.append(
                Req(f"run{k}", "", array("q", prompt), SamplingParams(max_new_tokens=max_new, ignore_eos=True))
            )
        mrr, cap = p["max_running_requests"], p["max_prefill_tokens"]
        adder = PrefillAdder(
            ps, cache, run.allocator, ScheduleBatch(reqs=running), ratio, NO_CAP if cap is None else cap, None,
            max_running_requests=mrr,
        )
        allocatable = NO_CAP if mrr is None else mrr - len(running)
        for i, (prompt, max_new) in enumerate(p["waiting"]):
            if len(adder.can_run_list) >= allocatable:
                break
            req = Req(f"w{i}", "", array("q", prompt), SamplingParams(max_new_tokens=max_new, ignore_eos=True))
            req.init_next_round_input(cache)
            assert req.host_hit_length == 0
            if adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None) != AddReqResult.CONTINUE:
                break
        return [int(req.rid[1:]) for req in adder.can_run_list]
    finally:
        run.cache.shutdown()


RESULT = {
    "admitted": [admits(p, tracked) for p, tracked in PAYLOAD["passes"]],
    "initial_ratio": NewTokenRatioTracker.from_server_args(get_global_server_args()).current,
}
"""


def sglang_0_5_14_admits(ps: list[tuple[Pass, bool]]) -> dict:
    """Per (pass, tracked), the indices (into its waiting queue) SGLang 0.5.14's PrefillAdder
    admits ("admitted"), at new_token_ratio 1.0 or, tracked, at the initial ratio of 0.5.14's
    `NewTokenRatioTracker` ("initial_ratio"): all passes in one child (a child start costs seconds)."""
    from dataclasses import asdict

    from engine import oracle_0_5_14 as o14
    from engine.oracle_0_5_23 import OracleConfig
    from sglang_0_5_14 import run_0_5_14

    setup = o14._SCRIPT[: o14._SCRIPT.index("\nRESULT = []\n")]  # the harness's rank and Replay
    payload = {
        "config": asdict(OracleConfig()),
        "no_cap": NO_CAP,
        "passes": [[asdict(p), tracked] for p, tracked in ps],
    }
    return run_0_5_14(setup + _CHILD_0_5_14, payload)


# Generated passes sent to the 0.5.14 child, next to the boundary passes: as many as the profile's
# examples for the 0.5.23 test (ci: 100; deep: 2000).
GENERATED_0_5_14 = settings.default.max_examples
BOUNDARY_PAGE_SIZES = (1, 4, 16)
# Two requests of one pass sharing a page the tree does not hold: SGLang refuses the second (its
# total 5 + 16 + 4 = 25 is not below the 40 - 15 left after the first); the engine, which prefilled
# the first before matching the second, finds the page locked and asks for 21.
SAME_PASS_SHARE = Pass(4, 10, (), (), (((1, 2, 3, 4, 5), 3), ((1, 2, 3, 4, 6), 16)), None, None)


@pytest.fixture(scope="module")
def passes_0_5_14() -> dict:
    """(pass, what 0.5.14 admits) for generated passes, the room-boundary passes and the single
    cases, from one child."""
    from sglang_0_5_14 import draw

    clip = [p for ps in BOUNDARY_PAGE_SIZES for p in _clip_passes(ps)]
    groups = {
        "generated": draw(passes(), GENERATED_0_5_14),
        "boundary": [p for ps in BOUNDARY_PAGE_SIZES for p in _boundary_passes(ps)],
        "clip": clip,
        "batch_size": [_BATCH_SIZE_SMOKE],
        "same_pass_share": [SAME_PASS_SHARE],
        "tracked_ratio": [p for p in clip if p.running],
    }
    sent = [(p, name == "tracked_ratio") for name, group in groups.items() for p in group]
    result = sglang_0_5_14_admits(sent)
    theirs = iter(result["admitted"])
    out = {name: [(p, next(theirs)) for p in group] for name, group in groups.items()}
    out["initial_ratio"] = result["initial_ratio"]
    return out


def test_a_pass_admits_what_sglangs_0_5_14_prefill_adder_admits(passes_0_5_14):
    generated = passes_0_5_14["generated"]
    assert generated
    for p, theirs in generated:
        assert engine_admits(p, "0.5.14") == theirs, p


def test_batch_size_cap_is_sglangs_0_5_14(passes_0_5_14):
    [(p, theirs)] = passes_0_5_14["batch_size"]
    assert theirs == engine_admits(p, "0.5.14") == [0]


@pytest.mark.parametrize("ps", BOUNDARY_PAGE_SIZES)
def test_rounding_at_the_room_boundary_0_5_14(passes_0_5_14, ps):
    reached = set()
    for p, theirs in passes_0_5_14["boundary"]:
        if p.page_size != ps:
            continue
        assert engine_admits(p, "0.5.14") == theirs, p
        reached.add((len(p.running), len(p.waiting), len(theirs)))
    assert {(0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (0, 2, 2), (1, 1, 0), (1, 1, 1)} <= reached


@pytest.mark.parametrize("ps", BOUNDARY_PAGE_SIZES)
def test_decode_clip_at_the_room_boundary_0_5_14(passes_0_5_14, ps):
    reached = set()
    for p, theirs in passes_0_5_14["clip"]:
        if p.page_size != ps:
            continue
        assert engine_admits(p, "0.5.14") == theirs, p
        reached.add((len(p.running), len(p.waiting), len(theirs)))
    assert {(0, 1, 0), (0, 1, 1), (0, 2, 1), (0, 2, 2), (1, 1, 0), (1, 1, 1)} <= reached


def test_same_pass_requests_do_not_share_a_prefix_0_5_14(passes_0_5_14):
    [(p, theirs)] = passes_0_5_14["same_pass_share"]
    if theirs != [0]:
        raise RuntimeError(f"SGLang 0.5.14 admits {theirs} on the pinned pass, not [0]: re-derive the case")
    assert shares_inside_the_pass(p)
    assert engine_admits(p, "0.5.14") == theirs


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="known divergence: 0.5.14 scales a running request's decode reservation by new_token_ratio, "
    "ignore_eos too; the engine keeps it whole",
)
def test_running_reservation_at_the_initial_new_token_ratio_0_5_14(passes_0_5_14):
    """0.5.14's `_get_running_request_total_token_offset` multiplies min(max_new_tokens - generated,
    4096) by the scheduler's `new_token_ratio` for every running request (0.5.23 takes 1.0 for
    `ignore_eos`), and its tracker starts at 0.7 and decays per decode step. Here: the clip
    passes with a running request, at the tracker's initial ratio."""
    if not passes_0_5_14["initial_ratio"] < 1.0:
        raise RuntimeError(f"0.5.14's initial new_token_ratio is {passes_0_5_14['initial_ratio']}: re-derive")
    for p, theirs in passes_0_5_14["tracked_ratio"]:
        assert engine_admits(p, "0.5.14") == theirs, p
