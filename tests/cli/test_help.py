"""Every command's --help: examples that parse, metavars that say what is expected, plain argument names."""

from __future__ import annotations

import re
import shlex

import pytest

from cli_runner import hicache, leaf_commands
from hicache_ops.cli.common.help import example_commands

COMMANDS = sorted(leaf_commands())
GROUPS = ["", "inspect", "bench", "trace", "playbook", "te", "lab"]
WIDE = {"COLUMNS": "240"}
TYPE_LABEL = re.compile(r"<(str|int|float|bool|list\[\w+\])>")


def help_text(path: str, columns: int = 240) -> str:
    result = hicache([*path.split(), "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def examples(text: str) -> list[str]:
    found = example_commands(text)
    assert found, "no Examples section"
    return found


@pytest.mark.parametrize("path", [p for p in COMMANDS])
def test_help_has_examples_of_this_command(path):
    lines = examples(help_text(path))
    assert 1 <= len(lines) <= 3, lines
    assert all(f"hicache {path}" in line for line in lines), lines


@pytest.mark.parametrize("path", GROUPS)
def test_top_level_and_groups_have_examples_of_their_commands(path):
    lines = examples(help_text(path))
    assert 2 <= len(lines) <= 3, lines
    assert all(f"hicache {path}".rstrip() in line for line in lines), lines
    for line in lines:  # each one parses as the command it names
        words = shlex.split(line)
        words = words[words.index("hicache") + 1 :]
        leaf = next(name for name in COMMANDS if words[: len(name.split())] == name.split())
        leaf_commands()[leaf].make_context(leaf, words[len(leaf.split()) :])


@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("path", COMMANDS + GROUPS)
def test_examples_never_wrap_inside_a_command(path, columns):
    """Every line of Examples is a whole command or a backslash continuation of one: pasting the
    section runs the commands as written, at 80 and at 100 columns."""
    text = help_text(path, columns)
    at_wide = examples(help_text(path))
    section = text.partition("Examples")[2]
    lines = [line.strip() for line in section.splitlines() if line.strip()]
    for previous, line in zip(lines, lines[1:], strict=False):
        if not line.startswith("hicache ") and not line.startswith("sudo ") and "hicache " not in line:
            assert previous.endswith("\\"), f"wrapped inside a command at {columns} columns: {previous!r} / {line!r}"
    assert example_commands(text) == at_wide


@pytest.mark.parametrize("path", [p for p in COMMANDS])
def test_every_example_parses(path):
    """Each example's flags exist and its values have the right type and choices (nothing runs)."""
    command = leaf_commands()[path]
    for line in examples(help_text(path)):
        words = shlex.split(line)
        words = words[words.index("hicache") + 1 + len(path.split()) :]
        command.make_context(path, words)  # raises Typer's usage error on a stale flag


@pytest.mark.parametrize("path", [p for p in COMMANDS + GROUPS])
def test_help_names_values_not_python_types(path):
    text = help_text(path)
    assert not TYPE_LABEL.search(text), TYPE_LABEL.search(text).group(0)
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage, usage


def test_options_are_grouped_in_panels():
    text = help_text("inspect keys")
    for panel in ("Input", "Deployment", "Output"):
        assert f"─ {panel} ─" in text
    deployment = text.split("─ Deployment ─")[1].split("─ Output ─")[0]
    assert "--page-size" in deployment and "--tokens " not in deployment


def test_arguments_show_a_plain_name():
    assert "Usage: hicache warm [OPTIONS] [PROMPTS]" in help_text("warm")
    assert "Usage: hicache trace show [OPTIONS] FILE..." in help_text("trace show")
    assert "Usage: hicache playbook run [OPTIONS] NAME" in help_text("playbook run")


@pytest.mark.parametrize("path", COMMANDS)
def test_help_fits_100_columns_without_cutting_a_name(path):
    result = hicache([*path.split(), "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0 and "…" not in result.stdout, result.stdout
