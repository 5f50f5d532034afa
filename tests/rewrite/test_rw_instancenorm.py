"""InstanceNormalization rewriter: numbers against onnxruntime, structure against a written graph.

Numbers: ranks 3-5, opsets 7 / 13 / 18 (ReduceMean's axes become an input) / 22, epsilon given
or defaulted, scale and B constant or fed, float32 against onnxruntime with graph optimizations
off at rtol = atol = 1e-4 (float16 at 4e-3: a few of its ulps); float64 against ONNX's reference evaluator (onnxruntime has no
float64 kernel); the ONNX backend node tests through the whole fuse pipeline. Structure: the
rewritten graph equals an expected graph written in ONNX text form (names ignored, wiring,
attributes and constants compared), as onnxscript's rewriter tests are written.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from rw_util import assert_close, full_check, op_types, run_ort

from onnxmlu import api
from onnxmlu.rewrite import rewrite_model
from onnxmlu.runtime import InferenceSession
from onnxmlu.schema import ensure_registered

PRIMITIVES = ["ReduceMean", "Sub", "Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]


def _model(shape, opset, *, epsilon=None, fed=(), elem=TensorProto.FLOAT, seed=0):
    """One InstanceNormalization; ``fed`` names the parameters ("s", "b") given as inputs."""
    rng = np.random.default_rng(seed)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    params = {"s": rng.uniform(0.5, 2, shape[1]).astype(dtype), "b": rng.uniform(-1, 1, shape[1]).astype(dtype)}
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="inorm", **attrs)
    inputs = [helper.make_tensor_value_info("x", elem, shape)]
    inputs += [helper.make_tensor_value_info(k, elem, [shape[1]]) for k in fed]
    inits = [numpy_helper.from_array(v, k) for k, v in params.items() if k not in fed]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", elem, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    feeds = {"x": (rng.normal(0.3, 2.0, shape)).astype(dtype), **{k: params[k] for k in fed}}
    return model, feeds


@pytest.mark.parametrize("opset", [7, 13, 18, 22])
@pytest.mark.parametrize("shape", [[2, 3, 7], [1, 4, 5, 6], [2, 2, 3, 4, 5]])
@pytest.mark.parametrize(("epsilon", "fed"), [(None, ()), (1e-2, ()), (1e-3, ("s", "b")), (0.5, ("b",))])
def test_matches_onnxruntime(opset, shape, epsilon, fed):
    model, feeds = _model(shape, opset, epsilon=epsilon, fed=fed)
    rewritten, report = rewrite_model(model, only=["instancenorm"])
    assert report.applied == {"instancenorm": 1}, report.skipped
    assert "InstanceNormalization" not in op_types(rewritten)
    assert [op for op in op_types(rewritten) if op != "Reshape"] == PRIMITIVES  # a fed parameter: a Reshape
    full_check(rewritten)
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), what=f"opset {opset} {shape}")


def test_float64_matches_the_reference_evaluator():
    model, feeds = _model([2, 3, 4, 4], 13, epsilon=1e-4, elem=TensorProto.DOUBLE)
    rewritten, _ = rewrite_model(model)
    expected = ReferenceEvaluator(model).run(None, feeds)
    assert_close(run_ort(rewritten, feeds), expected, rtol=1e-10, atol=1e-10, what="float64")


@pytest.mark.parametrize("shape", [[2, 3, 7], [1, 2, 64, 64]])
def test_float16_matches_onnxruntime(shape):
    """In float16 the decomposition's rounding is the kernel's to within a few float16 ulps."""
    model, feeds = _model(shape, 13, elem=TensorProto.FLOAT16)
    rewritten, _ = rewrite_model(model)
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), rtol=4e-3, atol=4e-3, what="float16")


BEFORE = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,3] x) => (float[1,2,3] y)
<float[2] s = {2.0, 0.5}, float[2] b = {1.0, -1.0}>
{
    y = InstanceNormalization <epsilon: float = 0.25> (x, s, b)
}
"""

EXPECTED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,3] x) => (float[1,2,3] y)
<float[2,1] scale = {2.0, 0.5}, float[2,1] bias = {1.0, -1.0}, float eps = {0.25}>
{
    mean = ReduceMean <axes: ints = [2], keepdims: int = 1> (x)
    centred = Sub (x, mean)
    square = Mul (centred, centred)
    var = ReduceMean <axes: ints = [2], keepdims: int = 1> (square)
    var_eps = Add (var, eps)
    std = Sqrt (var_eps)
    factor = Div (scale, std)
    scaled = Mul (centred, factor)
    y = Add (scaled, bias)
}
"""


def _structure(model: onnx.ModelProto) -> list:
    """The graph with its names taken out: each node's op, attributes and where each input
    comes from (a graph input by position, a node output by position, a constant by value)."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    where = {i.name: ("input", k) for k, i in enumerate(model.graph.input)}
    nodes = []
    for n, node in enumerate(model.graph.node):
        sources = [where.get(name) or ("const", consts[name].dtype.str, consts[name].shape,
                                       tuple(consts[name].ravel().tolist())) for name in node.input]
        attrs = sorted((a.name, str(helper.get_attribute_value(a))) for a in node.attribute)
        nodes.append((node.domain, node.op_type, attrs, sources))
        where.update({name: ("node", n, k) for k, name in enumerate(node.output)})
    return nodes + [("output", where[o.name]) for o in model.graph.output]


def test_structure_before_expected():
    before, expected = onnx.parser.parse_model(BEFORE), onnx.parser.parse_model(EXPECTED)
    rewritten, _ = rewrite_model(before)
    assert _structure(rewritten) == _structure(expected)
    feeds = {"x": np.array([[[1, 2, 6], [-1, 0, 4]]], np.float32)}
    assert_close(run_ort(expected, feeds), run_ort(before, feeds), what="the expected graph itself")


@pytest.mark.parametrize(("model", "reason"), [
    (_model([2, 3, 4], 6)[0], "opset 6 < 7"),
    (helper.make_model(helper.make_graph(
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "xsb"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 13)]), "unknown rank"),
], ids=["opset6", "unknown-rank"])
def test_refusals_are_diagnostics(model, reason):
    rewritten, report = rewrite_model(model)
    assert report.total == 0 and op_types(rewritten) == ["InstanceNormalization"]
    [diagnostic] = report.skipped
    assert (diagnostic.stage, diagnostic.rule) == ("rewrite", "instancenorm") and reason in diagnostic.message


@pytest.mark.parametrize("name", ["test_instancenorm_example", "test_instancenorm_epsilon"])
def test_backend_cases_fuse_into_blocks(onnx_backend_case, name):
    """The peer's cases through fuse: nothing left on the host, the stored outputs at 1e-4."""
    case = onnx_backend_case(name)
    fused = api.fuse(case.model, strategy="all-fusion").model
    assert {n.op_type for n in fused.graph.node} == {"MLUFusionBlock"}
    ensure_registered()
    session = InferenceSession(fused)
    names = [i.name for i in session.get_inputs()]
    for inputs, expected in case.datasets:
        assert_close(session.run(None, dict(zip(names, inputs))), expected, what=name)
