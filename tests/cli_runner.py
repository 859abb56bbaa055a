"""The one way tests run `hicache` in-process: hicache(["inspect", "keys", "--json"]) -> Result."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from hicache_ops.cli.main import app


def hicache(args: list[str], **kwargs):
    """Invoke the root app with `args` (typer's CliRunner; stdout and stderr kept apart)."""
    return CliRunner().invoke(app, [str(a) for a in args], **kwargs)


def leaf_commands() -> dict[str, object]:
    """ "inspect keys" -> its command object, for every command that runs (groups excluded),
    found through Typer's own introspection."""
    found: dict[str, object] = {}

    def walk(command, path: list[str]) -> None:
        children = getattr(command, "commands", None)
        if children:
            for name, child in children.items():
                walk(child, path + [name])
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), [])
    return found
