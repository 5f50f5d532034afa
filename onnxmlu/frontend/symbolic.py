"""onnxruntime's symbolic shape inference with every merged dim named by a fixed rule.

onnxruntime's ``SymbolicShapeInference`` merges dims it proves equal (two symbolic dims that
broadcast together, a dim equal to a size) into one *representative*, and picks it by
iterating a Python ``set`` of strings: which name wins follows the process's string hashes
(``PYTHONHASHSEED``), so two runs on the same model wrote different ``dim_param`` names
(``state_d1`` in one, ``If_output_0_d0`` in the other) and the fused files differed in bytes.

Here every group of merged dims takes its representative by one total order on its members
(:func:`_merge_rank`): onnxruntime's own preference, made total:

1. a literal size (a group holds at most one value), smallest first;
2. a dim the model's own inputs name (``N``; ``state_d1``, the engine's name for axis 1 of an
   input ``state`` that names none), by the first input, then the first axis, that has it;
3. another dim a subgraph engine takes as an input (an outer tensor's dim seen from an ``If``
   branch or a ``Loop`` body), shortest, then by text;
4. a dim made by inference as a plain symbol (``Concat_12_o0__d1``), shortest, then by text;
5. an expression (``2*W + 1``), shortest, then by text.

Rule 2 reads the positions in the model's own inputs, never in a subgraph engine's: onnxruntime
lists a subgraph's outer tensors in ``set`` order. The dims merged into the representative are
recorded in the same order. Everything else the engine names follows the graph's order (a new
dim is called after its node's index and output axis), so its result is a function of the
model alone. The engine's subgraph passes (``If``, ``Loop``, ``Scan`` bodies) make engines of
the module's class by name: the class is swapped for the deterministic one while
:func:`symbolic_infer` runs, under a lock.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator

import onnx

from onnxmlu.optional import optional_import

_SWAP_LOCK = threading.Lock()
#: onnxruntime's arguments: int_max, auto_merge, guess_output_rank (no: a guessed type for an
#: op onnxruntime does not know would be declared on a block boundary as if it were known), verbose
_ENGINE_ARGS = (2**31 - 1, True, False, 0)


def symbolic_infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's symbolic inference of ``model``, driven step by step (its ``infer_shapes``
    saves the model to the current directory and raises when it cannot finish), with merged
    dims named by :func:`_merge_rank`. Raises what the engine raises."""
    module = optional_import("onnxruntime.tools.symbolic_shape_infer")
    with _SWAP_LOCK:
        engine_class = _deterministic_engine(module.SymbolicShapeInference, _input_positions(model.graph))
        with _swapped(module, engine_class):
            engine = engine_class(*_ENGINE_ARGS)
            engine._preprocess(model)
            while engine.run_:
                engine._infer_impl()
            engine._update_output_from_vi()
            return engine.out_mp_


@contextlib.contextmanager
def _swapped(module, engine_class) -> Iterator[None]:
    """The module's ``SymbolicShapeInference`` is ``engine_class`` inside the block (subgraph
    engines are made by that global name)."""
    original = module.SymbolicShapeInference
    module.SymbolicShapeInference = engine_class
    try:
        yield
    finally:
        module.SymbolicShapeInference = original


def _deterministic_engine(base: type, positions: dict[str, tuple[int, int]]) -> type:
    """A subclass of onnxruntime's engine whose only change is the order of its merge choices;
    ``positions``: where each dim name first appears in the model's inputs (rule 2)."""
    return type("DeterministicSymbolicShapeInference", (base,),
                {"_add_suggested_merge": _add_suggested_merge, "_infer_Resize": _infer_resize,
                 "_infer_Gather": _infer_gather, "_onnxmlu_input_positions": positions})


def _infer_gather(self, node: onnx.NodeProto) -> None:
    """onnxruntime's Gather rule, with com.microsoft ``GatherBlockQuantized``'s shape as its
    kernel computes it: ``data`` dims before ``gather_axis``, ``indices``' dims, the dims after,
    the ``quantize_axis`` one ``8 / bits`` times the stored one when ``data`` is uint8 (4-bit
    values two a byte); the scales' type. onnxruntime's rule reads ``axis`` and the packed width
    (an int4 embedding's rows half as wide as the residual they are added to: the engine's
    merge check failed, and every op after it lost its type)."""
    data = self._get_shape(node, 0)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    quantize = attrs.get("quantize_axis", 1) % max(len(data), 1)
    if node.op_type != "GatherBlockQuantized" or not isinstance(data[quantize], int):
        super(type(self), self)._infer_Gather(node)
        return
    if self.known_vi_[node.input[0]].type.tensor_type.elem_type == onnx.TensorProto.UINT8:
        data[quantize] *= 8 // attrs.get("bits", 4)
    gather = attrs.get("gather_axis", 0) % len(data)
    shape = data[:gather] + self._get_shape(node, 1) + data[gather + 1:]
    element = self.known_vi_[node.input[2]].type.tensor_type.elem_type
    self.known_vi_[node.output[0]].CopyFrom(onnx.helper.make_tensor_value_info(node.output[0], element, shape))


