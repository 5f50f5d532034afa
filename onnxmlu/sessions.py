"""Every onnxruntime ``SessionOptions`` the package makes comes from here, so that every session
computes quantized arithmetic exactly, whatever the host's CPU.

The maths. An INT8 product layer computes ``acc = sum_k (a_k - z_a)(w_k - z_w)`` in 32 bits and
then rescales ``acc``. onnxruntime's optimizer turns such layers (QDQ pairs around Conv/MatMul/
Gemm, QLinearConv, QLinearMatMul, MatMulInteger, DynamicQuantizeLSTM, ...) into u8 x s8 kernels;
on x86 CPUs without VNNI (SSE4.1, AVX2, AVX-512 without VNNI) those kernels multiply with
``pmaddubsw``, which adds *pairs* of 8-bit products in 16 bits and saturates:
``255 * 127 + 255 * 127 = 64770 > 32767``. The result then depends on the CPU (measured under
``qemu-x86_64 -cpu Skylake-Client`` by tests/precision/exact_int8_check.py: a QDQ Conv's output
off by 4 quantization steps, a MatMulInteger's accumulator by 134358). With the session config entry
``session.x64quantprecision`` = ``1`` (:data:`EXACT_INT8_KEY`) onnxruntime's optimizer
rewrites constant s8 weights to u8 (``w + 128``, zero point ``+ 128``: the same integers
``w - z_w``) and runs u8 x u8 kernels, which widen to 16 bits before ``pmaddwd`` and so
accumulate exactly in 32 bits. onnxruntime applies it on VNNI hosts too, whose u8 x s8 kernels
(``vpdpbusd``: four products summed into 32 bits) are exact already: the same integers from
kernels measured 1.2-2.1x slower there (scripts/int8_exact_cost.py). So the entry is set only
where the default kernels are not exact (:func:`default_kernels_exact`: x86 without AVX-512
VNNI, as onnxruntime's MLAS dispatches; AVX-VNNI-only CPUs get the entry, exact either way).

Gaps of that entry, closed here, in :mod:`onnxmlu.runtime.session` and in the fuse:

* it is an optimizer pass: a session with every optimization off (the numerical reference)
  runs the model's own QOperator nodes with their s8 weights, saturating.
  :func:`exact_integer_weights` applies the same identity (``w ^ 0x80``, ``z_w ^ 0x80``) to the
  model itself for u8-activation integer nodes (the list of onnxruntime's pass, which the reference
  must cover whole: MatMulIntegerToFloat and QGemm saturated there too, by 254059 and 246218 on an int32-sized
  product under Skylake-Client, QAttention by 0.083 on attention outputs up to 0.34);
* onnxruntime applies it to QLinearConv / QLinearMatMul (opset < 21) also when the
  *activation* is s8, and then finds no (s8, u8) kernel: the session cannot be created.
  s8 x s8 kernels widen before multiplying (exact on every x86: the ``qlinear_conv_s8`` case of
  tests/precision/exact_int8_check.py), so a model holding such a node in any of its graphs is
  given the options without the entry (:func:`needs_default_kernels`), and the library retries
  such a body without it; the body's u8-activation integer nodes then get u8 weights at fuse time
  (:func:`unshare_dequantized_weights`), exact without the entry, and so do the weights its
  QDQ products with u8 activations dequantize (onnxruntime's QDQ fusion made them u8 x s8
  kernels: 5 output steps off under Skylake-Client, ``s8_conv_and_u8_qdq_conv``);
* its pass matches QLinearMatMul only at since-version 10 (onnxruntime 1.32), so a QLinearMatMul
  of opset 21 or later with u8 activations and s8 weights kept them and saturated inside a block
  on x86 without VNNI (35 output steps under Skylake-Client). The fuse gives such a node u8
  weights itself (:mod:`onnxmlu.rewrite.qlinearmatmul`), on every host, so the file no longer
  depends on the entry for it;
* it fails on a quantized weight that several readers share (DequantizeLinear readers, also one
  whose output leaves the block; QOperator readers: QLinearConv, QLinearMatMul, MatMulInteger
  after DynamicQuantizeLinear), after which the library's retry without it ran the saturating
  kernels silently and ``--precision auto``'s trials could not load at all: INT8 bodies give
  each reader its own copy (:func:`unshare_dequantized_weights`), so the library's retry serves
  only files written elsewhere, and warns there (custom_ops/inner_session.cc);
* it runs only where onnxruntime's pass reaches: not an opset-21 QLinearMatMul, nor a weight an
  If's branch reads from the outer scope. The evaluator and calibration, which load a model
  arriving quantized whole, load it through :func:`exact_loadable` (u8 weights, unshared readers);
  ``onnxmlu.InferenceSession`` and the plain session benchmarks time through
  :func:`onnxmlu.runtime.loadable_source`, which does the same to a model file whose weights are
  in external files without reading them (a copy per reader refers to the same bytes; a u8
  weight is ``Cast(Cast(w, int32) + 128, uint8)``, nodes onnxruntime folds at load).
"""

