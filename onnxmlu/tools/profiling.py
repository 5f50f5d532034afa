"""Measured per-block CPU time, next to the simulated accelerator time.

onnxruntime's own profiler records one ``Node`` event per kernel call with its duration in
microseconds; for a fused model each MLUFusionBlock node is one kernel, so the median over
the repeated runs is that block's measured CPU time (blocks are not merged into one inner
session here, as ``onnxmlu.InferenceSession`` does for a run, so that each keeps its own time).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from onnxmlu.schema import block_precision, is_fusion_block
from onnxmlu.optional import optional_import


@dataclass(frozen=True)
class NodeProfile:
    name: str
    op_type: str
    mp: int | None
    sim_latency_us: float | None
    measured_us: float
    #: The block's precision (``fp32`` when its node has no attribute); None for other nodes.
    precision: str | None = None


def profile_nodes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[NodeProfile]:
    """Median measured time per node (kernel) over ``repeat`` runs, in graph order."""
    runtime = optional_import("onnxmlu.runtime")
    with tempfile.TemporaryDirectory() as folder:
        options = runtime.session_options()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "onnxmlu")
        session = runtime.InferenceSession(model, options, merge_blocks=False)  # a time per block
        for _ in range(repeat):
            session.run(None, dict(feeds))
        events = json.loads(Path(session.end_profiling()).read_text())
    durations: dict[str, list[float]] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            durations.setdefault(event["name"][: -len("_kernel_time")], []).append(float(event["dur"]))
    return [_node_profile(n, durations) for n in model.graph.node if (n.name or n.op_type) in durations]


def _node_profile(node: onnx.NodeProto, durations: dict[str, list[float]]) -> NodeProfile:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
             if a.name in ("mp", "sim_latency_us")}
    return NodeProfile(node.name or node.op_type, node.op_type,
                       int(attrs["mp"]) if is_fusion_block(node) and "mp" in attrs else None,
                       float(attrs["sim_latency_us"]) if "sim_latency_us" in attrs else None,
                       statistics.median(durations[node.name or node.op_type]),
                       block_precision(node) if is_fusion_block(node) else None)
