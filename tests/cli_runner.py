"""The one way tests run `hicache` in-process: hicache(["inspect", "keys", "--json"]) -> Result."""

from __future__ import annotations

from typer.testing import CliRunner

from hicache_ops.cli.main import app


def hicache(args: list[str], **kwargs):
    """Invoke the root app with `args` (typer's CliRunner; stdout and stderr kept apart)."""
    return CliRunner().invoke(app, [str(a) for a in args], **kwargs)
