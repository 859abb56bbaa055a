"""The embedded tiered cache: one radix tree over L1 (device), L2 (host) and L3 (store).

`TieredCache.request(prompt, output)` serves one request the way SGLang's HiCache does, per
`--sglang-version` (docs/controller.md): match the tree up to input length - 1 (device hit, then
host hit), prefetch the rest of the page-aligned span from L3 when it reaches the threshold (cut
by the stop policy), load the host part back when it reaches the load-back threshold, compute the
rest, insert it (a hit per node the insert passes on the device), back nodes up by the write
policy (to host, and once to L3 when the host copy is acknowledged), then insert the prompt and
output at finish. `prefill(tokens)` is the prompt half alone (serve, trace).
Eviction takes whole radix nodes, per tier, in the configured policy's order.

The cache only decides and counts; a DataPlane and an L3Tier move the bytes (or not, in
accounting mode), so the same decisions run at benchmark scale and byte for byte.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hicache_ops.engine.admission import Admission
from hicache_ops.engine.backup import Backups
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.l3_prefetch import L3Prefetch
from hicache_ops.engine.page_pools import CapacityError, PagePool, PoolAllocation
from hicache_ops.engine.parts import Arrival, MatchedPrefill, TokenKeys
from hicache_ops.engine.planes import DataPlane, L3Tier
from hicache_ops.engine.results import CacheStats, PrefillResult
from hicache_ops.engine.tree import Node, RadixTree, page_views
from hicache_ops.errors import InputError
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import as_token_array, page_keys
from hicache_ops.sglang.versions import V0_5_14, V0_5_23

# Token arrays whose every value is a valid id in both versions (0 .. 2**32-1).
_NARROW_UNSIGNED = frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32))

# How many distinct request namespaces a cache remembers (a bound: extra_key comes from clients).
NAMESPACES_KEPT = 32


def _pages(nodes: list[Node]) -> int:
    """The pages of `nodes` (hot: a loop costs less than sum() over a generator)."""
    total = 0
    for node in nodes:
        total += len(node.keys)
    return total


class TieredCache(PoolAllocation, Backups, L3Prefetch, Admission):
    """The request path, load-back and the finish insert live here; the other concerns beside it:
    pools and eviction (pools.py), backups to host and L3 (backup.py), the L3 prefetch
    (prefetch.py) and the concurrency model's steps (admission.py)."""

    def __init__(self, config: CacheConfig, plane: DataPlane, l3: L3Tier | None = None):
        self.config = config
        self.plane = plane
        self.l3 = l3
        version = config.sglang_version
        self.tree = RadixTree(version, config.eviction_policy)
        self.device = PagePool(config.device_pages)
        self.host = PagePool(config.host_pages if config.enable_l2 else 0)
        self.stats = CacheStats()
        self.lock = threading.RLock()  # one request at a time, like SGLang's scheduler loop
        self._write_threshold = pol.write_through_threshold(config.write_policy)
        self._counts_every_insert = pol.counts_every_insert(version)
        self._counts_revived = pol.counts_revived_nodes(version)
        self._chains_ancestors = pol.backs_up_unbacked_ancestors(version)
        self._reclaims_duplicates = pol.reclaims_host_duplicates(version, config.write_policy)
        self._drops_unbacked_write_back = pol.drops_unbacked_write_back(version)
        self._defers_write_back_victims = pol.defers_write_back_victims(version)
        # Requested tokens of prefetches issued and not yet admitted (the concurrency model sets
        # it; one request at a time it is 0 when a prefetch is considered).
        self.in_flight_tokens = 0
        # Device tokens running requests hold or will take outside the tree: their partial last
        # prompt page and their clipped decode (the concurrency model, docs/controller.md#admission-budget).
        self.reserved_tokens = 0
        self._last_backup_bytes = 0
        self._last_l3_bytes = 0
        self._request_device_evicted = 0
        self._request_host_evicted = 0
        # Storage keys of pages already counted as mismatched when they arrived from L3: their
        # load-back finds the same bytes and must not count them again.
        self._counted_mismatches: set[str] = set()
        # The (extra_key, cache_salt) namespaces requests have keyed pages under, first seen first
        # (at most NAMESPACES_KEPT): a prompt missed without its namespace can be tried under them.
        self.namespaces: dict[tuple[str | None, str | None], None] = {}
        # The concurrency model's clock (seconds; None until a scheduler drives the cache) and the
        # L3 writes queued on it (docs/controller.md#transfer-time): (when it ends, node, first page).
        self.clock: float | None = None
        self._pending_l3_writes: list[tuple[float, Node, int]] = []
        self._l3_writer_free_at = 0.0
        self._l3_page_bytes = 0.0
        # Set for one call by prefill(observer=...): sees each step of the real path as it happens.
        self._observer: Callable[[str, dict[str, Any]], None] | None = None

    def _emit(self, event: str, **data: Any) -> None:
        if self._observer is not None:
            self._observer(event, data)

    # -- keys -----------------------------------------------------------------------------------

    def keys_for(
        self,
        tokens: np.ndarray,
        extra_key: str | None,
        cache_salt: str | None,
        known: tuple[list[str], list[str]] | None = None,
    ) -> tuple[list[str], list[str]]:
        """(tree keys, L3 page keys) of the whole pages of a prompt; `known` holds the keys of its
        first pages already (the chain continues from them).

        The tree always separates namespaces; 0.5.14's L3 keys ignore them (docs/keys.md#namespace-seed).
        """
        if (extra_key is not None or cache_salt) and len(self.namespaces) < NAMESPACES_KEPT:
            self.namespaces[(extra_key, cache_salt or None)] = None
        ps, version = self.config.page_size, self.config.sglang_version
        if known is not None and len(known[0]) == len(tokens) // ps:
            return known  # every whole page known already (bench replay's chained block keys)
        if known is None and extra_key is None and not cache_salt:
            # Hot: no namespace and nothing known (the same keys for the tree and L3 either version).
            keys = page_keys(tokens, ps, V0_5_23)
            return keys, keys
        tree_known, storage_known = known if known is not None else ([], [])
        rest = tokens[len(tree_known) * ps :]
        tree_keys = tree_known + page_keys(
            rest, ps, V0_5_23, extra_key=extra_key, cache_salt=cache_salt, prior=tree_known[-1] if tree_known else None
        )
        if version == V0_5_14 and (extra_key is not None or cache_salt):
            storage_keys = storage_known + page_keys(
                rest, ps, V0_5_14, prior=storage_known[-1] if storage_known else None
            )
            return tree_keys, storage_keys
        return tree_keys, tree_keys

    # -- the request path -----------------------------------------------------------------------

    def _check_prompt(self, tokens: Sequence[int] | np.ndarray) -> tuple[np.ndarray, int]:
        cfg = self.config
        if type(tokens) is np.ndarray and tokens.ndim == 1 and tokens.dtype in _NARROW_UNSIGNED:
            # Hot (bench replay): ids of a uint8/16/32 array are valid for every version as they
            # are; as_token_array would only scan them for a minimum and a maximum (and the
            # version was validated with the config).
            arr = tokens
        else:
            arr = as_token_array(tokens, cfg.sglang_version)
        if arr.size == 0:
            raise InputError("the prompt is empty; send at least one token.")
        n_pages = arr.size // cfg.page_size
        if n_pages > cfg.device_pages:
            raise CapacityError(
                f"the prompt has {n_pages} pages but the device pool holds {cfg.device_pages}.",
                hint="Send a shorter prompt or start the cache with a larger device pool.",
            )
        return arr, n_pages

    def prefill(
        self,
        tokens: Sequence[int] | np.ndarray,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        *,
        with_keys: bool = False,
        force_backup: bool = False,
        observer: Callable[[str, dict[str, Any]], None] | None = None,
        known_keys: TokenKeys | None = None,
    ) -> PrefillResult:
        """Serve one prompt (no decode); the result's breakdown adds up to the prompt's tokens.

        `force_backup` backs every whole page up to host and L3 now, whatever the write policy,
        and re-puts objects missing from L3 (warming: an operator action SGLang does not take).
        `known_keys`: the (tree, L3) keys of the prompt's first whole pages (or all of them), as
        `keys_for` gives them; only the pages past them are hashed.
        """
        arr, n_pages = self._check_prompt(tokens)
        with self.lock:
            if self._pending_l3_writes:
                self.drain_l3_writes()
            self._observer = observer
            try:
                result, held, _, _ = self._prefill(
                    arr, n_pages, extra_key, cache_salt, with_keys, force_backup, known=known_keys
                )
                self.tree.unlock(held)
                return result
            finally:
                self._observer = None

    def request(
        self,
        prompt: Sequence[int] | np.ndarray,
        output: Sequence[int] | np.ndarray,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        known_keys: tuple[list[str], list[str]] | None = None,
    ) -> PrefillResult:
        """One whole request: the prompt's prefill, then its finish with `output` (the generated
        token ids; at least one), as SGLang serves a lone request (docs/controller.md#finished-requests).

        The request holds device pages for every token it has (the prompt's partial last page
        too, then the decode's), taken when it needs them. A request that decodes (2+ output
        tokens) inserts its prompt after the prefill, where the write policy acts; one whose only
        token came from the prefill finishes at once and inserts once. The prompt's nodes stay
        locked until the finish inserts prompt + output but the last token. `known_keys`: the
        (tree, L3) keys of the prompt's first whole pages, from `keys_for` of an earlier prompt
        it extends (a conversation's next turn); only the pages past them are hashed."""
        arr, n_pages = self._check_prompt(prompt)
        out = as_token_array(output, self.config.sglang_version)
        if out.size == 0:
            raise InputError("a request generates at least one token.")
        decodes = out.size > 1
        with self.lock:
            self.drain_l3_writes()
            result, held, keys, tail = self._prefill(
                arr, n_pages, extra_key, cache_salt, False, False, count_hits=decodes, hold_tail=True, known=known_keys
            )
            try:
                self._finish(
                    np.concatenate([arr, out[:-1]]),
                    keys,
                    extra_key,
                    cache_salt,
                    result,
                    held_pages=tail,
                    inserted_pages=n_pages if decodes else 0,
                    stepwise_decode=True,
                )
            finally:
                self.tree.unlock(held)
            return result

    def _prefill(
        self,
        arr: np.ndarray,
        n_pages: int,
        extra_key: str | None,
        cache_salt: str | None,
        with_keys: bool,
        force_backup: bool,
        *,
        arrival: Arrival | None = None,
        count_hits: bool = True,
        hold_tail: bool = False,
        known: tuple[list[str], list[str]] | None = None,
    ) -> tuple[PrefillResult, list[Node], TokenKeys, list[int]]:
        """The prompt half of a request; returns the result, the deepest nodes it locked, the
        prompt's (tree, L3) page keys, and the device page holding the prompt's partial last page
        (`hold_tail`: the request keeps it for its finish; none when the prompt is whole pages).
        With an `arrival`, its prefetch was issued when it queued and lands now; otherwise the
        prefetch is issued and landed here. Without `count_hits` the prompt's insert counts no hit
        and backs nothing up (the finish insert does). The match half and the compute half run
        apart under the scheduler (`_prefill_match`, `_prefill_compute`)."""
        matched = self._prefill_match(arr, n_pages, extra_key, cache_salt, with_keys, arrival=arrival, known=known)
        return self._prefill_compute(matched, force_backup, count_hits=count_hits, hold_tail=hold_tail)

    def _prefill_match(
        self,
        arr: np.ndarray,
        n_pages: int,
        extra_key: str | None,
        cache_salt: str | None,
        with_keys: bool,
        *,
        arrival: Arrival | None = None,
        known: tuple[list[str], list[str]] | None = None,
    ) -> MatchedPrefill:
        """The match half of a prefill: match the tree (device hit, then host hit), lock the path,
        land or issue the prefetch and load the host part back."""
        ps, tree = self.config.page_size, self.tree
        t0 = time.perf_counter()
        self._last_backup_bytes = self._last_l3_bytes = 0
        self._request_device_evicted = self._request_host_evicted = 0
        if arrival is None:
            result = PrefillResult(
                prompt_tokens=int(arr.size), pages=n_pages, trailing_tokens=int(arr.size - n_pages * ps)
            )
            tree_keys, storage_keys = self.keys_for(arr, extra_key, cache_salt, known=known)
        else:
            result = arrival.result
            tree_keys, storage_keys = arrival.keys
        if with_keys:
            result.page_keys = storage_keys
        timings = result.timings_ms
        timings["hash"] = (time.perf_counter() - t0) * 1e3

        cap = pol.match_cap_pages(int(arr.size), ps)
        path = tree.match(tree_keys[:cap])
        d = 0
        while d < len(path) and path[d].device is not None:
            d += 1
        h = d
        while h < len(path) and path[h].host is not None:
            h += 1
        if h < len(path):
            path = path[:h]
        device_nodes, host_nodes = path[:d], path[d:]
        device_pages = _pages(device_nodes)
        host_pages = _pages(host_nodes)
        if self._observer is not None:
            self._emit(
                "match",
                tree_keys=tree_keys,
                storage_keys=storage_keys,
                device_nodes=page_views(device_nodes),
                host_nodes=page_views(host_nodes),
                extra_key=extra_key,
                cache_salt=cache_salt,
            )
        held: list[Node] = []
        if path:
            tree.lock([path[-1]])
            held.append(path[-1])
        try:
            result.device_hit = device_pages * ps
            pos = device_pages + host_pages
            fetched: list[Node] = []
            anchor = path[-1] if path else tree.root
            if arrival is not None:
                if arrival.anchor is not None:
                    tree.pin_host([arrival.anchor], -1)
                    arrival.anchor = None
                hold, arrival.prefetch = arrival.prefetch, None
                if hold is not None:
                    if hold.pos != pos:  # the match moved while it queued: the pages do not attach here
                        self._release_in_flight(hold)
                        self.host.give_many(hold.host_pages)
                        result.prefetch.reason = "the local match changed while the request queued"
                    else:
                        fetched = self._land_prefetch(hold, anchor, tree_keys, storage_keys, result)
            elif self.l3 is not None and pos < cap:
                t = time.perf_counter()
                fetched = self._fetch_to_host(anchor, tree_keys, storage_keys, pos, cap, result, tokens=arr)
                timings["prefetch"] = (time.perf_counter() - t) * 1e3
            if fetched:
                tree.lock([fetched[-1]])
                held.append(fetched[-1])
            fetched_pages = _pages(fetched)

            # L2 -> L1, all or nothing: a host hit shorter than the threshold is recomputed.
            on_device = list(device_nodes)
            to_load = host_nodes + fetched
            if to_load:
                t = time.perf_counter()
                if self._load_back(to_load, result):
                    result.host_hit = host_pages * ps
                    result.storage_hit = fetched_pages * ps
                    on_device += to_load
                timings["load_back"] = (time.perf_counter() - t) * 1e3
        except BaseException:
            tree.unlock(held)
            raise
        return MatchedPrefill(
            n_pages,
            result,
            (tree_keys, storage_keys),
            held,
            on_device,
            (time.perf_counter() - t0) * 1e3,
            self._request_device_evicted,
            self._request_host_evicted,
            self._last_backup_bytes,
            self._last_l3_bytes,
        )

    def _compute_start(self, matched: MatchedPrefill) -> tuple[int, list[Node]]:
        """The page the compute starts at and the device prefix above it, as the tree stands now."""
        on_device = matched.on_device
        pos = _pages(on_device)
        if on_device and pos != on_device[-1].depth + len(on_device[-1].keys):
            # A request matched since split a node of the prefix (the list holds its lower half):
            # the prefix is the path down to its last node as it stands now.
            pos, node, on_device = on_device[-1].depth + len(on_device[-1].keys), on_device[-1], []
            while node is not self.tree.root:
                on_device.append(node)
                node = node.parent
            on_device.reverse()
        return pos, on_device

    def _prefill_compute(
        self, matched: MatchedPrefill, force_backup: bool, *, count_hits: bool = True, hold_tail: bool = False
    ) -> tuple[PrefillResult, list[Node], TokenKeys, list[int]]:
        """The compute half of a prefill: compute the prompt past its matched prefix, insert it (a
        hit per node the insert passes on the device) and back nodes up by the write policy."""
        ps, tree = self.config.page_size, self.tree
        t0 = time.perf_counter()
        self._last_backup_bytes = self._last_l3_bytes = 0
        self._request_device_evicted = self._request_host_evicted = 0
        n_pages, result, held = matched.n_pages, matched.result, matched.held
        on_device, (tree_keys, storage_keys) = matched.on_device, matched.keys
        timings = result.timings_ms
        pos, on_device = self._compute_start(matched)
        tail: list[int] = []  # the partial last page's device page, with hold_tail
        try:
            # Compute the rest (host pages not loaded back included): every whole page of the
            # prompt joins the tree; trailing tokens don't.
            t = time.perf_counter()
            counted = list(on_device)
            walked: list[Node] = []
            if matched.allocated is not None:
                pages, matched.allocated = matched.allocated, None
                if hold_tail and result.trailing_tokens:
                    pages, tail = pages[:-1], pages[-1:]
            else:
                # A batch of one: the eviction for SGLang's extend demand, then one allocation for
                # the whole prompt.
                self._evict_for_prefill((n_pages - pos) * ps + result.trailing_tokens)
                if hold_tail and result.trailing_tokens:
                    pages = self._alloc_device(n_pages + 1 - pos)
                    pages, tail = pages[:-1], pages[-1:]
                elif pos < n_pages:
                    pages = self._alloc_device(n_pages - pos)
                else:
                    pages = []
            if pages:
                computed_keys = storage_keys[pos:n_pages]
                self.plane.compute(pages, computed_keys)
                if self._observer is not None:
                    self._emit("compute", first_page=pos, device_pages=pages, storage_keys=computed_keys)
                anchor = on_device[-1] if on_device else tree.root
                walked, unused, resident = tree.insert_device(anchor, tree_keys, storage_keys, pos, pages)
                if unused:
                    self.device.give_many(unused)
                counted += walked if self._counts_revived else resident
                if walked:
                    tree.lock([walked[-1]])
                    held.append(walked[-1])
            result.computed = (n_pages - pos) * ps + result.trailing_tokens
            t_end = time.perf_counter()  # one stamp ends the compute step and starts the backup step
            timings["compute"] = (t_end - t) * 1e3

            t = t_end
            passed = on_device + walked if walked else on_device
            if count_hits:
                result.backed_up_pages = self._count_hits_and_back_up(counted, passed, force_backup)
            if force_backup and self.l3 is not None:
                for node in passed:
                    self._backup_to_l3(node, 0)  # re-put what is missing (the write skips present objects)
            stored = 0
            for node in passed:
                stored += min(node.stored, len(node.keys))
            result.stored_pages = stored
            t_end = time.perf_counter()
            timings["backup"] = (t_end - t) * 1e3
        except BaseException:
            tree.unlock(held)
            self.device.give_many(tail)
            raise

        result.bytes_backed_up_to_host = matched.backup_bytes + self._last_backup_bytes
        result.bytes_written_to_l3 = matched.l3_bytes + self._last_l3_bytes
        result.device_evicted_pages = matched.device_evicted + self._request_device_evicted
        result.host_evicted_pages = matched.host_evicted + self._request_host_evicted
        # To the backup step's end (what follows is bookkeeping), the match half's time included.
        timings["total"] = matched.elapsed_ms + (t_end - t0) * 1e3
        s = self.stats
        s.requests += 1
        s.prompt_tokens += result.prompt_tokens
        s.device_hit += result.device_hit
        s.host_hit += result.host_hit
        s.storage_hit += result.storage_hit
        s.computed += result.computed
        s.mismatched_pages += result.mismatched_pages
        if tail and not hold_tail:
            self.device.give_many(tail)
        return result, held, (tree_keys, storage_keys), tail

    def _finish(
        self,
        tokens: np.ndarray,
        prompt_keys: TokenKeys,
        extra_key: str | None,
        cache_salt: str | None,
        result: PrefillResult,
        *,
        held_pages: list[int] | None = None,
        inserted_pages: int | None = None,
        stepwise_decode: bool = False,
    ) -> None:
        """The finish insert: prompt + output but the last token, whole pages.

        `held_pages`: the device pages the request holds past its prompt's whole pages (the
        partial last prompt page); the decode's are taken here, before the insert, and those past
        the last whole page are freed after it. None: the pages the tree lacks are taken at once
        (the concurrency model reserved them at admission). `inserted_pages`: what the request's
        prefill insert covered (0.5.23 counts hits past it only); default the prompt's pages.
        `stepwise_decode`: a lone request's decode pages are taken a step at a time as SGLang's
        decode takes them (`_alloc_decode`); else at once (the concurrency model's finish)."""
        ps, tree = self.config.page_size, self.tree
        n_pages = tokens.size // ps
        prompt_pages = len(prompt_keys[0])
        if inserted_pages is None:
            inserted_pages = prompt_pages
        evicted_before = (self._request_device_evicted, self._request_host_evicted)
        tree_keys, storage_keys = self.keys_for(tokens, extra_key, cache_salt, known=prompt_keys)
        spare: list[int] = []
        if held_pages is None:
            # The insert walks on from the longest run of whole nodes still on the device: a node
            # past the request's own prompt may have left the device while it decoded (the insert
            # revives it), and those on the device stay locked while the decode's pages are taken,
            # so that eviction cannot drop the node the insert continues below.
            path, _ = tree.full_nodes(tree_keys[:n_pages])
            on_device = 0
            while on_device < len(path) and path[on_device].device is not None:
                on_device += 1
            path = path[:on_device]
            start = sum(len(n.keys) for n in path)
            if path:
                tree.lock([path[-1]])
            try:
                pages = self._alloc_device(n_pages - start) if n_pages > start else []
            finally:
                if path:
                    tree.unlock([path[-1]])
        else:
            # The prompt's nodes are locked and end at its last whole page (its match and insert
            # split there); the insert walks on from that boundary.
            path, start = tree.full_nodes(tree_keys[:prompt_pages])
            if stepwise_decode:
                row = held_pages + self._alloc_decode(result.prompt_tokens, tokens.size)
            else:
                decode = -(-tokens.size // ps) - prompt_pages - len(held_pages)
                row = held_pages + (self._alloc_device(decode) if decode > 0 else [])
            pages, spare = row[: n_pages - start], row[n_pages - start :]
        if pages:
            self.plane.compute(pages, storage_keys[start:n_pages])
        tree.touch(path)  # the insert walks from the root: ancestors first, so leaves stay newest
        anchor = path[-1] if path else tree.root
        walked, unused, resident = tree.insert_device(anchor, tree_keys, storage_keys, start, pages)
        self.device.give_many(unused + spare)
        passed = [n for n in path if n.device is not None] + (walked if self._counts_revived else resident)
        # 0.5.14 counts every node this insert passes on the device again; 0.5.23 only the nodes
        # past what the request inserted already.
        counted = passed if self._counts_every_insert else [n for n in passed if n.depth + len(n.keys) > inserted_pages]
        result.output_pages = len(pages) - len(unused)
        result.backed_up_pages += self._count_hits_and_back_up(counted, path + walked, False)
        result.device_evicted_pages += self._request_device_evicted - evicted_before[0]
        result.host_evicted_pages += self._request_host_evicted - evicted_before[1]

    def _evict_for_prefill(self, extend_tokens: int) -> None:
        """A lone request's prefill eviction, before its pages are taken: SGLang's demand for a
        batch of one, `extend_tokens` past the device prefix (docs/controller.md#pass-allocation)."""
        ps = self.config.page_size
        evict = pol.pass_allocation_eviction_pages(self.config.sglang_version, extend_tokens, 1, self.device.free, ps)
        if evict:
            self._evict_device(evict)

    def _alloc_decode(self, written: int, total: int) -> list[int]:
        """The pages a lone request's decode takes while its KV grows from `written` tokens to
        `total`, one token a step as SGLang's decode allocates it: before each step the tree evicts
        for a page whenever none is free, whether or not the step's token opens one
        (docs/controller.md#pass-allocation)."""
        ps, version = self.config.page_size, self.config.sglang_version
        pages: list[int] = []
        step = written  # the token the next decode step writes
        while step < total:
            evict = pol.decode_eviction_pages(version, 1, self.device.free, ps)
            if evict:
                self._evict_device(evict)
            if step % ps == 0:
                pages += self._alloc_device(1)
                step += 1
            else:
                # Nothing changes the pool before the step that opens the next page: this step's
                # eviction left a page free, or found nothing that a later step would find.
                step = min(total, (step // ps + 1) * ps)
        return pages

    def _load_back(self, nodes: list[Node], result: PrefillResult) -> bool:
        """Load host-resident nodes to the device at once (docs/controller.md#load-back); False when
        below the threshold or when the device cannot hold them even after eviction."""
        cfg = self.config
        tokens = sum(len(n.keys) for n in nodes) * cfg.page_size
        pages = None
        if tokens >= cfg.load_back_threshold:
            n = tokens // cfg.page_size
            if self.device.free < n:
                self._evict_device(pol.load_back_eviction_pages(cfg.sglang_version, n, self.device.free))
            if self.device.free >= n:
                pages = self.device.take_many(n)
        if self._observer is not None:
            self._emit(
                "load_back",
                load=pages is not None,
                nodes=page_views(nodes),
                device_pages=pages or [],
                tokens=tokens,
                threshold=cfg.load_back_threshold,
            )
        if pages is None:
            return False
        host = [p for n in nodes for p in (n.host or [])]
        keys = [k for n in nodes for k in n.storage_keys]
        moved, bad = self.plane.load(host, pages, keys)
        self.stats.bytes_h2d += moved
        result.bytes_loaded_from_host += moved
        result.mismatched_pages += sum(1 for key in bad if key not in self._counted_mismatches)
        i = 0
        for node in nodes:
            self.tree.set_device(node, pages[i : i + len(node.keys)])
            i += len(node.keys)
        return True

    # -- other operations -----------------------------------------------------------------------

    def flush(self) -> None:
        """Drop L1 and L2 (like SGLang's /flush_cache); L3 is untouched."""
        with self.lock:
            self.drain_l3_writes()
            self.tree = RadixTree(self.config.sglang_version, self.config.eviction_policy)
            self.device.reset()
            self.host.reset()

    def occupancy(self) -> dict[str, Any]:
        nodes = self.tree.all_nodes()
        return {
            "tree_nodes": len(nodes),
            "tree_pages": sum(len(n.keys) for n in nodes),
            "device_pages_used": self.device.used,
            "device_pages": self.device.capacity,
            "host_pages_used": self.host.used,
            "host_pages": self.host.capacity,
            "pages_on_device": sum(len(n.keys) for n in nodes if n.device is not None),
            "pages_on_host": sum(len(n.keys) for n in nodes if n.host is not None),
            "pages_stored": sum(min(n.stored, len(n.keys)) for n in nodes),
        }
