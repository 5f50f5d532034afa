"""The package's import graph is a DAG by layer (docs/architecture.md, "Layers").

Read from the syntax trees, not by importing: a module's edges are its module-level imports
(those under ``if TYPE_CHECKING`` are types only and never run) and the modules it names to
:func:`onnxmlu.optional.optional_import`, the one way to import late. An edge may point down
the layers or within one; no two packages may import each other, even through a third.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from onnxmlu.optional import LAZY

PACKAGE = Path(__file__).resolve().parents[1] / "onnxmlu"

#: The layers, bottom first: a package or top-level module imports only from its own layer or
#: those below. ``onnxmlu`` is the package's root (its facade), ``__main__`` is ``python -m``.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "diagnostics", "registry", "optional", "version", "plots", "schemas", "precisions", "ortlog",
     "progress", "wording"),
    ("ir", "schema", "reference", "sessions"),
    ("frontend", "rewrite", "analyze", "plan", "runtime"),
    ("collapse",),
    ("precision",),
    ("tools", "reports", "options"),
    ("pipeline",),
    ("api",),
    ("cli", "__main__", "onnxmlu"),
)
RANK = {unit: k for k, layer in enumerate(LAYERS) for unit in layer}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The package or top-level module a module belongs to (``onnxmlu`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "onnxmlu"


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parent = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(parent + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if _exists(f"{base}.{a.name}") else base for a in node.names]


def _exists(module: str) -> bool:
    """Whether ``module`` (``onnxmlu.x.y``) is a module or package of the package."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _edges(path: Path) -> tuple[set[str], list[str]]:
    """(modules of onnxmlu ``path`` imports or names to optional_import, imports inside a function)."""
    module, tree = _module(path), ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_imported(node, module, path.name == "__init__.py"))
    late = [f"{path.name}:{n.lineno}: {ast.unparse(n)}" for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
            if isinstance(n, (ast.Import, ast.ImportFrom))]
    found.update(_optional_targets(tree))
    return {m for m in found if m == "onnxmlu" or m.startswith("onnxmlu.")}, late


def _optional_targets(tree: ast.AST) -> list[str]:
    return [call.args[0].value for call in ast.walk(tree)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "optional_import"
            and call.args and isinstance(call.args[0], ast.Constant)]


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Unit -> the units it imports (itself left out)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        unit = _unit(_module(path))
        graph.setdefault(unit, set()).update(_unit(m) for m in _edges(path)[0] if _unit(m) != unit)
    return graph


def test_every_unit_of_the_package_has_a_layer():
    assert set(_graph()) <= set(RANK), f"give these a layer in LAYERS: {sorted(set(_graph()) - set(RANK))}"


def test_no_import_points_up_the_layers():
    up = [f"{unit} -> {target}" for unit, targets in _graph().items() for target in targets
          if RANK[target] > RANK[unit]]
    assert not up, "imports up the layers (move the shared code down, or the importer up):\n" + "\n".join(up)


def test_no_package_level_cycle():
    graph = _graph()
    cycles = [f"{a} <-> {b}" for a in graph for b in graph if a < b and _reaches(graph, a, b) and _reaches(graph, b, a)]
    assert not cycles, "packages that import each other, directly or through others:\n" + "\n".join(cycles)


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        unit = todo.pop()
        if unit == goal and unit != start:
            return True
        for nxt in graph.get(unit, ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def test_imports_sit_at_module_top_and_late_ones_say_why():
    late = [line for path in PACKAGE.rglob("*.py") if path.name != "optional.py" for line in _edges(path)[1]]
    assert not late, "import at module top, or through onnxmlu.optional.optional_import:\n" + "\n".join(late)
    named = {t for path in PACKAGE.rglob("*.py") for t in _optional_targets(ast.parse(path.read_text()))}
    assert named <= set(LAZY), f"late imports without a reason in onnxmlu.optional.LAZY: {sorted(named - set(LAZY))}"


def test_the_layer_test_sees_an_arrow_up_and_a_cycle():
    graph = {"ir": {"errors"}, "plan": {"precision"}, "precision": {"plan", "ir"}, "errors": set()}
    assert [u for u, ts in graph.items() for t in ts if RANK[t] > RANK[u]] == ["plan"]
    assert _reaches(graph, "plan", "precision") and _reaches(graph, "precision", "plan")
    assert not _reaches(graph, "ir", "plan")


def test_type_only_imports_point_down_too():
    """An import under ``if TYPE_CHECKING`` runs never, but a type named from a layer above is a
    call back up through an object handed down: name it by a Protocol of the lower layer."""
    up = []
    for path in PACKAGE.rglob("*.py"):
        module, tree = _module(path), ast.parse(path.read_text())
        for block in (n for n in tree.body if _is_type_checking(n)):
            for node in (n for n in ast.walk(block) if isinstance(n, (ast.Import, ast.ImportFrom))):
                targets = {_unit(m) for m in _imported(node, module, path.name == "__init__.py")
                           if m.startswith("onnxmlu.")}
                up += [f"{module} -> {t}" for t in targets if RANK[t] > RANK[_unit(module)]]
    assert not up, "type-only imports up the layers:\n" + "\n".join(up)
