"""The L3 lookup step of a trace when the engine carries side pools (docs/side-pools.md#side-objects-in-the-engine):
`batch_exists_v2`'s loadable prefix, and which pool, page and rule end it before the KV prefix."""

from __future__ import annotations

from hicache_ops.commands.trace.tracer import PASS, Tracer
from hicache_ops.engine.planes import side_layout

__all__ = ["side_layout", "side_lookup_step", "side_pool_cut"]


def side_pool_cut(l3, keys: list[str], found) -> dict | None:
    """When side pools end the loadable prefix before the KV prefix: which pool, which page, which
    rule, and the prefix left (docs/side-pools.md#loadable-prefix). None when they do not."""
    pools = getattr(l3, "pools", ())
    if not pools or found.pages >= found.kv_pages:
        return None
    kv = found.kv_pages
    presence = l3.side_presence(keys, kv)
    blocking = []
    for pool in pools:
        trailing = pool.trailing_pages
        # the pages whose objects the full KV prefix needs from this pool
        needed = range(max(0, kv - trailing), kv) if trailing is not None else range(kv)
        for rank, pages in enumerate(presence):
            missing = [(i, o["key"]) for i in needed for o in pages[pool.name][i] if not o["present"]]
            if missing:
                if trailing is None:
                    first_page = missing[0][0]
                    missing = [m for m in missing if m[0] == first_page]
                blocking.append(
                    {
                        "pool": pool.name,
                        "rank": rank,
                        "hit_policy": pool.hit_policy,
                        "trailing_pages": trailing,
                        "page": missing[0][0],
                        "missing": [k for _, k in missing],
                    }
                )
                break
    rule = {
        "trailing_pages": lambda b: (
            f"trailing_pages: the last {b['trailing_pages']} page(s) before a stop point must hold its objects"
        ),
        "all_pages": lambda b: "all_pages: every page of the prefix must hold its objects",
    }
    restorable = f"; restorable stop points {found.restorable}" if found.restorable is not None else ""
    first = blocking[0] if blocking else None
    summary = (
        f"the KV prefix is {kv} of {len(keys)} pages, but side pool {first['pool']} lacks page {first['page']} "
        f"({', '.join(first['missing'][:3])}); rule {rule[first['hit_policy']](first)}: SGLang's batch_exists_v2 "
        f"loads {found.pages} page(s){restorable}"
        if first
        else f"the KV prefix is {kv} of {len(keys)} pages, but the side pools leave {found.pages} loadable{restorable}"
    )
    return {
        "summary": summary,
        "blocking": blocking,
        "loadable_pages": found.pages,
        "kv_pages": kv,
        "restorable_prefix_pages": found.restorable,
        "pool_hit_pages": found.pool_hit_pages,
    }


def side_lookup_step(t: Tracer, cache, keys, found, info, detail, diagnose) -> None:
    """The L3 lookup with side pools (batch_exists_v2): the KV prefix, then each pool's hit policy;
    a side pool that shortens the prefix fails the step, naming the pool, page, rule and what is left."""
    ps = cache.config.page_size
    pools = cache.l3.pools
    detail = {
        **detail,
        "loadable_pages": found.pages,
        "pool_hit_pages": found.pool_hit_pages,
        "restorable_prefix_pages": found.restorable,
        "pools": [
            p.view(list(dict.fromkeys(s for r in side_layout(cache.l3.schemes, pools) for s in r[p.name]))).model_dump()
            for p in pools
        ],
    }
    invariant = (
        "batch_exists_v2: the KV prefix whose objects ALL exist, then each side pool's hit policy "
        "(all_pages / trailing_pages), over every rank"
    )
    cut = side_pool_cut(cache.l3, keys, found)
    if cut is not None:
        detail.update(side_pool_cut=cut)
        causes = [
            f"{b['pool']} on rank {b['rank']}: {len(b['missing'])} object(s) missing from page {b['page']}"
            for b in cut["blocking"][1:]
        ] + [
            "a side-pool object was evicted or removed on its own, or its write failed",
            "a writer without this side pool (another model configuration) wrote the KV",
        ]
        t.fail(
            "batch_exists_v2",
            cut["summary"]
            + (": below the threshold, the prefetch is revoked" if found.pages * ps < info.threshold else ""),
            causes,
            detail=detail,
            invariant=invariant,
        )
    if found.kv_pages < len(keys):
        causes = diagnose() if diagnose else []
        t.fail(
            "batch_exists_v2",
            f"the KV prefix stops after {found.kv_pages} of {len(keys)} pages (per rank {info.rank_hits})",
            causes or ["an object of the next page is missing"],
            detail=detail,
            invariant=invariant,
        )
    t.add(
        "batch_exists_v2",
        PASS,
        f"all {len(keys)} pages are loadable on every rank: KV and side pools "
        f"{', '.join(f'{p.name} ({p.hit_policy})' for p in pools)} ({found.pool_hit_pages})",
        invariant=invariant,
        detail=detail,
    )
