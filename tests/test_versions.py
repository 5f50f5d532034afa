"""The declared dependency ranges are true: what made versions inside them fail is tested here
on the installed versions, and `make smoke-lowest` (CI) runs scripts/smoke.sh on the lowest ones.

* The MLUFusionBlock schema has no Python inference function: onnx keeps one in a C++ static
  that is destroyed after the interpreter (onnx 1.19 hangs at exit, 1.20-1.22 segfault, 1.17
  and 1.18 cannot set one). Block outputs are typed from the body by onnxmlu.schema.infer_shapes.
* scripts/lowest_requirements.py pins every runtime dependency at its declared lower bound.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, defs, helper

from onnxmlu.schema import DOMAIN, OP_TYPE, VERSION, ensure_registered, infer_shapes, type_block_outputs
from runtime_helpers import block_node, conv_relu_body, fused_model, vi

ROOT = Path(__file__).resolve().parents[1]


def test_the_schema_holds_no_python_callback():
    ensure_registered()
    schema = defs.get_schema(OP_TYPE, VERSION, DOMAIN)
    assert not schema.has_type_and_shape_inference_function


def test_registering_the_schema_exits_cleanly():
    code = "import onnxmlu.schema as s; s.ensure_registered(); s.ensure_registered(); print('registered')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "registered"), done.stderr[-2000:]


def _block_then_host():
    """x -> block (Conv+Relu body) -> y -> Neg (host) -> n -> Abs -> z; y and n carry no type."""
    nodes = [block_node("block_0", ["x"], ["y"], conv_relu_body(), mp=2),
             helper.make_node("Neg", ["y"], ["n"], name="neg"), helper.make_node("Abs", ["n"], ["z"], name="abs")]
    return fused_model(nodes, [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [vi("z", TensorProto.FLOAT, [1, 4, 8, 8])])


def test_block_outputs_are_typed_from_the_body_and_inference_flows_past_them():
    model = _block_then_host()
    inferred = infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    assert [d.dim_value for d in types["y"].shape.dim] == [1, 4, 8, 8]
    assert [d.dim_value for d in types["n"].shape.dim] == [1, 4, 8, 8]  # typed by onnx, past the block
    assert not any(v.name == "y" for v in model.graph.value_info)  # the caller's model is untouched


def test_a_body_whose_outputs_do_not_match_the_node_is_an_inference_error():
    model = _block_then_host()
    model.graph.node[0].output.append("extra")
    with pytest.raises(onnx.shape_inference.InferenceError, match="body has 1 output, node has 2"):
        type_block_outputs(model)


def test_the_full_checker_accepts_a_fused_model_whose_block_outputs_are_typed():
    # onnxmlu writes a value_info for every block output (collapse); a hand-made model gets them here
    ensure_registered()
    onnx.checker.check_model(type_block_outputs(_block_then_host()), full_check=True)


def test_lowest_requirements_pin_every_dependency_at_its_bound():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import lowest_requirements as lowest
    finally:
        sys.path.pop(0)
    pins = subprocess.run([sys.executable, str(ROOT / "scripts" / "lowest_requirements.py")], capture_output=True,
                          text=True, check=True).stdout.split()
    declared = lowest.dependencies((ROOT / "pyproject.toml").read_text())
    assert len(pins) == len(declared) and "onnx==1.17" in pins and "onnxruntime==1.23" in pins
    with pytest.raises(SystemExit, match="no >= lower bound"):
        lowest.lowest("numpy<3")


def test_ci_runs_the_smoke_on_the_lowest_and_latest_versions():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make smoke\n" in ci and "make smoke-lowest\n" in ci
