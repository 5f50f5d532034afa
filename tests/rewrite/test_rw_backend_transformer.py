"""ONNX's own node tests of the opset-23/24 transformer operators (Attention, RMSNormalization,
RotaryEmbedding; onnx 1.22.0's backend data, every case but the ``_expanded`` function-body
twins) through the whole pipeline: rewrite, fuse with every node in a block, run in onnxruntime
with the custom-op library, compare with the stored outputs at 1e-4 (the float16 cases at 1e-3:
float16 ulps at the values' size)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import rw_backend

from onnxmlu import api
from onnxmlu.runtime import InferenceSession
from onnxmlu.schema import ensure_registered

PREFIXES = ("test_attention_", "test_rms_normalization", "test_rotary_embedding")


def _cases() -> list[str]:
    root, _ = rw_backend.backend_root()
    if root is None:
        return []
    return sorted(p.name for p in root.iterdir() if p.name.startswith(PREFIXES) and "_expanded" not in p.name)


CASES = _cases()


def test_the_families_are_there():
    """The node tests exist (an empty list would pass the parametrized test vacuously)."""
    root, why = rw_backend.backend_root()
    if root is None:
        pytest.skip(why)
    assert sum(n.startswith("test_attention_") for n in CASES) >= 60
    assert sum(n.startswith("test_rms_normalization") for n in CASES) >= 19
    assert sum(n.startswith("test_rotary_embedding") for n in CASES) >= 8


@pytest.mark.parametrize("name", CASES)
def test_transformer_node_tests_fuse_and_match(onnx_backend_case, name):
    case = onnx_backend_case(name)
    fused = api.fuse(case.model, strategy="all-fusion").model
    assert {n.op_type for n in fused.graph.node} == {"MLUFusionBlock"}, name
    ensure_registered()
    onnx.checker.check_model(fused, full_check=True)
    session = InferenceSession(fused)
    names = [i.name for i in session.get_inputs()]
    tol = 1e-3 if "fp16" in name else 1e-4
    for inputs, expected in case.datasets:
        for got, want in zip(session.run(None, dict(zip(names, inputs))), expected):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
