"""Graph walking, scopes, node order and model copies over ``onnx`` protos (see ``onnxmlu.ir``).

Scopes: a subgraph (an ``If`` branch, a ``Loop``/``Scan`` body) may read any name its
enclosing graphs define; those names are the node's *implicit* inputs. ONNX graphs are single
assignment across all scopes, so a name a subgraph reads and does not define itself comes from
outside, wherever in the file its producer stands.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable, Iterator, Sequence

import onnx

DEFAULT_DOMAINS = ("", "ai.onnx")
#: The fused-block operator (the file format is :mod:`onnxmlu.schema`).
FUSION_DOMAIN, FUSION_OP_TYPE = "com.onnxmlu", "MLUFusionBlock"
_GRAPH_KINDS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
#: Standard ops with GRAPH attributes; nodes of other domains are scanned (a custom op may have one).
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def is_default_domain(domain: str | None) -> bool:
    return domain in (None, *DEFAULT_DOMAINS)


def is_fusion_block(node: onnx.NodeProto) -> bool:
    return node.domain == FUSION_DOMAIN and node.op_type == FUSION_OP_TYPE


def subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def subgraph(node: onnx.NodeProto, name: str) -> onnx.GraphProto | None:
    """``node``'s graph attribute ``name`` (an If's ``then_branch``, a Loop's or Scan's ``body``),
    or None when it has no graph of that name."""
    for attr in node.attribute:
        if attr.name == name and attr.type == onnx.AttributeProto.GRAPH:
            return attr.g
    return None


def node_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    if node.op_type not in _SUBGRAPH_OPS and is_default_domain(node.domain):
        return []  # skips reading every attribute of every plain node
    return [g for attr in node.attribute if attr.type in _GRAPH_KINDS for g in subgraphs(attr)]


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in it, depth first in node and attribute order."""
    yield graph
    yield from nested_graphs(graph)


def graphs_by_branch(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """Every graph with the key of the main-graph branch it sits in (``"NODE.ATTR"`` of the
    main-graph node's subgraph attribute, ``""`` for the main graph): a stable name for a
    branch while nodes inside it change."""
    yield "", graph
    for key, attr in branch_attributes(graph):
        for sub in subgraphs(attr):
            yield from ((key, g) for g in iter_graphs(sub))


def branch_attributes(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.AttributeProto]]:
    """The subgraph attributes of ``graph``'s own nodes, keyed ``"NODE.ATTR"``."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type in _GRAPH_KINDS:
                yield f"{node.name or node.output[0]}.{attr.name}", attr


def nested_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Every subgraph below ``graph`` (not ``graph`` itself), in :func:`iter_graphs` order."""
    for node in graph.node:
        for sub in node_subgraphs(node):
            yield from iter_graphs(sub)


def attribute_value(node: onnx.NodeProto, name: str, default=None):
    """The value of ``node``'s attribute ``name`` (as ``onnx.helper.get_attribute_value`` reads
    it), or ``default`` when the node does not set it."""
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Explicit inputs plus the outer-scope names its subgraphs read, without repeats."""
    names = [n for n in node.input if n]
    for sub in node_subgraphs(node):
        names.extend(n for n in outer_scope_names(sub) if n not in names)
    return names


def outer_scope_names(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` reads (nodes, nested subgraphs, outputs) but does not define itself."""
    defined = _defined_names(graph)
    used: dict[str, None] = {}
    for node in graph.node:
        used.update((n, None) for n in node_inputs(node) if n not in defined)
    used.update((o.name, None) for o in graph.output if o.name not in defined)
    return list(used)


