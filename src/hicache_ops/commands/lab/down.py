"""`hicache lab down`: stop every process and remove every namespace and link one lab created.

Idempotent, and complete after a crash of the lab process: it works from the lab's state file, then
sweeps whatever still carries that lab's ID (processes inside its namespaces, the namespaces, its
bridge and veths). Other labs on the machine, and anything not named after this lab, are left alone.
Returns once every process it stopped is gone from the process table (reaped, not a zombie).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hicache_ops.commands.lab import processes, state, topology

if TYPE_CHECKING:
    from hicache_ops.commands.lab.results import LabDown


def down(run_dir: str | os.PathLike[str] | None = None) -> LabDown:
    from hicache_ops.commands.lab.results import LabDown, StoppedProcess

    topology.require_namespaces()
    folder = state.lab_to_stop(run_dir)
    lab = state.load(folder) or {"hosts": []}
    lab_id = lab.get("id")
    stopped = []
    records = []
    for host in reversed(lab["hosts"]):  # serves first: a segment owner closes faster with its master up
        record = host.get("process")
        if processes.alive(record):
            processes.stop(record)
            stopped.append(StoppedProcess(host=f"h{host['index']}", pid=record["pid"]))
        if record:
            records.append(record)
    recorded = {h["namespace"] for h in lab["hosts"]}
    swept = set(topology.existing_namespaces(topology.namespace_prefix(lab_id))) if lab_id else set()
    present = set(topology.existing_namespaces())
    namespaces = sorted((recorded & present) | swept)
    leftovers = [pid for ns in namespaces for pid in topology.namespace_pids(ns)]
    records += processes.kill_all(leftovers)  # anything else still inside our namespaces is ours too
    zombies = processes.wait_gone(records)
    for ns in namespaces:
        topology.delete_namespace(ns)
    bridge = (lab.get("bridge") or {}).get("name")
    links = [h.get("veth") for h in lab["hosts"]] + [bridge]
    links += topology.links(topology.link_prefix(lab_id)) if lab_id else []
    for link in dict.fromkeys(link for link in links if link):
        if topology.link_exists(link):
            topology.delete_link(link)
    state.remove(folder)
    return LabDown(
        id=lab_id,
        stopped=stopped,
        killed_leftovers=leftovers,
        not_reaped=zombies,
        namespaces_removed=namespaces,
        run_dir=str(folder),
    )
