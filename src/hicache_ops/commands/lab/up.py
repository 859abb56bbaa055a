"""`hicache lab up`: namespaces hicache-ID-h0..hN on one bridge, the master in h0, a serve in each other host.

ID and the subnet are picked per lab (topology.py), so labs in different run folders run side by side.

Every serve is a real `hicache serve --l3 mooncake://MASTER` bound to its host's address; its
Mooncake local_hostname comes from MOONCAKE_LOCAL_HOSTNAME as a deployment would set it (see
docs/mooncake.md#advertised-hostname), so the Transfer Engine of each host advertises that host's
address and the hosts read each other's segments over real TCP.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hicache_ops.commands.lab import processes, state, topology
from hicache_ops.commands.lab.state import Lab
from hicache_ops.commands.lab.topology import host_address, namespace_name
from hicache_ops.errors import InputError, SettingError

MASTER_RPC_PORT = 50051
MASTER_METRICS_PORT = 9003
SERVE_PORT = 18080
SEGMENT_MB = 64
MAX_HOSTS = 16
START_TIMEOUT_S = 180.0
SEGMENT_RECORD_WAIT_S = 30.0
# Where SGLang (and serve) take the advertised hostname from: the lab sets the first and clears the others.
_HOSTNAME_VARIABLES = (
    "MOONCAKE_LOCAL_HOSTNAME",
    "LOCAL_HOSTNAME",
    "SGLANG_HOST_IP",
    "HOST_IP",
    "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH",
    "MC_TCP_BIND_ADDRESS",
)


def _hicache() -> str:
    script = Path(sys.executable).with_name("hicache")
    return str(script) if script.exists() else "hicache"


def master_argv(address: str) -> list[str]:
    from hicache_ops.mooncake.master import find_master_binary

    return [
        find_master_binary(),
        f"--rpc_address={address}",
        f"--rpc_port={MASTER_RPC_PORT}",
        f"--metrics_host={address}",
        f"--metrics_port={MASTER_METRICS_PORT}",
    ]


def l3_url(master_address: str) -> str:
    return f"mooncake://{master_address}:{MASTER_RPC_PORT}?metrics={MASTER_METRICS_PORT}"


def start_master(folder: Path, lab: Lab) -> None:
    host = lab["hosts"][0]
    record = processes.spawn(
        host["namespace"], master_argv(host["address"]), dict(os.environ), folder / "h0" / "mooncake_master.log"
    )
    host["process"] = record
    state.save(folder, lab)
    processes.wait_http(
        host["address"], MASTER_METRICS_PORT, "/health", record, timeout=30, what="mooncake_master in h0"
    )


def spawn_serve(
    folder: Path, lab: Lab, index: int, *, advertise: str | None = None, extra_args: Sequence[str] = ()
) -> None:
    """Start host `index`'s serve (advertising `advertise`, by default its own address); do not wait."""
    host = lab["hosts"][index]
    env = {k: v for k, v in os.environ.items() if k not in _HOSTNAME_VARIABLES}
    env["MOONCAKE_LOCAL_HOSTNAME"] = advertise or host["address"]
    log_dir = folder / f"h{index}"
    argv = [
        _hicache(),
        "serve",
        "--host",
        host["address"],
        "--port",
        str(SERVE_PORT),
        "--l3",
        l3_url(lab["hosts"][0]["address"]),
        "--segment-mb",
        str(SEGMENT_MB),
        "--device",
        "cpu",
        "--log-dir",
        str(log_dir),
        *extra_args,
    ]
    record = processes.spawn(host["namespace"], argv, env, log_dir / "serve.out")
    record["env"] = {"MOONCAKE_LOCAL_HOSTNAME": env["MOONCAKE_LOCAL_HOSTNAME"]}
    host["process"] = record
    host["advertised"] = env["MOONCAKE_LOCAL_HOSTNAME"]
    host["segment"] = None
    state.save(folder, lab)


def wait_serve(lab: Lab, index: int, folder: Path | None = None) -> None:
    """Wait for host `index`'s serve to answer; record the segment it mounted (a later restart waits
    for that segment to leave the master, also when the serve was killed)."""
    from hicache_ops.commands.lab.status import serve_segment

    host = lab["hosts"][index]
    processes.wait_http(
        host["address"],
        SERVE_PORT,
        "/health",
        host["process"],
        timeout=START_TIMEOUT_S,
        what=f"hicache serve in h{index}",
    )
    # A loaded machine can miss serve_segment's short timeout: ask again, a bounded while (without
    # the record a restart could not wait for a killed serve's segment to leave the master).
    deadline = time.monotonic() + SEGMENT_RECORD_WAIT_S
    host["segment"] = serve_segment(host)
    while host["segment"] is None and time.monotonic() < deadline and processes.alive(host["process"]):
        time.sleep(0.2)
        host["segment"] = serve_segment(host)
    if folder is not None:
        state.save(folder, lab)


def up(hosts: int = 3, run_dir: str | os.PathLike[str] | None = None) -> Lab:
    """Create the lab and start everything; on any failure undo what was done and re-raise."""
    from hicache_ops.commands.lab.down import down

    if not 2 <= hosts <= MAX_HOSTS:
        raise SettingError(
            "hosts", f"{hosts} must be between 2 and {MAX_HOSTS} (h0 runs the master, the others a serve each)."
        )
    topology.require_namespaces()
    folder = state.run_dir(run_dir)
    existing = state.load(folder)
    if existing is not None:
        raise InputError(
            f"a lab is already up in {folder} (lab {existing.get('id') or 'without an ID'}).",
            hint=f"Run `hicache lab down{state.run_dir_flag(folder)}` first, or pass another --run-dir.",
        )
    lab: Lab = {}
    try:
        with state.creating():  # the ID and subnet are free until the bridge holds them
            lab_id = topology.new_lab_id()
            subnet = topology.choose_subnet(state.subnets_in_use())
            bridge = topology.bridge_name(lab_id)
            lab = {
                "id": lab_id,
                "subnet": subnet,
                "bridge": {"name": bridge, "address": topology.bridge_address(subnet)},
                "hosts": [_host(lab_id, subnet, i) for i in range(hosts)],
                "faults": [],
            }
            lab["master"] = {
                "rpc": f"{lab['hosts'][0]['address']}:{MASTER_RPC_PORT}",
                "metrics": f"{lab['hosts'][0]['address']}:{MASTER_METRICS_PORT}",
            }
            state.save(folder, lab)  # recorded before anything exists, so down can remove a half-built lab
            topology.create_bridge(bridge, subnet)
        for host in lab["hosts"]:
            topology.create_host(bridge, host["namespace"], host["veth"], host["address"])
        start_master(folder, lab)
        for i in range(1, hosts):
            spawn_serve(folder, lab, i)
        for i in range(1, hosts):
            wait_serve(lab, i, folder)
    except BaseException:
        if lab:
            down(folder)
        raise
    lab["run_dir"] = str(folder)
    return lab


def _host(lab_id: str, subnet: str, index: int) -> dict[str, Any]:
    host: dict[str, Any] = {
        "index": index,
        "namespace": namespace_name(lab_id, index),
        "address": host_address(subnet, index),
        "veth": topology.root_veth_name(lab_id, index),
        "role": "master" if index == 0 else "serve",
        "process": None,
    }
    if index:
        host["url"] = f"http://{host['address']}:{SERVE_PORT}"
    return host
