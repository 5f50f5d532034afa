"""Consecutive blocks as one inner session: a load-time pass over fused models.

The library turns every MLUFusionBlock node into an inner onnxruntime session, and unless the
process has onnxruntime's global thread pool each inner session owns a pool of T - 1 workers
(ResNet-50 dlfusion at 16 threads: 11 blocks x 15 workers), each woken in turn as its block
runs. Blocks with nothing on the host between them run one after another anyway, so
:func:`merge_consecutive_blocks` joins every such run of blocks into one node whose body is the
members' bodies wired together: one inner session and one pool where there were N, and
onnxruntime optimizes across the former boundaries as it does in the original model (NCHWc
tensors pass through, residual Adds fuse into their Conv).

The merged body computes the composition of its members: member k's body graph with its fed
inputs renamed to the node's input tensors, its outputs to the node's output tensors and every
other name prefixed with ``onnxmlu.merged.k/`` (so no two members' names meet); a body output that
is also one of its inputs, or repeats another output, stays that one tensor: the merged body lists
it as its output as often as the node names it (the library copies such outputs), and a later
member reading the node's name reads the tensor. The merged node
reads the members' inputs that no member produces and writes the members' outputs that anything
after the run reads (a later node, a subgraph, a graph output).

Blocks are joined only where the result is the same function by construction: one ``precision``,
one version per opset domain, no model-local functions, no weights listed as graph inputs (IR < 4),
and every tensor passed inside the run has one element type at both ends (a 16-bit float block
whose output the kernel widens to float for the next block is not joined with it). The pass runs
in memory, in :func:`onnxmlu.InferenceSession`: the file, the plan, each block's ``mp`` and
``precision`` stay as they are; the merged node's ``mp`` is its members' largest (the inner thread
count when the user gives no budget), ``gops`` and ``sim_latency_us`` their sums. The members'
shared weights (``shared_weights``, onnxmlu/collapse/shared.py) are the merged node's shared
weights, last, each once: the merged inner session sees them as initializers too.
The members' output dims metadata (onnxmlu/collapse/dims.py) is rewritten over the merged
inputs: a member's input that an earlier member produces stands for that member's dim
(``k2``'s axis 2 is ``x``'s axis 1, so ``present``'s is ``past + x[1]``), so a joined decoder
still has its growing caches written in place.

The pass never parses a weight: each member's body is parsed with its initializers'
``raw_data`` cut out at the wire level (:func:`_without_raw_data`), the small graphs are
renamed and wired as protobuf messages, and the merged body's bytes are joined from its
serialized graph and the members' raw data (:func:`_serialized`); the merged node is built in
its last member's place. Each weight is then copied three times (read out of its member's
attribute, joined into the merged body, set as the merged node's attribute) where reading the
body twice, parsing, copying into the merged graph, serializing, setting the attribute and
rebuilding the node list copied it eight times: on ResNet-50 dlfusion b8 (11 blocks, 100 MB of
weights) the pass went from 0.66 s to 0.19 s and session creation from 2.95 s to 2.60 s
(``scripts/merge_cost.py --before`` the older merge.py, medians of 7 turns, commit d7048fb, 2-core
AMD EPYC with AVX-512 VNNI, load average 4.3: other jobs running).
"""

from __future__ import annotations

import re
from typing import Callable

import onnx
from google.protobuf.message import DecodeError

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import is_fusion_block, wire
from onnxmlu.ir.graphs import fed_inputs, node_inputs, node_subgraphs
from onnxmlu.schema import (OUTPUT_DIMS_KEY, OUTPUT_SHAPES_KEY, SHARED_ATTRIBUTE, UNKNOWN_DIM, add_body,
                            block_precision, body_bytes, close_body, open_body, refuse_file_references,
                            refuse_mislabel, shared_names, verify_body)

