"""The device and host page pools, and taking pages from them by evicting whole radix nodes.

A pool is a free list of page indices. When one runs short, the cache evicts whole radix nodes in
the configured policy's order (docs/controller.md#device-eviction, #host-eviction): device leaves
keep their host copy (write_back makes one as they leave), host leaves leave the tree.
"""

from __future__ import annotations

from collections.abc import Callable

from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.results import CacheStats
from hicache_ops.engine.tree import Node, RadixTree
from hicache_ops.errors import InputError
from hicache_ops.sglang import policy as pol


class CapacityError(InputError):
    """A request cannot fit in the pools even after evicting everything unpinned."""


class PagePool:
    """A free list of page indices."""

    def __init__(self, pages: int) -> None:
        self.capacity = pages
        self._free = list(range(pages - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.capacity - len(self._free)

    def take_many(self, n: int) -> list[int]:
        """n pages, the most recently freed first."""
        free = self._free
        cut = len(free) - n
        pages = free[cut:]
        pages.reverse()
        del free[cut:]
        return pages

    def give_many(self, pages: list[int]) -> None:
        """Return pages to the pool."""
        self._free.extend(pages)

    def reset(self) -> None:
        self._free = list(range(self.capacity - 1, -1, -1))


class PoolAllocation:
    """TieredCache's page allocation and eviction (a mixin: it uses the cache's config, tree,
    device and host pools, stats and per-request eviction counters, and the write_back step of
    backup.py)."""

    # What the mixin uses of TieredCache (engine/cache.py); declared here, set there.
    config: CacheConfig
    tree: RadixTree
    device: PagePool
    host: PagePool
    stats: CacheStats
    _reclaims_duplicates: bool  # the version frees host copies of device-resident nodes first
    _drops_unbacked_write_back: bool  # from 0.5.15: drop a write_back leaf whose backup got no host page
    _defers_write_back_victims: bool  # 0.5.14-0.5.18: a pass's write_back victims are held on host
    _request_device_evicted: int  # pages evicted for the request in progress
    _request_host_evicted: int
    _write_back_one: Callable[[Node], bool]  # Backups (engine/backup.py); an annotation, not a stub

    def _alloc_device(self, n: int) -> list[int]:
        pages = self._try_alloc_device(n)
        if pages is None:
            raise CapacityError(
                f"the device pool has {self.device.capacity} pages and cannot hold {n} more "
                "even after evicting every unpinned page.",
                hint="Use a larger device pool or a shorter prompt.",
            )
        return pages

    def _try_alloc_device(self, n: int) -> list[int] | None:
        device = self.device
        free = len(device._free)
        if free < n:
            self._evict_device(n - free)
            if len(device._free) < n:
                return None
        return device.take_many(n)

    def _alloc_host(self, n: int, at_least: int | None = None, prefetch: bool = False) -> list[int] | None:
        """n host pages, evicting host nodes for them (as much as the version asks for a backup or
        a prefetch); with `at_least`, fewer (what is free) when that is at least `at_least` pages.
        None when they cannot be had."""
        if n == 0:
            return []
        cfg = self.config
        if not cfg.enable_l2:
            return None
        host = self.host
        if len(host._free) >= n:  # hot: nothing to evict
            return host.take_many(n)
        self._evict_host(pol.host_eviction_pages(cfg.sglang_version, n, host.free, prefetch))
        if host.free >= n:
            return host.take_many(n)
        if at_least is not None and host.free >= at_least:
            return host.take_many(host.free)
        return None

    def _evict_device(self, n: int) -> None:
        """Whole device leaves in policy order; write_back backs each up as it leaves (without a
        host tier there is no HiCache: a leaf is simply dropped)."""
        write_back = (
            self._write_back_one if self.config.write_policy == "write_back" and self.config.enable_l2 else None
        )
        freed: list[int] = []
        # from 0.5.15 a write_back leaf whose backup got no host page is dropped (with its host-only subtree)
        host_freed: list[int] | None = [] if write_back and self._drops_unbacked_write_back else None
        nodes = dropped = 0
        try:
            nodes, dropped = self.tree.evict_device(
                n, write_back, freed, host_freed, hold_written=self._defers_write_back_victims
            )
        finally:
            stats = self.stats
            if host_freed:
                self.host.give_many(host_freed)
                stats.host_evictions += len(host_freed)
                self._request_host_evicted += len(host_freed)
            self.device._free.extend(freed)
            stats.device_evictions += len(freed)
            stats.device_evicted_nodes += nodes
            stats.dropped_pages += dropped
            self._request_device_evicted += len(freed)

    def _evict_host(self, n: int) -> None:
        freed: list[int] = []
        if self._reclaims_duplicates:
            self.stats.host_reclaimed_nodes += self.tree.reclaim_host_duplicates(n, freed)
        nodes = dropped = 0
        if len(freed) < n:
            nodes, dropped = self.tree.evict_host(n - len(freed), freed)
        self.host._free.extend(freed)
        stats = self.stats
        stats.host_evictions += len(freed)
        stats.host_evicted_nodes += nodes
        stats.dropped_pages += dropped
        self._request_host_evicted += len(freed)
