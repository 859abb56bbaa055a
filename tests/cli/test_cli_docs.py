"""The generated CLI reference (docs/cli/*.reference.md) is current: regenerated in memory from the
Typer app and the result models, it equals the files. Run `scripts/gen_cli_docs.py` after changing a
command's options, help or result model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_generated_reference_is_current():
    pages = gen.render_pages()
    assert {p.name for p in pages} >= {"bench.reference.md", "inspect.reference.md", "prefetch.reference.md"}
    stale = [p.name for p, text in pages.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"not current (run .venv/bin/python scripts/gen_cli_docs.py): {stale}"
    on_disk = {p.name for p in (ROOT / "docs" / "cli").glob("*.reference.md")}
    assert on_disk == {p.name for p in pages}, "a generated page no command writes any more"


COMMANDS = dict(gen.leaf_commands())
MODELS = [(command, when, model) for command in sorted(COMMANDS) for when, model in gen.result_models(command)]


def _section(command: str) -> str:
    """The command's section of its generated page."""
    page = (ROOT / "docs" / "cli" / f"{command.split()[1]}.reference.md").read_text()
    _, found, rest = page.partition(f"## `{command}`\n")
    assert found, f"{command} has no section on its page"
    return rest.split("\n## `", 1)[0]


def test_every_command_taking_json_has_a_result_model():
    """What `--json` prints comes from a model, and the reference lists every model by the option that
    selects it (one the command takes)."""
    assert [c for c, command in COMMANDS.items() if gen.has_json(command) and c not in gen.RESULT_MODELS] == []
    assert set(gen.RESULT_MODELS) | set(gen.OPTION_MODELS) <= set(COMMANDS), "a model of a command that is gone"
    for command, choices in gen.OPTION_MODELS.items():
        options = {opt for param in COMMANDS[command].params for opt in param.opts}
        assert {when for when, _ in choices} <= options, command


@pytest.mark.parametrize(("command", "when", "model"), MODELS, ids=[f"{c} {w or ''}".strip() for c, w, _ in MODELS])
def test_every_result_field_is_described(command, when, model):
    cls = gen._model(model)
    rows = gen.field_rows(cls)
    assert rows
    assert [path for path, _, meaning in rows if not meaning] == []
    # in the command's section, under the line naming this model (and the option that selects it)
    lead = f"With `{when}`, `--json` prints" if when else "`--json` prints"
    _, found, table = _section(command).partition(f"{lead} ")
    assert found and table.startswith((f"`{cls.__name__}`", f"a list of `{cls.__name__}`")), (command, when)
    table = table.split("\n\n", 2)[1]
    assert [line.split(" | ")[0].removeprefix("| `").removesuffix("`") for line in table.splitlines()[2:]] == [
        path for path, _, _ in rows
    ]


def test_field_rows_expand_nested_models():
    rows = {path: kind for path, kind, _ in gen.field_rows(gen._model(gen.RESULT_MODELS["hicache prefetch"]))}
    assert rows["prompts"] == "list[object]"
    assert rows["prompts[].policies.*.deadline_s"] == "number \\| null"