_PREFIX = "onnxmlu.merged."
#: A reference to an input dim in the output dims metadata (custom_ops/dim_expr.h), and an atom.
_REF = re.compile(r"i(\d+)\.(\d+)")
_ATOM = re.compile(r"i\d+\.\d+|\d+")
_SUMMED = ("gops", "sim_latency_us")
_JOINED = ("layers", "op_types")


def merge_consecutive_blocks(model: onnx.ModelProto) -> int:
    """Join each run of consecutive blocks of ``model``'s main graph into one node, in place;
    returns how many nodes went. Bodies the pass cannot read are left to the library to judge."""
    graph = model.graph
    runs, run = [], []  # runs of (index, node, body, weights)
    for i, node in enumerate(graph.node):
        member = _member(node) if is_fusion_block(node) else None
        if member is not None and run and _joinable(run, member):
            run.append((i, *member))
            continue
        runs.append(run)
        run = [(i, *member)] if member is not None else []
    runs.append(run)
    runs = [r for r in runs if len(r) > 1]
    if not runs:
        return 0
    readers = _read_names(graph)
    for r in runs:  # the merged node takes the last member's place, built where it stays (no copy of its body)
        _fill_merged_node(graph.node[r[-1][0]], r, readers)
    dropped = sorted((i for r in runs for i, *_ in r[:-1]), reverse=True)
    for i in dropped:
        del graph.node[i]
    _drop_internal_value_info(graph)
    return len(dropped)


def _member(node: onnx.NodeProto):
    """(node, body, weights) for a block whose body this pass can join (:func:`_light_body`),
    else None."""
    try:
        body, weights = _light_body(node)
    except (OnnxMluError, ValueError, DecodeError):  # a damaged or odd block: the library reports it
        return None
    graph = body.graph
    initializers = {t.name for t in graph.initializer}
    if body.functions or any(i.name in initializers for i in graph.input) or len(fed_inputs(graph)) != len(node.input):
        return None
    if len(graph.output) != len(node.output) or any(not name for name in [*node.input, *node.output]):
        return None
    if not _readable_metadata(node):
        return None
    return node, body, weights


#: The type of each metadata attribute the merged node combines (:func:`_merged_attributes`).
_METADATA_TYPES = {"mp": onnx.AttributeProto.INT, "precision": onnx.AttributeProto.STRING,
                   **{name: onnx.AttributeProto.FLOAT for name in _SUMMED},
                   **{name: onnx.AttributeProto.STRINGS for name in _JOINED}}


def _readable_metadata(node: onnx.NodeProto) -> bool:
    """Whether every metadata attribute has its type: a block whose ``mp`` is a tensor or a
    string is left alone, and the library refuses it with its own message (combining it with
    another block's would compare a string with an int)."""
    return all(a.type == _METADATA_TYPES[a.name] for a in node.attribute if a.name in _METADATA_TYPES)


def _light_body(node: onnx.NodeProto) -> tuple[onnx.ModelProto, dict[str, list[memoryview]]]:
    """``node``'s body as :func:`~onnxmlu.schema.body_model` reads it (digest, file references
    and label checked, shared weights opened), but parsed without its initializers' ``raw_data``:
    those stay in the body's bytes, returned beside it by tensor name (views, never copied, until
    the merged body is joined). Parsing the weights, copying them into the merged graph and
    serializing them again was most of the pass's time (the module docstring)."""
    attr = next((a for a in node.attribute if a.name == "body"), None)
    if attr is None:
        raise ValueError(f"MLUFusionBlock {node.name!r} has no body attribute")
    data = body_bytes(attr)
    verify_body(node, data)
    header, raws = _without_raw_data(data)
    body = onnx.ModelProto.FromString(header)
    names = [t.name for t in body.graph.initializer]
    if len(set(names)) != len(names):
        raise ValueError("two initializers share a name")  # whose raw data is whose would be a guess
    refuse_file_references(node, body)
    refuse_mislabel(node, body)
    return open_body(body, shared_names(node)), dict(zip(names, raws))


