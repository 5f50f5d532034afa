"""Layer tables of the zoo CNNs for the performance-model and planner tests.

``zoo_layers(name)`` runs the real pipeline -- ``onnxmlu.tools.zoo.build_model`` ->
``onnxmlu.api.prepare`` (normalize + ``onnxmlu.rewrite.rewrite_model``) ->
``onnxmlu.analyze.analyze`` -- so the findings are checked on exactly what ``onnxmlu compare``
plans. A failure there is a test failure, never a silent switch to other tables: the tables
built here (``synthetic_layers``) are used only when asked for, by ``ONNXMLU_SYNTHETIC_ZOO=1``
or by the tests that cross-check the two paths. They follow the published architectures
(torchvision layouts, 224x224, batch 1, fp32) in the shape the rewriter produces: every
BatchNormalization becomes norm-only BN + Mul + Add (three layers after each Conv), every
Gemm a MatMul + bias Add.

Operation counts of the fallback follow DLFusion Eq. 1-2 for Conv/FC (2 * MAC, groups
respected) and small per-element counts for the rest: 1 for Relu/Add/Mul/Clip, 2
for norm-only BN, k*k per output for pools, H*W per channel for global pools, 0 for
data movement (Flatten/Reshape) -- the conventions of ``onnxmlu.analyze``.  The layer order
mimics the real topological order too: a residual block's downsample branch is interleaved
with its first convolution (conv1, downsample, bn1/norm, ds-bn/norm, ...).
"""

from __future__ import annotations

import functools
import os
from typing import Callable

from onnxmlu.plan.perf.layers import Layer

CNN_NAMES = ("resnet18", "resnet50", "vgg19", "alexnet", "mobilenetv2")
_F32 = 4


def zoo_layers(name: str) -> list[Layer]:
    """Layers of a zoo CNN: the real analysis, or the synthetic table when ONNXMLU_SYNTHETIC_ZOO is set."""
    return list(_real_layers(name)) if using_real_pipeline() else synthetic_layers(name)


def using_real_pipeline() -> bool:
    return not os.environ.get("ONNXMLU_SYNTHETIC_ZOO")


@functools.lru_cache(maxsize=None)
def _real_layers(name: str) -> tuple[Layer, ...]:
    from onnxmlu.analyze import analyze
    from onnxmlu.api import prepare
    from onnxmlu.tools.zoo import build_model

    model, _ = prepare(build_model(name))
    return tuple(analyze(model).layers)


@functools.lru_cache(maxsize=None)
def _synthetic(name: str) -> tuple[Layer, ...]:
    try:
        build = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"no layer table for {name!r} (known: {', '.join(_BUILDERS)})") from None
    b = _Builder()
    build(b)
    return tuple(b.layers)


def synthetic_layers(name: str) -> list[Layer]:
    return list(_synthetic(name))


def conv_chain(channels: int, size: int, count: int = 16, kernel: int = 3) -> list[Layer]:
    """``count`` identical convolutions {C, C, size x size, k x k} (DLFusion Fig. 5b, 7b)."""
    b = _Builder()
    b.shape = (channels, size, size)
    for i in range(count):
        b.conv(f"conv{i}", channels, kernel, bn=False, act=None)
    return b.layers


