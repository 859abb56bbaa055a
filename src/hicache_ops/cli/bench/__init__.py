"""`hicache bench`: measurements printed as ratios taken side by side in one run."""

import typer

from hicache_ops.cli.bench import kernels, keys, multiturn, replay, store
from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples

app = typer.Typer(
    cls=HicacheGroup,
    help="Benchmarks that print side-by-side ratios measured in one run.",
    no_args_is_help=True,
    epilog=examples("hicache bench keys --tokens 65536", "hicache bench replay trace.jsonl --l1-tokens 3000000"),
)
app.command("keys", cls=HicacheCommand, epilog=keys.EXAMPLES)(keys.keys)
app.command("store", cls=HicacheCommand, epilog=store.EXAMPLES)(store.store)
app.command("kernels", cls=HicacheCommand, epilog=kernels.EXAMPLES)(kernels.kernels)
app.command("multiturn", cls=HicacheCommand, epilog=multiturn.EXAMPLES)(multiturn.multiturn)
app.command("replay", cls=HicacheCommand, epilog=replay.EXAMPLES)(replay.replay)
