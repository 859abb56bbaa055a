"""An embedded `mooncake_master`: a child process bound to 127.0.0.1 that cannot outlive us.

    with EmbeddedMaster() as master:          # free ports, waits until /health says ready
        master.rpc_address                    # "127.0.0.1:PORT" for clients (master_server_address)
        master.metrics_address                # "127.0.0.1:PORT" for the admin HTTP API
        master.log_path                       # where its stdout and stderr go

Life cycle:
- the wheel's binary is started directly (not through the Python wrapper), so the PID we hold is
  the master's; it gets its own process group and PR_SET_PDEATHSIG(SIGKILL), so it dies with the
  thread that started it even when that process is killed -9 (start it from a long-lived thread);
- `stop()` sends SIGTERM to that PID, then SIGKILL after a grace period; an atexit hook stops
  every master still running when the interpreter exits normally;
- the HTTP metadata server is started only when asked (`http_metadata=True`). Mooncake binds it
  to 0.0.0.0 whatever `--http_metadata_server_host` says (measured with 0.3.13.post1), so it is
  off by default; clients of it need MC_TCP_BIND_ADDRESS=127.0.0.1 (`client_env()`).

Objects live in the segments of the clients that mounted them, not in the master: a master alone
holds no data, and a master restart loses every key.
"""

from __future__ import annotations

import atexit
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.mooncake.net import format_host_port, free_port

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1
_running: weakref.WeakSet[EmbeddedMaster] = weakref.WeakSet()


def find_master_binary() -> str:
    """Path of the `mooncake_master` executable shipped in the mooncake wheel (no import of mooncake)."""
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec("mooncake")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        candidates += [Path(loc) / "mooncake_master" for loc in (spec.submodule_search_locations or [])]
    candidates.append(Path(sys.executable).parent / "mooncake_master")
    which = shutil.which("mooncake_master")
    if which:
        candidates.append(Path(which))
    for path in candidates:
        if path.is_file():
            if not os.access(path, os.X_OK):
                try:
                    path.chmod(path.stat().st_mode | 0o111)
                except OSError:
                    continue
            return str(path)
    raise InputError(
        "mooncake_master was not found next to this Python or on PATH.",
        hint="Install the mooncake wheel: pip install mooncake-transfer-engine-non-cuda.",
    )


