"""Normalizing: an exported model made regular for the rest of the pipeline.

1. model-local functions are inlined (their layers must reach the planner);
2. input-shape pins (``--input-shape``) are checked against the model, and nothing more: they
   choose the shapes the planner prices (:mod:`onnxmlu.frontend.pins`), never the graph's dims;
3. every graph, subgraphs included, is put in topological order;
4. constants fold, exactly and bounded (:mod:`onnxmlu.frontend.fold`): ``Constant`` nodes,
   weights computed from constants, ``Shape`` of the dims the model itself fixes;
5. every tensor gets a type and a shape (:mod:`onnxmlu.frontend.shapes`).
"""

from __future__ import annotations

import onnx
from onnx import version_converter
from onnx.inliner import inline_local_functions

from onnxmlu.diagnostics import Diagnostic
from onnxmlu.errors import OnnxMluError, first_line
from onnxmlu.frontend.pins import Pins, check_pins, symbolic_axes
from onnxmlu.frontend.extensions import import_runtime_domains, is_runtime_extension
from onnxmlu.frontend.fold import flatten_constant_ifs, fold_constant_nodes, fold_shape_ops, invalid_branch
from onnxmlu.frontend.shapes import infer_shapes, probe_shapes
from onnxmlu.ir import branch_attributes, copy_model, iter_graphs, node_subgraphs, opset_version, sort_graphs
from onnxmlu.ir import unresolved_names
from onnxmlu.ir.weights import WeightStore, tensor_payload_bytes

MIN_OPSET = 7
#: Above this many bytes of tensor data, shape inference runs on a skeleton of the model
#: (see :func:`onnxmlu.frontend.shapes.infer_shapes`) and graphsurgeon's constant folding is skipped.
LIGHT_INFERENCE_BYTES = 2**30


def check_opset(model: onnx.ModelProto) -> None:
    version = opset_version(model)
    if version is None:
        raise OnnxMluError("model imports no version of the standard ONNX domain")
    latest = onnx.defs.onnx_opset_version()
    if version > latest:
        raise OnnxMluError(f"model uses opset {version}, newer than this onnx knows ({latest})")


def normalize(model: onnx.ModelProto, input_shapes: Pins | None = None,
              fold_constants: bool = True, *, diagnostics: list[Diagnostic] | None = None) -> onnx.ModelProto:
    """Make an exported model regular for the rest of the pipeline; returns a new model
    (``model`` is not changed). See :func:`normalize_owned`."""
    own = model if model.functions else copy_model(model)  # inlining makes a new model anyway
    return normalize_owned(own, input_shapes, fold_constants, diagnostics=diagnostics)


def normalize_owned(model: onnx.ModelProto, input_shapes: Pins | None = None,
                    fold_constants: bool = True, *, diagnostics: list[Diagnostic] | None = None,
                    probe_values: dict | None = None, weights: WeightStore | None = None,
                    max_memory: int | None = None) -> onnx.ModelProto:
    """:func:`normalize` for a caller that gives ``model`` away: it is changed in place (no copy
    of every weight) and returned, or a new model when inlining or folding made one.

    Model-local functions are inlined, the input-shape pins checked (they are not applied: the
    graph keeps its symbolic dims), every graph's nodes sorted, constants folded (exactly, see
    :mod:`onnxmlu.frontend.fold`) and every tensor typed and shaped
    (:mod:`onnxmlu.frontend.shapes`); folding and inference alternate while fixed shapes turn
    ``Shape`` nodes into constants. What could not be done is appended to ``diagnostics``.
    ``weights``: the store whose markers ``model`` holds (a file parsed through a map); only
    what must read a marker's value fills it in. ``max_memory``: the shape probe's memory budget
    in bytes (:mod:`onnxmlu.frontend.memory`; None: the default)."""
    note = _unique_appender(diagnostics)
    check_opset(model)
    if opset_version(model) < MIN_OPSET:
        if weights is not None:
            weights.fill_markers(model.graph)  # the converter rewrites weights (PRelu slopes)
        model = _upgrade_opset(model, note)
    elif model.functions:
        model = _inline_functions(model)
    import_runtime_domains(model)  # a model built in memory, not loaded (load_model does it for files)
    check_nodes(model)
    check_pins(model, input_shapes)
    if symbolic_axes(model):
        forget_traced_sizes(model)
    sort_graphs(model.graph)
    if fold_constants and tensor_payload_bytes(model) <= LIGHT_INFERENCE_BYTES:
        model = _fold(model, note, weights)  # graphsurgeon copies every weight: not for huge models
    else:
        model = infer_shapes(model, note)
    probe_shapes(model, note, probe_values, weights, max_memory)  # the user's --inputs, where given
    return model


