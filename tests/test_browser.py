"""Netron in a real browser: the fused model's blocks are drawn as MLUFusionBlock boxes, a
block's sidebar shows its attributes with the body as ``uint8[N]``, and an exploded view copy
opens a block as a function holding the body's nodes.

Marked ``browser``: needs Debian's chromium and the netron + playwright packages; skipped
cleanly without them (CI runs without a browser)."""

import re
import shutil
from collections import Counter

import pytest

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser_tools():
    if not shutil.which("chromium"):
        pytest.skip("Debian chromium is not installed")
    pytest.importorskip("netron")
    pytest.importorskip("playwright")


@pytest.fixture
def fused_file(tmp_path, chain_model):
    import onnx

    from onnxmlu import api

    path = tmp_path / "fused.onnx"
    onnx.save(api.fuse(chain_model, strategy="all-fusion").model, path)
    return path


def test_netron_shows_fusion_blocks(browser_tools, tmp_path, fused_file):
    import onnx

    from onnxmlu.tools.view import explode, snapshot

    labels = Counter(snapshot(fused_file, tmp_path / "fused.png", port=18231).labels)
    assert labels["MLUFusionBlock"] == 2 and labels["TopK"] == 1
    assert (tmp_path / "fused.png").stat().st_size > 10_000

    onnx.save(explode(onnx.load(fused_file)), tmp_path / "view.onnx")
    labels = Counter(snapshot(tmp_path / "view.onnx", tmp_path / "view.png", port=18232).labels)
    assert labels["MLUFusionBlock"] == 0 and sum(v for k, v in labels.items() if k.startswith("block_")) == 2


def test_block_sidebar_shows_attributes_and_uint8_body(browser_tools, tmp_path, fused_file):
    from onnxmlu.tools.view import snapshot

    items = snapshot(fused_file, tmp_path / "sidebar.png", port=18233, select="block_0").sidebar
    assert items["type"] == "MLUFusionBlock" and items["module"] == "com.onnxmlu"
    assert re.fullmatch(r"block_0 \(mp=\d+\)", items["name"]) and items["mp"].isdigit()
    assert items["layers"].startswith("conv0, relu0") and "Conv" in items["op_types"]
    assert float(items["gops"]) > 0 and float(items["sim_latency_us"]) > 0
    assert "simulated" in items["description"]
    assert re.fullmatch(r"tensor: uint8\[\d+\]", items["body"]), items["body"]  # never garbled text


def test_exploded_block_opens_as_a_function(browser_tools, tmp_path, fused_file):
    import onnx

    from onnxmlu.tools.view import explode, snapshot

    onnx.save(explode(onnx.load(fused_file)), tmp_path / "view.onnx")
    shot = snapshot(tmp_path / "view.onnx", tmp_path / "inside.png", port=18234, select="block_0",
                    open_function=True)
    assert shot.sidebar["module"] == "com.onnxmlu.view" and "body" not in shot.sidebar  # the body left the node
    assert "mp" in shot.sidebar and "layers" in shot.sidebar
    assert "MLUFusionBlock" not in shot.pictured and {"Conv", "Relu"} <= set(shot.pictured)  # its nodes
