"""Real models from packages people install (see ``corpus``): each fuses with the default
strategy, its symbolic dims pinned, and the fused model runs in plain onnxruntime with only the
custom-op library registered and matches the original (optimizations off) at fp32 tolerance.

Also per model: at least one MLUFusionBlock; no Gemm, LSTM, GRU, RNN or weighted
BatchNormalization outside the blocks, and no standard-domain quantized operator (QuantizeLinear,
QLinearConv, MatMulInteger, ...: models that arrive quantized run them in INT8 blocks) outside
the blocks of the main graph, unless the report gives that node a reason, and every block that
runs one is INT8; ``onnxmlu
check`` with the same pins agrees; weights are not multiplied (the fused model's tensors, bodies
included, weigh about what the original's do) and the file is about the original's size plus the
bodies' framing (an unrolled RNN adds nodes, not weights); nothing is left in the working directory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus  # noqa: E402
from ci import unavailable  # noqa: E402

from onnxmlu.analyze.optable import QUANTIZED_OPS  # noqa: E402
from onnxmlu.cli import app  # noqa: E402
from onnxmlu.ir import iter_graphs  # noqa: E402
from onnxmlu.ir.weights import tensor_payload_bytes  # noqa: E402
from onnxmlu.schema import block_precision, body_model, is_fusion_block  # noqa: E402

pytestmark = pytest.mark.realworld
runner = CliRunner()
RTOL = ATOL = 1e-4
#: Serialized framing of one block (its body's ModelProto, graph, value infos, attributes).
FRAMING_BYTES_PER_BLOCK = 8 << 10
#: What folding may add: shape constants and small folded weights (each at most FOLD_FREE_BYTES).
FOLDED_BYTES = 1 << 20
REWRITTEN = ("Gemm", "LSTM", "GRU", "RNN")


@pytest.fixture
def case_model(request):
    case = request.param
    try:
        return case, corpus.model_path(case)
    except corpus.FetchError as error:
        unavailable(str(error))


@pytest.mark.parametrize("case_model", corpus.MODELS, ids=[c.id for c in corpus.MODELS], indirect=True)
def test_real_model_fuses_runs_matches_and_checks(case_model, library, tmp_path, monkeypatch):
    case, src = case_model
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    out, report_file = tmp_path / "fused.onnx", tmp_path / "report.json"
    result = runner.invoke(app, ["fuse", str(src), str(out), *case.shape_args(), "--json", str(report_file), "-q"])
    assert result.exit_code == 0, result.output
    report, original, fused = json.loads(report_file.read_text()), onnx.load(src), onnx.load(out)

    assert sum(is_fusion_block(n) for n in fused.graph.node) >= 1
    assert _unexplained_leftovers(fused, report) == []
    assert _quantized_blocks_not_int8(fused) == []
    _assert_outputs_match(case, original, out, library)
    _assert_check_agrees(case, original, src, out, tmp_path)
    assert _weight_bytes(fused) <= 1.1 * tensor_payload_bytes(original) + FOLDED_BYTES
    assert out.stat().st_size <= 1.5 * src.stat().st_size + FRAMING_BYTES_PER_BLOCK * (len(report["blocks"]) + 8)
    assert list(workdir.iterdir()) == []


def _weight_bytes(fused: onnx.ModelProto) -> int:
    """Tensor bytes of the fused model with each block counted by its body's own tensors."""
    total = tensor_payload_bytes(fused)
    for node in fused.graph.node:
        if is_fusion_block(node):
            body = next(a.t for a in node.attribute if a.name == "body")
            total -= len(body.raw_data)
            total += tensor_payload_bytes(onnx.load_from_string(body.raw_data))
    return total


def _unexplained_leftovers(fused: onnx.ModelProto, report: dict) -> list[str]:
    """Nodes the accelerator cannot run, outside the blocks, that no diagnostic names."""
    explained = {d["node"] for d in report["diagnostics"]}
    weights = {t.name: onnx.numpy_helper.to_array(t) for g in iter_graphs(fused.graph) for t in g.initializer}
    left = []
    for graph in iter_graphs(fused.graph):
        for node in graph.node:
            weighted_bn = node.op_type == "BatchNormalization" and not _normalization_only(node, weights)
            quantized = graph is fused.graph and node.op_type in QUANTIZED_OPS and node.domain in ("", "ai.onnx")
            if (node.op_type in REWRITTEN or weighted_bn or quantized) and not ({node.name, node.op_type} & explained):
                left.append(f"{node.op_type} {node.name}")
    return left


def _quantized_blocks_not_int8(fused: onnx.ModelProto) -> list[str]:
    """Blocks whose body runs a standard quantized operator but are not INT8."""
    return [node.name for node in fused.graph.node if is_fusion_block(node) and block_precision(node) != "int8"
            and any(n.op_type in QUANTIZED_OPS for n in body_model(node).graph.node)]


def _normalization_only(node: onnx.NodeProto, weights: dict) -> bool:
    scale, bias = (weights.get(n) for n in node.input[1:3])
    return scale is not None and bias is not None and bool(np.all(scale == 1) and np.all(bias == 0))


def _assert_outputs_match(case, original: onnx.ModelProto, fused_path: Path, library: str) -> None:
    reference = ort.SessionOptions()
    reference.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.SessionOptions()
    plain.register_custom_ops_library(library)
    ref = ort.InferenceSession(original.SerializeToString(), reference, providers=["CPUExecutionProvider"])
    sess = ort.InferenceSession(str(fused_path), plain, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    for seed in (0, 1):
        feeds = corpus.feeds(case, original, seed)
        for name, want, got in zip(names, ref.run(names, feeds), sess.run(names, feeds)):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{case.id}: output {name}")


def _assert_check_agrees(case, original: onnx.ModelProto, src: Path, out: Path, tmp_path: Path) -> None:
    """``onnxmlu check`` with the fuse pins; inputs whose values matter (a sample rate, token
    ids) come from the corpus through --inputs."""
    args = ["check", str(src), str(out), *case.shape_args()]
    if case.values:
        fixed = tmp_path / "inputs.npz"
        feeds = corpus.feeds(case, original, 0)
        np.savez(fixed, **{name: feeds[name] for name in case.values})
        args += ["--inputs", str(fixed)]
    result = runner.invoke(app, [*args, "-q"])
    assert result.exit_code == 0, result.output
