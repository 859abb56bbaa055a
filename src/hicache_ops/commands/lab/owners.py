"""Which lab host owns a segment the master lists, from what this machine can observe.

A segment is named by the address its owner advertises (HOST:PORT). An address of a lab host names
that host. A loopback address names none: every host has its own 127.0.0.1, so the owner is told
apart by what each host shows of that segment:
  - the serve of one host reports the segment as its own (its /v1/stats), and
  - its Transfer Engine endpoint's port listens in one host's network namespace (the endpoint is
    listed beside the segment; the port in the segment's own name is not a listening one).
When neither singles out one host, no host is named and the hosts that could own it are listed.

Only when a lab is up (its state file in $HICACHE_LAB_DIR, else /run/hicache-lab): elsewhere every
lookup answers nothing, and no other address is resolved (a reverse lookup could hang).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from hicache_ops.commands.lab import processes, state, topology
from hicache_ops.errors import InputError
from hicache_ops.mooncake.net import is_loopback, parse_host_port

LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


def _load_lab(run_dir: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    try:
        return state.load(state.run_dir(run_dir))
    except (InputError, OSError):  # an unreadable state file is `lab status`'s to report, not ours
        return None


def listening_ports(pid: int) -> set[int]:
    """TCP ports listening in the network namespace of process `pid` (empty if it is gone)."""
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                next(fh, None)  # the header
                for line in fh:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == LISTEN:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return ports


def _namespace_ports(host: dict[str, Any]) -> set[int]:
    """Ports listening in the host's namespace, seen through its recorded process or any other in it."""
    record = host.get("process")
    pids = [record["pid"]] if record and processes.alive(record) else topology.namespace_pids(host["namespace"])[:1]
    return listening_ports(pids[0]) if pids else set()


def _name(host: dict[str, Any]) -> str:
    return f"h{host['index']}"


def segment_owners(
    segments: Iterable[tuple[str, str | None]], run_dir: str | os.PathLike[str] | None = None
) -> dict[str, dict[str, Any]]:
    """{segment: {"host", "candidates", "basis"}} for (segment name, Transfer Engine endpoint) pairs
    as the master lists them, where a lab is up.

    host: the lab host that owns it (None when the observations do not single one out);
    candidates: the hosts that could own it; basis: what the answer rests on, in words.
    """
    lab = _load_lab(run_dir)
    if lab is None:
        return {}
    from hicache_ops.commands.lab.status import serve_segment

    serves = [h for h in lab["hosts"] if h.get("role") == "serve"]
    reported: dict[str, str | None] | None = None  # host name -> the segment its serve reports
    ports: dict[str, set[int]] = {}
    out: dict[str, dict[str, Any]] = {}
    for segment, endpoint in dict(segments).items():
        try:
            address, _ = parse_host_port(segment or "", what="segment")
            _, port = parse_host_port(endpoint or segment or "", what="Transfer Engine endpoint")
        except InputError:
            continue
        if not is_loopback(address):
            owners = [_name(h) for h in lab["hosts"] if h["address"] == address]
            if owners:
                out[segment] = {
                    "host": owners[0],
                    "candidates": owners,
                    "basis": f"{address} is lab host {owners[0]}'s address",
                }
            continue
        if reported is None:
            reported = {_name(h): serve_segment(h) if processes.alive(h.get("process")) else None for h in serves}
        for h in serves:
            if _name(h) not in ports:
                ports[_name(h)] = _namespace_ports(h)
        by_report = [name for name, seg in reported.items() if seg == segment]
        by_port = [_name(h) for h in serves if port in ports[_name(h)]]
        out[segment] = _decide(segment, port, by_report, by_port, [_name(h) for h in serves])
    return out


def _decide(segment: str, port: int, by_report: list[str], by_port: list[str], serves: list[str]) -> dict[str, Any]:
    def listens(hosts: list[str]) -> str:
        return f"port {port} listens in {', '.join(hosts)}" if hosts else f"port {port} listens in no lab host"

    if len(by_report) == 1:
        host = by_report[0]
        also = f", and port {port} listens there" if host in by_port else f"; {listens(by_port)}"
        return {"host": host, "candidates": [host], "basis": f"{host}'s serve reports {segment} as its segment{also}"}
    if len(by_port) == 1:
        host = by_port[0]
        return {
            "host": host,
            "candidates": [host],
            "basis": f"a loopback address names no host, but port {port} listens only in {host}",
        }
    candidates = sorted(set(by_report) | set(by_port)) or serves
    return {
        "host": None,
        "candidates": candidates,
        "basis": f"a loopback address names no host and {listens(by_port)}: "
        f"any of {', '.join(candidates)} could own it",
    }


def describe(owner: dict[str, Any] | None) -> str:
    """A clause for a message: 'lab host h1 (basis)' or 'one of the lab hosts h1, h2 (basis)'."""
    if not owner:
        return ""
    if owner["host"]:
        return f"lab host {owner['host']} ({owner['basis']})"
    return f"one of the lab hosts {', '.join(owner['candidates'])} ({owner['basis']})"
