"""The import direction of src/hicache_ops, read from the source with ast (nothing is imported).

Layers, high to low: cli > commands, server > engine, mooncake, kernels > sglang > base (errors,
units, tokens, interrupt, playbooks, the package itself). A module may import from its own layer
or below, never above: every import counts, at module level, under TYPE_CHECKING or inside a
function. No two modules may import each other in a cycle, counting the same imports: a lazy
import inside a function hides a cycle from the interpreter, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hicache_ops

PACKAGE = Path(hicache_ops.__file__).resolve().parent
LAYERS = {
    "cli": 5,
    "commands": 4,
    "server": 4,
    "engine": 3,
    "mooncake": 3,
    "kernels": 3,
    "sglang": 2,
    "errors": 1,
    "units": 1,
    "tokens": 1,
    "interrupt": 1,
    "results": 1,
    "playbooks": 1,
}
NAMES = {5: "cli", 4: "commands/server", 3: "engine/mooncake/kernels", 2: "sglang", 1: "base"}


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file, for every .py module under the package."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def layer(module: str) -> int:
    """The layer of a dotted hicache_ops module name (the package itself is base)."""
    parts = module.split(".")
    if len(parts) == 1:
        return 1
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS in {__file__}")
    return LAYERS[parts[1]]


def imports(path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, imported hicache_ops module) for every import in the file, wherever it stands."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "hicache_ops"]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            if node.module is None or node.module.split(".")[0] != "hicache_ops":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                # `from pkg import mod` imports the module; `from mod import name` the module `mod`
                out.append((node.lineno, sub if sub in known else node.module))
    return out


def graph(known: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module -> first line}, imports of modules that exist only."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges[name] = {}
        for line, target in imports(path, known):
            if target in known and target != name:
                edges[name].setdefault(target, line)
    return edges


def upward_imports(known: dict[str, Path], root: Path = PACKAGE) -> list[str]:
    bad = []
    for name, path in known.items():
        for line, target in imports(path, known):
            if layer(target) > layer(name):
                bad.append(
                    f"{path.relative_to(root.parent)}:{line}: {name} ({NAMES[layer(name)]}) imports "
                    f"{target} ({NAMES[layer(target)]})"
                )
    return bad


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_package_is_read():
    known = modules()
    assert {"hicache_ops.cli.main", "hicache_ops.engine.cache", "hicache_ops.sglang.page_keys"} <= set(known)
    assert ("hicache_ops.sglang.versions" in graph(known)["hicache_ops.cli.main"]) or any(
        "hicache_ops.sglang" in t for t in graph(known)["hicache_ops.cli.common.options"]
    )


def test_every_module_has_a_layer():
    for name in modules():
        layer(name)


def test_no_import_goes_up_a_layer():
    bad = upward_imports(modules())
    assert bad == [], "imports from a lower layer to a higher one:\n" + "\n".join(bad)


def test_no_import_cycle():
    edges = graph(modules())
    found = cycles(edges)
    described = [
        " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(c, c[1:] + c[:1], strict=True) if b in edges[a])
        or ", ".join(c)
        for c in found
    ]
    assert found == [], "import cycles:\n" + "\n".join(described)


@pytest.mark.parametrize(
    "source, message",
    [
        ("from hicache_ops.cli.main import app\n", "imports hicache_ops.cli.main (cli)"),
        (
            "def f():\n    from hicache_ops.commands import warm\n",
            "imports hicache_ops.commands.warm (commands/server)",
        ),
    ],
)
def test_an_upward_import_is_caught(tmp_path, source, message):
    """The checker itself: a low module importing from above, at top level or lazily, is named."""
    root = tmp_path / "hicache_ops"
    for package in ("", "sglang", "cli", "commands"):
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "cli" / "main.py").write_text("")
    (root / "commands" / "warm.py").write_text("")
    (root / "sglang" / "low.py").write_text(source)
    bad = upward_imports(modules(root), root)
    assert len(bad) == 1 and "hicache_ops.sglang.low (sglang)" in bad[0] and message in bad[0], bad


def test_a_cycle_is_caught():
    edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 1}}
    assert cycles(edges) == [["a", "b", "c"]]
