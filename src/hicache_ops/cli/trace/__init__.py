"""`hicache trace`: the write and read paths step by step, and recordings of live servers."""

import typer

from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples
from hicache_ops.cli.trace import path, show

app = typer.Typer(
    cls=HicacheGroup,
    help="Walk the write and read paths step by step; summarise tap recordings.",
    no_args_is_help=True,
    epilog=examples(
        "hicache trace write --tokens-file prompt.jsonl",
        "hicache trace read --tokens-file prompt.jsonl --inject missing-v",
    ),
)
app.command("write", cls=HicacheCommand, epilog=path.WRITE_EXAMPLES)(path.write)
app.command("read", cls=HicacheCommand, epilog=path.READ_EXAMPLES)(path.read)
app.command("show", cls=HicacheCommand, epilog=show.EXAMPLES)(show.show)
