"""The ``com.onnxmlu::MLUFusionBlock`` operator: its ONNX schema and helpers to read a node.

Format (version 1) — one node per fused block:

* inputs: the tensors entering the block (any element types, variadic, heterogeneous);
* outputs: the block's tensors used after it (any element types, variadic, heterogeneous);
* ``mp`` (INT, required): cores the block runs on, 1..cores of the hardware profile;
* ``body`` (TENSOR, uint8, 1-D): the block as a serialized ModelProto with its weights.
  Its graph inputs/outputs match the node's inputs/outputs by position. A STRING ``body``
  from older files is still read by :func:`body_model` and by the runtime;
* ``layers``, ``op_types`` (STRINGS), ``gops``, ``sim_latency_us`` (FLOAT): metadata
  for people (Netron) and reports.

Registering the schema (``ensure_registered``) lets ``onnx.checker.check_model(full_check=True)``
and ``onnx.shape_inference`` handle fused models; its inference function reads output types
from the body.
"""

from __future__ import annotations

import onnx
from onnx import defs

from onnxmlu.ir.graphs import FUSION_DOMAIN as DOMAIN
from onnxmlu.ir.graphs import FUSION_OP_TYPE as OP_TYPE
from onnxmlu.ir.graphs import is_fusion_block  # noqa: F401 - the format's predicate, read here too

VERSION = 1

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
            defs.OpSchema.Attribute("body", defs.OpSchema.AttrType.TENSOR, "Serialized ModelProto (uint8).", required=True),
            defs.OpSchema.Attribute("layers", defs.OpSchema.AttrType.STRINGS, "Original node names.", required=False),
            defs.OpSchema.Attribute("op_types", defs.OpSchema.AttrType.STRINGS, "Original op types.", required=False),
            defs.OpSchema.Attribute("gops", defs.OpSchema.AttrType.FLOAT, "Operation count, GOPs.", required=False),
            defs.OpSchema.Attribute("sim_latency_us", defs.OpSchema.AttrType.FLOAT, "Simulated latency, us.", required=False),
        ],
    )
    schema.set_type_and_shape_inference_function(_infer_outputs)
    defs.register_schema(schema)


def _variadic(name: str, doc: str) -> defs.OpSchema.FormalParameter:
    return defs.OpSchema.FormalParameter(
        name, "T", doc, param_option=defs.OpSchema.FormalParameterOption.Variadic,
        is_homogeneous=False, min_arity=1,
    )


def _infer_outputs(ctx) -> None:
    body = body_model_from_attribute(ctx.get_attribute("body"))
    outputs = body.graph.output
    if len(outputs) != ctx.get_num_outputs():
        raise onnx.shape_inference.InferenceError(
            f"MLUFusionBlock body has {len(outputs)} outputs, node has {ctx.get_num_outputs()}")
    for i, value in enumerate(outputs):
        ctx.set_output_type(i, value.type)


def body_model_from_attribute(attr: onnx.AttributeProto) -> onnx.ModelProto:
    """Parse a ``body`` attribute (uint8 TENSOR, or STRING for compatibility)."""
    if attr.type == onnx.AttributeProto.TENSOR:
        data = attr.t.raw_data or bytes(attr.t.int32_data)
    elif attr.type == onnx.AttributeProto.STRING:
        data = attr.s
    else:
        raise ValueError(f"MLUFusionBlock body must be a uint8 tensor, got attribute type {attr.type}")
    body = onnx.ModelProto()
    body.ParseFromString(data)
    return body


def body_model(node: onnx.NodeProto) -> onnx.ModelProto:
    """The block model held by an MLUFusionBlock node."""
    for attr in node.attribute:
        if attr.name == "body":
            return body_model_from_attribute(attr)
    raise ValueError(f"MLUFusionBlock {node.name!r} has no body attribute")


def body_attribute(body: onnx.ModelProto) -> onnx.AttributeProto:
    attr = onnx.AttributeProto()
    fill_body_attribute(attr, body.SerializeToString())
    return attr


def fill_body_attribute(attr: onnx.AttributeProto, data: bytes) -> None:
    """Make ``attr`` the ``body`` attribute holding ``data`` (a serialized ModelProto) as a 1-D
    uint8 tensor, in place: ``make_tensor``/``make_attribute`` would copy the bytes twice more."""
    attr.name, attr.type = "body", onnx.AttributeProto.TENSOR
    attr.t.name, attr.t.data_type = "body", onnx.TensorProto.UINT8
    attr.t.dims.append(len(data))
    attr.t.raw_data = data
