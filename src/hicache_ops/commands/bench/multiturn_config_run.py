"""One configuration of `bench multiturn` (L1, L1+L2 or L1+L2+L3) driven through every round of the
workload (multiturn_workload.py).

Each request is one `TieredCache.request(prompt, answer)`: the prompt is matched (up to its length
- 1), loaded, prefetched and computed, then the finish inserts prompt + answer but its last token,
as SGLang caches a finished request (docs/controller.md#finished-requests). Prefilled tokens =
prompt tokens - cached tokens. Hits are counted as the chosen SGLang version counts them: 0.5.14
per insert (a request's prefill and finish both count, so write_through_selective backs a turn up
at its own finish), 0.5.23 once per request (a page is backed up by the next request that still
finds it in L1, so after the L1 cliff new turns never reach L2 or L3).

The same workload runs side by side in three configurations of the same engine code (tree,
eviction, write and prefetch policies): L1 only, L1+L2, L1+L2+L3. The only difference between
the accounting-only mode and the real-bytes mode is the plane factory (`_build_accounting` /
`_build_bytes`): the engine builder's byte-free planes, or real device/host pools and Mooncake.

Pure library: no typer, no rich; torch and mooncake are imported only by the real-bytes mode.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hicache_ops import interrupt
from hicache_ops.commands.bench.multiturn_workload import CONFIGS, MultiturnSpec, workload_tokens
from hicache_ops.engine.scheduler import WaveStats, run_wave
from hicache_ops.errors import InputError

# Real-bytes L3: the Mooncake segment holds every page once, with this much headroom.
SEGMENT_HEADROOM = 1.25
SEGMENT_EXTRA_BYTES = 16 * 2**20

Progress = Callable[[str, int, int], None]  # (configuration, round just finished, rounds)


# ---------------------------------------------------------------------------------------------
# Plane factories: the only difference between the two modes
# ---------------------------------------------------------------------------------------------


def _build_accounting(spec: MultiturnSpec, config: str):
    """(cache, close): the byte-free planes and an unbounded in-process L3."""
    from hicache_ops.engine.builder import build_accounting

    return build_accounting(spec.engine_spec(config), l3=config == "l1_l2_l3"), (lambda: None)


def _build_bytes(spec: MultiturnSpec, config: str):
    """(cache, close): real device and host pools; L3 is Mooncake (an embedded master and a store
    client owning a segment sized for every page of the run)."""
    try:
        from hicache_ops.engine import bytes_plane as _bytes_plane  # noqa: F401  (torch and the kernels)
        from hicache_ops.engine.builder import build_bytes
    except ImportError as exc:
        raise InputError(
            "real-bytes mode needs the bytes plane (hicache_ops.engine.bytes_plane), which cannot be imported here: "
            f"{exc}.",
            hint="Pass --accounting-only, or install torch and the package's kernels.",
        ) from None
    engine_spec = spec.engine_spec(config)
    if config != "l1_l2_l3":
        return build_bytes(engine_spec), (lambda: None)

    from hicache_ops.mooncake.master import EmbeddedMaster
    from hicache_ops.mooncake.store_client import StoreClient

    host = engine_spec.host_layout(mooncake=True)
    pages = spec.clients * spec.history_pages(spec.rounds)
    segment = int(pages * host.bytes_per_page * engine_spec.tp_size * SEGMENT_HEADROOM) + SEGMENT_EXTRA_BYTES
    master = EmbeddedMaster().start()
    store = None
    try:
        store = StoreClient.connect(master.rpc_address, segment_size=segment)
        cache = build_bytes(engine_spec, store)
    except BaseException:
        if store is not None:
            store.close()
        master.stop()
        raise

    def close() -> None:
        try:
            store.close()
        finally:
            master.stop()

    return cache, close


# ---------------------------------------------------------------------------------------------
# One configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class ConfigRun:
    """Per-round totals over all clients for one configuration."""

    name: str
    cached: list[int] = field(default_factory=list)
    device_hit: list[int] = field(default_factory=list)
    host_hit: list[int] = field(default_factory=list)
    storage_hit: list[int] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    occupancy: dict = field(default_factory=dict)
    device_pages: int = 0
    host_pages: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    waves: dict = field(default_factory=dict)  # the concurrency model's totals (WaveStats)
    interrupted: bool = False  # stopped before its last round

    @property
    def rounds_done(self) -> int:
        return len(self.cached)


def run_config(
    spec: MultiturnSpec,
    config: str,
    progress: Progress | None = None,
    tokens: np.ndarray | None = None,
    stop: Callable[[], bool] = interrupt.requested,
) -> ConfigRun:
    """Drive one configuration through every round of the workload; `stop()` true ends it after
    the round in progress (marked interrupted)."""
    from dataclasses import asdict

    if config not in CONFIGS:
        raise InputError(f"configuration {config!r} is unknown.", hint=f"Use one of: {', '.join(CONFIGS)}.")
    if tokens is None:
        tokens = workload_tokens(spec)
    factory = _build_accounting if spec.accounting_only else _build_bytes
    cache, close = factory(spec, config)
    run = ConfigRun(
        config,
        device_pages=cache.config.device_pages,
        host_pages=cache.config.host_pages if cache.config.enable_l2 else 0,
    )
    turn = spec.turn_tokens
    # The run allocates millions of small, acyclic objects (tree nodes, queue entries): the cyclic
    # collector finds nothing in them and, left on, costs a third of the run. Restored after.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        waves = WaveStats()
        keys: dict[int, tuple[list[str], list[str]]] = {}  # per client: its last prompt's page keys
        for r in range(spec.rounds):
            if stop():
                run.interrupted = True
                break
            end = (r + 1) * turn
            prompt_end = end - spec.output_tokens
            device = host = storage = 0
            for result in _serve_round(cache, spec, tokens, prompt_end, end, waves, keys):
                device += result.device_hit
                host += result.host_hit
                storage += result.storage_hit
            cached = device + host + storage
            run.cached.append(cached)
            run.device_hit.append(device)
            run.host_hit.append(host)
            run.storage_hit.append(storage)
            if progress is not None:
                progress(config, r, spec.rounds)
        run.stats = asdict(cache.stats)
        run.occupancy = cache.occupancy()
        if spec.concurrency is not None:
            run.waves = asdict(waves)
    finally:
        run.elapsed_s = time.perf_counter() - t0
        run.cpu_s = time.process_time() - c0
        if gc_was_enabled:
            gc.enable()
        close()
    return run


def _serve_round(
    cache,
    spec: MultiturnSpec,
    tokens: np.ndarray,
    prompt_end: int,
    end: int,
    waves: WaveStats,
    keys: dict[int, tuple[list[str], list[str]]],
) -> list:
    """One round's requests: one at a time, or in waves of `concurrency` clients arriving together.

    One at a time, a client's prompt extends its previous one, so its page keys continue that
    prompt's (`keys`, updated here): each round hashes only its new pages, as the same keys."""
    clients = range(spec.clients)
    if spec.output_tokens == 0:  # nothing is generated: the prompt alone
        return [cache.prefill(tokens[c, :prompt_end]) for c in clients]
    if spec.concurrency is None:
        out = []
        for c in clients:
            prompt = tokens[c, :prompt_end]
            keys[c] = cache.keys_for(prompt, None, None, known=keys.get(c))
            out.append(cache.request(prompt, tokens[c, prompt_end:end], known_keys=keys[c]))
        return out
    out = []
    for first in range(0, spec.clients, spec.concurrency):
        wave = [(tokens[c, :prompt_end], tokens[c, prompt_end:end]) for c in clients[first : first + spec.concurrency]]
        out += run_wave(cache, wave, waves)
    return out
