"""The shape rules: no import cycles in engine/ or adapters/, engine/ never imports adapters/, no ``type: ignore`` in engine/, one owner of stream positions.

The graph counts every import the source contains, wherever it stands: at module
level, inside functions and under ``TYPE_CHECKING``. A cycle that only a lazy or
type-only import closes is still a cycle of the design (the two modules cannot be
understood apart), so it fails here too. ``from pkg import name`` depends on
``pkg.name`` when that is a module, else on ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "adapters")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that ``name`` names, or whose member it is."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                owner = _owner(target, modules)
                if owner is not None and owner != module:
                    graph[module].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_engine_or_adapters() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_engine_never_imports_adapters() -> None:
    bad = sorted(f"{m} -> {d}" for m, deps in import_graph().items() if m.startswith("engine") for d in deps if d.startswith("adapters"))
    assert bad == []


def test_no_type_ignore_in_engine() -> None:
    """engine/ is typed strictly: a port that mypy cannot follow gets a better
    type, not a silenced error."""
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "engine").rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert found == []


def test_only_the_turn_view_moves_stream_positions() -> None:
    """Stream positions (``Positions`` of ``engine.fold.turn_view``) have one
    owner: the actor and the followers claim positions for live chunks from
    it (``Positions.claim``), never set them."""
    owner = ROOT / "engine" / "fold" / "turn_view.py"
    moved = []
    for path in _modules().values():
        if path == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr in ("next", "last_event", "epoch"):
                moved.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr} = ...")
    assert moved == []
