"""The simulated accelerator: layer descriptions, hardware profiles and the performance model.

Nothing in this package imports onnx: it is pure arithmetic over frozen dataclasses, so a
strategy can be tested on synthetic layer chains without building a graph.
"""
