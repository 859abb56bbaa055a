"""The store client against a real master: typed errors, bounded set-up, scoped removal, faults."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid

import numpy as np
import pytest

from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.mooncake.config import resolve_store_config
from hicache_ops.mooncake.master import EmbeddedMaster
from hicache_ops.mooncake.store_client import (
    LEASE_HELD,
    OBJECT_NOT_FOUND,
    SEGMENT_FULL,
    InvalidParams,
    LeaseHeld,
    ObjectNotFound,
    RpcFailure,
    SegmentFull,
    StoreClient,
    ecma_escape,
    raise_for_codes,
)

HANG_BOUND_S = 5.0  # the hard bound for an unreachable or silent master


def unique(tag: str) -> str:
    return f"t-{tag}-{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def client(mooncake_master, mooncake_segment_owner):
    """A short-lived client (no segment): its puts land in the session segment owner's segment."""
    c = StoreClient.connect(mooncake_master.rpc_address)
    try:
        yield c
    finally:
        c.close()


def free_closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- bytes and existence -------------------------------------------------------------------------


def test_put_get_exists_and_no_overwrite(client):
    p = unique("bytes")
    assert client.segment_size == 0 and client.master.startswith("127.0.0.1:")
    client.put(p + "a", b"first")
    assert client.get(p + "a") == b"first"
    client.put(p + "a", b"second")  # Mooncake's put keeps the existing object
    assert client.get(p + "a") == b"first"
    client.put(p + "a", b"third", upsert=True)
    assert client.get(p + "a") == b"third"
    assert client.batch_is_exist([p + "a", p + "missing"]) == [True, False]
    assert client.exists(p + "a") and not client.exists(p + "missing")
    assert client.batch_is_exist([]) == []


def test_objects_of_a_client_without_segment_outlive_it(mooncake_master, mooncake_segment_owner):
    p = unique("outlive")
    with StoreClient.connect(mooncake_master.rpc_address) as short:
        short.put(p + "x", b"kept")
    with StoreClient.connect(mooncake_master.rpc_address) as other:
        assert other.get(p + "x") == b"kept"


def test_objects_go_with_the_segment_that_held_them(fresh_mooncake_master):
    p = unique("segment")
    owner = StoreClient.connect(fresh_mooncake_master.rpc_address, segment_size=16 << 20)
    owner.put(p + "x", b"mine")
    with StoreClient.connect(fresh_mooncake_master.rpc_address) as reader:
        assert reader.exists(p + "x")
        owner.close()
        assert not reader.exists(p + "x")


def test_get_missing_is_object_not_found(client):
    with pytest.raises(ObjectNotFound) as info:
        client.get(unique("nf") + "nothing")
    assert info.value.rc == OBJECT_NOT_FOUND and info.value.exit_code == 1


def test_empty_put_is_refused(client):
    with pytest.raises(InputError):
        client.put(unique("e") + "x", b"")


# -- zero-copy batch I/O -------------------------------------------------------------------------


def test_batch_put_get_registered_buffers(client, mooncake_segment_owner):
    p = unique("batch")
    n, size = 8, 64 * 1024
    src = np.random.default_rng(1).integers(0, 256, n * size, dtype=np.uint8)
    dst = np.zeros(n * size, dtype=np.uint8)
    client.register_buffer(src.ctypes.data, src.nbytes)
    client.register_buffer(dst.ctypes.data, dst.nbytes)
    keys = [f"{p}{i}" for i in range(n)]
    ptrs = [src.ctypes.data + i * size for i in range(n)]
    assert client.batch_put_from(keys, ptrs, [size] * n) == [0] * n
    got = client.batch_get_into(
        keys + [p + "missing"], [dst.ctypes.data + i * size for i in range(n)] + [dst.ctypes.data], [size] * (n + 1)
    )
    assert got[:n] == [size] * n and got[n] == OBJECT_NOT_FOUND
    assert np.array_equal(src, dst)
    with pytest.raises(ObjectNotFound) as info:
        raise_for_codes(got, keys + [p + "missing"], op="batch_get_into")
    assert info.value.key == p + "missing"
    # Upsert replaces what put keeps.
    original = src[:size].copy()
    src[:size] = 7
    assert client.batch_put_from(keys[:1], ptrs[:1], [size]) == [0]  # kept: put does not overwrite
    assert client.batch_get_into(keys[:1], [dst.ctypes.data], [size]) == [size]
    assert np.array_equal(dst[:size], original)
    assert client.batch_put_from(keys[:1], ptrs[:1], [size], upsert=True) == [0]
    client.batch_get_into(keys[:1], [dst.ctypes.data], [size])
    assert np.all(dst[:size] == 7)
    client.unregister_buffer(src.ctypes.data)
    client.unregister_buffer(dst.ctypes.data)


