"""The multi-turn benchmark (docs/workloads.md#multi-turn-workload), run against the embedded tiered cache.

The workload, its pools and the ceiling h_max(r): multiturn_workload.py.

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

A stop request (Ctrl-C, hicache_ops/interrupt.py) ends each configuration after the round in
progress; configurations not yet started are not run. The result then covers the rounds finished,
per configuration, and its totals the rounds every configuration finished.

Pure library: no typer, no rich; torch and mooncake are imported only by the real-bytes mode.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import interrupt
from ..engine.scheduler import WaveStats, run_wave
from ..errors import HicacheError, InputError
from .multiturn_workload import CONFIGS, LABELS, MultiturnSpec, workload_tokens

# Real-bytes L3: the Mooncake segment holds every page once, with this much headroom.
SEGMENT_HEADROOM = 1.25
SEGMENT_EXTRA_BYTES = 16 * 2**20

Progress = Callable[[str, int, int], None]  # (configuration, round just finished, rounds)


# ---------------------------------------------------------------------------------------------
# Plane factories: the only difference between the two modes
# ---------------------------------------------------------------------------------------------


def _build_accounting(spec: MultiturnSpec, config: str):
    """(cache, close): the byte-free planes and an unbounded in-process L3."""
    from ..engine.builder import build_accounting

    return build_accounting(spec.engine_spec(config), l3=config == "l1_l2_l3"), (lambda: None)


def _build_bytes(spec: MultiturnSpec, config: str):
    """(cache, close): real device and host pools; L3 is Mooncake (an embedded master and a store
    client owning a segment sized for every page of the run)."""
    try:
        from ..engine.builder import build_bytes
        from ..engine import bytes as _bytes_plane  # noqa: F401  (torch and the kernels)
    except ImportError as exc:
        raise InputError(
            f"real-bytes mode needs the bytes plane (hicache_ops.engine.bytes), which cannot be imported here: {exc}.",
            hint="Pass --accounting-only, or install torch and the package's kernels.",
        ) from None
    engine_spec = spec.engine_spec(config)
    if config != "l1_l2_l3":
        return build_bytes(engine_spec), (lambda: None)

    from ..mooncake.master import EmbeddedMaster
    from ..mooncake.store import StoreClient

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


def run_config(spec: MultiturnSpec, config: str, progress: Progress | None = None,
               tokens: np.ndarray | None = None, stop: Callable[[], bool] = interrupt.requested) -> ConfigRun:
    """Drive one configuration through every round of the workload; `stop()` true ends it after
    the round in progress (marked interrupted)."""
    from dataclasses import asdict

    if config not in CONFIGS:
        raise InputError(f"configuration {config!r} is unknown.", hint=f"Use one of: {', '.join(CONFIGS)}.")
    if tokens is None:
        tokens = workload_tokens(spec)
    factory = _build_accounting if spec.accounting_only else _build_bytes
    cache, close = factory(spec, config)
    run = ConfigRun(config, device_pages=cache.config.device_pages,
                    host_pages=cache.config.host_pages if cache.config.enable_l2 else 0)
    turn = spec.turn_tokens
    # The run allocates millions of small, acyclic objects (tree nodes, queue entries): the cyclic
    # collector finds nothing in them and, left on, costs a third of the run. Restored after.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        waves = WaveStats()
        for r in range(spec.rounds):
            if stop():
                run.interrupted = True
                break
            end = (r + 1) * turn
            prompt_end = end - spec.output_tokens
            device = host = storage = 0
            for result in _serve_round(cache, spec, tokens, prompt_end, end, waves):
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


def _serve_round(cache, spec: MultiturnSpec, tokens: np.ndarray, prompt_end: int, end: int, waves: WaveStats):
    """One round's requests: one at a time, or in waves of `concurrency` clients arriving together."""
    clients = range(spec.clients)
    if spec.output_tokens == 0:  # nothing is generated: the prompt alone
        return [cache.prefill(tokens[c, :prompt_end]) for c in clients]
    if spec.concurrency is None:
        return [cache.request(tokens[c, :prompt_end], tokens[c, prompt_end:end]) for c in clients]
    out = []
    for first in range(0, spec.clients, spec.concurrency):
        wave = [(tokens[c, :prompt_end], tokens[c, prompt_end:end]) for c in clients[first : first + spec.concurrency]]
        out += run_wave(cache, wave, waves)
    return out


# ---------------------------------------------------------------------------------------------
# Three configurations side by side
# ---------------------------------------------------------------------------------------------


