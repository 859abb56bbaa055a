"""Shared fixtures: a real `mooncake_master` on loopback, started once and always stopped by PID.

    def test_x(mooncake_master):               # session-wide master (EmbeddedMaster)
        mooncake_master.rpc_address            # "127.0.0.1:PORT"  -> master_server_address
        mooncake_master.metrics_address        # "127.0.0.1:PORT"  -> the admin HTTP API / --master
        mooncake_master.metadata_server        # "P2PHANDSHAKE"

    def test_y(mooncake_segment_owner):        # a StoreClient that mounts 256 MiB on that master
        ...

    def test_z(fresh_mooncake_master):         # a master of the test's own (kill it, fill it, ...)

    def test_v(shared_serve):                  # a `hicache serve` per session and argument set
        serve = shared_serve("--device-tokens", "2048", ...)

    def test_w(fresh_mooncake_master, freeze_process):
        freeze_process(fresh_mooncake_master.pid)   # a silent master: SIGSTOP, resumed at teardown

Objects live in the segment of the client that mounted them (docs/mooncake.md#segments-and-ttl): puts from clients that
mount nothing land in `mooncake_segment_owner`'s segment and outlive those clients. The session
master is shared: give each test's keys a unique prefix. Master logs go under pytest's tmp_path
(`master.log_path`), which pytest rotates.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest
from hypothesis import HealthCheck, settings

from hicache_ops.mooncake.master import EmbeddedMaster

# Hypothesis: `make test` draws derandomized examples (profile "ci", no example database);
# `make test-deep` (HYPOTHESIS_PROFILE=deep) draws fresh, many more examples where a test does not
# fix its count (the oracle's workload counts follow the profile too: DEEP_WORKLOADS in
# tests/engine/oracle_workloads.py). Derandomized is not context-free: Hypothesis mixes in
# constants from the local (hicache_ops) modules imported so far, so an xdist worker that ran
# other modules first draws other examples. Properties must hold for any draw; a test whose
# assertions depend on which examples are drawn draws them in a process of its own, as the oracle does.
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=2000, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests touch only loopback. SGLang picks the address its Transfer Engine advertises from the first
# NIC (or a UDP "connect" towards a public DNS server) unless SGLANG_HOST_IP says otherwise.
os.environ["SGLANG_HOST_IP"] = "127.0.0.1"


@pytest.fixture(scope="session", autouse=True)
def temporary_files_under_pytest(tmp_path_factory):
    """The code under test keeps some logs on purpose (a failure a test provokes keeps its log and
    prints the path): in tests they land in pytest's session folder, which pytest rotates, never
    in /tmp itself. Child processes inherit TMPDIR."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield folder
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


@pytest.fixture(scope="session")
def mooncake_master(tmp_path_factory):
    master = EmbeddedMaster(log_path=tmp_path_factory.mktemp("mooncake-master") / "mooncake_master.log")
    master.start()
    try:
        yield master
    finally:
        master.stop()


@pytest.fixture(scope="session")
def mooncake_segment_owner(mooncake_master):
    from hicache_ops.mooncake.store_client import StoreClient

    client = StoreClient.connect(mooncake_master.rpc_address, segment_size=256 << 20)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def shared_serve(tmp_path_factory):
    """shared_serve(*args): a `hicache serve` started once per session (per xdist worker) and per
    argument set, stopped at the end of the session. Modules with the same arguments share it:
    their tests use prompts (token ranges, seeds) of their own. A test that kills or reconfigures
    a serve, or needs an empty one, starts its own `Serve`."""
    from serve_process import Serve

    started: dict[tuple[str, ...], Serve] = {}

    def get(*args: str) -> Serve:
        if args not in started:
            started[args] = Serve(tmp_path_factory.mktemp("shared-serve"), *args)
        return started[args]

    try:
        yield get
    finally:
        for serve in started.values():
            serve.stop()


@pytest.fixture
def fresh_mooncake_master(tmp_path):
    master = EmbeddedMaster(log_path=tmp_path / "mooncake_master.log")
    master.start()
    try:
        yield master
    finally:
        master.stop()


@pytest.fixture
def freeze_process():
    """freeze(pid): SIGSTOP and wait until every thread is stopped (delivery is asynchronous on a
    busy host), so the process accepts TCP connections but answers nothing. SIGCONT at teardown."""
    frozen: list[int] = []

    def freeze(pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
                states = set()
                for task in tasks:
                    with open(f"/proc/{pid}/task/{task}/stat") as fh:
                        states.add(fh.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                return
            if states <= {"T", "t"}:
                return
            time.sleep(0.01)
        raise AssertionError(f"process {pid} did not stop")

    try:
        yield freeze
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


@pytest.fixture
def silent_server():
    """ "127.0.0.1:PORT" of a listening socket that accepts connections (the kernel's backlog) and
    never answers: a server that is up but silent."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture(autouse=True)
def environment_restored_after_each_test():
    """Some code under test writes os.environ on purpose: SGLang's ServerArgs sets MC_FORCE_TCP=1 for
    the `mooncake_tcp` transfer backend. Under xdist a module runs after whatever ran before it in the
    same worker, so a value left behind changed what later tests' commands saw (te check reading
    MC_FORCE_TCP=1 as reused). Each test gets back the environment it started with."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)
