"""Hostile fused models: every one is refused with a message naming the block, never crashes the
process and never reads a file -- by the library at session creation and by the Python readers
(body_model, inspect, explode/--portable, the reference evaluator, shape inference).

A body holding a tensor with external data is the file-reading case: made from bytes, the inner
session would resolve a relative location against the process's working directory (a model
downloaded to ~/models run from a project folder read ./secret.txt into its output). Every test
here runs with such a secret.txt in the working directory. `make sanitize` runs this file under
ASan + UBSan as well.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from onnxmlu import runtime
from onnxmlu.cli import app
from onnxmlu.errors import OnnxMluError
from onnxmlu.reference import reference_evaluator
from onnxmlu.schema import BodyFileReferenceError, BodyLabelError, body_model, infer_shapes, is_fusion_block
from onnxmlu.tools.view import explode
from runtime_helpers import DOMAIN, block_node, conv_relu_fused, fused_model, vi
from runtime_helpers import body_model as make_body

SECRET = b"SECRET-SECRET-SECRET-SECRET-SECR"  # 8 float32 values' worth


@pytest.fixture(autouse=True)
def secret_in_working_directory(tmp_path, monkeypatch):
    (tmp_path / "secret.txt").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)


def external(name: str, location: str, dims=(4,)) -> onnx.TensorProto:
    """A float tensor whose data lives in ``location`` (no bytes inline)."""
    tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(dims))
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(4 * int(np.prod(dims))))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def one_block(nodes, initializers=(), functions=(), extra_opsets=(), **attrs) -> onnx.ModelProto:
    """x[4] -> block 'hostile (mp=1)' (body: ``nodes``; ``attrs``: more node attributes) -> y[4]."""
    body = make_body(nodes, [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])], initializers,
                     extra_opsets=extra_opsets)
    body.functions.extend(functions)
    return fused_model([block_node("hostile (mp=1)", ["x"], ["y"], body, mp=1, **attrs)],
                       [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])])


def add_initializer(location):
    return one_block([helper.make_node("Add", ["x", "w"], ["y"])], [external("w", location)])


def constant_attribute():
    return one_block([helper.make_node("Constant", [], ["w"], value=external("c", "secret.txt")),
                      helper.make_node("Add", ["x", "w"], ["y"])])


def in_a_subgraph():
    branch = helper.make_graph([helper.make_node("Add", ["x", "w"], ["z"])], "then", [],
                               [vi("z", TensorProto.FLOAT, [4])], [external("w", "secret.txt")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["z2"])], "else", [], [vi("z2", TensorProto.FLOAT, [4])])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    return one_block([helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)], [cond])


def in_a_local_function():
    function = helper.make_function(
        "local", "leak", ["a"], ["b"],
        [helper.make_node("Constant", [], ["w"], value=external("c", "secret.txt")),
         helper.make_node("Add", ["a", "w"], ["b"])],
        opset_imports=[helper.make_opsetid("", 17)])
    return one_block([helper.make_node("leak", ["x"], ["y"], domain="local")], functions=[function],
                     extra_opsets=[helper.make_opsetid("local", 1)])


def location_without_entries():
    tensor = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    return one_block([helper.make_node("Add", ["x", "w"], ["y"])], [tensor])


FILE_CASES = {
    "relative": (lambda: add_initializer("secret.txt"), "tensor 'w' keeps its data in external file 'secret.txt'"),
    "absolute": (lambda: add_initializer("/etc/hostname"), "external file '/etc/hostname'"),
    "parent": (lambda: add_initializer("../secret.txt"), "external file '../secret.txt'"),
    "constant attribute": (constant_attribute, "tensor 'c' keeps its data in external file 'secret.txt'"),
    "subgraph": (in_a_subgraph, "tensor 'w' keeps its data in external file 'secret.txt'"),
    "local function": (in_a_local_function, "tensor 'c' keeps its data in external file 'secret.txt'"),
    "no location": (location_without_entries, "tensor 'w' keeps its data in external file '?'"),
}


def creation_error(model: onnx.ModelProto) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 - onnxruntime's exception types vary by version
        runtime.InferenceSession(model).run(None, {"x": np.zeros(4, np.float32)})
    return str(info.value)


def still_works() -> None:
    model, body = conv_relu_fused()
    x = np.ones((1, 3, 8, 8), np.float32)
    assert runtime.InferenceSession(model).run(None, {"x": x})[0].shape == (1, 4, 8, 8)


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_the_library_refuses_a_body_that_refers_to_a_file(library, case):
    build, fragment = FILE_CASES[case]
    message = creation_error(build())
    assert "MLUFusionBlock 'hostile (mp=1)': body refers to a file" in message and fragment in message, message
    assert "SECRET" not in message
    still_works()


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_the_python_readers_refuse_it_too(case, tmp_path):
    model = FILE_CASES[case][0]()
    node = next(n for n in model.graph.node if is_fusion_block(n))
    with pytest.raises(BodyFileReferenceError, match=r"'hostile \(mp=1\)': body refers to a file"):
        body_model(node)
    for reader in (explode, reference_evaluator):
        with pytest.raises(BodyFileReferenceError):
            reader(model)
    with pytest.raises(onnx.shape_inference.InferenceError, match="body refers to a file"):
        infer_shapes(model)
    path = tmp_path / "hostile.onnx"
    onnx.save(model, path)
    result = CliRunner().invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2 and "body refers to a file" in result.output and "Traceback" not in result.output
    assert runtime.optimize_block_layouts(model)[1] == 0  # the layout pass never hands it to onnxruntime


def nested_block():
    inner = make_body([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, [4])],
                      [vi("y", TensorProto.FLOAT, [4])])
    return one_block([block_node("inner", ["x"], ["y"], inner, mp=1)], extra_opsets=[helper.make_opsetid(DOMAIN, 1)])


def huge_initializer():
    """An initializer that declares 2^40 floats and holds 16 bytes."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], np.ones(4, np.float32).tobytes(), raw=True)
    w.dims[:] = [2**40]
    return one_block([helper.make_node("ReduceMax", ["w"], ["m"], keepdims=0), helper.make_node("Add", ["x", "m"], ["y"])],
                     [w])


