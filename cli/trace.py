"""`hicache trace`: the write and read paths step by step, and recordings of live servers."""

import typer

from . import trace_path
from . import trace_show

app = typer.Typer(help="Walk the write and read paths step by step; summarise tap recordings.", no_args_is_help=True)
app.command("write")(trace_path.write)
app.command("read")(trace_path.read)
app.command("show")(trace_show.show)
