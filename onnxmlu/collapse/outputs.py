"""Whether a block's output shapes follow from its input shapes alone.

A block whose outputs have symbolic dims cannot have them allocated before its inner session
runs: the library lets the inner session allocate them and copies them into the node's outputs
(docs/architecture.md, "The runtime"). When every output's shape is a function of the input
*shapes* (not of the values the inputs carry), the library can learn the output shapes the
first time it sees a set of input shapes and, from the second run at those shapes on,
allocate the node's outputs first so the inner session writes in place: no copy, as for a
static block. The body says so in its metadata (:data:`SHAPES_KEY`), which the library reads
when it creates the block's kernel.

The rule, a forward walk over the body: a tensor is *value-carrying* when it is a body input or
computed from one, except through ``Shape`` and ``Size`` (their results depend on shapes only).
The shapes follow the input shapes unless some input that sets an output size (a ``Reshape``
target, ``Expand``'s shape, ``Tile``'s repeats, ``Slice``'s bounds, ``Range``'s arguments,
``ConstantOfShape``'s shape, ``Resize``'s scales or sizes, ``Pad``'s pads, split sizes,
squeeze/reduce axes, ``TopK``'s k, ``OneHot``'s depth) reads a value-carrying tensor, or the
body holds a ``Loop`` (its trip count is a value) or an op outside this table's knowledge whose
output size could depend on data (``NonZero`` and its kin, which blocks do not hold anyway).
"""

from __future__ import annotations

from typing import Sequence

import onnx

from onnxmlu.collapse.dims import DIMS_KEY, output_dims_text
from onnxmlu.ir import is_default_domain, node_subgraphs
from onnxmlu.schema import OUTPUT_SHAPES_KEY

SHAPES_KEY = OUTPUT_SHAPES_KEY  # onnxmlu/schema.py: the file format
FOLLOW_INPUT_SHAPES = "input-shapes"

#: Per op, the input positions whose values set an output size.
_SIZE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Range": (0, 1, 2),
    "ConstantOfShape": (0,), "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1, 3), "Split": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,), "OneHot": (1,), "CenterCropPad": (1,),
    **{op: (1,) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL1",
                           "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum")},
}
#: Ops whose output size follows the values they read, whatever the input.
_DATA_SIZED = frozenset({"Loop", "NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit"})
#: Ops whose outputs carry no input value (only its shape).
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def output_shapes_follow_inputs(graph: onnx.GraphProto) -> bool:
    """Whether every output shape of ``graph`` is a function of its input shapes (module
    docstring); ``graph``'s nodes are in topological order (a block body is)."""
    carrying = {vi.name for vi in graph.input}
    return _follows(graph, carrying)


def _follows(graph: onnx.GraphProto, carrying: set[str]) -> bool:
    for node in graph.node:
        if not is_default_domain(node.domain) or node.op_type in _DATA_SIZED:
            return False
        for position in _SIZE_INPUTS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position] in carrying:
                return False
        for sub in node_subgraphs(node):  # a Scan's body: every value inside it is carried
            if not _follows(sub, carrying | {vi.name for vi in sub.input} | _produced(sub)):
                return False
        if node.op_type not in _SHAPE_ONLY and any(name in carrying for name in node.input):
            carrying.update(o for o in node.output if o)
    return True


def _produced(graph: onnx.GraphProto) -> set[str]:
    return {o for node in graph.node for o in node.output if o}


def has_symbolic_output(graph: onnx.GraphProto) -> bool:
    """Whether an output of ``graph`` has a dim that is not a fixed size (or an unknown rank)."""
    for vi in graph.output:
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
            return True
    return False


def mark_output_shapes(body: onnx.ModelProto, absent: Sequence[onnx.TensorProto] = ()) -> None:
    """Record in ``body``'s metadata that its output shapes follow its input shapes, when it has
    an output of symbolic size and they do (a static body is left byte for byte as it was), and
    then each output dim as a function of the input dims where it can be written
    (:mod:`onnxmlu.collapse.dims`; ``absent``: constants of the body not in it yet)."""
    if has_symbolic_output(body.graph) and output_shapes_follow_inputs(body.graph):
        body.metadata_props.add(key=SHAPES_KEY, value=FOLLOW_INPUT_SHAPES)
        dims = output_dims_text(body, absent)
        if dims is not None:
            body.metadata_props.add(key=DIMS_KEY, value=dims)
