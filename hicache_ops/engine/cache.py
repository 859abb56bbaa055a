"""The embedded tiered cache: one page tree over L1 (device), L2 (host) and L3 (store).

`TieredCache.prefill(tokens)` walks a request the way SGLang's HiCache does (FACTS §4):
match the tree (device hit, then host hit), load a host hit back when it reaches
`load_back_threshold`, prefetch the unmatched page-aligned suffix from L3 when it reaches the
prefetch threshold (revoked when the minimum hit over all ranks is below it, cut by the stop
policy), compute the rest, then back pages up by the write policy (to host, and from host to L3).
Eviction is per tier, leaf-only LRU; write_back backs a node up when it leaves the device.

The cache only decides and counts; a DataPlane and an L3Tier move the bytes (or not, in
accounting mode), so the same decisions run at benchmark scale and byte for byte.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import InputError
from ..sglang.keys import as_token_array, page_keys
from ..sglang.versions import V0_5_14, V0_5_23, validate_version
from ..sglang import policy as pol
from .planes import DataPlane, L3Tier
from .tree import PageNode, PageTree


class CapacityError(InputError):
    """A request cannot fit in the pools even after evicting everything unpinned."""


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = 16
    device_pages: int = 64
    host_pages: int = 129
    write_policy: str = pol.DEFAULT_WRITE_POLICY
    stop_policy: str = pol.DEFAULT_STOP_POLICY
    prefetch_threshold: int = pol.DEFAULT_PREFETCH_THRESHOLD
    load_back_threshold: int = pol.LOAD_BACK_THRESHOLD
    sglang_version: str = V0_5_23
    timeout_budget: pol.TimeoutBudget = pol.TimeoutBudget()
    # When the scheduler admits a request after its prefetch started; best_effort takes what has
    # arrived by then, `timeout` waits at least this long.
    admission_s: float = 0.05
    enable_l2: bool = True

    def __post_init__(self) -> None:
        if self.page_size <= 0:
            raise InputError(f"page size {self.page_size} must be > 0.")
        if self.device_pages <= 0:
            raise InputError(f"the device pool needs at least one page, got {self.device_pages}.")
        if self.enable_l2 and self.host_pages <= 0:
            raise InputError(f"the host pool needs at least one page, got {self.host_pages}.")
        pol.check_write_policy(self.write_policy)
        pol.check_stop_policy(self.stop_policy)
        validate_version(self.sglang_version)


@dataclass
class PrefetchInfo:
    """What the storage step did for one request."""

    considered_tokens: int = 0  # the unmatched page-aligned suffix
    threshold: int = 0
    issued: bool = False
    reason: str = ""  # why not issued / revoked / cut
    rank_hits: list[int] = field(default_factory=list)  # contiguous pages per rank
    hit_pages: int = 0  # min over ranks
    completed_pages: int = 0  # arrived before the stop policy's deadline
    budget_s: float = 0.0  # the `timeout` budget for this prefetch
    deadline_s: float = 0.0  # the deadline the configured policy applied
    elapsed_s: float = 0.0  # when the last hit page arrived
    timeout_would_cut: bool = False
    mismatched_pages: int = 0
    bytes: int = 0


@dataclass
class PrefillResult:
    prompt_tokens: int
    device_hit: int = 0
    host_hit: int = 0
    storage_hit: int = 0
    computed: int = 0
    pages: int = 0
    trailing_tokens: int = 0
    bytes_loaded_from_host: int = 0
    bytes_backed_up_to_host: int = 0
    bytes_written_to_l3: int = 0
    bytes_read_from_l3: int = 0
    mismatched_pages: int = 0
    backed_up_pages: int = 0
    stored_pages: int = 0
    prefetch: PrefetchInfo = field(default_factory=PrefetchInfo)
    timings_ms: dict[str, float] = field(default_factory=dict)
    page_keys: list[str] = field(default_factory=list)

    @property
    def cached(self) -> int:
        return self.device_hit + self.host_hit + self.storage_hit

    def to_json(self, with_keys: bool = False) -> dict:
        data = asdict(self)
        if not with_keys:
            data.pop("page_keys")
        data["cached"] = self.cached
        return data


@dataclass
class CacheStats:
    requests: int = 0
    prompt_tokens: int = 0
    device_hit: int = 0
    host_hit: int = 0
    storage_hit: int = 0
    computed: int = 0
    device_evictions: int = 0
    host_evictions: int = 0
    write_back_backups: int = 0
    dropped_pages: int = 0  # evicted from every tier
    backup_failures: int = 0  # host or L3 backups that could not be made
    mismatched_pages: int = 0
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    bytes_l3_write: int = 0
    bytes_l3_read: int = 0
    l3_objects_written: int = 0
    l3_objects_skipped: int = 0
    prefetches_issued: int = 0
    prefetches_revoked: int = 0


class PagePool:
    """A free list of page indices."""

    def __init__(self, pages: int):
        self.capacity = pages
        self._free = list(range(pages - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.capacity - len(self._free)

    def take(self) -> int:
        return self._free.pop()

    def take_many(self, n: int) -> list[int]:
        """n pages: the same ones, in the same order, as n take() calls."""
        free = self._free
        cut = len(free) - n
        pages = free[cut:]
        pages.reverse()
        del free[cut:]
        return pages

    def give(self, page: int) -> None:
        self._free.append(page)

    def give_many(self, pages: list[int]) -> None:
        """The same as give() for each page, in order."""
        self._free.extend(pages)

    def reset(self) -> None:
        self._free = list(range(self.capacity - 1, -1, -1))


class TieredCache:
    def __init__(self, config: CacheConfig, plane: DataPlane, l3: L3Tier | None = None):
        self.config = config
        self.plane = plane
        self.l3 = l3
        self.tree = PageTree()
        self.device = PagePool(config.device_pages)
        self.host = PagePool(config.host_pages if config.enable_l2 else 0)
        self.stats = CacheStats()
        self.lock = threading.RLock()  # one request at a time, like SGLang's scheduler loop
        self._write_threshold = pol.write_through_threshold(config.write_policy)
        # Set for one call by prefill(observer=...): sees each step of the real path as it happens.
        self._observer: Callable[[str, dict], None] | None = None

    def _emit(self, event: str, **data) -> None:
        if self._observer is not None:
            self._observer(event, data)

    # -- keys -----------------------------------------------------------------------------------

    def keys_for(self, tokens: np.ndarray, extra_key: str | None, cache_salt: str | None) -> tuple[list[str], list[str]]:
        """(tree keys, L3 page keys) of the whole pages of a prompt.

        The tree always separates namespaces; 0.5.14's L3 keys ignore them (FACTS §1).
        """
        ps, version = self.config.page_size, self.config.sglang_version
        tree_keys = page_keys(tokens, ps, V0_5_23, extra_key=extra_key, cache_salt=cache_salt)
        if version == V0_5_14 and (extra_key is not None or cache_salt):
            return tree_keys, page_keys(tokens, ps, V0_5_14)
        return tree_keys, tree_keys

    # -- allocation and eviction ----------------------------------------------------------------

    def _alloc_device(self, n: int) -> list[int]:
        if self.device.free < n:
            self._evict_device(n - self.device.free)
        if self.device.free < n:
            raise CapacityError(
                f"the device pool has {self.device.capacity} pages and cannot hold {n} more "
                "even after evicting every unpinned page.",
                hint="Use a larger device pool or a shorter prompt.",
            )
        return self.device.take_many(n)

    def _alloc_host(self, n: int, pinned: set[int] | None = None) -> list[int] | None:
        """n host pages, evicting host leaves; None when they cannot be had."""
        if n == 0:
            return []
        if not self.config.enable_l2:
            return None
        if self.host.free < n:
            self._evict_host(n - self.host.free, pinned or set())
        if self.host.free < n:
            return None
        return self.host.take_many(n)

    def _evict_device(self, n: int) -> None:
        """Leaf-only LRU (PageTree.evict_device): a backed-up page keeps its host copy, one that
        is not is dropped; write_back backs a page up as it leaves."""
        write_back = self._write_back_one if self.config.write_policy == "write_back" else None
        freed: list[int] = []
        dropped = 0
        try:
            dropped = self.tree.evict_device(n, freed, write_back)  # (not `stats.x += call()`: the call may count drops itself)
        finally:
            self.device.give_many(freed)
            self.stats.device_evictions += len(freed)
            self.stats.dropped_pages += dropped

    def _write_back_one(self, node: PageNode) -> None:
        if self._backup_to_host([node], pinned={id(node)}):
            self.stats.write_back_backups += 1

    def _evict_host(self, n: int, pinned: set[int]) -> None:
        freed: list[int] = []
        dropped = 0
        try:
            dropped = self.tree.evict_host(n, pinned, freed)  # (not `stats.x += call()`: the call may count drops itself)
        finally:
            self.host.give_many(freed)
            self.stats.host_evictions += len(freed)
            self.stats.dropped_pages += dropped

    # -- backups --------------------------------------------------------------------------------

    def _backup_to_host(self, nodes: list[PageNode], pinned: set[int] | None = None) -> int:
        """Copy device pages to host (then to L3); return how many were backed up."""
        nodes = [n for n in nodes if not n.backed_up and n.device_page >= 0]
        if not nodes:
            return 0
        host_pages = (
            self._alloc_host(len(nodes), pinned={id(n) for n in nodes} | (pinned or set()))
            if self.config.enable_l2
            else None  # what _alloc_host answers without a host pool (skips building the pin set)
        )
        if host_pages is None:
            self.stats.backup_failures += len(nodes)
            self._emit("backup_failed", pages=len(nodes), host_free=self.host.free, host_pages=self.host.capacity)
            return 0
        moved = self.plane.backup([n.device_page for n in nodes], host_pages)
        self.stats.bytes_d2h += moved
        self._last_backup_bytes += moved
        self._emit("backup_host", nodes=nodes, device_pages=[n.device_page for n in nodes], host_pages=host_pages, bytes=moved)
        for node, page in zip(nodes, host_pages):
            self.tree.set_host(node, page, offer=False)  # acknowledged: the copy above completed
        self.tree.offer_all(nodes)
        self._emit("backup_ack", nodes=nodes)
        self._backup_to_l3(nodes)
        return len(nodes)

    def _backup_to_l3(self, nodes: list[PageNode], *, recheck: bool = False) -> None:
        """Write host-resident nodes to L3; `recheck` includes nodes believed stored (the
        write asks batch_is_exist first, so present objects are not put again)."""
        if self.l3 is None:
            return
        nodes = [n for n in nodes if n.backed_up and n.host_page >= 0 and (recheck or not n.stored)]  # on_host
        if not nodes:
            return
        for node in nodes:
            node.host_ref += 1
        try:
            ok, outcome = self.l3.write([n.storage_key for n in nodes], [n.host_page for n in nodes])
        finally:
            for node in nodes:
                node.host_ref -= 1
        for node, stored in zip(nodes, ok):
            node.stored = stored
        self._emit("l3_write", nodes=nodes, ok=ok, outcome=outcome)
        self.stats.bytes_l3_write += outcome.nbytes
        self.stats.l3_objects_written += outcome.written
        self.stats.l3_objects_skipped += outcome.skipped
        self.stats.backup_failures += sum(1 for s in ok if not s)
        self._last_l3_bytes += outcome.nbytes

    # -- the request path -----------------------------------------------------------------------

    def prefill(
        self,
        tokens,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        *,
        with_keys: bool = False,
        force_backup: bool = False,
        observer: Callable[[str, dict], None] | None = None,
    ) -> PrefillResult:
        """Serve one request; the result's breakdown adds up to the prompt's tokens.

        `force_backup` backs every whole page up to host and L3 now, whatever the write policy,
        and re-puts objects missing from L3 even where the tree believes them stored (warming).
        """
        cfg = self.config
        ps = cfg.page_size
        arr = as_token_array(tokens, cfg.sglang_version)
        if arr.size == 0:
            raise InputError("the prompt is empty; send at least one token.")
        n_pages = arr.size // ps
        if n_pages > cfg.device_pages:
            raise CapacityError(
                f"the prompt has {n_pages} pages but the device pool holds {cfg.device_pages}.",
                hint="Send a shorter prompt or start the cache with a larger device pool.",
            )
        with self.lock:
            self._observer = observer
            try:
                return self._prefill(arr, n_pages, extra_key, cache_salt, with_keys, force_backup)
            finally:
                self._observer = None

    def _prefill(self, arr, n_pages, extra_key, cache_salt, with_keys, force_backup=False) -> PrefillResult:
        cfg, ps = self.config, self.config.page_size
        t0 = time.perf_counter()
        self._last_backup_bytes = 0
        self._last_l3_bytes = 0
        result = PrefillResult(prompt_tokens=int(arr.size), pages=n_pages, trailing_tokens=int(arr.size - n_pages * ps))
        tree_keys, storage_keys = self.keys_for(arr, extra_key, cache_salt)
        if with_keys:
            result.page_keys = storage_keys
        timings = result.timings_ms
        timings["hash"] = (time.perf_counter() - t0) * 1e3

        matched = self.tree.match(tree_keys)
        d = 0  # (on_device / on_host, inlined: these run once per matched page)
        while d < len(matched) and matched[d].device_page >= 0:
            d += 1
        h = d
        while h < len(matched) and matched[h].backed_up and matched[h].host_page >= 0:
            h += 1
        self._emit(
            "match", tree_keys=tree_keys, storage_keys=storage_keys, device_nodes=matched[:d], host_nodes=matched[d:h],
            extra_key=extra_key, cache_salt=cache_salt,
        )
        path: list[PageNode] = matched[:h]
        for node in path:
            node.lock_ref += 1
        try:
            result.device_hit = d * ps
            # L2 -> L1: a host hit shorter than the threshold is recomputed, not loaded.
            host_nodes = path[d:h]
            if host_nodes:
                t = time.perf_counter()
                self._to_device(host_nodes, result, load=len(host_nodes) * ps >= cfg.load_back_threshold)
                timings["load_back"] = (time.perf_counter() - t) * 1e3

            pos = h
            if self.l3 is not None and pos < n_pages:
                t = time.perf_counter()
                fetched = self._prefetch(path[-1] if path else None, tree_keys, storage_keys, pos, result)
                timings["prefetch"] = (time.perf_counter() - t) * 1e3
                for node in fetched:
                    node.lock_ref += 1
                path.extend(fetched)
                pos += len(fetched)

            # Compute the rest: the page-aligned remainder goes into the tree; trailing tokens don't.
            t = time.perf_counter()
            parent = path[-1] if path else None
            new_nodes = []
            if pos < n_pages:
                pages = self._alloc_device(n_pages - pos)
                self.plane.compute(pages, storage_keys[pos:n_pages])
                self._emit("compute", first_page=pos, device_pages=pages, storage_keys=storage_keys[pos:n_pages])
                # get_or_add + set_device + pin per page, in one loop; touch() below re-stamps them.
                new_nodes, unused = self.tree.insert_on_device(tree_keys, storage_keys, pos, pages, parent)
                self.device.give_many(unused)  # none: the tree did not match these pages
                path.extend(new_nodes)
            result.computed += (n_pages - pos) * ps + result.trailing_tokens
            timings["compute"] = (time.perf_counter() - t) * 1e3

            # Hits and the write policy.
            t = time.perf_counter()
            for node in path:
                node.hit_count += 1
            self.tree.touch(path)
            due = []
            if force_backup:
                due = [n for n in path if not n.backed_up]
            elif self._write_threshold is not None:
                due = [n for n in path if not n.backed_up and n.hit_count >= self._write_threshold]
            self._emit(
                "write_policy", policy=cfg.write_policy, threshold=self._write_threshold, path=path, due=due,
            )
            if due:
                result.backed_up_pages = self._backup_to_host(due)
            if self.l3 is not None:
                # Pages backed up earlier whose L3 write has not happened yet (e.g. L3 was down).
                self._backup_to_l3(path, recheck=force_backup)
            result.stored_pages = sum([n.stored for n in path])
            timings["backup"] = (time.perf_counter() - t) * 1e3
        finally:
            for node in path:
                node.lock_ref -= 1

        result.bytes_backed_up_to_host = self._last_backup_bytes
        result.bytes_written_to_l3 = self._last_l3_bytes
        timings["total"] = (time.perf_counter() - t0) * 1e3
        s = self.stats
        s.requests += 1
        s.prompt_tokens += result.prompt_tokens
        s.device_hit += result.device_hit
        s.host_hit += result.host_hit
        s.storage_hit += result.storage_hit
        s.computed += result.computed
        s.mismatched_pages += result.mismatched_pages
        return result

    def _to_device(self, nodes: list[PageNode], result: PrefillResult, *, load: bool) -> None:
        """Give host-resident nodes device pages: loaded back and verified, or recomputed."""
        # A load in flight pins its host pages: the device eviction below may back pages up
        # (write_back), and the host eviction that makes room must not take these nodes.
        for node in nodes:
            node.host_ref += 1
        try:
            pages = self._alloc_device(len(nodes))
        finally:
            for node in nodes:
                node.host_ref -= 1
        self._emit(
            "load_back", load=load, nodes=nodes, device_pages=pages, tokens=len(nodes) * self.config.page_size,
            threshold=self.config.load_back_threshold,
        )
        if load:
            moved, bad = self.plane.load([n.host_page for n in nodes], pages, [n.storage_key for n in nodes])
            self.stats.bytes_h2d += moved
            result.bytes_loaded_from_host += moved
            result.mismatched_pages += bad
            result.host_hit += len(nodes) * self.config.page_size
        else:
            self.plane.compute(pages, [n.storage_key for n in nodes])
            result.computed += len(nodes) * self.config.page_size
        self.tree.set_device_many(nodes, pages)

    def _prefetch(self, anchor, tree_keys, storage_keys, pos, result) -> list[PageNode]:
        """L3 -> L2 -> L1 for the unmatched suffix; returns the new (device-resident) nodes."""
        nodes = self._fetch_to_host(anchor, tree_keys, storage_keys, pos, result)
        if not nodes:
            return []
        for node in nodes:
            node.host_ref += 1
        try:
            before = result.host_hit
            self._to_device(nodes, result, load=len(nodes) * self.config.page_size >= self.config.load_back_threshold)
            # Those pages are storage hits, not host hits, in the breakdown.
            result.storage_hit += result.host_hit - before
            result.host_hit = before
        finally:
            for node in nodes:
                node.host_ref -= 1
        return nodes

    def _fetch_to_host(self, anchor, tree_keys, storage_keys, pos, result) -> list[PageNode]:
        """L3 -> L2: query, apply threshold/revocation/stop policy, read and insert host nodes."""
        cfg, ps = self.config, self.config.page_size
        info = result.prefetch
        n_pages = len(tree_keys)
        info.considered_tokens = (n_pages - pos) * ps
        info.threshold = pol.effective_prefetch_threshold(cfg.prefetch_threshold, ps)
        capacity = pol.prefetch_limit_tokens(cfg.sglang_version, self.host.capacity * ps, cfg.device_pages * ps)
        if info.considered_tokens < info.threshold:
            info.reason = f"below the prefetch threshold ({info.considered_tokens} < {info.threshold} tokens)"
        elif not cfg.enable_l2:
            info.reason = "no host pool: L3 reads stage through L2"
        self._emit(
            "prefetch_decision", info=info, first_page=pos, capacity_tokens=capacity,
            capacity_rule=pol.prefetch_limit_rule(cfg.sglang_version), host_free_pages=self.host.free,
        )
        if info.reason:
            return []
        info.rank_hits = self.l3.contiguous_hits(storage_keys[pos:])
        self._emit("storage_query", info=info, storage_keys=storage_keys[pos:], schemes=self.l3.schemes)
        hit = min(info.rank_hits) if info.rank_hits else 0
        info.hit_pages = hit
        if hit * ps < info.threshold:
            if hit:
                self.stats.prefetches_revoked += 1
            info.reason = (
                f"revoked: the minimum storage hit over ranks is {hit * ps} tokens, below {info.threshold}"
                if hit
                else "no page of the suffix is in L3"
            )
            return []
        host_pages = self._alloc_host(hit)
        if host_pages is None:
            info.reason = f"the host pool cannot hold {hit} prefetched pages"
            return []
        info.issued = True
        self.stats.prefetches_issued += 1
        outcome = self.l3.read(storage_keys[pos : pos + hit], host_pages)
        self._emit("storage_read", storage_keys=storage_keys[pos : pos + hit], host_pages=host_pages, outcome=outcome)
        info.bytes = outcome.nbytes
        self.stats.bytes_l3_read += outcome.nbytes
        result.bytes_read_from_l3 += outcome.nbytes
        info.budget_s = cfg.timeout_budget.seconds(
            cfg.sglang_version, requested_tokens=info.considered_tokens, hit_tokens=hit * ps
        )
        info.deadline_s = pol.stop_deadline(cfg.stop_policy, info.budget_s, cfg.admission_s)
        ok, done_at, deadline = outcome.ok[:hit], outcome.done_at[:hit], info.deadline_s
        total = sum(done_at)
        if len(ok) == len(done_at) == hit and all(ok) and total == total and max(done_at, default=0) <= deadline:
            done = hit  # every page arrived, in time (and no NaN): the loop below in one step
        else:
            done = 0
            while done < hit and outcome.ok[done] and outcome.done_at[done] <= deadline:
                done += 1
        info.elapsed_s = max(outcome.done_at) if outcome.done_at else 0.0
        info.timeout_would_cut = info.elapsed_s > max(cfg.admission_s, info.budget_s)
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
        result.mismatched_pages += info.mismatched_pages
        self._emit("stop_policy", info=info, policy=cfg.stop_policy, admission_s=cfg.admission_s)
        # get_or_add + set_host + stored per page, in one loop; touch() offers the leaves.
        nodes = self.tree.insert_on_host(tree_keys, storage_keys, pos, host_pages[:done], anchor)
        self.tree.touch(nodes)
        self._emit("insert", nodes=nodes)
        return nodes

    def prefetch(
        self,
        tokens,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        *,
        observer: Callable[[str, dict], None] | None = None,
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
            self._observer = observer
            try:
                return self._prefetch_only(arr, extra_key, cache_salt)
            finally:
                self._observer = None

    def _prefetch_only(self, arr, extra_key, cache_salt) -> PrefillResult:
        ps = self.config.page_size
        n_pages = arr.size // ps
        result = PrefillResult(prompt_tokens=int(arr.size), pages=n_pages, trailing_tokens=int(arr.size - n_pages * ps))
        tree_keys, storage_keys = self.keys_for(arr, extra_key, cache_salt)
        matched = self.tree.match(tree_keys)
        self._emit(
            "match", tree_keys=tree_keys, storage_keys=storage_keys, device_nodes=[n for n in matched if n.on_device],
            host_nodes=[n for n in matched if not n.on_device], extra_key=extra_key, cache_salt=cache_salt,
        )
        result.device_hit = sum(ps for n in matched if n.on_device)
        result.host_hit = sum(ps for n in matched if not n.on_device)
        t = time.perf_counter()
        nodes = self._fetch_to_host(matched[-1] if matched else None, tree_keys, storage_keys, len(matched), result)
        result.timings_ms["prefetch"] = (time.perf_counter() - t) * 1e3
        result.storage_hit = len(nodes) * ps
        self.stats.storage_hit += result.storage_hit
        self.stats.mismatched_pages += result.mismatched_pages
        return result

    # -- other operations -----------------------------------------------------------------------

    def flush(self) -> None:
        """Drop L1 and L2 (like SGLang's /flush_cache); L3 is untouched."""
        with self.lock:
            self.tree.clear()
            self.device.reset()
            self.host.reset()

    def occupancy(self) -> dict:
        on_device = sum(1 for n in self.tree.nodes.values() if n.on_device)
        on_host = sum(1 for n in self.tree.nodes.values() if n.on_host)
        return {
            "tree_pages": len(self.tree),
            "device_pages_used": self.device.used,
            "device_pages": self.device.capacity,
            "host_pages_used": self.host.used,
            "host_pages": self.host.capacity,
            "pages_on_device": on_device,
            "pages_on_host": on_host,
            "pages_stored": sum(1 for n in self.tree.nodes.values() if n.stored),
        }
