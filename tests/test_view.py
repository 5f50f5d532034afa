import onnx

from onnxmlu import api
from onnxmlu.schema import is_fusion_block
from onnxmlu.tools.view import VIEW_DOMAIN, explode


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


def test_view_command_writes_the_view_copy_then_serves_it(chain_model, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import onnxmlu.tools.view
    from onnxmlu.cli import app

    fused = tmp_path / "fused.onnx"
    onnx.save(api.fuse(chain_model, strategy="all-fusion").model, fused)
    served = []
    monkeypatch.setattr(onnxmlu.tools.view, "serve", lambda path, port, browse: served.append((path, port, browse)))
    result = CliRunner().invoke(app, ["view", str(fused), "--explode", "--port", "18555", "--no-browser"])
    assert result.exit_code == 0, result.output
    copy = tmp_path / "fused.view.onnx"
    assert served == [(copy, 18555, False)] and "for viewing only" in result.output
    view = onnx.load(copy)
    assert any(p.key == "onnxmlu.view_only" for p in view.metadata_props)
    assert not any(is_fusion_block(n) for n in view.graph.node)
    assert CliRunner().invoke(app, ["view", str(tmp_path / "missing.onnx")]).exit_code == 2
