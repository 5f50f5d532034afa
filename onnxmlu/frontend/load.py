"""Loading: a model file (external data included) into memory.

``load_model`` turns every way a file can be broken into one :class:`ModelLoadError` line;
``refuse_fused`` stops a model that is already fused from being fused again.
"""

from __future__ import annotations

import os
from pathlib import Path
import onnx

from onnxmlu.errors import ModelLoadError, OnnxMluError, first_line
from onnxmlu.ir import iter_graphs
from onnxmlu.schema import is_fusion_block


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read an ONNX file (and its external data) or raise a one-line ModelLoadError."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file {p} does not exist")
    if p.is_dir():
        raise ModelLoadError(f"{p} is a directory, not an ONNX model file")
    if p.stat().st_size == 0:
        raise ModelLoadError(f"model file {p} is empty")
    try:
        model = onnx.load(str(p), load_external_data=True)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, OSError for missing external data, ...
        raise ModelLoadError(f"cannot read {p} as an ONNX model: {first_line(exc)}") from None
    if not model.HasField("graph") or not (model.graph.node or model.graph.output):  # folded: outputs only
        raise ModelLoadError(f"{p} holds no ONNX graph (is it an ONNX model?)")
    return model


def refuse_fused(model: onnx.ModelProto) -> None:
    blocks = sum(1 for g in iter_graphs(model.graph) for n in g.node if is_fusion_block(n))
    if blocks:
        raise OnnxMluError(f"model is already fused ({blocks} MLUFusionBlock nodes); "
                           "fuse the original model instead")
