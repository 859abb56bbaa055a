"""How `--help` reads: examples in the epilog, metavars that name what is expected.

Typer labels every value with its Python type (`<str>`, `<int>`, `<bool>` even on flags) and
writes required arguments as `{NAME}`. These classes keep Typer's layout but show flags bare,
values as a word (an explicit metavar wins), and arguments as plain `NAME` / `[NAME]`.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions
from rich.table import Table
from rich.text import Text
from typer import rich_utils
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:
    # The Click that Typer bundles, whose Context, Parameter and HelpFormatter Typer's methods take:
    # Typer exports no public name for the last two, so it is named for the annotations only.
    from typer import _click

# Shown for a value whose option declares no metavar of its own.
_FALLBACK_METAVAR = {int: "N", float: "NUM", str: "TEXT"}


# An example line never gets wider than this, so an 80-column terminal (the help's panel takes
# two columns each side) never wraps it inside a command: longer commands continue with " \\".
EXAMPLE_WIDTH = 72


def wrap_command(command: str, width: int = EXAMPLE_WIDTH) -> list[str]:
    """`command` as shell lines of at most `width` columns, joined by backslash continuations, that
    paste as the one command. Breaks only between words, and keeps an option beside its value."""
    words = shlex.split(command)
    quoted = [word if shlex.quote(word) == word else shlex.quote(word) for word in words]
    # Units: "--flag value" stays together; a lone word is its own unit.
    units: list[str] = []
    i = 0
    while i < len(quoted):
        pair = i + 1 < len(quoted) and quoted[i].startswith("-") and not quoted[i + 1].startswith("-")
        if pair and len(quoted[i]) + len(quoted[i + 1]) + 7 <= width:
            units.append(f"{quoted[i]} {quoted[i + 1]}")
            i += 2
        else:
            units.append(quoted[i])
            i += 1
    lines: list[str] = []
    current = ""
    for unit in units:
        indent = "    " if lines else ""
        candidate = f"{current} {unit}" if current else f"{indent}{unit}"
        if current and len(candidate) + 2 > width:  # room for " \\"
            lines.append(current + " \\")
            current = f"    {unit}"
        else:
            current = candidate
    lines.append(current)
    return lines


def examples(*commands: str) -> str:
    """An epilog listing the commands an on-call engineer runs first (plain text: no markup); each
    pastes as written, long ones continued over lines with a backslash."""
    return "Examples\n\n" + "\n\n".join("\n".join(f"  {line}" for line in wrap_command(c)) for c in commands)


def example_commands(text: str) -> list[str]:
    """The commands of a help text's Examples section, continuation lines joined (for tests)."""
    _, found, after = text.partition("Examples")
    if not found:
        return []
    commands: list[str] = []
    pending = ""
    for raw in after.splitlines():
        line = raw.strip()
        if not line:
            continue
        if pending:
            pending += " " + line
        elif "hicache " in line:
            pending = line
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        commands.append(pending)
        pending = ""
    return commands


def _no_type_label(ctx: _click.Context) -> str | None:
    return None


def _label_values(params: list[_click.Parameter]) -> list[_click.Parameter]:
    for param in params:
        if isinstance(param, TyperArgument):
            # An argument's name (its metavar) already says what it is; drop the `<str>` column.
            # Typer makes the argument, so its method is replaced on that one instance.
            param.display_type_rich = _no_type_label  # type: ignore[method-assign]
            continue
        if not isinstance(param, TyperOption) or param.metavar is not None:
            continue
        if param.is_flag:
            param.metavar = ""
            continue
        annotation = param.type_descriptor.annotation
        element = annotation.__args__[0] if getattr(annotation, "__origin__", None) is list else annotation
        if element in _FALLBACK_METAVAR:
            param.metavar = _FALLBACK_METAVAR[element]
    return params


class _HelpTable(Table):
    """Typer's options and commands table, whose squeeze the help column alone takes: every other
    column (option names, aliases, metavar) keeps its full width and never wraps or cuts, and a help
    word wider than its column folds onto the next line instead of ending in '…'. Rich otherwise
    shrinks every column evenly, so at 80 columns `--hicache-storage-prefetch-policy` read
    `--hicache-storage-prefetch-p…`."""

    def _calculate_column_widths(self, console: Console, options: ConsoleOptions) -> list[int]:
        *names, last = self.columns
        for column in names:
            column.no_wrap = True
        last.overflow = "fold"
        for cell in last._cells:
            # An option's help is a Columns of Texts (help, default), laid out by a grid whose
            # columns cut by default: the Texts fold themselves.
            for item in getattr(cell, "renderables", [cell]):
                if isinstance(item, Text) and item.overflow is None:
                    item.overflow = "fold"
        return super()._calculate_column_widths(console, options)


@contextmanager
def _help_tables() -> Iterator[None]:
    # Typer builds its tables from the `Table` name of its rich_utils module; only while our help
    # renders is that name this class.
    original = rich_utils.Table
    rich_utils.Table = _HelpTable  # type: ignore[misc]  # mypy refuses any assignment to a class name
    try:
        yield
    finally:
        rich_utils.Table = original  # type: ignore[misc]  # (as above)


class HicacheCommand(TyperCommand):
    def invoke(self, ctx: _click.Context) -> Any:
        """Run the command with its flags (COMMAND_FLAGS) and its context's meta (COMMAND_META, what
        its options read) recorded for the output functions."""
        from hicache_ops.cli.common.output import COMMAND_FLAGS, COMMAND_META

        flags = {p.name: max(p.opts, key=len) for p in self.params if p.name and p.opts and p.opts[0].startswith("-")}
        tokens = COMMAND_FLAGS.set(flags), COMMAND_META.set(ctx.meta)
        try:
            return super().invoke(ctx)
        finally:
            COMMAND_FLAGS.reset(tokens[0])
            COMMAND_META.reset(tokens[1])

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        with _help_tables():
            super().format_help(ctx, formatter)

    def get_params(self, ctx: _click.Context) -> list[_click.Parameter]:
        return _label_values(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: _click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.display_name_raw + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class HicacheGroup(TyperGroup):
    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        with _help_tables():
            super().format_help(ctx, formatter)

    def get_params(self, ctx: _click.Context) -> list[_click.Parameter]:
        return _label_values(super().get_params(ctx))
