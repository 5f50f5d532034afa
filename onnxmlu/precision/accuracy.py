"""Accuracy of a lower-precision model against its FP32 reference, and accuracy budgets.

Two metrics, each computed over every calibration sample and every floating-point output:

* ``cosine``: the worst case of the cosine similarity ``<r, y> / (|r| |y|)`` between the
  reference output ``r`` and the output ``y``, each flattened, over samples and outputs. Two
  all-zero tensors count as 1, one all-zero tensor against a non-zero one as 0.
* ``top1``: for each output of rank >= 1 whose last axis has at least two entries (class
  scores), the fraction of rows -- every index but the last axis, over all samples -- whose
  argmax along the last axis agrees with the reference's; the least such fraction over those
  outputs. A model without such an output has no top-1 figure (``nan``).

The *deficit* of a metric is ``1 - value``: 0 for a perfect match. The joint precision planner
(:mod:`onnxmlu.precision.auto`) adds deficits measured for parts of the model to estimate the
accuracy of a plan; for small deficits that is the first-order model of independent errors
(``1 - cos`` is half the squared relative error, and independent errors add in power).

A :class:`Budget` is what the user asks for: ``cosine>=0.999`` or ``top1>=0.99``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from onnxmlu.errors import OnnxMluError

METRICS: tuple[str, ...] = ("cosine", "top1")
_BUDGET = re.compile(r"^\s*([a-z0-9]+)\s*>=\s*([-+0-9.eE]+)\s*$")

Outputs = Sequence[np.ndarray]


@dataclass(frozen=True)
class Accuracy:
    """Both metrics of one model against its reference (``top1`` is nan without class scores)."""

    cosine: float
    top1: float

    def value(self, metric: str) -> float:
        return self.cosine if metric == "cosine" else self.top1

    def to_dict(self) -> dict:
        return {"cosine": self.cosine, "top1": None if math.isnan(self.top1) else self.top1}


@dataclass(frozen=True)
class Budget:
    """``metric >= threshold``, the accuracy a plan must keep."""

    metric: str
    threshold: float

    @classmethod
    def parse(cls, text: str) -> "Budget":
        """``"cosine>=0.999"`` -> Budget("cosine", 0.999); a readable error otherwise."""
        match = _BUDGET.match(text)
        if match is None:
            raise OnnxMluError(f"--accuracy must read METRIC>=VALUE (e.g. cosine>=0.999 or top1>=0.99), not {text!r}")
        metric, value = match.group(1), float(match.group(2))
        if metric not in METRICS:
            raise OnnxMluError(f"accuracy metric must be one of {', '.join(METRICS)}, not {metric!r}")
        low = -1.0 if metric == "cosine" else 0.0
        if not low <= value <= 1.0:
            raise OnnxMluError(f"{metric} budget must lie in [{low:g}, 1], not {value:g}")
        return cls(metric, value)

    def met(self, accuracy: Accuracy) -> bool:
        return accuracy.value(self.metric) >= self.threshold

    def __str__(self) -> str:
        return f"{self.metric}>={self.threshold:g}"


def measure(reference: Sequence[Outputs], outputs: Sequence[Outputs]) -> Accuracy:
    """Both metrics of ``outputs`` against ``reference`` (one list of output arrays per sample)."""
    if len(reference) != len(outputs) or not reference:
        raise ValueError("measure() needs the same, non-zero number of samples on both sides")
    pairs = [(r, y) for ref, out in zip(reference, outputs) for r, y in zip(ref, out) if _is_float(r)]
    cosine = min((cosine_similarity(r, y) for r, y in pairs), default=1.0)
    return Accuracy(cosine, top1_agreement(reference, outputs))


def cosine_similarity(reference: np.ndarray, output: np.ndarray) -> float:
    r = np.asarray(reference, dtype=np.float64).ravel()
    y = np.asarray(output, dtype=np.float64).ravel()
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(y))):
        return float(np.array_equal(r, y, equal_nan=True))  # inf/nan: only an exact match counts
    norms = float(np.linalg.norm(r) * np.linalg.norm(y))
    if norms == 0.0:
        return float(not r.any() and not y.any())
    return float(np.dot(r, y) / norms)


def top1_agreement(reference: Sequence[Outputs], outputs: Sequence[Outputs]) -> float:
    """The least, over outputs with class scores, of the fraction of rows whose argmax agrees."""
    fractions = []
    for k, first in enumerate(reference[0]):
        if not (_is_float(first) and first.ndim >= 1 and first.shape[-1] >= 2):
            continue
        agree = [np.argmax(ref[k], axis=-1) == np.argmax(out[k], axis=-1) for ref, out in zip(reference, outputs)]
        fractions.append(float(np.mean(np.concatenate([a.ravel() for a in agree]))))
    return min(fractions, default=math.nan)


def _is_float(array: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(array).dtype, np.floating)
