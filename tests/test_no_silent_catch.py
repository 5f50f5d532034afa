"""No failure is swallowed silently (docs/architecture.md, "One diagnostics list").

A handler of ``Exception`` or ``BaseException`` (or a bare ``except:``) in the package must
re-raise, or use the exception it caught: its text becomes a diagnostic, a refusal reason or a
one-line error. A handler that expects a failure and falls back names the exception types it
expects instead (``except (OSError, DecodeError):``), so anything else surfaces as the bug it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "onnxmlu"
BROAD = {"Exception", "BaseException"}


def _broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in BROAD for t in types)


def _accounted(handler: ast.ExceptHandler) -> bool:
    """Re-raises, or reads the exception it bound (to record or report it)."""
    nodes = [n for statement in handler.body for n in ast.walk(statement)]
    if any(isinstance(n, ast.Raise) for n in nodes):
        return True
    return handler.name is not None and any(isinstance(n, ast.Name) and n.id == handler.name for n in nodes)


def silent_catches(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ExceptHandler) and _broad(node) and not _accounted(node):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_broad_catch_is_silent():
    assert silent_catches() == [], "catch what you expect by name, or record or re-raise the failure"


def test_the_rule_sees_a_silent_catch(tmp_path):
    (tmp_path / "m.py").write_text(
        "try:\n    f()\nexcept Exception:\n    pass\n"
        "try:\n    f()\nexcept Exception as exc:\n    notes.append(str(exc))\n"
        "try:\n    f()\nexcept (OSError, ValueError):\n    pass\n"
        "try:\n    f()\nexcept:\n    cleanup()\n    raise\n")
    assert silent_catches(tmp_path) == [f"{tmp_path.name}/m.py:3"]
