"""`hicache lab down`: stop every process and remove every namespace and link the lab created.

Idempotent, and complete after a crash of the lab process: it works from the state file, then
sweeps whatever still carries the lab's names (processes inside hicache-h* namespaces, the
namespaces, the bridge and veths).
"""

from __future__ import annotations

import os

from hicache_ops.commands.lab import processes, state, topology


def down(run_dir: str | os.PathLike | None = None) -> dict:
    topology.require_namespaces()
    folder = state.run_dir(run_dir)
    lab = state.load(folder) or {"hosts": []}
    stopped = []
    for host in reversed(lab["hosts"]):  # serves first: a segment owner closes faster with its master up
        record = host.get("process")
        if processes.alive(record):
            processes.stop(record)
            stopped.append({"host": f"h{host['index']}", "pid": record["pid"]})
    namespaces = sorted(set(topology.existing_namespaces()) | {h["namespace"] for h in lab["hosts"]})
    leftovers = [pid for ns in namespaces for pid in topology.namespace_pids(ns)]
    processes.kill_all(leftovers)  # anything else still inside our namespaces is ours too
    for ns in namespaces:
        topology.delete_namespace(ns)
    for veth in [h.get("veth") for h in lab["hosts"]] + [topology.BRIDGE]:
        if veth and topology.link_exists(veth):
            topology.delete_link(veth)
    state.remove(folder)
    return {"stopped": stopped, "killed_leftovers": leftovers, "namespaces_removed": namespaces, "run_dir": str(folder)}
