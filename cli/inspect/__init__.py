"""`hicache inspect`: keys, layouts and (later) the store, each verb in its own module."""

import typer

from . import keys
from . import layout
from . import store

app = typer.Typer(help="Look at page keys, object keys and host-pool layouts.", no_args_is_help=True)
app.command("keys")(keys.keys)
app.command("layout")(layout.layout)
app.command("store")(store.store)
