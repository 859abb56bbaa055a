"""Issue 22, divergence 3: 0.5.23 re-queries a waiting request's miss, not only a rate-limited
prefetch (docs/controller.md#miss-re-query).

SGLang 0.5.23 arms a re-query (`StoragePrefetchRetries.poll_miss`, mem_cache/storage_prefetch.py)
when a prefetch is refused by the in-flight limit, when its lookup finds less than the threshold
(nothing included) and when the hit finds no host room (mem_cache/unified_radix_cache.py:
prefetch_from_storage, _drain_and_alloc_storage_hit, _try_alloc_storage_hit); a span below the
threshold issues no lookup and arms nothing. Each scheduler step `pop_ready` drops the queue
head's pending re-query, gives an armed request its due step `interval` steps after the first
step that sees it, and re-issues due ones in queue order until `max_attempts`
(managers/scheduler.py: _process_storage_prefetch_retries). 0.5.14 has none of it.

The step bookkeeping is checked against SGLang's own `StoragePrefetchRetries`, driven in lockstep
with the engine's scheduler; the outcomes that arm it are checked one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from sglang.srt.mem_cache.storage_prefetch import StoragePrefetchRetries

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.planes import AccountingPlane, MemoryL3
from hicache_ops.engine.scheduler import Scheduler
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import ObjectKeyScheme

PS = 4


def _tokens(k: int, pages: int) -> np.ndarray:
    return np.arange(pages * PS + 1, dtype=np.int64) + 10_000 * (k + 1)


def _cache(version: str, l3: MemoryL3, **cfg) -> TieredCache:
    base = dict(page_size=PS, device_pages=20, host_pages=100, prefetch_threshold=PS, sglang_version=version)
    base.update(cfg)
    return TieredCache(CacheConfig(**base), AccountingPlane(64), l3)


@dataclass
class _Req:
    """What SGLang's pop_ready reads of a queued request."""

    rid: str
    storage_prefetch_retry_attempts: int


class Lockstep:
    """The engine's scheduler and SGLang's StoragePrefetchRetries stepped together: before each
    step the waiting queue (with its attempts) is what pop_ready sees; after it, what the engine
    admitted is cancelled and what it armed is poll_miss'ed, as SGLang's scheduler does."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.sglang = StoragePrefetchRetries()
        self.rid: dict[int, str] = {}

    def name(self, arrival) -> str:
        return self.rid.setdefault(id(arrival), f"r{len(self.rid)}")

    def sync(self) -> None:
        for arrival in self.scheduler.waiting:
            if arrival.retry_armed and self.name(arrival) not in self.sglang._pending:
                self.sglang.poll_miss(self.name(arrival))

    def submit(self, prompt, output):
        arrival = self.scheduler.submit(prompt, output)
        self.sync()
        return arrival

    def step(self) -> None:
        sched = self.scheduler
        queue = [_Req(self.name(a), a.retries) for a in sched.waiting]
        before = {id(a): len(a.retried_at) for a in sched.waiting}
        waiting = list(sched.waiting)
        sched.step()
        ready = self.sglang.pop_ready(queue, pol.RETRY_POLL_INTERVAL_PASSES, pol.RETRY_MAX_ATTEMPTS)
        requeried = [self.name(a) for a in waiting if len(a.retried_at) > before[id(a)]]
        assert [req.rid for req, _ in ready] == requeried, f"step {sched.pass_no}"
        for arrival in waiting:
            if arrival not in sched.waiting:
                self.sglang.cancel(self.name(arrival))  # admitted
        self.sync()
        engine = {self.name(a): a.retry_due for a in sched.waiting if a.retry_armed}
        theirs = {rid: retry.due_step for rid, retry in self.sglang._pending.items()}
        assert engine == theirs, f"step {sched.pass_no}"

    def run(self) -> None:
        while not self.scheduler.idle:
            self.step()


def _requery_scene(version: str):
    """B runs X, which fills its device for 40 passes; R1 (head) and R2 wait behind it. R2's
    prompt P is in no L3 when it arrives; instance A writes P to the shared L3 at B's step 2."""
    l3 = MemoryL3([ObjectKeyScheme(version)], 64)
    a, b = _cache(version, l3), _cache(version, l3)
    x, r1, p = _tokens(1, 8), _tokens(2, 4), _tokens(3, 8)
    scheduler = Scheduler(b)
    lock = Lockstep(scheduler) if version == "0.5.23" else None
    submit = lock.submit if lock else scheduler.submit
    step = lock.step if lock else scheduler.step
    arrivals = [submit(x, np.arange(40) + 7), submit(r1, [7]), submit(p, [7])]
    assert [arr.result.prefetch.reason for arr in arrivals] == ["no page of the suffix is in L3"] * 3
    step()
    step()
    a.request(p, [1])  # write_through: host copy, then L3
    while not scheduler.idle:
        step()
    return arrivals, scheduler


