"""`bench multiturn` in parallel: each configuration in a process of its own (they share nothing),
at most `workers` at a time, its progress and result sent back on a queue.

A terminal's Ctrl-C reaches every worker: the parent alone decides, through a stop event the
workers check after each round; a SIGTERM to the whole group stops a worker the same way. A
worker's HicacheError is raised again in the parent with its message, hint and exit code; any
other failure as a RuntimeError naming the worker.

Pure library: no typer, no rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hicache_ops import interrupt
from hicache_ops.commands.bench.multiturn_config_run import ConfigRun, Progress, run_config
from hicache_ops.commands.bench.multiturn_workload import MultiturnSpec
from hicache_ops.errors import HicacheError

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkProcess, SpawnContext, SpawnProcess
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event


def _worker(spec: MultiturnSpec, config: str, queue: Queue[Any], stop: Event) -> None:
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
        run = run_config(
            spec,
            config,
            progress=lambda name, r, n: queue.put(("progress", name, r)),
            stop=lambda: stop.is_set() or bool(terminated),
        )
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


def run_parallel(
    spec: MultiturnSpec, configs: tuple[str, ...], workers: int, progress: Progress | None
) -> dict[str, ConfigRun]:
    """Each configuration in its own process (they share nothing); at most `workers` at a time."""
    import multiprocessing as mp
    import queue as queue_mod

    # fork when this process runs one thread (the CLI; pytest): children start at once and need no
    # importable __main__. With other threads about, forking could copy a held lock: spawn.
    import threading

    single = threading.active_count() == 1 and "fork" in mp.get_all_start_methods()
    ctx: SpawnContext | ForkContext = mp.get_context("fork") if single else mp.get_context("spawn")
    queue: Queue[Any] = ctx.Queue()
    stop = ctx.Event()
    pending = list(configs)
    running: dict[str, SpawnProcess | ForkProcess] = {}
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


def available_cpus() -> int:
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
