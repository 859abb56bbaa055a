"""kernels/ imports in one direction: no module imports another in a circle (lazy imports inside
functions count too), and none imports a sibling's private names."""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "src" / "hicache_ops" / "kernels"
PACKAGE = "hicache_ops.kernels"


def _sibling_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(sibling module, names imported from it) for every import of a kernels/ module in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.append((node.module, [a.name for a in node.names]))
            elif node.level == 1:  # from . import x
                out.extend((a.name, []) for a in node.names)
            elif node.module and node.module.startswith(PACKAGE + "."):
                out.append((node.module.removeprefix(PACKAGE + "."), [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name.removeprefix(PACKAGE + "."), []) for a in node.names if a.name.startswith(PACKAGE + "."))
    return out


def _graph() -> dict[str, list[tuple[str, list[str]]]]:
    return {p.stem: _sibling_imports(p) for p in KERNELS.glob("*.py")}


def test_graph_sees_the_modules():
    graph = _graph()
    assert {"transfer", "checksum", "_triton", "geometry", "indexing"} <= set(graph)
    assert ("indexing", ["as_words", "check_tile", "next_pow2"]) in graph["_triton"]


def test_no_import_cycle():
    graph = {mod: {m for m, _ in imports} for mod, imports in _graph().items()}
    state: dict[str, str] = {}

    def visit(mod: str, path: list[str]) -> None:
        if state.get(mod) == "done":
            return
        assert state.get(mod) != "open", f"import cycle: {' -> '.join(path + [mod])}"
        state[mod] = "open"
        for dep in graph.get(mod, ()):
            visit(dep, path + [mod])
        state[mod] = "done"

    for mod in graph:
        visit(mod, [])


def test_no_private_names_across_modules():
    for mod, imports in _graph().items():
        for sibling, names in imports:
            private = [n for n in names if n.startswith("_")]
            assert not private, f"kernels/{mod}.py imports private {private} from {sibling}"
