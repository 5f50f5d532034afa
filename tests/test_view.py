"""Exploded fused models: each block as a model-local ONNX function. The result is a valid ONNX
model that runs in plain onnxruntime without the custom-op library (``fuse --portable``), and
what ``view --explode`` serves to Netron from memory, writing nothing beside the model."""

import json
import urllib.request

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from onnxmlu import api, runtime
from onnxmlu.cli import app
from onnxmlu.schema import DIGEST, DOMAIN, is_fusion_block
from onnxmlu.tools.verify import random_inputs
from onnxmlu.tools.view import VIEW_DOMAIN, explode


def plain_outputs(model: onnx.ModelProto, feeds) -> list:
    """``model`` in plain onnxruntime: no custom-op library registered."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_same_outputs(model, original, seed=0):
    feeds = random_inputs(original, seed)
    want = runtime.reference_session(original).run(None, feeds)
    for got, expected in zip(plain_outputs(model, feeds), want):
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_explode_turns_blocks_into_checked_functions(chain_model):
    fused = api.fuse(chain_model, strategy="all-fusion").model
    view = explode(fused)
    calls = [n for n in view.graph.node if n.domain == VIEW_DOMAIN]
    assert len(calls) == sum(is_fusion_block(n) for n in fused.graph.node) == 2
    assert {f.name for f in view.functions} == {n.op_type for n in calls}
    assert all(not {"body", DIGEST} & {a.name for a in n.attribute} for n in calls)
    assert {"mp", "layers", "op_types"} <= {a.name for a in calls[0].attribute}
    conv_function = next(f for f in view.functions if f.name == calls[0].op_type)
    assert [n.op_type for n in conv_function.node][:1] == ["Constant"]
    assert "Conv" in {n.op_type for n in conv_function.node}
    assert "runs in plain onnxruntime" in {p.key: p.value for p in view.metadata_props}["onnxmlu.exploded"]
    assert DOMAIN not in {o.domain for o in view.opset_import}
    onnx.checker.check_model(view, full_check=True)


@pytest.mark.parametrize("strategy", ["all-fusion", "dlfusion", "none"])
def test_exploded_model_runs_without_the_library_and_matches(chain_model, strategy):
    assert_same_outputs(explode(api.fuse(chain_model, strategy=strategy).model), chain_model)


def test_exploded_zoo_model_runs_without_the_library(zoo):
    original = zoo("mobilenetv2")
    assert_same_outputs(explode(api.fuse(original, strategy="dlfusion").model), original)


def test_fuse_portable_writes_a_model_that_needs_no_library(chain_model, tmp_path):
    src, out = tmp_path / "chain.onnx", tmp_path / "chain.portable.onnx"
    onnx.save(chain_model, src)
    result = CliRunner().invoke(app, ["fuse", str(src), str(out), "--portable", "--check", "--json",
                                      str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "no custom-op library needed" in result.output and "check passed" in result.output
    assert json.loads((tmp_path / "r.json").read_text())["check"]["ok"] is True
    portable = onnx.load(out)
    assert not any(is_fusion_block(n) for n in portable.graph.node) and len(portable.functions) == 2
    assert_same_outputs(portable, chain_model, seed=3)


def test_view_explode_serves_from_memory_and_writes_nothing(chain_model, tmp_path, monkeypatch):
    import onnxmlu.tools.view

    fused = tmp_path / "fused.onnx"
    onnx.save(api.fuse(chain_model, strategy="all-fusion").model, fused)
    served = []
    monkeypatch.setattr(onnxmlu.tools.view, "serve", lambda path, port, browse, data=None: served.append(
        (path, port, browse, data)))
    result = CliRunner().invoke(app, ["view", str(fused), "--explode", "--port", "18555", "--no-browser"])
    assert result.exit_code == 0, result.output
    assert "served from memory" in result.output
    [(path, port, browse, data)] = served
    assert (path, port, browse) == (tmp_path / "fused.exploded.onnx", 18555, False)
    assert onnx.load_from_string(data) == explode(onnx.load(fused))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx"]  # no copy beside the model
    assert CliRunner().invoke(app, ["view", str(tmp_path / "missing.onnx")]).exit_code == 2


def test_netron_serves_the_bytes_it_is_given(chain_model, tmp_path):
    """onnxmlu.tools.view.serve hands netron the model bytes; netron's server returns them for the
    file name it announces in its page (what the browser then loads)."""
    netron = pytest.importorskip("netron")
    import threading

    import onnxmlu.tools.view

    data = explode(api.fuse(chain_model, strategy="all-fusion").model).SerializeToString()
    addresses = []
    real_serve = netron.serve
    started = threading.Event()

    def serve(*args, **kwargs):
        addresses.append(real_serve(*args, **{**kwargs, "address": ("127.0.0.1", 0)}))
        started.set()
        return addresses[-1]

    import unittest.mock

    with unittest.mock.patch.object(netron, "serve", serve), unittest.mock.patch.object(netron, "wait", lambda: None):
        onnxmlu.tools.view.serve(tmp_path / "fused.exploded.onnx", port=0, browse=False, data=data)
    assert started.is_set()
    host, port = addresses[0]
    try:
        page = urllib.request.urlopen(f"http://{host}:{port}/", timeout=10).read().decode()
        assert '<meta name="file" content="/data/fused.exploded.onnx">' in page
        got = urllib.request.urlopen(f"http://{host}:{port}/data/fused.exploded.onnx", timeout=10).read()
        assert got == data
    finally:
        netron.stop(addresses[0])
    assert list(tmp_path.iterdir()) == []


def test_an_exploded_block_is_called_as_its_node_is_named(library):
    """Netron shows a call's function name over the node: the functions were named by the node's
    position in the graph, so past a host node ``block_1 (mp=1)`` read ``block_2``."""
    from test_story_tour import host_conv_model  # conv, relu | a host FusedConv | conv

    original = host_conv_model()
    fused = api.fuse(original).model
    names = [n.name for n in fused.graph.node if is_fusion_block(n)]
    assert [n.op_type for n in fused.graph.node][1] == "FusedConv" and len(names) == 2, names
    view = explode(fused)
    assert [(n.name, n.op_type) for n in view.graph.node if n.domain == VIEW_DOMAIN] == \
        [(name, name.split(" ")[0]) for name in names]
    assert_same_outputs(view, original)
    renamed = onnx.ModelProto()
    renamed.CopyFrom(fused)
    for node in renamed.graph.node:  # names that give no index: the node's position still names it
        node.name = "b" if is_fusion_block(node) else node.name
    assert [n.op_type for n in explode(renamed).graph.node if n.domain == VIEW_DOMAIN] == ["block_0", "block_2"]
