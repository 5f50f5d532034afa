"""What the process's inner sessions cost in threads, as the custom-op library counts them.

Each MLUFusionBlock kernel runs its block in an inner onnxruntime session. On an env with
onnxruntime's global thread pools (``set_global_thread_pool_sizes`` in Python,
``CreateEnvWithGlobalThreadPools`` in C/C++) every inner session shares that one pool; the
library detects it. Elsewhere each inner session on more than one thread owns a pool of
``threads - 1`` workers, which sleep between its block's runs and are woken at each: a pool
per block costs a wake-up per block per run and, with several models in the process, a set of
threads per block. :func:`thread_report` reads the library's counters (``OnnxmluThreadReport``
in custom_ops/mlu_fusion_block.h): live inner sessions with their own pool, the workers those
pools hold, live inner sessions on the global pool, and how many Runs each kind has made.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

from onnxmlu.runtime.session import custom_ops_library
from onnxmlu.wording import plural


class ThreadReport(NamedTuple):
    own_pools: int        # live inner sessions with an intra-op pool of their own
    own_workers: int      # worker threads those pools hold
    global_sessions: int  # live inner sessions on the env's global pool
    own_pool_runs: int    # Runs so far of inner sessions with their own pool (each wakes it)
    global_runs: int      # Runs so far of inner sessions on the global pool

    def __sub__(self, other: "ThreadReport") -> "ThreadReport":  # type: ignore[override]
        return ThreadReport(*(a - b for a, b in zip(self, other)))


@functools.lru_cache(maxsize=1)
def _report_function():
    # The path onnxruntime loaded: dlopen hands back the same copy, so the counters are its own.
    function = ctypes.CDLL(custom_ops_library()).OnnxmluThreadReport
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    return function


def thread_report() -> ThreadReport:
    """The library's thread counters now (all 0 before any block was loaded)."""
    values = (ctypes.c_int64 * len(ThreadReport._fields))()
    _report_function()(values, len(values))
    return ThreadReport(*values)


class CopyReport(NamedTuple):
    copied_outputs: int       # outputs copied from a result the inner session allocated
    in_place_dynamic: int     # outputs of a dynamic shape the inner session wrote in place
    dims_refusals: int        # blocks that stopped trusting their output dims metadata

    def __sub__(self, other: "CopyReport") -> "CopyReport":  # type: ignore[override]
        return CopyReport(*(a - b for a, b in zip(self, other)))


def copy_report() -> CopyReport:
    """How the process's blocks handed their outputs back so far (``OnnxmluCopyReport`` in
    custom_ops/mlu_fusion_block.h): the copy path taken for an output of a shape unknown before
    the run, against in place at a learned or evaluated shape (custom_ops/dim_expr.h)."""
    function = ctypes.CDLL(custom_ops_library()).OnnxmluCopyReport
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    values = (ctypes.c_int64 * len(CopyReport._fields))()
    function(values, len(values))
    return CopyReport(*values)


def pool_note(added: ThreadReport) -> str | None:
    """What a session's inner pools cost (``added``: the report's change across its creation),
    when more than one pool of its own does the work one shared pool could; else None."""
    if added.own_pools <= 1:
        return None
    return (f"{plural(added.own_pools, 'block')} run in inner sessions with a thread pool each "
            f"({plural(added.own_workers, 'worker thread')}, a pool woken per block per run): host ops between blocks "
            "keep them apart. "
            "onnxruntime's global thread pool shares one pool among them (README, 'Threads')")
