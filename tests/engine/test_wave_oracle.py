"""Issue 22, the oracle: requests in flight together. A wave of requests arrives at once; SGLang
0.5.23's own tree (the oracle harness's `UnifiedRadixCache` with its host pool and controller)
and its own `PrefillAdder` serve it pass by pass, and the engine's `run_wave` serves the same
wave; compared per request: device and host hit tokens (docs/oracle.md#scheduler-level-code).

The loop around SGLang's code is ours (the `Scheduler` needs a model to build), in the engine's
order: each pass finishes the requests whose decode is over (finish insert of prompt + output
minus its last token, unlock, `check_hicache_events`), then runs `PrefillAdder.add_one_req` over
the waiting queue in order (`init_next_round_input` matches each; a host hit is loaded back by
the adder's own `init_load_back`) until a verdict other than CONTINUE; an admitted request's
pass's prompts are allocated together by SGLang's `alloc_paged_token_slots_extend` (one eviction
for the batch), then each one that decodes is inserted and locked (checkpoint).
A request runs one pass per output token. Running requests are charged their whole clipped
decode (`output_ids` empty, `ignore_eos`), as the engine reserves it. No L3 here.
"""

from __future__ import annotations

import itertools
from array import array
from collections import Counter

import numpy as np
from hypothesis import strategies as st
from tests.sglang_0_5_14 import draw as draw_examples

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.planes import AccountingPlane
from hicache_ops.engine.scheduler import run_wave

PS = 4
NO_CAP = 10**9


