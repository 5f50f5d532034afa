"""One tensor for a weight that several subgraphs hold copies of.

A rewrite derives constants node by node: two LSTMs in the two branches of an ``If`` that read
one weight ``W`` each get their own transposed copy ``W_T``, one in each branch, and an
exporter may write the same table into several subgraphs. Every copy is then written into the
fused file (a Silero VAD grew by 40 %). :func:`hoist_identical_constants` keeps one: the
subgraph initializers of at least :data:`MIN_BYTES` with the same type, dims and bytes move to
the innermost graph that encloses all of them (where every copy's readers still see it, from
the outer scope), under the first copy's name, and the readers of the other copies are renamed
to it. The blocks that read the one tensor then share it (``onnxmlu/collapse/shared.py``).

Only subgraph initializers are compared (the main graph's weights may be weight-store markers,
whose bytes are not read here), and only those whose type and dims another one has, so a model
without control flow costs nothing.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

import onnx

from onnxmlu.ir.graphs import node_subgraphs
from onnxmlu.ir.weights import tensor_bytes

#: Smaller constants are left where they are.
MIN_BYTES = 1024


def hoist_identical_constants(graph: onnx.GraphProto) -> int:
    """Hoist and merge identical subgraph initializers of ``graph`` (module docstring), in
    place; the number of copies removed."""
    paths: dict[int, tuple[onnx.GraphProto, ...]] = {}
    _scopes(graph, (graph,), paths)
    groups: dict[tuple, list[tuple[onnx.GraphProto, onnx.TensorProto]]] = defaultdict(list)
    for path in paths.values():
        if len(path) > 1:
            for t in path[-1].initializer:
                if t.HasField("raw_data") and tensor_bytes(t) >= MIN_BYTES:
                    groups[(t.data_type, tuple(t.dims))].append((path[-1], t))
    removed = 0
    for candidates in groups.values():
        if len(candidates) > 1:
            removed += _merge_identical(candidates, paths)
    return removed


def _scopes(graph: onnx.GraphProto, path: tuple, paths: dict) -> None:
    """The chain of enclosing graphs (outermost first) of every graph, by ``id``."""
    paths[id(graph)] = path
    for node in graph.node:
        for sub in node_subgraphs(node):
            _scopes(sub, (*path, sub), paths)


def _merge_identical(candidates: list, paths: dict) -> int:
    by_content: dict[bytes, list] = defaultdict(list)
    for scope, tensor in candidates:
        by_content[hashlib.sha256(tensor.raw_data).digest()].append((scope, tensor))
    removed = 0
    for copies in by_content.values():
        if len(copies) > 1:
            _hoist(copies, paths)
            removed += len(copies) - 1
    return removed


def _hoist(copies: list, paths: dict) -> None:
    """Move the first copy to the innermost graph enclosing every copy; rename the others' readers."""
    keep = copies[0][1]
    home = _common_scope([paths[id(scope)] for scope, _ in copies])
    kept = onnx.TensorProto()
    kept.CopyFrom(keep)
    for scope, tensor in copies:
        if tensor.name != keep.name:
            _rename_reads(scope, tensor.name, keep.name)
        others = [t for t in scope.initializer if t.name != tensor.name]
        del scope.initializer[:]
        scope.initializer.extend(others)
    home.initializer.append(kept)


def _common_scope(chains: list[tuple]) -> onnx.GraphProto:
    common = chains[0]
    for chain in chains[1:]:
        k = 0
        while k < min(len(common), len(chain)) and common[k] is chain[k]:
            k += 1
        common = common[:k]
    return common[-1]


def _rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of ``old`` in ``graph`` and its subgraphs (node inputs, graph outputs) reads ``new``."""
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new
        for sub in node_subgraphs(node):
            _rename_reads(sub, old, new)
    for output in graph.output:
        if output.name == old:
            output.name = new
