"""onnxmlu: compile ONNX models for a simulated multi-core MLU100-class accelerator.

Pipeline: load -> normalize -> rewrite -> analyze -> plan -> collapse -> save. Fused models
hold one ``com.onnxmlu::MLUFusionBlock`` node per block and run in onnxruntime once the
custom-op library (:func:`custom_ops_library`) is registered. The two helpers below load
:mod:`onnxmlu.runtime` (and so onnxruntime) when called (:mod:`onnxmlu.optional`).
"""

from onnxmlu.optional import optional_import
from onnxmlu.version import __version__  # noqa: F401 - the package's version, read as onnxmlu.__version__


def custom_ops_library() -> str:
    """Path of the built custom-op library (``libonnxmlu_ops.so``)."""
    return optional_import("onnxmlu.runtime").custom_ops_library()


def InferenceSession(model, *args, **kwargs):  # noqa: N802 - mirrors onnxruntime's name
    """An onnxruntime session with the custom-op library registered (see onnxmlu.runtime)."""
    return optional_import("onnxmlu.runtime").InferenceSession(model, *args, **kwargs)
