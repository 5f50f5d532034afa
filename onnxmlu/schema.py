"""The ``com.onnxmlu::MLUFusionBlock`` operator: its ONNX schema and helpers to read a node.

Format (version 1) — one node per fused block:

* inputs: the tensors entering the block (any element types, variadic, heterogeneous);
* outputs: the block's tensors used after it (any element types, variadic, heterogeneous);
* ``mp`` (INT, required): cores the block runs on, 1..cores of the hardware profile;
* ``body`` (TENSOR, uint8, 1-D): the block as a serialized ModelProto with its weights.
  Its graph inputs/outputs match the node's inputs/outputs by position. A STRING ``body``
  from older files is still read by :func:`body_model` and by the runtime;
* ``body_crc32`` (INT, optional): the CRC-32 (zlib's ``crc32``) of the body's bytes. The
  runtime library and :func:`body_model` refuse a body that does not match it, naming the
  block; nodes from files written before it existed have none and load as before;
* ``precision`` (STRING, optional): the precision the block runs at, ``fp32``, ``fp16`` or
  ``int8`` (docs/precision.md). Absent means ``fp32`` -- files from before it read as they
  did, and FP32 blocks are written without it. The body already holds the numerics: FP16
  weights and roundings, or the QDQ form of an INT8 block, so the runtime needs nothing else;
* ``shared_weights`` (INT, optional): how many of the node's last inputs are weights shared
  with other blocks (:mod:`onnxmlu.collapse.shared`): constants of the outer graph, each held in
  the body as a placeholder initializer of the same name that the runtime fills with the input.
  Absent means none. :func:`body_model` returns the body with those placeholders as trailing
  graph inputs, so body and node still match by position;
* ``layers``, ``op_types`` (STRINGS), ``gops``, ``sim_latency_us`` (FLOAT): metadata
  for people (Netron) and reports.

A fused model describes itself (:func:`describe_fused_model`): ``producer_name`` ``onnxmlu``
and its version, and ``metadata_props`` keys ``onnxmlu.*`` (:data:`METADATA_KEYS`) naming the
library that runs the blocks and how to get it, the hardware profile, strategy and precisions
-- so a user whose plain onnxruntime says ``MLUFusionBlock is not a registered function/op``
finds the answer in the file (Netron shows the properties). ``onnxmlu.pricing_shape``
(:data:`PRICING_SHAPE_KEY`, JSON: :class:`onnxmlu.frontend.pins.PricingShape`) records the input
shapes the plan was priced at: ``{"inputs": {NAME: [dims]}, "defaulted": [symbolic dims no pin
sized], "profile": null or {"min"|"opt"|"max": {NAME: [dims]}}, "sim_latency_us": null or
{"min"|"opt"|"max": µs}}``; the graph keeps its symbolic dims. ``sim_latency_us`` (the plan's
simulated latency at each point of the ranges, as ``fuse`` prints it) came later: a record
without it reads as null, and ``inspect`` and ``report`` say the file does not record it.

Registering the schema (``ensure_registered``) lets ``onnx.checker.check_model(full_check=True)``
check a fused node's attributes. The schema deliberately has no Python inference function:
onnx keeps such a function in its C++ registry, whose static destructor runs after the
interpreter has finalized -- onnx 1.19 then waits forever for the GIL at exit, 1.20 to 1.22
segfault, and 1.17/1.18 have no ``set_type_and_shape_inference_function`` at all. The block's
output types come from its body instead, by :func:`infer_shapes` (:func:`type_block_outputs`
then onnx's own inference), which needs no registration and no callback across the boundary.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Sequence

import onnx
from onnx import defs

from onnxmlu.errors import OnnxMluError
from onnxmlu.precisions import FP16, INT8, RECORDS
from onnxmlu.ir.graphs import FUSION_DOMAIN as DOMAIN
from onnxmlu.ir.graphs import FUSION_OP_TYPE as OP_TYPE
from onnxmlu.ir.graphs import copy_model, iter_graphs, node_subgraphs
from onnxmlu.ir.graphs import is_fusion_block  # noqa: F401 - the format's predicate, read here too
from onnxmlu.version import __version__
from onnxmlu.wording import plural

VERSION = 1
#: The digest attribute: CRC-32 of the body's serialized bytes (custom_ops: kDigestAttribute).
DIGEST = "body_crc32"

_ALL_TENSOR_TYPES = sorted(
    f"tensor({name})" for name in (
        "float", "double", "float16", "bfloat16", "int8", "int16", "int32", "int64",
        "uint8", "uint16", "uint32", "uint64", "bool", "string",
    )
)

DOC = (
    "A block of accelerator layers fused by onnxmlu. Runs `body` (a serialized ONNX model "
    "held in a uint8 tensor) on `mp` cores of the simulated MLU accelerator."
)


#: metadata_props a fused model carries (the source model's own properties are kept beside them).
METADATA_KEYS = ("onnxmlu.runtime", "onnxmlu.version", "onnxmlu.hardware", "onnxmlu.strategy", "onnxmlu.precision",
                 "onnxmlu.blocks")
#: The input shapes the plan was priced at, as JSON (module docstring).
PRICING_SHAPE_KEY = "onnxmlu.pricing_shape"
#: Body metadata the library reads (custom_ops/mlu_fusion_block.h): ``"input-shapes"`` when every
#: output's shape follows from the input shapes (onnxmlu/collapse/outputs.py) ...
OUTPUT_SHAPES_KEY = "onnxmlu.output_shapes"
#: ... and each output's dims over the input dims, ``;`` between outputs, ``,`` between dims,
#: ``?`` unknown (onnxmlu/collapse/dims.py; custom_ops/dim_expr.h reads the grammar).
OUTPUT_DIMS_KEY = "onnxmlu.output_dims"
UNKNOWN_DIM = "?"
RUNTIME_NOTE = (
    "The com.onnxmlu::MLUFusionBlock nodes run in onnxruntime with onnxmlu's custom-op library: "
    "pip install onnxmlu; then onnxmlu.InferenceSession(path), or "
    "SessionOptions.register_custom_ops_library(onnxmlu.custom_ops_library()) in plain onnxruntime. "
    "Without it: `onnxmlu fuse --portable` writes a model that needs no library."
)


def describe_fused_model(model: onnx.ModelProto, *, hardware: str, strategy: str, precisions: list[str]) -> None:
    """Stamp ``model`` (in place) as written by onnxmlu: producer, and the ``onnxmlu.*``
    metadata_props (replacing any from an earlier run); ``precisions``: one per block."""
    model.producer_name, model.producer_version = "onnxmlu", __version__
    kept = [p for p in model.metadata_props if p.key not in METADATA_KEYS]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    counts = {p: precisions.count(p) for p in dict.fromkeys(precisions)}
    values = (RUNTIME_NOTE, __version__, hardware or "default", strategy or "custom",
              ", ".join(f"{p} x{n}" for p, n in counts.items()) if len(counts) > 1 else next(iter(counts), "fp32"),
              str(len(precisions)))
    for key, value in zip(METADATA_KEYS, values):
        model.metadata_props.add(key=key, value=value)


def block_node_name(index: int, mp: int) -> str:
    """A block's name: its node's in the fused file (what Netron shows, with its MP), and the
    block's everywhere else (``inspect``, ``report`` of the model and of the file, ``run --profile``)."""
    return f"block_{index} (mp={mp})"


