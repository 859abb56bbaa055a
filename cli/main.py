"""The root `hicache` app: composes the command groups and formats unexpected failures."""

from __future__ import annotations

import os
import sys

import typer

from . import bench, inspect, lab, playbook, prefetch, serve, trace, warm
from . import tap as tap_command
from . import te as te_command
from .output import DEBUG_ENV, stderr

app = typer.Typer(
    name="hicache",
    help="Make every step between SGLang HiCache and its Mooncake L3 tier visible and testable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(inspect.app, name="inspect")
app.add_typer(bench.app, name="bench")
app.command("serve")(serve.serve)
app.add_typer(trace.app, name="trace")
app.command("tap")(tap_command.tap)
app.command("warm")(warm.warm)
app.command("prefetch")(prefetch.prefetch)
app.add_typer(playbook.app, name="playbook")
app.add_typer(te_command.app, name="te")
app.add_typer(lab.app, name="lab")


def run() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug: one line, the traceback only on request
        if os.environ.get(DEBUG_ENV):
            raise
        stderr.print(
            f"[bold red]internal error:[/] {type(exc).__name__}: {exc}\n"
            f"[dim]hint:[/] set {DEBUG_ENV}=1 for the traceback and report it.",
            highlight=False,
        )
        sys.exit(1)
