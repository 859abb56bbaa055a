"""`hicache bench`: measurements printed as ratios taken side by side in one run."""

import typer

from . import kernels, keys, multiturn, replay
from . import store

app = typer.Typer(help="Benchmarks that print side-by-side ratios measured in one run.", no_args_is_help=True)
app.command("keys")(keys.keys)
app.command("store")(store.store)
app.command("kernels")(kernels.kernels)
app.command("multiturn")(multiturn.multiturn)
app.command("replay")(replay.replay)