from __future__ import annotations

import functools
import importlib
import platform

import numpy as np
import onnx
from onnx import numpy_helper

from onnxmlu import ortlog
from onnxmlu.ir import is_default_domain, iter_graphs, node_subgraphs
from onnxmlu.optional import optional_import
from onnxmlu.ir.weights import is_external, is_marker
from onnxmlu.schema import is_placeholder

#: onnxruntime's session config key for exact u8 x u8 kernels on x86 without VNNI.
EXACT_INT8_KEY = "session.x64quantprecision"

#: Integer product nodes whose activation is quantized to u8: op type -> (activation zero
#: point index or None when always u8, [(weight index, weight zero point index), ...]).
#: The weight pairs are onnxruntime's own list (its Avx2WeightS8ToU8Transformer). Of
#: com.microsoft's other quantized ops, QLinearAdd/QLinearMul/QLinearConcat/... multiply no u8 x s8
#: pairs (elementwise, requantized in float) and QOrderedMatMul is CUDA-only s8 x s8: none saturates.
U8_ACTIVATION_NODES: dict[str, tuple[int | None, list[tuple[int, int]]]] = {
    "QLinearConv": (2, [(3, 5)]),
    "QLinearMatMul": (2, [(3, 5)]),
    "MatMulInteger": (2, [(1, 3)]),
    "DynamicQuantizeMatMul": (None, [(1, 3)]),
    "MatMulIntegerToFloat": (4, [(1, 5)]),
    "QGemm": (2, [(3, 5)]),
    "DynamicQuantizeLSTM": (None, [(1, 9), (2, 11)]),
    "QAttention": (6, [(1, 7)]),  # input, weight, bias, input/weight scale, mask, zero points
}

#: Nodes onnxruntime cannot run with :data:`EXACT_INT8_KEY` when their activation is s8.
_S8_ACTIVATION_REFUSED = ("QLinearConv", "QLinearMatMul")

_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "all": "ORT_ENABLE_ALL"}


