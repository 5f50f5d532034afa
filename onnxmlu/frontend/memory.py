"""The memory budget: no shape probe runs a model at sizes whose tensors would not fit in it.

A probe (:mod:`onnxmlu.frontend.shapes`) runs the model once in onnxruntime on zeros, with
optimizations off, to learn shapes or to try the default sizes of symbolic dims. Before it
runs, :func:`probe_bound` bounds what that run can allocate from the sizes that shape
inference gives every tensor at the probe's input shapes (no tensor is made to know them):

    bound = 3 W + F + sum_t bytes(t) + max_n scratch(n)

* ``W``: the bytes of the weights. The probe hands onnxruntime a serialized copy of the model
  (one copy), the session keeps its own tensors (a second), and a model whose weights live in
  a file map is filled into the probe's copy first (a third);
* ``F``: the bytes of the input feeds;
* ``sum_t bytes(t)``: every node output of every graph (subgraph bodies once: a loop's
  iterations reuse their buffers; a loop's stacked outputs are tensors of the outer graph),
  each ``prod(dims) * element size``, as if every tensor stayed alive to the end (the probe
  exposes most of them as outputs, and onnxruntime's planner only ever reuses buffers);
* ``scratch(n)``: what a kernel may allocate besides its outputs, for the node that needs the
  most: the bytes of its inputs and outputs together (a transposed or broadcast copy of each),
  plus for a convolution its im2col buffer (``prod(weight dims after the first) *
  prod(output spatial)`` floats: ``C_in/group * prod(kernel)`` per output pixel).

It is an upper bound on the tensors of the run, under the one assumption stated for
``scratch``; onnxruntime's own fixed cost (its library, thread pools: tens of MB) is
resident before the probe and is not counted. Where inference cannot size a tensor at those
shapes (a length read from data), the bound is unknown and the probe runs only under an
enforced cap (:func:`capped`: the process's address space may grow by the budget at most,
so an allocation past it fails and the probe reports the failure, never the kernel's OOM killer).

The budget (``--max-memory``, :func:`parse_size`) defaults to :data:`DEFAULT_FRACTION` of the
memory the host has available (``MemAvailable`` in ``/proc/meminfo``) when the options are made.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from typing import Iterator

import onnx

try:
    import resource
except ImportError:  # not POSIX: nothing is capped, the peak RSS is not read
    resource = None

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import iter_graphs
from onnxmlu.ir.index import tensor_nbytes

#: The share of the host's available memory a probe may use when no --max-memory is given.
DEFAULT_FRACTION = 0.5
#: The budget where the host's available memory cannot be read.
FALLBACK_BUDGET = 4 << 30
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_CONVS = ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv")
_CAP_LOCK = threading.Lock()


def parse_size(text: str) -> int:
    """Bytes of ``4G``, ``512M``, ``1.5GiB``, ``300000`` (binary units: K, M, G, T; a trailing
    ``B`` or ``iB`` allowed); a one-line error otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", str(text).upper())
    if not found:
        raise OnnxMluError(f"--max-memory {text!r} is not a size (e.g. 4G, 512M, 1.5G)")
    value = int(float(found.group(1)) * _UNITS[found.group(2)])
    if value < 1 << 20:
        raise OnnxMluError(f"--max-memory {text!r} is under 1M: no model can be probed in it")
    return value


def size_text(n: int) -> str:
    """``n`` bytes for people: ``20.1G``, ``512M``, ``4.0K``."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.1f}{unit}"
    return f"{n}B"


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, else free physical pages; None if neither."""
    available = _proc_bytes("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def default_budget() -> int:
    """:data:`DEFAULT_FRACTION` of :func:`available_memory` (:data:`FALLBACK_BUDGET` where unknown)."""
    available = available_memory()
    return int(available * DEFAULT_FRACTION) if available else FALLBACK_BUDGET


def peak_rss_bytes() -> int | None:
    """This process's peak resident set so far (``VmHWM``), None where it cannot be read."""
    peak = _proc_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    if resource is not None:  # ru_maxrss is in KiB on Linux (answered above), bytes on macOS
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return None


# ------------------------------------------------------------------------------ the bound
def probe_bound(inferred: onnx.ModelProto, weight_bytes: int, feed_bytes: int) -> int | None:
    """The module docstring's bound for a run of ``inferred`` (a skeleton inferred at the probe's
    input shapes: every value info it has is at those shapes); None where a node output of any
    graph has no concrete size there."""
    total, scratch = 3 * weight_bytes + feed_bytes, 0
    for graph in iter_graphs(inferred.graph):
        sizes = _sizes(graph)
        for node in graph.node:
            outputs = [sizes.get(o) for o in node.output if o]
            if any(s is None for s in outputs):
                return None
            total += sum(outputs)
            scratch = max(scratch, _scratch(node, graph, sizes, outputs))
    return total + scratch


def _sizes(graph: onnx.GraphProto) -> dict[str, int]:
    """Bytes of every tensor of ``graph`` whose type and dims are known (initializers included)."""
    found = {t.name: tensor_nbytes(t.data_type, t.dims) for t in graph.initializer}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(
                d.HasField("dim_value") for d in tt.shape.dim):
            found[vi.name] = tensor_nbytes(tt.elem_type, [d.dim_value for d in tt.shape.dim])
    return found


def _scratch(node: onnx.NodeProto, graph: onnx.GraphProto, sizes: dict[str, int], outputs: list[int]) -> int:
    """What the node's kernel may allocate besides its outputs (module docstring)."""
    inputs = sum(sizes.get(i, 0) for i in node.input if i)
    if node.op_type not in _CONVS or len(node.input) < 2:
        return inputs + sum(outputs)
    weight, out = _dims(graph, node.input[1]), _dims(graph, node.output[0])
    if not weight or not out or len(out) < 3:
        return inputs + sum(outputs)
    # one column per output pixel of C/group * prod(kernel) floats (a ConvTranspose's columns are
    # per input pixel, fewer than its output pixels); integer convolutions use fewer bytes
    col = math.prod(weight[1:]) * math.prod(out[2:]) * 4
    return inputs + sum(outputs) + col


def _dims(graph: onnx.GraphProto, name: str) -> list[int] | None:
    for t in graph.initializer:
        if t.name == name:
            return list(t.dims)
    for vi in (*graph.input, *graph.value_info, *graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            return [d.dim_value for d in dims] if all(d.HasField("dim_value") for d in dims) else None
    return None


# ------------------------------------------------------------------------------ the cap
@contextlib.contextmanager
def capped(budget: int) -> Iterator[None]:
    """Inside the block, the process's address space may grow by ``budget`` bytes at most
    (``RLIMIT_AS`` set to its size now plus ``budget``, put back after): an allocation past it
    fails in the allocating call. Address space counts reservations too (thread stacks,
    allocator arenas), so the cap errs on the safe side. Where it cannot be set (not Linux,
    an already lower limit) nothing is capped."""
    now = _address_space()
    if resource is None or now is None:
        yield
        return
    with _CAP_LOCK:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = now + budget
        if (hard != resource.RLIM_INFINITY and limit > hard) or (soft != resource.RLIM_INFINITY and soft < limit):
            yield
            return
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _address_space() -> int | None:
    """``VmSize`` of this process in bytes, None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    return None


def _proc_bytes(path: str, key: str) -> int | None:
    """The ``key:  N kB`` line of a ``/proc`` file in bytes; None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="ascii") as lines:
            for line in lines:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    return None
