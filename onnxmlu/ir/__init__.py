"""The thin ONNX layer every stage uses: one helper for each chore on ``onnx`` protos.

* walking graphs: :func:`subgraphs` (of an attribute or a node), :func:`subgraph` (a node's
  graph attribute by name), :func:`iter_graphs` (a graph
  and everything nested in it, outermost first), :func:`nested_graphs`, :func:`graphs_by_branch`;
* nodes: :func:`attribute_value`;
* scopes: :func:`node_inputs` (explicit inputs plus the outer-scope names its subgraphs read),
  :func:`outer_scope_names`, :func:`unresolved_names` (a soundness check of a whole model);
* order: :func:`sort_graphs` puts the nodes of every graph in a topological order;
  :func:`topological_order` orders one graph keeping accelerator nodes in long runs;
* facts: :class:`GraphIndex` (producers, consumers, constants, types, shapes of one graph);
* models: :func:`copy_model`, :func:`copy_model_fields`, :func:`fed_inputs`, :func:`opset_version`,
  :func:`drop_unread_initializers`;
* domains: :data:`DEFAULT_DOMAINS`, :func:`is_default_domain`, :func:`is_fusion_block`.
* bytes: :mod:`onnxmlu.ir.wire` (protobuf framing written around buffers), :mod:`onnxmlu.ir.mapped`
  (a model file parsed through a memory map); imported by their users, not here.
"""

from onnxmlu.ir.graphs import (
    DEFAULT_DOMAINS,
    FUSION_DOMAIN,
    FUSION_OP_TYPE,
    attribute_value,
    branch_attributes,
    copy_model,
    copy_model_fields,
    drop_unread_initializers,
    fed_inputs,
    graphs_by_branch,
    is_default_domain,
    is_fusion_block,
    iter_graphs,
    nested_graphs,
    node_inputs,
    node_subgraphs,
    opset_version,
    outer_scope_names,
    sort_graphs,
    subgraph,
    subgraphs,
    unresolved_names,
)
from onnxmlu.ir.index import GraphIndex, topological_order

__all__ = [
    "DEFAULT_DOMAINS",
    "FUSION_DOMAIN",
    "FUSION_OP_TYPE",
    "GraphIndex",
    "attribute_value",
    "branch_attributes",
    "copy_model",
    "copy_model_fields",
    "drop_unread_initializers",
    "fed_inputs",
    "graphs_by_branch",
    "is_default_domain",
    "is_fusion_block",
    "iter_graphs",
    "nested_graphs",
    "node_inputs",
    "node_subgraphs",
    "opset_version",
    "outer_scope_names",
    "sort_graphs",
    "subgraph",
    "subgraphs",
    "topological_order",
    "unresolved_names",
]
