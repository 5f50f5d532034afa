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

#: Element-wise ops that onnxruntime (and an accelerator compiler) folds into the layer that
#: produces their input -- activations, BN-normalization, the residual Add.  A block boundary
#: between such an op and its producer leaves both unfused (see ``Layer.clean_cut``).
EPILOGUE_OPS: frozenset[str] = frozenset({
    "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
    "Celu", "Gelu", "Softplus", "BatchNormalization", "Add", "Sub", "Mul", "Div",
})


@dataclass(frozen=True)
class Layer:
    """One accelerator layer in topological order.

    ``segment`` numbers the maximal runs of supported nodes between host nodes; a block never
    spans two segments (that could make the collapsed graph cyclic).

    ``clean_cut``: a block may start at this layer without splitting what the runtime fuses.
    False when more than one tensor produced earlier in the segment is live across the cut
    (a residual branch: its skip tensor crosses too, and the Add can no longer fuse into its
    convolution) or when this layer is an element-wise epilogue (:data:`EPILOGUE_OPS`) whose
    input is the previous layer's output and has no other use.  Measured in onnxruntime,
    ResNet-50 batch 8 dlfusion cut inside bottlenecks left 16 Add + 16 Relu unfused and 54
    NCHWc reorders.  The fusion strategies cut only where this is True (segment starts always
    are); the per-layer strategies (``none``, ``dynamic-mp``) ignore it by definition.
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
    clean_cut: bool = True

    @property
    def gops(self) -> float:
        """Operation count in GOPs (10^9 operations)."""
        return self.ops / 1e9