def _without_raw_data(data: bytes) -> tuple[bytes, list[list[memoryview]]]:
    """The serialized body ``data`` with its main graph's initializers' ``raw_data`` fields cut
    out, and those fields (each its whole framing: appended to its tensor's other fields they
    make the tensor again), one list per initializer in order."""
    view, pieces, raws = memoryview(data), [], []
    top = list(wire.fields(view))
    if [t for n, t, _, _ in top if n == wire.GRAPH] != [wire.LEN]:
        raise ValueError("a body holds one graph")
    for number, _, start, end in top:
        if number != wire.GRAPH:
            pieces.append(view[start:end])
            continue
        graph, inner = wire.payload(view, start, end), []
        for field, kind, begin, stop in wire.fields(graph):
            if field != wire.INITIALIZER or kind != wire.LEN:
                inner.append(graph[begin:stop])
                continue
            tensor = wire.payload(graph, begin, stop)
            parts = [(f == wire.RAW_DATA, tensor[b:e]) for f, _, b, e in wire.fields(tensor)]
            inner += wire.framed(wire.INITIALIZER, [p for raw, p in parts if not raw])
            raws.append([p for raw, p in parts if raw])
        pieces += wire.framed(wire.GRAPH, inner)
    return b"".join(pieces), raws


def _joinable(run: list, member) -> bool:
    """Whether ``member`` can join ``run``: same precision and opsets, one type per passed tensor."""
    node, body, _ = member
    _, first_node, first_body, _ = run[0]
    if block_precision(node) != block_precision(first_node) or _opsets(body) is None:
        return False
    opsets = dict(_opsets(first_body))
    for domain, version in _opsets(body).items():
        if opsets.setdefault(domain, version) != version:
            return False
    produced = {out: _elem_type(vi) for _, n, b, _ in run for out, vi in zip(n.output, b.graph.output)}
    for name, vi in zip(node.input, body.graph.input):
        if name in produced and produced[name] != _elem_type(vi):
            return False
    return True


def _opsets(body: onnx.ModelProto) -> dict | None:
    opsets = {}
    for o in body.opset_import:
        domain = "" if o.domain == "ai.onnx" else o.domain
        if opsets.setdefault(domain, o.version) != o.version:
            return None
    return opsets


def _elem_type(vi: onnx.ValueInfoProto) -> int:
    return vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else -1


