"""Network namespaces joined by one bridge: the hosts of a lab on this machine.

Layout (N+1 hosts, h0 runs the master):

    root namespace:  bridge hicache-br0 (SUBNET.254/24), veth hicache-vK attached to it
    hicache-hK:      lo up, eth0 = the peer of hicache-vK, address SUBNET.(K+1)/24

The root namespace sits on the bridge so commands run here (inspect, playbooks) reach every host;
nothing is routed or NATed beyond the /24. Everything created is named with the lab's prefix and
recorded in the state file before it is created, so `down` finds it after a crash.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

from hicache_ops.errors import InputError

# Private /24s tried in order; the first that overlaps no address or route of this machine wins.
CANDIDATE_SUBNETS = ("10.213.47.0/24", "10.213.48.0/24", "10.214.47.0/24", "172.31.213.0/24")
PREFIX = "hicache"
BRIDGE = f"{PREFIX}-br0"
IP_TIMEOUT_S = 10.0


def namespace_name(index: int) -> str:
    return f"{PREFIX}-h{index}"


def root_veth_name(index: int) -> str:
    return f"{PREFIX}-v{index}"


def host_address(subnet: str, index: int) -> str:
    return str(ipaddress.ip_network(subnet)[index + 1])


def bridge_address(subnet: str) -> str:
    return str(ipaddress.ip_network(subnet)[254])


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip ARGS` (bounded); raise InputError with ip's own message when `check` and it fails."""
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise InputError(f"`ip {' '.join(args)}` did not finish within {IP_TIMEOUT_S:g} s.") from None
    if check and proc.returncode != 0:
        raise InputError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.returncode}.")
    return proc


def require_namespaces() -> None:
    """Refuse (InputError, exit 2) where this machine cannot create network namespaces."""
    if shutil.which("ip") is None:
        raise InputError(
            "the lab needs the `ip` command (iproute2), which is not installed.",
            hint="Install iproute2 (apt-get install iproute2).",
        )
    if os.geteuid() != 0:
        raise InputError("the lab creates network namespaces, which needs root.", hint="Run it with sudo.")


def existing_namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(f"{PREFIX}-h")]


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    used = []
    for line in ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            used.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    for line in ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("default", "broadcast", "local", "unreachable", "blackhole", "prohibit"):
            dest = line.split()[1] if dest != "default" and len(line.split()) > 1 else ""
        try:
            used.append(ipaddress.ip_network(dest, strict=False))
        except ValueError:
            continue
    return used


def choose_subnet() -> str:
    used = _networks_in_use()
    for candidate in CANDIDATE_SUBNETS:
        net = ipaddress.ip_network(candidate)
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return candidate
    raise InputError(f"every private /24 the lab may use ({', '.join(CANDIDATE_SUBNETS)}) is in use on this machine.")


def create_bridge(subnet: str) -> None:
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("addr", "add", f"{bridge_address(subnet)}/24", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")


def create_host(subnet: str, index: int) -> None:
    """Namespace hicache-hINDEX with lo and eth0 up, eth0 on the bridge."""
    ns, veth = namespace_name(index), root_veth_name(index)
    ip("netns", "add", ns)
    ip("-n", ns, "link", "set", "lo", "up")
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", veth, "master", BRIDGE)
    ip("link", "set", veth, "up")
    ip("-n", ns, "addr", "add", f"{host_address(subnet, index)}/24", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")


def namespace_pids(ns: str) -> list[int]:
    out = ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def delete_namespace(ns: str) -> None:
    """Delete the namespace (its veth goes with it); a missing one is fine."""
    ip("netns", "delete", ns, check=False)


def delete_link(name: str) -> None:
    ip("link", "delete", name, check=False)


def link_exists(name: str) -> bool:
    return ip("link", "show", name, check=False).returncode == 0
