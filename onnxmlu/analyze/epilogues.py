"""Epilogues: the ops a CPU runtime fuses into the op before them, kept next to it.

onnxruntime's CPU graph transformers fold into a Conv the ops that only rescale or clamp its
output: a BatchNormalization (ConvBNFusion), a Mul or an Add by a constant (ConvMulFusion,
ConvAddFusion) and an activation (ConvActivationFusion, and the NCHWc Conv's own activation);
into a MatMul the Add of a constant bias (MatMulAddFusion, to a Gemm). A block body is an
onnxruntime graph, so inside a block they still fuse; across a block boundary they cannot: the
producer's output leaves its block whole, and the epilogue runs as its own pass over it in the
next block. The BN rewrite (``--bn substitute``) makes every Conv of a BN network such a chain
(Conv -> BatchNormalization(normalize) -> Mul -> Add), so a boundary inside one is common, and
dear at a large batch (ResNet-50, batch 8, one thread: four such boundaries cost about 21 ms of
unfused BN/Mul/Add passes in 393 ms, ``scripts/profile_boundaries.py``).

Two rules follow, both exact (they never change what is computed):

* **order** (:func:`epilogues_after_producers`): an epilogue reads nothing but its producer's
  output and constants, so moving it right after its producer in a topological order keeps
  the order topological; then a chain is contiguous and a block either holds all of it or a
  boundary falls between two of its ops;
* **boundaries** (:func:`keep_epilogues`, in the plan stage): a boundary that falls before an
  epilogue moves past its chain, into the block after, when both blocks run at one precision.

An op ``E`` is an epilogue of ``P`` when ``E`` is one of :data:`EPILOGUE_OPS` for the chain's
head (``P`` itself, or the head of the chain ``P`` ends), ``E``'s inputs are ``P``'s output and
initializers only, and ``P``'s output has no reader but ``E`` and is not a graph output.
"""

from __future__ import annotations

from typing import Callable, Sequence

from onnxmlu.ir.index import GraphIndex

#: Ops a CPU runtime fuses into a chain headed by the key (onnxruntime's transformers above).
EPILOGUE_OPS: dict[str, frozenset[str]] = {
    "Conv": frozenset({"BatchNormalization", "Mul", "Add", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh",
                       "HardSigmoid"}),
    "MatMul": frozenset({"Add"}),
}


def epilogue_heads(order: Sequence[int], index: GraphIndex, is_layer: Callable[[int], bool]) -> dict[int, int]:
    """Each epilogue node -> the node it is an epilogue of (its producer), over ``order``."""
    nodes = index.graph.node
    head_of: dict[int, str] = {}  # node -> op type of its chain's head
    producer_of: dict[int, int] = {}
    for i in order:
        if not is_layer(i):
            continue
        op = nodes[i].op_type
        if op in EPILOGUE_OPS:
            head_of[i] = op
        p = _sole_producer(i, index)
        if p is None or p not in head_of or not is_layer(p) or op not in EPILOGUE_OPS[head_of[p]]:
            continue
        if _read_only_by(p, i, index):
            producer_of[i] = p
            head_of[i] = head_of[p]
    return producer_of


def _sole_producer(i: int, index: GraphIndex) -> int | None:
    """The one node whose output node ``i`` reads, when every other input is an initializer."""
    produced = [name for name in index.inputs[i] if name and not index.is_constant(name)]
    if len(produced) != 1 or produced[0] not in index.producer:
        return None
    return index.producer[produced[0]]


def _read_only_by(p: int, i: int, index: GraphIndex) -> bool:
    outputs = [name for name in index.outputs[p] if name]
    return all(name not in index.graph_outputs and index.consumers.get(name, []) == [i] for name in outputs)


def epilogues_after_producers(order: Sequence[int], producer_of: dict[int, int]) -> list[int]:
    """``order`` with every epilogue right after its producer (a chain's ops in a row)."""
    follower = {p: e for e, p in producer_of.items()}
    placed: set[int] = set()
    out: list[int] = []
    for i in order:
        if i in placed or i in producer_of:
            continue
        while i is not None:
            out.append(i)
            placed.add(i)
            i = follower.get(i)
    assert len(out) == len(order), "an epilogue whose producer is not in the order"
    return out
