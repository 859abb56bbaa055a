"""`hicache bench`: measurements printed as ratios taken side by side in one run."""

import typer

from . import keys

app = typer.Typer(help="Benchmarks that print side-by-side ratios measured in one run.", no_args_is_help=True)
app.command("keys")(keys.keys)