def block_index(name: str) -> int | None:
    """The index in a :func:`block_node_name` (a nested block's, after its subgraph's ``.../``);
    None for a node named otherwise (renamed by hand, or not a block)."""
    found = re.fullmatch(r"block_(\d+) \(mp=\d+\)", name.rpartition("/")[2])
    return None if found is None else int(found.group(1))


#: The line a host node's ``doc_string`` gets in a fused file: why the plan left it on the host
#: (Netron shows it as the node's description; ``inspect`` and ``report`` of the file read it).
HOST_NOTE = "onnxmlu: on the host: "


def note_host_reason(node: onnx.NodeProto, reason: str) -> None:
    """Add ``reason`` to ``node``'s doc_string (in place) as the :data:`HOST_NOTE` line, after
    the node's own documentation."""
    own = [line for line in node.doc_string.splitlines() if not line.startswith(HOST_NOTE)]
    node.doc_string = "\n".join([*own, HOST_NOTE + reason])


def host_reason(node: onnx.NodeProto) -> str | None:
    """The reason :func:`note_host_reason` wrote into ``node``, None when the file has none."""
    notes = [line[len(HOST_NOTE):] for line in node.doc_string.splitlines() if line.startswith(HOST_NOTE)]
    return notes[-1] if notes else None


def record_pricing_shape(model: onnx.ModelProto, record: dict) -> None:
    """Stamp ``model`` (in place) with the shapes its plan was priced at (:data:`PRICING_SHAPE_KEY`)."""
    kept = [p for p in model.metadata_props if p.key != PRICING_SHAPE_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=PRICING_SHAPE_KEY, value=json.dumps(record, separators=(",", ":")))