def _make_child_setup(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: own process group, and SIGKILL when the parent thread dies."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        prctl = None

    def setup() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup


def _get_json(host: str, port: int, path: str, timeout: float) -> tuple[int, object]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(body or b"null")
    except ValueError:
        return resp.status, None


class EmbeddedMaster:
    """One `mooncake_master` child on loopback. Use as a context manager or start()/stop()."""

    def __init__(
        self,
        *,
        http_metadata: bool = False,
        log_path: str | os.PathLike[str] | None = None,
        ready_timeout: float = 30.0,
        stop_grace: float = 5.0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        binary: str | None = None,
    ):
        self.http_metadata = http_metadata
        self.ready_timeout = ready_timeout
        self.stop_grace = stop_grace
        self.extra_args = list(extra_args)
        self._env = dict(env) if env is not None else None
        self._binary = binary
        self._log_path = Path(log_path) if log_path is not None else None
        self._temporary_log_dir: Path | None = None  # made by start(), removed by a clean stop()
        self.host = LOOPBACK
        self.rpc_port: int | None = None
        self.metrics_port: int | None = None
        self.http_metadata_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # -- addresses -----------------------------------------------------------------------------

    @property
    def rpc_address(self) -> str:
        """HOST:PORT of the RPC service: what clients take as master_server_address."""
        return format_host_port(self.host, self._need(self.rpc_port))

    @property
    def metrics_address(self) -> str:
        """HOST:PORT of the admin HTTP API (/health, /get_all_keys, /metrics, ...)."""
        return format_host_port(self.host, self._need(self.metrics_port))

    @property
    def metadata_server(self) -> str:
        """What clients pass as metadata_server: the HTTP metadata URL, or P2PHANDSHAKE."""
        if self.http_metadata:
            return f"http://{format_host_port(self.host, self._need(self.http_metadata_port))}/metadata"
        return "P2PHANDSHAKE"

    def client_env(self) -> dict[str, str]:
        """Environment a client of this master needs (MC_TCP_BIND_ADDRESS with HTTP metadata)."""
        return {"MC_TCP_BIND_ADDRESS": LOOPBACK} if self.http_metadata else {}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def info(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "rpc_address": self.rpc_address if self.rpc_port else None,
            "metrics_address": self.metrics_address if self.metrics_port else None,
            "metadata_server": self.metadata_server if self.rpc_port else None,
            "log_path": str(self._log_path) if self._log_path else None,
            "running": self.running,
        }

    def _need(self, port: int | None) -> int:
        if port is None:
            raise RuntimeError("the embedded master has not been started")
        return port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> EmbeddedMaster:
        """Start on free loopback ports and wait until ready; retries if a port was taken meanwhile."""
        with self._lock:
            if self.running:
                return self
            if self._log_path is None:
                self._temporary_log_dir = Path(tempfile.mkdtemp(prefix="hicache-mooncake-master-"))
                self._log_path = self._temporary_log_dir / "mooncake_master.log"
            log_path = self._log_path
            log_path.parent.mkdir(parents=True, exist_ok=True)
            binary = self._binary or find_master_binary()
            if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
                raise InputError(
                    f"mooncake_master {binary!r} is not an executable file.",
                    hint="Install mooncake-transfer-engine-non-cuda, or pass the right binary.",
                )
            last_error: Exception | None = None
            for _attempt in range(3):
                try:
                    proc = self._spawn(binary, log_path)
                    self._wait_ready(proc, self.ready_timeout)
                    _running.add(self)
                    return self
                except _EarlyExit as exc:  # most likely a port taken between probe and bind
                    last_error = exc
                    continue
                except BaseException:
                    self._terminate()
                    self._temporary_log_dir = None  # keep the log the error points to
                    raise
            self._temporary_log_dir = None  # keep the log the error points to
            raise UnreachableError(
                f"mooncake_master exited during start-up three times ({last_error}).",
                hint=f"See its log: {self._log_path}",
            )

    def _spawn(self, binary: str, log_path: Path) -> subprocess.Popen[bytes]:
        ordered: list[int] = []
        while len(ordered) < (3 if self.http_metadata else 2):
            port = free_port(self.host)
            if port not in ordered:
                ordered.append(port)
        self.rpc_port, self.metrics_port = ordered[0], ordered[1]
        args = [
            binary,
            f"--rpc_address={self.host}",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_host={self.host}",
            f"--metrics_port={self.metrics_port}",
        ]
        env = dict(os.environ if self._env is None else self._env)
        if self.http_metadata:
            self.http_metadata_port = ordered[2]
            args += [
                "--enable_http_metadata_server=true",
                f"--http_metadata_server_port={self.http_metadata_port}",
                f"--http_metadata_server_host={self.host}",
            ]
            env["MC_TCP_BIND_ADDRESS"] = LOOPBACK
        args += self.extra_args
        with open(log_path, "ab") as log:
            log.write(f"# hicache: {' '.join(args)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
                preexec_fn=_make_child_setup(os.getpid()),
            )
        return self._proc

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = proc.poll()
            if code is not None:
                raise _EarlyExit(f"exit code {code}")
            try:
                status, body = _get_json(self.host, self._need(self.metrics_port), "/health", timeout=1.0)
                if status == 200 and isinstance(body, dict) and body.get("service_ready", body.get("status") == "ok"):
                    # The admin server can answer before the RPC port listens (measured: up to
                    # ~7 ms earlier, more on a busy host), and a client connecting then is refused.
                    with socket.create_connection((self.host, self._need(self.rpc_port)), timeout=1.0):
                        return
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise UnreachableError(
                    f"mooncake_master (pid {proc.pid}) was not ready within {timeout:g} s.",
                    hint=f"See its log: {self._log_path}",
                )
            time.sleep(0.05)

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM by PID, SIGKILL after `grace` seconds; returns the exit code (None if never started).
        A log folder start() made is removed (a failed start keeps it: its error names the log)."""
        with self._lock:
            code = self._terminate(self.stop_grace if grace is None else grace)
            self._remove_temporary_log_dir()
            return code

    def kill(self) -> int | None:
        """SIGKILL at once (tests: a master that dies under its clients); its temporary log folder goes too."""
        with self._lock:
            code = self._terminate(0.0)
            self._remove_temporary_log_dir()
            return code

    def _remove_temporary_log_dir(self) -> None:
        folder, self._temporary_log_dir = self._temporary_log_dir, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def _terminate(self, grace: float = 5.0) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        _running.discard(self)
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM if grace > 0 else signal.SIGKILL)
                if grace > 0:
                    proc.send_signal(signal.SIGCONT)  # a stopped master would sit on SIGTERM
                proc.wait(timeout=grace if grace > 0 else 5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:  # pragma: no cover - already reaped
                pass
        return proc.returncode

    def on_exit(self, callback: Callable[[int], object]) -> None:
        """Reap the master the moment it exits (no zombie) and call `callback(returncode)` then,
        from a daemon thread; a stop() of ours calls it too."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("the embedded master has not been started")

        def wait() -> None:
            callback(proc.wait())

        threading.Thread(target=wait, name=f"reap-mooncake-master-{proc.pid}", daemon=True).start()

    def __enter__(self) -> EmbeddedMaster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = (
            f"pid {self.pid}, rpc {self.rpc_address}, metrics {self.metrics_address}"
            if self.rpc_port
            else "not started"
        )
        return f"EmbeddedMaster({state})"


class _EarlyExit(Exception):
    pass


@atexit.register
def _stop_all() -> None:
    for master in list(_running):
        try:
            master.stop(grace=2.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass
