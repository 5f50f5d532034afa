"""Standard-domain ops that onnxruntime defines and onnx does not, at a model's opset.

onnxruntime registers a few operators of its own in the standard domain, below the opset in
which ONNX adopted them or with no ONNX counterpart at all, and its graph optimizer writes them
into the models it saves: ``LayerNormalization`` in an opset-14 model (ONNX has it from 17),
``SimplifiedLayerNormalization`` (an RMS norm). onnx's checker refuses such a node ("No Op
registered"); onnxruntime runs the model. The toolkit takes what onnxruntime runs: the checker's
node rules are skipped for such a node; the rewriters substitute the ones they know
(``LayerNormalization``, ``SimplifiedLayerNormalization``: :mod:`onnxmlu.rewrite.skipnorm`) and the
analysis leaves the rest on the host with :func:`extension_reason` (the accelerator's op table
is ONNX's ops at their ONNX semantics).

A node of one of onnxruntime's own domains (``com.microsoft``) in a model that imports no opset
for that domain -- ``onnx.save`` of the optimizer's in-memory model writes none; its
``save_model_to_file`` adds it -- runs in onnxruntime; the checker refuses the model.
:func:`import_runtime_domains` adds the import at the version onnxruntime defines those ops at
(``load_model`` does, for every command: the file itself is not changed).

The question is answered from onnxruntime's own operator schemas, so it tracks the installed
onnxruntime rather than a list kept here.
"""

from __future__ import annotations

import functools

import onnx

from onnxmlu.ir import is_default_domain, iter_graphs
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


def import_runtime_domains(model: onnx.ModelProto) -> list[str]:
    """Add an opset import for each non-standard domain a node of ``model`` (any graph) uses
    without one, where onnxruntime defines every such op of that domain (module docstring): at
    the highest of their versions. Returns the ``domain:version`` imports added."""
    imported = {imp.domain for imp in model.opset_import}
    used: dict[str, set[str]] = {}
    for graph in iter_graphs(model.graph):
        for node in graph.node:
            if not is_default_domain(node.domain) and node.domain not in imported:
                used.setdefault(node.domain, set()).add(node.op_type)
    added = []
    schemas = _runtime_schemas()
    for domain, ops in sorted(used.items()):
        versions = [schemas.get((domain, op)) for op in sorted(ops)]
        if versions and None not in versions:
            model.opset_import.append(onnx.helper.make_opsetid(domain, max(versions)))
            added.append(f"{domain}:{max(versions)}")
    return added