@dataclass
class MultiturnResult:
    spec: MultiturnSpec
    runs: dict[str, ConfigRun]
    workers: int
    wall_s: float
    interrupted: bool = False  # a stop request ended some configuration early or left one unstarted

    @property
    def rounds_reported(self) -> int:
        """Rounds with a figure for at least one configuration."""
        return max((run.rounds_done for run in self.runs.values()), default=0)

    @property
    def rounds_totalled(self) -> int:
        """Rounds every configuration finished: the totals cover these, so they compare like with like."""
        return min((run.rounds_done for run in self.runs.values()), default=0)

    @property
    def mode(self) -> str:
        return "accounting" if self.spec.accounting_only else "bytes"

    def prompt_tokens(self, r: int) -> int:
        return self.spec.clients * self.spec.prompt_tokens(r)

    def hit_rate(self, config: str, r: int) -> float:
        return self.runs[config].cached[r] / self.prompt_tokens(r)

    def prefilled(self, config: str, r: int) -> int:
        return self.prompt_tokens(r) - self.runs[config].cached[r]

    def ceiling_tokens(self, r: int) -> int:
        """The most a page-granular cache can hit in round r, over all clients."""
        return self.spec.clients * self.spec.history_pages(r) * self.spec.page_size

    def cliffs(self) -> dict[str, dict]:
        """Per configuration: the predicted cliff, the first round below the (paged) ceiling, and
        the first round from which the hit rate stays at zero to the end."""
        predicted = self.spec.predicted_cliffs()
        out = {}
        for name, run in self.runs.items():
            rounds = range(run.rounds_done)
            leaves = next((r for r in rounds if run.cached[r] < self.ceiling_tokens(r)), None)
            zero_from = None
            for r in reversed(rounds):
                if r == 0 or run.cached[r] != 0:
                    break
                zero_from = r
            out[name] = {"predicted": predicted.get(name), "leaves_ceiling": leaves, "zero_from": zero_from}
        return out

    def to_json(self) -> dict:
        spec = self.spec
        rounds = []
        for r in range(self.rounds_reported):
            entry = {
                "round": r,
                "prompt_tokens": self.prompt_tokens(r),
                "ceiling": spec.ceiling(r),
                "ceiling_paged": spec.ceiling_paged(r),
            }
            done = [name for name, run in self.runs.items() if r < run.rounds_done]
            entry.update({name: self.hit_rate(name, r) if name in done else None for name in self.runs})
            entry["prefilled_tokens"] = {name: self.prefilled(name, r) if name in done else None for name in self.runs}
            rounds.append(entry)
        totalled = range(self.rounds_totalled)
        total_prompt = sum(self.prompt_tokens(r) for r in totalled)
        prefilled = {name: sum(self.prefilled(name, r) for r in totalled) for name in self.runs}
        prefilled["ceiling"] = total_prompt - sum(self.ceiling_tokens(r) for r in totalled)
        configurations = {}
        for name, run in self.runs.items():
            s = run.stats
            configurations[name] = {
                "label": LABELS[name],
                "device_pages": run.device_pages,
                "host_pages": run.host_pages,
                "l3": name == "l1_l2_l3",
                "cached_tokens": sum(run.cached),
                "device_hit_tokens": sum(run.device_hit),
                "host_hit_tokens": sum(run.host_hit),
                "storage_hit_tokens": sum(run.storage_hit),
                "bytes": {
                    "device_to_host": s.get("bytes_d2h", 0),
                    "host_to_device": s.get("bytes_h2d", 0),
                    "host_to_l3": s.get("bytes_l3_write", 0),
                    "l3_to_host": s.get("bytes_l3_read", 0),
                },
                "device_evictions": s.get("device_evictions", 0),
                "host_evictions": s.get("host_evictions", 0),
                "mismatched_pages": s.get("mismatched_pages", 0),
                "elapsed_s": run.elapsed_s,
                "cpu_s": run.cpu_s,
                "prefetches": {
                    "issued": s.get("prefetches_issued", 0),
                    "rate_limited": s.get("prefetches_rate_limited", 0),
                    "revoked": s.get("prefetches_revoked", 0),
                },
                "waves": run.waves,
                "rounds_done": run.rounds_done,
            }
        return {
            "mode": self.mode,
            "workload": spec.to_json(),
            "pools": {
                "device_pages": spec.device_pages,
                "device_tokens": spec.device_tokens,
                "l1_rounds": spec.l1_rounds_effective,
                "host_pages": spec.host_pages,
                "host_tokens": spec.host_pages * spec.page_size,
                "hicache_ratio": spec.hicache_ratio,
                "write_policy": spec.write_policy,
            },
            "rounds": rounds,
            "prompt_tokens": total_prompt,
            "prefilled_tokens": prefilled,
            "cliffs": self.cliffs(),
            "configurations": configurations,
            "workers": self.workers,
            "wall_s": self.wall_s,
            "in_flight_rule": _in_flight_rule(spec),
            "interrupted": self.interrupted,
            "rounds_totalled": self.rounds_totalled,
        }


def _in_flight_rule(spec: MultiturnSpec) -> str:
    """The in-flight prefetch limit SGLang applies to these pools (docs/controller.md#in-flight-limit)."""
    from ..sglang import policy as pol

    limit = pol.prefetch_limit_tokens(spec.sglang_version, spec.host_pages * spec.page_size, spec.device_tokens)
    return f"limit {limit:,} tokens, {pol.prefetch_limit_rule(spec.sglang_version)}; {pol.retry_rule(spec.sglang_version)}"


