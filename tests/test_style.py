"""Habits that keep the package's shape (docs/architecture.md, "Keeping the shape"): short
functions, thin CLI commands, the pipeline's stage order visible in one place."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "onnxmlu"
MAX_FUNCTION_LINES = 40
MAX_COMMAND_LINES = 30


def _functions(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.end_lineno - node.lineno + 1


def test_no_function_over_40_lines():
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)"
            for path in sorted(PACKAGE.rglob("*.py")) for node, lines in _functions(path)
            if lines > MAX_FUNCTION_LINES]
    assert not long, "split these functions:\n" + "\n".join(long)


def test_cli_commands_parse_options_and_call_the_api():
    commands = [(node, lines) for node, lines in _functions(PACKAGE / "cli.py")
                if any(_decorator_name(d) in ("command", "hw_app.command") for d in node.decorator_list)]
    assert len(commands) >= 10
    long = [f"{node.name} ({lines} lines)" for node, lines in commands if lines > MAX_COMMAND_LINES]
    assert not long, "move the work of these commands into onnxmlu.api:\n" + "\n".join(long)


def _decorator_name(decorator: ast.expr) -> str:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target)


def test_no_reference_to_a_design_document_outside_the_repository():
    roots = (PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "scripts")
    mentions = [str(path) for root in roots for path in root.rglob("*.py")
                if "DESIGN" + "." in path.read_text() or "DESIGN" + " §" in path.read_text()]
    assert not mentions, mentions


def test_the_two_fuse_pipelines_differ_only_in_their_last_pass():
    from onnxmlu.pipeline import FUSE, FUSE_TO_FILE

    names = [p.name for p in FUSE], [p.name for p in FUSE_TO_FILE]
    assert names[0][:-1] == names[1][:-1] == ["load", "normalize", "rewrite", "analyze", "plan", "profile",
                                                "collapse", "branches"]
    assert (names[0][-1], names[1][-1]) == ("embed", "write")