def test_batch_length_mismatch_and_invalid_params(client):
    buf = np.zeros(4096, dtype=np.uint8)
    client.register_buffer(buf.ctypes.data, buf.nbytes)
    with pytest.raises(InputError, match="one per key"):
        client.batch_put_from(["a", "b"], [buf.ctypes.data], [1])
    key = unique("zero") + "x"
    codes = client.batch_put_from([key], [buf.ctypes.data], [0])
    with pytest.raises(InvalidParams) as info:
        raise_for_codes(codes, [key], op="batch_put_from")
    assert info.value.exit_code == 2
    assert client.batch_put_from([], [], []) == [] and client.batch_get_into([], [], []) == []


# -- leases and segment space --------------------------------------------------------------------


def test_lease_held_then_forced(client):
    p = unique("lease")
    client.put(p + "x", b"leased")
    client.get(p + "x")  # a read grants a lease
    codes = client.remove_keys([p + "x"], prefix=p)
    assert codes == [LEASE_HELD]
    with pytest.raises(LeaseHeld) as info:
        raise_for_codes(codes, [p + "x"], op="remove")
    assert "lease" in info.value.message and info.value.hint
    assert client.remove_keys([p + "x"], prefix=p, force=True) == [0]
    assert not client.exists(p + "x")
    assert client.remove_keys([p + "x"], prefix=p, force=True) == [OBJECT_NOT_FOUND]


def test_segment_full_is_typed_and_retried(fresh_mooncake_master):
    mib = 1 << 20
    owner = StoreClient.connect(fresh_mooncake_master.rpc_address, segment_size=16 * mib)
    try:
        buf = np.ones(32 * mib, dtype=np.uint8)
        owner.register_buffer(buf.ctypes.data, buf.nbytes)
        # Larger than the whole segment: full whatever eviction does.
        codes = owner.batch_put_from(["huge"], [buf.ctypes.data], [32 * mib], retries=2, backoff=0.01)
        assert codes == [SEGMENT_FULL]
        with pytest.raises(SegmentFull) as info:
            raise_for_codes(codes, ["huge"], op="batch_put_from")
        assert info.value.exit_code == 1 and info.value.hint
        # Overfill without retries: some keys report SEGMENT_FULL ...
        keys = [f"fill/{i}" for i in range(24)]
        ptrs = [buf.ctypes.data + i * mib for i in range(24)]
        first = owner.batch_put_from(keys, ptrs, [mib] * 24, retries=0)
        assert SEGMENT_FULL in first
        # ... and with retries the keys that hit it go in once eviction has made room.
        later = [f"fill2/{i}" for i in range(8)]
        assert owner.batch_put_from(later, ptrs[:8], [mib] * 8, retries=10, backoff=0.05) == [0] * 8
    finally:
        owner.close()


# -- removal is always scoped ---------------------------------------------------------------------


def test_remove_prefix_is_literal_and_scoped(client):
    p = unique("rm")
    dotted = p + "m.v+1_"
    keys = [dotted + "a", dotted + "b", p + "mXv+1_c", p + "m.vv1_d", p + "other"]
    for k in keys:
        client.put(k, b"x")
    assert client.remove_prefix(dotted, force=True) == 2
    assert client.batch_is_exist(keys) == [False, False, True, True, True]
    assert client.remove_prefix(p, force=True) == 3
    assert client.batch_is_exist(keys) == [False] * 5


def test_removal_refuses_unscoped_requests(client, mooncake_segment_owner):
    p = unique("guard")
    client.put(p + "x", b"x")
    with pytest.raises(InputError, match="empty prefix"):
        client.remove_prefix("")
    with pytest.raises(InputError, match="outside the prefix"):
        client.remove_keys([p + "x", "elsewhere"], prefix=p)
    with pytest.raises(InputError, match="cluster-wide"):
        client.remove_all()
    assert client.exists(p + "x")


def test_remove_all_only_with_force(fresh_mooncake_master):
    owner = StoreClient.connect(fresh_mooncake_master.rpc_address, segment_size=16 << 20)
    try:
        owner.put("a", b"1")
        owner.put("b", b"2")
        with pytest.raises(InputError):
            owner.remove_all()
        assert owner.remove_all(force=True) == 2
        assert owner.batch_is_exist(["a", "b"]) == [False, False]
    finally:
        owner.close()