def new_options(level: str = "all", *, log_severity: int | None = None, model: onnx.ModelProto | None = None,
                exact: bool = True):
    """``onnxruntime.SessionOptions`` at optimization ``level`` ("disable", "basic", "all")
    with exact INT8 arithmetic (:data:`EXACT_INT8_KEY`), unless ``model`` holds a node that
    onnxruntime cannot load with it (:func:`needs_default_kernels`). ``exact=False``: onnxruntime's
    default kernels, only to measure what exactness costs (scripts/int8_exact_cost.py)."""
    ort = optional_import("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    # never more verbose than the severity the command line chose (onnxmlu.ortlog)
    options.log_severity_level = max(options.log_severity_level if log_severity is None else log_severity,
                                     ortlog.severity())
    if exact and not default_kernels_exact() and (model is None or not needs_default_kernels(model)):
        options.add_session_config_entry(EXACT_INT8_KEY, "1")
    return options


def config_entry(options, key: str) -> str | None:
    """The value of session config entry ``key`` in ``options``; None when it is not set."""
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # "SessionOptions does not have configuration with key: ..."
        return None


def exact_int8(options, model: onnx.ModelProto | None = None):
    """``options`` (a caller's) with :data:`EXACT_INT8_KEY` set unless the caller set it;
    returns them."""
    if config_entry(options, EXACT_INT8_KEY) is None and not default_kernels_exact() and \
            (model is None or not needs_default_kernels(model)):
        options.add_session_config_entry(EXACT_INT8_KEY, "1")
    return options


@functools.cache
def default_kernels_exact() -> bool:
    """Whether onnxruntime's default integer kernels are exact on this CPU: not x86 (the entry
    is x86-only), or x86 with AVX-512 VNNI usable (numpy reads CPUID and the OS's AVX-512
    state, as MLAS does; under an emulator, the emulated CPU's)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    umath = importlib.import_module("numpy._core._multiarray_umath" if hasattr(np, "_core")
                                    else "numpy.core._multiarray_umath")
    return bool(umath.__cpu_features__.get("AVX512VNNI"))


def needs_default_kernels(model: onnx.ModelProto) -> bool:
    """Whether any graph of ``model`` (If branches, Loop and Scan bodies: onnxruntime's pass
    rewrites them too) holds a QLinearConv/QLinearMatMul with an s8 activation zero point:
    onnxruntime (1.32) rewrites its weight to u8 under :data:`EXACT_INT8_KEY` and then has no
    kernel for it. Its s8 x s8 kernel is exact without the entry."""
    return _refuses_entry(model.graph, {})


def _refuses_entry(graph: onnx.GraphProto, outer: dict) -> bool:
    """:func:`needs_default_kernels` for ``graph``, whose nodes see ``outer``'s initializers
    unless one of its own has the name."""
    inits = {**outer, **{t.name: t for t in graph.initializer}}
    if any(n.op_type in _S8_ACTIVATION_REFUSED and is_default_domain(n.domain) and len(n.input) > 2
           and n.input[2] in inits and inits[n.input[2]].data_type == onnx.TensorProto.INT8 for n in graph.node):
        return True
    return any(_refuses_entry(sub, inits) for n in graph.node for sub in node_subgraphs(n))


def exact_integer_weights(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each constant s8 weight (and its s8 zero point) of a u8-activation
    integer node of any graph (If branches, Loop bodies: the copy is a main-graph initializer,
    which they see) to u8 by ``^ 0x80`` (``w + 128``, ``z + 128``: every ``w - z`` unchanged),
    so that even an unoptimized session runs exact u8 x u8 kernels. A missing weight zero point
    (0) becomes an explicit 128. Returns the nodes rewritten."""
    return _exact_integer_weights_in(model.graph)


def _exact_integer_weights_in(main: onnx.GraphProto) -> int:
    """:func:`exact_integer_weights` of ``main`` and its subgraphs (the copies: ``main``'s)."""
    graphs = list(iter_graphs(main))
    inits = {t.name: t for g in graphs for t in g.initializer}
    types = {v.name: v.type.tensor_type.elem_type for g in graphs for v in [*g.input, *g.value_info]}
    count = 0
    for node in [n for g in graphs for n in g.node]:  # a list: flips may add nodes
        spec = U8_ACTIVATION_NODES.get(node.op_type)
        if spec is None or not _u8_activation(node, spec[0], inits, types):
            continue
        pairs = [(w, z) for w, z in spec[1] if _flippable(node, w, z, inits)]
        if node.op_type == "DynamicQuantizeLSTM" and (len(pairs) != 2 or not all(_uniform(node, z, inits)
                                                                                  for _, z in pairs)):
            continue  # W and R share one type; onnxruntime reads one zero point per u8 weight here
        for weight, zero in pairs:
            _flip_into(main, node, weight, inits, default_shape=None)
            _flip_into(main, node, zero, inits, default_shape=())
        count += bool(pairs)
    _drop_unread(main)
    return count


def _drop_unread(graph: onnx.GraphProto) -> None:
    """Remove initializers no node or output reads any more (the s8 originals)."""
    read = {i for g in iter_graphs(graph) for n in g.node for i in n.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in read]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _u8_activation(node: onnx.NodeProto, index: int | None, inits: dict, types: dict) -> bool:
    """Whether the node's activation (input 0) is u8: by its zero point's type, else by its own
    declared type (an unknown one: no)."""
    if index is None:
        return True
    if len(node.input) > index and node.input[index]:
        zero = inits.get(node.input[index])
        return zero is not None and zero.data_type == onnx.TensorProto.UINT8
    return types.get(node.input[0]) == onnx.TensorProto.UINT8


def _flippable(node: onnx.NodeProto, weight: int, zero: int, inits: dict) -> bool:
    has_weight = len(node.input) > weight and _s8_initializer(node.input[weight], inits)
    zero_name = node.input[zero] if len(node.input) > zero else ""
    s8_zero = _s8_initializer(zero_name, inits)
    return has_weight and (zero_name == "" or s8_zero)


def _uniform(node: onnx.NodeProto, zero: int, inits: dict) -> bool:
    """Whether a zero point is one value (absent: 0); one in an external file is not read: no."""
    name = node.input[zero] if len(node.input) > zero else ""
    if name and is_external(inits[name]):
        return False
    values = numpy_helper.to_array(inits[name]) if name else None
    return values is None or bool(np.all(values == values.flat[0]))


def _flip_into(graph: onnx.GraphProto, node: onnx.NodeProto, index: int, inits: dict, default_shape) -> None:
    """Point ``node.input[index]`` at a u8 copy (``^ 0x80``) of its s8 initializer (an absent
    zero point: 0); of one whose bytes are in an external file, the copy computed by nodes
    (:func:`_flipped_by_nodes`)."""
    name = node.input[index] if len(node.input) > index else ""
    flipped_name = f"{name or (node.name or node.output[0]) + '_zero_point'}_exact_u8_{index}"
    if flipped_name not in inits and name and is_external(inits[name]):
        inits[flipped_name] = _flipped_by_nodes(graph, inits[name], flipped_name)
    elif flipped_name not in inits:
        values = numpy_helper.to_array(inits[name]) if name else np.zeros(default_shape, np.int8)
        flipped = numpy_helper.from_array((values.view(np.uint8) ^ 0x80).astype(np.uint8), flipped_name)
        graph.initializer.append(flipped)
        inits[flipped.name] = flipped
    while len(node.input) <= index:
        node.input.append("")
    node.input[index] = flipped_name


#: The int32 constant :func:`_flipped_by_nodes` adds (one per graph).
_OFFSET = "onnxmlu_exact_u8_offset"


def _flipped_by_nodes(graph: onnx.GraphProto, tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    """``name`` := ``Cast(Cast(tensor, int32) + 128, uint8)``, nodes put first in ``graph``: the
    same u8 copy, its bytes never read here (a weight in an external file: a model of any size).
    onnxruntime's constant folding makes it an initializer when the session loads, before its
    integer passes look at the weights. Returns a data-less TensorProto of the copy's type."""
    if not any(t.name == _OFFSET for t in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(np.int32(128), _OFFSET))
    # int32: Add has no 8- or 16-bit integer kernels before opset 14
    nodes = [onnx.helper.make_node("Cast", [tensor.name], [f"{name}_wide"], to=onnx.TensorProto.INT32),
             onnx.helper.make_node("Add", [f"{name}_wide", _OFFSET], [f"{name}_shifted"]),
             onnx.helper.make_node("Cast", [f"{name}_shifted"], [name], to=onnx.TensorProto.UINT8)]
    for node in reversed(nodes):
        graph.node.insert(0, node)
    return onnx.TensorProto(name=name, data_type=onnx.TensorProto.UINT8, dims=tensor.dims)


def unshare_dequantized_weights(graph: onnx.GraphProto) -> int:
    """Give every reader of a constant s8 weight that onnxruntime's exact INT8 pass rewrites its
    own copy of that weight and its zero point, in every graph of a body (in place; returns the
    copies made). Why: under :data:`EXACT_INT8_KEY` onnxruntime (1.32) rewrites each such s8
    weight to u8 under one name derived from the weight's; the second reader of a shared weight
    adds that name again and session creation fails ("Attempt to replace the existing tensor"),
    after which a session retried without the entry runs the saturating kernels (3.5 off on
    outputs up to 3.6 under Skylake-Client, tests/precision/auto_plan_check.py). The readers are

    * a DequantizeLinear of the weight: onnxruntime first gives each reader of its output (a
      graph output counts) its own copy of the node, so the fuse does that itself;
    * a u8-activation integer node's weight slot (:data:`U8_ACTIVATION_NODES`: QLinearConv,
      QLinearMatMul, MatMulInteger after a DynamicQuantizeLinear, ...), the QOperator form.

    A weight read by several nodes costs a copy per reader.

    A body holding an s8-activation QLinearConv/QLinearMatMul (:func:`needs_default_kernels`)
    loads only without the entry (the library retries it so, silently: its s8 x s8 kernels are
    exact), and then its u8-activation integer nodes would saturate (198470 on a MatMulInteger
    beside such a QLinearConv under Skylake-Client): their weights are made u8 here
    (:func:`exact_integer_weights`), and so are its QDQ products' (:func:`_exact_dequantized_weights_in`),
    exact with or without the entry."""
    refuses = _refuses_entry(graph, {})
    if refuses:
        _exact_integer_weights_in(graph)
    copies = 0
    for sub in iter_graphs(graph):
        inits = {t.name: t for t in sub.initializer}
        claimed: set[str] = set()
        _split_dequantize_readers(sub, inits)
        for node in sub.node:
            copies += _own_inputs(sub, node, _weight_slots(node, inits), inits, claimed)
    if refuses:  # after the split: one product per weight DequantizeLinear
        _exact_dequantized_weights_in(graph)
    return copies


#: Float products onnxruntime's QDQ fusion turns, with DequantizeLinear on both inputs, into
#: integer kernels (QLinearConv, QLinearMatMul, QGemm, ...): u8 x s8 ones when the activation
#: is u8 and the weight s8.
_QDQ_PRODUCTS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def _exact_dequantized_weights_in(main: onnx.GraphProto) -> int:
    """Give each constant s8 weight's DequantizeLinear (one reader each, in any graph) whose
    readers are QDQ products with an activation that is not s8 u8 weights, in place: ``w ^ 0x80``
    and ``z ^ 0x80`` (an absent zero point: 128, the scale's shape), so that
    ``(w + 128) - (z + 128) = w - z``: the same floats, and onnxruntime's QDQ fusion makes the
    product a u8 x u8 kernel, exact without :data:`EXACT_INT8_KEY`, where it would make a
    saturating u8 x s8 one. Needed only in a graph that must load without the entry
    (:func:`needs_default_kernels`): with it onnxruntime does the same itself. An s8 activation
    keeps s8 weights (s8 x s8 kernels are exact; a u8 weight there would stop the fusion).
    Returns the DequantizeLinear nodes rewritten."""
    graphs = list(iter_graphs(main))
    inits = {t.name: t for g in graphs for t in g.initializer}
    types = {v.name: v.type.tensor_type.elem_type for g in graphs for v in [*g.input, *g.value_info]}
    producers = {o: n for g in graphs for n in g.node for o in n.output}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in (n for g in graphs for n in g.node):
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
    count = 0
    for node in [n for g in graphs for n in g.node]:  # a list: flips may add nodes
        uses = readers.get(node.output[0], []) if node.op_type == "DequantizeLinear" else []
        if not uses or not _s8_initializer(node.input[0], inits) or not _has_zero_point_shape(node, inits) or \
                not all(_not_s8_product(reader, index, producers, inits, types) for reader, index in uses):
            continue
        shape = tuple(inits[node.input[1]].dims)
        _flip_into(main, node, 0, inits, default_shape=None)
        _flip_into(main, node, 2, inits, default_shape=shape)
        count += 1
    _drop_unread(main)
    return count


def _has_zero_point_shape(node: onnx.NodeProto, inits: dict) -> bool:
    """Whether a weight DequantizeLinear's zero point can be flipped: an s8 initializer, or absent
    with the scale an initializer (whose shape the explicit one takes)."""
    zero = node.input[2] if len(node.input) > 2 else ""
    if zero:
        return zero in inits and inits[zero].data_type == onnx.TensorProto.INT8
    return node.input[1] in inits


def _not_s8_product(reader: onnx.NodeProto, index: int, producers: dict, inits: dict, types: dict) -> bool:
    """Whether ``reader`` is a QDQ product (:data:`_QDQ_PRODUCTS`) reading a weight at input
    ``index`` (0 or 1) beside an activation that a DequantizeLinear of a tensor not known to be
    s8 gives (by its zero point's type, else by its input's declared type)."""
    if reader.op_type not in _QDQ_PRODUCTS or not is_default_domain(reader.domain) or index > 1 \
            or len(reader.input) < 2:
        return False
    activation = producers.get(reader.input[1 - index])
    if activation is None or activation.op_type != "DequantizeLinear":
        return False
    zero = activation.input[2] if len(activation.input) > 2 else ""
    if zero:
        return zero not in inits or inits[zero].data_type != onnx.TensorProto.INT8
    return types.get(activation.input[0]) != onnx.TensorProto.INT8


def exact_loadable(model: onnx.ModelProto) -> bytes:
    """``model``'s bytes for a session of the package's options where they set
    :data:`EXACT_INT8_KEY` (a model arriving quantized, loaded whole by the evaluator or by
    calibration): where the model holds a u8-activation integer node or a quantized weight with
    several readers, a copy's bytes with the node's weights made u8 (:func:`exact_integer_weights`:
    also where onnxruntime's pass does not reach, an opset-21 QLinearMatMul or a weight from an
    If's outer scope) and every dequantized weight's reader given its own
    (:func:`unshare_dequantized_weights`), so that the session loads and computes exactly; else
    ``model``'s own bytes."""
    loadable = None if default_kernels_exact() else loadable_with_exact_entry(model)
    return model.SerializeToString() if loadable is None else loadable


def holds_u8_activation_nodes(model: onnx.ModelProto) -> bool:
    """Whether a graph of ``model`` holds a node of :data:`U8_ACTIVATION_NODES` (whose weights
    :func:`exact_integer_weights` makes u8)."""
    return any(n.op_type in U8_ACTIVATION_NODES for g in iter_graphs(model.graph) for n in g.node)


def loadable_with_exact_entry(model: onnx.ModelProto) -> bytes | None:
    """What :func:`exact_loadable` gives where :data:`EXACT_INT8_KEY` is set, whatever the host
    (a caller's options may set it on any x86 CPU: onnxruntime then applies it); None where
    ``model`` holds no node that needs a change (load it as it is)."""
    if not holds_u8_activation_nodes(model) and not any(_shares_weights(g) for g in iter_graphs(model.graph)):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    exact_integer_weights(copy)
    unshare_dequantized_weights(copy.graph)
    return copy.SerializeToString()


def _shares_weights(graph: onnx.GraphProto) -> bool:
    """Whether a weight of ``graph`` has several readers :func:`unshare_dequantized_weights` splits."""
    inits = {t.name: t for t in graph.initializer}
    slots = [n.input[i] for n in graph.node for i in _weight_slots(n, inits) if i < len(n.input)]
    weights = [s for s in slots if _s8_initializer(s, inits)]
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and _weight_slots(n, inits)}
    reads = [name for n in graph.node for name in n.input if name in dequantized]
    reads += [o.name for o in graph.output if o.name in dequantized]
    return len(set(weights)) < len(weights) or len(set(reads)) < len(reads)


def _weight_slots(node: onnx.NodeProto, inits: dict) -> tuple[int, ...]:
    """The inputs of ``node`` onnxruntime's exact INT8 pass may rewrite (weights, zero points);
    an activation's DequantizeLinear has none."""
    if node.op_type == "DequantizeLinear":
        return (0, 2) if _s8_initializer(node.input[0], inits) else ()
    spec = U8_ACTIVATION_NODES.get(node.op_type)
    return () if spec is None else tuple(i for pair in spec[1] for i in pair)


def _split_dequantize_readers(graph: onnx.GraphProto, inits: dict) -> None:
    """One reader per DequantizeLinear of an s8 initializer: a clone per further reader (every
    node reader when the output is also a graph output, which keeps the original)."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
    outputs = {o.name for o in graph.output}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        if node.op_type != "DequantizeLinear" or not _s8_initializer(node.input[0], inits):
            continue
        uses = readers.get(node.output[0], [])
        first = 0 if node.output[0] in outputs else 1
        for k, (reader, index) in enumerate(uses[first:], start=1):
            clone = onnx.NodeProto()
            clone.CopyFrom(node)
            clone.name, clone.output[0] = f"{node.name}_use{k}", f"{node.output[0]}_use{k}"
            reader.input[index] = clone.output[0]
            nodes.append(clone)
    del graph.node[:]
    graph.node.extend(nodes)


def _s8_initializer(name: str, inits: dict) -> bool:
    """An s8 initializer of the graph, its bytes in it or in an external file (a copy refers to
    the same bytes); not a shared weight's placeholder (one tensor outside the body, never
    copied: :func:`onnxmlu.schema.placeholder`) nor a weight store's marker (a mapped model's
    weight, one tensor of the store: :func:`onnxmlu.ir.weights.is_marker`)."""
    return name in inits and inits[name].data_type == onnx.TensorProto.INT8 and \
        not is_placeholder(inits[name]) and not is_marker(inits[name])


def _own_inputs(graph: onnx.GraphProto, node: onnx.NodeProto, slots: tuple[int, ...], inits: dict,
                claimed: set[str]) -> int:
    """Point ``node``'s ``slots`` (weights, zero points) at copies where an earlier reader
    claimed them already."""
    copies = 0
    for index in slots:
        name = node.input[index] if len(node.input) > index else ""
        if not _s8_initializer(name, inits):
            continue
        if name in claimed:
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = f"{name}_{node.name or node.output[0]}_{index}"
            graph.initializer.append(copy)
            node.input[index] = name = copy.name
            copies += 1
        claimed.add(name)
    return copies