def _worker(spec: MultiturnSpec, config: str, queue, stop) -> None:
    """Child process: run one configuration, report progress and the result on `queue`; the
    parent's `stop` event, or a SIGTERM of its own, ends it after the round in progress."""
    import signal

    # A terminal's Ctrl-C reaches the whole process group: the parent decides, through `stop`. A
    # SIGTERM to the group (a service manager) stops the worker like `stop`, so its rounds still
    # reach the parent; the parent ends a worker whose result it drops with SIGKILL.
    terminated: list[bool] = []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(True))
    try:
        run = run_config(spec, config, progress=lambda name, r, n: queue.put(("progress", name, r)),
                         stop=lambda: stop.is_set() or bool(terminated))
        queue.put(("done", config, run))
    except HicacheError as err:
        queue.put(("error", config, (type(err).__name__, err.message, err.hint, err.exit_code)))
    except BaseException as exc:  # a bug: hand it to the parent as text
        queue.put(("crash", config, f"{type(exc).__name__}: {exc}"))


class _WorkerError(HicacheError):
    """A worker's HicacheError, re-raised in the parent with its message, hint and exit code."""

    def __init__(self, message: str, hint: str | None, exit_code: int):
        super().__init__(message, hint)
        self.exit_code = exit_code
        self.code = {2: "input_error", 3: "unreachable"}.get(exit_code, "error")


def _run_parallel(spec: MultiturnSpec, configs: tuple[str, ...], workers: int, progress: Progress | None) -> dict:
    """Each configuration in its own process (they share nothing); at most `workers` at a time."""
    import multiprocessing as mp
    import queue as queue_mod

    # fork when this process runs one thread (the CLI; pytest): children start at once and need no
    # importable __main__. With other threads about, forking could copy a held lock: spawn.
    import threading

    single = threading.active_count() == 1 and "fork" in mp.get_all_start_methods()
    ctx = mp.get_context("fork" if single else "spawn")
    queue = ctx.Queue()
    stop = ctx.Event()
    pending = list(configs)
    running: dict[str, object] = {}
    runs: dict[str, ConfigRun] = {}
    try:
        while pending or running:
            if interrupt.requested() and not stop.is_set():
                stop.set()  # running workers finish their round and report; the others never start
                pending.clear()
            while pending and len(running) < workers:
                name = pending.pop(0)
                proc = ctx.Process(target=_worker, args=(spec, name, queue, stop), daemon=True)
                proc.start()
                running[name] = proc
            try:
                kind, name, payload = queue.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [name for name, proc in running.items() if not proc.is_alive()]
                if not dead:
                    continue
                if interrupt.requested():  # killed along with us (SIGTERM to the whole group): no result
                    running.pop(dead[0]).join()
                    continue
                try:  # a worker that just put its result and exited: its message is in the pipe
                    kind, name, payload = queue.get(timeout=5.0)
                except queue_mod.Empty:
                    proc = running[dead[0]]
                    raise RuntimeError(
                        f"the {dead[0]} worker exited with code {proc.exitcode} without a result"
                    ) from None
            if kind == "progress":
                if progress is not None:
                    progress(name, payload, spec.rounds)
            elif kind == "done":
                runs[name] = payload
                finished = running.pop(name, None)  # None: already dropped as dead after a stop
                if finished is not None:
                    finished.join()
            elif kind == "error":
                _, message, hint, code = payload
                raise _WorkerError(message, hint, code)
            else:
                raise RuntimeError(f"the {name} worker failed: {payload}")
    finally:
        for proc in running.values():  # results no one will read: accounting-only workers hold nothing else
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=5)
    return runs


def run_multiturn(spec: MultiturnSpec, *, progress: Progress | None = None, workers: int | None = None,
                  configs: tuple[str, ...] = CONFIGS) -> MultiturnResult:
    """Run the workload in each configuration; accounting mode spreads them over processes.

    `workers` None: one process per configuration, up to the CPUs available, in accounting mode;
    1 (and always in real-bytes mode) runs them one after another in this process.
    """
    spec.validate()
    for name in configs:
        if name not in CONFIGS:
            raise InputError(f"configuration {name!r} is unknown.", hint=f"Use one of: {', '.join(CONFIGS)}.")
    if workers is None:
        # One process per configuration as soon as there are two CPUs: three processes on two
        # CPUs finish sooner than two at a time, since the configurations take unequal times.
        workers = len(configs) if spec.accounting_only and _cpus() >= 2 else 1
    if not spec.accounting_only:
        workers = 1
    workers = max(1, min(workers, len(configs)))
    t0 = time.perf_counter()
    if workers == 1:
        tokens = workload_tokens(spec)
        runs = {}
        for name in configs:
            if interrupt.requested():
                break
            runs[name] = run_config(spec, name, progress, tokens)
    else:
        runs = _run_parallel(spec, configs, workers, progress)
    runs = {name: runs[name] for name in configs if name in runs and runs[name].rounds_done}
    interrupted = len(runs) < len(configs) or any(run.interrupted for run in runs.values())
    if not runs:  # stopped before any round ended: no figure to report
        raise interrupt.Interrupted(f"bench multiturn stopped on {interrupt.reason()} before its first round ended: nothing was measured.")
    return MultiturnResult(spec, runs, workers, time.perf_counter() - t0, interrupted)


def _cpus() -> int:
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
