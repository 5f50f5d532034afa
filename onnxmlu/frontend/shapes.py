"""A type and a shape for every tensor the planner needs, from three sources in turn.

1. onnx's shape inference with data propagation (cheap, exact, but it stops at ops it has no
   schema for and at ``Reshape`` targets computed from ``Shape``/``Gather``/``Concat``);
2. onnxruntime's symbolic shape inference (``sympy``), run only when a tensor still lacks an
   element type, a rank or a dim; its partial result is kept when it cannot finish;
3. a probe: when every model input has a concrete shape (static, or pinned with
   ``--input-shape``) and a tensor of the main graph is still not fully known, the model runs
   once in onnxruntime on zeros with those tensors exposed as outputs, and their concrete
   types and shapes are read back (onnxsim does the same). Models over
   :data:`PROBE_MAX_BYTES` of weights are not probed (it would hold a second copy).

1 and 2 run on the weight-free skeleton (:func:`onnxmlu.ir.weights.infer_on_skeleton`), so
no weight is serialized. Nothing is written to the working directory: onnxruntime's symbolic
inference saves a file there when it cannot finish, so its steps are driven here instead.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import onnx

from onnxmlu.diagnostics import Diagnostic
from onnxmlu.errors import first_line
from onnxmlu.ir import copy_model, fed_inputs, iter_graphs
from onnxmlu.ir.weights import infer_on_skeleton, tensor_payload_bytes

PROBE_MAX_BYTES = 1 << 29
Note = Callable[[Diagnostic], None]


def infer_shapes(model: onnx.ModelProto, note: Note) -> onnx.ModelProto:
    """Sources 1 and 2 on ``model``, in place; returns ``model``."""
    return infer_on_skeleton(model, lambda skel: _infer(skel, note))


def _infer(model: onnx.ModelProto, note: Note) -> onnx.ModelProto:
    from onnxmlu.errors import OnnxMluError

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - reported as the model's fault below
        raise OnnxMluError(f"shape inference failed: {first_line(exc)}") from None
    if not incomplete_tensors(inferred):
        return inferred
    symbolic = _symbolic(inferred, note)
    if symbolic is not None:
        merge_value_infos(iter_graphs(inferred.graph), iter_graphs(symbolic.graph))
    return inferred


def incomplete_tensors(model: onnx.ModelProto) -> list[str]:
    """Node outputs (every graph) without an element type, a rank, or a value or name per dim."""
    missing = []
    for graph in iter_graphs(model.graph):
        known = _value_infos(graph)
        for node in graph.node:
            missing.extend(o for o in node.output if o and not _complete(known.get(o), symbolic_ok=True))
    return missing


def _value_infos(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    found = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}
    return found


def _complete(vi: onnx.ValueInfoProto | None, symbolic_ok: bool) -> bool:
    if vi is None or not vi.type.HasField("tensor_type"):
        return vi is not None and vi.type.WhichOneof("value") is not None  # a sequence, an optional
    tt = vi.type.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return False
    return all(d.HasField("dim_value") or (symbolic_ok and d.dim_param) for d in tt.shape.dim)


def _symbolic(model: onnx.ModelProto, note: Note) -> onnx.ModelProto | None:
    """onnxruntime's symbolic inference, driven step by step so that an unfinished run keeps
    what it found and writes no file (its ``infer_shapes`` saves the model to the current
    directory and raises)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        # int_max, auto_merge, guess_output_rank (no: a guessed type for an op onnxruntime does not
        # know would be declared on a block boundary as if it were known), verbose
        engine = SymbolicShapeInference(2**31 - 1, True, False, 0)
        engine._preprocess(model)
        while engine.run_:
            engine._infer_impl()
        engine._update_output_from_vi()
        return engine.out_mp_
    except Exception as exc:  # noqa: BLE001 - an aid: onnx's result stands
        note(Diagnostic("normalize", "symbolic-inference", "",
                        f"onnxruntime's symbolic shape inference stopped: {first_line(exc)}"))
        return None


def merge_value_infos(targets: Iterable[onnx.GraphProto], sources: Iterable[onnx.GraphProto]) -> None:
    """Per pair of graphs, take the source's value info of a name where it knows more than
    the target's (a type, a rank, more dims)."""
    for graph, other in zip(targets, sources):
        mine = {v.name: v for v in graph.value_info}
        outputs = {o.name: o for o in graph.output}
        for vi in other.value_info:
            old = mine.get(vi.name) or outputs.get(vi.name)
            if old is None:
                graph.value_info.append(vi)
            elif old.type != vi.type and _knowledge(vi) > _knowledge(old):  # equal: the usual case
                old.type.CopyFrom(vi.type)


def _knowledge(vi: onnx.ValueInfoProto) -> tuple[int, int, int]:
    """(has a type, has a rank, dims with a value or a name): more is better."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return (0, 0, 0)
    dims = tt.shape.dim if tt.HasField("shape") else []
    return (int(bool(tt.elem_type)), int(tt.HasField("shape")),
            sum(1 for d in dims if d.HasField("dim_value")) * 2 + sum(1 for d in dims if d.dim_param))


# ----------------------------------------------------------------------------------- probe
def probe_shapes(model: onnx.ModelProto, note: Note, values: dict[str, np.ndarray] | None = None) -> int:
    """Source 3 on the main graph of ``model``, in place: the number of tensors it completed.
    ``values``: the user's arrays (``--inputs``), run instead of zeros where an input's shape
    allows them (a length read from an input must be the user's, not 0)."""
    known = _value_infos(model.graph)
    # a dim inference named (NonZero, TopK by a computed k) depends on data: it must stay
    # symbolic, never become a probed number, so only what lacks a type, a rank or a dim's
    # value and name is probed -- unless the user gave values: the plan is then for those
    wanted = [o for node in model.graph.node for o in node.output
              if o and not _complete(known.get(o), symbolic_ok=not values)]
    if not wanted:
        return 0
    feeds = _zero_feeds(model, values or {})
    if feeds is None:
        return 0
    if tensor_payload_bytes(model) > PROBE_MAX_BYTES:
        note(Diagnostic("normalize", "probe-skipped", "", f"{len(wanted)} tensors have unknown shapes; "
                        "the model is too large to probe them"))
        return 0
    results = _run_probe(model, wanted, feeds, note)
    for name, value in results.items():
        _set_value_info(model.graph, name, value)
    return len(results)


def _zero_feeds(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Zeros (or the value given, when its shape is the input's) for every graph input, or None
    when one has no concrete shape."""
    feeds = {}
    for vi in fed_inputs(model.graph):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape") or not tt.elem_type:
            return None
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if any(d < 0 for d in dims):
            return None
        given = values.get(vi.name)
        zeros = given is None or list(np.shape(given)) != dims
        feeds[vi.name] = np.zeros(dims, dtype=onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)) if zeros else given
    return feeds


def _run_probe(model: onnx.ModelProto, names: list[str], feeds: dict, note: Note) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    probe = copy_model(model)
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names
                              if n not in {o.name for o in probe.graph.output})
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        values = session.run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - the probe is an aid; analysis reports what stays unknown
        note(Diagnostic("normalize", "probe-failed", "", f"running the model on zeros to learn {len(names)} "
                        f"shapes failed: {first_line(exc)}"))
        return {}
    return {n: v for n, v in zip(names, values) if isinstance(v, np.ndarray)}


def _set_value_info(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    vi = onnx.helper.make_tensor_value_info(name, elem, list(value.shape))
    for existing in (*graph.value_info, *graph.output):
        if existing.name == name:
            existing.type.CopyFrom(vi.type)
            return
    graph.value_info.append(vi)

