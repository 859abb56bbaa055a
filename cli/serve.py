"""`hicache serve`: the embedded tiered cache (L1/L2/L3 with a Mooncake master) behind an HTTP API."""

from __future__ import annotations

import signal
import socket
from typing import Annotated

import typer
from rich.panel import Panel
from rich.table import Table

from hicache_ops.errors import InputError

from .options import ModelNameOption, PageSizeOption, SglangVersionOption
from .output import native_stderr_to_file, reporting, stderr


class _StopRequested(Exception):
    pass


def _stop_requested(signum, frame) -> None:
    raise _StopRequested()


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}.", hint="Pick another --port.") from None


def _panel(info: dict, url: str) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    g = info["geometry"]
    shape = (
        f"MLA {g['layers']} layers, latent {g['kv_cache_dim']}"
        if g["attention"] == "mla"
        else f"MHA {g['layers']} layers, {g['kv_heads']} KV heads x {g['head_dim']}"
    )
    rows = [
        ("API", url),
        ("model", f"{info['model_name']}  ({g.get('name') or 'custom'}: {shape}, {g['dtype']})"),
        ("ranks", f"tp {info['tp_size']} on {', '.join(info['rank_devices'])}"),
        ("L1 device", f"{info['device_pages']} pages x {info['page_size']} tokens per rank"),
        ("L2 host", f"{info['host_pages']} pages, layout {info['host_layout']}, {info['bytes_per_page_per_rank']} B/page/rank"),
        ("policies", f"write {info['write_policy']}, prefetch {info['stop_policy']} (threshold {info['prefetch_threshold']})"),
        ("keys", f"SGLang {info['sglang_version']}, prefix {info['key_prefix'] or '(none)'}"),
    ]
    if info["l3"] == "none":
        rows.append(("L3", "none"))
    else:
        where = "embedded master" if info["l3"] == "embedded" else "existing master"
        rows.append(("L3", f"{where} rpc {info['master_rpc_address']}, http {info['master_metrics_address']}"))
        if info["master_pid"]:
            rows.append(("master", f"pid {info['master_pid']}, log {info['master_log']}"))
        rows.append(("segment", f"{info['segment']} (local_hostname from {info['local_hostname_source']})"))
        rows.append(("client log", info["client_log"]))
    for name, value in rows:
        table.add_row(name, value)
    return Panel(table, title="hicache serve", subtitle="Ctrl-C stops everything it started", expand=False)


