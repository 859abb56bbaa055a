"""Network namespaces joined by one bridge: the hosts of a lab on this machine.

Layout of lab ID (N+1 hosts, h0 runs the master):

    root namespace:     bridge hcID-br (SUBNET.254/24), veth hcID-vK attached to it
    hicache-ID-hK:      lo up, eth0 = the peer of hcID-vK, address SUBNET.(K+1)/24

ID is a short name picked per lab (4 characters, so every interface name fits Linux's 15), and
SUBNET a private /24 no address or route of this machine uses, so several labs run side by side.
The root namespace sits on the bridge so commands run here (inspect, playbooks) reach every host;
nothing is routed or NATed beyond the /24. Every name is recorded in the state file before it is
created, so `down` finds it after a crash, and `down` touches only names carrying its lab's ID.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import string
import subprocess
from collections.abc import Iterable

from hicache_ops.errors import InputError

# Private /24s tried in order; the first that overlaps no address or route of this machine, and no
# other lab's recorded subnet, wins.
CANDIDATE_SUBNETS = tuple(f"10.213.{n}.0/24" for n in range(47, 111)) + ("172.31.213.0/24",)
PREFIX = "hicache"
ID_LENGTH = 4
IP_TIMEOUT_S = 10.0
IFNAMSIZ = 15  # the longest interface name Linux accepts


def new_lab_id(taken: Iterable[str] = ()) -> str:
    """A fresh lab ID: a letter then digits and letters, used by no namespace or link of this machine."""
    taken = set(taken)
    names = existing_namespaces() + links()
    for _ in range(100):
        lab_id = secrets.choice(string.ascii_lowercase) + "".join(
            secrets.choice(string.ascii_lowercase + string.digits) for _ in range(ID_LENGTH - 1)
        )
        if lab_id in taken:
            continue
        if not any(n.startswith((namespace_prefix(lab_id), link_prefix(lab_id))) for n in names):
            return lab_id
    raise InputError("could not pick a lab ID that no namespace or link of this machine uses.")


def namespace_prefix(lab_id: str) -> str:
    return f"{PREFIX}-{lab_id}-"


def link_prefix(lab_id: str) -> str:
    return f"hc{lab_id}-"


def namespace_name(lab_id: str, index: int) -> str:
    return f"{namespace_prefix(lab_id)}h{index}"


def bridge_name(lab_id: str) -> str:
    return f"{link_prefix(lab_id)}br"


def root_veth_name(lab_id: str, index: int) -> str:
    return f"{link_prefix(lab_id)}v{index}"  # at most 10 characters, under IFNAMSIZ


def host_address(subnet: str, index: int) -> str:
    return str(ipaddress.ip_network(subnet)[index + 1])


def bridge_address(subnet: str) -> str:
    return str(ipaddress.ip_network(subnet)[254])


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
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


def existing_namespaces(prefix: str = "") -> list[str]:
    """The network namespaces of this machine whose name starts with `prefix`."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(prefix)]


def links(prefix: str = "") -> list[str]:
    """The root namespace's interfaces whose name starts with `prefix` (a veth's '@peer' dropped)."""
    out = ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        fields = line.split(":", 2)
        if len(fields) > 1:
            name = fields[1].strip().split("@", 1)[0]
            if name.startswith(prefix):
                names.append(name)
    return names


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks_in_use() -> list[Network]:
    used: list[Network] = []
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


def choose_subnet(reserved: Iterable[str] = ()) -> str:
    """The first candidate /24 that overlaps no address or route here, nor a `reserved` subnet
    (those other labs recorded, perhaps before their bridge exists)."""
    used: list[Network] = [u for u in _networks_in_use() if u.prefixlen > 0]
    for subnet in reserved:
        try:
            used.append(ipaddress.ip_network(subnet))
        except ValueError:
            continue
    for candidate in CANDIDATE_SUBNETS:
        net = ipaddress.ip_network(candidate)
        if not any(net.overlaps(u) for u in used):
            return candidate
    raise InputError(
        f"every private /24 the lab may use ({CANDIDATE_SUBNETS[0]} to {CANDIDATE_SUBNETS[-1]}) "
        "is in use on this machine."
    )


def create_bridge(bridge: str, subnet: str) -> None:
    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", f"{bridge_address(subnet)}/24", "dev", bridge)
    ip("link", "set", bridge, "up")


def create_host(bridge: str, namespace: str, veth: str, address: str) -> None:
    """Namespace `namespace` with lo and eth0 up, eth0 (the peer of `veth`) on the bridge."""
    ns = namespace
    ip("netns", "add", ns)
    ip("-n", ns, "link", "set", "lo", "up")
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", veth, "master", bridge)
    ip("link", "set", veth, "up")
    ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
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