def huge_declared_io():
    """Body input and output declared [2^40, 2^40] where the node moves [4]."""
    body = make_body([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, [2**40, 2**40])],
                     [vi("y", TensorProto.FLOAT, [2**40, 2**40])])
    return fused_model([block_node("hostile (mp=1)", ["x"], ["y"], body, mp=1)],
                       [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])])


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (written by hand: Python's protobuf refuses to build
    messages this deep)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def deep_subgraphs(depth=60):
    """A body whose If nodes nest ``depth`` levels (3 messages each): deeper than protobuf parses."""
    def leaf(level):
        return helper.make_graph([helper.make_node("Identity", ["x"], [f"e{level}"])], f"e{level}", [],
                                 [vi(f"e{level}", TensorProto.FLOAT, [4])]).SerializeToString()

    def branch(name, graph):  # AttributeProto: name (1), g (6), type (20) = GRAPH (5)
        return _field(1, name) + _field(6, graph) + _varint(20 << 3) + _varint(5)

    graph = leaf(0)
    for level in range(1, depth + 1):
        out = b"y" if level == depth else f"z{level}".encode()
        node = _field(1, b"cond") + _field(2, out) + _field(4, b"If") + _field(5, branch(b"then_branch", graph)) \
            + _field(5, branch(b"else_branch", leaf(level)))
        graph = _field(1, node) + _field(2, f"g{level}".encode()) + _field(12, vi(f"z{level}", TensorProto.FLOAT, [4]).SerializeToString())
    top = make_body([], [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])],
                    [helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    top_graph = top.graph.SerializeToString() + _field(1, node)
    top.ClearField("graph")
    body = top.SerializeToString() + _field(7, top_graph)
    return fused_model([block_node("hostile (mp=1)", ["x"], ["y"], body, mp=1)],
                       [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])])