def recorded_pricing_shape(metadata: dict[str, str]) -> dict | None:
    """The record of :func:`record_pricing_shape` in a model's :func:`model_metadata`; None for a
    file written without one (or with a damaged one)."""
    text = metadata.get(PRICING_SHAPE_KEY)
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:  # edited by hand: the file still runs; the shape is just not known
        return None
    return record if isinstance(record, dict) and isinstance(record.get("inputs"), dict) else None


def model_metadata(model: onnx.ModelProto) -> dict[str, str]:
    """The model's metadata_props as a dict."""
    return {p.key: p.value for p in model.metadata_props}


def ensure_registered() -> None:
    """Register the MLUFusionBlock schema with onnx once per process."""
    if defs.has(OP_TYPE, DOMAIN):
        return
    schema = defs.OpSchema(
        OP_TYPE, DOMAIN, VERSION, DOC,
        inputs=[_variadic("inputs", "Tensors entering the block, in body-input order.")],
        outputs=[_variadic("outputs", "Tensors leaving the block, in body-output order.")],
        type_constraints=[("T", _ALL_TENSOR_TYPES, "Any tensor type; mixed types allowed.")],
        attributes=[
            defs.OpSchema.Attribute("mp", defs.OpSchema.AttrType.INT, "Model parallelism (cores).", required=True),
            defs.OpSchema.Attribute("precision", defs.OpSchema.AttrType.STRING, "fp32 (default), fp16 or int8.", required=False),
            defs.OpSchema.Attribute("body", defs.OpSchema.AttrType.TENSOR, "Serialized ModelProto (uint8).", required=True),
            defs.OpSchema.Attribute(DIGEST, defs.OpSchema.AttrType.INT, "CRC-32 of the body's bytes.", required=False),
            defs.OpSchema.Attribute(SHARED_ATTRIBUTE, defs.OpSchema.AttrType.INT, "Last inputs that are shared weights.",
                                    required=False),
            defs.OpSchema.Attribute("layers", defs.OpSchema.AttrType.STRINGS, "Original node names.", required=False),
            defs.OpSchema.Attribute("op_types", defs.OpSchema.AttrType.STRINGS, "Original op types.", required=False),
            defs.OpSchema.Attribute("gops", defs.OpSchema.AttrType.FLOAT, "Operation count, GOPs.", required=False),
            defs.OpSchema.Attribute("sim_latency_us", defs.OpSchema.AttrType.FLOAT, "Simulated latency, us.", required=False),
        ],
    )
    defs.register_schema(schema)  # no inference function: see the module docstring