def _infer_resize(self, node: onnx.NodeProto) -> None:
    """onnxruntime's Resize rule, with whole-number scales taken exactly: an output dim is
    ``floor(d * s)`` (the spec), which is ``s * d`` for an integer ``d`` and a whole ``s``.
    onnxruntime writes ``simplify(floor(d * 2.0))``, which stays ``floor(2.0*d)`` (a dim no
    polynomial can name, so a block after a 2x upsample had outputs of unknown size) and costs
    tens of milliseconds a dim plus sympy's simplifier imported on first use. Other scales,
    ``sizes``, ``axes`` and crop-and-resize regions go to onnxruntime's rule."""
    module = optional_import("onnxruntime.tools.symbolic_shape_infer")
    scales = _whole_scales(self, module, node)
    if scales is None:
        super(type(self), self)._infer_Resize(node)
        return
    shape = [d * s for d, s in zip(self._get_sympy_shape(node, 0), scales)]
    self._update_computed_dims(shape)
    element = self.known_vi_[node.input[0]].type.tensor_type.elem_type
    self.known_vi_[node.output[0]].CopyFrom(onnx.helper.make_tensor_value_info(
        node.output[0], element, module.get_shape_from_sympy_shape(shape)))


def _whole_scales(engine, module, node: onnx.NodeProto) -> list[int] | None:
    """The Resize's scales as integers when every one is a whole number >= 1 given for every
    axis, with no ``sizes``, ``axes`` or crop region; else None."""
    opset = module.get_opset(engine.out_mp_)
    if any(a.name == "axes" or (a.name == "coordinate_transformation_mode" and a.s == b"tf_crop_and_resize")
           for a in node.attribute):
        return None
    if opset > 10 and engine._try_get_value(node, 3) is not None:
        return None
    scales = engine._try_get_value(node, 1 if opset <= 10 else 2)
    rank = engine._get_shape_rank(node, 0)
    if scales is None or len(scales) != rank:
        return None
    values = [float(s) for s in scales]
    if not all(v >= 1 and v == int(v) for v in values):
        return None
    return [int(v) for v in values]


def _add_suggested_merge(self, symbols, apply: bool = False) -> None:
    """onnxruntime's ``_add_suggested_merge`` (record that ``symbols`` are one dim) with the
    representative and the recording order fixed by :func:`_merge_rank`."""
    module = optional_import("onnxruntime.tools.symbolic_shape_infer")
    group = set(symbols)
    for merged, into in self.suggested_merge_.items():  # a member merged before stands for its group
        if merged in group:
            group.remove(merged)
            group.add(into)
    rank = functools.partial(_merge_rank, self, module)
    ordered = sorted(group, key=rank)
    target = ordered[0]
    for s in ordered[1:]:
        if module.is_literal(target) and module.is_literal(s):
            assert int(target) == int(s)  # onnxruntime's own check: one group, one size
        self.suggested_merge_[s] = int(target) if module.is_literal(target) else target
        for key, value in self.suggested_merge_.items():
            if value == s:
                self.suggested_merge_[key] = target
    if apply and self.auto_merge_:
        self._apply_suggested_merge()


def _merge_rank(engine, module, s) -> tuple:
    """The sort key of a group member (module docstring, rules 1-5): lower wins."""
    if module.is_literal(s):
        return (1, int(s), "")
    positions = engine._onnxmlu_input_positions
    if s in positions:
        return (2, positions[s], s)
    if s in engine.input_symbols_:
        return (3, len(s), s)
    plain = type(engine.symbolic_dims_.get(s)) is module.sympy.Symbol
    return (4 if plain else 5, len(s), s)


def _input_positions(graph: onnx.GraphProto) -> dict[str, tuple[int, int]]:
    """Each dim name of the graph's inputs -> (input index, axis) where it first appears; a dim
    with neither size nor name under the engine's name for it, ``<input>_d<axis>``."""
    found: dict[str, tuple[int, int]] = {}
    for index, vi in enumerate(graph.input):
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            name = dim.dim_param or ("" if dim.HasField("dim_value") else f"{vi.name}_d{axis}")
            if name:
                found.setdefault(name, (index, axis))
    return found
