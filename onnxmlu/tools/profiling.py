"""Measured per-block CPU time, next to the simulated accelerator time.

onnxruntime's own profiler records one ``Node`` event per kernel call with its duration in
microseconds; for a fused model each MLUFusionBlock node is one kernel, so the median over
the repeated runs is that block's measured CPU time (blocks are not merged into one inner
session here, as ``onnxmlu.InferenceSession`` does for a run, so that each keeps its own time).

A block's ``sim_latency_us`` attribute is its simulated time at the pricing shape
(``onnxmlu.pricing_shape``). A run at another shape is re-priced (:func:`reprice_blocks`): the
performance model is a pure function of the layers' sizes, so each FP32 block's body is
analysed at the shapes its inputs take in this run (one observed run of the model) and priced
at its MP on the hardware profile the file names -- at the pricing shape that gives back the
attribute exactly. An FP16 or INT8 body holds the casts or quantization pairs its precision
added, which analyse as layers of their own: those blocks keep the pricing shape's figure.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx

from onnxmlu.ir import copy_model
from onnxmlu.optional import optional_import
from onnxmlu.plan.perf.hardware import DEFAULT_PROFILE, load_hardware
from onnxmlu.precisions import DEFAULT_PRECISION
from onnxmlu.plan.perf.model import block_latency_us
from onnxmlu.schema import block_precision, body_model, is_fusion_block, model_metadata


@dataclass(frozen=True)
class NodeProfile:
    name: str
    op_type: str
    mp: int | None
    sim_latency_us: float | None
    measured_us: float
    #: The block's precision (``fp32`` when its node has no attribute); None for other nodes.
    precision: str | None = None
    #: Simulated latency re-priced at this run's shape (:func:`reprice_blocks`); None when not re-priced.
    sim_here_us: float | None = None
    #: A node onnxruntime's graph optimizer made in the session (a layout change, a fusion): not
    #: in the file, named as onnxruntime names it; the file's nodes it replaced have no row.
    from_optimizer: bool = False


def profile_nodes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[NodeProfile]:
    """Median measured time per node (kernel) over ``repeat`` runs, in graph order; then the
    kernels of nodes onnxruntime's optimizer made (an NCHWc Conv and its reorders in place of a
    host Conv), so that no measured time is left out of the table and its total."""
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
    made: dict[str, str] = {}  # kernel name -> its op type
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            name = event["name"][: -len("_kernel_time")]
            durations.setdefault(name, []).append(float(event["dur"]))
            made.setdefault(name, event.get("args", {}).get("op_name", ""))
    in_file = [_node_profile(n, durations) for n in model.graph.node if (n.name or n.op_type) in durations]
    named = {p.name for p in in_file}
    return in_file + [NodeProfile(name, op, None, None, statistics.median(durations[name]), from_optimizer=True)
                      for name, op in made.items() if name not in named]


def _node_profile(node: onnx.NodeProto, durations: dict[str, list[float]]) -> NodeProfile:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
             if a.name in ("mp", "sim_latency_us")}
    return NodeProfile(node.name or node.op_type, node.op_type,
                       int(attrs["mp"]) if is_fusion_block(node) and "mp" in attrs else None,
                       float(attrs["sim_latency_us"]) if "sim_latency_us" in attrs else None,
                       statistics.median(durations[node.name or node.op_type]),
                       block_precision(node) if is_fusion_block(node) else None)


def reprice_blocks(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                   analyse: Callable[[onnx.ModelProto, dict], "object"]) -> dict[str, float]:
    """Block name -> its simulated latency at the shapes of ``feeds`` (module docstring), for
    every FP32 block of the main graph whose body's nodes all price as accelerator layers.
    ``analyse(body, pins)`` gives a body's analysis at its input pins (:func:`onnxmlu.api.inspect`
    without rewriting, handed down: this layer sits below the API)."""
    shapes = _block_input_shapes(model, feeds)
    hardware = load_hardware(model_metadata(model).get("onnxmlu.hardware") or DEFAULT_PROFILE)
    priced = {}
    for node in model.graph.node:
        mp = next((a.i for a in node.attribute if a.name == "mp"), None)
        if not is_fusion_block(node) or block_precision(node) != DEFAULT_PRECISION or mp is None:
            continue
        body = body_model(node)
        pins = {vi.name: shapes[name] for vi, name in zip(body.graph.input, node.input) if name in shapes}
        analysis = analyse(body, pins)
        if analysis.layers and not analysis.host_nodes():
            priced[node.name or node.op_type] = block_latency_us(analysis.layers, mp, hardware)
    return priced


def _block_input_shapes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, list[int]]:
    """The shape of every tensor a main-graph block reads, observed in one run on ``feeds``."""
    stored = {t.name for t in model.graph.initializer}
    read = [x for n in model.graph.node if is_fusion_block(n) for x in n.input if x and x not in stored]
    observed = copy_model(model)
    listed = {o.name for o in observed.graph.output} | set(feeds)
    observed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(x) for x in dict.fromkeys(read)
                                 if x not in listed)
    session = optional_import("onnxmlu.runtime").InferenceSession(observed)
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, session.run(names, dict(feeds))))
    return {name: list(np.shape(v)) for name, v in {**values, **feeds}.items()}
