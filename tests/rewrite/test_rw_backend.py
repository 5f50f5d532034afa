"""The ONNX backend node tests (onnx 1.22.0) for BN, Gemm, LSTM, GRU and RNN, rewritten.

Each case runs twice: as shipped (every weight is a graph input, so Gemm and the recurrent
rewriters take their dynamic-operand paths and BN must refuse: non-constant statistics) and
"frozen" (every input but the first becomes an initializer, so the constant-folding paths run
and BN applies). The rewritten model must pass the full checker, run in onnxruntime (layout=1
models too, which ORT's own LSTM/GRU/RNN kernels reject) and match the stored outputs at
rtol = atol = 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
from rw_backend import FAMILIES
from rw_util import assert_close, freeze_inputs, full_check, initializer_values, op_types, run_ort

from onnxmlu.rewrite import rewrite_model

REWRITER = {"bn": "bn", "gemm": "gemm", "lstm": "rnn", "gru": "rnn", "rnn": "rnn"}
FORBIDDEN = {"gemm": {"Gemm"}, "lstm": {"LSTM"}, "gru": {"GRU"}, "rnn": {"RNN"}}
CASES = [
    (family, name, mode)
    for family, names in FAMILIES.items()
    for name in names
    for mode in (("substitute", "fold") if family == "bn" else ("substitute",))
]


def _variants(case):
    """(label, model, feeds, expected) for the shipped and the frozen form of each data set."""
    inputs = case.input_names
    for k, (ins, outs) in enumerate(case.datasets):
        feeds = dict(zip(inputs, ins))
        yield f"set{k}", case.model, feeds, outs
        frozen = freeze_inputs(case.model, {n: feeds[n] for n in inputs[1:]})
        yield f"set{k}-frozen", frozen, {inputs[0]: ins[0]}, outs


def _assert_no_weighted_bn(model) -> None:
    values = initializer_values(model)
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            scale, bias = values.get(node.input[1]), values.get(node.input[2])
            assert scale is not None and bias is not None, "BN left with dynamic scale/B"
            assert np.all(scale == 1) and np.all(bias == 0), "weighted BN left after rewrite"


@pytest.mark.parametrize(
    ("family", "name", "bn_mode"), CASES, ids=[f"{n}-{m}" if f == "bn" else n for f, n, m in CASES]
)
def test_backend_node(family, name, bn_mode, onnx_backend_case):
    case = onnx_backend_case(name)
    for label, model, feeds, expected in _variants(case):
        rewritten, report = rewrite_model(model, bn_mode=bn_mode, only=[REWRITER[family]])
        what = f"{name}[{label}]"
        if "training_mode" in name:
            assert report.total == 0, what
            assert any("training" in d.message for d in report.skipped), report.skipped
            assert op_types(rewritten) == ["BatchNormalization"]
            continue
        full_check(rewritten)
        if family == "bn":
            if "frozen" in label:
                assert report.applied == {"bn": 1}, (what, report.skipped)
                _assert_no_weighted_bn(rewritten)
            else:  # parameters fed as inputs: the affine form computed by nodes
                assert report.applied == {"bn": 1}, (what, report.skipped)
                assert "BatchNormalization" not in op_types(rewritten), what
        else:
            assert report.applied[REWRITER[family]] == 1, (what, report.skipped)
            assert not FORBIDDEN[family] & set(op_types(rewritten)), what
        assert_close(run_ort(rewritten, feeds), expected, what=what)


@pytest.mark.parametrize("name", [n for names in FAMILIES.values() for n in names if n.endswith("_batchwise")])
def test_batchwise_runs_only_after_rewrite(name, onnx_backend_case):
    """onnxruntime's LSTM/GRU/RNN kernels reject layout=1; the unrolled model runs and matches."""
    case = onnx_backend_case(name)
    (_, outs), feeds = case.datasets[0], dict(zip(case.input_names, case.datasets[0][0]))
    with pytest.raises(Exception, match="layout"):
        run_ort(case.model, feeds)
    rewritten, report = rewrite_model(case.model)
    assert report.applied["rnn"] == 1
    assert_close(run_ort(rewritten, feeds), outs)
