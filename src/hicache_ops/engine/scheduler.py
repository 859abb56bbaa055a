"""Concurrent requests through one TieredCache, as SGLang's scheduler loop admits them.

Requests arrive together (a wave); each one's prefetch is considered on arrival, as SGLang does
when it queues a request: threshold, in-flight limit, storage query and host allocation per
version (docs/controller.md#in-flight-limit, #prefetch-host-allocation). Then scheduler passes run:
each pass finishes the requests whose decode is over, re-issues 0.5.23's parked prefetches that
are due, and admits waiting requests in queue order while the device can hold them next to the
KV the running requests hold and the pass's batch-size and prefill-token caps allow
(docs/controller.md#admission-budget) (0.5.23 first re-issues the prefetch of a request whose match shrank
while it waited, and admits it on a later pass). An admitted request's prefetch lands (its requested tokens leave
the in-flight count), its host part loads back, the rest is computed, and it runs for one pass
per output token before its finish inserts prompt and output.

L3 reads complete at once here (the accounting L3 has no bandwidth), so the stop policies never
cut a prefetch; what binds under load is the in-flight limit, host allocation and device room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hicache_ops.engine.admission import Arrival
from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.page_pools import CapacityError
from hicache_ops.engine.results import PrefillResult
from hicache_ops.sglang import policy as pol


@dataclass
class WaveStats:
    passes: int = 0
    retried: int = 0  # 0.5.23 re-issues of prefetches the in-flight limit refused
    retried_issued: int = 0  # re-issues that went out
    requeried: int = 0  # 0.5.23 re-issues after a waiting request's match shrank
    max_running: int = 0
    max_in_flight_tokens: int = 0


def run_wave(
    cache: TieredCache, requests: Sequence[tuple[np.ndarray, np.ndarray]], stats: WaveStats | None = None
) -> list[PrefillResult]:
    """Serve (prompt, output) pairs that arrive together; results in arrival order."""
    stats = stats if stats is not None else WaveStats()
    version = cache.config.sglang_version
    retries = pol.retries_rate_limited(version)
    arrivals: list[Arrival] = []
    for prompt, output in requests:
        arrival = cache.arrive(prompt, output)
        arrivals.append(arrival)
        stats.max_in_flight_tokens = max(stats.max_in_flight_tokens, cache.in_flight_tokens)
    waiting = list(arrivals)
    running: list[tuple[int, Arrival]] = []  # (the pass its decode ends, the request)
    pass_no = 0
    while waiting or running:
        pass_no += 1
        still_running = []
        for end, arrival in running:
            if end <= pass_no:
                cache.finish(arrival)
            else:
                still_running.append((end, arrival))
        running = still_running
        if retries:
            for position, arrival in enumerate(waiting):
                if not arrival.rate_limited or arrival.retries >= pol.RETRY_MAX_ATTEMPTS:
                    continue
                if position == 0:
                    arrival.rate_limited = False  # the queue head never waits for a miss retry
                    continue
                if pass_no - arrival.parked_at >= pol.RETRY_POLL_INTERVAL_PASSES:
                    stats.retried += 1
                    if cache.retry_prefetch(arrival, pass_no):
                        stats.retried_issued += 1
        admitted: list[Arrival] = []
        requeried = 0
        running_before = len(running)
        rem_input = cache.config.max_prefill_tokens
        for arrival in waiting:
            if pol.batch_is_full(cache.config.max_running_requests, running_before, len(admitted)):
                break  # before its prefetch is asked whether it may stop: it does not land
            if retries and cache.requery_after_match_loss(arrival, pass_no):
                requeried += 1
                continue
            extend = cache.extend_tokens(arrival)
            if pol.input_budget_refuses(extend, cache.config.page_size, rem_input, len(admitted)):
                break  # this pass's prefill tokens are spent
            if not cache.can_admit(arrival):
                break  # SGLang stops adding to the batch when the device has no room
            if rem_input is not None:
                rem_input -= pol.paged_tokens(extend, cache.config.page_size)
            cache.admit(arrival)
            admitted.append(arrival)
            running.append((pass_no + arrival.decode_passes, arrival))
        if admitted:
            waiting = [a for a in waiting if a not in admitted]
        elif waiting and not running and not requeried:
            raise CapacityError(
                f"the device pool has {cache.device.capacity} pages and cannot run a request that needs "
                f"{cache.admission_pages(waiting[0])} of them.",
                hint="Use a larger device pool or shorter prompts.",
            )
        stats.requeried += requeried
        stats.max_running = max(stats.max_running, len(running))
    stats.passes += pass_no
    return [a.result for a in arrivals]