def test_a_prefix_written_while_the_request_waits_is_found_in_0_5_23():
    (x, r1, r2), scheduler = _requery_scene("0.5.23")
    # SGLang's own StoragePrefetchRetries (Lockstep) says when: X is the head at step 1 (its
    # re-query dropped) and admitted; R1 and R2 are first seen at step 1, due at 9; R1 heads
    # the queue then (dropped), R2 is re-issued and finds the 8 pages A wrote.
    assert r1.retried_at == [] and r2.retried_at == [1 + pol.RETRY_POLL_INTERVAL_PASSES]
    assert r2.result.storage_hit == 8 * PS
    assert r2.result.prefetch.issued and r2.result.prefetch.reason == ""
    assert r1.result.storage_hit == 0 and x.result.storage_hit == 0


def test_0_5_14_never_asks_again():
    (_, r1, r2), scheduler = _requery_scene("0.5.14")
    assert r2.result.storage_hit == 0 and r2.retried_at == [] and scheduler.stats.retried == 0
    assert r2.result.prefetch.reason == "no page of the suffix is in L3"


# -- what arms a re-query (0.5.23), one outcome at a time ----------------------------------------


def _stored(version: str, *prompts: np.ndarray) -> MemoryL3:
    l3 = MemoryL3([ObjectKeyScheme(version)], 64)
    writer = _cache(version, l3, device_pages=64, host_pages=200)
    for prompt in prompts:
        writer.request(prompt, [1])
        writer.flush()
    return l3


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_which_outcomes_arm_a_re_query(version):
    stored = _tokens(5, 2)  # 2 pages in L3
    l3 = _stored(version, stored)
    reader = _cache(version, l3, prefetch_threshold=3 * PS)
    polled = version == "0.5.23"
    # A miss (no page in L3) and a hit below the threshold (2 of 4 pages) arm it.
    miss = reader.arrive(_tokens(6, 4), [1])
    below = reader.arrive(np.concatenate([stored[:-1], _tokens(7, 2)]), [1])
    assert miss.result.prefetch.reason == "no page of the suffix is in L3"
    assert below.result.prefetch.reason.startswith("revoked: the minimum storage hit over ranks is 8 tokens")
    assert (miss.retry_armed, below.retry_armed) == (polled, polled)
    # A span below the threshold issues no lookup and arms nothing.
    short = reader.arrive(_tokens(8, 2), [1])
    assert short.result.prefetch.reason.startswith("below the prefetch threshold") and not short.retry_armed


def test_no_host_room_for_the_hit_arms_a_re_query_in_0_5_23():
    stored = _tokens(5, 8)
    l3 = _stored("0.5.23", stored)
    reader = _cache("0.5.23", l3, host_pages=6, device_pages=64)
    reader.request(_tokens(9, 6), [1])  # its write_through host copy fills the host pool
    arrival = reader.arrive(stored, [1])
    assert "the host pool cannot hold 8 prefetched pages" in arrival.result.prefetch.reason
    assert arrival.retry_armed


def test_rate_limited_arms_a_re_query_in_0_5_23():
    prompts = [_tokens(k, 16) for k in range(3)]
    l3 = _stored("0.5.23", *prompts)
    reader = _cache("0.5.23", l3, host_pages=30)  # limit 0.5 x 30 x 4 = 60 tokens: one 64-token prefetch
    first, second = (reader.arrive(p, [1]) for p in prompts[:2])
    assert first.result.prefetch.issued and not first.retry_armed
    assert "in flight >= limit" in second.result.prefetch.reason and second.retry_armed


# -- the bookkeeping against SGLang's StoragePrefetchRetries, on mixed waves --------------------


@pytest.mark.parametrize("seed", range(12))
def test_re_query_steps_match_sglang_on_mixed_waves(seed):
    """Waves of stored and fresh prompts on a small host (rate limits, host shortfalls, misses);
    a second instance writes some fresh prompts to the shared L3 while they wait. Every step's
    re-issues and pending due steps are SGLang's."""
    rng = np.random.default_rng(seed)
    version = "0.5.23"
    prompts = [_tokens(k, int(rng.integers(2, 12))) for k in range(10)]
    stored = [p for p, keep in zip(prompts, rng.random(10) < 0.5, strict=True) if keep]
    l3 = _stored(version, *stored)
    writer = _cache(version, l3, device_pages=64, host_pages=200)
    reader = _cache(version, l3, device_pages=40, host_pages=int(rng.integers(24, 60)))
    lock = Lockstep(Scheduler(reader))
    order = rng.permutation(10)
    for i in order[:7]:
        lock.submit(prompts[i], np.arange(int(rng.integers(1, 30))) + 7)
    steps = 0
    late = list(order[7:])
    while not lock.scheduler.idle:
        lock.step()
        steps += 1
        if steps in (3, 11) and late:
            writer.request(prompts[late.pop()], [1])  # visible to the reader's next lookups
        if steps == 5:
            lock.submit(prompts[order[0]], [7, 8])
    assert lock.scheduler.stats.passes == steps
