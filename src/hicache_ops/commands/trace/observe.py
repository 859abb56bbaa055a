"""The read path of one prompt, observed without changing the cache: what a diagnosis may run.

`trace_read` (steps.py) runs the real request path, which prefills what misses and, under
write_through, writes it to L3: tracing a never-written prompt would write it, and the next trace
would find it local. `observe_read` takes the same decisions with the same rules and reports them
under the same step names, but only looks: the tree match without touching LRU order, the
prefetch threshold, `batch_exists` on L3, and a scratch `batch_get_into` into free host pages that
are verified against the reference and given back at once (nothing joins the tree, nothing is
computed, inserted, written or backed up). Running it twice gives the same steps.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np

from hicache_ops.commands.trace import dcp as dcp_view
from hicache_ops.commands.trace.side_pools import side_lookup_step
from hicache_ops.commands.trace.steps import _short
from hicache_ops.commands.trace.tracer import FAIL, INFO, PASS, SKIP, Step, Tracer, _Stop
from hicache_ops.engine.l3_prefetch import lone_stop, modelled_done_at, prefetch_anchor, prefetch_decision
from hicache_ops.sglang import policy as pol


def observe_read(
    cache, tokens, *, extra_key=None, cache_salt=None, on_step=None, diagnose: Callable[[], list[str]] | None = None
) -> list[Step]:
    t = Tracer(cache, on_step)
    cfg = cache.config
    ps = cfg.page_size
    with cache.lock:
        arr = np.asarray(tokens, dtype=np.uint64)
        tree_keys, storage_keys = cache.keys_for(arr, extra_key, cache_salt)
        n = len(tree_keys)
        # What a match would find, without splitting nodes or stamping LRU order; SGLang matches
        # at most input length - 1 tokens (docs/controller.md#match-cap).
        device, local, _ = cache.tree.local_match(tree_keys)
        cap = pol.match_cap_pages(len(tokens), ps)
        local = min(local, cap)
        device = min(device, local)
        host = local - device
        detail = {
            "pages": n,
            "device_pages": device,
            "host_pages": host,
            "match_cap_pages": cap,
            "trailing_tokens": len(tokens) - n * ps,
            "read_only": True,
        }
        if cap and local == cap:
            t.add(
                "local match",
                INFO,
                f"all {cap} matchable pages are local (device {device}, host {host}): served "
                "from L1/L2, L3 is not consulted",
                detail=detail,
                causes=["flush L1/L2 first (POST /flush_cache, or --flush) to trace the L3 path"],
            )
            return t.steps
        where = "none" if not local else f"device {device}, host {host}"
        t.add(
            "local match",
            PASS,
            f"local match: {where} of {n} pages",
            detail=detail,
            invariant="device pages form a prefix, host pages continue it",
        )

        pos = local
        considered = (cap - pos) * ps
        threshold = pol.effective_prefetch_threshold(cfg.prefetch_threshold, ps)
        limit = pol.prefetch_limit_tokens(cfg.sglang_version, cache.host.capacity * ps, cfg.device_pages * ps)
        detail = {
            "considered_tokens": considered,
            "threshold": threshold,
            "first_page": pos,
            "host_free_pages": cache.host.free,
            "page_aligned": True,
        }
        if cache.l3 is None:
            t.add(
                "prefetch decision",
                FAIL,
                "this instance has no L3 tier",
                detail=detail,
                causes=["start the serve with --l3"],
            )
            return t.steps
        _, _, anchor = cache.tree.local_match(tree_keys[:cap])
        gate, _ = prefetch_anchor(cache.tree, anchor, cfg.sglang_version)
        decision = prefetch_decision(
            cfg.sglang_version,
            gate=gate,
            considered_tokens=considered,
            threshold=threshold,
            enable_l2=cfg.enable_l2,
            in_flight_tokens=cache.in_flight_tokens,
            limit_tokens=limit,
        )
        if decision.rule in ("threshold", "no_l2", "rate_limited"):
            causes = {
                "threshold": [
                    f"SGLang prefetches only suffixes of at least max(prefetch_threshold, page_size) = {threshold} "
                    "tokens",
                    "lower extra-config prefetch_threshold, or send a longer prompt",
                ],
                "no_l2": ["L3 reads stage through the host pool: start the serve with one"],
                "rate_limited": ["prefetches in flight hold the limit; they end when their requests are admitted"],
            }[decision.rule]
            t.add("prefetch decision", FAIL, f"not issued: {decision.reason}", detail=detail, causes=causes)
            return t.steps
        if gate:
            t.add(
                "prefetch decision",
                FAIL,
                f"no L3 hit: {gate}",
                detail={**detail, "anchor_backed_up": False},
                causes=[
                    "the device prefix was computed here without a host copy (write_back, "
                    "write_through_selective below its hit threshold, or a failed backup)",
                    "use write_through on this instance, or flush L1/L2 so the match starts at the root",
                ],
            )
            return t.steps
        t.add(
            "prefetch decision",
            PASS,
            f"{considered} page-aligned tokens to look up (threshold {threshold})",
            invariant="suffix >= max(prefetch_threshold, page_size)",
            detail=detail,
        )

        suffix = storage_keys[pos:cap]
        found = cache.l3.lookup(suffix)
        rank_hits = found.rank_pages
        hit = found.kv_pages
        detail = {
            "rank_hits": rank_hits,
            "contiguous_pages": hit,
            "queried_pages": len(suffix),
            "first_query_keys": cache.l3.schemes[0].object_keys(suffix[0]) if suffix else [],
        }
        if dcp_view.dcp_size_of(cache.l3.schemes) > 1:
            t.add(
                "dcp shards",
                INFO,
                dcp_view.shard_summary(cache),
                detail={
                    "dcp_size": dcp_view.dcp_size_of(cache.l3.schemes),
                    "dcp_pages": dcp_view.shard_table(cache, tokens, list(range(pos, cap)), suffix),
                },
            )
        if getattr(cache.l3, "pools", ()):
            info = types.SimpleNamespace(rank_hits=rank_hits, threshold=threshold)
            try:
                side_lookup_step(t, cache, suffix, found, info, detail, diagnose)
            except _Stop:
                return t.steps
            hit = found.pages
        elif hit < len(suffix):
            causes = diagnose() if diagnose else []
            named, shards, shard_causes = dcp_view.explain_missing(cache.l3.schemes, rank_hits, suffix, pos)
            if shards:
                detail["missing_shards"] = shards
                causes = shard_causes + causes
            if hit * ps < threshold:
                t.add(
                    "batch_exists",
                    FAIL,
                    f"L3 holds {hit} contiguous page(s) of {len(suffix)} over all ranks "
                    f"(per rank {rank_hits}): below the threshold, the prefetch is revoked{named}",
                    detail=detail,
                    causes=causes
                    or [
                        "the pages were never written (write policy)",
                        "another namespace, model prefix, rank or version",
                    ],
                )
                return t.steps
            t.add(
                "batch_exists",
                FAIL,
                f"the prefix stops after {hit} of {len(suffix)} pages (per rank {rank_hits}){named}",
                detail=detail,
                causes=causes or ["an object of the next page is missing"],
            )
            return t.steps
        else:
            t.add(
                "batch_exists",
                PASS,
                f"all {len(suffix)} pages are in L3 on every rank ({rank_hits})",
                invariant="the contiguous prefix whose objects ALL exist, minimum over ranks",
                detail=detail,
            )

        scratch_pages = min(hit, cache.host.free)
        if scratch_pages == 0:
            t.add(
                "batch_get_into",
                SKIP,
                "no free host page to read into without evicting: the read is not tried",
                detail={"host_free_pages": 0},
            )
            return t.steps
        scratch = cache.host.take_many(scratch_pages)
        try:
            outcome = cache.l3.read(suffix[:scratch_pages], scratch)
            # The engine's modelled transfer time, as the request path applies it (docs/controller.md#transfer-time).
            outcome.done_at = modelled_done_at(
                outcome.done_at, outcome.nbytes, cfg.l3_bandwidth_bytes_s, cfg.l3_latency_s
            )
        finally:
            cache.host.give_many(scratch)
    failed = [i for i, ok in enumerate(outcome.ok) if not ok]
    corrupt = [i for i, (ok, v) in enumerate(zip(outcome.ok, outcome.verified, strict=True)) if ok and not v]
    detail = {
        "scratch_host_pages": scratch,
        "released": True,
        "bytes": outcome.nbytes,
        "per_page_ok": outcome.ok,
        "done_at_s": [round(x, 6) for x in outcome.done_at],
        "size_mismatched_objects": len(outcome.size_mismatches),
        "size_mismatches": outcome.size_mismatches[:5],
        "pages_read": scratch_pages,
        "hit_pages": hit,
    }
    if failed:
        t.add(
            "batch_get_into",
            FAIL,
            f"{len(failed)} page(s) failed to read (an object came back with <= 0 bytes)",
            detail={**detail, "failed_pages": failed},
            causes=[
                "the object disappeared between batch_exists and the read (its segment's client left)",
                "a lease or RPC failure",
            ],
        )
        return t.steps
    if corrupt:
        causes = [
            "a corrupted or stale object under the right key",
            "the writer used another host layout, dtype or model",
        ]
        if outcome.size_mismatches:
            first = outcome.size_mismatches[0]
            causes.insert(
                0,
                f"{len(outcome.size_mismatches)} object(s) hold a different byte count than this deployment's "
                f"pages ({first['read']} vs {first['expected']} bytes): another dtype (fp8 vs bf16), head count "
                "or page size wrote under the same keys",
            )
        t.add(
            "batch_get_into",
            FAIL,
            f"{len(corrupt)} page(s) arrived but their bytes differ from the reference (first: page {corrupt[0]})",
            detail={**detail, "corrupt_pages": corrupt, "corrupt_page_count": len(corrupt)},
            causes=causes,
        )
        return t.steps
    t.add(
        "batch_get_into",
        PASS,
        f"read {scratch_pages} page(s), {outcome.nbytes} bytes, into scratch host pages "
        f"{_short(scratch)}, verified and released",
        invariant="every object read > 0 bytes and each page equals its reference",
        detail=detail,
    )

    budget = cfg.timeout_budget.seconds(cfg.sglang_version, requested_tokens=considered, hit_tokens=hit * ps)
    stop = lone_stop(cfg.stop_policy, cfg.sglang_version, budget, cfg.admission_s, outcome)
    done, deadline, elapsed = stop.completed, stop.deadline_s, stop.elapsed_s
    detail = {
        "policy": cfg.stop_policy,
        "budget_s": budget,
        "deadline_s": None if deadline == float("inf") else deadline,
        "admission_s": cfg.admission_s,
        "elapsed_s": elapsed,
        "hit_pages": scratch_pages,
        "completed_pages": done,
        "timeout_would_cut": stop.timeout_would_cut,
    }
    if done < scratch_pages:
        t.add(
            "stop policy",
            FAIL,
            f"{cfg.stop_policy} would stop waiting at {deadline:.3f}s: {done} of {scratch_pages} pages arrived in time",
            detail=detail,
            causes=[
                "L3 reads slower than the budget (network, store load)",
                "best_effort takes only what arrived by admission; timeout waits up to "
                "prefetch_timeout_base + per_ki_token * tokens/1024",
                "wait_complete never cuts",
            ],
        )
        return t.steps
    t.add(
        "stop policy",
        PASS,
        f"{cfg.stop_policy}: all {scratch_pages} pages arrived in {elapsed:.3f}s (timeout budget {budget:.3f}s)",
        invariant="pages completed before the policy's deadline",
        detail=detail,
    )

    local_host = host * ps
    if 0 < local_host + done * ps < cfg.load_back_threshold:
        t.add(
            "load back",
            FAIL,
            f"a host hit of {local_host + done * ps} tokens would be recomputed, not loaded "
            f"(below load_back_threshold {cfg.load_back_threshold})",
            detail={"threshold": cfg.load_back_threshold},
            causes=["a host hit shorter than load_back_threshold is cheaper to recompute"],
        )
        return t.steps
    t.add(
        "verdict",
        PASS,
        f"a request would reuse {device} device, {host} host and {done} L3 page(s) of {n}",
        detail={"device_pages": device, "host_pages": host, "storage_pages": done, "pages": n, "read_only": True},
    )
    return t.steps


def observe_write(cache, tokens, *, extra_key=None, cache_salt=None, on_step=None) -> list[Step]:
    """What the write path would do for this prompt now, without doing it: the local state, the
    write policy's decision (hit counts as this request would leave them) and which objects L3
    already holds. Nothing is computed, backed up or put."""
    t = Tracer(cache, on_step)
    cfg = cache.config
    with cache.lock:
        arr = np.asarray(tokens, dtype=np.uint64)
        tree_keys, storage_keys = cache.keys_for(arr, extra_key, cache_salt)
        n = len(tree_keys)
        cached = [page for page in cache.tree.pages_of(tree_keys) if page.device_page >= 0 or page.host_page >= 0]
        if cached:
            on_device = sum(1 for page in cached if page.device_page >= 0)
            t.add(
                "local state",
                INFO,
                f"{len(cached)} of {n} pages are already cached (device or host); only the rest would be computed",
                detail={"device_pages": on_device, "host_pages": len(cached) - on_device, "read_only": True},
            )
        # After this request: cached pages one more hit, computed pages their first.
        hits_after = [page.hit_count + 1 for page in cached] + [1] * (n - len(cached))
        pending = [
            h
            for page, h in zip(cached + [None] * (n - len(cached)), hits_after, strict=True)
            if page is None or not page.backed_up
        ]
        threshold = pol.write_through_threshold(cfg.write_policy)
        due = [h for h in pending if threshold is not None and h >= threshold]
        detail = {
            "policy": cfg.write_policy,
            "threshold_hits": threshold,
            "hit_counts": sorted(set(hits_after)),
            "due_pages": len(due),
            "already_backed_up": n - len(pending),
            "read_only": True,
        }
        if pending and not due:
            why = (
                "write_back copies a page to host only when it leaves the GPU, and nothing would be evicted"
                if cfg.write_policy == "write_back"
                else f"{cfg.write_policy} backs a page up on hit {threshold}; these pages would have "
                f"{sorted(set(pending))} hit(s)"
            )
            t.add(
                "write policy",
                FAIL,
                f"{cfg.write_policy}: no page would be backed up now ({why})",
                detail=detail,
                causes=[
                    why,
                    "L3 gets a page only after its host backup: use write_through, or reuse the prefix again",
                    "an instance-local L2 hit is not yet a cross-instance hit",
                ],
            )
            return t.steps
        t.add(
            "write policy",
            PASS,
            f"{cfg.write_policy}: {len(due)} page(s) would be due for backup"
            + (f", {detail['already_backed_up']} already backed up" if detail["already_backed_up"] else ""),
            invariant="pages reaching the policy's hit threshold are backed up",
            detail=detail,
        )
        if cache.l3 is None:
            t.add("L3", SKIP, "this cache has no L3 tier: the write path ends in host memory")
            return t.steps
        rank_hits = cache.l3.contiguous_hits(storage_keys)
    stored = min(rank_hits) if rank_hits else 0
    t.add(
        "L3",
        INFO,
        f"L3 already holds {stored} of {n} pages on every rank (per rank {rank_hits}); a write would put the rest",
        detail={"rank_hits": rank_hits, "pages": n, "read_only": True},
    )
    return t.steps
