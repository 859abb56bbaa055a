"""How `--help` reads: examples in the epilog, metavars that name what is expected.

Typer labels every value with its Python type (`<str>`, `<int>`, `<bool>` even on flags) and
writes required arguments as `{NAME}`. These classes keep Typer's layout but show flags bare,
values as a word (an explicit metavar wins), and arguments as plain `NAME` / `[NAME]`.
"""

from __future__ import annotations

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

# Shown for a value whose option declares no metavar of its own.
_FALLBACK_METAVAR = {int: "N", float: "NUM", str: "TEXT"}


def examples(*commands: str) -> str:
    """An epilog listing the commands an on-call engineer runs first (plain text: no markup)."""
    return "Examples\n\n" + "\n\n".join(f"  {command}" for command in commands)


def _no_type_label(ctx: typer.Context) -> None:
    return None


def _label_values(params: list) -> list:
    for param in params:
        if isinstance(param, TyperArgument):
            # An argument's name (its metavar) already says what it is; drop the `<str>` column.
            param.display_type_rich = _no_type_label
            continue
        if param.metavar is not None:
            continue
        if param.is_flag:
            param.metavar = ""
            continue
        annotation = param.type_descriptor.annotation
        element = annotation.__args__[0] if getattr(annotation, "__origin__", None) is list else annotation
        if element in _FALLBACK_METAVAR:
            param.metavar = _FALLBACK_METAVAR[element]
    return params


class HicacheCommand(TyperCommand):
    def get_params(self, ctx: typer.Context) -> list:
        return _label_values(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.display_name_raw + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class HicacheGroup(TyperGroup):
    def get_params(self, ctx: typer.Context) -> list:
        return _label_values(super().get_params(ctx))
