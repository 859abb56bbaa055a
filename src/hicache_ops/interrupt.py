"""Stopping a long command on Ctrl-C or SIGTERM with an honest account of what it did.

    with interrupt.stop_on_signals():          # the CLI, around a long command
        for item in items:
            if interrupt.requested():          # between units of work: stop submitting
                break
            result = interrupt.call(client.prefill, ...)  # a blocking call a stop abandons at once

The first SIGINT or SIGTERM sets a stop request: loops stop submitting, let work already in
flight finish within its own bound, and return what they did marked interrupted (the CLI prints
the usual summary and exits 130). A blocking call made through `call()` is abandoned at once
instead: Interrupted is raised and the call's result is not counted as done. A second signal
raises KeyboardInterrupt wherever the main thread is. Reruns resume because every loop skips
work already done.

The first signal's handler only records the stop: it takes no lock and raises nothing. An
exception raised from a handler lands at whatever bytecode the main thread is running, e.g. just
after a library's `lock.acquire()` and before its `with` block can release it (httpcore's pool
lock: the client's close then waits forever), so `call()` runs the blocking call in a worker
thread and the main thread, polling in this module, raises Interrupted at a point of our own.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

from hicache_ops.errors import HicacheError

EXIT_CODE = 130  # what shells report for a command ended by SIGINT
# How often a wait in the main thread looks at the stop request: a stop is seen within this.
POLL_S = 0.02

T = TypeVar("T")


@dataclass
class _State:
    # A plain flag, not a threading.Event: setting an Event takes its lock, and a signal handler
    # that waits on a lock the main thread holds (it was interrupted inside Event.wait) never returns.
    stopped: bool = False
    signal: str | None = None  # why the stop was requested (a signal name or the caller's reason)


_state = _State()


class Interrupted(HicacheError):
    """The user stopped the command (Ctrl-C or SIGTERM): exit 130."""

    exit_code = EXIT_CODE
    code = "interrupted"


def requested() -> bool:
    return _state.stopped


def request(reason: str = "a stop was requested") -> None:
    """Ask every loop to stop (what the signal handler does; also for callers without signals)."""
    _state.signal = _state.signal or reason
    _state.stopped = True


def reason() -> str:
    return _state.signal or "not stopped"


def wait(seconds: float) -> bool:
    """Sleep up to `seconds`; True as soon as a stop is requested (within POLL_S)."""
    end = time.monotonic() + seconds
    while not _state.stopped:
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(POLL_S, left))
    return True


def check(what: str) -> None:
    """Raise Interrupted if a stop was requested (`what`: what stops, for the message)."""
    if _state.stopped:
        raise Interrupted(f"{what} stopped on {reason()}.", hint="Rerun to resume: finished work is skipped.")


def call(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, abandoned at once on a stop request: Interrupted is raised in the main
    thread within POLL_S, and the call, left running in a daemon worker thread, is not counted.
    Abandon what it uses too (close it; never reuse it for another call). Off the main thread
    (no signal lands there) it is a plain call."""
    check("the command")
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    outcome: dict[str, T] = {}
    failure: list[BaseException] = []
    done = threading.Event()  # the handler never touches it: waiting on it is safe in the main thread

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller, as a plain call would raise it
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="hicache-call").start()
    while not done.wait(POLL_S):
        check("the command")
    if failure:
        raise failure[0]
    return outcome["value"]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Takes no lock and raises nothing on the first signal (see the module's docstring).
    name = signal.Signals(signum).name
    if _state.stopped:
        raise KeyboardInterrupt(f"second {name}")
    request(name)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into a stop request while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state.stopped = False
        _state.signal = None
