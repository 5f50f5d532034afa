"""Loading: a model file (external data included) into memory, the one way the package reads
a model it compiles.

``load_model`` turns every way a file can be broken into one :class:`ModelLoadError` line;
given a :class:`~onnxmlu.ir.weights.WeightStore`, it parses the file through a memory map
instead where it can (:class:`~onnxmlu.ir.mapped.MappedModel`: the large weights stay views of
the file, markers in the tree). ``refuse_fused`` stops a model that is already fused from
being fused again.
"""

from __future__ import annotations

import os
from pathlib import Path
import onnx
from onnx.serialization import registry

from onnxmlu.errors import ModelLoadError, OnnxMluError, first_line
from onnxmlu.frontend.extensions import import_runtime_domains
from onnxmlu.ir import iter_graphs
from onnxmlu.ir.mapped import MappedModel
from onnxmlu.ir.weights import WeightStore, all_tensors, is_external, is_marker
from onnxmlu.schema import is_fusion_block


def load_model(path: str | os.PathLike, weights: WeightStore | None = None) -> onnx.ModelProto:
    """Read an ONNX file (and its external data) or raise a one-line ModelLoadError; with
    ``weights``, through the memory map where the file allows it (:func:`_mapped`)."""
    mapped = _mapped(path, weights) if weights is not None else None
    model = mapped if mapped is not None else _parsed(path)
    import_runtime_domains(model)  # onnxruntime runs a contrib op whose domain the file does not import
    return model


def _parsed(path: str | os.PathLike) -> onnx.ModelProto:
    """The file parsed whole by ``onnx.load``, every way it can be broken one line."""
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


def _mapped(path: str | os.PathLike, weights: WeightStore) -> onnx.ModelProto | None:
    """The model file parsed through a memory map, its large weights views of the file in
    ``weights`` and markers in the tree; or None where :func:`_parsed` reads it: a file it
    cannot parse (the one-line errors are _parsed's), a text format, a model with external data
    (onnx.load reads those files)."""
    if registry.get_format_from_file_extension(Path(path).suffix) not in (None, "protobuf"):
        return None
    try:
        model = MappedModel(path).parse(weights)
    except MappedModel.PARSE_ERRORS:  # _parsed says what is wrong with the file
        weights.clear()
        return None
    if not model.HasField("graph") or not model.graph.node or any(
            is_external(t) and not is_marker(t) for t in all_tensors(model.graph)):
        weights.clear()
        return None
    return model


def refuse_fused(model: onnx.ModelProto) -> None:
    blocks = sum(1 for g in iter_graphs(model.graph) for n in g.node if is_fusion_block(n))
    if blocks:
        raise OnnxMluError(f"model is already fused ({blocks} MLUFusionBlock nodes); "
                           "fuse the original model instead")
