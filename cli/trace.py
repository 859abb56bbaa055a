"""`hicache trace`: the write and read paths step by step, and recordings of live servers."""

import typer

app = typer.Typer(help="Walk the write and read paths step by step; summarise tap recordings.", no_args_is_help=True)