def _variadic(name: str, doc: str) -> defs.OpSchema.FormalParameter:
    return defs.OpSchema.FormalParameter(
        name, "T", doc, param_option=defs.OpSchema.FormalParameterOption.Variadic,
        is_homogeneous=False, min_arity=1,
    )


def type_block_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (changed in place) with a ``value_info`` for every MLUFusionBlock output that
    has no type yet, read from the block's body (outputs match the body's by position), so
    onnx's inference types everything downstream of a block. Checks each body's digest and
    output count; raises ``onnx.shape_inference.InferenceError`` naming the block."""
    typed = {v.name for v in (*model.graph.value_info, *model.graph.output) if v.type.HasField("tensor_type")}
    for node in model.graph.node:
        if not is_fusion_block(node):
            continue
        try:
            outputs = body_model(node).graph.output
        except (OnnxMluError, ValueError) as exc:  # damaged, or refers to a file
            raise onnx.shape_inference.InferenceError(str(exc)) from exc
        if len(outputs) != len(node.output):
            raise onnx.shape_inference.InferenceError(
                f"MLUFusionBlock {node.name!r}: body has {plural(len(outputs), 'output')}, node has {len(node.output)}")
        for name, value in zip(node.output, outputs):
            if name and name not in typed:
                info = model.graph.value_info.add()
                info.name = name
                info.type.CopyFrom(value.type)
    return model


def infer_shapes(model: onnx.ModelProto, strict_mode: bool = False, data_prop: bool = False) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` for a model that may hold MLUFusionBlock nodes:
    their outputs typed from their bodies first (:func:`type_block_outputs`); ``model`` is
    not changed."""
    return onnx.shape_inference.infer_shapes(type_block_outputs(copy_model(model)), strict_mode=strict_mode,
                                             data_prop=data_prop)


def body_bytes(attr: onnx.AttributeProto) -> bytes:
    """The serialized body a ``body`` attribute holds (uint8 TENSOR, or STRING for compatibility)."""
    if attr.type == onnx.AttributeProto.TENSOR:
        return attr.t.raw_data or bytes(attr.t.int32_data)
    if attr.type == onnx.AttributeProto.STRING:
        return attr.s
    raise ValueError(f"MLUFusionBlock body must be a uint8 tensor, got attribute type {attr.type}")


def body_model_from_attribute(attr: onnx.AttributeProto) -> onnx.ModelProto:
    """Parse a ``body`` attribute (uint8 TENSOR, or STRING for compatibility); the digest is
    checked by :func:`body_model`, which sees the whole node."""
    body = onnx.ModelProto()
    body.ParseFromString(body_bytes(attr))
    return body


def block_precision(node: onnx.NodeProto) -> str:
    """The precision an MLUFusionBlock node runs at: its ``precision`` attribute, ``fp32``
    when it has none (files written before the attribute existed)."""
    for attr in node.attribute:
        if attr.name == "precision":
            return attr.s.decode()
    return "fp32"


def body_model(node: onnx.NodeProto) -> onnx.ModelProto:
    """The block model held by an MLUFusionBlock node; raises :class:`BodyDigestError` when
    the body's bytes do not match the node's ``body_crc32``, :class:`BodyFileReferenceError`
    when the body refers to a file, :class:`BodyLabelError` when its ``precision`` is not what
    the body computes (every Python reader comes through here). Shared weights come back as
    the body's last graph inputs (:func:`open_body`)."""
    attrs = {a.name: a for a in node.attribute}
    if "body" not in attrs:
        raise ValueError(f"MLUFusionBlock {node.name!r} has no body attribute")
    verify_body(node)
    body = body_model_from_attribute(attrs["body"])
    refuse_file_references(node, body)
    refuse_mislabel(node, body)
    return open_body(body, shared_names(node))


