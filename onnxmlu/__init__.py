"""onnxmlu: compile ONNX models for a simulated multi-core MLU100-class accelerator.

Pipeline: load -> normalize -> rewrite -> analyze -> plan -> collapse -> save. Fused models
hold one ``com.onnxmlu::MLUFusionBlock`` node per block and run in onnxruntime once the
custom-op library (:func:`custom_ops_library`) is registered.
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("onnxmlu")  # one source: pyproject.toml's version, as installed
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"


def custom_ops_library() -> str:
    """Path of the built custom-op library (``libonnxmlu_ops.so``)."""
    from onnxmlu import runtime

    return runtime.custom_ops_library()


def InferenceSession(model, *args, **kwargs):  # noqa: N802 - mirrors onnxruntime's name
    """An onnxruntime session with the custom-op library registered (see onnxmlu.runtime)."""
    from onnxmlu import runtime

    return runtime.InferenceSession(model, *args, **kwargs)
