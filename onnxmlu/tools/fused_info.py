"""What a fused model holds, read from the file alone: ``onnxmlu inspect FUSED.onnx``.

One row per MLUFusionBlock node (mp, precision, layers, simulated µs, body size) in graph
order, the main graph's first, then those inside host control flow (``graph``: the subgraph
holding it), the main graph's host nodes, and the ``onnxmlu.*`` metadata the model was written with
(:func:`onnxmlu.schema.describe_fused_model`). Every body goes through
:func:`onnxmlu.schema.body_model`, so a damaged body or one that refers to a file is refused
here as in the library.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from onnxmlu.ir import iter_graphs
from onnxmlu.frontend.pins import PricingShape
from onnxmlu.schema import (block_precision, body_model, host_reason, is_fusion_block, model_metadata,
                            recorded_pricing_shape)


@dataclass(frozen=True)
class BlockRow:
    name: str
    mp: int | None
    precision: str
    layers: int
    sim_latency_us: float | None
    body_bytes: int
    graph: str = ""  # the subgraph holding the block ("" for the main graph)
    #: (name, op type) of each layer, from the node's ``layers`` / ``op_types`` (else its body's nodes).
    members: tuple[tuple[str, str], ...] = ()
    gops: float | None = None  # the node's gops attribute


@dataclass
class FusedSummary:
    """The ``inspect`` report of a fused model (schema ``onnxmlu.inspect-fused/1``)."""

    producer: str
    metadata: dict[str, str]
    blocks: list[BlockRow]
    host_nodes: list[dict[str, str]]

    @property
    def pricing(self) -> PricingShape | None:
        """The shapes the plan was priced at (``onnxmlu.pricing_shape``), None when not recorded."""
        record = recorded_pricing_shape(self.metadata)
        return None if record is None else PricingShape.from_dict(record)

    def layer_rows(self) -> list[list[dict]]:
        """Per main-graph block, its layers (name, op type, precision, MP): the report's drill-down
        (a file records no per-layer time)."""
        return [[{"name": n, "op_type": op, "precision": b.precision, "mp": b.mp} for n, op in b.members]
                for b in self.blocks if not b.graph]

    def to_dict(self) -> dict:
        main = [b for b in self.blocks if not b.graph]
        simulated = [b.sim_latency_us for b in main if b.sim_latency_us is not None]
        return {
            "producer": self.producer,
            "metadata": dict(self.metadata),
            "blocks": [{"block": b.name, "mp": b.mp, "precision": b.precision, "layers": b.layers,
                        "sim_latency_us": b.sim_latency_us, "body_bytes": b.body_bytes, "graph": b.graph,
                        "gops": b.gops, "first": b.members[0][0] if b.members else "",
                        "last": b.members[-1][0] if b.members else ""}
                       for b in self.blocks],
            "host_nodes": list(self.host_nodes),
            "sim_latency_us": sum(simulated) if len(simulated) == len(main) else None,
            "pricing_shape": None if self.pricing is None else self.pricing.to_dict(),
        }


def summarize_fused(model: onnx.ModelProto) -> FusedSummary | None:
    """The summary of ``model``, or None when it holds no MLUFusionBlock node."""
    blocks = [_block_row(n, "" if g is model.graph else g.name)
              for g in iter_graphs(model.graph) for n in g.node if is_fusion_block(n)]
    if not blocks:
        return None
    host = [_host_row(n) for n in model.graph.node if not is_fusion_block(n)]
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return FusedSummary(producer, model_metadata(model), blocks, host)


def _host_row(node: onnx.NodeProto) -> dict[str, str]:
    """A host node as inspect reports it, with the reason the fuse recorded (files written
    before the record have none)."""
    row = {"node": node.name or node.op_type, "op_type": node.op_type, "domain": node.domain or "ai.onnx"}
    reason = host_reason(node)
    if reason is not None:
        row["reason"] = reason
    return row


def _block_row(node: onnx.NodeProto, graph: str) -> BlockRow:
    body = body_model(node)  # digest and file references checked
    attrs = {a.name: a for a in node.attribute}
    layers = attrs.get("layers")
    latency, gops = attrs.get("sim_latency_us"), attrs.get("gops")
    mp = attrs.get("mp")
    names = ([x.decode() for x in layers.strings] if layers is not None
             else [n.name or n.op_type for n in body.graph.node])
    ops = [x.decode() for x in attrs["op_types"].strings] if "op_types" in attrs else []
    if len(ops) != len(names):  # no (or another count of) op types: the body's nodes say them, if they match
        ops = [n.op_type for n in body.graph.node] if len(body.graph.node) == len(names) else ["?"] * len(names)
    return BlockRow(
        name=node.name or "<unnamed>",
        mp=mp.i if mp is not None and mp.type == onnx.AttributeProto.INT else None,
        precision=block_precision(node),
        layers=len(layers.strings) if layers is not None else len(body.graph.node),
        sim_latency_us=latency.f if latency is not None and latency.type == onnx.AttributeProto.FLOAT else None,
        body_bytes=body.ByteSize(),
        graph=graph,
        members=tuple(zip(names, ops)),
        gops=gops.f if gops is not None and gops.type == onnx.AttributeProto.FLOAT else None,
    )
