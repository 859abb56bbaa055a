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


@pytest.mark.parametrize("command", sorted(gen.RESULT_MODELS))
def test_every_result_field_is_described(command):
    model = gen._model(gen.RESULT_MODELS[command])
    rows = gen.field_rows(model)
    assert rows
    assert [path for path, _, meaning in rows if not meaning] == []
    page = (ROOT / "docs" / "cli" / f"{command.split()[1]}.reference.md").read_text()
    for path, _, _ in rows:
        assert f"| `{path}` |" in page


def test_field_rows_expand_nested_models():
    rows = {path: kind for path, kind, _ in gen.field_rows(gen._model(gen.RESULT_MODELS["hicache prefetch"]))}
    assert rows["prompts"] == "list[object]"
    assert rows["prompts[].policies.*.deadline_s"] == "number \\| null"
