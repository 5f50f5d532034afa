"""Each output dim of a block as a function of its input dims: the body metadata :data:`DIMS_KEY`.

A block whose outputs have symbolic dims cannot be allocated before its inner session runs,
unless their sizes are known from the input shapes of the run. Where every step has new
shapes (a decoder's KV cache, ``present = Concat(past, new)`` along the sequence axis, one
token longer each step), learning shapes per set of input shapes (:mod:`.outputs`) never pays:
the library would copy every present cache out of the block at every token. Here each output
dim is written as a polynomial over the body's input dims, which the library evaluates at the
run's input shapes (custom_ops/dim_expr.h has the grammar):

* a fixed size ``d`` is the literal ``d``;
* a dim named like an input's dim (the same ``dim_param``, the model's own symbol or the one
  shape inference merged it into) is ``i<k>.<a>``: axis ``a`` of body input ``k``, the first
  input, then the first axis, that has it;
* any other symbolic dim is taken from shape inference of the body alone: first onnx's own
  (a dim carried unchanged keeps its input's name; milliseconds), then the polynomial tier of
  :mod:`onnxmlu.collapse.polydims` (no sympy: it settles an output with the engine's own text,
  or proves it has none, ``?``), then, for outputs still open, onnxruntime's symbolic engine
  (:func:`onnxmlu.frontend.symbolic.symbolic_infer`: merged dims named by a fixed rule),
  which writes what it derives as a sympy expression over the input symbols
  (``past_sequence_length + sequence_length`` for a Concat, ``2*W + 1``, ``H*D`` for a Reshape
  that merges heads); an expression of integers, input symbols, ``+``, ``-`` and ``*`` only is
  rewritten over the input dims, anything else (``floor``, ``/``, ``Max``, a symbol no input
  holds) leaves the output's shape unknown: ``?``, and the library copies it as before.

The text is a function of the body alone (inputs and axes in order, sympy's printing is
canonical), so fused bytes stay a function of the model and the options. A wrong expression
costs no correctness: the library checks its first run against the inner session's shapes and
stops using the metadata of a block whose run disagrees.
"""

from __future__ import annotations

import ast
import logging
from typing import Sequence

import onnx

from onnxmlu.collapse import polydims
from onnxmlu.errors import first_line
from onnxmlu.frontend.symbolic import symbolic_infer
from onnxmlu.ir.weights import SKELETON_MIN_TENSOR_BYTES, is_marker, skeleton, tensor_bytes
from onnxmlu.schema import OUTPUT_DIMS_KEY, UNKNOWN_DIM

#: Body metadata key and the unknown dim (onnxmlu/schema.py: the file format).
DIMS_KEY, UNKNOWN = OUTPUT_DIMS_KEY, UNKNOWN_DIM

_LOG = logging.getLogger(__name__)
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def output_dims_text(body: onnx.ModelProto, absent: Sequence[onnx.TensorProto] = ()) -> str | None:
    """The :data:`DIMS_KEY` value of ``body`` (module docstring), or None when no output with a
    symbolic dim can be expressed. ``absent``: constants of the body not in its graph yet (the
    streamed fuse splices them into the bytes later), seen by the inference as the body's own."""
    graph = body.graph
    refs = _input_refs(graph)
    texts = [_output_text(_dims(vi), refs, None) for vi in graph.output]
    pending = {k for k, text in enumerate(texts) if text == UNKNOWN}
    light = None
    for infer, proves in _INFERENCES:
        if not pending:
            break
        light = light or _light_body(body, absent)
        inferred = infer(light)
        for k in sorted(pending):
            dims = inferred[k] if k < len(inferred) else None
            texts[k] = _output_text(_dims(graph.output[k]), refs, dims)
            if texts[k] != UNKNOWN or (proves and _settled(_dims(graph.output[k]), refs, dims)):
                pending.discard(k)
    expressed = [t for t, vi in zip(texts, graph.output) if t != UNKNOWN and _is_symbolic(vi)]
    return ";".join(texts) if expressed else None


def _settled(declared: list | None, refs: dict[str, str], inferred: list | None) -> bool:
    """Whether ``?`` is the answer for an output (no later tier is asked): the polynomial tier
    gave its rank and, on every axis the declared dims leave open, a dim or a proof that none is
    a polynomial; :data:`onnxmlu.collapse.polydims.UNKNOWN` axes go on to the engine."""
    if inferred is None or (declared is not None and len(declared) != len(inferred)):
        return False
    declared = declared or [None] * len(inferred)
    return all(_dim_text(d, refs) is not None or i is not _UNSETTLED for d, i in zip(declared, inferred))


def _output_text(dims: list | None, refs: dict[str, str], inferred: list | None) -> str:
    """One output's dims as text, or :data:`UNKNOWN`; ``inferred``: the symbolic engine's dims."""
    if dims is None:  # an unknown rank: the engine's, where it found one
        dims = [None] * len(inferred) if inferred is not None else None
    if dims is None or (inferred is not None and len(inferred) != len(dims)):
        return UNKNOWN
    out = []
    for axis, dim in enumerate(dims):
        text = _dim_text(dim, refs)
        if text is None and inferred is not None:
            text = _dim_text(inferred[axis], refs)
        if text is None:
            return UNKNOWN
        out.append(text)
    return ",".join(out)