@st.composite
def waves(draw):
    fresh = itertools.count(100_000)
    stems = [list(range(1000 * (k + 1), 1000 * (k + 1) + draw(st.integers(4, 12)) * PS)) for k in range(3)]

    def request(k):
        stem = stems[k]
        cut = draw(st.integers(0, len(stem)))
        tail = draw(st.integers(0 if cut else 1, 2 * PS))
        prompt = stem[:cut] + [next(fresh) for _ in range(tail)]
        return prompt, [next(fresh) for _ in range(draw(st.integers(1, 6)))]

    # Requests of one wave may take the same stem (a pass admits requests that share a prefix)
    # and requests of later waves find the earlier ones' (device and host hits, after eviction).
    wave_list = [
        [request(draw(st.integers(0, 2))) for _ in range(draw(st.integers(2, 3)))]
        for _ in range(draw(st.integers(2, 4)))
    ]
    longest = max(len(p) + len(o) for w in wave_list for p, o in w)
    device_tokens = PS * (-(-longest // PS) + 3 + draw(st.integers(0, 24)))
    return device_tokens, wave_list


def sglang_wave(
    device_tokens: int, wave_list, reach: Counter | None = None, ps: int = PS
) -> list[list[tuple[int, int]]]:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
    from sglang.srt.sampling.sampling_params import SamplingParams

    from engine import oracle_0_5_23 as o

    run = o._Replay(o.OracleConfig(page_size=ps, device_tokens=device_tokens))
    cache = run.cache
    out = []
    try:
        for wave in wave_list:
            waiting = [
                (Req(f"r{i}", "", array("q", p), SamplingParams(max_new_tokens=len(q), ignore_eos=True)), p, q)
                for i, (p, q) in enumerate(wave)
            ]
            hits: dict[str, tuple[int, int]] = {}
            running: list[list] = []  # [end pass, req, prompt, output, row, protected, inserted, lock]
            pass_no = 0
            batch_full = False  # the Scheduler's running_batch.batch_is_full
            while waiting or running:
                pass_no += 1
                if pass_no > 10_000:
                    raise AssertionError("SGLang's loop admits nothing")
                still = []
                for entry in running:
                    end, req, prompt, output, row, protected, inserted, lock = entry
                    if end > pass_no:
                        still.append(entry)
                        continue
                    batch_full = False  # a request leaves the running batch
                    kept = prompt + output[:-1]
                    row = run.extend(row, len(kept))
                    row, protected, inserted, lock = run.insert(kept, len(prompt), row, protected, inserted, lock)
                    if row[protected:].numel():
                        run.allocator.free(row[protected:])
                    cache.unlock(lock)
                    cache.check_hicache_events()
                running = still
                adder = PrefillAdder(
                    ps, cache, run.allocator, ScheduleBatch(reqs=[e[1] for e in running]), 1.0, NO_CAP, None
                )
                device_hit = {}
                if reach is not None:
                    reach["passes kept from admitting by batch_is_full"] += batch_full and bool(waiting)
                for req, _, _ in waiting if not batch_full else []:
                    if adder.budget_state() == AddReqResult.OTHER:
                        break
                    req.init_next_round_input(cache)
                    device_hit[req.rid] = req.prefix_len
                    verdict = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
                    if verdict != AddReqResult.CONTINUE:
                        if verdict == AddReqResult.NO_TOKEN:
                            batch_full = bool(adder.can_run_list or running)
                        break
                admitted = {req.rid for req in adder.can_run_list}
                if reach is not None:
                    reach["passes admitting two or more"] += len(admitted) > 1
                    reach["admitted while others run"] += len(admitted) if running else 0
                    reach["held back by device room"] += bool(
                        len(waiting) > len(admitted) > 0 or (not admitted and running)
                    )
                if adder.can_run_list:
                    cache.ready_to_load_host_cache()
                    cache.check_hicache_events()
                batch = [w for w in waiting if w[0].rid in admitted]
                rows = o.alloc_pass_kv(cache, [req for req, _, _ in batch], [len(p) for _, p, _ in batch], ps)
                for (req, prompt, output), row in zip(batch, rows, strict=True):
                    hits[req.rid] = (device_hit[req.rid], req.host_loaded_length)
                    lock = req.lock
                    protected, inserted = req.prefix_len, 0
                    if len(output) > 1:
                        row, protected, inserted, lock = run.insert(prompt, len(prompt), row, protected, inserted, lock)
                        cache.check_hicache_events()
                    running.append([pass_no + len(output), req, prompt, output, row, protected, inserted, lock])
                waiting = [w for w in waiting if w[0].rid not in admitted]
            out.append([hits[f"r{i}"] for i in range(len(wave))])
    finally:
        cache.shutdown()
    return out


def engine_wave(device_tokens: int, wave_list, ps: int = PS) -> list[list[tuple[int, int]]]:
    cfg = CacheConfig(
        page_size=ps,
        device_pages=device_tokens // ps,
        host_pages=int(device_tokens * 2.0) // ps + 1,
        sglang_version="0.5.23",
    )
    cache = TieredCache(cfg, AccountingPlane(1), None)
    out = []
    for wave in wave_list:
        requests = [(np.array(p, dtype=np.int64), np.array(q, dtype=np.int64)) for p, q in wave]
        out.append([(r.device_hit, r.host_hit) for r in run_wave(cache, requests)])
    return out


def _workloads():
    return draw_examples(waves(), 40)


def test_sglangs_waves_reach_what_requests_in_flight_together_do():
    """The generated workloads (the hypothesis profile's) reach, in SGLang's own loop: device
    and host hits, passes admitting several requests, admissions next to running requests and
    requests held back by device room."""
    reach: Counter = Counter()
    for device_tokens, wave_list in _workloads():
        for wave in sglang_wave(device_tokens, wave_list, reach):
            reach["device hit"] += sum(d > 0 for d, _ in wave)
            reach["host hit"] += sum(h > 0 for _, h in wave)
    wanted = ("device hit", "host hit", "passes admitting two or more", "admitted while others run")
    held_back = ("held back by device room", "passes kept from admitting by batch_is_full")
    assert min(reach[k] for k in wanted + held_back) > 0, reach


def test_wave_hits_are_sglangs():
    """Every request's hits are SGLang's."""
    for device_tokens, wave_list in _workloads():
        assert engine_wave(device_tokens, wave_list) == sglang_wave(device_tokens, wave_list), (
            device_tokens,
            wave_list,
        )


def test_same_pass_requests_do_not_share_a_prefix():
    """Two requests admitted on one pass: SGLang matches each (init_next_round_input) as its
    loop reaches it and runs the batch's prefills after the loop, so the second computes the
    shared page again (its insert finds the first's copy and frees its own)."""
    wave_list = [[([1000, 1001, 1002, 1003], [100000]), ([1000, 1001, 1002, 1003, 100001], [100002])]]
    assert sglang_wave(20, wave_list) == [[(0, 0), (0, 0)]]
    assert engine_wave(20, wave_list) == [[(0, 0), (0, 0)]]


def test_a_page_1_pass_asks_only_for_its_extend_tokens():
    """At page 1 a pass's allocation asks eviction for its extend tokens alone (`alloc_for_extend`
    takes `alloc_token_slots` there; the page per request is the paged allocator's over-estimate).
    Device 20 tokens: A (10) is cached; B and C (5 each) are admitted on one pass and fit the 10
    free tokens, so A stays on the device for its next request. Asking a token more per request
    evicted A (the engine before: (0, 0), A computed again)."""
    a = (list(range(3000, 3010)), [100000])
    wave_list = [[a], [(list(range(4000, 4005)), [100001]), (list(range(5000, 5005)), [100002])], [a]]
    assert sglang_wave(20, wave_list, ps=1)[2] == [(9, 0)]
    assert engine_wave(20, wave_list, ps=1)[2] == [(9, 0)]


def test_a_running_request_holds_its_partial_last_page():
    """A running request holds a device page for its prompt's partial last page from its
    prefill on, and its decode's pages: E's (26 tokens, 3 more decoded) take the device's last
    free pages and evict the oldest node, A's, so F misses A's first page on SGLang's device.
    (Shrunk from a generated wave; the engine held only E's whole pages and kept A.)"""
    a = (list(range(3000, 3008)), [100020])
    b = (list(range(2001, 2013)), [100034])
    c = ([3001, 3002, 3003, 100039, 100040], [100044, 100045, 100046, 100047])
    d = ([2000, 2001, 2002, 2003, 2004], [100048, 100049, 100050, 100051])
    e = ([*range(1000, 1024), 100052, 100053], [100056, 100057, 100058, 100059])
    f = ([3000, 3001, 3002, 3003, 3004], [100068])
    wave_list = [[a, b], [c], [d], [e], [f]]
    assert sglang_wave(64, wave_list)[-1] == [(0, 0)]
    assert engine_wave(64, wave_list) == sglang_wave(64, wave_list)


def test_a_request_the_pass_does_not_admit_still_splits_its_match():
    """SGLang matches every request its loop reaches, the one the memory check then refuses too:
    C's match splits A's node after its first page, so B's prefill (admitted before C on the same
    pass) evicts only A's tail, and C, admitted next pass, finds A's first page on the device.
    (Shrunk from a generated wave; the engine matched only admitted requests and evicted A whole.)"""
    a = (list(range(1000, 1012)), [100056])
    b = ([*range(2000, 2026), *range(100057, 100064)], [100065])
    c = ([1000, 1001, 1002, 1003, 1004], [100070])
    wave_list = [[a], [b, c]]
    assert sglang_wave(44, wave_list) == [[(0, 0)], [(0, 0), (4, 0)]]
    assert engine_wave(44, wave_list) == sglang_wave(44, wave_list)


def test_no_pass_admits_after_a_memory_refusal_until_a_request_leaves():
    """SGLang's `batch_is_full` (`_get_new_batch_prefill_raw`, 0.5.23 and 0.5.14 with HiCache):
    X's NO_TOKEN next to P, admitted on the same pass, keeps the next passes from admitting until
    P leaves, although the page of alignment P's admission charged is free again on the next
    pass and X would fit there. X is admitted after P's finish and finds P's prompt and output
    (2 pages), not the page P's prefill inserted."""
    p = ([1, 2, 3, 4, 5, 6], [7, 8, 9])
    x = ([1, 2, 3, 4, 5, 6, 7, 8, *range(100, 136)], [200])
    assert sglang_wave(64, [[p, x]]) == [[(0, 0), (8, 0)]]
    assert engine_wave(64, [[p, x]]) == sglang_wave(64, [[p, x]])
