"""Segment endpoint probes: a real listener, a closed port, and the loopback rule."""

from __future__ import annotations

import socket

from hicache_ops.commands.inspect.segments import check_segments, probe_endpoint
from hicache_ops.mooncake.net import free_port


def _row(endpoint: str) -> dict:
    return {"name": endpoint, "te_endpoint": endpoint}


def test_listener_is_reachable_and_a_closed_port_is_not():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        open_probe = probe_endpoint(f"127.0.0.1:{port}", master_host="127.0.0.1")
    assert open_probe["reachable"] and open_probe["problem"] is None
    closed = probe_endpoint(f"127.0.0.1:{free_port()}", master_host="127.0.0.1")
    assert not closed["reachable"] and closed["problem"] == "unreachable" and "refused" in closed["reason"]


def test_loopback_endpoint_is_flagged_only_when_the_master_is_elsewhere():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        single_host = check_segments([_row(endpoint)], master_host="127.0.0.1")[0]
        multi_host = check_segments([_row(endpoint)], master_host="10.213.47.1")[0]
    assert single_host["endpoint_problem"] is None and single_host["te_reachable"]
    # reachable from here (the owner's own host), yet every other host would dial itself
    assert multi_host["endpoint_problem"] == "loopback" and "MOONCAKE_LOCAL_HOSTNAME" in multi_host["endpoint_note"]


def test_malformed_endpoint_is_unreachable_not_an_error():
    row = check_segments([_row("no-port")], master_host="127.0.0.1")[0]
    assert row["endpoint_problem"] == "unreachable"
