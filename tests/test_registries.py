"""Choice lists are written once: whatever lists the rewriters or the BN modes reads the registry.

The rewriters (``onnxmlu.rewrite.REWRITERS``): the CLI's ``--only`` and ``--rewrite`` help, the
rewrite pass's progress line, the rewrite report's schema and docs/json.md (which name the
registry rather than copy it) and docs/architecture.md (one bullet per rewriter). The BN modes:
one tuple in the package, read by the CLI's help. The accelerator's op table runs no op as it is
that a rewriter rewrites, save BatchNormalization and DequantizeLinear, whose forms their
special checks tell apart (a weighted BN, a 4-bit DequantizeLinear: tests/analyze/test_optable.py
checks those checks).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import typer

from onnxmlu import schemas
from onnxmlu.analyze import optable
from onnxmlu.cli import app
from onnxmlu.options import Options
from onnxmlu.pipeline import Rewrite
from onnxmlu.rewrite import BN_MODES, REWRITER_NAMES, rewritten_ops

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "onnxmlu"


def _help(command: str, option: str) -> str:
    params = typer.main.get_command(app).commands[command].params
    return next(p.help for p in params if option in p.opts)


def test_cli_help_reads_the_registries():
    assert f"subset of {','.join(REWRITER_NAMES)}." in _help("rewrite", "--only")
    rewrite_help = _help("inspect", "--rewrite")
    assert all(f"{name} (" in rewrite_help for name in REWRITER_NAMES), rewrite_help
    for command in ("rewrite", "fuse"):
        assert f"{' or '.join(BN_MODES)}" in _help(command, "--bn")


def test_cli_help_lists_what_the_strategy_precision_and_calibrator_registries_hold():
    """``--precision`` reads the precisions; the strategies' and calibrators' lists are written
    in the help (reading those registries would load the strategies and the INT8 scheme on every
    ``--help``) and must equal them."""
    from onnxmlu.plan.strategies import strategy_names
    from onnxmlu.precision.int8 import CALIBRATION_METHODS
    from onnxmlu.precision.planners import PLANNERS, judged_names

    listed = re.search(r"strategy: (.*), or one registered", _help("fuse", "--strategy")).group(1)
    assert listed.split(", ") == list(strategy_names())
    calibrators = re.search(r"calibrator: (.*)\.", _help("fuse", "--calibrator")).group(1)
    assert re.split(r", | or ", calibrators) == list(CALIBRATION_METHODS)
    precision_help = _help("fuse", "--precision")
    assert all(name in precision_help for name in PLANNERS) and f"{judged_names()[0]}:" in precision_help


def test_progress_label_reads_the_registry():
    def label(only):
        return Rewrite().label(SimpleNamespace(options=Options.of(only=only)))

    assert label(None) == f"rewriting {', '.join(REWRITER_NAMES)}"
    assert label(["rnn", "bn"]) == "rewriting bn, rnn"  # in the order they run


def test_schema_and_json_doc_name_the_registry_instead_of_copying_it():
    schema = json.dumps(schemas.load("rewrite"))
    assert schema.count("onnxmlu.rewrite.REWRITERS") == 2
    section = (ROOT / "docs" / "json.md").read_text().split("\n## rewrite\n")[1].split("\n## ")[0]
    assert section.count("`onnxmlu.rewrite.REWRITERS`") == 2
    for name in REWRITER_NAMES:  # no hand-written list left to fall behind
        assert f'"{name}"' not in schema and f"`{name}`" not in section


def test_architecture_describes_every_rewriter_in_order():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Rewrite (`rewrite/`)")[1].split("\n### ")[0]
    assert re.findall(r"^- `(\w+)`", section, re.M) == list(REWRITER_NAMES)


def test_bn_modes_are_one_tuple():
    """The tuple of BN modes is written once in the package (rewrite/batchnorm.py)."""
    where = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List)) and \
                    [getattr(e, "value", None) for e in node.elts] == list(BN_MODES):
                where.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(where) == 1 and where[0].startswith("onnxmlu/rewrite/batchnorm.py:"), where


def test_op_table_agrees_with_the_rewriters():
    rewritten = {op for ops in rewritten_ops().values() for op in ops}
    both = rewritten & set(optable.OP_KINDS)
    # BatchNormalization: the weighted form is rewritten; DequantizeLinear: the 4-bit form;
    # QLinearMatMul: every form runs as is, the opset-21 u8 x s8 one given u8 weights for exact INT8;
    # LayerNormalization: ONNX's (opset 17+) runs as is, onnxruntime's below 17 is rewritten (the
    # model's opset tells them apart: onnxmlu/frontend/extensions.py)
    assert both == {"BatchNormalization", "DequantizeLinear", "QLinearMatMul", "LayerNormalization"}, \
        f"rewritten and also run as is: {sorted(both)}"
    # the special check tells the forms apart
    assert both - {"QLinearMatMul", "LayerNormalization"} <= set(optable._SPECIAL_CHECKS)


def test_registry_get_takes_a_default_as_dict_get_does():
    from onnxmlu.errors import OnnxMluError
    from onnxmlu.registry import Registry

    registry = Registry("widget", [("a", 1)])
    assert registry.get("a") == 1 and registry.get("b", None) is None and registry.get("b", 7) == 7
    try:
        registry.get("b")
    except OnnxMluError as exc:
        assert "unknown widget 'b' (known: a)" in str(exc)
    else:
        raise AssertionError("an unknown name without a default must raise")
