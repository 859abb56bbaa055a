"""A request's steps under the concurrency model (scheduler.py), between its arrival and finish.

It arrives: it joins the waiting queue and its prefetch is considered, as SGLang does when it
queues a request (docs/controller.md#prefetch-threshold-and-revocation, #in-flight-limit). While
it waits, 0.5.23 re-queries its miss (docs/controller.md#miss-re-query), or its prefetch when its
local match shrank. It is admitted when
the device can hold it next to what running requests hold and still write, counted in tokens as
SGLang's PrefillAdder does (its prefetch lands and its prompt is prefilled), and the pass's
batch-size and input caps allow it
(docs/controller.md#admission-budget), and its finish inserts prompt and output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hicache_ops.engine.l3_prefetch import stop_verdict
from hicache_ops.engine.parts import Arrival, CacheParts
from hicache_ops.engine.results import PrefillResult
from hicache_ops.errors import InputError
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import as_token_array


class Admission(CacheParts):
    """TieredCache's concurrency-model steps (a mixin: it uses the cache's config, tree, device and
    host pools, lock, in-flight and reserved counts, the prefetch issue of prefetch.py, and the
    cache's own prefill and finish)."""

    def arrive(
        self,
        prompt: Sequence[int] | np.ndarray,
        output: Sequence[int] | np.ndarray,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        *,
        now: float = 0.0,
    ) -> Arrival:
        """A request joins the waiting queue: its prefetch is considered now, as SGLang does when it
        queues a request (docs/controller.md#prefetch-threshold-and-revocation, #in-flight-limit)."""
        arr, n_pages = self._check_prompt(prompt)
        out = as_token_array(output, self.config.sglang_version)
        if out.size == 0:
            raise InputError("a request generates at least one token.")
        ps = self.config.page_size
        result = PrefillResult(prompt_tokens=int(arr.size), pages=n_pages, trailing_tokens=int(arr.size - n_pages * ps))
        arrival = Arrival(
            arr, out, n_pages, self.keys_for(arr, extra_key, cache_salt), result, decode_passes=int(out.size)
        )
        with self.lock:
            self._queue_prefetch(arrival, now)
        return arrival

    def _queue_prefetch(self, arrival: Arrival, now: float) -> None:
        arrival.retry_armed, arrival.retry_due = False, None  # a new attempt replaces a pending one
        if self.l3 is None:
            return
        tree_keys, storage_keys = arrival.keys
        cap = pol.match_cap_pages(int(arrival.prompt.size), self.config.page_size)
        # With a storage tier SGLang's prefetch step starts with the request's own match
        # (`init_next_round_input`): it splits where the match ends and stamps the path as accessed,
        # so what a waiting request shares stays on the device longer (docs/oracle.md#scheduler-level-code).
        self.tree.match(tree_keys[:cap])
        _, pos, anchor = self.tree.local_match(tree_keys[:cap])
        arrival.matched_pages = pos
        if pos >= cap:
            return
        info = arrival.result.prefetch
        arrival.prefetch, poll_again = self._issue_prefetch(
            storage_keys, pos, cap, info, anchor=anchor, tokens=arrival.prompt, now=now
        )
        if arrival.prefetch is not None and anchor is not None:
            # The anchor's host copy is pinned until admission (SGLang's protect_host): host
            # eviction then cannot shorten the match the prefetched pages attach to.
            self.tree.pin_host([anchor], 1)
            arrival.anchor = anchor
        arrival.retry_armed = poll_again and pol.retries_rate_limited(self.config.sglang_version)
        info.rate_limited = False

    def retry_prefetch(self, arrival: Arrival, step: int, now: float = 0.0) -> bool:
        """0.5.23 re-issues the prefetch of a request still waiting whose miss was due for a
        re-query (docs/controller.md#miss-re-query); True when it went out."""
        arrival.retries += 1
        arrival.retried_at.append(step)
        with self.lock:
            self._queue_prefetch(arrival, now)
        return arrival.prefetch is not None

    def check_prefetch(self, arrival: Arrival, now: float) -> bool:
        """SGLang's admission check of a waiting request's prefetch at scheduler time `now`
        (docs/controller.md#stop-policies): True when it has ended (or there is none) and the
        request may be admitted; False: the stop policy waits on, and the request is skipped
        this pass. An ended prefetch leaves the in-flight count; its pages land at admission."""
        hold = arrival.prefetch
        if hold is None or hold.completed is not None:
            return True
        cfg = self.config
        verdict = stop_verdict(
            cfg.stop_policy, cfg.sglang_version, self._prefetch_budget(hold), hold, now, hold.first_check_at
        )
        if not verdict.stop:
            if hold.first_check_at is None:
                hold.first_check_at = now
            return False
        hold.completed, hold.stopped_at = verdict.arrived, now
        with self.lock:
            self._release_in_flight(hold)
        return True

    def next_prefetch_event(self, arrivals: list[Arrival], now: float) -> float | None:
        """The earliest scheduler time after `now` at which a waiting request's unfinished
        prefetch changes what its admission check says (a page lands or the budget runs out)."""
        cfg = self.config
        times = []
        for arrival in arrivals:
            hold = arrival.prefetch
            if hold is None or hold.completed is not None:
                continue
            times += [hold.issued_at + t for t in hold.outcome.done_at]
            start = hold.issued_at if pol.clock_starts_at_issue(cfg.sglang_version) else hold.first_check_at
            if cfg.stop_policy == "timeout" and start is not None:
                expiry = start + self._prefetch_budget(hold)
                times.append(expiry + 1e-9 * max(1.0, expiry))  # the budget runs out just after
        later = [t for t in times if t > now]
        return min(later) if later else None

    def requery_after_match_loss(self, arrival: Arrival, step: int, now: float = 0.0) -> bool:
        """0.5.23: a waiting request whose local match shrank since its prefetch was considered
        (other requests' allocations evicted its pages) re-issues its prefetch from the shorter
        match instead of being admitted on this pass, within the retry budget. True: re-issued."""
        version = self.config.sglang_version
        if self.l3 is None or not pol.retries_rate_limited(version) or arrival.retries >= pol.RETRY_MAX_ATTEMPTS:
            return False
        cap = pol.match_cap_pages(int(arrival.prompt.size), self.config.page_size)
        with self.lock:
            _, now, _ = self.tree.local_match(arrival.keys[0][:cap])
            if now >= arrival.matched_pages:
                return False
            hold, arrival.prefetch = arrival.prefetch, None
            if hold is not None:
                self._release_in_flight(hold)
                self.host.give_many(hold.host_pages)
            if arrival.anchor is not None:
                self.tree.pin_host([arrival.anchor], -1)
                arrival.anchor = None
            arrival.retries += 1
            self._queue_prefetch(arrival, now)
        return True

    def match_waiting(self, arrival: Arrival) -> None:
        """SGLang's `init_next_round_input` for a waiting request a pass's loop reaches (admitted
        or not): the match splits the node it ends inside and stamps its path as accessed, and
        eviction, which takes whole nodes, then takes what lies past the split first
        (docs/oracle.md#scheduler-level-code)."""
        cap = pol.match_cap_pages(int(arrival.prompt.size), self.config.page_size)
        with self.lock:
            self.tree.match(arrival.keys[0][:cap])

    def _reserved_tokens(self, arrival: Arrival) -> int:
        # A running request holds its partial last prompt page outside the tree and SGLang's
        # running-batch offset reserves min(max_new_tokens, 4096) decode tokens for it
        # (docs/controller.md#admission-budget); a request's max_new_tokens is its output here.
        ps = self.config.page_size
        partial = ps if arrival.prompt.size % ps else 0
        return pol.reserved_new_tokens(int(arrival.output.size)) + partial

    def extend_tokens(self, arrival: Arrival) -> int:
        """Prompt tokens the request's prefill computes if admitted now: past its device and host
        match and the pages its prefetch read (docs/controller.md#admission-budget)."""
        ps = self.config.page_size
        cap = pol.match_cap_pages(int(arrival.prompt.size), ps)
        _, matched, _ = self.tree.local_match(arrival.keys[0][:cap])
        hold = arrival.prefetch
        if hold is not None:
            read = 0
            for ok in hold.outcome.ok:
                if not ok:
                    break
                read += 1
            if hold.completed is not None:
                read = min(read, hold.completed)
            matched = max(matched, min(cap, hold.pos + read))
        return int(arrival.prompt.size) - matched * ps

    def _locked_prefix_tokens(self, arrival: Arrival) -> int:
        ps = self.config.page_size
        cap = pol.match_cap_pages(int(arrival.prompt.size), ps)
        return self.tree.locked_prefix_pages(arrival.keys[0][:cap]) * ps

    def admission_tokens(self, arrival: Arrival) -> int:
        """SGLang's `total_tokens` for the request (PrefillAdder.add_one_req): its prompt past the
        device prefix, its clipped decode and a page of alignment, plus its own unlocked device
        prefix, which the check locks and so takes out of the evictable tokens: the prompt past
        what running requests already lock (docs/controller.md#admission-budget)."""
        out = pol.reserved_new_tokens(int(arrival.output.size))
        return int(arrival.prompt.size) - self._locked_prefix_tokens(arrival) + out + self.config.page_size

    def pass_charge_tokens(self, arrival: Arrival) -> int:
        """What admitting the request takes from the pass's remaining tokens (SGLang's
        `PrefillBudget.reserve` plus the prefix it locks and the host hit it loads): its prompt
        past the locked prefix, page-rounded, a page of alignment and its clipped decode."""
        out = pol.reserved_new_tokens(int(arrival.output.size))
        ps = self.config.page_size
        return pol.paged_tokens(int(arrival.prompt.size), ps) - self._locked_prefix_tokens(arrival) + ps + out

    def room_tokens(self) -> int:
        """SGLang's `remaining_total` at the start of a pass: free and evictable device tokens
        less what running requests hold outside the tree and have yet to decode."""
        return (self.device.capacity - self.tree.protected_pages) * self.config.page_size - self.reserved_tokens

    def can_admit(self, arrival: Arrival, remaining_tokens: int) -> bool:
        """SGLang's memory check (`PrefillBudget.check_prefill`): strictly less than what remains."""
        return self.admission_tokens(arrival) < remaining_tokens

    def admit(self, arrival: Arrival) -> None:
        """The request leaves the queue alone: `admit_match` then `prefill_admitted`."""
        self.admit_match(arrival)
        self.prefill_admitted(arrival)

    def admit_match(self, arrival: Arrival) -> None:
        """The request leaves the queue: it matches the tree as it is now (what this pass's
        earlier admissions loaded back and locked, not what their prefills insert), its prefetch
        lands and its host part loads back; `prefill_admitted` runs its prefill after the pass, as
        SGLang runs the prefill of the batch a pass built (docs/oracle.md#scheduler-level-code).
        Its nodes stay locked until `finish`."""
        with self.lock:
            arrival.matched = self._prefill_match(arrival.prompt, arrival.n_pages, None, None, False, arrival=arrival)
            arrival.held = arrival.matched.held
            self.reserved_tokens += self._reserved_tokens(arrival)

    def allocate_admitted(self, arrivals: list[Arrival]) -> None:
        """The KV of a pass's admitted requests, taken before any of their prefills inserts, as
        SGLang's `alloc_paged_token_slots_extend` takes it for the batch: one eviction for the
        batch's demand (docs/controller.md#pass-allocation), then each request's pages in
        admission order. A page a later insert finds already in the tree stays taken until then,
        so the pass evicts as much as SGLang's does. The eviction is counted on the first request."""
        if not arrivals:
            return
        ps = self.config.page_size
        with self.lock:
            needs, extend = [], 0
            for arrival in arrivals:
                matched = arrival.matched
                if matched is None:
                    raise ValueError("allocate_admitted needs requests admit_match matched")
                pos, _ = self._compute_start(matched)
                trailing = matched.result.trailing_tokens
                needs.append(matched.n_pages - pos + (1 if trailing else 0))
                extend += (matched.n_pages - pos) * ps + trailing
            self._request_device_evicted = self._request_host_evicted = 0
            self._last_backup_bytes = self._last_l3_bytes = 0
            evict = pol.pass_allocation_eviction_pages(
                self.config.sglang_version, extend, len(arrivals), self.device.free, ps
            )
            taken: list[list[int]] = []
            try:
                if evict:
                    self._evict_device(evict)
                for n in needs:
                    taken.append(self._alloc_device(n) if n else [])
            except BaseException:
                for pages in taken:
                    self.device.give_many(pages)
                raise
            finally:
                first = arrivals[0].matched
                assert first is not None
                first.device_evicted += self._request_device_evicted
                first.host_evicted += self._request_host_evicted
                first.backup_bytes += self._last_backup_bytes
                first.l3_bytes += self._last_l3_bytes
            for arrival, pages in zip(arrivals, taken, strict=True):
                assert arrival.matched is not None
                arrival.matched.allocated = pages

    def prefill_admitted(self, arrival: Arrival) -> None:
        """The prefill of a request `admit_match` matched: compute past the match it recorded and insert
        (pages another request of its pass inserted meanwhile are duplicates, freed)."""
        matched, arrival.matched = arrival.matched, None
        if matched is None:
            raise ValueError("prefill_admitted needs a request admit_match matched")
        with self.lock:
            _, arrival.held, _, arrival.tail = self._prefill_compute(matched, False, hold_tail=True)

    def finish(self, arrival: Arrival, extra_key: str | None = None, cache_salt: str | None = None) -> None:
        with self.lock:
            self.reserved_tokens -= self._reserved_tokens(arrival)
            try:
                self._finish(
                    np.concatenate([arrival.prompt, arrival.output[:-1]]),
                    arrival.keys,
                    extra_key,
                    cache_salt,
                    arrival.result,
                    held_pages=arrival.tail,
                )
            finally:
                self.tree.unlock(arrival.held)
                arrival.held, arrival.tail = [], []
