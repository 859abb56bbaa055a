"""`hicache te check --live`: bytes through a store client that uses the engine passed in.

    result = live_check(report, tcp=True)      # report from check_reuse
    result["ok"], result["uses_shared_engine"], result["transfers"]

A child process initialises a `mooncake.engine.TransferEngine` and a store client with
`engine=te.get_engine()` (mounting a small segment, as a rank does; docs/transfer-engine.md#reuse-rule)
against a real master on loopback; this process reads the child's object and writes one into its
segment, so bytes cross the shared engine in both directions. The child speaks one JSON line per
message on stdout, prefixed so that Mooncake's own output there is skipped. Nothing here imports
mooncake at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from hicache_ops.commands.te.report import TeReport
from hicache_ops.commands.te.rule import FORCE_TCP_ENV, IB_SYSFS, P2P, RDMA, rdma_devices
from hicache_ops.errors import CheckFailed, InputError, UnreachableError

LIVE_SEGMENT = 32 << 20
LIVE_OBJECT = 1 << 20
_LINE = "HICACHE_TE "


def live_check(
    report: TeReport,
    *,
    master: str | None = None,
    tcp: bool = False,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    tp_rank: int | None = None,
    master_started_here: bool = False,
) -> dict:
    """Initialise a TransferEngine and a store client with `engine=te.get_engine()` in a child
    process, as SGLang's rank would, and move bytes through it both ways.

    `master` HOST:RPC_PORT of a running mooncake_master (UnreachableError when nothing answers);
    None starts an embedded one on loopback (`master_started_here`: `master` is an embedded one the
    caller started and stops). `tcp` runs engine and store over TCP (the only choice
    without RDMA hardware). Returns a dict; raises CheckFailed when the transfer fails or does not
    finish within `timeout` seconds, InputError when rdma is asked for on a machine without RDMA.
    """
    from hicache_ops.mooncake.net import format_host_port, parse_host_port, tcp_probe

    cfg = report.config
    rank = next((r for r in report.ranks if tp_rank is None or r.rank.tp_rank == tp_rank), report.ranks[0])
    run_env = dict(os.environ if env is None else env)
    force_tcp = run_env.get(FORCE_TCP_ENV) == "1"
    engine_protocol = "tcp" if tcp else run_env.get("MOONCAKE_PROTOCOL", "rdma")
    store_protocol = "tcp" if tcp else cfg.protocol
    wants_rdma = not force_tcp and RDMA in (engine_protocol, store_protocol)
    if wants_rdma and not rdma_devices():
        raise InputError(
            f"the live test would use protocol rdma (engine {engine_protocol!r}, store {store_protocol!r}) "
            f"but this machine has no RDMA device ({IB_SYSFS} is missing or empty).",
            hint="Add --tcp to prove the same shared-engine path over TCP on loopback.",
        )
    engine_device = rank.engine_ib_device if rank.engine_ib_device is not None else ""
    store_device = rank.store_device if isinstance(rank.store_device, str) else ""
    if tcp:
        engine_device = store_device = ""
    notes: list[str] = []
    if cfg.metadata_server != P2P:
        notes.append(
            f"the deployment's metadata_server is {cfg.metadata_server!r}; SGLang reuses the engine only with "
            "P2PHANDSHAKE, which the live test uses"
        )

    embedded = None
    started = time.monotonic()
    if master is not None:
        host, port = parse_host_port(master, what="--master-rpc")
        master = format_host_port(host, port)
        tcp_probe(host, port, timeout=min(2.0, timeout), what="Mooncake master RPC service")
    else:
        from hicache_ops.mooncake.master import EmbeddedMaster

        embedded = EmbeddedMaster(ready_timeout=min(20.0, timeout))
        embedded.start()
        master = embedded.rpc_address
    log_dir = Path(tempfile.mkdtemp(prefix="hicache-te-live-"))
    log_path = log_dir / "child.log"
    child = None
    peer = None
    step = "start"
    key_prefix = f"hicache-te-check-{uuid.uuid4().hex[:12]}_"
    result: dict = {
        "ok": False,
        "master": master,
        "embedded_master": embedded is not None or master_started_here,
        "rank": rank.rank.label,
        "engine": {"protocol": engine_protocol, "device": engine_device, "metadata_server": P2P},
        "store": {"protocol": store_protocol, "device_name": store_device, "segment_bytes": LIVE_SEGMENT},
        "tcp_forced_by_flag": tcp,
        "log": str(log_path),
        "notes": notes,
    }
    if not os.environ.get("HICACHE_DEBUG"):
        os.environ.setdefault("GLOG_minloglevel", "2")  # the peer client's Mooncake INFO lines
    try:
        from hicache_ops.mooncake.store_client import StoreClient

        deadline = started + timeout
        # The peer first: its bounded set-up tells a master that accepts but never answers (exit 3)
        # from a live test that fails.
        step = "the peer client's set-up"
        peer = StoreClient.connect(master, segment_size=0, setup_timeout=min(5.0, timeout))
        child_env = dict(run_env)
        child_env.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
        child_env.setdefault("MC_RPC_TIMEOUT_MS", "3000")
        child_env.setdefault("MC_RPC_CONNECT_TIMEOUT_MS", "2000")
        with open(log_path, "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-c", "from hicache_ops.commands.te.live import live_child_main; live_child_main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=child_env,
                close_fds=True,
            )
        key = key_prefix + "from_rank"
        params = {
            "master": master,
            "engine_protocol": engine_protocol,
            "engine_device": engine_device,
            "store_protocol": store_protocol,
            "store_device": store_device,
            "segment": LIVE_SEGMENT,
            "key": key,
            "size": LIVE_OBJECT,
        }
        _send(child, {"op": "start", **params})
        step = "engine and store set-up in the child"
        ready = _recv(child, deadline, step)
        if not ready.get("ok"):
            raise CheckFailed(
                f"the live test failed at {ready.get('step', step)}: {ready.get('error')}.",
                hint=f"See the Mooncake log: {log_path}",
            )
        result["engine"]["session"] = ready["engine_session"]
        result["store"]["hostname"] = ready["store_hostname"]
        result["uses_shared_engine"] = ready["store_hostname"] == ready["engine_session"]
        transfers = []
        step = "reading the rank's object through its shared engine"
        t0 = time.monotonic()
        data = peer.get(key)
        ok = hashlib.sha256(data).hexdigest() == ready["digest"]
        transfers.append(
            {
                "direction": "rank segment -> peer (read served by the shared engine)",
                "key": key,
                "bytes": len(data),
                "ok": ok,
                "seconds": round(time.monotonic() - t0, 4),
            }
        )
        step = "writing into the rank's segment through its shared engine"
        payload = os.urandom(LIVE_OBJECT)
        back_key = key_prefix + "from_peer"
        t0 = time.monotonic()
        peer.put(back_key, payload)
        _send(child, {"op": "verify", "key": back_key, "digest": hashlib.sha256(payload).hexdigest()})
        step = "the rank reading the peer's object"
        answer = _recv(child, deadline, step)
        transfers.append(
            {
                "direction": "peer -> rank segment (write served by the shared engine)",
                "key": back_key,
                "bytes": len(payload),
                "ok": bool(answer.get("ok")),
                "seconds": round(time.monotonic() - t0, 4),
            }
        )
        result["transfers"] = transfers
        result["ok"] = all(t["ok"] for t in transfers) and result["uses_shared_engine"]
        if not result["uses_shared_engine"]:
            result["error"] = (
                "the store client's hostname is not the engine's session: Mooncake did not use the engine passed in"
            )
        elif not result["ok"]:
            result["error"] = answer.get("error") or "the bytes read back differ from the bytes written"
        _send(child, {"op": "close"})
        try:
            child.wait(timeout=max(2.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    except (UnreachableError, InputError):
        raise
    except CheckFailed:
        raise
    except _LiveTimeout:
        raise CheckFailed(
            f"the live test did not finish within {timeout:g} s (stuck at {step}).",
            hint=f"See the Mooncake log: {log_path}",
        ) from None
    except Exception as exc:  # a typed store error from the peer, or a broken child
        result["error"] = f"{step}: {getattr(exc, 'message', None) or exc}"
        raise CheckFailed(
            f"the live test failed at {step}: {getattr(exc, 'message', None) or exc}.",
            hint=f"See the Mooncake log: {log_path}",
        ) from None
    finally:
        if peer is not None:
            try:
                peer.close()
            except Exception:
                pass
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if embedded is not None:
            embedded.stop()
        result["seconds"] = round(time.monotonic() - started, 3)
        if not log_path.exists() or not log_path.stat().st_size:  # nothing logged: nothing to keep
            shutil.rmtree(log_dir, ignore_errors=True)
    if result["ok"]:  # nothing to read in the child's log; a failure keeps it (its path is in the result)
        shutil.rmtree(log_dir, ignore_errors=True)
        result["log"] = None
    return result


class _LiveTimeout(Exception):
    pass


def _send(child: subprocess.Popen, message: dict) -> None:
    assert child.stdin is not None
    try:
        child.stdin.write((json.dumps(message) + "\n").encode())
        child.stdin.flush()
    except (BrokenPipeError, OSError):
        pass


def _recv(child: subprocess.Popen, deadline: float, step: str) -> dict:
    """The child's next protocol line (Mooncake may print other lines on stdout too)."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _LiveTimeout(step)
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if child.poll() is not None:
                raise CheckFailed(f"the live test's child exited with code {child.returncode} during {step}.")
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise CheckFailed(f"the live test's child exited with code {child.wait()} during {step}.")
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith(_LINE):
                return json.loads(text[len(_LINE) :])


