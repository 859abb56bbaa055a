"""`hicache serve`: the embedded tiered cache (L1/L2/L3 with a Mooncake master) behind an HTTP API."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
from typing import Annotated

import typer
from rich.panel import Panel
from rich.table import Table

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    DEPLOYMENT,
    OUTPUT,
    DcpSizeOption,
    Device,
    DeviceOption,
    DeviceTokensOption,
    DtypeOption,
    ExtraBackendTagOption,
    HicacheRatioOption,
    HicacheSizeOption,
    HostLayout,
    IoBackend,
    IoBackendOption,
    L3BandwidthOption,
    LayoutOption,
    ModelNameOption,
    PageSizeOption,
    PoolOption,
    PoolPresetOption,
    PrefetchThresholdOption,
    PresetOption,
    SglangVersionOption,
    StopPolicy,
    StopPolicyOption,
    TokenizerOption,
    TpSizeOption,
    WritePolicy,
    WritePolicyOption,
    l3_bandwidth_bytes_s,
)
from hicache_ops.cli.common.output import native_stderr_to_file, reporting, stderr
from hicache_ops.errors import InputError

EXAMPLES = examples(
    "hicache serve",
    "hicache serve --l3 'mooncake://10.0.0.5:50051?metrics=9003' --inject-l3-latency-ms 5",
    "hicache serve --tokenizer ./model",
)


class _StopRequested(Exception):
    pass


def _stop_requested(signum, frame) -> None:
    raise _StopRequested()


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
        (
            "ranks",
            f"tp {info['tp_size']} on {', '.join(info['rank_devices'])}"
            + (
                f", DCP {info['dcp_size']} (token i of a page on DCP rank i % {info['dcp_size']})"
                if info.get("dcp_size", 1) > 1
                else ""
            ),
        ),
        (
            "L1 device",
            f"{info['device_pages']} pages x {info.get('rank_page_size', info['page_size'])} tokens per rank",
        ),
        (
            "L2 host",
            f"{info['host_pages']} pages, layout {info['host_layout']}, {info['bytes_per_page_per_rank']} B/page/rank",
        ),
        (
            "policies",
            f"write {info['write_policy']}, prefetch {info['stop_policy']} (threshold {info['prefetch_threshold']})",
        ),
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
        if info["injected_l3_latency_s"]:
            # A drill setting: say it loudly, or slow L3 reads look like a real fault.
            latency_ms = info["injected_l3_latency_s"] * 1e3
            rows.append(("fault", f"[bold yellow]injected L3 latency: +{latency_ms:g} ms per page read[/]"))
        rows.append(("client log", info["client_log"]))
    for name, value in rows:
        table.add_row(name, value)
    return Panel(table, title="hicache serve", subtitle="Ctrl-C stops everything it started", expand=False)


def serve(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (loopback by default).", metavar="ADDRESS")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="HTTP port.", metavar="PORT")] = 18080,
    host_memory_mode: Annotated[
        str,
        typer.Option(
            "--hicache-host-memory-mode",
            help="cache (host RAM is the L2 tier) or 0.5.23's buffer_only, which the engine cannot represent "
            "(refused).",
            metavar="MODE",
            rich_help_panel=DEPLOYMENT,
        ),
    ] = "cache",
    l3: Annotated[
        str,
        typer.Option(
            "--l3",
            help="The L3 tier: embedded (a master of its own), none, or mooncake://HOST:RPC_PORT?metrics=PORT.",
            metavar="WHERE",
        ),
    ] = "embedded",
    segment_mb: Annotated[
        int, typer.Option("--segment-mb", help="Mooncake segment this process mounts (MiB).", metavar="MIB")
    ] = 256,
    device: DeviceOption = Device.auto,
    keep_logs: Annotated[
        bool,
        typer.Option(
            "--keep-logs",
            help="Without --log-dir: keep the temporary log folder (its path is printed).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    inject_l3_latency_ms: Annotated[
        float,
        typer.Option(
            "--inject-l3-latency-ms",
            help="Fault injection: simulated extra ms per L3 page read (stop-policy drills).",
            metavar="MS",
        ),
    ] = 0.0,
    l3_bandwidth_gbps: L3BandwidthOption = None,
    tokenizer: TokenizerOption = None,
    preset: PresetOption = "tiny",
    dtype: DtypeOption = None,
    page_size: PageSizeOption = 16,
    device_tokens: DeviceTokensOption = 4096,
    hicache_ratio: HicacheRatioOption = 2.0,
    hicache_size: HicacheSizeOption = 0,
    layout: LayoutOption = HostLayout.page_first,
    io_backend: IoBackendOption = IoBackend.kernel,
    write_policy: WritePolicyOption = WritePolicy.write_through,
    prefetch_policy: StopPolicyOption = StopPolicy.timeout,
    prefetch_threshold: PrefetchThresholdOption = 256,
    model_name: ModelNameOption = "hicache/tiny",
    extra_backend_tag: ExtraBackendTagOption = None,
    tp_size: TpSizeOption = 1,
    dcp_size: DcpSizeOption = 1,
    sglang_version: SglangVersionOption = None,
    pool: PoolOption = None,
    pool_preset: PoolPresetOption = None,
    log_dir: Annotated[
        str | None,
        typer.Option(
            "--log-dir",
            help="Folder for the master's and the client's logs (kept).",
            metavar="DIR",
            show_default=False,
            rich_help_panel=OUTPUT,
        ),
    ] = None,
) -> None:
    """Run the embedded tiered cache (L1/L2/L3, Mooncake master included) behind an HTTP API.

    Policy defaults are SGLang's, the same in 0.5.14 and 0.5.23: write policy write_through, prefetch
    stop policy timeout, prefetch threshold 256 tokens; the timeout budget and prefetch limits follow
    --sglang-version (docs/controller.md).
    """
    with reporting(False):
        from hicache_ops.engine.builder import EngineSpec
        from hicache_ops.server.runtime import L3Target, check_device, check_listen, check_log_dir, check_segment
        from hicache_ops.sglang.geometry import DEFAULT_PRESET
        from hicache_ops.sglang.geometry import preset as load_preset

        geometry = load_preset(preset or DEFAULT_PRESET)
        if dtype is not None:
            geometry = geometry.with_dtype(dtype)
        check_segment(segment_mb * 2**20)
        check_log_dir(log_dir)
        if keep_logs and log_dir is not None:
            raise InputError("--keep-logs applies without --log-dir; a --log-dir is always kept.")
        if inject_l3_latency_ms < 0:
            raise InputError(f"--inject-l3-latency-ms {inject_l3_latency_ms} must be >= 0.")
        from hicache_ops.cli.common.deployment import deployment_settings, side_pools

        settings = deployment_settings(ctx, mla=geometry.mla)
        spec = EngineSpec.of(
            geometry,
            settings,
            side_pools=side_pools(ctx, settings),
            torch_device=check_device(device.value, tp_size),
            l3_bandwidth_bytes_s=l3_bandwidth_bytes_s(l3_bandwidth_gbps),
        ).validate(mooncake=l3 != "none")  # pools that cannot fit are refused before a master starts
        target = L3Target.parse(l3)
        if tokenizer is not None:
            from hicache_ops.server.sglang_api import load_tokenizer

            load_tokenizer(tokenizer)  # refused before anything starts
        check_listen(host, port)
        if host not in ("127.0.0.1", "localhost", "::1"):
            stderr.print(f"[yellow]warning:[/] binding {host}: the API has no authentication.")

        # Without --log-dir the logs go to a temporary folder, removed at a clean stop unless
        # --keep-logs; a serve that fails keeps it and prints its path.
        folder = log_dir or tempfile.mkdtemp(prefix="hicache-serve-")
        remove = log_dir is None and not keep_logs
        failed = False
        try:
            with native_stderr_to_file(folder, restore=False) as native_log:
                _run(
                    spec,
                    target,
                    segment_mb,
                    folder,
                    host,
                    port,
                    native_log,
                    inject_l3_latency_ms / 1e3,
                    remove,
                    tokenizer,
                )
        except Exception:  # an interrupt is not a failure the logs would explain
            failed = True
            raise
        finally:
            # A serve that failed before Mooncake logged anything has nothing to keep.
            said_nothing = all(entry.stat().st_size == 0 for entry in os.scandir(folder))
            if remove and (not failed or said_nothing):
                shutil.rmtree(folder, ignore_errors=True)
            elif log_dir is None:
                stderr.print(f"logs kept in {folder}")


def _run(
    spec,
    target,
    segment_mb: int,
    log_dir,
    host: str,
    port: int,
    native_log: str,
    l3_latency_s: float,
    remove_logs: bool,
    tokenizer: str | None = None,
) -> None:
    from hicache_ops.mooncake.hostname import advertised_hostname
    from hicache_ops.server.runtime import Runtime

    # The L3 watch logs the tier going down or up again; sys.stderr is the terminal here.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s hicache serve: %(message)s", "%H:%M:%S"))
    logging.getLogger("hicache").addHandler(handler)
    logging.getLogger("hicache").setLevel(logging.INFO)

    local_hostname, source = advertised_hostname(spec.sglang_version, host)
    runtime = Runtime(
        spec,
        target,
        segment_bytes=segment_mb * 2**20,
        log_dir=log_dir,
        l3_latency_s=l3_latency_s,
        local_hostname=local_hostname,
        local_hostname_source=source,
        tokenizer_path=tokenizer,
    ).start()
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
        closed = runtime.stop()
        stderr.print("hicache serve stopped; everything it started is down.")
    if not closed:
        # L3 was down: Mooncake's client close would block ~15 s for a master that is gone, and
        # its segment went with the master; end without running its destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        if remove_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        os._exit(0)
