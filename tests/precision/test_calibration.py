"""Calibration data: the folder loader (.npz files, sub-folders of TensorProto files), its
checks, the seeded random fallback, the reader onnxruntime's calibrators use, and the capture
of a block's input tensors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxmlu.errors import OnnxMluError
from onnxmlu.precision.calibration import (
    SampleReader,
    calibration_set,
    capture_tensors,
    load_calibration,
    random_calibration,
)
from onnxmlu.runtime import reference_session
from precision_models import SIZE, residual_model

SHAPE = (1, 3, SIZE, SIZE)


def _arrays(count, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def test_npz_files_are_samples_in_name_order(tmp_path):
    arrays = _arrays(3)
    for k, x in enumerate(arrays):
        np.savez(tmp_path / f"sample_{k}.npz", x=x)
    cal = load_calibration(tmp_path, residual_model())
    assert len(cal) == 3 and not cal.random and cal.source == str(tmp_path)
    for sample, x in zip(cal.samples, arrays):
        np.testing.assert_array_equal(sample["x"], x)
    assert "3 samples from" in cal.describe()


def test_tensorproto_subfolders_are_samples_keyed_by_tensor_name(tmp_path):
    arrays = _arrays(2, seed=1)
    for k, x in enumerate(arrays):  # the ONNX model zoo's test_data_set_N/input_0.pb layout
        (tmp_path / f"test_data_set_{k}").mkdir()
        (tmp_path / f"test_data_set_{k}" / "input_0.pb").write_bytes(
            numpy_helper.from_array(x, "x").SerializeToString())
        (tmp_path / f"test_data_set_{k}" / "output_0.pb").write_bytes(  # expected outputs: skipped
            numpy_helper.from_array(np.zeros((1, 10), np.float32), "y").SerializeToString())
    (tmp_path / "unnamed").mkdir()  # a tensor without a name is keyed by its file's stem
    (tmp_path / "unnamed" / "x.pb").write_bytes(numpy_helper.from_array(arrays[0]).SerializeToString())
    cal = load_calibration(tmp_path, residual_model())
    assert len(cal) == 3
    np.testing.assert_array_equal(cal.samples[0]["x"], arrays[0])
    np.testing.assert_array_equal(cal.samples[1]["x"], arrays[1])
    np.testing.assert_array_equal(cal.samples[2]["x"], arrays[0])


def test_float64_arrays_are_narrowed_to_the_input_type(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros(SHAPE, dtype=np.float64))
    assert load_calibration(tmp_path, residual_model()).samples[0]["x"].dtype == np.float32


@pytest.mark.parametrize("arrays, message", [
    ({"y": np.zeros(SHAPE, np.float32)}, "missing input.* x; unknown name.* y"),
    ({"x": np.zeros((1, 3, 5, 5), np.float32)}, r"shape \[1, 3, 5, 5\], the model wants \[1, 3, 12, 12\]"),
    ({"x": np.zeros(SHAPE, np.int64)}, "is int64, the model wants float32"),
])
def test_samples_that_do_not_fit_the_model_get_clear_errors(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(OnnxMluError, match=message):
        load_calibration(tmp_path, residual_model())


def test_folders_without_samples_are_refused(tmp_path):
    with pytest.raises(OnnxMluError, match="does not exist"):
        load_calibration(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("no samples here")
    with pytest.raises(OnnxMluError, match="holds no sample"):
        load_calibration(tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.pb").write_bytes(b"\xff\xff\xff")
    with pytest.raises(OnnxMluError, match="not a serialized ONNX TensorProto"):
        load_calibration(tmp_path)


def test_random_fallback_is_seeded_and_flagged():
    model = residual_model()
    first, again = random_calibration(model, count=4, seed=7), random_calibration(model, count=4, seed=7)
    assert first.random and first.seed == 7 and len(first) == 4
    for a, b in zip(first.samples, again.samples):
        np.testing.assert_array_equal(a["x"], b["x"])
    assert not np.array_equal(first.samples[0]["x"], first.samples[1]["x"])
    assert "seeded random" in first.describe() and "no calibration data" in first.describe()
    assert calibration_set(model).random and calibration_set(model).seed == 0


def test_reader_serves_each_sample_once_then_rewinds_and_takes_ranges():
    samples = [{"x": np.full(2, k, np.float32)} for k in range(5)]
    reader = SampleReader(samples)
    assert len(reader) == 5
    assert [int(s["x"][0]) for s in reader] == [0, 1, 2, 3, 4]
    assert reader.get_next() is None
    reader.rewind()
    assert int(reader.get_next()["x"][0]) == 0
    reader.set_range(2, 4)
    assert [int(s["x"][0]) for s in reader] == [2, 3]


def test_capture_gives_the_tensors_entering_a_block():
    model = residual_model(seed=2)
    samples = random_calibration(model, count=2).samples
    captured = capture_tensors(model, ["x", "h", "p"], samples)
    before = len(model.graph.output)
    # the same tensors by an independent route: each exposed as an output of its own model
    for name in ("h", "p"):
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        exposed.graph.output.add().name = name
        session = reference_session(exposed)
        for sample, got in zip(samples, captured):
            np.testing.assert_allclose(got[name], session.run([name], sample)[0], rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(c["x"], s["x"]) for c, s in zip(captured, samples))
    assert len(model.graph.output) == before  # the model is left as it was