def _read_names(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Every name the graph reads -> the indices of the nodes reading it (subgraph reads count
    for their node); a graph output is read by -1."""
    readers: dict[str, list] = {}
    for i, node in enumerate(graph.node):
        for name in node_inputs(node):
            readers.setdefault(name, []).append(i)
    for output in graph.output:
        readers.setdefault(output.name, []).append(-1)
    return readers


def _fill_merged_node(target: onnx.NodeProto, indexed_run: list, readers: dict) -> None:
    """Make ``target`` (the run's last member) the one node that replaces the run of
    (index, node, body, weights) (see the module docstring)."""
    members = {i for i, *_ in indexed_run}
    run = [(node, body) for _, node, body, _ in indexed_run]
    weights = {}
    produced, inputs, outputs = set(), [], []
    for node, _ in run:
        inputs += [n for n in node.input if n not in produced and n not in inputs]
        produced.update(node.output)
    for node, _ in run:
        outputs += [o for o in node.output if any(r not in members for r in readers.get(o, []))]
    body = _merged_body(run, inputs, outputs, [w for *_, w in indexed_run], weights)
    shared = list(dict.fromkeys(name for node, _ in run for name in shared_names(node)))
    inputs = [n for n in inputs if n not in shared] + shared  # the members' shared weights stay shared, last
    first = run[0][0]
    merged = onnx.helper.make_node(first.op_type, inputs, outputs, name="+".join(n.name for n, _ in run),
                                   domain=first.domain)
    merged.attribute.extend(_merged_attributes(run))
    if shared:
        merged.attribute.append(onnx.helper.make_attribute(SHARED_ATTRIBUTE, len(shared)))
    data = _serialized(close_body(body, shared), weights)
    target.CopyFrom(merged)  # drops the member's own body
    add_body(target, data)


def _serialized(body: onnx.ModelProto, weights: dict[str, list[memoryview]]) -> bytes:
    """``body``'s bytes with each initializer's raw data (``weights``, by name) back in place:
    one copy of the weights, into the result."""
    entries = [[tensor.SerializeToString(), *weights.get(tensor.name, ())] for tensor in body.graph.initializer]
    del body.graph.initializer[:]
    return b"".join(wire.with_initializers(body, entries))


def _merged_attributes(run: list) -> list[onnx.AttributeProto]:
    """The metadata attributes: largest ``mp``, summed costs, joined names, the shared precision."""
    values: dict[str, list] = {}
    for node, _ in run:
        for attr in node.attribute:
            if attr.name not in ("body", "body_crc32"):
                values.setdefault(attr.name, []).append(onnx.helper.get_attribute_value(attr))
    attributes = []
    for name, seen in values.items():
        if name == "mp":
            value = max(seen)
        elif name in _SUMMED:
            value = float(sum(seen))
        elif name in _JOINED:
            value = [item for items in seen for item in items]
        elif name == "precision":
            value = seen[0]
        else:
            continue  # a per-block note (doc, future attributes): it describes one member only
        attributes.append(onnx.helper.make_attribute(name, value))
    return attributes


def _merged_body(run: list, inputs: list[str], outputs: list[str], member_weights: list[dict],
                 weights: dict) -> onnx.ModelProto:
    """The members' bodies wired together, with the merged node's interface; ``weights`` gains
    the raw data of its initializers (``member_weights``' entries under their merged names)."""
    merged = onnx.ModelProto()
    merged.ir_version = max(body.ir_version for _, body in run)
    merged.producer_name = run[0][1].producer_name
    opsets: dict = {}
    for _, body in run:
        opsets.update(_opsets(body))
    merged.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in sorted(opsets.items()))
    shapes = {_metadata(body).get(OUTPUT_SHAPES_KEY) for _, body in run}
    if len(shapes) == 1 and None not in shapes:
        merged.metadata_props.add(key=OUTPUT_SHAPES_KEY, value=shapes.pop())
    dims = _merged_dims(run, inputs, outputs)
    if dims is not None:
        merged.metadata_props.add(key=OUTPUT_DIMS_KEY, value=dims)
    graph, infos, aliases = merged.graph, {}, {}
    graph.name = "merged"
    for k, (node, body) in enumerate(run):
        infos.update(_add_member(graph, k, node, body, aliases))
        added = graph.initializer[len(graph.initializer) - len(body.graph.initializer):]
        renamed = zip(body.graph.initializer, added)
        weights.update((new.name, member_weights[k].get(old.name, [])) for old, new in renamed)
    graph.input.extend(infos[name] for name in inputs)
    graph.output.extend(_renamed_info(infos[name], aliases.get(name, name)) for name in outputs)
    listed = {*inputs, *(vi.name for vi in graph.output)}
    graph.value_info.extend(vi for name, vi in infos.items() if name not in listed and name not in aliases)
    return merged


def _merged_dims(run: list, inputs: list[str], outputs: list[str]) -> str | None:
    """The members' output dims metadata over the merged node's inputs: a member's reference to
    one of its inputs becomes a reference to the merged input of that name, or, for a tensor an
    earlier member produces, that member's dim (the composition); anything else unknown."""
    positions = {name: k for k, name in enumerate(inputs)}
    known: dict[str, list[str] | None] = {}
    for node, body in run:
        text = _metadata(body).get(OUTPUT_DIMS_KEY)
        pieces = text.split(";") if text is not None else []
        for j, outer in enumerate(node.output):
            piece = pieces[j] if len(pieces) == len(node.output) else UNKNOWN_DIM
            known[outer] = _rebased(piece, node, positions, known)
    texts = [",".join(known[o]) if known.get(o) is not None else UNKNOWN_DIM for o in outputs]
    return ";".join(texts) if any(t != UNKNOWN_DIM for t in texts) else None


def _rebased(piece: str, node: onnx.NodeProto, positions: dict[str, int], known: dict) -> list[str] | None:
    """One member output's dims over the merged inputs (see :func:`_merged_dims`), or None."""
    if piece == UNKNOWN_DIM:
        return None
    unknown = False

    def substitute(match: re.Match) -> str:
        nonlocal unknown
        index, axis = int(match[1]), int(match[2])
        name = node.input[index] if index < len(node.input) else None
        if name in positions:
            return f"i{positions[name]}.{axis}"
        dims = known.get(name)
        if dims is None or axis >= len(dims):
            unknown = True
            return UNKNOWN_DIM
        return dims[axis] if _ATOM.fullmatch(dims[axis]) else f"({dims[axis]})"

    dims = [_REF.sub(substitute, dim) for dim in (piece.split(",") if piece else [])]
    return None if unknown else dims


def _metadata(body: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in body.metadata_props}


def _add_member(graph: onnx.GraphProto, k: int, node: onnx.NodeProto, body: onnx.ModelProto, aliases: dict) -> dict:
    """Append member ``k``'s body to ``graph`` with its names mapped onto the outer tensors;
    returns outer name -> ValueInfo for the member's interface. ``aliases`` gains each outer
    output that is another tensor of the merged graph (an input passed through, a repeated output)."""
    source = body.graph
    interface = {vi.name: aliases.get(outer, outer) for vi, outer in zip(fed_inputs(source), node.input)}
    infos = {outer: _renamed_info(vi, outer) for vi, outer in zip(fed_inputs(source), node.input)}
    for vi, outer in zip(source.output, node.output):
        if interface.setdefault(vi.name, outer) != outer:
            aliases[outer] = interface[vi.name]
        infos[outer] = _renamed_info(vi, outer)
    member = onnx.GraphProto()
    member.CopyFrom(source)
    _rename(member, lambda name: interface.get(name) or f"{_PREFIX}{k}/{name}")
    for inner in member.node:  # node names must be unique in a graph too (two bodies' "ReorderOutput")
        if inner.name:
            inner.name = f"{_PREFIX}{k}/{inner.name}"
    graph.node.extend(member.node)
    graph.initializer.extend(member.initializer)
    graph.sparse_initializer.extend(member.sparse_initializer)
    graph.value_info.extend(member.value_info)
    return infos


def _renamed_info(vi: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    out.name = name
    return out


def _rename(graph: onnx.GraphProto, rename: Callable[[str], str]) -> None:
    """Rename every value name in ``graph`` and its subgraphs (empty names mean "absent": kept)."""
    def new(name: str) -> str:
        return rename(name) if name else name
    for node in graph.node:
        names = [new(n) for n in node.input], [new(n) for n in node.output]
        del node.input[:], node.output[:]
        node.input.extend(names[0])
        node.output.extend(names[1])
        for sub in node_subgraphs(node):
            _rename(sub, rename)
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        vi.name = new(vi.name)
    for tensor in graph.initializer:
        tensor.name = new(tensor.name)
    for sparse in graph.sparse_initializer:
        sparse.values.name = new(sparse.values.name)


def _drop_internal_value_info(graph: onnx.GraphProto) -> None:
    """Value infos of tensors that no longer exist (passed inside a merged node)."""
    names = {o for node in graph.node for o in node.output} | {i.name for i in graph.input}
    kept = [vi for vi in graph.value_info if vi.name in names]
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)