def fp32_body_labelled(precision: str) -> onnx.ModelProto:
    """An FP32 body (x + w, w a float weight) whose node says ``precision``."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4], [0.5, 1.0, 1.5, 2.0])
    return one_block([helper.make_node("Add", ["x", "w"], ["y"])], [weight], precision=precision)


def honest_body(precision: str) -> onnx.ModelProto:
    """Bodies that bear their label out: QDQ (int8), INT8 weights cast to float and scaled (int8),
    a round trip through float16 (fp16)."""
    scale, zero = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]), helper.make_tensor("z", TensorProto.INT8, [], [0])
    codes = helper.make_tensor("wq", TensorProto.INT8, [4], [1, -2, 3, -4])
    bodies = {
        "int8": ([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                  helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], [scale, zero]),
        "int8 weights": ([helper.make_node("Cast", ["wq"], ["wf"], to=TensorProto.FLOAT),
                          helper.make_node("Mul", ["wf", "s"], ["w"]), helper.make_node("Add", ["x", "w"], ["y"])],
                         [codes, scale]),
        "fp16": ([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                  helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)], []),
    }
    nodes, inits = bodies[precision]
    return one_block(nodes, inits, precision=precision.split()[0])


OTHER_CASES = {
    "fp32 body labelled int8": (lambda: fp32_body_labelled("int8"), "MLUFusionBlock 'hostile (mp=1)': labelled int8 but "
                                "its body holds no quantized operator and no 8-bit integer weight cast to float"),
    "fp32 body labelled fp16": (lambda: fp32_body_labelled("fp16"),
                                "MLUFusionBlock 'hostile (mp=1)': labelled fp16 but its body holds no float16 tensor"),
    "nested block": (nested_block, "blocks cannot be nested"),
    "mp=0": (lambda: conv_relu_fused(mp=0)[0], "'mp' must be between 1 and 1024"),
    "mp=2^40": (lambda: conv_relu_fused(mp=2**40)[0], "'mp' must be between 1 and 1024"),
    "huge initializer": (huge_initializer, "MLUFusionBlock 'hostile (mp=1)'"),
    "huge declared shapes": (huge_declared_io, "hostile (mp=1)"),
    "deep subgraphs": (deep_subgraphs, "MLUFusionBlock 'hostile (mp=1)': body nests subgraphs more than 100"),
}


@pytest.mark.parametrize("case", list(OTHER_CASES))
def test_other_hostile_bodies_are_refused_with_a_message(library, case):
    build, fragment = OTHER_CASES[case]
    message = creation_error(build())
    assert fragment in message, message
    still_works()


def test_python_readers_refuse_a_nested_block():
    with pytest.raises(OnnxMluError, match="cannot be nested"):
        reference_evaluator(nested_block())


@pytest.mark.parametrize("precision", ["int8", "int8 weights", "fp16"])
def test_a_body_that_bears_its_label_out_runs(library, precision):
    x = np.array([1.0, -2.0, 3.0, 0.25], np.float32)
    assert runtime.InferenceSession(honest_body(precision)).run(None, {"x": x})[0].shape == (4,)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_python_readers_refuse_a_mislabelled_body(precision, tmp_path):
    """body_model (every Python reader), and ``onnxmlu inspect`` of the fused file: one line
    naming the block and the mismatch, as the library says it."""
    model = fp32_body_labelled(precision)
    node = next(n for n in model.graph.node if is_fusion_block(n))
    with pytest.raises(BodyLabelError, match=rf"'hostile \(mp=1\)': labelled {precision} but its body holds no"):
        body_model(node)
    path = tmp_path / "mislabelled.onnx"
    onnx.save(model, path)
    result = CliRunner().invoke(app, ["inspect", str(path)])
    assert result.exit_code == 2 and f"labelled {precision} but" in result.output and "Traceback" not in result.output
    for good in ("int8", "int8 weights", "fp16"):
        honest = honest_body(good)
        assert body_model(next(n for n in honest.graph.node if is_fusion_block(n))).graph.node


def test_the_layout_pass_keeps_a_body_whose_optimized_form_would_lose_its_label():
    """onnxruntime folds Cast(INT8 weights) * scale into float weights: the optimized body would
    hold nothing quantized, so the pass leaves the block's own body (and says why)."""
    model = honest_body("int8 weights")
    notes = []
    rewritten, _ = runtime.optimize_block_layouts(model, diagnostics=notes)
    node = next(n for n in rewritten.graph.node if is_fusion_block(n))
    assert [n.op_type for n in body_model(node).graph.node] == ["Cast", "Mul", "Add"]
    assert [d.rule for d in notes] == ["body-label"]