def forget_traced_sizes(model: onnx.ModelProto) -> int:
    """Make every size an exporter recorded for a tensor other than a graph input unknown
    (types and ranks stay); the count of dims forgotten.

    Exporters that trace at one shape record that shape's sizes in ``value_info`` and in the
    graph outputs even where a dim follows a symbolic input (a CRNN's sequence output declared
    ``[1, 19]`` takes ``[1, 38]`` on a wider image; onnxruntime only warns). A block boundary
    declared with such a size would be allocated at it, so inference decides every size anew."""
    count = 0
    for graph in iter_graphs(model.graph):
        for vi in (*graph.value_info, *graph.output):
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
                continue
            for dim in tt.shape.dim:
                if dim.HasField("dim_value") or dim.HasField("dim_param"):
                    dim.Clear()
                    count += 1
    return count


def _fold(model: onnx.ModelProto, note, weights: WeightStore | None) -> onnx.ModelProto:
    """:func:`_fold_all`, with every branch that folding makes invalid kept as exported.

    Pinned shapes specialize every ``If`` branch, also one the pins never take, and
    onnxruntime type-checks every branch when it loads a model (see
    :func:`~onnxmlu.frontend.fold.invalid_branch`)."""
    if not any(node_subgraphs(n) for n in model.graph.node) or invalid_branch(model) is not None:
        return _fold_all(model, frozenset(), note, weights)
    frozen: frozenset[str] = frozenset()
    for _ in range(MAX_FROZEN_BRANCHES + 1):
        folded = _restore_branches(_fold_all(copy_model(model), frozen, note, weights), model, frozen, note)
        bad = invalid_branch(folded)
        if bad is None and not unresolved_names(folded.graph):
            return folded
        if not bad or bad in frozen:
            break
        note(Diagnostic("normalize", "branch-frozen", bad, "the pinned input shapes make this branch invalid "
                        "(onnxruntime would refuse the model): it is kept as exported"))
        frozen |= {bad}
    note(Diagnostic("normalize", "fold-unsound", "", "folding left a model onnxruntime refuses; "
                    "the model is planned unfolded"))
    return infer_shapes(model, note)


def _fold_all(model: onnx.ModelProto, frozen: frozenset[str], note, weights: WeightStore | None) -> onnx.ModelProto:
    """Fold constants and infer, then rounds of: fold ``Shape`` nodes and constant ``If``
    nodes (outside ``frozen`` branches), fold constants, infer; until nothing is left."""
    model = infer_shapes(model, note)  # the folder bounds what it writes by the inferred sizes
    if needs_folding(model.graph):
        model = infer_shapes(fold_constant_nodes(model, note, weights), note)
    for _ in range(MAX_FOLD_ROUNDS):
        if not fold_shape_ops(model, frozen) + flatten_constant_ifs(model, frozen):
            break
        model = infer_shapes(fold_constant_nodes(model, note, weights), note)
    return model


def _restore_branches(model: onnx.ModelProto, exported: onnx.ModelProto, frozen: frozenset[str],
                      note) -> onnx.ModelProto:
    """Put the ``frozen`` main-graph branches of ``exported`` back into ``model``, typed."""
    if not frozen:
        return model
    originals = dict(branch_attributes(exported.graph))
    for key, attr in branch_attributes(model.graph):
        if key in frozen and key in originals:
            attr.CopyFrom(originals[key])
    return infer_shapes(model, note)


#: Branches a model may have frozen before folding gives up.
MAX_FROZEN_BRANCHES = 4


def _unique_appender(diagnostics: list[Diagnostic] | None):
    """A ``note`` function that records each diagnostic once (fold rounds repeat them)."""
    def note(diagnostic: Diagnostic) -> None:
        if diagnostics is not None and diagnostic not in diagnostics:
            diagnostics.append(diagnostic)
    return note


#: Rounds of (fold Shape nodes and constant Ifs, fold constants, infer): each round can only
#: shrink the graph, and shape chains in exported models are a few ops deep.
MAX_FOLD_ROUNDS = 12


