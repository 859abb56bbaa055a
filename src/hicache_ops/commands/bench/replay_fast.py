"""`bench replay`'s one-block path: a request that is one whole 512-token block, served on the
tree's one or two nodes of that block without the general prefill's machinery.

A page-reference stream (every request one block: scripts/bench_vs_simulator.py) spends most of
its time in what `TieredCache.prefill` does for any prompt (the result record, its timings, the
key and prompt checks, the general match and insert walks). For one block of P pages, the tree
below the root holds at most the block's match part (its first P - 1 pages: a match stops one
token short of the prompt, policy.match_cap_pages) and its last page, so the request is one of:

- a miss: no node starts with the block's first page: the block becomes one new leaf;
- a hit: a node holds the block's first P - 1 pages (split off the whole block the first time);
  on the device it is a device hit, on the host a host hit loaded back; the last page is inserted
  below it (a new leaf, a node revived, or a node already on the device).

Anything else (a node covering only part of the match, one on no tier, a last-page node longer
than one page, a load-back refused) is handed back before anything changes, or to the engine's
own steps (`RadixTree.split`, `insert_device`, `TieredCache._load_back`, `_evict_for_prefill`,
`_alloc_device`, `_backup_due`), so the decisions, their order and every counter are the general
path's: the match stamps the node, the node is locked while pages are taken for the rest, the
insert counts a hit on the nodes it passes on the device, and the write policy backs them up
(docs/benchmarks.md#bench-replay-beside-sglangs-policy-simulator). The locks the general path also
takes for the insert and the backup are left out: nothing they protect can be evicted then (host
eviction takes nodes off the device only; the block's nodes are on it), and they end where they
began; a new or revived node gets the insert's access stamp just before it is placed rather
than just after (the same stamp: the tree's lazy heap then queues it current rather than stale).
tests/bench/test_replay.py checks the two paths give the same results.

It serves a cache without L3 (no prefetch, no L3 writes), no observer and no concurrency clock:
`applies` says when.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hicache_ops.engine.results import PrefillResult
from hicache_ops.sglang import policy as pol

if TYPE_CHECKING:
    from hicache_ops.engine.cache import TieredCache
    from hicache_ops.engine.tree import Node


class OneBlockPath:
    """Serves one-block requests of `block_tokens` tokens on `cache` (see the module docstring)."""

    def __init__(self, cache: TieredCache, block_tokens: int):
        cfg = cache.config
        self.cache = cache
        self.page_size = cfg.page_size
        self.pages = block_tokens // cfg.page_size
        self.cap = pol.match_cap_pages(block_tokens, cfg.page_size)
        self.block_tokens = block_tokens
        self._threshold = cache._write_threshold
        self._counts_revived = cache._counts_revived
        # _load_back reports into a request's result: one record serves every call (two fields read).
        self._scratch = PrefillResult(prompt_tokens=0)
        self.served = 0  # requests this path served (the others went to the engine's prefill)

    @staticmethod
    def applies(cache: TieredCache, block_tokens: int) -> bool:
        ps = cache.config.page_size
        return (
            cache.l3 is None
            and cache.clock is None
            and block_tokens % ps == 0
            and pol.match_cap_pages(block_tokens, ps) == block_tokens // ps - 1 >= 1
        )

    def serve(self, keys: list[str]) -> tuple[int, int] | None:
        """Serve the block whose page keys are `keys`; (device hit, host hit) in tokens, or None
        when its tree shape is not one this path takes (nothing was changed: serve it the general way)."""
        cache = self.cache
        tree = cache.tree
        root = tree.root
        cap = self.cap
        node = root.children.get(keys[0])
        if node is None:
            self._miss(keys)
            self.served += 1
            return 0, 0
        n = len(node.keys)
        if n < cap or node.keys[cap - 1] != keys[cap - 1] or (node.device is None and node.host is None):
            return None
        # The match: the node's first cap pages (chained keys agree up to the last equal one).
        if n > cap:
            node = tree.split(node, cap)
        node.last_access = next(tree._clock)
        held = [node]
        tree.lock(held)
        try:
            ps = self.page_size
            device_hit = host_hit = 0
            pos = cap
            if node.device is not None:
                device_hit = cap * ps
            else:
                scratch = self._scratch
                scratch.mismatched_pages = 0
                if cache._load_back(held, scratch):
                    host_hit = cap * ps
                    cache.stats.mismatched_pages += scratch.mismatched_pages
                else:
                    pos = 0
            cache._evict_for_prefill((self.pages - pos) * ps)
            pages = cache._alloc_device(self.pages - pos)
            cache.plane.compute(pages, keys[pos:])
            if pos:
                counted = self._insert_last(node, keys, pages)
            else:  # the host part is recomputed: the insert revives it from the root
                walked, unused, resident = tree.insert_device(root, keys, keys, 0, pages)
                if unused:
                    cache.device.give_many(unused)
                counted = walked if self._counts_revived else resident
            self._count_and_back_up(counted)
        finally:
            tree.unlock(held)
        s = cache.stats
        s.requests += 1
        s.prompt_tokens += self.block_tokens
        s.device_hit += device_hit
        s.host_hit += host_hit
        s.computed += (self.pages - pos) * ps
        self.served += 1
        return device_hit, host_hit

    def _miss(self, keys: list[str]) -> None:
        cache = self.cache
        tree = cache.tree
        cache._evict_for_prefill(self.block_tokens)
        pages = cache._alloc_device(self.pages)
        cache.plane.compute(pages, keys)
        # The insert from the root: nothing starts with the first page (eviction only removes).
        leaf = tree._new_node(keys[:], keys[:], 0, tree.root)
        leaf.last_access = next(tree._clock)  # the insert's stamp, before the placing queues it
        tree.set_device(leaf, pages)
        self._count_and_back_up([leaf])
        s = cache.stats
        s.requests += 1
        s.prompt_tokens += self.block_tokens
        s.computed += self.block_tokens

    def _insert_last(self, node: Node, keys: list[str], pages: list[int]) -> list[Node]:
        """Insert the block's last page below its match `node` (on the device); the nodes the
        insert counts a hit on."""
        cache = self.cache
        tree = cache.tree
        cap = self.cap
        last = node.children.get(keys[cap])
        if last is None:
            leaf = tree._new_node(keys[cap:], keys[cap:], cap, node)
            leaf.last_access = next(tree._clock)
            tree.set_device(leaf, pages)
            return [node, leaf]
        if len(last.keys) != 1:  # a longer run below (a longer prompt's): the engine's insert splits it
            walked, unused, resident = tree.insert_device(node, keys, keys, cap, pages)
            if unused:
                cache.device.give_many(unused)
            return [node, *(walked if self._counts_revived else resident)]
        if last.device is None:  # revived
            last.last_access = next(tree._clock)
            tree.set_device(last, pages)
            return [node, last] if self._counts_revived else [node]
        cache.device.give_many(pages)  # already on the device: the computed page is a duplicate
        last.last_access = next(tree._clock)
        return [node, last]

    def _count_and_back_up(self, counted: list[Node]) -> None:
        """The insert's hits and the write policy's backups (Backups._count_hits_and_back_up
        without an observer or a forced backup)."""
        threshold = self._threshold
        if threshold is None:
            return
        due = []
        for node in counted:
            node.hit_count += 1
            if node.host is None and node.hit_count >= threshold:
                due.append(node)
        if due:
            self.cache._backup_due(due)
