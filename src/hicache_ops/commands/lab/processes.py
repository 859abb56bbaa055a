"""Processes started inside a lab namespace, detached from the lab command, stopped by PID.

Each is started as `ip netns exec NS ARGV` (ip execs ARGV, so the PID is ARGV's) in its own
session, so it outlives `hicache lab up`. Its PID and kernel start time are recorded: a PID the
kernel has since given to another process is never signalled.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from pathlib import Path

from hicache_ops.errors import UnreachableError

# Popen objects of children of this process, reaped when stopped (a zombie still answers kill 0).
_children: dict[int, subprocess.Popen] = {}


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def alive(record: dict | None) -> bool:
    return bool(record) and start_time(record["pid"]) == record["start_time"]


def spawn(namespace: str, argv: list[str], env: dict[str, str], log: Path) -> dict:
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


def stop(record: dict | None, *, grace: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds (0: SIGKILL at once); only if still the same process."""
    if not alive(record):
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


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    for pid in pids:
        _reap(pid)
        while start_time(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)


def wait_http(host: str, port: int, path: str, record: dict, *, timeout: float, what: str) -> None:
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
