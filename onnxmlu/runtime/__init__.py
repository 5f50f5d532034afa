"""Running fused models: onnxruntime sessions with the custom-op library registered
(``session``), and the graph pass that lets blocks exchange NCHWc tensors (``layouts``)."""

from onnxmlu.runtime.layouts import optimize_block_layouts
from onnxmlu.runtime.session import (
    INNER_GLOBAL_POOL_KEY,
    INNER_SPINNING_KEY,
    INNER_THREADS_KEY,
    LIBRARY_ENV,
    InferenceSession,
    custom_ops_library,
    reference_session,
    register_library,
    session_options,
)

__all__ = [
    "INNER_GLOBAL_POOL_KEY",
    "INNER_SPINNING_KEY",
    "INNER_THREADS_KEY",
    "LIBRARY_ENV",
    "InferenceSession",
    "custom_ops_library",
    "optimize_block_layouts",
    "reference_session",
    "register_library",
    "session_options",
]