def live_child_main() -> None:  # pragma: no cover - runs in the child process
    """The rank side: shared engine, store client with engine passed in, a mounted segment."""
    out = sys.stdout

    def emit(message: dict) -> None:
        out.write(_LINE + json.dumps(message) + "\n")
        out.flush()

    params = json.loads(sys.stdin.readline())
    step = "import mooncake"
    try:
        from mooncake.engine import TransferEngine
        from mooncake.store import MooncakeDistributedStore

        step = "TransferEngine.initialize"
        te = TransferEngine()
        rc = te.initialize("127.0.0.1", P2P, params["engine_protocol"], params["engine_device"])
        if rc != 0:
            emit({"ok": False, "step": step, "error": f"returned {rc}"})
            return
        session = f"127.0.0.1:{te.get_rpc_port()}"
        step = "store setup with engine=te.get_engine()"
        store = MooncakeDistributedStore()
        rc = store.setup(
            session,
            P2P,
            int(params["segment"]),
            16 << 20,
            params["store_protocol"],
            params["store_device"],
            params["master"],
            te.get_engine(),
        )
        if rc != 0:
            emit({"ok": False, "step": step, "error": f"returned {rc} (master unreachable or parameters rejected)"})
            return
        step = "put"
        data = os.urandom(int(params["size"]))
        rc = store.put(params["key"], data)
        if rc != 0:
            emit({"ok": False, "step": step, "error": f"returned {rc}"})
            return
        emit(
            {
                "ok": True,
                "engine_session": session,
                "store_hostname": str(store.get_hostname()),
                "digest": hashlib.sha256(data).hexdigest(),
            }
        )
        for line in sys.stdin:
            msg = json.loads(line)
            if msg.get("op") == "verify":
                got = store.get(msg["key"])
                ok = bool(got) and hashlib.sha256(bytes(got)).hexdigest() == msg["digest"]
                emit({"ok": ok, "bytes": len(got), "error": None if ok else "the rank read different bytes"})
            elif msg.get("op") == "close":
                break
        store.close()
    except Exception as exc:
        emit({"ok": False, "step": step, "error": f"{type(exc).__name__}: {exc}"})
