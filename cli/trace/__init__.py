"""`hicache trace`: the write and read paths step by step, and recordings of live servers."""

import typer

from . import path, show

app = typer.Typer(help="Walk the write and read paths step by step; summarise tap recordings.", no_args_is_help=True)
app.command("write")(path.write)
app.command("read")(path.read)
app.command("show")(show.show)
