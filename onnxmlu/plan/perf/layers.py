"""What the planner knows about one accelerator layer (one supported ONNX node).

A :class:`Layer` is produced by :mod:`onnxmlu.analyze` from a graph and consumed by the
performance model and the strategies. It carries no onnx objects.

Operation counts follow DLFusion Eq. 1-2 (two operations per multiply-accumulate):

* Conv:  ``ops = 2 * H_out * W_out * K_h * K_w * (C_in / groups) * C_out * N``
* FC / MatMul: ``ops = 2 * M * K * N`` (batch dimensions folded into M)
* other layers: a documented small count per output element (see ``analyze``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LayerKind = Literal["conv", "fc", "eltwise", "pool", "global_pool", "norm", "softmax", "data"]

#: Kinds whose consumer needs the whole feature map: fusing across them admits no spatial tiling.
WHOLE_MAP_KINDS: frozenset[str] = frozenset({"fc", "global_pool", "softmax"})


@dataclass(frozen=True)
class Layer:
    """One accelerator layer in topological order.

    ``segment`` numbers the maximal runs of supported nodes between host nodes; a block never
    spans two segments (that could make the collapsed graph cyclic).
    """

    index: int
    name: str
    op_type: str
    kind: LayerKind
    ops: float
    in_channels: int = 1
    out_channels: int = 1
    out_height: int = 1
    out_width: int = 1
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    groups: int = 1
    input_bytes: int = 0
    output_bytes: int = 0
    weight_bytes: int = 0
    segment: int = 0

    @property
    def gops(self) -> float:
        """Operation count in GOPs (10^9 operations)."""
        return self.ops / 1e9