def _dim_text(dim, refs: dict[str, str]) -> str | None:
    if isinstance(dim, int):
        return str(dim) if dim >= 0 else None
    if not isinstance(dim, str):
        return None
    if dim in refs:
        return refs[dim]
    try:
        tree = ast.parse(dim, mode="eval").body
    except SyntaxError:  # a dim name that is no expression: no input holds it
        return None
    text = _expression(tree, refs)
    wrapped = isinstance(tree, (ast.BinOp, ast.UnaryOp)) and text is not None
    return text[1:-1] if wrapped else text  # the outermost parentheses say nothing


def _expression(node: ast.AST, refs: dict[str, str]) -> str | None:
    """``node`` over integers, input symbols, + - * (and unary minus) as the library's grammar."""
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        return str(node.value)
    if isinstance(node, ast.Name):
        return refs.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _expression(node.operand, refs)
        return None if operand is None else f"(0-{operand})"
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _expression(node.left, refs), _expression(node.right, refs)
        if left is None or right is None:
            return None
        return f"({left}{_OPS[type(node.op)]}{right})"
    return None


def _input_refs(graph: onnx.GraphProto) -> dict[str, str]:
    """Each input dim name -> ``i<k>.<a>`` of its first input, then first axis."""
    refs: dict[str, str] = {}
    for k, vi in enumerate(graph.input):
        for axis, dim in enumerate(_dims(vi) or ()):
            if isinstance(dim, str):
                refs.setdefault(dim, f"i{k}.{axis}")
    return refs


def _dims(vi: onnx.ValueInfoProto) -> list | None:
    """Per axis its size, its name, or None; None for an unknown rank or a non-tensor."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def _is_symbolic(vi: onnx.ValueInfoProto) -> bool:
    dims = _dims(vi)
    return dims is None or not all(isinstance(d, int) for d in dims)


def _light_body(body: onnx.ModelProto, absent: Sequence[onnx.TensorProto]) -> onnx.ModelProto:
    """``body`` for inference from its inputs alone: large constants as typed inputs, the
    declared output shapes and inner value infos cleared, so nothing but the inputs decides."""
    light = skeleton(body)
    del light.graph.value_info[:]
    for tensor in absent:  # as skeleton() holds a constant: small ones with their values, the rest typed inputs
        if tensor_bytes(tensor) < SKELETON_MIN_TENSOR_BYTES and not is_marker(tensor):
            light.graph.initializer.append(tensor)
        else:
            typed = onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            light.graph.input.append(typed)
    for vi in light.graph.output:
        vi.type.tensor_type.ClearField("shape")
    return light


def _onnx_inferred_dims(light: onnx.ModelProto) -> list:
    """The output dims onnx's own shape inference gives ``light`` (C++, milliseconds): a dim it
    carries unchanged keeps its input's name; [] when it stops."""
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - an aid: the symbolic engine is tried next
        _LOG.debug("onnx shape inference of a block body stopped: %s", first_line(exc))
        return []
    return [_dims(vi) for vi in inferred.graph.output]


def _symbolic_inferred_dims(light: onnx.ModelProto) -> list:
    """The output dims onnxruntime's symbolic inference derives (sums and products of input
    dims: a KV cache's past + new); [] when the engine cannot finish (those outputs stay
    unknown: the copy path)."""
    try:
        inferred = symbolic_infer(light)
    except Exception as exc:  # noqa: BLE001 - an aid: without it the outputs are copied, as before
        _LOG.debug("symbolic inference of a block body stopped: %s", first_line(exc))
        return []
    return [_dims(vi) for vi in inferred.graph.output]


class _Unsettled:
    """An axis the polynomial tier leaves to the engine (its ``_dim_text`` is None: no text)."""


_UNSETTLED = _Unsettled()


def _polynomial_dims(light: onnx.ModelProto) -> list:
    """The output dims :mod:`onnxmlu.collapse.polydims` derives without sympy, each as the text
    the engine's sympy prints (an int, a string, None where no polynomial is, or
    :data:`_UNSETTLED`); [] where the engine would merge dims (it decides the body), or where a
    node the tier reads is malformed (an aid: the engine is asked, as before the tier)."""
    try:
        found = polydims.output_dims(light)
    except Exception as exc:  # noqa: BLE001 - an aid: the engine is asked next
        _LOG.debug("polynomial dims of a block body stopped: %s", first_line(exc))
        return []
    if found is None:
        return []
    return [None if dims is None else [_UNSETTLED if d is polydims.UNKNOWN else polydims.sympy_text(d) for d in dims]
            for dims in found]


#: Cheapest first: onnx's inference (C++), the polynomial tier (pure Python, no import), then
#: onnxruntime's engine, which imports sympy (about 0.25 s a process) and simplifies each dim it
#: derives, so it runs only for outputs the first two left unsettled. The flag: whether the tier
#: proves a ``?`` (the polynomial tier's dims that are no polynomial); the others' ``?`` is only
#: what they could not find.
_INFERENCES = ((_onnx_inferred_dims, False), (_polynomial_dims, True), (_symbolic_inferred_dims, False))
