"""What TieredCache's parts share: a queued request (Arrival) and its issued prefetch, and the
state and steps one part (a mixin: pools, backups, the L3 prefetch, admission) uses of another,
declared once for the type checker (cache.py sets the state, the parts define the steps)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.page_pools import PagePool
from hicache_ops.engine.planes import DataPlane, L3Tier, ReadOutcome
from hicache_ops.engine.results import CacheStats, PrefetchInfo, PrefillResult
from hicache_ops.engine.tree import Node, RadixTree

TokenKeys = tuple[list[str], list[str]]  # (tree keys, L3 page keys) of a prompt's whole pages


@dataclass
class IssuedPrefetch:
    """An issued prefetch, holding its host pages until the request's admission lands it."""

    pos: int  # the first page it reads
    requested_tokens: int
    host_pages: list[int]
    outcome: ReadOutcome
    issued_at: float = 0.0  # the scheduler clock when the read started (outcome.done_at counts from it)
    # Set by the concurrency model's admission check (Admission.check_prefetch): when the stop
    # policy's clock started (0.5.23: the first check that found the read unfinished), when the
    # check ended the prefetch, and how many pages counted then. None: not ended yet.
    first_check_at: float | None = None
    stopped_at: float | None = None
    completed: int | None = None
    in_flight: bool = True  # its requested tokens still count against the in-flight limit


@dataclass(eq=False)
class MatchedPrefill:
    """A prompt's prefill between its match (its prefetch landed, its host part loaded back,
    its path locked) and its compute and insert. SGLang matches each request a pass admits in
    turn and runs their prefills after the pass (docs/oracle.md#scheduler-level-code)."""

    n_pages: int
    result: PrefillResult
    keys: TokenKeys
    held: list[Node]
    on_device: list[Node]  # the prefix the compute and insert start below
    elapsed_ms: float  # the match half's time (its timings' total so far)
    device_evicted: int  # what the match half evicted and backed up
    host_evicted: int
    backup_bytes: int
    l3_bytes: int
    # The device pages past the prefix (the partial last page's last), when the scheduler's pass
    # allocated them before any of its prefills ran (`allocate_admitted`); None: the compute takes them.
    allocated: list[int] | None = None


@dataclass(eq=False)
class Arrival:
    """A request queued by the concurrency model (scheduler.py), between arrival and finish."""

    prompt: np.ndarray
    output: np.ndarray
    n_pages: int
    keys: tuple[list[str], list[str]]
    result: PrefillResult
    decode_passes: int
    prefetch: IssuedPrefetch | None = None
    # 0.5.23's miss re-query (docs/controller.md#miss-re-query): armed when its last prefetch was
    # refused by the in-flight limit, found less than the threshold in L3 or no host room for the
    # hit; `retry_due` is the scheduler step it is due at (set at the first step that sees it
    # armed); `retries` counts re-issues (the device-hit-loss re-query included).
    retry_armed: bool = False
    retry_due: int | None = None
    retries: int = 0
    retried_at: list[int] = field(default_factory=list)  # the scheduler steps its miss was re-queried at
    anchor: Node | None = None  # the node its prefetch attaches below, host-pinned until admission
    matched_pages: int = 0  # its local match when its prefetch was last considered
    held: list[Node] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)  # the device page of its partial last prompt page
    matched: MatchedPrefill | None = None  # admitted on this pass, its prefill yet to run


class CacheParts:
    config: CacheConfig
    plane: DataPlane
    l3: L3Tier | None
    tree: RadixTree
    device: PagePool
    host: PagePool
    stats: CacheStats
    lock: threading.RLock
    in_flight_tokens: int
    reserved_tokens: int
    clock: float | None
    _pending_l3_writes: list[tuple[float, Node, int]]
    _l3_writer_free_at: float
    _l3_page_bytes: float
    _observer: Callable[[str, dict[str, Any]], None] | None
    _counted_mismatches: set[str]
    _write_threshold: int | None
    _chains_ancestors: bool
    _last_backup_bytes: int
    _last_l3_bytes: int

    if TYPE_CHECKING:

        def _emit(self, event: str, **data: Any) -> None: ...

        def _alloc_host(self, n: int, at_least: int | None = None, prefetch: bool = False) -> list[int] | None: ...

        def _alloc_device(self, n: int) -> list[int]: ...

        def _evict_device(self, n: int) -> None: ...

        def _compute_start(self, matched: MatchedPrefill) -> tuple[int, list[Node]]: ...

        def _evict_for_prefill(self, extend_tokens: int) -> None: ...

        def keys_for(
            self,
            tokens: np.ndarray,
            extra_key: str | None,
            cache_salt: str | None,
            known: TokenKeys | None = None,
        ) -> TokenKeys: ...

        def _check_prompt(self, tokens: Any) -> tuple[np.ndarray, int]: ...

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
            known: TokenKeys | None = None,
        ) -> tuple[PrefillResult, list[Node], TokenKeys, list[int]]: ...

        def _prefill_match(
            self,
            arr: np.ndarray,
            n_pages: int,
            extra_key: str | None,
            cache_salt: str | None,
            with_keys: bool,
            *,
            arrival: Arrival | None = None,
            known: TokenKeys | None = None,
        ) -> MatchedPrefill: ...

        def _prefill_compute(
            self, matched: MatchedPrefill, force_backup: bool, *, count_hits: bool = True, hold_tail: bool = False
        ) -> tuple[PrefillResult, list[Node], TokenKeys, list[int]]: ...

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
        ) -> None: ...

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
        ) -> tuple[IssuedPrefetch | None, bool]: ...

        def _prefetch_budget(self, hold: IssuedPrefetch) -> float: ...

        def _release_in_flight(self, hold: IssuedPrefetch) -> None: ...

        def drain_l3_writes(self) -> None: ...
