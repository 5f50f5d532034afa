"""Netron in a real browser: the fused model's blocks are drawn as MLUFusionBlock boxes.

Marked ``browser``: needs Debian's chromium and the netron + playwright packages; skipped
cleanly without them (CI runs without a browser)."""

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


def test_netron_shows_fusion_blocks(browser_tools, tmp_path, chain_model):
    import onnx

    from onnxmlu import api
    from onnxmlu.view import explode, snapshot

    fused = api.fuse(chain_model, strategy="all-fusion").model
    onnx.save(fused, tmp_path / "fused.onnx")
    labels = Counter(snapshot(tmp_path / "fused.onnx", tmp_path / "fused.png", port=18231))
    assert labels["MLUFusionBlock"] == 2 and labels["TopK"] == 1
    assert (tmp_path / "fused.png").stat().st_size > 10_000

    onnx.save(explode(fused), tmp_path / "view.onnx")
    labels = Counter(snapshot(tmp_path / "view.onnx", tmp_path / "view.png", port=18232))
    assert labels["MLUFusionBlock"] == 0 and sum(v for k, v in labels.items() if k.startswith("block_")) == 2
