"""Weights several blocks read, stored once in the fused file.

A block's body carries its constants (:mod:`onnxmlu.collapse.blocks`), so a weight ``W`` read by
``k`` blocks was written ``k`` times: a Siamese tower applied to two inputs and cut into two
blocks doubled the file, and so did a merged decoder's outer weights, read by blocks in both
branches of its ``If``. Instead, a weight is *shared* when it is at least
:data:`MIN_SHARED_BYTES` and

* two or more FP32 blocks read it, or
* the outer graph keeps it anyway: a host node reads it (an ``If`` whose branches read it
  from the outer scope included) or it is a graph output, or
* it is an outer-scope constant of the subgraph being fused (``outer``: a branch lifted by
  :mod:`onnxmlu.collapse.branches` reads the enclosing graph's weights).

A shared weight stays one initializer of the (outer) graph and becomes an extra input of every
block that reads it, after the block's ordinary inputs; the node's ``shared_weights``
attribute (:data:`onnxmlu.schema.SHARED_ATTRIBUTE`) counts them. In the body, each is an
initializer of the same name, type and dims whose data is an external reference to
:data:`onnxmlu.schema.SHARED_LOCATION` (:func:`onnxmlu.schema.placeholder`): no bytes. The
custom-op library reads the node's constant input when it creates the kernel and hands it to
the inner session in place of the placeholder, so the inner session still sees an initializer
(constant folding and prepacking work as before) and the file holds the weight once: the fused
file weighs the original plus the blocks' framing. A reference to that location is the only one
a body may hold, and only for the initializers the node's shared inputs name
(:func:`onnxmlu.schema.file_references`).

Python readers see the body *opened* (:func:`onnxmlu.schema.open_body`; the format's helpers
live with the format, below this package): the placeholders become trailing graph inputs, so
body inputs and node inputs match by position again (the reference evaluator,
``--portable``'s functions, the views).

FP16 and INT8 blocks keep their own copy: their bodies hold the weights converted. So does a
block reading an initializer its graph (or an enclosing one) also lists as an input (IR < 4):
the caller may override it, so it is no constant where the block runs.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import onnx

from onnxmlu.ir.weights import tensor_bytes

#: Smaller constants (shape vectors, scalars) are copied: a copy costs less than an input.
MIN_SHARED_BYTES = 1024


def shared_constants(initializers: dict[str, onnx.TensorProto], readers: Iterable[Sequence[str]],
                     kept_outside: set[str], outer: frozenset[str] = frozenset()) -> set[str]:
    """The constants to share (module docstring): ``readers`` are the constants of each block
    that may share, ``kept_outside`` the names the outer graph keeps anyway."""
    counts = Counter(name for names in readers for name in set(names))
    return {name for name, count in counts.items()
            if tensor_bytes(initializers[name]) >= MIN_SHARED_BYTES
            and (count > 1 or name in kept_outside or name in outer)}
