"""The base of every command's result model: what `--json` prints is the model's fields, in order.

A command's library code returns one `Result` (a pydantic model declared next to it); the CLI prints
it with `hicache_ops.cli.common.output.emit`, as JSON (`json_data`) or through the command's
renderer. Each field's `description` is its entry in the generated reference (docs/cli/, written by
scripts/gen_cli_docs.py), so a field documents itself where it is declared.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, model_serializer


class OnlyWith(NamedTuple):
    """A group of fields present only with an option (or in one case of the result): all left out of
    the JSON while `given` (a field, `fields[0]` by default) is None or False, all there (null or
    not) once it is set, so the JSON without the option keeps its shape."""

    option: str  # what adds them, as the reference says it: "--master", "a split-heads layout"
    fields: tuple[str, ...]
    given: str | None = None  # the field that says the option was given; may be excluded from the JSON


class Result(BaseModel):
    """A command's result (or a part of one): plain JSON fields, none left undeclared."""

    model_config = ConfigDict(extra="forbid")

    # Fields left out of the JSON while they are None: those an option adds (--sglang-url's
    # server_disagreements), so the JSON without that option keeps its shape.
    omit_if_none: ClassVar[tuple[str, ...]] = ()
    # Groups of fields an option adds, left out together without it (inspect keys' live fields,
    # present only with --master).
    only_with: ClassVar[tuple[OnlyWith, ...]] = ()

    @classmethod
    def optional_fields(cls) -> dict[str, str | None]:
        """The fields an option adds, absent from the JSON without it: field -> that option (None
        where the model does not name it)."""
        named = {field: group.option for group in cls.only_with for field in group.fields}
        return {name: None for name in cls.omit_if_none if name not in named} | named

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Any) -> Any:
        data = handler(self)
        for name in self.omit_if_none:
            if data.get(name) is None:
                data.pop(name, None)
        for group in self.only_with:
            given = getattr(self, group.given or group.fields[0])
            if given is None or given is False:
                for field in group.fields:
                    data.pop(field, None)
        return data


def json_data(value: Any) -> Any:
    """The one JSON rendering of a result: a model gives its fields in declaration order (its own
    omissions applied), a dataclass value object its fields in order, containers their items; a
    plain value passes through. What `--json` prints and what the serve's endpoints answer."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", fallback=_plain)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_data(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr}
    if isinstance(value, dict):
        return {k: json_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_data(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """A value pydantic has no JSON form for, inside an `Any` field: a numpy scalar or array becomes
    its Python value (`item()`, `tolist()`), anything else its text (what `json.dumps(default=str)`
    printed before)."""
    for name in ("item", "tolist"):
        method = getattr(value, name, None)
        if callable(method) and type(value).__module__ == "numpy":
            return method()
    return str(value)
