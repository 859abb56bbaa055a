"""The base of every command's result model: what `--json` prints is the model's fields, in order.

A command's library code returns one `Result` (a pydantic model declared next to it); the CLI prints
it with `hicache_ops.cli.common.output.emit`, as JSON (`json_data`) or through the command's
renderer. Each field's `description` is its entry in the generated reference (docs/cli/, written by
scripts/gen_cli_docs.py), so a field documents itself where it is declared.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Result(BaseModel):
    """A command's result: plain JSON fields, no field left undeclared."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=False)