def _upgrade_opset(model: onnx.ModelProto, note) -> onnx.ModelProto:
    """A model older than opset MIN_OPSET (PyTorch's early exporters wrote opset 6) brought to
    it by onnx's version converter; the rewriters start at opset 7."""
    version = opset_version(model)
    try:
        upgraded = version_converter.convert_version(_inline_functions(model) if model.functions else model, MIN_OPSET)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError and its own errors
        raise OnnxMluError(f"model uses opset {version}; onnx's version converter could not bring it to "
                           f"opset {MIN_OPSET}, the oldest onnxmlu supports: {first_line(exc)}") from None
    _channel_slopes(upgraded)
    note(Diagnostic("normalize", "opset-upgraded", "", f"opset {version} converted to {MIN_OPSET} "
                    "with onnx's version converter"))
    return upgraded


def _channel_slopes(model: onnx.ModelProto) -> None:
    """PRelu before opset 7 applied a 1-D slope along the channel axis; from opset 7 it
    broadcasts numpy-style, from the last axis. onnx's converter leaves the slope as it is, so
    a constant slope of C values becomes [C, 1, ..., 1] here."""
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in model.graph.input}
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    ranks.update((vi.name, len(vi.type.tensor_type.shape.dim)) for vi in inferred.graph.value_info
                 if vi.type.tensor_type.HasField("shape"))
    slopes = {t.name: t for t in model.graph.initializer}
    declared = {vi.name: vi for vi in model.graph.input}
    for node in model.graph.node:
        if node.op_type != "PRelu" or node.input[1] not in slopes:
            continue
        slope, rank = slopes[node.input[1]], ranks.get(node.input[0], 0)
        if len(slope.dims) == 1 and slope.dims[0] > 1 and rank > 2:
            slope.dims.extend([1] * (rank - 2))
            if slope.name in declared:  # IR < 4: the weight is a graph input too
                declared[slope.name].CopyFrom(onnx.helper.make_tensor_value_info(
                    slope.name, slope.data_type, list(slope.dims)))


def _inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Model-local functions inlined (their layers must be visible to the planner)."""
    try:
        return inline_local_functions(model)
    except Exception as exc:  # noqa: BLE001 - onnx's inliner rejects malformed functions
        raise OnnxMluError(f"cannot inline the model's local functions: {first_line(exc)}") from None


#: Ops graphsurgeon may fold even with non-constant inputs (their value follows from shapes).
_SHAPE_OPS = frozenset({"Constant", "Shape", "Size"})


def needs_folding(graph: onnx.GraphProto) -> bool:
    """Whether graphsurgeon's fold + cleanup could change the graph: a Constant/Shape/Size node,
    a node whose inputs are all constants, a dead node, or a subgraph (folded recursively).

    One O(nodes) pass, so the import/fold/export round trip (a copy of every weight) is only
    paid by graphs that have something to fold.
    """
    constants = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    for node in graph.node:
        if node.op_type in _SHAPE_OPS or node_subgraphs(node):
            return True
        inputs = [n for n in node.input if n]
        if inputs and all(n in constants for n in inputs):
            return True
    return _has_dead_nodes(graph)


def _has_dead_nodes(graph: onnx.GraphProto) -> bool:
    live = {o.name for o in graph.output}
    for node in reversed(graph.node):  # file order is usually topological; else fold anyway
        if not any(o in live for o in node.output):
            return True
        live.update(node.input)
    return False


def check_nodes(model: onnx.ModelProto) -> None:
    """The ONNX checker's per-node rules (schema, arity, attributes) and single assignment.

    The whole-model checker is stricter than onnxruntime (it wants a shape on every graph
    input and output, and nodes in file order), so only the node rules that onnxruntime also
    enforces are applied; cycles and dangling inputs get their own messages later.
    """
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version or onnx.IR_VERSION
    ctx.opset_imports = {imp.domain: imp.version for imp in model.opset_import}
    opset = opset_version(model)  # an onnxruntime operator onnx lacks: checked by onnxruntime
    producers: dict[str, str] = {}
    for node in model.graph.node:
        label = f"node {node.name or node.op_type!r} ({node.op_type})"
        if not node_subgraphs(node) and not is_runtime_extension(node, opset):
            try:
                onnx.checker.check_node(node, ctx)
            except onnx.checker.ValidationError as exc:
                raise OnnxMluError(f"model fails the ONNX checker: {label}: {first_line(exc)}") from None
        for name in node.output:
            if name and name in producers:
                raise OnnxMluError(f"model fails the ONNX checker: tensor {name!r} is produced by both "
                                   f"{producers[name]} and {label}; ONNX graphs are single-assignment")
            producers[name] = label
