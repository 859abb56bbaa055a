"""Addresses and sockets: HOST:PORT parsing, a bounded TCP probe, free loopback ports."""

from __future__ import annotations

import errno
import socket

from hicache_ops.errors import InputError, UnreachableError


def parse_host_port(text: str, *, what: str = "address", default_port: int | None = None) -> tuple[str, int]:
    """Split "HOST:PORT" (or "[v6]:PORT", optionally "http://..."); raise InputError when malformed.

    `what` names the flag or field in the message ("--master", "master_server_address").
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{what} is empty; give HOST:PORT such as 127.0.0.1:9003.")
    raw = text.strip()
    body = raw
    for scheme in ("http://", "https://"):
        if body.lower().startswith(scheme):
            body = body[len(scheme) :]
    body = body.rstrip("/")
    if "/" in body or " " in body:
        raise InputError(f"{what} {raw!r} is not HOST:PORT.", hint="Give HOST:PORT such as 127.0.0.1:9003.")
    if body.startswith("["):
        host, sep, rest = body[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise InputError(f"{what} {raw!r} is not HOST:PORT.", hint="Write IPv6 hosts as [::1]:9003.")
        port_text = rest[1:] if rest else ""
    else:
        if body.count(":") > 1:
            raise InputError(f"{what} {raw!r} is not HOST:PORT.", hint="Write IPv6 hosts as [::1]:9003.")
        host, _, port_text = body.partition(":")
    if not host:
        raise InputError(f"{what} {raw!r} has no host.", hint="Give HOST:PORT such as 127.0.0.1:9003.")
    if not port_text:
        if default_port is None:
            raise InputError(f"{what} {raw!r} has no port.", hint="Give HOST:PORT such as 127.0.0.1:9003.")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InputError(
            f"{what} {raw!r} has port {port_text!r}, not a number in 1..65535.",
            hint="Give HOST:PORT such as 127.0.0.1:9003.",
        )
    return host, int(port_text)


def format_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tcp_probe(host: str, port: int, *, timeout: float = 1.0, what: str = "Mooncake master") -> None:
    """Open and close one TCP connection; raise UnreachableError (naming the address) on failure.

    A refused port fails at once; a black-holed one after `timeout`. A listener that accepts but
    never answers passes this probe: callers bound their first request separately.
    """
    address = format_host_port(host, port)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except TimeoutError:
        raise UnreachableError(
            f"no {what} answered at {address} within {timeout:g} s.",
            hint="Check the address and that the process is running and reachable from here.",
        ) from None
    except socket.gaierror as exc:
        raise UnreachableError(
            f"cannot resolve the {what} host {host!r}: {exc.strerror}.", hint="Check the host name."
        ) from None
    except OSError as exc:
        reason = "connection refused" if exc.errno == errno.ECONNREFUSED else (exc.strerror or str(exc))
        raise UnreachableError(
            f"no {what} is listening at {address} ({reason}).",
            hint="Start the master, or pass the right HOST:PORT.",
        ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on `host` (callers retry if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]  # (host, port) for AF_INET
        return port


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
