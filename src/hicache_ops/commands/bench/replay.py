"""`hicache bench replay`: a request trace through the tiered cache, for capacity planning.

Each request of the trace (replay_trace.py), in arrival order, is one prefill of its prompt in the
embedded engine, in accounting mode: the same tree, eviction and write/prefetch policies as the
real-bytes mode, with the byte counts a model geometry (`preset`) would move. Only the prompt is
cached: a trace records how many tokens were generated, not which. Hit rate = cached prompt
tokens / prompt tokens, per tier (L1 device, L2 host, L3 store) and together.

Beside it, from the same requests: the ceiling (an unbounded cache with SGLang's page rules) and
the published-style block LRU (replay_baseline.py); the report of one configuration or a sweep
(replay_report.py) puts them together, and replay_plot.py draws a sweep.

This module and replay_fast.py (the one-block path, which drives the tree, pools and backups
directly) are the command's only doors to the engine, so re-pointing it at a new engine API is a
change there alone: `ReplaySpec.engine_spec` (EngineSpec), `_build_cache` (build_accounting with an
L3Tier), `_serve_group` (TieredCache.prefill, one request at a time), `replay` (the cache's pool
sizes and CacheStats counters) and `MooncakeEvictingL3` (the L3Tier interface and its outcomes).

A bounded L3 (`--l3 TOKENS`) evicts as Mooncake's master does (`MooncakeEvictingL3`).
"""

from __future__ import annotations

import gc
import math
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.commands.bench import replay_baseline
from hicache_ops.commands.bench.replay_fast import OneBlockPath
from hicache_ops.commands.bench.replay_trace import MOONCAKE_BLOCK_TOKENS, TokenSource, Trace, TraceRequest
from hicache_ops.errors import InputError, SettingError
from hicache_ops.results import Result
from hicache_ops.sglang.hit_policy import LoadablePrefix, kv_only
from hicache_ops.sglang.page_keys import chain_keys
from hicache_ops.sglang.versions import NEWEST, validate_version

if TYPE_CHECKING:
    from hicache_ops.engine.planes import ReadOutcome, WriteOutcome
    from hicache_ops.sglang.page_keys import ObjectKeyScheme

TIERS: tuple[str, ...] = ("l1", "l2", "l3")
TIER_LABELS: dict[str, str] = {"l1": "L1 (device)", "l2": "L2 (host)", "l3": "L3 (Mooncake)"}
L3_MODES: tuple[str, ...] = ("none", "unbounded")
DEFAULT_L1_TOKENS = 3_000_000
DEFAULT_HICACHE_RATIO = 2.0
DEFAULT_PRESET = "llama-3.1-8b"

# Mooncake master defaults (docs/mooncake.md#eviction): eviction starts above this share of the
# segments in use, or after a put found no space, and frees at least this share per pass.
MOONCAKE_HIGH_WATERMARK = 0.90
MOONCAKE_EVICTION_RATIO = 0.05
# The lease an exist query or a read grants an object (ms): a leased object is never evicted.
MOONCAKE_LEASE_TTL_MS = 10_000.0

# (requests done, requests in all, seconds since the run's start, run number from 1, runs)
Progress = Callable[[int, int, float, int, int], None]