def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 18080,
    preset: Annotated[str, typer.Option("--preset", help="Model geometry preset (see `hicache inspect layout`).")] = "tiny",
    dtype: Annotated[str | None, typer.Option("--dtype", help="Override the preset's KV dtype.", show_default=False)] = None,
    page_size: PageSizeOption = 16,
    device_tokens: Annotated[int, typer.Option("--device-tokens", help="L1 pool tokens per rank.")] = 4096,
    hicache_ratio: Annotated[float, typer.Option("--hicache-ratio", help="L2 size as a multiple of L1.")] = 2.0,
    hicache_size: Annotated[float, typer.Option("--hicache-size", help="L2 size in GB per rank (overrides the ratio).")] = 0,
    hicache_mem_layout: Annotated[str, typer.Option("--hicache-mem-layout", help="Host-pool layout.")] = "page_first",
    hicache_io_backend: Annotated[str, typer.Option("--hicache-io-backend", help="kernel or direct.")] = "kernel",
    hicache_write_policy: Annotated[
        str, typer.Option("--hicache-write-policy", help="write_through, write_through_selective or write_back.")
    ] = "write_through",
    hicache_storage_prefetch_policy: Annotated[
        str, typer.Option("--hicache-storage-prefetch-policy", help="best_effort, wait_complete or timeout.")
    ] = "best_effort",
    prefetch_threshold: Annotated[int, typer.Option("--prefetch-threshold", help="Extra-config prefetch_threshold (tokens).")] = 256,
    model_name: ModelNameOption = "hicache/tiny",
    extra_backend_tag: Annotated[
        str | None, typer.Option("--extra-backend-tag", help="Mooncake extra_backend_tag.", show_default=False)
    ] = None,
    tp_size: Annotated[int, typer.Option("--tp-size", help="Tensor-parallel ranks.")] = 1,
    sglang_version: SglangVersionOption = None,
    l3: Annotated[
        str, typer.Option("--l3", help="embedded | none | mooncake://HOST:RPC_PORT?metrics=PORT")
    ] = "embedded",
    segment_mb: Annotated[int, typer.Option("--segment-mb", help="Mooncake segment this process mounts (MiB).")] = 256,
    device: Annotated[str, typer.Option("--device", help="auto (GPUs when there are tp-size), cpu, or cuda.")] = "auto",
    log_dir: Annotated[str | None, typer.Option("--log-dir", help="Folder for the master's log.", show_default=False)] = None,
    inject_l3_latency_ms: Annotated[
        float, typer.Option("--inject-l3-latency-ms", help="Fault injection: simulated extra ms per L3 page read (stop-policy drills).")
    ] = 0.0,
) -> None:
    """Run the embedded tiered cache (L1/L2/L3, Mooncake master included) behind an HTTP API."""
    with reporting(False):
        from hicache_ops.engine.builder import EngineSpec
        from hicache_ops.sglang.geometry import preset as load_preset
        from hicache_ops.server.runtime import L3Target
        from hicache_ops.sglang.versions import default_version, validate_version

        geometry = load_preset(preset)
        if dtype is not None:
            geometry = geometry.with_dtype(dtype)
        if not 0 < port < 65536:
            raise InputError(f"--port {port} is not a TCP port (1-65535).")
        if segment_mb <= 0:
            raise InputError(f"--segment-mb {segment_mb} must be > 0.")
        if inject_l3_latency_ms < 0:
            raise InputError(f"--inject-l3-latency-ms {inject_l3_latency_ms} must be >= 0.")
        spec = EngineSpec(
            geometry=geometry,
            page_size=page_size,
            device_tokens=device_tokens,
            hicache_ratio=hicache_ratio,
            hicache_size_gb=hicache_size,
            layout=hicache_mem_layout,
            io_backend=hicache_io_backend,
            write_policy=hicache_write_policy,
            stop_policy=hicache_storage_prefetch_policy,
            prefetch_threshold=prefetch_threshold,
            sglang_version=validate_version(sglang_version or default_version()),
            model_name=model_name,
            extra_backend_tag=extra_backend_tag,
            tp_size=tp_size,
            torch_device="auto" if device == "auto" else device,
        )
        spec.cache_config(spec.host_layout(mooncake=l3 != "none"))  # validate before starting anything
        target = L3Target.parse(l3)
        _check_port_free(host, port)
        if host not in ("127.0.0.1", "localhost", "::1"):
            stderr.print(f"[yellow]warning:[/] binding {host}: the API has no authentication.", highlight=False)

        with native_stderr_to_file(log_dir, restore=False) as native_log:
            _run(spec, target, segment_mb, log_dir, host, port, native_log, inject_l3_latency_ms / 1e3)


def _run(spec, target, segment_mb: int, log_dir, host: str, port: int, native_log: str, l3_latency_s: float) -> None:
    from hicache_ops.server.runtime import Runtime

    from hicache_ops.mooncake.hostname import advertised_hostname

    local_hostname, source = advertised_hostname(spec.sglang_version, host)
    runtime = Runtime(spec, target, segment_bytes=segment_mb * 2**20, log_dir=log_dir, l3_latency_s=l3_latency_s,
                      local_hostname=local_hostname, local_hostname_source=source).start()
    try:
        import uvicorn

        from hicache_ops.server.app import create_app

        url = f"http://{host}:{port}"
        stderr.print(_panel({**runtime.describe(), "client_log": native_log}, url))
        server = uvicorn.Server(uvicorn.Config(create_app(runtime), host=host, port=port, log_level="warning"))
        # uvicorn shuts down on SIGINT/SIGTERM and then re-raises the signal to the handler
        # it found: make that ours, so the finally below still stops the master and store.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _stop_requested)
        try:
            server.run()
        except _StopRequested:
            pass
    finally:
        runtime.stop()
        stderr.print("hicache serve stopped; everything it started is down.", highlight=False)
