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


def test_the_architecture_page_shows_the_passes_as_they_declare_themselves():
    from onnxmlu.pipeline import ALL_PASSES, pass_table

    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert pass_table(ALL_PASSES) in page, "regenerate the table: python -c 'from onnxmlu.pipeline import " \
        "pass_table, ALL_PASSES; print(pass_table(ALL_PASSES))'"


def test_every_pass_declares_fields_the_context_has():
    from dataclasses import fields

    from onnxmlu.pipeline import ALL_PASSES, RESULTS, Settings

    known = set(RESULTS) | {f.name for f in fields(Settings)}
    for p in ALL_PASSES:
        assert set(p.requires) | set(p.provides) | set(p.may_leave) <= known, p.name
        assert p.where and p.what, p.name


def test_each_fuse_pipeline_meets_its_own_contracts():
    """Along every pass list, a pass only requires what the caller or an earlier pass provides."""
    from onnxmlu.pipeline import BRANCH, FUSE, FUSE_TO_FILE, PLAN, PORTABLE

    given = {"source", "hardware", "output"}  # what the caller puts in the context
    for passes in (PLAN, FUSE, FUSE_TO_FILE, PORTABLE, BRANCH):
        have = set(given)
        for p in passes:
            assert set(p.requires) <= have, (p.name, set(p.requires) - have)
            have |= set(p.provides)


def test_a_pass_list_that_forgets_a_result_fails_at_the_pass_that_needed_it(chain_model):
    import pytest

    from onnxmlu.pipeline import Context, Load, PassContractError, PassManager, PlanPass

    with pytest.raises(PassContractError, match="pass 'plan' requires ctx.analysis"):
        PassManager([Load(), PlanPass()], instruments=()).run(Context(chain_model, None))


def test_subgraphs_are_read_through_ir_only():
    """An If branch or a Loop/Scan body is read by ``onnxmlu.ir``'s helpers (``subgraph``,
    ``subgraphs``, ``node_subgraphs``, ``iter_graphs``), never as ``attr.g`` / ``attr.graphs``
    by hand (docs/architecture.md, "Keeping the shape": one subgraph walker)."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
             for path in sorted(PACKAGE.rglob("*.py")) if "ir" not in path.relative_to(PACKAGE).parts[:1]
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr in ("g", "graphs")]
    assert not found, "read these subgraphs with onnxmlu.ir.subgraph / node_subgraphs:\n" + "\n".join(found)


def test_subgraph_is_a_nodes_graph_attribute_by_name():
    from onnx import helper

    from onnxmlu.ir import subgraph

    branch = helper.make_graph([], "then", [], [])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="if")
    node.attribute.append(helper.make_attribute("body", 3))  # an attribute of that name, not a graph
    assert subgraph(node, "then_branch").name == "then"
    assert subgraph(node, "body") is None and subgraph(node, "missing") is None


def test_the_fp16_precision_is_spelled_only_in_its_record():
    """A precision is one record (onnxmlu/precisions.py): everything else reads its name from
    there, so adding or renaming one touches the record, not string literals across the package.
    (``"int8"`` is also numpy's and onnx's name of a dtype, so only FP16's name is held here.)"""
    from onnxmlu.precisions import FP16

    names = {FP16.name}
    spelled = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value!r}"
               for path in sorted(PACKAGE.rglob("*.py")) if path.name != "precisions.py"
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant) and node.value in names]
    assert not spelled, "read these names from onnxmlu.precisions:\n" + "\n".join(spelled)
