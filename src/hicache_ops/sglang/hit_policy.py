"""How SGLang's v2 storage calls treat side pools: which pages of a backup get side objects, which
ranks write them, and the loadable prefix `batch_exists_v2` computes from what exists
(docs/side-pools.md#loadable-prefix, #which-pages-get-side-objects).

Everything here works on presence flags, so the live diff (objects on a master) and the engine's
L3 tiers (objects they hold) compute the same prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hicache_ops.sglang.page_keys import ObjectKeyScheme
from hicache_ops.sglang.side_pool_specs import PoolSpec
from hicache_ops.sglang.versions import V0_5_14, family

# One rank's presence: exists(pool, pages) -> for each of the first `pages` pages whether all of
# that pool's objects exist (pool None: the KV objects).
PagePresence = Callable[[PoolSpec | None, int], list[bool]]


@dataclass
class LoadablePrefix:
    """What SGLang's batch_exists / batch_exists_v2 return over every selected rank."""

    kv_pages: int
    pages: int
    restorable: list[int] | None  # 0.5.23 with side pools: the stop points every rank can restore
    pool_hit_pages: dict[str, int]  # SGLang's extra_pool_hit_pages without kv: the least over ranks
    rank_pages: list[int] = field(default_factory=list)  # each rank's own answer, before intersecting


def kv_only(rank_hits: list[int]) -> LoadablePrefix:
    """batch_exists without side pools: the least contiguous hit over ranks."""
    least = min(rank_hits, default=0)
    return LoadablePrefix(least, least, None, {}, list(rank_hits))


def leading(flags: Sequence[bool]) -> int:
    n = 0
    for flag in flags:
        if not flag:
            break
        n += 1
    return n


def pool_stop_points(exists: Sequence[bool], trailing: int | None) -> set[int]:
    """The prefix lengths a pool can serve: all_pages up to its first missing page; trailing_pages
    every length whose last `trailing` pages exist."""
    if trailing is None:
        return set(range(1, leading(exists) + 1))
    return {n for n in range(1, len(exists) + 1) if all(exists[max(0, n - trailing) : n])}


def loadable_prefix(
    version: str, pools: Sequence[PoolSpec], ranks: Sequence[PagePresence], pages: int
) -> LoadablePrefix:
    """Per rank as `batch_exists_v2` does it (KV prefix, then each pool's hit policy in order),
    intersected over ranks: 0.5.14 takes the least page count, 0.5.23 intersects the stop points.

    Like SGLang, a rank stops looking at further pools once nothing is loadable, so those pools
    report no hit.
    """
    old = family(version) == V0_5_14
    kv_all, final_all, hits_all = [], [], []
    restorable_all: set[int] | None = None
    for exists in ranks:
        kv_pages = leading(exists(None, pages))
        kv_all.append(kv_pages)
        restorable = set(range(1, kv_pages + 1))
        final = kv_pages
        hits: dict[str, int] = {}
        for pool in pools:
            if not (final if old else restorable):
                break
            stops = pool_stop_points(exists(pool, kv_pages), pool.trailing_pages)
            if stops:
                hits[pool.name] = max(stops)
            restorable &= stops
            final = min(final, max(stops, default=0))
        final_all.append(final if old else max(restorable, default=0))
        hits_all.append(hits)
        restorable_all = restorable if restorable_all is None else restorable_all & restorable
    kv = min(kv_all, default=0)
    if not pools:
        return LoadablePrefix(kv, kv, None, {}, kv_all)
    pool_hits = {p.name: min(h.get(p.name, 0) for h in hits_all) for p in pools}
    pool_hits = {name: n for name, n in pool_hits.items() if n}
    if old:
        return LoadablePrefix(kv, min(final_all), None, pool_hits, final_all)
    ordered = sorted(restorable_all or ())
    return LoadablePrefix(kv, ordered[-1] if ordered else 0, ordered, pool_hits, final_all)


def written_pages(pool: PoolSpec, pages: int) -> list[int]:
    """Which pages of one node's L3 backup (pages 0..pages-1 of the span written) get `pool`'s objects.

    Mamba keeps one state per node, valid at its end: only the node's last page. SWA and the pools
    that take their indices from SWA write every page whose SWA value the node's host copy holds;
    the engine keeps every page's, so all of them. all_pages pools write every page.
    """
    if pages <= 0:
        return []
    return [pages - 1] if pool.name == "mamba" else list(range(pages))


def read_pages(pool: PoolSpec, pages: int) -> list[int]:
    """Which pages of a prefetch of `pages` pages read `pool`'s objects: every page for all_pages,
    the last N before the stop point for trailing_pages (SGLang re-aligns the keys to the hit)."""
    trailing = pool.trailing_pages
    if trailing is None:
        return list(range(pages))
    return list(range(max(0, pages - trailing), pages))


def writes_side_pool(version: str, scheme: ObjectKeyScheme, pool: PoolSpec) -> bool:
    """Whether a rank backs up `pool` to Mooncake: the KV writer always; under MLA with tp > 1 the
    other ranks write nothing in 0.5.14 (backup_skip) and in 0.5.23 only Mamba and MHA draft pools."""
    if scheme.writes:
        return True
    if family(version) == V0_5_14:
        return False
    if pool.name == "mamba":
        return True
    if pool.name in ("draft", "draft_swa"):
        return (pool.attention or ("mla" if scheme.mla else "mha")) == "mha"
    return False
