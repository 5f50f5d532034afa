import onnx

from onnxmlu import api
from onnxmlu.schema import is_fusion_block
from onnxmlu.view import VIEW_DOMAIN, explode


def test_explode_turns_blocks_into_checked_functions(chain_model):
    fused = api.fuse(chain_model, strategy="all-fusion").model
    view = explode(fused)
    calls = [n for n in view.graph.node if n.domain == VIEW_DOMAIN]
    assert len(calls) == sum(is_fusion_block(n) for n in fused.graph.node) == 2
    assert {f.name for f in view.functions} == {n.op_type for n in calls}
    assert all("body" not in {a.name for a in n.attribute} for n in calls)
    assert {"mp", "layers", "op_types"} <= {a.name for a in calls[0].attribute}
    conv_function = next(f for f in view.functions if f.name == calls[0].op_type)
    assert [n.op_type for n in conv_function.node][:1] == ["Constant"]
    assert "Conv" in {n.op_type for n in conv_function.node}
    assert any(p.key == "onnxmlu.view_only" for p in view.metadata_props)
    onnx.checker.check_model(view)