# ------------------------------------------------------------------------ shared weights
#: The node attribute counting the node's last inputs that are shared weights.
SHARED_ATTRIBUTE = "shared_weights"
#: The external-data location of a placeholder: never a file, the node's input.
SHARED_LOCATION = "onnxmlu:outer-constant"


def placeholder(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """``tensor``'s name, type and dims, its data an external reference to the node's input."""
    ref = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                           data_location=onnx.TensorProto.EXTERNAL)
    ref.external_data.add(key="location", value=SHARED_LOCATION)
    return ref


def is_placeholder(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL and [(e.key, e.value) for e in tensor.external_data] == [
        ("location", SHARED_LOCATION)]


def shared_names(node: onnx.NodeProto) -> list[str]:
    """The node's shared-weight inputs (its last ``shared_weights`` inputs)."""
    count = next((a.i for a in node.attribute if a.name == SHARED_ATTRIBUTE), 0)
    return list(node.input[len(node.input) - count:]) if count > 0 else []


def open_body(body: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """``body`` (changed in place) with the placeholders of ``names`` turned into graph inputs
    after its own, in that order: the body as a function of all the node's inputs."""
    if not names:
        return body
    graph = body.graph
    found = {t.name: t for t in graph.initializer if t.name in set(names) and is_placeholder(t)}
    kept = [t for t in graph.initializer if t.name not in found]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for name in names:
        tensor = found.get(name)
        if tensor is not None:
            graph.input.append(onnx.helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims)))
    return body


def close_body(body: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """:func:`open_body` undone: the graph inputs of ``names`` (typed, of concrete dims) become
    placeholders again, in place; the node that carries the body passes them last."""
    graph, wanted = body.graph, set(names)
    found = {vi.name: vi for vi in graph.input if vi.name in wanted}
    kept = [vi for vi in graph.input if vi.name not in wanted]
    del graph.input[:]
    graph.input.extend(kept)
    for name in names:
        tt = found[name].type.tensor_type
        graph.initializer.append(placeholder(onnx.TensorProto(name=name, data_type=tt.elem_type,
                                                              dims=[d.dim_value for d in tt.shape.dim])))
    return body


class BodyDigestError(OnnxMluError):
    """A block's body does not match its ``body_crc32``: the file is damaged."""


class BodyFileReferenceError(OnnxMluError):
    """A block's body refers to a file (a tensor with external data): refused, never read."""


def file_references(body: onnx.ModelProto, shared: Sequence[str] = ()) -> list[str]:
    """Every tensor of ``body`` that keeps its data in a file, described ("initializer 'w' in
    'secret.txt'"): initializers, sparse initializers and tensor attributes, in every subgraph
    and local function. A body must hold its weights inline: loaded from bytes, a relative
    location would resolve against the process's working directory, not the model's folder.
    The one exception: a main-graph initializer named in ``shared`` (the node's shared-weight
    inputs) that refers to the node's input (:func:`placeholder`)."""
    graphs = [*iter_graphs(body.graph), *(g for f in body.functions for n in f.node for sub in node_subgraphs(n)
                                          for g in iter_graphs(sub))]
    allowed = {t.name for t in body.graph.initializer if t.name in set(shared) and is_placeholder(t)}
    found = [f"{where} in {_location(t)!r}" for g in graphs for where, t in _graph_tensors(g)
             if _is_external(t) and not (g is body.graph and t.name in allowed and is_placeholder(t))]
    found += [f"{where} in {_location(t)!r}" for f in body.functions for where, t in _node_tensors(f.node)
              if _is_external(t)]
    return found


def _graph_tensors(graph: onnx.GraphProto):
    yield from ((f"initializer {t.name!r}", t) for t in graph.initializer)
    yield from ((f"sparse initializer {s.values.name!r}", t) for s in graph.sparse_initializer
                for t in (s.values, s.indices))
    yield from _node_tensors(graph.node)


def _node_tensors(nodes):
    for node in nodes:
        for a in node.attribute:
            sparse = ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors)
            tensors = ([a.t] if a.HasField("t") else []) + list(a.tensors) + [t for s in sparse for t in (s.values, s.indices)]
            yield from ((f"attribute {a.name!r} of node {node.name or node.op_type!r}", t) for t in tensors)


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data) > 0


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "?")


