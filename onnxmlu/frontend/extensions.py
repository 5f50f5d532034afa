"""Standard-domain ops that onnxruntime defines and onnx does not, at a model's opset.

onnxruntime registers a few operators of its own in the standard domain, below the opset in
which ONNX adopted them or with no ONNX counterpart at all, and its graph optimizer writes them
into the models it saves: ``LayerNormalization`` in an opset-14 model (ONNX has it from 17),
``SimplifiedLayerNormalization`` (an RMS norm). onnx's checker refuses such a node ("No Op
registered"); onnxruntime runs the model. The toolkit takes what onnxruntime runs: the checker's
node rules are skipped for such a node, and the analysis leaves it on the host with
:func:`extension_reason` (the accelerator's op table is ONNX's ops at their ONNX semantics).

The question is answered from onnxruntime's own operator schemas, so it tracks the installed
onnxruntime rather than a list kept here.
"""

from __future__ import annotations

import functools

import onnx

from onnxmlu.ir import is_default_domain
from onnxmlu.optional import optional_import


def has_onnx_schema(op_type: str, domain: str, opset: int) -> bool:
    """Whether onnx defines ``op_type`` in ``domain`` at ``opset`` (or an earlier version)."""
    try:
        return onnx.defs.has(op_type, opset, domain or "")
    except TypeError:  # an old onnx without max_inclusive_version
        return onnx.defs.has(op_type, domain or "")


@functools.lru_cache(maxsize=None)
def _runtime_schemas() -> dict[tuple[str, str], int]:
    """(domain, op type) -> the lowest version at which onnxruntime registers a schema."""
    try:
        schemas = optional_import("onnxruntime.capi.onnxruntime_pybind11_state").get_all_operator_schema()
    except (ImportError, AttributeError):  # a build without the schema list: nothing is an extension
        return {}
    found: dict[tuple[str, str], int] = {}
    for schema in schemas:
        key = ("" if is_default_domain(schema.domain) else schema.domain, schema.name)
        found[key] = min(found.get(key, schema.since_version), schema.since_version)
    return found


def is_runtime_extension(node: onnx.NodeProto, opset: int | None) -> bool:
    """A standard-domain node that onnx has no schema for at ``opset`` and onnxruntime has."""
    if opset is None or not is_default_domain(node.domain):
        return False
    if has_onnx_schema(node.op_type, "", opset):
        return False
    since = _runtime_schemas().get(("", node.op_type))
    return since is not None and since <= opset


def extension_reason(node: onnx.NodeProto, opset: int | None) -> str | None:
    """Why such a node stays on the host, or None for an ordinary node."""
    if not is_runtime_extension(node, opset):
        return None
    return (f"{node.op_type} has no ONNX schema at opset {opset}; it is onnxruntime's own operator "
            "(its optimizer writes it), which the host runs")