def test_ecma_escape():
    assert ecma_escape("Qwen2.5-7B_(x)+[y]*") == r"Qwen2\.5-7B_\(x\)\+\[y\]\*"


# -- bounded set-up and faults ---------------------------------------------------------------------


def test_refused_port_fails_fast():
    port = free_closed_port()
    start = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        StoreClient.connect(f"127.0.0.1:{port}")
    assert time.monotonic() - start < HANG_BOUND_S
    assert f"127.0.0.1:{port}" in info.value.message and info.value.exit_code == 3


def test_silent_master_is_bounded(fresh_mooncake_master, freeze_process):
    """A master that accepts connections but never answers (SIGSTOP): UnreachableError within 5 s."""
    freeze_process(fresh_mooncake_master.pid)
    start = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        StoreClient.connect(fresh_mooncake_master.rpc_address)
    assert time.monotonic() - start < HANG_BOUND_S
    assert fresh_mooncake_master.rpc_address in info.value.message


def test_master_killed_under_a_client_is_rpc_failure():
    master = EmbeddedMaster().start()
    try:
        short = StoreClient.connect(master.rpc_address)
        short.batch_is_exist(["x"])
        master.kill()
        start = time.monotonic()
        with pytest.raises(RpcFailure) as info:  # Mooncake's own reconnect attempts: up to ~4.3 s
            short.batch_is_exist(["x"])
        assert time.monotonic() - start < HANG_BOUND_S
        assert info.value.exit_code == 3 and master.rpc_address in info.value.message
        start = time.monotonic()
        with pytest.raises(RpcFailure):  # later calls probe the port first and fail at once
            short.get("x")
        with pytest.raises(RpcFailure):
            short.batch_put_from(["x"], [0], [1])
        assert time.monotonic() - start < HANG_BOUND_S
        short.close()
        assert short.health() == 1
    finally:
        master.stop()


def test_master_silenced_under_a_client_is_bounded(freeze_process):
    master = EmbeddedMaster().start()
    try:
        short = StoreClient.connect(master.rpc_address)
        short.batch_is_exist(["x"])
        freeze_process(master.pid)
        start = time.monotonic()
        with pytest.raises(RpcFailure):  # the RPC timeout set at connect bounds every call
            short.batch_is_exist(["x"])
        assert time.monotonic() - start < HANG_BOUND_S
        os.kill(master.pid, signal.SIGCONT)
        assert short.batch_is_exist(["x"]) == [False]  # and the client recovers
        short.close()
    finally:
        master.stop()


def test_malformed_addresses_are_input_errors():
    for bad in ("", "localhost", "127.0.0.1:notaport", "127.0.0.1:70000", "a:b:c", "http://h:1/path"):
        with pytest.raises(InputError):
            StoreClient.connect(bad)


def test_crashing_metadata_never_reaches_mooncake(mooncake_master):
    # If this reached Mooncake, the glog FATAL would end the whole pytest process.
    with pytest.raises(InputError, match="Redis"):
        StoreClient.connect(mooncake_master.rpc_address, metadata_server="redis://127.0.0.1:6379")
    start = time.monotonic()
    with pytest.raises(InputError, match="etcd"):
        StoreClient.connect(mooncake_master.rpc_address, metadata_server="127.0.0.1:2379")
    assert time.monotonic() - start < HANG_BOUND_S


def test_from_config(mooncake_master, mooncake_segment_owner):
    cfg = resolve_store_config(
        "0.5.23",
        env={
            "MOONCAKE_MASTER": mooncake_master.rpc_address,
            "MOONCAKE_PROTOCOL": "tcp",
            "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
        },
    )
    with StoreClient.from_config(cfg) as c:
        assert c.segment_size == 0
        p = unique("cfg")
        c.put(p + "x", b"ok")
        assert c.get(p + "x") == b"ok"
    bad = resolve_store_config(
        "0.5.23", env={"MOONCAKE_MASTER": mooncake_master.rpc_address, "MOONCAKE_TE_META_DATA_SERVER": "redis://r:1"}
    )
    with pytest.raises(InputError):
        StoreClient.from_config(bad)


def test_closed_client_refuses_calls(mooncake_master):
    c = StoreClient.connect(mooncake_master.rpc_address)
    c.close()
    c.close()
    with pytest.raises(Exception, match="closed"):
        c.batch_is_exist(["x"])
