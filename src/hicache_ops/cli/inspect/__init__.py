"""`hicache inspect`: keys, layouts and the store, each verb in its own module."""

import typer

from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples
from hicache_ops.cli.inspect import keys, layout, store

app = typer.Typer(
    cls=HicacheGroup,
    help="Look at page keys, object keys and host-pool layouts.",
    no_args_is_help=True,
    epilog=examples(
        "hicache inspect keys --tokens 1,2,3,4 --page-size 2", "hicache inspect layout --preset llama-3.1-8b"
    ),
)
app.command("keys", cls=HicacheCommand, epilog=keys.EXAMPLES)(keys.keys)
app.command("layout", cls=HicacheCommand, epilog=layout.EXAMPLES)(layout.layout)
app.command("store", cls=HicacheCommand, epilog=store.EXAMPLES)(store.store)