# ---------------------------------------------------------------------------------------------
# The configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplaySpec:
    """Pools as operators size them. L2: `l2_tokens` (0: none) or `hicache_ratio` x L1 (SGLang's
    default ratio when neither is given). L3: "none", "unbounded" or a capacity in tokens."""

    page_size: int = 64
    l1_tokens: int = DEFAULT_L1_TOKENS
    l2_tokens: int | None = None
    hicache_ratio: float | None = None
    l3: str | int = "unbounded"
    write_policy: str = "write_through"
    sglang_version: str = NEWEST
    preset: str = DEFAULT_PRESET

    def validate(self) -> ReplaySpec:
        def integer(name: str, value, minimum: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise SettingError(name.replace("-", "_"), f"{value!r} must be an integer >= {minimum}.")

        integer("page-size", self.page_size, 1)
        integer("l1-tokens", self.l1_tokens, self.page_size)
        validate_version(self.sglang_version)
        from hicache_ops.sglang.geometry import preset
        from hicache_ops.sglang.policy import check_write_policy

        check_write_policy(self.write_policy)
        preset(self.preset)
        if self.l2_tokens is not None and self.hicache_ratio is not None:
            raise InputError("give --l2-tokens or --hicache-ratio, not both.")
        if self.l2_tokens is not None:
            integer("l2-tokens", self.l2_tokens, 0)
            if 0 < self.l2_tokens <= self.l1_tokens:
                raise SettingError(
                    "l2_tokens",
                    f"{self.l2_tokens} must be above --l1-tokens {self.l1_tokens} (or 0 for no L2): "
                    "SGLang needs the host pool larger than the device pool.",
                )
        ratio = self.hicache_ratio
        if ratio is not None and (
            isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 1
        ):
            raise SettingError(
                "hicache_ratio", f"{ratio!r} must be above 1: SGLang needs the host pool larger than the device pool."
            )
        if isinstance(self.l3, int) and not isinstance(self.l3, bool):
            integer("l3", self.l3, self.page_size)
        elif self.l3 not in L3_MODES:
            raise SettingError("l3", f"{self.l3!r} must be none, unbounded or a capacity in tokens.")
        if self.l3 != "none" and not self.enable_l2:
            raise InputError(
                "an L3 tier needs an L2 (host) pool: SGLang stages every L3 read and write through it.",
                hint="Give --l2-tokens above --l1-tokens, or --l3 none.",
            )
        from hicache_ops.mooncake.store_client import check_fits_in_memory

        # The simulated pools keep a free list of their pages (about 40 bytes a page): refused before allocating.
        l1_pages = self.l1_tokens // self.page_size
        l2_pages = int(l1_pages * self.ratio) if self.enable_l2 else 0
        check_fits_in_memory(
            40 * (l1_pages + l2_pages),
            f"an L1 of {self.l1_tokens} tokens and an L2 of {l2_pages * self.page_size} tokens",
        )
        return self

    @property
    def enable_l2(self) -> bool:
        return self.l2_tokens != 0

    @property
    def device_tokens(self) -> int:
        return self.l1_tokens // self.page_size * self.page_size

    @property
    def ratio(self) -> float:
        if self.l2_tokens:
            return self.l2_tokens / self.device_tokens
        return DEFAULT_HICACHE_RATIO if self.hicache_ratio is None else float(self.hicache_ratio)

    @property
    def l3_pages(self) -> int | None:
        """None: unbounded (or no L3)."""
        return self.l3 // self.page_size if isinstance(self.l3, int) else None

    def engine_spec(self):
        from hicache_ops.engine.builder import EngineSpec
        from hicache_ops.sglang.geometry import preset

        return EngineSpec(
            geometry=preset(self.preset),
            page_size=self.page_size,
            device_tokens=self.device_tokens,
            hicache_ratio=self.ratio,
            host_asked_tokens=self.l2_tokens or None,  # exact: the ratio can lose a page to rounding
            write_policy=self.write_policy,
            sglang_version=self.sglang_version,
            enable_l2=self.enable_l2,
        )

    def with_tier(self, tier: str, tokens: int) -> ReplaySpec:
        """This configuration with one tier resized (a sweep point)."""
        from dataclasses import replace

        if tier == "l1":
            return replace(self, l1_tokens=tokens)
        if tier == "l2":
            return replace(self, l2_tokens=tokens, hicache_ratio=None)
        return replace(self, l3=tokens)

    def baseline_capacity(self) -> int | None:
        """The block LRU's one tier: as large as the largest tier here (the tiers are inclusive
        under write_through: L2 holds L1's pages, L3 holds L2's); None: unbounded."""
        if self.l3 == "unbounded":
            return None
        if isinstance(self.l3, int):
            return self.l3
        if self.l2_tokens:
            return self.l2_tokens
        if self.enable_l2:
            return int(self.device_tokens * self.ratio)
        return self.device_tokens


# ---------------------------------------------------------------------------------------------
# A bounded L3 that evicts as Mooncake's master does
# ---------------------------------------------------------------------------------------------


class MooncakeEvictingL3:
    """An L3 of `capacity_pages` pages whose eviction follows Mooncake's master
    (docs/mooncake.md#eviction):

    - the eviction thread runs when the share of space in use is above the high watermark (0.90)
      or a put found no space; a put that finds no space fails (the page is not stored);
    - a pass evicts ceil(objects x target) objects, target = max(0.05, used - 0.90 + 0.05), taken
      from the objects whose lease has expired, oldest lease first;
    - an exist query or a read grants a 10 s lease; a new object has none (its lease time is the
      clock's epoch), so objects never read since their put go first (among them, oldest put first:
      Mooncake leaves their order unspecified).

    The clock is the trace's (`advance(now_ms)` before each request) and the eviction pass runs
    there, between requests (Mooncake's thread wakes every few ms, far more often than requests
    arrive). A page's objects (every rank's, K and V) share one fate, so the count is in pages.
    The engine's `L3Tier` interface: lookup (no side pools), contiguous_hits, write, read.
    """

    def __init__(self, schemes: list[ObjectKeyScheme], bytes_per_page: int, capacity_pages: int):
        self.schemes = schemes
        self.bytes_per_page = bytes_per_page
        self.capacity = capacity_pages
        self.objects_per_page = sum(len(s.suffixes) for s in schemes)
        self.now_ms = 0.0
        # Pages in eviction order without a sort: never leased (put order), then leased (by lease
        # time: a new lease ends at now + TTL, never before an earlier one, so it moves to the end).
        self._unleased: OrderedDict[str, None] = OrderedDict()
        self._leased: OrderedDict[str, float] = OrderedDict()  # page key -> lease timeout (ms)
        self._need_eviction = False
        self.evictions = 0  # pages
        self.failed_puts = 0  # pages

    def __len__(self) -> int:
        return len(self._unleased) + len(self._leased)

    def __contains__(self, key: str) -> bool:
        return key in self._leased or key in self._unleased

    def advance(self, now_ms: float) -> None:
        self.now_ms = now_ms
        used = len(self) / self.capacity
        if used > MOONCAKE_HIGH_WATERMARK or self._need_eviction:
            self._evict(max(MOONCAKE_EVICTION_RATIO, used - MOONCAKE_HIGH_WATERMARK + MOONCAKE_EVICTION_RATIO))

    def _evict(self, target: float) -> None:
        self._need_eviction = False
        wanted = math.ceil(len(self) * target)
        unleased, leased = self._unleased, self._leased
        while wanted and unleased:
            unleased.popitem(last=False)
            wanted -= 1
            self.evictions += 1
        while wanted and leased and next(iter(leased.values())) <= self.now_ms:
            leased.popitem(last=False)
            wanted -= 1
            self.evictions += 1

    def _lease(self, key: str) -> bool:
        """Grant a lease if the page is stored; whether it is."""
        leased = self._leased
        if key in leased:
            leased.move_to_end(key)
        elif key in self._unleased:
            del self._unleased[key]
        else:
            return False
        leased[key] = self.now_ms + MOONCAKE_LEASE_TTL_MS
        return True

    def lookup(self, storage_keys: list[str]) -> LoadablePrefix:
        return kv_only(self.contiguous_hits(storage_keys))

    def contiguous_hits(self, storage_keys: list[str]) -> list[int]:
        count = 0
        for key in storage_keys:
            if not self._lease(key):
                break
            count += 1
        return [count] * len(self.schemes)

    def write(self, storage_keys: list[str], host_pages: list[int]) -> tuple[list[bool], WriteOutcome]:
        from hicache_ops.engine.planes import WriteOutcome

        outcome = WriteOutcome()
        ok = []
        for key in storage_keys:
            if self._lease(key):  # SGLang asks batch_is_exist first, which grants a lease
                outcome.skipped += self.objects_per_page
                ok.append(True)
            elif len(self) < self.capacity:
                self._unleased[key] = None
                outcome.written += self.objects_per_page
                outcome.nbytes += self.bytes_per_page
                ok.append(True)
            else:
                self._need_eviction = True
                self.failed_puts += 1
                outcome.failed.append(key)
                ok.append(False)
        return ok, outcome

    def read(self, storage_keys: list[str], host_pages: list[int]) -> ReadOutcome:
        from hicache_ops.engine.planes import ReadOutcome

        present = []
        for key in storage_keys:
            present.append(self._lease(key))
        n = len(storage_keys)
        return ReadOutcome(ok=present, done_at=[0.0] * n, verified=present, nbytes=sum(present) * self.bytes_per_page)


# ---------------------------------------------------------------------------------------------
# The engine adapter: the only calls into hicache_ops.engine
# ---------------------------------------------------------------------------------------------


def _build_cache(spec: ReplaySpec):
    """(cache, bounded L3 or None): the engine's accounting planes with the L3 the spec asks for."""
    from hicache_ops.engine.builder import build_accounting

    engine_spec = spec.engine_spec()
    if spec.l3_pages is None:
        return build_accounting(engine_spec, l3=spec.l3 == "unbounded"), None
    host = engine_spec.host_layout(mooncake=True)
    l3 = MooncakeEvictingL3(engine_spec.schemes(), host.bytes_per_page * engine_spec.tp_size, spec.l3_pages)
    return build_accounting(engine_spec, l3=True, shared_l3=l3), l3


# BlockKeys' tables, per TokenSource and page size (weak: they go with the TokenSource).
_KEY_TABLES: weakref.WeakKeyDictionary[TokenSource, dict[int, tuple[dict, dict]]] = weakref.WeakKeyDictionary()


class BlockKeys:
    """The page keys of mooncake-format prompts, hashed once per block and run (given to the
    engine's prefill as known keys, so it hashes nothing).

    Page keys are chained (docs/keys.md#page-keys): a page's key depends on its tokens and the key
    before it alone. When the page size divides the 512-token block, a block is whole pages, and
    its keys depend only on its tokens (its row in the block table) and the key of the page
    before it: the block's keys are computed once per (prior key, row) and reused. A prompt's keys
    are its blocks' keys laid end to end, cut to its whole pages (a partial last block's pages are
    the first of the whole block's). The keys are those `TieredCache.keys_for` gives a prompt with
    no namespace (tree and L3 keys alike, in both versions); mooncake lines carry none.
    Memory: one list of 512 / page size keys per distinct (prior key, block), about half the
    block table's 2 KiB per id at 64-token pages; kept as long as the TokenSource, per page size
    (the keys depend on the tokens and the page size alone: a sweep's points and a benchmark's
    repeats over one TokenSource hash each block once).
    """

    def __init__(self, tokens: TokenSource, page_size: int):
        self.tokens = tokens
        self.page_size = page_size
        tables = _KEY_TABLES.setdefault(tokens, {})
        if page_size not in tables:
            tables[page_size] = ({}, {})
        # _known: by (prior key, row); _first: a prompt's first block (no prior key), by row.
        self._known, self._first = tables[page_size]

    @staticmethod
    def applies(trace: Trace, page_size: int) -> bool:
        return trace.format == "mooncake" and MOONCAKE_BLOCK_TOKENS % page_size == 0

    def _block(self, prior: str | None, row: int) -> list[str]:
        if prior is None:
            keys = self._first.get(row)
            if keys is None:
                keys = self._first[row] = chain_keys(self.tokens.block(row), self.page_size, None)
            return keys
        keys = self._known.get((prior, row))
        if keys is None:
            keys = chain_keys(self.tokens.block(row), self.page_size, prior)
            self._known[(prior, row)] = keys
        return keys

    def whole_block(self, request: TraceRequest) -> list[str] | None:
        """The keys of `request`'s prompt when it is one whole block; None otherwise."""
        rows = self.tokens.block_rows(request)
        if isinstance(rows, int) and request.input_length == MOONCAKE_BLOCK_TOKENS:
            return self._block(None, rows)
        return None

    def __call__(self, request: TraceRequest, prompt_tokens: int) -> list[str]:
        """The keys of the whole pages of `request`'s prompt of `prompt_tokens` tokens."""
        rows = self.tokens.block_rows(request)
        pages = prompt_tokens // self.page_size
        if isinstance(rows, int):  # hot: one block (a page-reference stream)
            keys = self._block(None, rows)
            return keys if len(keys) == pages else keys[:pages]
        keys = []
        prior = None
        for row in rows:
            block = self._block(prior, row)
            keys += block
            prior = block[-1]
        return keys[:pages]


def _serve_group(
    cache,
    group,
    tokens: TokenSource,
    totals: dict,
    block_keys: BlockKeys | None = None,
    one_block: OneBlockPath | None = None,
) -> None:
    """One arrival group, one request after another (the engine serves one at a time today); a
    request that is one whole block goes by `one_block` when given (replay_fast.py)."""
    prefill = cache.prefill
    l1 = l2 = l3 = 0
    for request in group:
        if one_block is not None and block_keys is not None:
            keys = block_keys.whole_block(request)
            if keys is not None:
                hits = one_block.serve(keys)
                if hits is not None:
                    l1 += hits[0]
                    l2 += hits[1]
                    continue
        arr = tokens.tokens(request)
        if block_keys is None:
            result = prefill(arr, request.extra_key, request.cache_salt)
        else:
            keys = block_keys(request, arr.size)
            result = prefill(arr, known_keys=(keys, keys))
        l1 += result.device_hit
        l2 += result.host_hit
        l3 += result.storage_hit
    totals["l1"] += l1  # a group cut short by Ctrl-C is recounted from the cache's stats (replay)
    totals["l2"] += l2
    totals["l3"] += l3


# ---------------------------------------------------------------------------------------------
# One replay
# ---------------------------------------------------------------------------------------------


@dataclass
class ReplayRun:
    spec: ReplaySpec
    requests: int  # replayed
    prompt_tokens: int  # of the replayed requests
    cached: dict[str, int]  # per tier
    stats: dict
    pools: dict[str, int | None]  # tokens per tier (None: unbounded, 0: none)
    l3_evictions: int = 0
    l3_failed_puts: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False
    baseline: replay_baseline.ReferenceRun | None = None
    one_block_requests: int = 0  # served by replay_fast.py's one-block path

    @property
    def cached_tokens(self) -> int:
        return sum(self.cached.values())

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def tiers(self, bytes_per_token: int) -> ReplayTiers:
        s = self.stats
        moved = {  # (bytes written into the tier, bytes read out of it)
            "l1": (s["bytes_h2d"], s["bytes_d2h"]),
            "l2": (s["bytes_d2h"] + s["bytes_l3_read"], s["bytes_h2d"] + s["bytes_l3_write"]),
            "l3": (s["bytes_l3_write"], s["bytes_l3_read"]),
        }
        evictions = {"l1": s["device_evictions"], "l2": s["host_evictions"], "l3": self.l3_evictions}
        out: dict[str, dict[str, Any]] = {}
        for tier in TIERS:
            capacity = self.pools[tier]
            out[tier] = {
                "capacity_tokens": capacity,
                "capacity_bytes": None if capacity is None else capacity * bytes_per_token,
                "cached_tokens": self.cached[tier],
                "hit_rate": self.cached[tier] / self.prompt_tokens if self.prompt_tokens else 0.0,
                "evictions": evictions[tier],
                "bytes_written": moved[tier][0],
                "bytes_read": moved[tier][1],
            }
        return ReplayTiers(
            l1=TierFigures(**out["l1"]),
            l2=TierFigures(**out["l2"]),
            l3=L3Figures(**out["l3"], failed_puts=self.l3_failed_puts),
        )


class TierFigures(Result):
    """One tier of a `bench replay` run."""

    capacity_tokens: int | None = Field(description="the tier's size in tokens; `null`: unbounded, 0: none")
    capacity_bytes: int | None = Field(description="the tier's size in KV bytes of the preset; `null`: unbounded")
    cached_tokens: int = Field(description="prompt tokens this tier served")
    hit_rate: float = Field(description="cached_tokens / prompt tokens")
    evictions: int = Field(description="pages evicted from the tier")
    bytes_written: int = Field(description="KV bytes moved into the tier")
    bytes_read: int = Field(description="KV bytes moved out of the tier")


class L3Figures(TierFigures):
    """The L3 tier of a `bench replay` run."""

    failed_puts: int = Field(description="pages whose put found no space (a bounded L3)")


class ReplayTiers(Result):
    """`bench replay`'s figures per tier."""

    l1: TierFigures = Field(description="L1, the device pool")
    l2: TierFigures = Field(description="L2, the host pool")
    l3: L3Figures = Field(description="L3, the simulated Mooncake store")


def check_fits(spec: ReplaySpec, trace: Trace) -> None:
    longest = max(r.input_length for r in trace.requests)
    if longest // spec.page_size > spec.device_tokens // spec.page_size:
        raise InputError(
            f"the longest prompt of the trace has {longest:,} tokens, more than the L1 pool of "
            f"{spec.device_tokens:,} tokens holds.",
            hint=f"Give --l1-tokens {longest} or more.",
        )


def replay(
    spec: ReplaySpec,
    trace: Trace,
    tokens: TokenSource | None = None,
    progress: Progress | None = None,
    run_number: tuple[int, int] = (1, 1),
    one_block_path: bool = True,
) -> ReplayRun:
    """Run the trace through one configuration; Ctrl-C stops it with what was replayed so far
    (between arrival groups under interrupt.stop_on_signals, at once otherwise).
    `one_block_path`: serve one-block requests by replay_fast.py where it applies (the results
    are the same either way; False: every request by the engine's prefill)."""
    from dataclasses import asdict

    spec.validate()
    check_fits(spec, trace)
    tokens = tokens or TokenSource(trace)
    cache, bounded_l3 = _build_cache(spec)
    cfg = cache.config
    pools = {
        "l1": cfg.device_pages * spec.page_size,
        "l2": cfg.host_pages * spec.page_size if cfg.enable_l2 else 0,
        "l3": 0 if spec.l3 == "none" else (None if bounded_l3 is None else bounded_l3.capacity * spec.page_size),
    }
    totals = dict.fromkeys(TIERS, 0)
    block_keys = BlockKeys(tokens, spec.page_size) if BlockKeys.applies(trace, spec.page_size) else None
    one_block = None
    if one_block_path and block_keys is not None and OneBlockPath.applies(cache, MOONCAKE_BLOCK_TOKENS):
        one_block = OneBlockPath(cache, MOONCAKE_BLOCK_TOKENS)
    done = prompt = 0
    interrupted = False
    total = len(trace.requests)
    # Millions of small acyclic objects (tree nodes, queue entries): the cyclic collector finds
    # nothing in them and would cost a large share of the run. Restored after.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    t0 = time.perf_counter()
    try:
        for group in trace.groups():
            if interrupt.requested():
                interrupted = True
                break
            if bounded_l3 is not None:
                bounded_l3.advance(group[0].timestamp)
            _serve_group(cache, group, tokens, totals, block_keys, one_block)
            done += len(group)
            prompt += sum(r.input_length for r in group)
            if progress is not None:
                progress(done, total, time.perf_counter() - t0, *run_number)
    except KeyboardInterrupt:
        interrupted = True
        # A request cut off midway may have counted hits; the totals keep whole requests only.
        totals = {
            tier: cache.stats.__dict__[key]
            for tier, key in (("l1", "device_hit"), ("l2", "host_hit"), ("l3", "storage_hit"))
        }
        done, prompt = cache.stats.requests, cache.stats.prompt_tokens
    finally:
        elapsed = time.perf_counter() - t0
        if gc_was_enabled:
            gc.enable()
    return ReplayRun(
        spec,
        done,
        prompt,
        totals,
        asdict(cache.stats),
        pools,
        l3_evictions=bounded_l3.evictions if bounded_l3 else 0,
        l3_failed_puts=bounded_l3.failed_puts if bounded_l3 else 0,
        elapsed_s=elapsed,
        interrupted=interrupted,
        one_block_requests=one_block.served if one_block is not None else 0,
    )


# ---------------------------------------------------------------------------------------------
# --l3 as given on the command line
# ---------------------------------------------------------------------------------------------


def parse_l3(text: str) -> str | int:
    value = str(text).strip().lower()
    if value in L3_MODES:
        return value
    try:
        return int(value.replace("_", ""))
    except ValueError:
        raise SettingError("l3", f"{text!r} must be none, unbounded or a capacity in tokens.") from None
