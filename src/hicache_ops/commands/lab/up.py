"""`hicache lab up`: namespaces hicache-h0..hN on one bridge, the master in h0, a serve in each other host.

Every serve is a real `hicache serve --l3 mooncake://MASTER` bound to its host's address; its
Mooncake local_hostname comes from MOONCAKE_LOCAL_HOSTNAME as a deployment would set it (see
docs/mooncake.md#advertised-hostname), so the Transfer Engine of each host advertises that host's
address and the hosts read each other's segments over real TCP.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hicache_ops.commands.lab import processes, state, topology
from hicache_ops.commands.lab.topology import host_address, namespace_name
from hicache_ops.errors import InputError, SettingError

MASTER_RPC_PORT = 50051
MASTER_METRICS_PORT = 9003
SERVE_PORT = 18080
SEGMENT_MB = 64
MAX_HOSTS = 16
START_TIMEOUT_S = 180.0
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


def start_master(folder: Path, lab: dict) -> None:
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
    folder: Path, lab: dict, index: int, *, advertise: str | None = None, extra_args: list[str] = ()
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
    state.save(folder, lab)


def wait_serve(lab: dict, index: int) -> None:
    host = lab["hosts"][index]
    processes.wait_http(
        host["address"],
        SERVE_PORT,
        "/health",
        host["process"],
        timeout=START_TIMEOUT_S,
        what=f"hicache serve in h{index}",
    )


def up(hosts: int = 3, run_dir: str | os.PathLike | None = None) -> dict:
    """Create the lab and start everything; on any failure undo what was done and re-raise."""
    from hicache_ops.commands.lab.down import down

    if not 2 <= hosts <= MAX_HOSTS:
        raise SettingError(
            "hosts", f"{hosts} must be between 2 and {MAX_HOSTS} (h0 runs the master, the others a serve each)."
        )
    topology.require_namespaces()
    folder = state.run_dir(run_dir)
    if state.load(folder) is not None or topology.existing_namespaces() or topology.link_exists(topology.BRIDGE):
        raise InputError(
            "a lab is already up on this machine (hicache-* namespaces or state found).",
            hint="Run `hicache lab down` first.",
        )
    subnet = topology.choose_subnet()
    lab = {
        "subnet": subnet,
        "bridge": {"name": topology.BRIDGE, "address": topology.bridge_address(subnet)},
        "hosts": [
            {
                "index": i,
                "namespace": namespace_name(i),
                "address": host_address(subnet, i),
                "veth": topology.root_veth_name(i),
                "role": "master" if i == 0 else "serve",
                "process": None,
            }
            for i in range(hosts)
        ],
        "faults": [],
    }
    lab["master"] = {
        "rpc": f"{lab['hosts'][0]['address']}:{MASTER_RPC_PORT}",
        "metrics": f"{lab['hosts'][0]['address']}:{MASTER_METRICS_PORT}",
    }
    for host in lab["hosts"][1:]:
        host["url"] = f"http://{host['address']}:{SERVE_PORT}"
    state.save(folder, lab)  # recorded before anything exists, so down can remove a half-built lab
    try:
        topology.create_bridge(subnet)
        for i in range(hosts):
            topology.create_host(subnet, i)
        start_master(folder, lab)
        for i in range(1, hosts):
            spawn_serve(folder, lab, i)
        for i in range(1, hosts):
            wait_serve(lab, i)
    except BaseException:
        down(folder)
        raise
    lab["run_dir"] = str(folder)
    return lab
