"""`hicache lab fault NAME [--on hK]`: the cross-host failures on-call engineers meet, reproduced.

loopback-hostname  hK's serve restarted with MOONCAKE_LOCAL_HOSTNAME=127.0.0.1: the master lists
                   its objects, no other host can read them (they dial their own loopback)
host-down          hK's serve killed (SIGKILL): its segment and objects leave the master once the
                   client TTL runs out
partition          hK loses the master but not its peers: a blackhole route to the master's
                   address inside hK (no firewall is needed; peers stay reachable); returns once
                   hK's serve reports its L3 down
master-restart     the master killed and started again on the same address: every object is
                   gone, clients re-mount their segments by themselves
slow-link          hK's serve restarted with --inject-l3-latency-ms (this kernel has no netem)
heal               hK back to normal: route removed, serve (re)started advertising its own address;
                   returns once the master no longer lists hK's old segment (after host-down: once
                   the client TTL has run out), so no stale segment outlives the fault
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_ops.commands.lab import processes, state, topology
from hicache_ops.commands.lab.state import Lab
from hicache_ops.commands.lab.status import serve_segment
from hicache_ops.commands.lab.up import spawn_serve, start_master, wait_serve
from hicache_ops.errors import HicacheError, InputError, SettingError

if TYPE_CHECKING:
    from hicache_ops.commands.lab.results import LabFault

FAULTS = ("loopback-hostname", "host-down", "partition", "master-restart", "slow-link", "heal")
DEFAULT_SLOW_MS = 200.0
# A serve that could not unmount (it had lost the master) leaves its segment listed for the
# master's client TTL, about 10 s (docs/mooncake.md#segments-and-ttl); puts placed there fail.
OLD_SEGMENT_WAIT_S = 30.0
# A serve probes its master every second with a 1 s timeout (server/l3_health.py).
L3_DOWN_WAIT_S = 15.0


def _serve_index(lab: Lab, host: str | None) -> int:
    serves = [h["index"] for h in lab["hosts"] if h["role"] == "serve"]
    if host is None:
        return int(serves[0])
    name = host.removeprefix(topology.namespace_prefix(lab["id"])) if lab.get("id") else host
    if not (name.startswith("h") and name[1:].isdigit()) or int(name[1:]) not in serves:
        raise SettingError(
            "host",
            f"{host!r} is not a serve host of this lab.",
            hint=f"Pick one of {', '.join(f'h{i}' for i in serves)} (h0 runs the master).",
        )
    return int(name[1:])


def _restart_serve(folder: Path, lab: Lab, index: int, **kwargs: Any) -> None:
    """Restart hK's serve; return once the master no longer lists the old serve's segment (the one
    it reports, else the one recorded when it started: a killed serve reports nothing), so the next
    puts are not placed on a segment nobody serves and no stale segment stays listed."""
    host = lab["hosts"][index]
    old_segment = serve_segment(host) or host.get("segment")
    processes.stop(host.get("process"))
    spawn_serve(folder, lab, index, **kwargs)
    wait_serve(lab, index, folder)
    if old_segment is not None and old_segment != host.get("segment"):
        _wait_segment_gone(lab, old_segment)


def _wait_l3_down(host: dict[str, Any]) -> None:
    """Until the host's serve reports its L3 down (bounded): the partition is then in effect."""
    from hicache_ops.server.client import ServeClient

    deadline = time.monotonic() + L3_DOWN_WAIT_S
    while time.monotonic() < deadline:
        try:
            with ServeClient(host["url"], timeout_s=2.0) as client:
                if (client.stats().get("l3") or {}).get("state") == "down":
                    return
        except HicacheError:
            return  # the serve itself not answering is not this wait's to report
        time.sleep(0.2)


def _wait_segment_gone(lab: Lab, segment: str) -> None:
    from hicache_ops.mooncake.admin import AdminClient

    deadline = time.monotonic() + OLD_SEGMENT_WAIT_S
    while time.monotonic() < deadline:
        try:
            with AdminClient(lab["master"]["metrics"]) as admin:
                if segment not in admin.get_all_segments():
                    return
        except HicacheError:  # a slow or absent answer: ask again until the deadline (the master
            pass  # not answering at all is the fault under test, not ours to report)
        time.sleep(0.2)


def fault(
    name: str,
    host: str | None = None,
    *,
    latency_ms: float = DEFAULT_SLOW_MS,
    run_dir: str | os.PathLike[str] | None = None,
) -> LabFault:
    """Inject fault `name` on lab host `host` (the first serve host by default) and record it in the
    lab's state (a restart or a heal is recorded as no fault)."""
    from hicache_ops.commands.lab.results import LabFault

    if name not in FAULTS:
        raise InputError(f"no fault named {name!r}.", hint=f"Known faults: {', '.join(FAULTS)}.")
    topology.require_namespaces()
    folder = state.lab_in_use(run_dir, "fault", "inject the fault into")
    lab = state.load(folder)
    if lab is None:
        raise state.no_lab_error(folder)
    if not any(h["role"] == "serve" for h in lab["hosts"]):
        raise InputError(
            f"the lab in {folder} has no serve host (its `lab up` did not finish).",
            hint=f"Remove it with `sudo hicache lab down{state.run_dir_flag(folder)}` and start it again.",
        )
    master = lab["hosts"][0]
    index = 0 if name == "master-restart" else _serve_index(lab, host)  # h0 runs the master
    target = lab["hosts"][index]
    entry: dict[str, Any] = {"name": name, "host": f"h{target['index']}"}
    if name == "loopback-hostname":
        _restart_serve(folder, lab, index, advertise="127.0.0.1")
        entry["detail"] = (
            f"h{index}'s serve advertises 127.0.0.1 (MOONCAKE_LOCAL_HOSTNAME) instead of {target['address']}"
        )
    elif name == "host-down":
        processes.stop(target.get("process"), grace=0)
        entry["detail"] = (
            f"h{index}'s serve (pid {target['process']['pid']}) killed; its objects leave the master after the "
            "client TTL"
        )
    elif name == "partition":
        topology.ip("-n", target["namespace"], "route", "replace", "blackhole", f"{master['address']}/32")
        _wait_l3_down(target)
        entry["detail"] = f"h{index} drops every packet to the master {master['address']}; its peers stay reachable"
    elif name == "master-restart":
        processes.stop(master.get("process"), grace=0)
        start_master(folder, lab)
        entry["detail"] = "the master was killed and started again: every object is gone until clients write again"
    elif name == "slow-link":
        if latency_ms <= 0:
            raise SettingError("latency_ms", f"{latency_ms:g} must be > 0.")
        _restart_serve(folder, lab, index, extra_args=["--inject-l3-latency-ms", f"{latency_ms:g}"])
        entry["detail"] = f"h{index}'s serve adds {latency_ms:g} ms to every L3 page read"
    else:  # heal
        topology.ip("-n", target["namespace"], "route", "delete", "blackhole", f"{master['address']}/32", check=False)
        _restart_serve(folder, lab, index)
        lab["faults"] = [f for f in lab["faults"] if f["host"] != entry["host"]]
        entry["detail"] = f"h{index} restored: no blackhole route, serve advertising {target['address']}"
    if name not in ("heal", "master-restart"):  # a restart is an event, not a state to heal
        lab["faults"].append(entry)
    state.save(folder, lab)
    return LabFault(**entry, run_dir=str(folder))
