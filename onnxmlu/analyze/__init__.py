"""Pipeline stage "analyze": the layer table the planner works on.

``optable`` is the accelerator's op set (which nodes may run inside a block, and why the others
stay on the host); ``layers`` puts the main graph in a topological order that keeps accelerator
nodes in long runs and describes each accelerator node as a :class:`~onnxmlu.plan.perf.layers.Layer`;
``quantized`` finds the layers a model that arrives quantized computes in INT8, and the weight
dequantizations carried into their blocks.
"""

from onnxmlu.analyze.layers import CONSTANT_REASON, Analysis, analyze

__all__ = ["CONSTANT_REASON", "Analysis", "analyze"]
