"""Processes started inside a lab namespace, detached from the lab command, stopped by PID.

Each is started as `ip netns exec NS ARGV` (ip execs ARGV, so the PID is ARGV's) in its own
session, so it outlives `hicache lab up`. Its PID and kernel start time are recorded: a PID the
kernel has since given to another process is never signalled.

Once `lab up` has exited, the processes it started are children of PID 1, which reaps them
whenever it gets to it (about 1.5 s on this machine): until then a stopped one is a zombie. `down`
waits for each to be gone, not merely dead, so it returns with nothing of the lab left.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from hicache_ops.errors import UnreachableError

Record = dict[str, Any]  # {"pid", "start_time", "argv", "log", ...} as the state file keeps it
# How long `down` waits for a stopped process to be reaped (by this process or by PID 1).
REAP_WAIT_S = 15.0

# Popen objects of children of this process, reaped when stopped (a zombie still answers kill 0).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) from /proc/PID/stat (fields 3 and 22), None if no such PID."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], fields[19]


def start_time(pid: int) -> str | None:
    """The process's start time, None if gone or a zombie."""
    stat = _stat(pid)
    return None if stat is None or stat[0] == "Z" else stat[1]


def alive(record: Record | None) -> bool:
    if not record:
        return False
    return bool(start_time(record["pid"]) == record["start_time"])


def present(record: Record | None) -> bool:
    """Still in the process table, alive or a zombie not yet reaped (the same process, not a reused PID)."""
    if not record:
        return False
    stat = _stat(record["pid"])
    return stat is not None and (record.get("start_time") is None or stat[1] == record["start_time"])


def wait_gone(records: list[Record], timeout: float = REAP_WAIT_S) -> list[int]:
    """Reap what this process can and wait for the rest to leave the process table; the PIDs still
    there (zombies nobody reaped) after `timeout`."""
    deadline = time.monotonic() + timeout
    left = [r for r in records if r]
    while True:
        for record in left:
            _reap(record["pid"])
        left = [r for r in left if present(r)]
        if not left or time.monotonic() > deadline:
            return [r["pid"] for r in left]
        time.sleep(0.05)


def spawn(namespace: str, argv: list[str], env: dict[str, str], log: Path) -> Record:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", namespace, *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    _children[proc.pid] = proc
    started = None
    for _ in range(100):  # /proc/PID/stat appears at once; the start time is fixed from then on
        started = start_time(proc.pid)
        if started is not None or proc.poll() is not None:
            break
        time.sleep(0.01)
    return {"pid": proc.pid, "start_time": started, "argv": argv, "log": str(log)}


def _reap(pid: int) -> None:
    proc = _children.pop(pid, None)
    if proc is not None:
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            _children[pid] = proc


def stop(record: Record | None, *, grace: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds (0: SIGKILL at once); only if still the same process."""
    if record is None or not alive(record):
        if record:
            _reap(record["pid"])
        return
    pid = record["pid"]
    try:
        os.kill(pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while alive(record):
        proc = _children.get(pid)
        if proc is not None:
            proc.poll()
        if time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 10
        time.sleep(0.05)
    _reap(pid)


def kill_all(pids: list[int]) -> list[Record]:
    """SIGKILL each PID; records of them (their current start time) for wait_gone."""
    records = []
    for pid in pids:
        started = _stat(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        records.append({"pid": pid, "start_time": started[1] if started else None})
    return records


def wait_http(host: str, port: int, path: str, record: Record, *, timeout: float, what: str) -> None:
    """Poll GET path until HTTP 200; UnreachableError naming the log if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if not alive(record):
            raise UnreachableError(f"{what} exited during start-up.", hint=f"See its log: {record['log']}")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=1.0)
            try:
                conn.request("GET", path)
                if conn.getresponse().status == 200:
                    return
            finally:
                conn.close()
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            raise UnreachableError(
                f"{what} did not answer {path} within {timeout:g} s.", hint=f"See its log: {record['log']}"
            )
        time.sleep(0.2)