def refuse_file_references(node: onnx.NodeProto, body: onnx.ModelProto) -> None:
    """Raise :class:`BodyFileReferenceError` (naming the block and the first tensor) when the
    body refers to a file; the library refuses the same bodies at session creation."""
    found = file_references(body, shared_names(node))
    if found:
        raise BodyFileReferenceError(
            f"MLUFusionBlock {node.name or '<unnamed>'!r}: body refers to a file ({found[0]}"
            f"{f' and {len(found) - 1} more' if len(found) > 1 else ''}); a block body must hold its weights "
            "inline, and onnxmlu never reads files for it")


class BodyLabelError(OnnxMluError):
    """A block's ``precision`` is not what its body computes (:func:`label_mismatch`)."""


#: ONNX element types a Cast to which turns INT8 weights into float ones.
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                          onnx.TensorProto.DOUBLE})


def label_mismatch(precision: str, body: onnx.ModelProto) -> str | None:
    """Why ``body`` is not what a block labelled ``precision`` computes, or None: an ``int8``
    body holds quantized arithmetic -- a quantized operator (``QuantizeLinear``,
    ``DequantizeLinear``, ``DynamicQuantizeLinear``, ``QLinear*``, ``ConvInteger``,
    ``MatMulInteger``, contrib ``Q*`` ops) or an 8-bit integer initializer cast to a float type --
    and an ``fp16`` body a float16 value (an initializer, a ``Cast`` to float16, a graph input,
    output or value_info of that type). The body's main graph is read; the custom-op library
    applies the same rule when a session is created (custom_ops/label_rule.cc, LabelMismatch)."""
    graph = body.graph
    holds = _BODY_HOLDS.get(precision)
    if holds is not None and not holds(graph):
        return f"labelled {precision} but its body holds no {RECORDS[precision].body_holds}"
    return None


def _holds_int8(graph: onnx.GraphProto) -> bool:
    eight_bit = {t.name for t in graph.initializer if t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)}
    return any(_is_quantized_operator(n.op_type) or (n.op_type == "Cast" and n.input and n.input[0] in eight_bit
                                                     and _cast_to(n) in _FLOAT_TYPES) for n in graph.node)


def _holds_element(element_type: int):
    """The check that a body holds a value of ``element_type``: an initializer, a Cast to it,
    or a graph input, output or value_info of that type (label_rule.cc: kElementType)."""
    def holds(graph: onnx.GraphProto) -> bool:
        values = (*graph.input, *graph.output, *graph.value_info)
        return (any(t.data_type == element_type for t in graph.initializer)
                or any(n.op_type == "Cast" and _cast_to(n) == element_type for n in graph.node)
                or any(v.type.tensor_type.elem_type == element_type for v in values))
    return holds


#: The standard quantized operators; contrib ones are named with ``Quantize`` or ``Q`` + capital.
_QUANTIZED_OPERATORS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                                  "QLinearMatMul", "ConvInteger", "MatMulInteger"})


def _is_quantized_operator(op: str) -> bool:
    return op in _QUANTIZED_OPERATORS or "Quantize" in op or (len(op) > 1 and op[0] == "Q" and op[1].isupper())


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def refuse_mislabel(node: onnx.NodeProto, body: onnx.ModelProto) -> None:
    """Raise :class:`BodyLabelError` naming the block when its ``precision`` attribute is not
    what ``body`` computes (the library refuses the same nodes when a session is created)."""
    mismatch = label_mismatch(block_precision(node), body)
    if mismatch:
        raise BodyLabelError(f"MLUFusionBlock {node.name or '<unnamed>'!r}: {mismatch}; "
                             "a block's precision must say what its body computes")


