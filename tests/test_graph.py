import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu.tools.testing import make_model
from onnxmlu.errors import ModelLoadError, OnnxMluError
from onnxmlu.frontend.load import load_model
from onnxmlu.frontend.pins import DimRange, check_pins, concrete_shapes, parse_input_shapes
from onnxmlu.frontend.shapes import sizes_at
from onnxmlu.frontend.normalize import normalize
from onnxmlu.ir import GraphIndex, node_inputs, topological_order


def test_load_model_errors_are_one_line(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "missing.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is empty"):
        load_model(empty)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(bytes(range(256)) * 7)
    with pytest.raises(ModelLoadError) as info:
        load_model(junk)
    assert "\n" not in str(info.value)


def test_parse_input_shapes():
    assert parse_input_shapes(["input:1,3,224,224", "ids:N,16"]) == {"input": [1, 3, 224, 224], "ids": ["N", 16]}
    with pytest.raises(OnnxMluError, match="NAME:D1"):
        parse_input_shapes(["oops"])
    assert parse_input_shapes(["x:1,3,48,160..1280"])["x"][3] == DimRange(160, 160, 1280)
    assert parse_input_shapes(["x:1,3,48,160/320/1280"])["x"][3] == DimRange(160, 320, 1280)
    for bad, why in (("x:1,3,-5", "at least 1"), ("x:1,0", "at least 1"), ("x:1,3..2", "MIN <= OPT <= MAX"),
                     ("x:1,2/1/3", "MIN <= OPT <= MAX"), ("x:1,1..2..3", "MIN..MAX"), ("x:1,a-b", "neither")):
        with pytest.raises(OnnxMluError, match=why):
            parse_input_shapes([bad])
    with pytest.raises(OnnxMluError, match="twice"):
        parse_input_shapes(["x:1", "x:2"])


@pytest.mark.parametrize("pin, why", [
    ({"x": [1, 8, 16]}, "3 dims; the model declares rank 4"),
    ({"x": [1, 4, 16, 16]}, "dim 1 as 4; the model fixes it at 8"),
    ({"x": [1, 8, DimRange(8, 8, 32), 16]}, "dim 2 as 8..32; the model fixes it at 16"),
    ({"y": [1]}, "not a model input"),
])
def test_pins_the_model_contradicts_are_refused(chain_model, pin, why):
    chain_model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    with pytest.raises(OnnxMluError, match=why):
        check_pins(chain_model, pin)
    check_pins(chain_model, {"x": [DimRange(1, 2, 8), 8, 16, 16]})


def test_unpinned_dims_take_the_stated_defaults():
    def shape_of(dims):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [])
        return concrete_shapes(helper.make_model(graph))["x"]

    assert shape_of(["N", 3, 48, "W"]) == [1, 3, 48, 48]
    assert shape_of(["N", 3, "H", "W"]) == [1, 3, 224, 224]
    assert shape_of(["N", "T", 80]) == [1, 128, 80]
    assert shape_of(["N", "T", "T"]) == [1, 128, 128]  # a name shared: one size


def test_normalize_folds_constant_nodes_into_initializers():
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w_value")
    nodes = [helper.make_node("Constant", [], ["w"], value=weight, name="const"),
             helper.make_node("Identity", ["w"], ["w2"], name="ident"),
             helper.make_node("MatMul", ["x", "w2"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = normalize(make_model(graph, 13))
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    index = GraphIndex.build(model.graph)
    assert index.is_constant(model.graph.node[0].input[1])
    assert index.shape("y") == ["N", 4]


def test_pins_price_the_layers_and_leave_the_graph_symbolic(chain_model):
    chain_model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    pins = {"x": [2, 8, 16, 16]}
    model = normalize(chain_model, pins)
    assert GraphIndex.build(model.graph).shape("pooled") == ["N", 8, 1, 1]
    sizes = sizes_at(model, concrete_shapes(model, pins), lambda d: None)
    assert sizes["pooled"] == (TensorProto.FLOAT, [2, 8, 1, 1])
    assert GraphIndex.build(model.graph, sizes=sizes).static_shape("pooled") == [2, 8, 1, 1]
    with pytest.raises(OnnxMluError, match="not a model input"):
        normalize(chain_model, {"nope": [1]})


def test_opset_bounds(chain_model):
    """An old opset is upgraded by onnx's version converter, then checked: this chain's TopK
    has opset 10's k input, invalid at opset 6, so it is refused (tests/test_peer_models.py
    holds the upgrade of valid opset-6 models); a newer opset than this onnx knows is refused."""
    chain_model.opset_import[0].version = 6
    with pytest.raises(OnnxMluError, match="TopK"):
        normalize(chain_model)
    chain_model.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    with pytest.raises(OnnxMluError, match="newer"):
        normalize(chain_model)


def _graph(nodes, inputs=("x",)):
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [1]) for i in inputs],
                             [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, [1])])


def test_topological_order_gathers_host_nodes_between_runs():
    # file order interleaves: a(acc) h1(host) b(acc, reads a) h2(host, reads h1) c(acc, reads b, h2)
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("TopK", ["x"], ["h1"], name="h1"),
             helper.make_node("Relu", ["a"], ["b"], name="b"),
             helper.make_node("TopK", ["h1"], ["h2"], name="h2"),
             helper.make_node("Add", ["b", "h2"], ["c"], name="c")]
    host = {1, 3}
    order = topological_order(_graph(nodes), prefer=lambda i: i not in host)
    assert order == [0, 2, 1, 3, 4]


def test_topological_order_rejects_cycles_and_dangling_inputs():
    cyclic = [helper.make_node("Relu", ["b"], ["a"], name="a"), helper.make_node("Relu", ["a"], ["b"], name="b")]
    with pytest.raises(OnnxMluError, match="cycle"):
        topological_order(_graph(cyclic), prefer=lambda i: True)
    dangling = [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")]
    with pytest.raises(OnnxMluError, match="ghost"):
        topological_order(_graph(dangling), prefer=lambda i: True)


def test_node_inputs_include_subgraph_outer_scope():
    then_g = helper.make_graph([helper.make_node("Relu", ["outer"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["outer2"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)
    assert sorted(node_inputs(node)) == ["cond", "outer", "outer2"]
