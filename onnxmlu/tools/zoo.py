"""The model zoo: the benchmark networks of [DLFusion] built in code with ``onnx.helper``.

``build_model(name)`` returns a fresh, self-contained ONNX model for one of
:data:`ZOO_NAMES`, with random but *seeded* weights.  No torch, no downloads: the zoo is
what the tests, the benchmarks and the examples compile, so it must be reproducible
byte for byte from ``(name, batch, seed, opset)`` alone.

Design choices
--------------
* **Real architectures, real sizes.**  The five CNNs follow torchvision's layouts
  (ResNet v1.5 with the stride on the 3x3 conv, VGG-19 config "E", AlexNet's
  one-GPU variant, MobileNetV2 width 1.0), so parameter counts match torchvision's
  exactly (ResNet-18 11,689,512; ResNet-50 25,557,032; VGG-19 143,667,240; AlexNet
  61,100,840; MobileNetV2 3,504,872; counting, as torchvision does, BN's scale and
  bias but not its running statistics).  Node and initializer names follow
  torchvision's module and ``state_dict`` names (``layer1.0.conv1``,
  ``layer1.0.bn1.running_var``, ``features.3.conv.1.0``, ``fc``...), so a layer is
  recognisable in a fusion plan and in netron.
* **BatchNormalization is kept as its own node**, after a bias-free Conv, exactly as a
  PyTorch export before any optimisation.  Folding BN into the conv is one of the
  rewrites this project performs; the zoo must give it something to do.  BN statistics
  and affine parameters are random and non-trivial (scale ~ U(0.5, 1.5),
  B ~ N(0, 0.1), mean ~ N(0, 0.1), var ~ U(0.5, 1.5), epsilon 1e-5), so a wrong fold
  changes the numbers instead of silently multiplying by one.
* **He-normal weights** (std = sqrt(2 / fan_in), fan_in = C_in/group * kH * kW).  With
  ReLU this keeps the second moment of activations roughly constant through the depth
  (He et al. 2015), so a random N(0, 1) input gives O(1) activations and moderate
  logits.  That matters because fused and unfused runs are compared later at
  atol = rtol = 1e-4: with exploding (or vanishing) activations such a comparison
  would either always fail or mean nothing.  A ResNet adds its residual at every block
  and eval-mode BN does not renormalise, so plain He init still grows the activations
  ~1.5x per block (ResNet-50 logits ~1e3-1e4).  Hence, as torchvision's
  ``zero_init_residual`` and Fixup/SkipInit do, the *last* BN of each residual branch
  has its (still random, still non-trivial) scale multiplied by 1/sqrt(#blocks), and a
  downsample BN by 1/sqrt(2) (He's gain of 2 presumes a ReLU right after the conv).
  Activations then stay ~1-3 RMS through the whole network.
* **Classifiers are Gemm** (transB=1, with a C bias), as a PyTorch ``nn.Linear`` export,
  preceded by Flatten (or GlobalAveragePool + Flatten).  A Gemm with a [out, in]
  weight is the canonical FC layer that the partitioner and the performance model
  recognise; MatMul + Add would be a different pattern.
* **Inference graphs**: Dropout is omitted; adaptive average pools that are the
  identity at 224x224 (AlexNet's 6x6, VGG's 7x7) are skipped; MobileNetV2's ReLU6 is
  ``Clip`` with min/max given as (shared) scalar initializers, as opset >= 11 requires;
  its depthwise convs are Conv with ``group = C``.
* **lstm** is a small recurrent benchmark: input [16 (seq), batch, 64]; a bidirectional
  LSTM (hidden 128) whose Y [16, 2, batch, 128] is transposed to [16, batch, 2, 128] and
  reshaped with shape [0, 0, -1] (so a symbolic batch survives) to [16, batch, 256];
  a forward LSTM (hidden 128) whose last hidden state Y_h [1, batch, 128] is squeezed and
  fed to a Gemm head with 10 classes.  Weights (W, R and the bias B; no initial
  states) are U(-1/sqrt(H), 1/sqrt(H)) as PyTorch initialises them.
* **Speed**: weights are drawn directly in float32 (``rng.standard_normal(dtype=
  np.float32)``), scaled in place and written straight into the final ModelProto (no
  make_graph/make_model copies), so even VGG-19's 143M parameters build in ~2 s.

``batch`` may be an int or a string; a string becomes a symbolic ``dim_param`` on the
graph input and output, and every node is written so that the model runs at any batch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxmlu.errors import OnnxMluError
from onnxmlu.wording import plural

__all__ = ["ZOO_NAMES", "CNN_NAMES", "build_model"]

ZOO_NAMES: tuple[str, ...] = ("resnet18", "resnet50", "vgg19", "alexnet", "mobilenetv2", "lstm")
CNN_NAMES: tuple[str, ...] = ("resnet18", "resnet50", "vgg19", "alexnet", "mobilenetv2")

_MIN_OPSET = 13  # Squeeze with axes as an input; Clip with min/max inputs (>= 11)
_BN_EPS = 1e-5
_IMAGE = (3, 224, 224)
_NUM_CLASSES = 1000


class _GraphBuilder:
    """Appends nodes and initializers; every helper returns the name of its output.

    A node's output tensor has the node's name (names are unique), and a layer's
    initializers are named ``<layer>.<param>`` as in a torchvision ``state_dict``.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        # Initializers are created in place inside the final ModelProto: copying VGG-19's
        # 575 MB of weights through make_graph/make_model would double the build time.
        self.model = onnx.ModelProto()
        self.nodes: list[onnx.NodeProto] = []
        self._names: set[str] = set()

    # -- primitives -------------------------------------------------------------------
    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate tensor/node name {name!r}")  # a bug in the zoo
        self._names.add(name)
        return name

    def init(self, name: str, array: np.ndarray) -> str:
        tensor = self.model.graph.initializer.add()
        tensor.name = self._claim(name)
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        tensor.raw_data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        return name

    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> str:
        """Add one node named ``name``; its first output is also called ``name``."""
        outputs = [self._claim(name)] + [self._claim(f"{name}.out{i}") for i in range(1, n_out)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return name

    def _he_normal(self, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(math.sqrt(2.0 / fan_in))
        return w

    def _uniform(self, shape: tuple[int, ...], bound: float) -> np.ndarray:
        return self.rng.uniform(-bound, bound, shape).astype(np.float32)

    # -- layers -----------------------------------------------------------------------
    def conv(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
             pad: int | None = None, group: int = 1, bias: bool = False) -> str:
        fan_in = cin // group * k * k
        weight = self._he_normal((cout, cin // group, k, k), fan_in)
        inputs = [x, self.init(f"{name}.weight", weight)]
        if bias:  # PyTorch's default conv bias init
            bias_values = self._uniform((cout,), 1.0 / math.sqrt(fan_in))
            inputs.append(self.init(f"{name}.bias", bias_values))
        pad = k // 2 if pad is None else pad
        return self.node("Conv", inputs, name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, group=group, dilations=[1, 1])

    def bn(self, x: str, name: str, c: int, scale_mult: float = 1.0) -> str:
        rng = self.rng
        scale = rng.uniform(0.5, 1.5, c) * scale_mult
        params = {
            "weight": scale,
            "bias": rng.normal(0.0, 0.1, c),
            "running_mean": rng.normal(0.0, 0.1, c),
            "running_var": rng.uniform(0.5, 1.5, c),
        }
        inputs = [x] + [self.init(f"{name}.{k}", v.astype(np.float32)) for k, v in params.items()]
        return self.node("BatchNormalization", inputs, name, epsilon=_BN_EPS)

    def relu(self, x: str, name: str) -> str:
        return self.node("Relu", [x], name)

    def relu6(self, x: str, name: str) -> str:
        if "relu6.min" not in self._names:
            self.init("relu6.min", np.array(0.0, np.float32))
            self.init("relu6.max", np.array(6.0, np.float32))
        return self.node("Clip", [x, "relu6.min", "relu6.max"], name)

    def act(self, x: str, name: str, kind: str) -> str:
        return self.relu6(x, name) if kind == "relu6" else self.relu(x, name)

    def conv_bn_act(self, x: str, names: tuple[str, str, str | None], cin: int, cout: int,
                    k: int, stride: int = 1, group: int = 1, act: str | None = "relu",
                    bn_scale_mult: float = 1.0) -> str:
        """Conv (no bias) -> BatchNormalization -> optional Relu/ReLU6, named ``names``."""
        conv_name, bn_name, act_name = names
        y = self.conv(x, conv_name, cin, cout, k, stride, group=group)
        y = self.bn(y, bn_name, cout, bn_scale_mult)
        return self.act(y, act_name, act) if act else y

    def add(self, a: str, b: str, name: str) -> str:
        return self.node("Add", [a, b], name)

    def maxpool(self, x: str, name: str, k: int, stride: int, pad: int = 0) -> str:
        return self.node("MaxPool", [x], name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4)

    def flatten(self, x: str, name: str) -> str:
        return self.node("Flatten", [x], name, axis=1)

    def global_pool_flatten(self, x: str, name: str) -> str:
        return self.flatten(self.node("GlobalAveragePool", [x], name), "flatten")

    def gemm(self, x: str, name: str, fin: int, fout: int, he: bool = True) -> str:
        """FC layer as Gemm(transB=1) with weight [fout, fin] and bias C [fout]."""
        bound = 1.0 / math.sqrt(fin)
        w = self._he_normal((fout, fin), fin) if he else self._uniform((fout, fin), bound)
        inputs = [x, self.init(f"{name}.weight", w),
                  self.init(f"{name}.bias", self._uniform((fout,), bound))]
        return self.node("Gemm", inputs, name, transB=1)

    def classifier(self, x: str, names: list[str], dims: list[int], relu_names: list[str]) -> str:
        """Chain of Gemm layers (Dropout omitted) with Relu between them."""
        for i, name in enumerate(names):
            x = self.gemm(x, name, dims[i], dims[i + 1])
            if i < len(names) - 1:
                x = self.relu(x, relu_names[i])
        return x


# -- architectures ------------------------------------------------------------------------
def _resnet(b: _GraphBuilder, x: str, blocks: tuple[int, ...], bottleneck: bool) -> str:
    x = b.conv_bn_act(x, ("conv1", "bn1", "relu"), 3, 64, 7, stride=2)
    x = b.maxpool(x, "maxpool", 3, 2, pad=1)
    expansion = 4 if bottleneck else 1
    cin = 64
    # Residual branches would grow the activations ~1.5x per block (eval-mode BN does not
    # renormalise): damp the branch's last BN scale by 1/sqrt(#blocks) (Fixup/SkipInit
    # idea) and the downsample BN by 1/sqrt(2) (He's gain of 2 assumes a ReLU follows).
    branch_damping = 1.0 / math.sqrt(sum(blocks))
    downsample_damping = 1.0 / math.sqrt(2.0)
    for stage, n in enumerate(blocks):
        width = 64 * 2**stage
        cout = width * expansion
        for i in range(n):
            p = f"layer{stage + 1}.{i}"
            stride = 2 if (i == 0 and stage > 0) else 1
            if bottleneck:  # torchvision v1.5: the stride sits on the 3x3 conv
                specs = [(cin, width, 1, 1), (width, width, 3, stride), (width, cout, 1, 1)]
            else:
                specs = [(cin, width, 3, stride), (width, cout, 3, 1)]
            y = x
            for j, (ci, co, k, s) in enumerate(specs, start=1):
                last = j == len(specs)
                y = b.conv_bn_act(y, (f"{p}.conv{j}", f"{p}.bn{j}", f"{p}.relu{j}"), ci, co, k, s,
                                  act=None if last else "relu",
                                  bn_scale_mult=branch_damping if last else 1.0)
            identity = x
            if stride != 1 or cin != cout:
                identity = b.conv_bn_act(x, (f"{p}.downsample.0", f"{p}.downsample.1", None),
                                         cin, cout, 1, stride, act=None,
                                         bn_scale_mult=downsample_damping)
            x = b.relu(b.add(y, identity, f"{p}.add"), f"{p}.relu_out")
            cin = cout
    x = b.global_pool_flatten(x, "avgpool")
    return b.gemm(x, "fc", cin, _NUM_CLASSES)


def _sequential_features(b: _GraphBuilder, x: str, layers: list[tuple]) -> tuple[str, int]:
    """torchvision ``features`` Sequential of ("conv", cout, k, stride, pad) and
    ("pool", k, stride) entries; each conv (with bias, no BN) is followed by a Relu and
    takes two Sequential indices, as in torchvision, so names match its state_dict."""
    idx, cin = 0, 3
    for layer in layers:
        if layer[0] == "conv":
            _, cout, k, stride, pad = layer
            x = b.conv(x, f"features.{idx}", cin, cout, k, stride, pad, bias=True)
            x = b.relu(x, f"features.{idx + 1}")
            idx, cin = idx + 2, cout
        else:
            _, k, stride = layer
            x = b.maxpool(x, f"features.{idx}", k, stride)
            idx += 1
    return x, cin


def _vgg19(b: _GraphBuilder, x: str) -> str:
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
           512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]
    layers = [("pool", 2, 2) if c == "M" else ("conv", c, 3, 1, 1) for c in cfg]
    x, c = _sequential_features(b, x, layers)
    # AdaptiveAvgPool2d((7, 7)) of a 7x7 map is the identity: skipped.
    x = b.flatten(x, "flatten")
    return b.classifier(x, ["classifier.0", "classifier.3", "classifier.6"],
                        [c * 7 * 7, 4096, 4096, _NUM_CLASSES], ["classifier.1", "classifier.4"])


def _alexnet(b: _GraphBuilder, x: str) -> str:
    layers = [("conv", 64, 11, 4, 2), ("pool", 3, 2), ("conv", 192, 5, 1, 2), ("pool", 3, 2),
              ("conv", 384, 3, 1, 1), ("conv", 256, 3, 1, 1), ("conv", 256, 3, 1, 1),
              ("pool", 3, 2)]
    x, c = _sequential_features(b, x, layers)
    # AdaptiveAvgPool2d((6, 6)) of a 6x6 map is the identity: skipped.
    x = b.flatten(x, "flatten")
    return b.classifier(x, ["classifier.1", "classifier.4", "classifier.6"],
                        [c * 6 * 6, 4096, 4096, _NUM_CLASSES], ["classifier.2", "classifier.5"])


def _mobilenetv2(b: _GraphBuilder, x: str) -> str:
    def cba(x, prefix, cin, cout, k, stride=1, group=1):  # torchvision Conv2dNormActivation
        return b.conv_bn_act(x, (f"{prefix}.0", f"{prefix}.1", f"{prefix}.2"), cin, cout, k,
                             stride, group, act="relu6")

    x = cba(x, "features.0", 3, 32, 3, stride=2)
    cin, idx = 32, 1
    # (expand ratio t, output channels c, repeats n, first stride s)
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            p = f"features.{idx}.conv"
            hidden, j, y = cin * t, 0, x
            if t != 1:
                y, j = cba(y, f"{p}.0", cin, hidden, 1), 1
            y = cba(y, f"{p}.{j}", hidden, hidden, 3, stride, group=hidden)  # depthwise
            y = b.conv_bn_act(y, (f"{p}.{j + 1}", f"{p}.{j + 2}", None), hidden, c, 1, act=None)
            x = b.add(x, y, f"features.{idx}.add") if stride == 1 and cin == c else y
            cin, idx = c, idx + 1
    x = cba(x, f"features.{idx}", cin, 1280, 1)
    x = b.global_pool_flatten(x, "avgpool")
    return b.gemm(x, "classifier.1", 1280, _NUM_CLASSES)


_LSTM_SEQ, _LSTM_IN, _LSTM_HIDDEN, _LSTM_CLASSES = 16, 64, 128, 10


def _lstm_layer(b: _GraphBuilder, x: str, name: str, fin: int, hidden: int,
                direction: str) -> str:
    """ONNX LSTM with W, R, B (PyTorch init), no sequence_lens / initial states.
    Outputs ``name`` (Y) and ``name.out1`` (Y_h)."""
    dirs = 2 if direction == "bidirectional" else 1
    bound = 1.0 / math.sqrt(hidden)
    inputs = [x,
              b.init(f"{name}.W", b._uniform((dirs, 4 * hidden, fin), bound)),
              b.init(f"{name}.R", b._uniform((dirs, 4 * hidden, hidden), bound)),
              b.init(f"{name}.B", b._uniform((dirs, 8 * hidden), bound))]
    return b.node("LSTM", inputs, name, n_out=2, hidden_size=hidden, direction=direction)


def _lstm(b: _GraphBuilder, x: str) -> str:
    h = _LSTM_HIDDEN
    y = _lstm_layer(b, x, "lstm1", _LSTM_IN, h, "bidirectional")  # [seq, 2, batch, H]
    y = b.node("Transpose", [y], "lstm1.transpose", perm=[0, 2, 1, 3])  # [seq, batch, 2, H]
    shape = b.init("lstm1.concat_shape", np.array([0, 0, -1], np.int64))
    # allowzero left at its default 0 (attribute only exists from opset 14): 0 copies a dim
    y = b.node("Reshape", [y, shape], "lstm1.concat")  # [seq, batch, 2H]
    _lstm_layer(b, y, "lstm2", 2 * h, h, "forward")
    axes = b.init("lstm2.squeeze_axes", np.array([0], np.int64))
    y = b.node("Squeeze", ["lstm2.out1", axes], "lstm2.squeeze")  # Y_h [batch, H]
    return b.gemm(y, "fc", h, _LSTM_CLASSES, he=False)


# name -> (builder, input shape without batch, batch axis, output classes, doc)
_ARCHS = {
    "resnet18": (lambda b, x: _resnet(b, x, (2, 2, 2, 2), bottleneck=False), _IMAGE, 0,
                 _NUM_CLASSES, "ResNet-18 (He et al. 2016; torchvision layout, basic blocks)"),
    "resnet50": (lambda b, x: _resnet(b, x, (3, 4, 6, 3), bottleneck=True), _IMAGE, 0,
                 _NUM_CLASSES, "ResNet-50 (He et al. 2016; torchvision v1.5 bottleneck blocks)"),
    "vgg19": (_vgg19, _IMAGE, 0, _NUM_CLASSES,
              "VGG-19 (Simonyan & Zisserman 2014, config E; torchvision layout, no BN)"),
    "alexnet": (_alexnet, _IMAGE, 0, _NUM_CLASSES,
                "AlexNet (Krizhevsky et al. 2012; torchvision one-GPU variant)"),
    "mobilenetv2": (_mobilenetv2, _IMAGE, 0, _NUM_CLASSES,
                    "MobileNetV2 (Sandler et al. 2018; torchvision layout, width 1.0)"),
    "lstm": (_lstm, (_LSTM_SEQ, _LSTM_IN), 1, _LSTM_CLASSES,
             "2-layer LSTM classifier: bidirectional LSTM(64->128) + LSTM(256->128) + FC(10)"),
}


def build_model(name: str, *, batch: int | str = 1, seed: int = 0,
                opset: int = 17) -> onnx.ModelProto:
    """Build zoo model ``name`` with seeded random weights.

    ``batch`` is the batch dimension of the graph input ``input`` and output ``logits``:
    an int, or a string naming a symbolic dimension (e.g. ``"N"``).  The same arguments
    always give the same bytes.
    """
    if name not in _ARCHS:
        raise OnnxMluError(f"unknown zoo model {name!r} (known: {', '.join(ZOO_NAMES)})")
    if isinstance(batch, bool) or not isinstance(batch, (int, str)) or \
            (isinstance(batch, int) and batch < 1) or (isinstance(batch, str) and not batch):
        raise OnnxMluError(f"batch must be a positive int or a dimension name, got {batch!r}")
    max_opset = onnx.defs.onnx_opset_version()
    if not _MIN_OPSET <= opset <= max_opset:
        raise OnnxMluError(f"zoo models need opset {_MIN_OPSET}..{max_opset}, got {opset}")

    arch, in_shape, batch_axis, classes, doc = _ARCHS[name]
    b = _GraphBuilder(np.random.default_rng(seed))
    out = arch(b, b._claim("input"))
    # Rename the last node's output to "logits".
    last = b.nodes[-1]
    assert last.output[0] == out
    last.output[0] = "logits"

    shape = list(in_shape)
    shape.insert(batch_axis, batch)
    model = b.model
    model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    model.opset_import.add(domain="", version=opset)
    model.producer_name = "onnxmlu.zoo"
    model.doc_string = f"{doc}; random weights, seed={seed}, built by onnxmlu.zoo"
    graph = model.graph
    graph.name = name
    graph.doc_string = doc
    graph.node.extend(b.nodes)
    graph.input.append(helper.make_tensor_value_info("input", TensorProto.FLOAT, shape))
    graph.output.append(
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes]))
    return model


def zoo_names(spec: str) -> list[str]:
    """``"all"`` or comma-separated zoo names (the CLI's NAME argument)."""
    return list(ZOO_NAMES) if spec == "all" else spec.split(",")


def zoo_targets(names: list[str], output: Path) -> list[tuple[str, Path]]:
    """``(name, path)`` per model: OUTPUT itself for one model, OUTPUT/NAME.onnx for several."""
    unknown = [n for n in names if n not in ZOO_NAMES]
    if unknown:
        raise OnnxMluError(f"unknown zoo model {unknown[0]!r} (known: {', '.join(ZOO_NAMES)}, or all)")
    if len(names) == 1:
        return [(names[0], output)]
    if output.suffix == ".onnx" or (output.exists() and not output.is_dir()):
        raise OnnxMluError(f"{plural(len(names), 'model')} need a folder as OUTPUT, not {output}")
    if not output.parent.is_dir():
        raise OnnxMluError(f"folder {output.parent} does not exist")
    output.mkdir(exist_ok=True)
    return [(n, output / f"{n}.onnx") for n in names]
