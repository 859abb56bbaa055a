"""Whether `hicache serve`'s L3 tier (its Mooncake master) is up, watched while the serve runs.

Two signals, either one marks L3 down (see README, "serve API", GET /health):
- an embedded master's exit: its process is reaped the moment it exits (no zombie), whatever
  killed it;
- the master's admin API not answering /health within `probe_timeout_s`, probed every
  `interval_s`: a master that is dead, frozen or unreachable, embedded or existing
  (`--l3 mooncake://`). When it answers again, L3 is up again (clients re-mount by themselves).

L3 calls that failed while serving requests are counted (`record_error`), so /v1/stats and
/metrics show how many requests the dead tier cost.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from hicache_ops.errors import UnreachableError
from hicache_ops.mooncake.admin import AdminClient

log = logging.getLogger("hicache.serve")

UP, DOWN = "up", "down"


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class L3Health:
    def __init__(
        self,
        metrics_address: str,
        *,
        interval_s: float = 1.0,
        probe_timeout_s: float = 1.0,
        on_change: Callable[[str, str], None] | None = None,
    ):
        self.metrics_address = metrics_address
        self.interval_s = interval_s
        self.probe_timeout_s = probe_timeout_s
        self._on_change = on_change
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.state = UP
        self.reason = ""
        self.since = time.time()
        self.master_exit: str | None = None  # set once an embedded master has exited: it stays down
        self.errors = 0
        self.last_error: str | None = None
        self.failed_probes = 0

    # -- signals -------------------------------------------------------------------------------

    def master_exited(self, pid: int, returncode: int, *, expected: bool) -> None:
        """Called by the reaper of an embedded master."""
        if expected:
            return
        self.master_exit = f"the embedded mooncake_master (pid {pid}) {describe_exit(returncode)}"
        self._set(DOWN, self.master_exit)

    def record_error(self, message: str) -> None:
        with self._lock:
            self.errors += 1
            self.last_error = message

    def probe(self) -> None:
        """One /health probe of the master's admin API."""
        try:
            with AdminClient(self.metrics_address, timeout=self.probe_timeout_s) as admin:
                admin.health()
        except UnreachableError as exc:
            with self._lock:
                self.failed_probes += 1
            self._set(DOWN, self.master_exit or exc.message)
            return
        if self.master_exit is None:
            self._set(UP, "")

    def _set(self, state: str, reason: str) -> None:
        with self._lock:
            if state == self.state and (state == UP or self.reason == reason):
                return
            changed = state != self.state
            self.state, self.reason = state, reason
            if changed:
                self.since = time.time()
        message = (
            f"L3 is down: {reason}"
            if state == DOWN
            else f"L3 is up again: the master at {self.metrics_address} answers"
        )
        (log.error if state == DOWN else log.warning)(message)
        if self._on_change is not None:
            self._on_change(state, reason)

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> L3Health:
        self._thread = threading.Thread(target=self._loop, name="l3-health", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.probe()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.probe_timeout_s + 1)

    @property
    def down(self) -> bool:
        return self.state == DOWN

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                "state": self.state,
                "reason": self.reason or None,
                "since": self.since,
                "errors": self.errors,
                "last_error": self.last_error,
                "failed_probes": self.failed_probes,
                "master_address": self.metrics_address,
            }