def body_digest(data: bytes) -> int:
    """The ``body_crc32`` of serialized body bytes (CRC-32, as zlib computes it)."""
    return zlib.crc32(data)


def verify_body(node: onnx.NodeProto, data: bytes | None = None) -> bool:
    """Check an MLUFusionBlock node's body against its ``body_crc32``. True when it matches,
    False when the node has no digest (older files) or no inline body (external data: the
    library checks it when it loads); raises :class:`BodyDigestError` when it does not match.
    ``data``: the body's bytes when the caller has them already (protobuf copies them on
    every read)."""
    attrs = {a.name: a for a in node.attribute}
    body, digest = attrs.get("body"), attrs.get(DIGEST)
    if body is None or digest is None or (body.type == onnx.AttributeProto.TENSOR and body.t.external_data):
        return False
    data = body_bytes(body) if data is None else data
    problem = _digest_problem(data, _digest_value(digest))
    if problem:
        raise BodyDigestError(f"MLUFusionBlock {node.name or '<unnamed>'!r}: {problem}")
    return True


def _digest_value(attr: onnx.AttributeProto):
    """The digest attribute's value (an int when it is well-formed, else what it holds)."""
    if attr.type == onnx.AttributeProto.INT:
        return attr.i
    try:
        return onnx.helper.get_attribute_value(attr)
    except ValueError:  # an attribute without a type: show that
        return None


def _digest_problem(data: bytes, expected) -> str | None:
    """Why ``data`` does not match the digest ``expected`` (None: it matches)."""
    if not isinstance(expected, int) or isinstance(expected, bool) or not 0 <= expected <= 0xFFFFFFFF:
        return f"attribute {DIGEST!r} must be an int from 0 to 4294967295 (a CRC-32), got {expected!r}"
    actual = body_digest(data)
    if actual != expected:
        return (f"body is corrupt: its {plural(len(data), 'byte')} have CRC-32 0x{actual:08x} but attribute {DIGEST!r} "
                f"says 0x{expected:08x} (the model file was damaged or the body edited)")
    return None


def add_body(node: onnx.NodeProto, data: bytes) -> None:
    """Attach ``data`` (a serialized ModelProto) to ``node`` as its ``body`` and ``body_crc32``."""
    fill_body_attribute(node.attribute.add(), data)
    set_body_digest(node, data)


def set_body_digest(node: onnx.NodeProto, data: bytes) -> None:
    """Set (or add) the node's ``body_crc32`` for the body bytes ``data``."""
    for attr in node.attribute:
        if attr.name == DIGEST:
            attr.type, attr.i = onnx.AttributeProto.INT, body_digest(data)
            return
    node.attribute.append(onnx.helper.make_attribute(DIGEST, body_digest(data)))


def fill_body_attribute(attr: onnx.AttributeProto, data: bytes) -> None:
    """Make ``attr`` the ``body`` attribute holding ``data`` (a serialized ModelProto) as a 1-D
    uint8 tensor, in place: ``make_tensor``/``make_attribute`` would copy the bytes twice more."""
    fill_body_header(attr, len(data))
    attr.t.raw_data = data


def fill_body_header(attr: onnx.AttributeProto, size: int) -> None:
    """Make ``attr`` the ``body`` attribute of a ``size``-byte body, all but the bytes
    (``t.raw_data``), for a writer that frames them itself (:mod:`onnxmlu.ir.wire`)."""
    attr.name, attr.type = "body", onnx.AttributeProto.TENSOR
    attr.t.name, attr.t.data_type = "body", onnx.TensorProto.UINT8
    attr.t.dims.append(size)


#: What a body labelled with each precision must hold (the records' ``body_holds``, checked).
_BODY_HOLDS = {INT8.name: _holds_int8, FP16.name: _holds_element(onnx.TensorProto.FLOAT16)}
