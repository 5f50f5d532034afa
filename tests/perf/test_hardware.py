"""Hardware profiles are checked when loaded: a bad file gets one line naming the field and the
value (the CLI exits 2 without a traceback), never a bare TypeError or a silently wrong model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxmlu.cli import app
from onnxmlu.errors import OnnxMluError
from onnxmlu.plan.perf import hardware
from onnxmlu.plan.perf.hardware import PerfParams, load_hardware, profile_names


@pytest.fixture
def base() -> dict:
    return json.loads(CliRunner().invoke(app, ["hw", "show", "mlu100"]).stdout)


def write(tmp_path, data, name="hw.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize("patch, message", [
    ({"cores": "32"}, """'cores' must be an integer from 1 to 1024, got "32" (a string)"""),
    ({"cores": 0}, "'cores' must be an integer from 1 to 1024, got 0"),
    ({"cores": 4096}, "'cores' must be an integer from 1 to 1024, got 4096"),
    ({"cores": True}, "'cores' must be an integer from 1 to 1024, got true (a boolean)"),
    ({"cores": 2.5}, "'cores' must be an integer from 1 to 1024, got 2.5"),
    ({"dram_gbps": -5}, "'dram_gbps' must be a number > 0, got -5"),
    ({"frequency_ghz": None}, "'frequency_ghz' must be a number > 0, got null (null)"),
    ({"peak_tflops_fp32_per_core": [1]}, "'peak_tflops_fp32_per_core' must be a number > 0, got [1] (an array)"),
    ({"name": ""}, """'name' must be a non-empty string, got "" (a string)"""),
    ({"model": []}, "'model' must be an object of performance-model parameters, got [] (an array)"),
    ({"model": {"overlap_theta": 2}}, "'model.overlap_theta' must be a number from 0 to 1, got 2"),
    ({"model": {"launch_us": "fast"}}, """'model.launch_us' must be a number >= 0, got "fast" (a string)"""),
    ({"model": {"knee": 1}}, "unknown model parameter 'model.knee'"),
    ({"coress": 32}, "unknown field 'coress'"),
])
def test_a_bad_field_is_named_with_its_value(tmp_path, base, patch, message):
    path = write(tmp_path, {**base, **patch})
    with pytest.raises(OnnxMluError) as info:
        load_hardware(path)
    text = str(info.value)
    assert text.startswith(f"hardware profile {path}: ") and message in text and "\n" not in text


def test_missing_fields_and_non_objects(tmp_path, base):
    del base["cores"]
    with pytest.raises(OnnxMluError, match="missing field 'cores'"):
        load_hardware(write(tmp_path, base))
    with pytest.raises(OnnxMluError, match=r"must be a JSON object, got \[1, 2\] \(an array\)"):
        load_hardware(write(tmp_path, [1, 2]))
    with pytest.raises(OnnxMluError, match="is not valid JSON"):
        load_hardware(write(tmp_path, "{"))
    with pytest.raises(OnnxMluError, match=r"'dram_gbps' must be a number > 0, got NaN"):
        load_hardware(write(tmp_path, {**base, "cores": 8, "dram_gbps": float("nan")}))


def test_valid_files_load_with_integral_floats_as_integers(tmp_path, base):
    base["cores"], base["model"]["search_max_block_layers"] = 8.0, 64.0
    hw = load_hardware(write(tmp_path, base))
    assert hw.cores == 8 and isinstance(hw.cores, int) and hw.model.search_max_block_layers == 64
    del base["description"], base["model"]
    assert load_hardware(write(tmp_path, base, "minimal.json")).model == PerfParams()
    for name in profile_names():
        assert load_hardware(name).name == name


def test_each_default_is_written_once():
    """Each default is written once, in PerfParams: no module keeps a second copy of a value."""
    package = Path(hardware.__file__).parents[2]
    sources = [p for p in package.rglob("*.py") if p.name != "hardware.py"]
    sources += list((package / "plan" / "perf" / "profiles").glob("mlu100.json"))
    for default in ("3.585", "0.316", "0.659"):
        assert not [str(p) for p in sources if default in p.read_text()], default


@pytest.mark.parametrize("command", [["fuse", "{model}", "{out}"], ["plan", "{model}"], ["hw", "show"]])
def test_cli_says_one_line_and_exits_2(tmp_path, base, chain_model, command):
    import onnx

    model = tmp_path / "m.onnx"
    onnx.save(chain_model, model)
    bad = write(tmp_path, {**base, "cores": "32"})
    args = [a.format(model=model, out=tmp_path / "o.onnx") for a in command]
    args += [str(bad)] if command[0] == "hw" else ["--hw", str(bad)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: hardware profile") and "'cores'" in lines[0]
    assert "Traceback" not in result.output and not (tmp_path / "o.onnx").exists()


def test_a_profile_s_peaks_are_one_field_per_precision_record():
    """The peak fields a profile has, the loader checks and ``hw show`` writes are the records'
    ``peak`` names, in their order; Hardware.peaks is keyed by precision and needs every one."""
    from onnxmlu.plan.perf.hardware import Hardware
    from onnxmlu.precisions import RECORDS

    peaks = [p.peak for p in RECORDS.values()]
    for name in profile_names():
        hw = load_hardware(name)
        data = hw.to_dict()
        assert list(data)[2:2 + len(peaks)] == peaks and Hardware.from_dict(data) == hw
        assert [hw.peak_per_core(p) for p in RECORDS] == [data[k] for k in peaks]
        assert hardware.profile_problem({k: v for k, v in data.items() if k != peaks[-1]}) == \
            f"missing field {peaks[-1]!r}"
    with pytest.raises(ValueError, match="Hardware.peaks must give each of"):
        Hardware(name="x", cores=1, peaks={"fp32": 1.0}, dram_gbps=1.0, frequency_ghz=1.0)
