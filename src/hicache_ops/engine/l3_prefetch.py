"""The L3 prefetch: L3 -> L2 for the span a request's device and host match leaves.

Issue (docs/controller.md#prefetch-threshold-and-revocation, #in-flight-limit,
#prefetch-host-allocation): the threshold, the in-flight limit, host allocation and the storage
query decide per version whether the read starts and for how many pages. Land (#stop-policies):
when the request is admitted, the stop policy decides how many arrived pages count; they join the
tree as host nodes. `prefetch()` is the operation alone: pull a prompt's pages into host memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hicache_ops.engine.parts import CacheParts, IssuedPrefetch
from hicache_ops.engine.planes import ReadOutcome
from hicache_ops.engine.results import PrefetchInfo, PrefillResult
from hicache_ops.engine.tree import Node, RadixTree, page_views
from hicache_ops.errors import InputError
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import as_token_array, page_keys
from hicache_ops.sglang.versions import V0_5_14


@dataclass(frozen=True)
class StopVerdict:
    """What an admission check makes of an issued prefetch at one instant."""

    stop: bool  # the check ends the prefetch now (the request may be admitted)
    arrived: int  # leading pages read by then (what counts if it stops)


def stop_verdict(
    policy: str, version: str, budget_s: float, hold: IssuedPrefetch, now: float, first_check_at: float | None
) -> StopVerdict:
    """The admission check's stop decision (docs/controller.md#stop-policies): a finished read
    ends at once; best_effort ends it at the first check with what has arrived; wait_complete
    waits for the last page; timeout ends it once the budget has run out, counted from the issue
    (0.5.14) or from the first check that found it unfinished (0.5.23)."""
    outcome, start = hold.outcome, hold.issued_at
    arrived = 0
    while arrived < len(outcome.ok) and outcome.ok[arrived] and start + outcome.done_at[arrived] <= now:
        arrived += 1
    finished = not outcome.done_at or start + max(outcome.done_at) <= now
    if finished or policy == "best_effort":
        return StopVerdict(True, arrived)
    if policy == "wait_complete":
        return StopVerdict(False, arrived)
    clock = start if pol.clock_starts_at_issue(version) else (now if first_check_at is None else first_check_at)
    return StopVerdict(now - clock > budget_s, arrived)


def transfer_seconds(pages: int, page_bytes: float, bandwidth_bytes_s: float | None, latency_s: float) -> float:
    """Modelled seconds an L3 transfer of `pages` pages takes: per batch of
    policy.STORAGE_BATCH_PAGES pages, `latency_s` plus its bytes / bandwidth (docs/controller.md#transfer-time)."""
    batches = -(-pages // pol.STORAGE_BATCH_PAGES)
    moved = pages * page_bytes / bandwidth_bytes_s if bandwidth_bytes_s else 0.0
    return batches * latency_s + moved


def modelled_done_at(
    done_at: list[float], nbytes: int, bandwidth_bytes_s: float | None, latency_s: float
) -> list[float]:
    """Per page, when it has arrived: the tier's own time, or later the modelled transfer (each
    batch of policy.STORAGE_BATCH_PAGES pages takes `latency_s` + its bytes / bandwidth, batches one
    after another, and a batch's pages count when it ends, as SGLang acknowledges progress per
    batch: docs/controller.md#transfer-time)."""
    n = len(done_at)
    if not n or (bandwidth_bytes_s is None and not latency_s):
        return done_at
    per_page = nbytes / n
    out, clock = list(done_at), 0.0
    for first in range(0, n, pol.STORAGE_BATCH_PAGES):
        last = min(first + pol.STORAGE_BATCH_PAGES, n)
        clock += latency_s + ((last - first) * per_page / bandwidth_bytes_s if bandwidth_bytes_s else 0.0)
        for i in range(first, last):
            out[i] = max(out[i], clock)
    return out


def prefetch_anchor(tree: RadixTree, anchor: Node | None, version: str) -> tuple[str, Node | None]:
    """SGLang's gate on the node a prefetch continues from: the last node of the local match
    (docs/controller.md#prefetch-anchor). Returns ("", None) when it is the root or backed up
    (the lookup chains from the prompt's own keys). Past a node with no host copy: 0.5.23 issues
    nothing (the reason, None); 0.5.14 walks up to the nearest backed-up ancestor and chains the
    lookup keys from it (the reason, that ancestor; the root: the chain starts unseeded), so the
    lookup asks for other keys than the prompt's and misses. `trace` and the engine both ask this."""
    if anchor is None or anchor is tree.root or anchor.host is not None:
        return "", None
    if version != V0_5_14:
        return (
            "the local match ends in a node with no host copy: 0.5.23 prefetches only past a backed-up node "
            "(or the root), so nothing is issued",
            None,
        )
    backed = anchor.parent
    while backed is not None and backed is not tree.root and backed.host is None:
        backed = backed.parent
    return (
        "the local match ends in a node with no host copy: 0.5.14 chains the lookup keys from the nearest "
        "backed-up ancestor, not from the prompt's own prefix, so the lookup asks for other keys",
        backed,
    )


@dataclass(frozen=True)
class PrefetchDecision:
    """Whether a prefetch goes on to the storage lookup, and if not, which rule refused it."""

    reason: str  # "" : go on to the lookup
    rule: str  # "", "anchor", "threshold", "no_l2" or "rate_limited"


def prefetch_decision(
    version: str,
    *,
    gate: str,
    considered_tokens: int,
    threshold: int,
    enable_l2: bool,
    in_flight_tokens: int,
    limit_tokens: int,
) -> PrefetchDecision:
    """SGLang's decision to look a request's unmatched span up in L3, in SGLang's order: 0.5.23's
    anchor gate (`gate`, from `prefetch_anchor`; 0.5.14 issues and misses instead), the threshold
    (docs/controller.md#prefetch-threshold-and-revocation), the host pool L3 reads stage through,
    the in-flight limit (#in-flight-limit). The engine and `trace` both ask it, with the
    per-request state passed in."""
    if gate and version != V0_5_14:
        return PrefetchDecision(gate, "anchor")
    if considered_tokens < threshold:
        return PrefetchDecision(f"below the prefetch threshold ({considered_tokens} < {threshold} tokens)", "threshold")
    if not enable_l2:
        return PrefetchDecision("no host pool: L3 reads stage through L2", "no_l2")
    if in_flight_tokens >= limit_tokens:
        return PrefetchDecision(pol.rate_limited_verdict(version, in_flight_tokens, limit_tokens), "rate_limited")
    return PrefetchDecision("", "")


@dataclass(frozen=True)
class LoneStop:
    """The stop policy on a prefetch whose first admission check comes `admission_s` after it
    was issued (one request at a time: `request()`, `prefill()`, `trace`)."""

    completed: int  # leading pages read by the deadline
    deadline_s: float  # after the issue (inf: wait_complete)
    elapsed_s: float  # when the last page arrived
    timeout_would_cut: bool


def lone_stop(policy: str, version: str, budget_s: float, admission_s: float, outcome: ReadOutcome) -> LoneStop:
    """docs/controller.md#stop-policies, #timeout-budget, for one request served alone."""
    deadline = pol.stop_deadline(policy, budget_s, admission_s, version)
    done = 0
    while done < len(outcome.ok) and outcome.ok[done] and outcome.done_at[done] <= deadline:
        done += 1
    elapsed = max(outcome.done_at) if outcome.done_at else 0.0
    cut = elapsed > pol.stop_deadline("timeout", budget_s, admission_s, version)
    return LoneStop(done, deadline, elapsed, cut)


class L3Prefetch(CacheParts):
    """TieredCache's L3 prefetch (a mixin: it uses the cache's config, tree, host pool and its
    allocation, L3 tier, stats, in-flight count and observer)."""

    def _fetch_to_host(
        self,
        anchor: Node,
        tree_keys: list[str],
        storage_keys: list[str],
        pos: int,
        end: int,
        result: PrefillResult,
        tokens: np.ndarray | None = None,
    ) -> list[Node]:
        """L3 -> L2 for one request at a time: issue the prefetch, then land it at once."""
        hold, _ = self._issue_prefetch(storage_keys, pos, end, result.prefetch, anchor=anchor, tokens=tokens)
        if hold is None:
            return []
        return self._land_prefetch(hold, anchor, tree_keys, storage_keys, result)

    def _issue_prefetch(
        self,
        storage_keys: list[str],
        pos: int,
        end: int,
        info: PrefetchInfo,
        *,
        anchor: Node | None = None,
        tokens: np.ndarray | None = None,
        now: float = 0.0,
    ) -> tuple[IssuedPrefetch | None, bool]:
        """Consider pages pos..end as SGLang does when it queues a request: the anchor gate,
        threshold, in-flight limit, host allocation and storage query per version; the read starts
        at `now` (the scheduler clock). Returns the issued prefetch (None: not issued;
        `info.reason` says why, naming the rule and version) and whether the outcome is one
        0.5.23 polls again for a waiting request (docs/controller.md#miss-re-query): refused by
        the in-flight limit, a storage hit below the threshold (none included), or no host room
        for the hit; a span below the threshold or an unbacked anchor issues no lookup and is not.
        `anchor`: the node the local match ends in; `tokens`: the prompt (0.5.14 re-chains the
        keys past an unbacked anchor)."""
        cfg, ps, version = self.config, self.config.page_size, self.config.sglang_version
        l3 = self.l3
        if l3 is None:
            raise InputError("this cache has no L3 tier to prefetch from.", hint="Start it with an L3 (--l3).")
        info.considered_tokens = info.requested_tokens = (end - pos) * ps
        info.threshold = pol.effective_prefetch_threshold(cfg.prefetch_threshold, ps)
        info.reason = ""
        threshold_pages = -(-info.threshold // ps)
        limit = pol.prefetch_limit_tokens(version, self.host.capacity * ps, cfg.device_pages * ps)
        gate, prior = prefetch_anchor(self.tree, anchor, version)
        if gate and version == V0_5_14 and tokens is not None:
            prior_key = prior.storage_keys[-1] if prior is not None and prior is not self.tree.root else None
            chained = page_keys(tokens[pos * ps : end * ps], ps, V0_5_14, prior=prior_key)
            storage_keys = list(storage_keys[:pos]) + chained
        info.anchor_note = gate
        decision = prefetch_decision(
            version,
            gate=gate,
            considered_tokens=info.considered_tokens,
            threshold=info.threshold,
            enable_l2=cfg.enable_l2,
            in_flight_tokens=self.in_flight_tokens,
            limit_tokens=limit,
        )
        info.reason = decision.reason
        if decision.rule == "rate_limited":
            info.rate_limited = True
            self.stats.prefetches_rate_limited += 1
        self._emit(
            "prefetch_decision",
            info=info,
            first_page=pos,
            capacity_tokens=limit,
            capacity_rule=pol.prefetch_limit_rule(version),
            host_free_pages=self.host.free,
        )
        if info.reason:
            return None, info.rate_limited
        host_pages: list[int] | None = None
        span = end - pos
        if not pol.allocates_host_at_hit(version):
            # 0.5.14 takes host pages for the whole span when it issues (evicting host nodes).
            host_pages = self._alloc_host(span, at_least=threshold_pages, prefetch=True)
            if host_pages is None:
                info.reason = (
                    f"the host pool cannot give the {span} pages requested, nor the {threshold_pages} of the threshold "
                    "(0.5.14 allocates the requested span when it issues)"
                )
                return None, False
            span = len(host_pages)
        found = l3.lookup(storage_keys[pos : pos + span])
        info.rank_hits = found.rank_pages
        self._emit(
            "storage_query",
            info=info,
            storage_keys=storage_keys[pos : pos + span],
            schemes=l3.schemes,
            lookup=found,
        )
        hit = found.pages
        info.hit_pages = hit
        if hit * ps < info.threshold:
            if host_pages:
                self.host.give_many(host_pages)
            if hit:
                self.stats.prefetches_revoked += 1
            info.reason = (
                f"revoked: the minimum storage hit over ranks is {hit * ps} tokens, below {info.threshold}"
                if hit
                else "no page of the suffix is in L3"
            )
            if gate:
                info.reason += f" ({gate})"
            return None, True
        if host_pages is None:
            # 0.5.23 allocates for the hit once it is known, partially if the threshold still fits.
            host_pages = self._alloc_host(hit, at_least=threshold_pages, prefetch=True)
            if host_pages is None:
                info.reason = (
                    f"the host pool cannot hold {hit} prefetched pages, nor the {threshold_pages} of the threshold "
                    f"(0.5.23 polls it again for a waiting request)"
                )
                return None, True
        else:
            self.host.give_many(host_pages[hit:])
        host_pages = host_pages[:hit]
        hit = len(host_pages)
        info.allocated_pages = hit
        info.issued = True
        self.stats.prefetches_issued += 1
        self.in_flight_tokens += info.requested_tokens
        outcome = l3.read(storage_keys[pos : pos + hit], host_pages)
        outcome.done_at = modelled_done_at(outcome.done_at, outcome.nbytes, cfg.l3_bandwidth_bytes_s, cfg.l3_latency_s)
        self._emit("storage_read", storage_keys=storage_keys[pos : pos + hit], host_pages=host_pages, outcome=outcome)
        info.bytes = outcome.nbytes
        info.size_mismatched_objects = len(outcome.size_mismatches)
        self.stats.bytes_l3_read += outcome.nbytes
        self.stats.l3_side_objects_read += outcome.side_objects
        self.stats.size_mismatched_objects += len(outcome.size_mismatches)
        return IssuedPrefetch(pos, info.requested_tokens, host_pages, outcome, issued_at=now), False

    def _release_in_flight(self, hold: IssuedPrefetch) -> None:
        """The prefetch has ended: its requested tokens leave the in-flight count (once)."""
        if hold.in_flight:
            self.in_flight_tokens -= hold.requested_tokens
            hold.in_flight = False

    def _prefetch_budget(self, hold: IssuedPrefetch) -> float:
        """The `timeout` stop policy's budget for an issued prefetch (docs/controller.md#timeout-budget)."""
        cfg = self.config
        hit_tokens = len(hold.host_pages) * cfg.page_size
        return cfg.timeout_budget.seconds(
            cfg.sglang_version, requested_tokens=hold.requested_tokens, hit_tokens=hit_tokens
        )

    def _land_prefetch(
        self,
        hold: IssuedPrefetch,
        anchor: Node,
        tree_keys: list[str],
        storage_keys: list[str],
        result: PrefillResult,
    ) -> list[Node]:
        """The request's admission ends its prefetch: the stop policy decides how many pages count,
        they join the tree as host nodes below `anchor`, and the request leaves the in-flight count."""
        cfg, version = self.config, self.config.sglang_version
        info, outcome, host_pages, pos = result.prefetch, hold.outcome, hold.host_pages, hold.pos
        self._release_in_flight(hold)
        hit = len(host_pages)
        result.bytes_read_from_l3 += outcome.nbytes
        info.budget_s = self._prefetch_budget(hold)
        info.elapsed_s = max(outcome.done_at) if outcome.done_at else 0.0
        if hold.completed is not None and hold.stopped_at is not None:
            # The concurrency model's admission check ended it (check_prefetch) on the scheduler clock.
            done = hold.completed
            info.deadline_s = hold.stopped_at - hold.issued_at
            info.timeout_would_cut = (
                hold.first_check_at is not None
                and hold.issued_at + info.elapsed_s
                > (hold.issued_at if pol.clock_starts_at_issue(version) else hold.first_check_at) + info.budget_s
            )
        else:
            lone = lone_stop(cfg.stop_policy, version, info.budget_s, cfg.admission_s, outcome)
            done, info.deadline_s, info.timeout_would_cut = (
                min(lone.completed, hit),
                lone.deadline_s,
                lone.timeout_would_cut,
            )
        info.completed_pages = done
        if done < hit:
            info.reason = (
                f"page {pos + done} could not be read from L3"
                if not outcome.ok[done]
                else f"{cfg.stop_policy} stopped waiting after {info.deadline_s:.3f}s with {done} of {hit} pages"
            )
        self.host.give_many(host_pages[done:])
        verified = outcome.verified[:done]
        info.mismatched_pages = len(verified) - sum(map(bool, verified))
        # strict=False: under pressure the two lengths differ; strict=True made tests/engine/test_oracle.py's
        # device_evicted cases differ from SGLang. Why they differ is for the engine's owner to settle.
        self._counted_mismatches.update(
            key for key, ok in zip(storage_keys[pos : pos + done], verified, strict=False) if not ok
        )
        result.mismatched_pages += info.mismatched_pages
        self._emit("stop_policy", info=info, policy=cfg.stop_policy, admission_s=cfg.admission_s)
        if not done:
            return []
        nodes, unused = self.tree.insert_host(anchor, tree_keys, storage_keys, pos, host_pages[:done])
        self.host.give_many(unused)
        if self._observer is not None:
            self._emit("insert", nodes=page_views(nodes))
        return nodes

    def prefetch(
        self,
        tokens: Sequence[int] | np.ndarray,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        *,
        observer: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> PrefillResult:
        """Pull a prompt's pages from L3 into the host pool only (no device load, no compute).

        The result's breakdown counts pages already on device or host as hits, fetched pages as
        storage hits and the rest as not cached (`computed` stays 0: nothing was prefilled).
        """
        arr = as_token_array(tokens, self.config.sglang_version)
        if arr.size == 0:
            raise InputError("the prompt is empty; send at least one token.")
        if self.l3 is None:
            raise InputError("this cache has no L3 tier to prefetch from.", hint="Start it with an L3 (--l3).")
        with self.lock:
            self.drain_l3_writes()
            self._observer = observer
            try:
                return self._prefetch_only(arr, extra_key, cache_salt)
            finally:
                self._observer = None

    def _prefetch_only(self, arr: np.ndarray, extra_key: str | None, cache_salt: str | None) -> PrefillResult:
        ps, tree = self.config.page_size, self.tree
        n_pages = arr.size // ps
        self._request_device_evicted = self._request_host_evicted = 0
        result = PrefillResult(prompt_tokens=int(arr.size), pages=n_pages, trailing_tokens=int(arr.size - n_pages * ps))
        tree_keys, storage_keys = self.keys_for(arr, extra_key, cache_salt)
        cap = pol.match_cap_pages(int(arr.size), ps)
        path = tree.match(tree_keys[:cap])
        on_device = [n for n in path if n.device is not None]
        off_device = [n for n in path if n.device is None]
        if self._observer is not None:
            self._emit(
                "match",
                tree_keys=tree_keys,
                storage_keys=storage_keys,
                device_nodes=page_views(on_device),
                host_nodes=page_views(off_device),
                extra_key=extra_key,
                cache_salt=cache_salt,
            )
        result.device_hit = sum(len(n.keys) for n in on_device) * ps
        result.host_hit = sum(len(n.keys) for n in off_device) * ps
        held = [path[-1]] if path else []
        tree.lock(held)
        t = time.perf_counter()
        try:
            pos = sum(len(n.keys) for n in path)
            anchor = path[-1] if path else tree.root
            nodes = (
                self._fetch_to_host(anchor, tree_keys, storage_keys, pos, cap, result, tokens=arr) if pos < cap else []
            )
        finally:
            tree.unlock(held)
        result.timings_ms["prefetch"] = (time.perf_counter() - t) * 1e3
        result.storage_hit = sum(len(n.keys) for n in nodes) * ps
        result.host_evicted_pages = self._request_host_evicted
        self.stats.storage_hit += result.storage_hit
        self.stats.mismatched_pages += result.mismatched_pages
        return result
