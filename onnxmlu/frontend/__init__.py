"""The front end of the pipeline: what turns a file someone exported into a regular graph.

``fold`` (exact, bounded, checked constant folding) and ``shapes`` (a type and a shape for
every tensor: onnx inference, onnxruntime's symbolic inference, a probe run). Loading and
:func:`onnxmlu.frontend.normalize.normalize` drive them.
"""
