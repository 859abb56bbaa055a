"""`hicache trace write|read`: the write and read paths of one prompt, step by step.

The trace runs the real engine path (TieredCache.prefill) with an observer: each event of the
path becomes a step that says what it did, the state it changed, its time, and whether the
invariant it checks holds (PASS/FAIL), checked at that moment against the reference bytes, the
keys as SGLang computes them, and the Mooncake master. Reporting stops at the first failing step,
which names the likely causes. Three states that are easy to confuse — the backend exists, the
bytes moved, the prefix was reused — are separate steps here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from hicache_ops.commands.trace import dcp as dcp_view
from hicache_ops.commands.trace.side_pools import side_layout, side_lookup_step
from hicache_ops.commands.trace.tracer import FAIL, INFO, PASS, SKIP, Step, Tracer, _Stop
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import hash_page, namespace_seed

# --------------------------------------------------------------------------------------------
# Helpers over the engine's planes
# --------------------------------------------------------------------------------------------


def _bytes_plane(cache):
    plane = cache.plane
    return plane if hasattr(plane, "device_page_ok") else None


def _device_bad(cache, nodes_or_pages, keys) -> list[int]:
    """Device pages whose bytes differ from the reference (empty without a bytes plane)."""
    plane = _bytes_plane(cache)
    if plane is None:
        return []
    return [p for p, k in zip(nodes_or_pages, keys, strict=True) if not plane.device_page_ok(p, k)]


def _host_bad(cache, host_pages, keys) -> list[int]:
    plane = _bytes_plane(cache)
    if plane is None:
        return []
    return [
        p for p, k in zip(host_pages, keys, strict=True) if not all(plane.host_page_ok(r, p, k) for r in plane.ranks)
    ]


def _spec_keys(tokens, page_size, version, extra_key, cache_salt) -> list[str]:
    """Page keys recomputed page by page with the plain hashlib path (not the native loop)."""
    import numpy as np

    arr = np.asarray(tokens, dtype=np.uint64)
    prior = namespace_seed(version, extra_key, cache_salt)
    out = []
    for start in range(0, arr.size - arr.size % page_size, page_size):
        prior = hash_page(arr[start : start + page_size], prior, version)
        out.append(prior)
    return out


# --------------------------------------------------------------------------------------------
# The write path
# --------------------------------------------------------------------------------------------


def trace_write(cache, tokens, *, extra_key=None, cache_salt=None, on_step=None) -> list[Step]:
    """Trace one prompt from device slots to verified Mooncake objects."""
    t = Tracer(cache, on_step)
    cfg = cache.config
    seen: dict = {}

    def observe(event: str, data: dict) -> None:
        if t.failed:
            return
        if event == "match":
            seen["tree_keys"] = data["tree_keys"]
            local = len(data["device_nodes"]) + len(data["host_nodes"])
            if local:
                t.add(
                    "local state",
                    INFO,
                    f"{local} of {len(data['tree_keys'])} pages were already cached "
                    "(device or host); only the rest are computed",
                    detail={"device_pages": len(data["device_nodes"]), "host_pages": len(data["host_nodes"])},
                )
        elif event == "compute":
            pages, keys = data["device_pages"], data["storage_keys"]
            ps = cfg.page_size
            bad = _device_bad(cache, pages, keys)
            detail = {
                "device_pages": pages,
                "slots": [[(p + 1) * ps, (p + 2) * ps] for p in pages],
                "first_page": data["first_page"],
            }
            if bad:
                t.fail(
                    "compute",
                    f"reference KV written into {len(pages)} device pages, but {len(bad)} differ",
                    ["device pool corruption or a kernel bug"],
                    detail={**detail, "mismatched": bad},
                )
            t.add(
                "compute",
                PASS,
                f"allocated {len(pages)} device pages ({len(pages) * ps} slots) and wrote the reference KV",
                invariant="every device page equals its reference bytes",
                state="L1 holds the prompt's KV",
                detail=detail,
            )
        elif event == "write_policy":
            policy, threshold, path, due = data["policy"], data["threshold"], data["path"], data["due"]
            pending = [n for n in path if not n.backed_up]
            hits = sorted({n.hit_count for n in path})
            detail = {
                "policy": policy,
                "threshold_hits": threshold,
                "hit_counts": hits,
                "due_pages": len(due),
                "already_backed_up": len(path) - len(pending),
            }
            if pending and not due:
                why = (
                    "write_back copies a page to host only when it leaves the GPU, and nothing was evicted"
                    if policy == "write_back"
                    else f"{policy} backs a page up on hit {threshold}; these pages have {hits} hit(s)"
                )
                t.fail(
                    "write policy",
                    f"{policy}: no page is backed up now ({why})",
                    [
                        why,
                        "L3 gets a page only after its host backup: use write_through, or reuse the prefix again",
                        "an instance-local L2 hit is not yet a cross-instance hit",
                    ],
                    detail=detail,
                )
            t.add(
                "write policy",
                PASS,
                f"{policy}: {len(due)} page(s) due for backup"
                + (f", {detail['already_backed_up']} already backed up" if detail["already_backed_up"] else ""),
                invariant="pages reaching the policy's hit threshold are backed up",
                detail=detail,
            )
        elif event == "backup_failed":
            t.fail(
                "device to host",
                f"no host pages for {data['pages']} page(s): the host pool is full of pinned pages",
                ["host pool too small (--hicache-ratio / --hicache-size)", "prefetches or loads pin host pages"],
                detail=data,
            )
        elif event == "backup_host":
            nodes, hosts = data["nodes"], data["host_pages"]
            keys = [n.storage_key for n in nodes]
            bad = _host_bad(cache, hosts, keys)
            detail = {
                "device_pages": data["device_pages"],
                "host_pages": hosts,
                "bytes": data["bytes"],
                "layout": getattr(cache.plane, "layout", None),
            }
            if bad:
                t.fail(
                    "device to host",
                    f"{len(bad)} host page(s) differ from the device copy's reference",
                    ["a transfer kernel wrote the wrong host offsets for this layout"],
                    detail={**detail, "mismatched": bad},
                )
            t.add(
                "device to host",
                PASS,
                f"copied {len(nodes)} page(s), {data['bytes']} bytes, into host pages "
                f"{_short(hosts)} ({detail['layout'] or 'accounting'})",
                invariant="every host page equals its reference bytes",
                state="L2 holds a copy",
                detail=detail,
            )
        elif event == "backup_ack":
            nodes = data["nodes"]
            ok = all(n.backed_up for n in nodes)
            t.add(
                "backed-up ack",
                PASS if ok else FAIL,
                f"{len(nodes)} node(s) marked backed up after the copy completed",
                invariant="a node is marked backed up only after its copy is acknowledged",
                state="nodes: backed_up=True",
            )
        elif event == "l3_write":
            seen.setdefault("side", []).extend(o for o in data["outcome"].objects if "pool" in o)
            _write_l3_steps(t, cache, data, tokens, extra_key, cache_salt)

    try:
        result = cache.prefill(tokens, extra_key, cache_salt, observer=observe)
    except _Stop:
        return t.steps
    if t.failed:
        return t.steps
    if cache.l3 is None:
        t.add("L3", SKIP, "this cache has no L3 tier: the write path ends in host memory")
        return t.steps
    if not any(s.name == "batch_put_from" for s in t.steps):
        if result.stored_pages == result.pages:
            t.add("L3", INFO, "every page was already stored in L3 by an earlier write; nothing to put")
        else:
            t.add(
                "L3", FAIL, "no page reached L3", causes=["the host backup did not happen (see the write policy step)"]
            )
            return t.steps
    _verify_on_master(t, cache, cache.tree.pages_of(seen.get("tree_keys", [])), seen.get("side", []))
    return t.steps


def _short(items: list, n: int = 8) -> str:
    return str(items) if len(items) <= n else f"{items[:n]}... ({len(items)} in all)"


def _write_l3_steps(t: Tracer, cache, data: dict, tokens, extra_key, cache_salt) -> None:
    cfg = cache.config
    nodes, outcome = data["nodes"], data["outcome"]
    keys = [n.storage_key for n in nodes]
    # Page keys: recomputed with the plain hashlib path and compared with what the engine used.
    spec = _spec_keys(tokens, cfg.page_size, cfg.sglang_version, extra_key, cache_salt)
    first = nodes[0].depth
    expected = spec[first : first + len(nodes)]
    seed = namespace_seed(cfg.sglang_version, extra_key, cache_salt)
    detail = {"namespace_seed": seed, "first_page": first, "page_keys": keys}
    if keys != expected:
        t.fail(
            "page keys",
            "the page keys differ from SGLang's rule recomputed page by page",
            ["a namespace (extra_key/cache_salt) or version mismatch inside the engine"],
            detail=detail,
        )
    t.add(
        "page keys",
        PASS,
        f"{len(keys)} page key(s), chain seeded with {seed or 'nothing (no extra_key/cache_salt)'}",
        invariant=f"sha256(prior || tokens as u32 LE), SGLang {cfg.sglang_version}",
        detail=detail,
    )
    schemes = cache.l3.schemes
    per_rank = {
        f"tp{s.tp_rank}"
        + (f"/pp{s.pp_rank}" if s.pp_size > 1 else "")
        + (f"/dcp{s.dcp_rank}" if s.dcp_size > 1 else ""): {
            "prefix": s.prefix,
            "suffixes": s.suffixes,
            "writes": s.writes,
            "first_page": s.object_keys(keys[0]),
        }
        for s in schemes
    }
    pools = getattr(cache.l3, "pools", ())
    side = [o for o in outcome.objects if "pool" in o]
    if pools:
        for row, suffixes in zip(per_rank.values(), side_layout(schemes, pools), strict=True):
            row["side_pools"] = suffixes
        per_page: dict[int, list[str]] = {}
        for o in side:
            per_page.setdefault(first + o["page"], []).append(o["key"])
        rules = ", ".join(
            f"{p.name} {p.hit_policy}" + (" (the node's last page only)" if p.name == "mamba" else "") for p in pools
        )
        side_text = f" and {len(side)} side-pool object(s) ({rules})"
    else:
        per_page, side_text = {}, ""
    t.add(
        "object keys",
        PASS,
        f"{sum(len(s.suffixes) for s in schemes if s.writes) * len(keys)} KV object(s){side_text} over "
        f"{len(schemes)} rank(s), prefix {schemes[0].prefix or '(none)'}",
        invariant="{prefix}{page_key}{rank suffix}{_k|_v}, side pools {page_key}{pool suffix}, as SGLang's "
        "MooncakeStore "
        "names them",
        detail={"ranks": per_rank, **({"side_objects_by_page": per_page} if pools else {})},
    )
    if dcp_view.dcp_size_of(schemes) > 1:
        _dcp_step(t, cache, tokens, [n.depth for n in nodes], keys)
    objects = outcome.objects
    if objects:
        existed = [o["key"] for o in objects if o["existed"]]
        t.add(
            "batch_is_exist",
            PASS,
            f"{len(existed)} of {len(objects)} object(s) already existed and are skipped",
            invariant="only missing objects are put (put does not overwrite)",
            detail={"existing": existed},
        )
        codes = [o for o in objects if o["code"] not in (None, 0)]
        put = [
            {
                "key": o["key"],
                "ptr": hex(o["ptr"]),
                "size": o["size"],
                "code": o["code"],
                **({"pool": o["pool"]} if "pool" in o else {}),
            }
            for o in objects
            if o["code"] is not None
        ]
        if codes:
            t.fail(
                "batch_put_from",
                f"{len(codes)} of {len(put)} put(s) failed",
                [f"code {o['code']} for {o['key']}" for o in codes[:5]]
                + [
                    "-200 segment full: the master has no room (eviction is asynchronous, retry)",
                    "-900 RPC failure: the master died or is unreachable",
                ],
                detail={"objects": put},
            )
        t.add(
            "batch_put_from",
            PASS,
            f"{len(put)} object(s) put from registered host memory, {outcome.nbytes} bytes",
            invariant="every put returns 0; pointers and sizes come from the host pool's page buffer metadata",
            state="L3 holds the objects (in this client's segment)",
            detail={"objects": put},
        )


def _dcp_step(t: Tracer, cache, tokens, depths: list[int], keys: list[str]) -> None:
    """Which DCP rank holds which tokens of each page, and the object key its shard goes under."""
    table = dcp_view.shard_table(cache, tokens, depths, keys)
    # Shown, not checked here: each rank's host copy is checked against its shard of the reference
    # (device to host), and each object against that host copy (verify on master).
    t.add(
        "dcp shards",
        INFO,
        dcp_view.shard_summary(cache),
        detail={"dcp_size": dcp_view.dcp_size_of(cache.l3.schemes), "dcp_pages": table},
    )


def _verify_on_master(t: Tracer, cache, nodes, side: Sequence[dict] = ()) -> None:
    """Every expected object of the prompt's pages is on the master with the host copy's bytes
    (side-pool objects: with their reference bytes)."""
    from hicache_ops.engine.reference import reference_side_object

    store = cache.l3.store
    expected, sources, shard_of = [], [], {}
    for scheme in cache.l3.schemes:
        if not scheme.writes:
            continue
        pools = cache.plane.ranks[scheme.tp_rank]
        for node in nodes:
            for i, key in enumerate(scheme.object_keys(node.storage_key)):
                expected.append(key)
                sources.append((pools, node, i))
                shard_of[key] = (scheme.dcp_rank, node.depth)
    exists = store.batch_is_exist(expected)
    missing = [k for k, e in zip(expected, exists, strict=True) if not e]
    if missing:
        shards = sorted({shard_of[k] for k in missing}) if dcp_view.dcp_size_of(cache.l3.schemes) > 1 else []
        where = "; ".join(f"DCP rank {d}'s object of page {p}" for d, p in shards[:5])
        t.fail(
            "verify on master",
            f"{len(missing)} of {len(expected)} expected object(s) are not on the master"
            + (f" ({where})" if where else ""),
            [
                "the writing client closed or died (objects live in its segment)",
                "evicted under memory pressure",
                "removed by someone",
            ],
            detail={"missing": missing[:20]},
        )
    differ = []
    for key, (pools, node, i) in zip(expected, sources, strict=True):
        if node.host_page < 0:
            continue
        piece = pools.host_layout.page_objects(node.host_page)[i]
        want = ctypes.string_at(pools.host.data_ptr() + piece.offset, piece.size)
        if store.get(key) != want:
            differ.append(key)
    side_keys = [o["key"] for o in side]
    for o, present in zip(side, store.batch_is_exist(side_keys) if side_keys else [], strict=True):
        if not present:
            missing.append(o["key"])
        elif store.get(o["key"]) != reference_side_object(o["page_key"], o["suffix"], o["size"]).tobytes():
            differ.append(o["key"])
    expected += side_keys
    if missing:
        t.fail(
            "verify on master",
            f"{len(missing)} of {len(expected)} expected object(s) are not on the master",
            [
                "the writing client closed or died (objects live in its segment)",
                "evicted under memory pressure",
                "removed by someone",
            ],
            detail={"missing": missing[:20]},
        )
    if differ:
        t.fail(
            "verify on master",
            f"{len(differ)} object(s) hold bytes other than the reference",
            ["an older object under the same key (put never overwrites)", "a writer with another host layout or dtype"],
            detail={"differ": differ[:20]},
        )
    t.add(
        "verify on master",
        PASS,
        f"all {len(expected)} object(s) exist and their bytes equal the reference",
        invariant="every expected object exists on the master with the reference bytes",
    )


# --------------------------------------------------------------------------------------------
# The read path
# --------------------------------------------------------------------------------------------


def trace_read(cache, tokens, *, extra_key=None, cache_salt=None, on_step=None, diagnose=None) -> list[Step]:
    """Trace one prompt from the local match through L3 to verified device bytes.

    `diagnose()` may return likely causes when L3 misses (the live key diff against the master).
    """
    t = Tracer(cache, on_step)
    cfg = cache.config
    ps = cfg.page_size
    state: dict = {"loads": []}

    def observe(event: str, data: dict) -> None:
        if t.failed:
            return
        if event == "match":
            d, h, n = len(data["device_nodes"]), len(data["host_nodes"]), len(data["tree_keys"])
            state["pages"] = n
            cap = pol.match_cap_pages(len(tokens), ps)
            detail = {
                "pages": n,
                "device_pages": d,
                "host_pages": h,
                "trailing_tokens": len(tokens) - n * ps,
                "match_cap_pages": cap,
            }
            if cap and d == cap:
                t.add(
                    "local match",
                    INFO,
                    f"all {cap} pages a match may cover (input length - 1) are on the device: "
                    "served from L1, L3 is not consulted",
                    detail=detail,
                    causes=["flush L1/L2 first (POST /flush_cache, or --flush) to trace the L3 path"],
                )
                raise _Stop()
            where = "none" if not d and not h else f"device {d}, host {h}"
            t.add(
                "local match",
                PASS,
                f"local match: {where} of {n} pages",
                detail=detail,
                invariant="device pages form a prefix, host pages continue it",
            )
        elif event == "load_back" and "prefetch" not in state:
            state["loads"].append(data)  # a local host hit, reported with the load-back step
        elif event == "prefetch_decision":
            info = data["info"]
            state["prefetch"] = True
            state["first_page"] = data["first_page"]
            detail = {
                "considered_tokens": info.considered_tokens,
                "threshold": info.threshold,
                "first_page": data["first_page"],
                "host_free_pages": data["host_free_pages"],
                "capacity_tokens": data["capacity_tokens"],
                "capacity_rule": data["capacity_rule"],
                "retry_rule": pol.retry_rule(cfg.sglang_version),
                "budget_rule": pol.budget_rule(cfg.sglang_version),
                "page_aligned": True,
            }
            if info.reason:
                t.fail(
                    "prefetch decision",
                    f"not issued: {info.reason}",
                    [
                        "SGLang prefetches only suffixes of at least max(prefetch_threshold, page_size) = "
                        f"{info.threshold} tokens",
                        "lower extra-config prefetch_threshold, or send a longer prompt",
                    ],
                    detail=detail,
                )
            t.add(
                "prefetch decision",
                PASS,
                f"{info.considered_tokens} page-aligned tokens to look up (threshold {info.threshold}); "
                f"SGLang admits prefetches while fewer than {data['capacity_tokens']} requested tokens are in flight "
                f"({data['capacity_rule']}); rate limited: {pol.retry_rule(cfg.sglang_version)}; "
                f"timeout budget {pol.budget_rule(cfg.sglang_version)}",
                invariant="suffix >= max(prefetch_threshold, page_size)",
                detail=detail,
            )
        elif event == "storage_query":
            info = data["info"]
            keys = data["storage_keys"]
            found = data["lookup"]
            hit = found.kv_pages
            detail = {
                "rank_hits": info.rank_hits,
                "contiguous_pages": hit,
                "queried_pages": len(keys),
                "first_query_keys": data["schemes"][0].object_keys(keys[0]) if keys else [],
            }
            first = state.get("first_page", 0)
            dcp = dcp_view.dcp_size_of(data["schemes"])
            if dcp > 1:
                t.add(
                    "dcp shards",
                    INFO,
                    dcp_view.shard_summary(cache),
                    detail={
                        "dcp_size": dcp,
                        "dcp_pages": dcp_view.shard_table(cache, tokens, list(range(first, first + len(keys))), keys),
                    },
                )
            if getattr(cache.l3, "pools", ()):
                side_lookup_step(t, cache, keys, found, info, detail, diagnose)
                return
            if hit < len(keys):
                causes = diagnose() if diagnose else []
                named, shards, shard_causes = dcp_view.explain_missing(data["schemes"], info.rank_hits, keys, first)
                if shards:
                    detail["missing_shards"] = shards
                    causes = shard_causes + causes
                if hit * ps < info.threshold:
                    t.fail(
                        "batch_exists",
                        f"L3 holds {hit} contiguous page(s) of {len(keys)} over all ranks "
                        f"(per rank {info.rank_hits}): below the threshold, the prefetch is revoked{named}",
                        causes
                        or [
                            "the pages were never written (write policy)",
                            "another namespace, model prefix, rank or version",
                        ],
                        detail=detail,
                    )
                t.fail(
                    "batch_exists",
                    f"the prefix stops after {hit} of {len(keys)} pages (per rank {info.rank_hits}){named}",
                    causes or ["an object of the next page is missing"],
                    detail=detail,
                )
            t.add(
                "batch_exists",
                PASS,
                f"all {len(keys)} pages are in L3 on every rank ({info.rank_hits})",
                invariant="the contiguous prefix whose objects ALL exist, minimum over ranks",
                detail=detail,
            )
        elif event == "storage_read":
            outcome, hosts = data["outcome"], data["host_pages"]
            failed = [i for i, ok in enumerate(outcome.ok) if not ok]
            corrupt = [i for i, (ok, v) in enumerate(zip(outcome.ok, outcome.verified, strict=True)) if ok and not v]
            detail = {
                "host_pages": hosts,
                "bytes": outcome.nbytes,
                "per_page_ok": outcome.ok,
                "done_at_s": [round(x, 6) for x in outcome.done_at],
                "size_mismatched_objects": len(outcome.size_mismatches),
                "size_mismatches": outcome.size_mismatches[:5],
            }
            if outcome.side_failures:
                detail["side_failures"] = outcome.side_failures[:10]
                first = outcome.side_failures[0]
                if not first["why"].startswith("bytes"):
                    t.fail(
                        "batch_get_into",
                        f"side pool {first['pool']}: object {first['key']} of page {first['page']} "
                        f"failed to read ({first['why']})",
                        ["the object disappeared between batch_exists_v2 and the read", "a lease or RPC failure"],
                        detail=detail,
                    )
                t.fail(
                    "batch_get_into",
                    f"side pool {first['pool']}: object {first['key']} of page {first['page']} "
                    "holds bytes other than its reference",
                    ["a corrupted or stale side object under the right key", "a writer with another side-pool shape"],
                    detail=detail,
                )
            if failed:
                # the live diff names a present object's segment that this host cannot reach (another host's)
                located = diagnose() if diagnose else []
                t.fail(
                    "batch_get_into",
                    f"{len(failed)} page(s) failed to read (an object came back with <= 0 bytes)",
                    located
                    + [
                        "the object disappeared between batch_exists and the read (its segment's client left)",
                        "a lease or RPC failure",
                    ],
                    detail={**detail, "failed_pages": failed},
                )
            if corrupt:
                causes = [
                    "a corrupted or stale object under the right key",
                    "the writer used another host layout, dtype or model",
                ]
                if outcome.size_mismatches:
                    first = outcome.size_mismatches[0]
                    causes.insert(
                        0,
                        f"{len(outcome.size_mismatches)} object(s) hold a different byte count than this "
                        f"deployment's pages ({first['read']} vs {first['expected']} bytes): another dtype "
                        "(fp8 vs bf16), head count or page size wrote under the same keys",
                    )
                t.fail(
                    "batch_get_into",
                    f"{len(corrupt)} page(s) arrived but their bytes differ from the reference "
                    f"(first: page {corrupt[0]})",
                    causes,
                    detail={**detail, "corrupt_pages": corrupt, "corrupt_page_count": len(corrupt)},
                )
            side_read = f" and {outcome.side_objects} side-pool object(s)" if outcome.side_objects else ""
            t.add(
                "batch_get_into",
                PASS,
                f"read {len(hosts)} page(s){side_read}, {outcome.nbytes} bytes, into host pages {_short(hosts)}; "
                "bytes verified",
                invariant="every object read > 0 bytes and each page equals its reference",
                state="L2 holds the pages",
                detail=detail,
            )
        elif event == "stop_policy":
            info = data["info"]
            detail = {
                "policy": data["policy"],
                "budget_s": info.budget_s,
                "deadline_s": info.deadline_s,
                "admission_s": data["admission_s"],
                "elapsed_s": info.elapsed_s,
                "hit_pages": info.hit_pages,
                "completed_pages": info.completed_pages,
                "timeout_would_cut": info.timeout_would_cut,
            }
            if info.completed_pages < info.hit_pages:
                t.fail(
                    "stop policy",
                    f"{data['policy']} stopped waiting at {info.deadline_s:.3f}s: "
                    f"{info.completed_pages} of {info.hit_pages} pages arrived in time",
                    [
                        "L3 reads slower than the budget (network, store load)",
                        "best_effort takes only what arrived by admission; timeout waits up to its budget, "
                        + pol.budget_rule(cfg.sglang_version),
                        "wait_complete never cuts",
                    ],
                    detail=detail,
                )
            t.add(
                "stop policy",
                PASS,
                f"{data['policy']}: all {info.hit_pages} pages arrived in {info.elapsed_s:.3f}s "
                f"(timeout budget {info.budget_s:.3f}s, {pol.budget_rule(cfg.sglang_version)}"
                f"{'; timeout would cut' if info.timeout_would_cut else ''})",
                invariant="pages completed before the policy's deadline",
                detail=detail,
            )
        elif event == "insert":
            nodes = data["nodes"]
            t.add(
                "insert",
                PASS,
                f"{len(nodes)} node(s) inserted into the tree on host pages {_short([n.host_page for n in nodes])}",
                invariant="prefetched pages join the tree as backed-up host nodes",
                state="tree: host-resident nodes",
                detail={"first_page": nodes[0].depth if nodes else None},
            )
        elif event == "load_back":
            state["loads"].append(data)

    try:
        result = cache.prefill(tokens, extra_key, cache_salt, observer=observe)
    except _Stop:
        return t.steps
    if t.failed:
        return t.steps
    loads = state["loads"]
    if loads:
        loaded = [d for d in loads if d["load"]]
        recomputed = [d for d in loads if not d["load"]]
        detail = {
            "loaded_tokens": sum(d["tokens"] for d in loaded),
            "recomputed_tokens": sum(d["tokens"] for d in recomputed),
            "threshold": cfg.load_back_threshold,
        }
        if recomputed and not loaded:
            t.add(
                "load back",
                FAIL,
                f"{detail['recomputed_tokens']} host-hit tokens were recomputed, not loaded "
                f"(below load_back_threshold {cfg.load_back_threshold})",
                detail=detail,
                causes=["a host hit shorter than load_back_threshold is cheaper to recompute"],
            )
            return t.steps
        t.add(
            "load back",
            PASS,
            f"loaded {detail['loaded_tokens']} tokens from host to device"
            + (f", recomputed {detail['recomputed_tokens']}" if recomputed else ""),
            invariant=f"host hits >= {cfg.load_back_threshold} tokens are loaded back",
            state="L1 holds the pages",
            detail=detail,
        )
    elif "prefetch" not in state and result.cached == 0:
        t.add("load back", SKIP, "nothing to load: no page was found locally or in L3")
    bad = result.mismatched_pages
    t.add(
        "device bytes",
        PASS if not bad else FAIL,
        f"{result.cached} cached tokens (device {result.device_hit}, host {result.host_hit}, L3 {result.storage_hit}), "
        f"{result.computed} computed; {bad} mismatched page(s)",
        invariant="the prefix was reused: device bytes equal the reference",
        detail=result.to_json(),
        causes=["a corrupted copy along the path"] if bad else [],
    )
    return t.steps
