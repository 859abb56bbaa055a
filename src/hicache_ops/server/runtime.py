"""Everything `hicache serve` runs: the embedded Mooncake master (or a link to an existing one),
the long-lived store client that owns the L3 segment, and the real-bytes tiered cache.

`start()` brings the pieces up in order and `stop()` takes down what it started, the master
included, whatever failed in between.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hicache_ops.engine.builder import EngineSpec, build_bytes
from hicache_ops.errors import InputError
from hicache_ops.mooncake.net import parse_host_port
from hicache_ops.server.api_counters import ApiCounters
from hicache_ops.server.namespaces import NamespaceMarkers
from hicache_ops.tokens import Tokenizer

if TYPE_CHECKING:
    from hicache_ops.engine.cache import TieredCache
    from hicache_ops.mooncake.master import EmbeddedMaster
    from hicache_ops.mooncake.store_client import StoreClient
    from hicache_ops.server.l3_health import L3Health

DEFAULT_PORT = 18080
DEFAULT_SEGMENT_BYTES = 256 * 2**20


def check_device(device: str, tp_size: int) -> str:
    """--device: auto, cpu, cuda or cuda:N, and CUDA only where there is as much of it as asked."""
    if device in ("auto", "cpu"):
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise InputError(f"--device {device!r} is not auto, cpu, cuda or cuda:N.")
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    wanted = tp_size if device == "cuda" else int(device[5:]) + 1
    if available < wanted:
        raise InputError(
            f"--device {device} needs {wanted} CUDA device(s) and this machine has {available}.",
            hint="Use --device cpu (or auto).",
        )
    return device


def check_log_dir(log_dir: str | None) -> None:
    if log_dir is None:
        return
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise InputError(f"--log-dir {log_dir!r} is a file, not a folder.")
    try:  # created now, so a folder that cannot exist is refused before anything starts
        os.makedirs(log_dir, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--log-dir {log_dir!r} cannot be created: {exc.strerror}.") from None
    if not os.access(log_dir, os.W_OK):
        raise InputError(f"--log-dir {log_dir!r} is not writable.")


def check_segment(segment_bytes: int) -> None:
    from hicache_ops.mooncake.store_client import check_fits_in_memory

    if segment_bytes <= 0:
        raise InputError(f"--segment-mb {segment_bytes // 2**20} must be > 0.")
    check_fits_in_memory(segment_bytes, f"--segment-mb {segment_bytes // 2**20}")


def check_listen(host: str, port: int) -> None:
    """That `host:port` can be bound now, with the reason when not (bad address, port in use)."""
    if not 0 < port < 65536:
        raise InputError(f"--port {port} is not a TCP port (1-65535).")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError):
        raise InputError(
            f"--host {host!r} is not an address or a name this machine can resolve.",
            hint="Use 127.0.0.1 (the default) or an address of this machine.",
        ) from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise InputError(
                    f"cannot listen on {host}:{port}: the port is in use.", hint="Pick another --port."
                ) from None
            raise InputError(
                f"cannot listen on {host}:{port}: {exc.strerror}.",
                hint="--host must be an address of this machine (127.0.0.1 by default).",
            ) from None


@dataclass(frozen=True)
class L3Target:
    """Where L3 lives: "embedded" (a master this process starts), "none", or an existing cluster."""

    kind: str  # embedded | none | mooncake
    rpc_address: str | None = None
    metrics_address: str | None = None

    @classmethod
    def parse(cls, text: str) -> L3Target:
        if text in ("embedded", "none"):
            return cls(text)
        if not text.startswith("mooncake://"):
            raise InputError(
                f"--l3 {text!r} is not embedded, none or mooncake://HOST:RPC_PORT?metrics=PORT.",
                hint="For an existing master: --l3 'mooncake://127.0.0.1:50051?metrics=9003'.",
            )
        url = urllib.parse.urlsplit(text)
        host, port = parse_host_port(url.netloc, what="--l3 master address")
        query = urllib.parse.parse_qs(url.query)
        metrics = query.get("metrics", [None])[0]
        if metrics is None or not metrics.isdigit():
            raise InputError(
                f"--l3 {text!r} lacks ?metrics=PORT, the master's HTTP (metrics) port.",
                hint="Add ?metrics=9003 (MOONCAKE_MASTER_METRICS_PORT).",
            )
        return cls("mooncake", f"{host}:{port}", f"{host}:{int(metrics)}")


@dataclass
class Runtime:
    spec: EngineSpec
    l3: L3Target = field(default_factory=lambda: L3Target("embedded"))
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    log_dir: str | None = None
    # Fault injection for training and playbook tests: simulated extra seconds per L3 page read.
    l3_latency_s: float = 0.0
    # The store client's Mooncake local_hostname: peers dial it to read this segment.
    local_hostname: str = "127.0.0.1"
    local_hostname_source: str = "default"
    # A local tokenizer for SGLang's `text` requests (server/sglang_api.py); None: input_ids only.
    tokenizer_path: str | None = None
    tokenizer: Tokenizer | None = None
    api_counters: ApiCounters = field(default_factory=ApiCounters)
    master: EmbeddedMaster | None = None
    store: StoreClient | None = None
    cache: TieredCache | None = None
    l3_health: L3Health | None = None
    started: dict = field(default_factory=dict)
    namespace_markers: NamespaceMarkers = field(default_factory=NamespaceMarkers)

    def start(self) -> Runtime:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def running_cache(self) -> TieredCache:
        """The tiered cache start() built; an error before start() or after a failed one."""
        if self.cache is None:
            raise RuntimeError("the serve runtime has no cache: start() has not run or failed")
        return self.cache

    def _start(self) -> None:
        self.api_counters = ApiCounters()
        if self.tokenizer_path is not None and self.tokenizer is None:
            self.tokenizer = Tokenizer(self.tokenizer_path)
        rpc, metrics = self.l3.rpc_address, self.l3.metrics_address
        if self.l3.kind == "embedded":
            from hicache_ops.mooncake.master import EmbeddedMaster

            log = f"{self.log_dir}/mooncake_master.log" if self.log_dir else None
            self.master = EmbeddedMaster(log_path=log).start()
            rpc, metrics = self.master.rpc_address, self.master.metrics_address
        if self.l3.kind != "none":
            # L3Target.parse gives a mooncake target both addresses; an embedded master has both
            assert rpc is not None and metrics is not None
            from hicache_ops.mooncake.store_client import StoreClient
            from hicache_ops.server.l3_health import L3Health

            # This long-lived client owns the segment the objects live in (docs/mooncake.md#segments-and-ttl).
            self.store = StoreClient.connect(rpc, segment_size=self.segment_bytes, local_hostname=self.local_hostname)
            store = self.store

            def on_change(state: str, reason: str) -> None:
                store.mark_down(reason if state == "down" else None)
                recovery = self.l3_recovery() if state == "down" else None
                if recovery is not None:  # the serve's log says it too, beside "L3 is down"
                    logging.getLogger("hicache.serve").error("to recover: %s", recovery)

            self.l3_health = L3Health(metrics, on_change=on_change)
            if self.master is not None:
                master, health, pid = self.master, self.l3_health, self.master.pid
                assert pid is not None  # a started master has a process
                master.on_exit(lambda code: health.master_exited(pid, code, expected=self.master is None))
            self.l3_health.start()
        from hicache_ops.engine.bytes_plane import MooncakeL3

        self.cache = build_bytes(self.spec, self.store)
        # build_bytes gives the cache an L3 only with a store, and then a MooncakeL3
        if self.l3_latency_s and isinstance(self.cache.l3, MooncakeL3):
            self.cache.l3.extra_latency_s = self.l3_latency_s
        self.started = {"rpc_address": rpc, "metrics_address": metrics}

    def stop(self) -> bool:
        """Take down what start() started. False when L3 was down and the store client was
        abandoned rather than closed (docs/mooncake.md, "A master that dies under its clients"): the
        process must then end with os._exit."""
        health, self.l3_health = self.l3_health, None
        if health is not None:
            health.stop()
            if health.down:
                # Decide on a fresh probe: one slow answer on a loaded machine marks L3 down, and an
                # abandoned client leaves its segment listed (puts placed there fail) for the TTL.
                health.probe()
        closed = True
        store, self.store = self.store, None
        if store is not None:
            try:
                if health is not None and health.down:
                    store.abandon()
                    closed = False
                else:
                    store.close()
            except Exception:  # closing is best effort; the master goes next anyway
                pass
        master, self.master = self.master, None
        if master is not None:
            master.stop()
        return closed

    @property
    def l3_state(self) -> dict:
        if self.l3_health is None:
            return {"state": "none" if self.l3.kind == "none" else "stopped"}
        from hicache_ops.results import json_data

        return json_data(self.l3_health.view())

    def l3_recovery(self) -> str | None:
        """What brings a down L3 back, for /health (docs/serve-api.md#when-l3-is-down); None while up.

        An embedded master that exited stays down: the serve does not start another under its
        mounted store client, whose segment went with the master (docs/mooncake.md, "A master that
        dies under its clients"). An existing master comes back by itself once it answers again."""
        health = self.l3_health
        if health is None or not health.down:
            return None
        if self.l3.kind == "embedded" and health.master_exit is not None:
            log = self.master_log_path
            return (
                "this serve does not restart its embedded master: stop the serve (Ctrl-C or SIGTERM) and start "
                "`hicache serve` again, which starts a new master with an empty L3"
                + (f"; the dead master's log is {log}" if log else "")
                + "."
            )
        return (
            f"bring the Mooncake master at {health.metrics_address} back; the serve probes it every "
            f"{health.interval_s:g} s and L3 is up again as soon as it answers."
        )

    def publish_namespaces(self) -> None:
        """A marker on the master for each request namespace not marked yet (server/namespaces.py),
        so that readers sharing the master can name it."""
        cache = self.cache
        if cache is None or self.store is None:
            return
        with cache.lock:
            namespaces = list(cache.namespaces)
        health = self.l3_health
        self.namespace_markers.publish(namespaces, self.store, health is not None and health.down)

    def record_l3_error(self, message: str) -> None:
        if self.l3_health is not None:
            self.l3_health.record_error(message)

    @property
    def master_log_path(self) -> str | None:
        path = getattr(self.master, "log_path", None)
        return str(path) if path is not None else None

    # -- what the API reports -------------------------------------------------------------------

    def describe(self) -> dict:
        from hicache_ops.engine.bytes_plane import BytesPlane

        cache = self.running_cache
        plane = cache.plane
        assert isinstance(plane, BytesPlane)  # build_bytes builds the real-bytes plane
        host = self.spec.host_layout(mooncake=self.store is not None)
        return {
            "geometry": self.spec.geometry.view().model_dump(mode="json"),
            "page_size": self.spec.page_size,
            "tp_size": self.spec.tp_size,
            "dcp_size": self.spec.dcp_size,
            "rank_page_size": self.spec.rank_page_size,  # tokens of a page one rank holds (DCP splits it)
            "rank_devices": [str(r.device_k.device) for r in plane.ranks],
            "device_pages": cache.config.device_pages,
            "host_pages": cache.config.host_pages,
            "host_layout": host.layout,
            "bytes_per_page_per_rank": host.bytes_per_page,
            "write_policy": cache.config.write_policy,
            "stop_policy": cache.config.stop_policy,
            "prefetch_threshold": cache.config.prefetch_threshold,
            "admission_s": cache.config.admission_s,
            "timeout_budget": {
                "base": self.spec.timeout_budget.base,
                "per_ki_token": self.spec.timeout_budget.per_ki_token,
                "maximum": self.spec.timeout_budget.maximum,
            },
            "sglang_version": cache.config.sglang_version,
            "model_name": self.spec.model_name,
            "extra_backend_tag": self.spec.extra_backend_tag,
            "key_prefix": self.spec.schemes()[0].prefix,
            "side_pools": [
                {
                    **pool.view(
                        list(
                            dict.fromkeys(
                                s
                                for scheme in self.spec.schemes()
                                for s in self.spec.side_pool_suffixes(scheme)[pool.name]
                            )
                        )
                    ).model_dump(mode="json"),
                    "spec": pool.to_text(),
                }
                for pool in self.spec.side_pools
            ],
            "l3": self.l3.kind,
            "injected_l3_latency_s": self.l3_latency_s,
            "master_rpc_address": self.started.get("rpc_address"),
            "master_metrics_address": self.started.get("metrics_address"),
            "master_pid": getattr(self.master, "pid", None),
            "master_log": self.master_log_path,
            "local_hostname": self.local_hostname,
            "local_hostname_source": self.local_hostname_source,
            "segment": self.store.hostname if self.store is not None else None,
            "tokenizer": self.tokenizer_path,
        }

    def stats(self) -> dict:
        from dataclasses import asdict

        cache = self.running_cache
        with cache.lock:
            return {
                "config": self.describe(),
                "occupancy": cache.occupancy(),
                "stats": asdict(cache.stats),
                "l3": self.l3_state,
                "namespaces": [{"extra_key": e, "cache_salt": c} for e, c in cache.namespaces],
            }

    def layout_report(self) -> dict[str, Any]:
        from hicache_ops.commands.inspect.layout import inspect_layout
        from hicache_ops.results import json_data

        spec = self.spec
        report = inspect_layout(
            # one rank's pools: under DCP a rank holds 1/dcp_size of every page
            spec.geometry,
            layout=spec.layout,
            io_backend=spec.io_backend,
            page_size=spec.rank_page_size,
            device_tokens=spec.device_tokens // spec.dcp_size,
            hicache_ratio=spec.hicache_ratio,
            hicache_size_gb=spec.hicache_size_gb,
            tp_size=spec.tp_size,
            tp_lcm_size=spec.tp_lcm_size,
            pages=[0],
            sglang_version=spec.sglang_version,
            mooncake=self.store is not None,
        )
        return json_data(report.result())

    def trace(
        self, kind: str, tokens: list[int], extra_key, cache_salt, *, flush: bool = False, observe: bool = False
    ) -> dict:
        """Trace the write or read path of a prompt on this instance (same shape as embedded runs);
        `observe`: the read path looked at without changing the cache (trace/observe.py)."""
        from hicache_ops.commands.trace.observe import observe_read, observe_write
        from hicache_ops.commands.trace.run import TraceRun, diagnosis_causes
        from hicache_ops.commands.trace.steps import trace_read, trace_write

        if flush:
            self.running_cache.flush()
        run = TraceRun(kind, None, scenario={"serve": self.describe(), "flushed": flush, "read_only": observe})
        if kind == "write":
            write = observe_write if observe else trace_write
            run.steps = write(self.running_cache, tokens, extra_key=extra_key, cache_salt=cache_salt)
        else:
            metrics = self.started.get("metrics_address")
            diagnose = (
                (lambda: diagnosis_causes(tokens, self.spec, metrics, extra_key, cache_salt)) if metrics else None
            )
            read = observe_read if observe else trace_read
            run.steps = read(self.running_cache, tokens, extra_key=extra_key, cache_salt=cache_salt, diagnose=diagnose)
        from hicache_ops.results import json_data

        return json_data(run.result())

    def metrics_text(self) -> str:
        from hicache_ops.server.metrics import render_metrics

        return render_metrics(self.stats(), self.sglang_metrics())

    def sglang_metrics(self) -> dict:
        """What SGLang's collectors would report for this serve (server/metrics.py)."""
        return {
            "api": self.api_counters.snapshot(),
            "page_size": self.spec.page_size,
            "model_name": self.spec.model_name,
            "sglang_version": self.spec.sglang_version,
            "tp_size": self.spec.tp_size,
        }
