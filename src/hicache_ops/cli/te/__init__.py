"""`hicache te`: the shared Mooncake Transfer Engine, each verb in its own module."""

import typer

from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples
from hicache_ops.cli.te import check

app = typer.Typer(
    cls=HicacheGroup,
    help="The shared Mooncake Transfer Engine: will the HiCache store reuse it?",
    no_args_is_help=True,
    epilog=examples("hicache te check --env MOONCAKE_MASTER=10.0.0.5:50051", "hicache te check --live --tcp"),
)
app.command("check", cls=HicacheCommand, epilog=check.EXAMPLES)(check.check)