class _Builder:
    """Appends layers while tracking the current feature map (C, H, W)."""

    def __init__(self) -> None:
        self.layers: list[Layer] = []
        self.shape = (3, 224, 224)

    def _add(self, name, op_type, kind, ops, c_in, c_out, h, w, in_bytes, out_bytes,
             weight_bytes=0, kernel=(1, 1), stride=(1, 1), groups=1) -> None:
        self.layers.append(Layer(
            index=len(self.layers), name=name, op_type=op_type, kind=kind, ops=float(ops),
            in_channels=c_in, out_channels=c_out, out_height=h, out_width=w, kernel=kernel,
            stride=stride, groups=groups, input_bytes=in_bytes, output_bytes=out_bytes,
            weight_bytes=weight_bytes))

    def conv(self, name, c_out, k, s=1, groups=1, bias=False, bn=True, act="Relu", pad=None):
        c_in, h_in, w_in = self.shape
        pad = k // 2 if pad is None else pad
        h, w = (h_in + 2 * pad - k) // s + 1, (w_in + 2 * pad - k) // s + 1
        macs = h * w * k * k * (c_in // groups) * c_out
        weights = (k * k * (c_in // groups) * c_out + (c_out if bias else 0)) * _F32
        self._add(name, "Conv", "conv", 2 * macs, c_in, c_out, h, w, c_in * h_in * w_in * _F32,
                  c_out * h * w * _F32, weights, (k, k), (s, s), groups)
        self.shape = (c_out, h, w)
        if bn:
            self.batchnorm(name + ".bn")
        if act:
            self.act(name + "." + act.lower(), act)

    def batchnorm(self, name):
        _bn_part(self, name, None)
        _bn_part(self, name + ".scale", "Mul")
        _bn_part(self, name + ".shift", "Add")

    def eltwise(self, name, op_type, weight=0, operands=1, ops_per=1):
        c, h, w = self.shape
        n = c * h * w
        self._add(name, op_type, "eltwise", ops_per * n, c, c, h, w, operands * n * _F32,
                  n * _F32, weight * _F32)

    def act(self, name, op_type):
        self.eltwise(name, op_type, weight=2 if op_type == "Clip" else 0)

    def residual(self, name):
        self.eltwise(name, "Add", operands=2)

    def pool(self, name, k, s, pad=0, op_type="MaxPool"):
        c, h_in, w_in = self.shape
        h, w = (h_in + 2 * pad - k) // s + 1, (w_in + 2 * pad - k) // s + 1
        self._add(name, op_type, "pool", k * k * c * h * w, c, c, h, w, c * h_in * w_in * _F32,
                  c * h * w * _F32, 0, (k, k), (s, s))
        self.shape = (c, h, w)

    def global_pool(self, name):
        c, h, w = self.shape
        self._add(name, "GlobalAveragePool", "global_pool", c * h * w, c, c, 1, 1,
                  c * h * w * _F32, c * _F32, 0)
        self.shape = (c, 1, 1)

    def flatten(self, name):
        c, h, w = self.shape
        n = c * h * w
        self._add(name, "Flatten", "data", 0, n, n, 1, 1, n * _F32, n * _F32)
        self.shape = (n, 1, 1)

    def fc(self, name, n_out, act=None):
        k = self.shape[0]
        self._add(name, "MatMul", "fc", 2 * k * n_out, k, n_out, 1, 1, k * _F32, n_out * _F32,
                  k * n_out * _F32)
        self.shape = (n_out, 1, 1)
        self.eltwise(name + ".bias", "Add", weight=n_out)
        if act:
            self.act(name + "." + act.lower(), act)


def _resnet(b: _Builder, bottleneck: bool, counts: tuple[int, ...]) -> None:
    b.conv("conv1", 64, 7, 2)
    b.pool("maxpool", 3, 2, pad=1)
    for stage, (n, width) in enumerate(zip(counts, (64, 128, 256, 512)), start=1):
        for i in range(n):
            stride = 2 if (i == 0 and stage > 1) else 1
            _residual_block(b, f"layer{stage}.{i}", width, stride, bottleneck)
    b.global_pool("avgpool")
    b.flatten("flatten")
    b.fc("fc", 1000)


def _residual_block(b: _Builder, name: str, width: int, stride: int, bottleneck: bool) -> None:
    c_in, h_in, w_in = b.shape
    c_out = width * 4 if bottleneck else width
    first_stride = 1 if bottleneck else stride
    first_width = width
    if stride != 1 or c_in != c_out:
        # conv1 and the downsample branch both read the block input: interleave them
        b.conv(name + ".conv1", first_width, 1 if bottleneck else 3, first_stride, bn=False, act=None)
        main = b.shape
        b.shape = (c_in, h_in, w_in)
        b.conv(name + ".downsample", c_out, 1, stride, bn=False, act=None)
        side = b.shape
        for suffix, op in ((".bn", None), (".bn.scale", "Mul"), (".bn.shift", "Add")):
            b.shape = main
            _bn_part(b, name + ".conv1" + suffix, op)
            b.shape = side
            _bn_part(b, name + ".downsample" + suffix, op)
        b.shape = main
        b.act(name + ".conv1.relu", "Relu")
    else:
        b.conv(name + ".conv1", width, 1 if bottleneck else 3, first_stride)
    if bottleneck:
        b.conv(name + ".conv2", width, 3, stride)
        b.conv(name + ".conv3", c_out, 1, act=None)
    else:
        b.conv(name + ".conv2", width, 3, act=None)
    b.residual(name + ".add")
    b.act(name + ".relu", "Relu")


def _bn_part(b: _Builder, name: str, op: str | None) -> None:
    if op is None:
        c, h, w = b.shape
        n = c * h * w
        b._add(name, "BatchNormalization", "norm", 2 * n, c, c, h, w, n * _F32, n * _F32,
               4 * c * _F32)
    else:
        b.eltwise(name, op, weight=b.shape[0])


def _vgg19(b: _Builder) -> None:
    cfg = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
           512, 512, 512, 512, "M")
    for i, v in enumerate(cfg):
        if v == "M":
            b.pool(f"features.{i}", 2, 2)
        else:
            b.conv(f"features.{i}", v, 3, bias=True, bn=False)
    b.flatten("flatten")
    b.fc("classifier.0", 4096, act="Relu")
    b.fc("classifier.3", 4096, act="Relu")
    b.fc("classifier.6", 1000)


def _alexnet(b: _Builder) -> None:
    b.conv("features.0", 64, 11, 4, bias=True, bn=False, pad=2)
    b.pool("features.2", 3, 2)
    b.conv("features.3", 192, 5, bias=True, bn=False)
    b.pool("features.5", 3, 2)
    b.conv("features.6", 384, 3, bias=True, bn=False)
    b.conv("features.8", 256, 3, bias=True, bn=False)
    b.conv("features.10", 256, 3, bias=True, bn=False)
    b.pool("features.12", 3, 2)
    b.flatten("flatten")
    b.fc("classifier.1", 4096, act="Relu")
    b.fc("classifier.4", 4096, act="Relu")
    b.fc("classifier.6", 1000)


def _mobilenetv2(b: _Builder) -> None:
    b.conv("features.0", 32, 3, 2, act="Clip")
    settings = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))
    index = 1
    for t, c, n, s in settings:
        for i in range(n):
            _inverted_residual(b, f"features.{index}", c, s if i == 0 else 1, t)
            index += 1
    b.conv(f"features.{index}", 1280, 1, act="Clip")
    b.global_pool("avgpool")
    b.flatten("flatten")
    b.fc("classifier.1", 1000)


def _inverted_residual(b: _Builder, name: str, c_out: int, stride: int, t: int) -> None:
    c_in = b.shape[0]
    if t != 1:
        b.conv(name + ".expand", c_in * t, 1, act="Clip")
    hidden = b.shape[0]
    b.conv(name + ".dw", hidden, 3, stride, groups=hidden, act="Clip")
    b.conv(name + ".project", c_out, 1, act=None)
    if stride == 1 and c_in == c_out:
        b.residual(name + ".add")


_BUILDERS: dict[str, Callable[[_Builder], None]] = {
    "resnet18": lambda b: _resnet(b, False, (2, 2, 2, 2)),
    "resnet50": lambda b: _resnet(b, True, (3, 4, 6, 3)),
    "vgg19": _vgg19,
    "alexnet": _alexnet,
    "mobilenetv2": _mobilenetv2,
}
