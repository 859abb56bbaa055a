"""Stopping a long command on Ctrl-C or SIGTERM with an honest account of what it did.

    with interrupt.stop_on_signals():          # the CLI, around a long command
        for item in items:
            if interrupt.requested():          # between units of work: stop submitting
                break
            with interrupt.cancellable():      # a blocking call the signal may abandon at once
                result = client.prefill(...)

The first SIGINT or SIGTERM sets a stop request: loops stop submitting, let work already in
flight finish within its own bound, and return what they did marked interrupted (the CLI prints
the usual summary and exits 130). Inside `cancellable()` the signal raises Interrupted at once
instead: the call's result is then not counted as done. A second signal raises KeyboardInterrupt
wherever the main thread is. Reruns resume because every loop skips work already done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from hicache_ops.errors import HicacheError

EXIT_CODE = 130  # what shells report for a command ended by SIGINT


@dataclass
class _State:
    cancellable: int = 0  # how deep the main thread is in `cancellable()` blocks
    signal: str | None = None  # why the stop was requested (a signal name or the caller's reason)


_stop = threading.Event()
_state = _State()


class Interrupted(HicacheError):
    """The user stopped the command (Ctrl-C or SIGTERM): exit 130."""

    exit_code = EXIT_CODE
    code = "interrupted"


def requested() -> bool:
    return _stop.is_set()


def request(reason: str = "a stop was requested") -> None:
    """Ask every loop to stop (what the signal handler does; also for callers without signals)."""
    _state.signal = _state.signal or reason
    _stop.set()


def reason() -> str:
    return _state.signal or "not stopped"


def wait(seconds: float) -> bool:
    """Sleep up to `seconds`; True as soon as a stop is requested."""
    return _stop.wait(seconds)


def check(what: str) -> None:
    """Raise Interrupted if a stop was requested (`what`: what stops, for the message)."""
    if _stop.is_set():
        raise Interrupted(f"{what} stopped on {reason()}.", hint="Rerun to resume: finished work is skipped.")


@contextmanager
def cancellable() -> Iterator[None]:
    """A blocking call that a stop request abandons at once (Interrupted raised in the main thread)."""
    check("the command")
    main = threading.current_thread() is threading.main_thread()
    if main:
        _state.cancellable += 1
    try:
        yield
    finally:
        if main:
            _state.cancellable -= 1


def _on_signal(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if _stop.is_set():
        raise KeyboardInterrupt(f"second {name}")
    request(name)
    if _state.cancellable:
        raise Interrupted(f"the command stopped on {name}.", hint="Rerun to resume: finished work is skipped.")


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
        _stop.clear()
        _state.cancellable = 0
        _state.signal = None
