"""`hicache lab status`: what runs where, and whether each process is still alive."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from hicache_ops.commands.lab import processes, state, topology
from hicache_ops.commands.lab.state import Lab

if TYPE_CHECKING:
    from hicache_ops.commands.lab.results import LabStatus


def serve_segment(host: dict[str, Any]) -> str | None:
    """The Mooncake segment a serve mounted, as the master lists it (None if it does not answer)."""
    if not host.get("url"):
        return None
    from hicache_ops.errors import HicacheError
    from hicache_ops.server.client import ServeClient

    try:
        with ServeClient(host["url"], timeout_s=2.0) as client:
            segment = client.stats()["config"].get("segment")
    except HicacheError:
        return None
    return str(segment) if segment else None


def rows(lab: Lab) -> list[dict[str, Any]]:
    """One row per host: host, namespace, address, process (name, PID, alive), URL, faults."""
    out = []
    for host in lab["hosts"]:
        record = host.get("process") or {}
        name = "mooncake_master" if host["role"] == "master" else "hicache serve"
        url = host.get("url") or f"rpc {lab['master']['rpc']}, http {lab['master']['metrics']}"
        out.append(
            {
                "host": f"h{host['index']}",
                "namespace": host["namespace"],
                "address": host["address"],
                "process": name,
                "pid": record.get("pid"),
                "alive": processes.alive(record),
                "url": url,
                "advertises": host.get("advertised"),
                "segment": serve_segment(host) if processes.alive(record) else None,
                "faults": [f["name"] for f in lab.get("faults", []) if f.get("host") in (f"h{host['index']}", None)],
            }
        )
    return out


def status(run_dir: str | os.PathLike[str] | None = None) -> LabStatus:
    from hicache_ops.commands.lab.results import LabHostRow, LabStatus

    folder = state.lab_in_use(run_dir)
    lab = state.load(folder)
    if lab is None:
        raise state.no_lab_error(folder)
    present = set(topology.existing_namespaces())
    table = rows(lab)
    for row in table:
        row["namespace_present"] = row["namespace"] in present
    return LabStatus(
        run_dir=str(folder),
        id=lab.get("id"),
        subnet=lab["subnet"],
        bridge=lab["bridge"],
        master=lab["master"],
        hosts=[LabHostRow(**row) for row in table],
        faults=lab.get("faults", []),
    )
