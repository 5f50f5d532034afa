"""The front end of the pipeline: what turns a file someone exported into a regular graph.

``load`` (read a model file, refuse a fused one, parse the input-shape pins) and ``normalize``
(inline functions, apply the pins, sort, fold, type every tensor), which drives ``fold``
(exact, bounded, checked constant folding) and ``shapes`` (a type and a shape for every
tensor: onnx inference, onnxruntime's symbolic inference, a probe run).
"""
