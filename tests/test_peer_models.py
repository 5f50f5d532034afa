"""The model tests shipped in the onnx wheel (``onnx/backend/test/data/pytorch-converted`` and
``pytorch-operator``: early PyTorch exports, most at opset 6) as a peer's test suite: each model
must fuse (old opsets go through onnx's version converter) into at least one block, and the
fused model must reproduce the reference outputs stored beside it -- also when onnxruntime
refuses the original (opset 1/6 models it no longer loads, the PRelu-6 slope cases among
them): the stored outputs are the reference, not a rerun of the original. A model may instead
be refused with one line, but only for a reason in :data:`REFUSALS`."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxmlu import api
from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import fed_inputs
from onnxmlu.schema import is_fusion_block
from onnxmlu.runtime import InferenceSession

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted(Path(p).parent for suite in ("pytorch-converted", "pytorch-operator")
               for p in glob.glob(str(DATA / suite / "*" / "model.onnx")))


#: The one-line refusals a peer model may end in (anything else fails the test).
REFUSALS = ()


def _tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in sorted(folder.glob(f"{prefix}_*.pb"))]


@pytest.mark.skipif(not CASES, reason="this onnx wheel ships no pytorch model tests")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_peer_model_fuses_and_reproduces_its_reference_outputs(case, library):
    model = onnx.load(str(case / "model.onnx"))
    data = sorted(case.glob("test_data_set_*"))[0]
    names = [vi.name for vi in fed_inputs(model.graph)]
    inputs, expected = _tensors(data, "input"), _tensors(data, "output")
    try:
        fused = api.fuse(model, input_shapes={n: list(a.shape) for n, a in zip(names, inputs)}).model
    except OnnxMluError as error:
        message = str(error)
        assert "\n" not in message and any(r in message for r in REFUSALS), f"not a stated refusal: {message}"
        return
    assert any(is_fusion_block(n) for n in fused.graph.node), "no block"
    got = InferenceSession(fused).run(None, dict(zip(names, inputs)))
    for out, want in zip(got, expected):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, equal_nan=True)