def _defined_names(graph: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined.update(t.values.name for t in graph.sparse_initializer)
    defined.update(o for node in graph.node for o in node.output if o)
    return defined


def unresolved_names(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> list[str]:
    """Every name read in ``graph`` or its subgraphs that no enclosing scope defines, as
    ``"graph: name"``; empty for a sound graph (in any node order)."""
    scope = outer | _defined_names(graph)
    missing = [f"{graph.name or 'main'}: {n}" for n in _read_names(graph) if n not in scope]
    for node in graph.node:
        for sub in node_subgraphs(node):
            missing.extend(unresolved_names(sub, scope))
    return missing


def _read_names(graph: onnx.GraphProto) -> Iterable[str]:
    yield from (n for node in graph.node for n in node.input if n)
    yield from (o.name for o in graph.output)


def sort_graphs(graph: onnx.GraphProto) -> bool:
    """Put the nodes of ``graph`` and of every subgraph in a topological order, in place
    (exporters write ``If`` branches out of order; onnxruntime accepts that, onnx's shape
    inference and checker do not). Ties keep the file order. Returns whether any node moved;
    a graph with a cycle is left as it is (the analysis reports the cycle)."""
    moved = False
    for node in graph.node:
        for sub in node_subgraphs(node):
            moved |= sort_graphs(sub)
    order = _kahn_order(graph)
    if order is None or order == list(range(len(graph.node))):
        return moved
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)
    return True


def _kahn_order(graph: onnx.GraphProto) -> list[int] | None:
    producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    deps = [{producer[n] for n in node_inputs(node) if n in producer} - {i} for i, node in enumerate(graph.node)]
    order = kahn_order(deps)
    return order if len(order) == len(graph.node) else None


def kahn_order(deps: Sequence[Iterable[int]], prefer: Callable[[int], bool] | None = None,
               early: Callable[[int], bool] | None = None) -> list[int]:
    """Kahn's algorithm over node indices: node ``i`` waits for every index in ``deps[i]`` (one
    listed twice is waited for twice). Ties keep the index order. With ``prefer``, two ready
    queues: while the current run is of preferred nodes it keeps taking ready preferred ones,
    so the others gather between runs instead of splitting them. A ready ``early`` node is
    taken before anything else (work that no preferred node precedes goes before their runs
    instead of waiting until a run needs it). Nodes on a cycle are left out of the order."""
    wanted = prefer if prefer is not None else (lambda i: True)
    first = early if early is not None else (lambda i: False)
    indegree = [0] * len(deps)
    consumers: list[list[int]] = [[] for _ in deps]
    for i, waits in enumerate(deps):
        for d in waits:
            indegree[i] += 1
            consumers[d].append(i)
    ready: tuple[list[int], list[int], list[int]] = ([], [], [])  # (early, preferred, others) heaps
    queue_of = lambda i: 0 if first(i) else 1 if wanted(i) else 2  # noqa: E731
    for i, deg in enumerate(indegree):
        if deg == 0:
            heapq.heappush(ready[queue_of(i)], i)
    order: list[int] = []
    in_preferred_run = True
    while any(ready):
        early_q, preferred, others = ready
        queue = early_q or (preferred if (preferred and (in_preferred_run or not others)) else others)
        i = heapq.heappop(queue)
        in_preferred_run = queue is preferred or (in_preferred_run and queue is early_q)
        order.append(i)
        for c in consumers[i]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready[queue_of(c)], c)
    return order


def fed_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds: those without an initializer of the same name (an IR < 4
    model lists its weights as inputs too)."""
    initializers = {t.name for t in graph.initializer}
    return [vi for vi in graph.input if vi.name not in initializers]


def drop_unread_initializers(graph: onnx.GraphProto) -> int:
    """Remove the initializers of ``graph`` that no node (subgraphs' outer-scope reads
    included), graph output or graph input names; returns how many went."""
    read = {n for node in graph.node for n in node_inputs(node)}
    read.update(o.name for o in graph.output)
    read.update(i.name for i in graph.input)
    kept = [t for t in graph.initializer if t.name in read]
    dropped = len(graph.initializer) - len(kept)
    if dropped:
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return dropped


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def copy_model_fields(target: onnx.ModelProto, source: onnx.ModelProto) -> None:
    """Model-level fields (IR, opsets, producer, metadata, local functions) of ``source``."""
    target.ir_version = source.ir_version
    del target.opset_import[:]
    target.opset_import.extend(source.opset_import)
    for field_name in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(target, field_name, getattr(source, field_name))
    del target.metadata_props[:]
    target.metadata_props.extend(source.metadata_props)
    del target.functions[:]
    target.functions.extend(source.functions)


def opset_version(model: onnx.ModelProto, domain: str = "") -> int | None:
    """The model's opset of ``domain`` (the standard domain by default), None when not imported."""
    domains = DEFAULT_DOMAINS if domain in DEFAULT_DOMAINS else (domain,)
    for imp in model.opset_import:
        if imp.domain in domains:
            return int(imp.version)
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
