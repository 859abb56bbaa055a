"""`hicache upgrade check --from A --to B`: what an SGLang upgrade changes for a deployment (docs/releases.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples
from hicache_ops.cli.common.options import (
    DEPLOYMENT,
    INPUT,
    CacheSaltOption,
    ExtraBackendTagOption,
    ExtraKeyOption,
    HicacheRatioOption,
    HostLayout,
    IoBackend,
    IoBackendOption,
    JsonOption,
    LayoutOption,
    MasterOption,
    MlaOption,
    ModelNameOption,
    PageSizeOption,
    PpSizeOption,
    TimeoutOption,
    TpSizeOption,
)
from hicache_ops.cli.common.output import emit, json_data, reporting, stdout

app = typer.Typer(
    cls=HicacheGroup,
    help="What an SGLang upgrade does to a deployment: key prefix, namespace seed, defaults, limits, rewrites.",
    no_args_is_help=True,
)

EXAMPLES = examples(
    "hicache upgrade check --from 0.5.16 --to 0.5.17 --model-name Qwen/Qwen3-8B",
    "hicache upgrade check --from 0.5.19 --to 0.5.21 --model-name Qwen/Qwen3-8B --master 10.0.0.5:9003 --json",
)

FromOption = Annotated[
    str,
    typer.Option(
        "--from", help="The SGLang release running now (0.5.14 and newer).", metavar="VERSION", rich_help_panel=INPUT
    ),
]
ToOption = Annotated[
    str,
    typer.Option("--to", help="The SGLang release after the upgrade.", metavar="VERSION", rich_help_panel=INPUT),
]
# The same option as serve's (one help text per shared option).
HostMemoryModeOption = Annotated[
    str,
    typer.Option(
        "--hicache-host-memory-mode",
        help="cache (host RAM is the L2 tier) or 0.5.23's buffer_only, which the engine cannot represent (refused).",
        metavar="MODE",
        rich_help_panel=DEPLOYMENT,
    ),
]


def _shown(value) -> str:
    if value in ("", None):
        return "(none)"
    if isinstance(value, dict):
        return f"{value['layout']}/{value['io_backend']}" + (
            f" ({'; '.join(value['notes'])})" if value["notes"] else ""
        )
    return str(value)


def _render(data: dict) -> None:
    a, b = data["from"], data["to"]
    stdout.print(f"SGLang {a['requested']} -> {b['requested']}  (rules {a['version']} -> {b['version']})")
    stdout.print(("[bold red]" if data["cold"] else "[green]") + data["verdict"] + "[/]")
    if not data["changes"]:
        stdout.print("no rule this toolkit knows changes between them.")
    for change in data["changes"]:
        stdout.print(
            f"- {change['rule']} (since {', '.join(change['since'])}; {change['sglang_file']}): "
            f"{_shown(change['from'])} -> {_shown(change['to'])}"
        )
    for note in data["notes"]:
        stdout.print(f"[yellow]note:[/] {note}")


@app.command("check", cls=HicacheCommand, epilog=EXAMPLES)
def check(
    ctx: typer.Context,
    source: FromOption,
    target: ToOption,
    model_name: ModelNameOption = None,
    extra_backend_tag: ExtraBackendTagOption = None,
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    page_size: PageSizeOption = 64,
    tp_size: TpSizeOption = 1,
    pp_size: PpSizeOption = 1,
    mla: MlaOption = False,
    layout: LayoutOption = HostLayout.page_first,
    io_backend: IoBackendOption = IoBackend.kernel,
    hicache_ratio: HicacheRatioOption = None,
    host_memory_mode: HostMemoryModeOption = "cache",
    master: MasterOption = None,
    timeout: TimeoutOption = 3.0,
    json_output: JsonOption = False,
) -> None:
    """List what changes between two SGLang releases for this deployment: object key prefix (with
    --master, the objects under the old prefix that will never be read again), namespace seed,
    prefetch limit / budget / retry rule, defaults and start-up rewrites."""
    with reporting(json_output):
        from hicache_ops.cli.common.deployment import deployment_settings
        from hicache_ops.commands.upgrade import UpgradeDeployment, check_upgrade

        dep = UpgradeDeployment.of(deployment_settings(ctx), extra_key=extra_key, cache_salt=cache_salt)
        report = check_upgrade(source, target, dep, master=master, timeout=timeout)
        emit(report.result(), json_output, lambda result: _render(json_data(result)))
