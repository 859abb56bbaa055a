"""`hicache te`: the shared Mooncake Transfer Engine, each verb in its own module."""

import typer

from . import check

app = typer.Typer(help="The shared Mooncake Transfer Engine: will the HiCache store reuse it?", no_args_is_help=True)
app.command("check")(check.check)
