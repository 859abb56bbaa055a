"""`hicache te check`: will SGLang's Mooncake store reuse the shared Transfer Engine? (registered on the `te` group)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    DEPLOYMENT,
    INPUT,
    ExtraConfigOption,
    JsonOption,
    MooncakeConfigOption,
    ServerArgsOption,
    SglangVersionOption,
    TimeoutOption,
    TpRankOption,
)
from hicache_ops.cli.common.output import emit, native_stderr_to_file, print_wrapped, reporting, stderr, stdout
from hicache_ops.cli.common.sglang_url import sglang_url_option

if TYPE_CHECKING:
    from hicache_ops.commands.te.report import TeCheckResult

EXAMPLES = examples(
    "hicache te check --server-args '--enable-hierarchical-cache --hicache-storage-backend mooncake' "
    "--env MOONCAKE_MASTER=10.0.0.5:50051 --env MOONCAKE_DEVICE=mlx5_0",
    "hicache te check --server-args @launch-flags.txt --config mooncake.json --json",
    "hicache te check --live --tcp",
)
# --master-rpc as everywhere, but not read from $MOONCAKE_MASTER: here that variable belongs to the
# deployment being evaluated (--env), and --live starts its own master unless one is named.
LiveMasterRpcOption = Annotated[
    str | None,
    typer.Option(
        "--master-rpc",
        help="The Mooncake master's RPC address, HOST:RPC_PORT.",
        metavar="HOST:PORT",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]


def _cell(value: object) -> str:
    import json

    if value is None:
        return "None"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    return str(value)


def _render(result: TeCheckResult) -> None:
    """The verdict first (one line: the answer), then the conditions, ranks, fix and live test."""
    from rich.table import Table

    wrapped = print_wrapped

    if result.eligible:
        wrapped(
            f"[bold green]verdict: reused[/] - every rank's store passes the shared engine to Mooncake "
            f"(SGLang {result.sglang_version})."
        )
    else:
        wrapped(
            f"[bold red]verdict: not reused[/] - each rank's store starts a Transfer Engine of its own "
            f"(SGLang {result.sglang_version})."
        )
    stdout.print("[bold]Shared Transfer Engine reuse[/]")
    for cond in result.conditions:
        mark = "[green]ok[/]" if cond.ok else "[red]NO[/]"
        wrapped(f"{mark}  [bold]{cond.name}[/]  actual {_cell(cond.actual)}  expected {_cell(cond.expected)}", 2)
        wrapped(f"[dim]why:[/] {cond.why}", 8)
    ranks = result.ranks
    if len(ranks) > 1 and len({(_cell(r.store_device_name), _cell(r.engine_ib_device)) for r in ranks}) > 1:
        per = Table(title="per rank", show_lines=False)
        for column in ("rank", "store tp rank", "GPU", "store device_name", "engine ib device", "reused"):
            per.add_column(column, overflow="fold")
        for r in ranks:
            per.add_row(
                r.rank,
                str(r.store_tp_rank),
                str(r.gpu_id),
                _cell(r.store_device_name),
                _cell(r.engine_ib_device),
                "[green]yes[/]" if r.eligible else "[red]no[/]",
            )
        stdout.print(per)
    fix = result.fix
    if fix:
        stdout.print(f"[bold]fix[/] ({'verified' if fix.verified else 'NOT verified'}):")
        for change in fix.changes:
            wrapped(f"- {change.text}", 2)
        if fix.alternative:
            wrapped(f"[dim]or:[/] {fix.alternative}", 2)
        wrapped(f"[bold]does it matter?[/] {fix.matters}")
    live = result.live
    if live:
        state = "[green]transfer ok[/]" if live["ok"] else "[red]transfer FAILED[/]"
        wrapped(
            f"[bold]live[/] {state}: master {live['master']}{' (embedded)' if live['embedded_master'] else ''}, "
            f"engine {live['engine'].get('session')} protocol {live['engine']['protocol']!r}, "
            f"store hostname {live['store'].get('hostname')} "
            f"({'the engine passed in' if live.get('uses_shared_engine') else 'NOT the engine passed in'}), "
            f"{live['seconds']} s",
        )
        for t in live.get("transfers", []):
            wrapped(f"{'ok ' if t['ok'] else 'BAD'} {t['direction']}: {t['bytes']} bytes in {t['seconds']} s", 2)
        if live.get("error"):
            wrapped(f"[red]{live['error']}[/]", 2)
        for note in live.get("notes", []):
            print_wrapped(f"[yellow]note:[/] {note}", console=stderr)
    for warning in result.warnings:
        print_wrapped(f"[yellow]warning:[/] {warning}", console=stderr)
    for note in result.notes:
        print_wrapped(f"[dim]note:[/] {note}", console=stderr)


@sglang_url_option("sglang_version", "server_args")
def check(
    server_args: ServerArgsOption = None,
    extra_config: ExtraConfigOption = None,
    config: MooncakeConfigOption = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            help="NAME=VALUE of the deployment's environment, over this shell's (repeatable).",
            metavar="NAME=VALUE",
            show_default=False,
            rich_help_panel=DEPLOYMENT,
        ),
    ] = None,
    sglang_version: SglangVersionOption = None,
    tp_rank: TpRankOption = None,
    live: Annotated[
        bool,
        typer.Option(
            "--live", help="Also prove a transfer through a store client built with engine=te.get_engine() on loopback."
        ),
    ] = False,
    master_rpc: LiveMasterRpcOption = None,
    tcp: Annotated[
        bool, typer.Option("--tcp", help="With --live: run engine and store over TCP (for machines without RDMA).")
    ] = False,
    timeout: TimeoutOption = 30.0,
    json_output: JsonOption = False,
) -> None:
    """Evaluate SGLang's shared Transfer Engine rule: exit 0 reused, 1 not (or --live failed), 2 input, 3 unreachable.

    --server-args defaults to --enable-hierarchical-cache --hicache-storage-backend mooncake;
    --extra-config applies when the flags carry none. With --live, --master-rpc names a running
    master (default: an embedded one) and --timeout bounds the whole live test.
    """
    with reporting(json_output):
        from hicache_ops.commands.te.live import live_check
        from hicache_ops.commands.te.report import check_reuse
        from hicache_ops.errors import InputError
        from hicache_ops.sglang.launch import parse_env_overrides
        from hicache_ops.sglang.versions import default_version, validate_version

        if not live and (master_rpc is not None or tcp):
            raise InputError("--master-rpc and --tcp only apply with --live.", hint="Add --live, or drop them.")
        if timeout <= 0:
            raise InputError(f"--timeout {timeout:g} must be positive.")
        version = validate_version(sglang_version or default_version())
        overrides = parse_env_overrides(env)

        def evaluate(overrides):
            return check_reuse(
                version,
                server_args=server_args,
                extra_config=extra_config,
                config_file=config,
                env_overrides=overrides,
                tp_rank=tp_rank,
            )

        from contextlib import ExitStack

        from hicache_ops.mooncake.config import NoStoreConfig

        with ExitStack() as stack:
            stand_in = None
            try:
                report = evaluate(overrides)
            except NoStoreConfig:
                if not live:
                    raise
                # A deployment that names no master: the live test's master stands for MOONCAKE_MASTER.
                if master_rpc is None:
                    from hicache_ops.mooncake.master import EmbeddedMaster

                    master = stack.enter_context(EmbeddedMaster(ready_timeout=min(20.0, timeout)))
                    stand_in = master.rpc_address
                else:
                    from hicache_ops.mooncake.net import format_host_port, parse_host_port

                    stand_in = format_host_port(*parse_host_port(master_rpc, what="--master-rpc"))
                overrides = {**overrides, "MOONCAKE_MASTER": stand_in}
                report = evaluate(overrides)
                report.notes.insert(
                    0,
                    f"no Mooncake config given: the live test's master {stand_in} stands for MOONCAKE_MASTER.",
                )
            if live:
                import os

                run_env = dict(os.environ)
                run_env.update(overrides)
                # The peer client in this process logs through glog to fd 2: keep it out of the output.
                with native_stderr_to_file(None, "te_live_mooncake.log"):
                    report.live = live_check(
                        report,
                        master=master_rpc if master_rpc is not None else stand_in,
                        master_started_here=master_rpc is None and stand_in is not None,
                        tcp=tcp,
                        timeout=timeout,
                        env=run_env,
                        tp_rank=tp_rank,
                    )
        emit(report.result(), json_output, _render)
    if not report.eligible or (report.live is not None and not report.live["ok"]):
        raise typer.Exit(1)
