"""Running fused models: onnxruntime sessions with the custom-op library registered
(``session``), the load-time passes that run consecutive blocks as one inner session
(``merge``) and let blocks exchange NCHWc tensors (``layouts``), and the library's report of
its inner sessions' thread pools and of how blocks hand their outputs back (``threads``)."""

from onnxmlu.runtime.layouts import optimize_block_layouts
from onnxmlu.runtime.session import (
    INNER_GLOBAL_POOL_KEY,
    INNER_SPINNING_KEY,
    INNER_THREADS_KEY,
    LIBRARY_ENV,
    InferenceSession,
    custom_ops_library,
    loadable_source,
    reference_session,
    register_library,
    session_options,
)
from onnxmlu.runtime.threads import CopyReport, ThreadReport, copy_report, pool_note, thread_report

__all__ = [
    "CopyReport",
    "INNER_GLOBAL_POOL_KEY",
    "INNER_SPINNING_KEY",
    "INNER_THREADS_KEY",
    "LIBRARY_ENV",
    "ThreadReport",
    "InferenceSession",
    "copy_report",
    "custom_ops_library",
    "loadable_source",
    "optimize_block_layouts",
    "pool_note",
    "reference_session",
    "register_library",
    "session_options",
    "thread_report",
]
