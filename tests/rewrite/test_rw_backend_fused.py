"""ONNX backend node tests through the whole pipeline: rewrite, fuse (every accelerator op in
a block), run in onnxruntime with the custom-op library, compare with the stored outputs.

Covers the rewritten families (as shipped, weights as graph inputs, and "frozen", weights as
initializers so BatchNormalization becomes rewritable) and the primitive families the
accelerator runs directly. A case onnxruntime itself cannot run (e.g. layout=1 recurrent
models before rewriting) must run after fusion."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import rw_backend
from rw_util import freeze_inputs

from onnxmlu import api
from onnxmlu.runtime import InferenceSession
from onnxmlu.schema import ensure_registered, is_fusion_block

PRIMITIVE_PREFIXES = ("test_conv_", "test_convtranspose", "test_maxpool_", "test_averagepool_",
                      "test_globalaveragepool", "test_globalmaxpool", "test_relu", "test_matmul_",
                      "test_flatten_", "test_softmax_", "test_logsoftmax_")
HOST_ONLY = "_with_argmax_"  # MaxPool with an Indices output stays on the host (not in the op table)


def _primitive_cases() -> list[str]:
    root, _ = rw_backend.backend_root()
    if root is None:
        return []
    return sorted(p.name for p in root.iterdir() if p.name.startswith(PRIMITIVE_PREFIXES))


REWRITTEN = [n for names in rw_backend.FAMILIES.values() for n in names if "training_mode" not in n]
PRIMITIVE = _primitive_cases()


def _fuse_and_compare(model: onnx.ModelProto, datasets, tol: float = 1e-4) -> onnx.ModelProto:
    fused = api.fuse(model, strategy="all-fusion").model
    ensure_registered()
    onnx.checker.check_model(fused, full_check=True)
    session = InferenceSession(fused)
    names = [i.name for i in session.get_inputs()]
    for inputs, expected in datasets:
        feeds = dict(zip(names, inputs[: len(names)]))
        for got, want in zip(session.run(None, feeds), expected):
            np.testing.assert_allclose(got, want, atol=tol, rtol=tol)
    return fused


@pytest.mark.parametrize("name", REWRITTEN)
def test_rewritten_families_fuse_and_match(onnx_backend_case, name):
    case = onnx_backend_case(name)
    fused = _fuse_and_compare(case.model, case.datasets)
    leftover = {n.op_type for n in fused.graph.node} & {"Gemm", "LSTM", "GRU", "RNN"}
    assert not leftover


@pytest.mark.parametrize("name", REWRITTEN)
def test_frozen_weights_fuse_into_one_block(onnx_backend_case, name):
    case = onnx_backend_case(name)
    inputs, _ = case.datasets[0]
    values = dict(zip(case.input_names[1:], inputs[1:]))
    frozen = freeze_inputs(case.model, values)
    data = [(ins[:1], outs) for ins, outs in case.datasets]
    fused = _fuse_and_compare(frozen, data)
    assert [n.op_type for n in fused.graph.node] == ["MLUFusionBlock"]


@pytest.mark.parametrize("name", PRIMITIVE or [pytest.param("unavailable", marks=pytest.mark.skip("no backend data"))])
def test_primitive_families_fuse_and_match(onnx_backend_case, name):
    case = onnx_backend_case(name)
    fused = _fuse_and_compare(case.model, case.datasets)
    blocks = sum(is_fusion_block(n) for n in fused.graph.node)
    assert blocks == (0 if HOST_ONLY in name else 1)


QUANTIZED_PREFIXES = ("test_qlinearconv", "test_qlinearmatmul_", "test_matmulinteger", "test_convinteger_",
                      "test_dynamicquantizelinear", "test_quantizelinear", "test_dequantizelinear")


def _quantized_cases() -> list[str]:
    root, _ = rw_backend.backend_root()
    if root is None:
        return []
    return sorted(p.name for p in root.iterdir() if p.name.startswith(QUANTIZED_PREFIXES))


QUANTIZED = _quantized_cases()


@pytest.mark.parametrize("name", QUANTIZED or [pytest.param("unavailable", marks=pytest.mark.skip("no backend data"))])
def test_quantized_operators_fuse_into_int8_blocks_and_match(onnx_backend_case, name):
    """Models that arrive quantized (docs/precision.md): an INT8 quantized operator runs in an
    INT8 block and reproduces the stored outputs exactly; other integer types (INT16, INT4,
    FP8) stay on the host with their reason."""
    import onnxruntime as ort

    from onnxmlu.schema import block_precision

    case = onnx_backend_case(name)
    inputs, expected = case.datasets[0]
    # The plan and the host reasons are checked first: only the numeric part depends on onnxruntime.
    result = api.fuse(case.model, strategy="all-fusion")
    blocks = [n for n in result.model.graph.node if is_fusion_block(n)]
    if not blocks:
        host = [d for d in result.diagnostics if d.stage != "rewrite"]  # a rewriter may say why it left it too
        assert host and all("quantized units are INT8" in d.message for d in host), result.diagnostics
        return
    assert [block_precision(b) for b in blocks] == ["int8"] and len(result.model.graph.node) == 1
    try:
        ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, dict(zip(case.input_names, inputs)))
    except Exception as error:  # noqa: BLE001 - the reference runtime cannot run the operator
        pytest.skip(f"onnxruntime cannot run the original: {str(error).splitlines()[0][:100]}")
    _fuse_and_compare(case.model, case.datasets, tol=1e-6)
