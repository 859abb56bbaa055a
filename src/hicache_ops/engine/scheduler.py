"""Concurrent requests through one TieredCache, as SGLang's scheduler loop admits them.

Requests arrive together (a wave); each one's prefetch is considered on arrival, as SGLang does
when it queues a request: threshold, in-flight limit, storage query and host allocation per
version (docs/controller.md#in-flight-limit, #prefetch-host-allocation). Then scheduler passes run:
each pass finishes the requests whose decode is over, re-queries 0.5.23's misses that
are due, and admits waiting requests in queue order while the device can hold them next to the
KV the running requests hold and the pass's batch-size and prefill-token caps allow
(docs/controller.md#admission-budget) (0.5.23 first re-issues the prefetch of a request whose match shrank
while it waited, and admits it on a later pass). Each request the pass reaches is matched (admitted or
not); an admitted request's prefetch lands (its requested tokens leave the in-flight count) and
its host part loads back, and the pass's prefills (the rest computed and inserted) run after the
loop, as SGLang runs the batch it built (docs/controller.md#admission-budget). It runs for one
pass per output token before its finish inserts prompt and output.

Time (docs/controller.md#transfer-time): the scheduler keeps a clock. Requests arrive at its
current time; the first pass runs `admission_s` later and each next one `pass_s` after it. An
L3 read takes the tier's time or the configured bandwidth and latency, whichever is later, and
each pass's admission check asks the stop policy whether a waiting request's prefetch ends now
(best_effort: yes, with what has arrived; wait_complete: once the last page has; timeout: once
its budget has run out); one it does not end is skipped for the pass. When nothing runs and
every waiting request waits on its read, the clock jumps to the next page or budget expiry.

0.5.23 polls a waiting request's miss again (docs/controller.md#miss-re-query): a prefetch the
in-flight limit refused, one whose lookup found less than the threshold (or nothing) and one
with no host room for its hit are re-issued at the scheduler step `RETRY_POLL_INTERVAL_PASSES`
after the first step that saw them armed, at most `RETRY_MAX_ATTEMPTS` times, never for the
queue head (its pending re-query is dropped). A prefix another instance wrote to the shared L3
meanwhile is then found. 0.5.14 never asks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.page_pools import CapacityError
from hicache_ops.engine.parts import Arrival
from hicache_ops.engine.results import PrefillResult
from hicache_ops.sglang import policy as pol


@dataclass
class WaveStats:
    passes: int = 0
    retried: int = 0  # 0.5.23 re-issues of misses (in-flight limit, a hit below the threshold, no host room)
    retried_issued: int = 0  # re-issues that went out
    requeried: int = 0  # 0.5.23 re-issues after a waiting request's match shrank
    max_running: int = 0
    max_in_flight_tokens: int = 0


class Scheduler:
    """One TieredCache's scheduler loop: `submit` queues a request at the current clock, `step`
    runs one pass (finish, the 0.5.23 miss re-query, admission). Two schedulers over caches that
    share an L3 tier can be stepped in turn (instances serving side by side)."""

    def __init__(self, cache: TieredCache, stats: WaveStats | None = None):
        self.cache = cache
        self.stats = stats if stats is not None else WaveStats()
        self.waiting: list[Arrival] = []
        self.running: list[tuple[int, Arrival]] = []  # (the pass its decode ends, the request)
        self.pass_no = 0  # also SGLang's retry step: one per pass
        self.clock = cache.clock if cache.clock is not None else 0.0  # the cache keeps it across waves
        cache.advance_clock(self.clock)
        self._jump_to: float | None = None
        self._retries = pol.retries_rate_limited(cache.config.sglang_version)
        # SGLang's running_batch.batch_is_full after a memory refusal: no pass admits until a
        # running request leaves (docs/controller.md#admission-budget).
        self.batch_full = False

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def submit(
        self,
        prompt: Sequence[int] | np.ndarray,
        output: Sequence[int] | np.ndarray,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> Arrival:
        """A request arrives now: it queues and its prefetch is considered."""
        self.cache.advance_clock(self.clock)
        arrival = self.cache.arrive(prompt, output, extra_key, cache_salt, now=self.clock)
        self.waiting.append(arrival)
        self.stats.max_in_flight_tokens = max(self.stats.max_in_flight_tokens, self.cache.in_flight_tokens)
        return arrival

    def step(self) -> None:
        cache, cfg, stats = self.cache, self.cache.config, self.stats
        self.pass_no += 1
        stats.passes += 1
        self.clock += cfg.admission_s if self.pass_no == 1 else cfg.pass_s
        if self._jump_to is not None:
            self.clock, self._jump_to = max(self.clock, self._jump_to), None
        cache.advance_clock(self.clock)
        still_running = []
        for end, arrival in self.running:
            if end <= self.pass_no:
                cache.finish(arrival)
                self.batch_full = False  # a request left the running batch
            else:
                still_running.append((end, arrival))
        self.running = still_running
        if self._retries:
            self._poll_retries()
        admitted: list[Arrival] = []
        requeried = 0
        blocked = False
        running_before = len(self.running)
        rem_input = cfg.max_prefill_tokens
        remaining = cache.room_tokens()  # SGLang's remaining_total, charged per admitted request
        for arrival in self.waiting if not self.batch_full else []:
            if pol.batch_is_full(cfg.max_running_requests, running_before, len(admitted)):
                break  # before its prefetch is asked whether it may stop: it does not land
            if not cache.check_prefetch(arrival, self.clock):
                blocked = True
                continue  # its stop policy waits on its read: skipped this pass
            cache.match_waiting(arrival)  # matched whether or not it is admitted
            if self._retries and cache.requery_after_match_loss(arrival, self.pass_no, self.clock):
                requeried += 1
                continue
            extend = cache.extend_tokens(arrival)
            if pol.input_budget_refuses(extend, cfg.page_size, rem_input, len(admitted)):
                break  # this pass's prefill tokens are spent
            if not cache.can_admit(arrival, remaining):
                # SGLang stops adding to the batch when the device has no room (NO_TOKEN) and
                # keeps later passes from admitting while something is admitted or running.
                self.batch_full = bool(self.running)  # this pass's admissions run too
                break
            if rem_input is not None:
                rem_input -= pol.paged_tokens(extend, cfg.page_size)
            remaining -= cache.pass_charge_tokens(arrival)
            arrival.retry_armed, arrival.retry_due = False, None  # admitted: its pending re-query is dropped
            cache.admit_match(arrival)
            admitted.append(arrival)
            self.running.append((self.pass_no + arrival.decode_passes, arrival))
            if remaining <= 0 or (rem_input is not None and rem_input <= 0):
                break  # the verdict after an admission: nothing left (before the next prefetch check)
        if admitted:
            cache.allocate_admitted(admitted)  # the batch's KV, before any of its inserts
            for arrival in admitted:  # the pass's batch runs its prefills (each matched above)
                cache.prefill_admitted(arrival)
            self.waiting = [a for a in self.waiting if a not in admitted]
        elif self.waiting and not self.running and not requeried:
            nxt = cache.next_prefetch_event(self.waiting, self.clock) if blocked else None
            if nxt is None:
                raise CapacityError(
                    f"the device pool has {cache.device.capacity * cfg.page_size} tokens and cannot run a request "
                    f"that needs {cache.admission_tokens(self.waiting[0])} of them (SGLang's admission: prompt, "
                    f"clipped decode and a page, strictly less than the pool).",
                    hint="Use a larger device pool or shorter prompts.",
                )
            self._jump_to = nxt  # nothing else happens until a read lands or a budget runs out
        stats.requeried += requeried
        stats.max_running = max(stats.max_running, len(self.running))

    def _poll_retries(self) -> None:
        """0.5.23's miss re-query at this step (docs/controller.md#miss-re-query): the queue
        head's pending re-query is dropped; an armed request past its attempts is dropped; one
        seen armed for the first time is due `RETRY_POLL_INTERVAL_PASSES` steps later; due ones
        are re-issued in queue order."""
        step = self.pass_no
        if not self.waiting:
            return
        head = self.waiting[0]
        head.retry_armed, head.retry_due = False, None
        for arrival in self.waiting:
            if not arrival.retry_armed:
                continue
            if arrival.retries >= pol.RETRY_MAX_ATTEMPTS:
                arrival.retry_armed, arrival.retry_due = False, None
                continue
            if arrival.retry_due is None:
                arrival.retry_due = step + pol.RETRY_POLL_INTERVAL_PASSES
            if arrival.retry_due > step:
                continue
            arrival.retry_armed, arrival.retry_due = False, None
            self.stats.retried += 1
            if self.cache.retry_prefetch(arrival, step, self.clock):
                self.stats.retried_issued += 1


def run_wave(
    cache: TieredCache, requests: Sequence[tuple[np.ndarray, np.ndarray]], stats: WaveStats | None = None
) -> list[PrefillResult]:
    """Serve (prompt, output) pairs that arrive together; results in arrival order."""
    scheduler = Scheduler(cache, stats)
    arrivals = [scheduler.submit(prompt, output) for prompt, output in requests]
    while not scheduler.idle:
        scheduler.step()
    return [a.result for a in arrivals]
