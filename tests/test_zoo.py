"""Tests of the model zoo (onnxmlu.tools.zoo): structure, sizes, numerics, determinism.

Models are built once per session (VGG-19 alone is 575 MB of weights) and onnxruntime
runs single-threaded to stay light on shared machines.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnxmlu.errors import OnnxMluError
from onnxmlu.tools.zoo import CNN_NAMES, ZOO_NAMES, build_model

# torchvision's sum(p.numel() for p in model.parameters()) (BN running stats excluded).
# lstm: per LSTM layer dirs * (4H(I+H) + 8H) (W, R and ONNX's B = PyTorch's b_ih + b_hh):
#   LSTM(64 -> 128, bidirectional): 2 * (512*192 + 1024) = 198,656
#   LSTM(256 -> 128):               1 * (512*384 + 1024) = 197,632
#   Gemm(128 -> 10):                128*10 + 10          =   1,290   -> 397,578
EXPECTED_PARAMS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg19": 143_667_240,
    "alexnet": 61_100_840,
    "mobilenetv2": 3_504_872,
    "lstm": 397_578,
}

# Full op census of each graph (Dropout omitted, identity adaptive pools skipped).
EXPECTED_OPS = {
    "resnet18": {"Conv": 20, "BatchNormalization": 20, "Relu": 17, "MaxPool": 1, "Add": 8,
                 "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1},
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Relu": 49, "MaxPool": 1, "Add": 16,
                 "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1},
    "vgg19": {"Conv": 16, "Relu": 18, "MaxPool": 5, "Flatten": 1, "Gemm": 3},
    "alexnet": {"Conv": 5, "Relu": 7, "MaxPool": 3, "Flatten": 1, "Gemm": 3},
    "mobilenetv2": {"Conv": 52, "BatchNormalization": 52, "Clip": 35, "Add": 10,
                    "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1},
    "lstm": {"LSTM": 2, "Transpose": 1, "Reshape": 1, "Squeeze": 1, "Gemm": 1},
}

# Inputs of each op that hold trainable parameters (BN: scale and B, not mean/var).
PARAM_INPUTS = {"Conv": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2),
                "LSTM": (1, 2, 3)}


@functools.lru_cache(maxsize=None)
def _model(name: str, batch: int | str = 1, seed: int = 0) -> onnx.ModelProto:
    return build_model(name, batch=batch, seed=seed)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _input(name: str, batch: int, seed: int = 123) -> np.ndarray:
    shape = (16, batch, 64) if name == "lstm" else (batch, 3, 224, 224)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_checker_and_metadata(name):
    model = _model(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.producer_name == "onnxmlu.zoo"
    assert model.doc_string and model.graph.doc_string
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    node_names = [n.name for n in model.graph.node]
    assert all(node_names) and len(set(node_names)) == len(node_names)
    tensor_names = [o for n in model.graph.node for o in n.output] + list(_initializers(model))
    assert len(set(tensor_names)) == len(tensor_names)
    for t in model.graph.initializer:
        assert t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64), t.name


def test_doc_strings_name_the_architecture():
    for name, arch in [("resnet18", "ResNet-18"), ("resnet50", "ResNet-50"), ("vgg19", "VGG-19"),
                       ("alexnet", "AlexNet"), ("mobilenetv2", "MobileNetV2"), ("lstm", "LSTM")]:
        assert arch in _model(name).doc_string


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_parameter_count_matches_torchvision(name):
    model = _model(name)
    inits = _initializers(model)
    used = {n.input[i] for n in model.graph.node for i in PARAM_INPUTS.get(n.op_type, ())
            if i < len(n.input) and n.input[i]}
    assert used <= set(inits)
    assert sum(int(np.prod(inits[t].dims)) for t in used) == EXPECTED_PARAMS[name]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_op_census(name):
    assert Counter(n.op_type for n in _model(name).graph.node) == EXPECTED_OPS[name]


def test_layer_details():
    inits = _initializers(_model("resnet18"))
    nodes = {n.name: n for n in _model("resnet18").graph.node}
    assert nodes["layer1.0.conv1"].op_type == "Conv" and len(nodes["layer1.0.conv1"].input) == 2
    bn = nodes["layer1.0.bn1"]
    assert bn.op_type == "BatchNormalization"
    assert onnx.helper.get_attribute_value(bn.attribute[0]) == pytest.approx(1e-5)
    scale, bias, mean, var = (numpy_helper.to_array(inits[t]) for t in bn.input[1:])
    assert 0.5 <= scale.min() and scale.max() <= 1.5 and scale.std() > 0.1
    assert 0.5 <= var.min() and var.max() <= 1.5 and np.abs(mean).max() > 0.05
    assert np.abs(bias).max() > 0.05
    assert nodes["layer2.0.downsample.0"].op_type == "Conv"
    assert nodes["layer2.0.downsample.1"].op_type == "BatchNormalization"
    fc = nodes["fc"]
    assert fc.op_type == "Gemm" and len(fc.input) == 3 and fc.output[0] == "logits"
    assert {a.name: a.i for a in fc.attribute}.get("transB") == 1
    # conv weight is He-normal: std ~ sqrt(2 / fan_in)
    w = numpy_helper.to_array(inits["layer3.0.conv2.weight"])
    assert w.std() == pytest.approx(np.sqrt(2 / (256 * 9)), rel=0.02)

    # VGG / AlexNet convs carry a bias, MobileNetV2 depthwise convs have group = C
    assert all(len(n.input) == 3 for n in _model("vgg19").graph.node if n.op_type == "Conv")
    assert all(len(n.input) == 3 for n in _model("alexnet").graph.node if n.op_type == "Conv")
    mb = _model("mobilenetv2")
    groups = [a.i for n in mb.graph.node if n.op_type == "Conv" for a in n.attribute
              if a.name == "group" and a.i > 1]
    assert len(groups) == 17
    clip = next(n for n in mb.graph.node if n.op_type == "Clip")
    m_inits = _initializers(mb)
    assert [float(numpy_helper.to_array(m_inits[t])) for t in clip.input[1:]] == [0.0, 6.0]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_shape_inference_types_every_tensor(name):
    inferred = onnx.shape_inference.infer_shapes(_model(name), strict_mode=True)
    known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for node in inferred.graph.node:
        for out in node.output:
            dims = _dims(known[out])
            assert dims and all(isinstance(d, int) and d > 0 for d in dims), (out, dims)
    classes = 10 if name == "lstm" else 1000
    assert _dims(known["logits"]) == [1, classes]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_runs_in_onnxruntime_with_moderate_logits(name):
    (logits,) = _session(_model(name)).run(None, {"input": _input(name, 1)})
    assert logits.shape == (1, 10 if name == "lstm" else 1000)
    assert np.isfinite(logits).all()
    assert np.abs(logits).max() < 1e3
    assert logits.std() > 1e-3  # not collapsed either


@pytest.mark.parametrize("name", ["resnet18", "lstm"])
def test_symbolic_batch(name):
    model = _model(name, "N")
    onnx.checker.check_model(model, full_check=True)
    assert _dims(model.graph.input[0])[1 if name == "lstm" else 0] == "N"
    assert _dims(model.graph.output[0])[0] == "N"
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {vi.name: _dims(vi)
             for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    assert known["logits"] == ["N", 10 if name == "lstm" else 1000]
    if name == "lstm":
        assert known["lstm1.concat"] == [16, "N", 256]

    x = _input(name, 2)
    (out,) = _session(model).run(None, {"input": x})
    assert out.shape == (2, 10 if name == "lstm" else 1000)
    # Same seed -> same weights as the batch-1 model: each row matches a batch-1 run.
    single = _session(_model(name))
    for i in range(2):
        xi = x[:, i:i + 1] if name == "lstm" else x[i:i + 1]
        (ref,) = single.run(None, {"input": xi})
        np.testing.assert_allclose(out[i:i + 1], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2", "lstm"])
def test_determinism(name):
    a = build_model(name, seed=0).SerializeToString()
    assert a == _model(name).SerializeToString()
    assert a == build_model(name, seed=0).SerializeToString()
    other = build_model(name, seed=1)
    assert [n.SerializeToString() for n in other.graph.node] == \
           [n.SerializeToString() for n in _model(name).graph.node]
    base = _initializers(_model(name))
    for t in other.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) > 1:
            assert t.raw_data != base[t.name].raw_data, t.name


def test_cnn_names():
    assert CNN_NAMES == tuple(n for n in ZOO_NAMES if n != "lstm")


def test_bad_requests():
    with pytest.raises(OnnxMluError, match=r"unknown zoo model 'resnet101' \(known: resnet18"):
        build_model("resnet101")
    with pytest.raises(OnnxMluError):
        build_model("lstm", opset=9)
    with pytest.raises(OnnxMluError):
        build_model("lstm", batch=0)


@pytest.mark.parametrize("opset", [13, onnx.defs.onnx_opset_version()])
def test_other_opsets(opset):
    for name in ("mobilenetv2", "lstm"):
        model = build_model(name, opset=opset)
        onnx.checker.check_model(model, full_check=True)
        assert model.opset_import[0].version == opset


def _dlfusion_gops(model: onnx.ModelProto) -> float:
    """DLFusion Eq. 1-2: ops = 2 * MAC / 2^30 over Conv and FC layers.

    Conv MAC = N * C_out * H_out * W_out * C_in * kH * kW with C_in the *full* input
    channel count (a depthwise conv is not divided by its groups, as the paper's
    MobileNet figure apparently counts); FC MAC = N * in * out.
    """
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {vi.name: _dims(vi) for vi in list(inferred.graph.value_info)
              + list(inferred.graph.output) + list(inferred.graph.input)}
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    macs = 0
    for node in inferred.graph.node:
        if node.op_type == "Conv":
            n, c_out, h, w = shapes[node.output[0]]
            _, c_in, kh, kw = weights[node.input[1]]
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            macs += n * c_out * h * w * (c_in * group) * kh * kw
        elif node.op_type == "Gemm":
            n = shapes[node.input[0]][0]
            fout, fin = weights[node.input[1]]
            macs += n * fin * fout
    return 2 * macs / 2**30


@pytest.mark.parametrize("name, gops", [("resnet18", 3.38), ("resnet50", 7.62)])
def test_dlfusion_table2_op_counts(name, gops):
    assert _dlfusion_gops(_model(name)) == pytest.approx(gops, rel=0.01)
