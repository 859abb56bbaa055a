"""`hicache tap`: the SGLang flags that record every Mooncake storage call of a live server."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import ExtraConfigOption, JsonOption, PpSizeOption, TpSizeOption
from hicache_ops.cli.common.output import emit, reporting, stderr, stdout
from hicache_ops.commands.tap.plan import launch_plan
from hicache_ops.sglang.launch import load_extra_config

EXAMPLES = examples(
    "hicache tap --tp-size 2",
    "hicache tap --extra-config @extra.json --path /var/tmp/tap.jsonl",
)


def _render(plan: dict[str, Any]) -> None:
    stdout.print("[bold]Add to the SGLang launch command:[/]")
    # Plain, unwrapped text: the flags must copy-paste exactly.
    print(plan["command_line"], flush=True)
    rec = plan["recording"]
    if rec["per_rank"]:
        stdout.print(f"[bold]recording[/] one file per rank: {', '.join(rec['files'])}")
    else:
        stdout.print(f"[bold]recording[/] {rec['path']}")
    stdout.print(f"[bold]kept from your extra-config[/] {', '.join(plan['kept_keys']) or '(nothing given)'}")
    stdout.print(f"[bold]then[/] {plan['show']}")
    for note in plan["notes"]:
        stderr.print(f"[yellow]note:[/] {note}")


def tap(
    extra_config: ExtraConfigOption = None,
    path: Annotated[
        str | None,
        typer.Option(
            "--path",
            help="Recording file on the server host (default: $TMPDIR/hicache-tap.jsonl); "
            "several ranks add .tpN before .jsonl.",
            show_default=False,
        ),
    ] = None,
    tp_size: TpSizeOption = 1,
    pp_size: PpSizeOption = 1,
    no_objects: Annotated[
        bool,
        typer.Option("--no-objects", help="Record page keys only, not each Mooncake object key and code."),
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Print the SGLang flags that load the tap: SGLang's MooncakeStore with every call recorded.

    The keys of your --extra-config are kept next to the tap's; --tp-size and --pp-size name the
    per-rank recording files.
    """
    with reporting(json_output):
        plan = launch_plan(
            load_extra_config(extra_config, where="--extra-config"),
            path=path,
            tp_size=tp_size,
            pp_size=pp_size,
            objects=not no_objects,
        )
        emit(plan, json_output, _render)
