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

**Certifying top-1.** An agreement of 8 in 8 rows does not show that 99 % of rows agree. A
``top1`` budget is met only when the one-sided Clopper–Pearson lower confidence bound
(:data:`CONFIDENCE`, 95 %) on the agreement clears it: for ``k`` agreeing rows of ``n``, the
``p`` at which ``P(X >= k | n, p) = 1 - CONFIDENCE`` (``X ~ Binomial(n, p)``), found by bisection
on the binomial tail (no scipy). With ``k = n`` it is ``(1 - CONFIDENCE)^(1/n)``, so
``top1>=0.99`` needs at least 299 rows even when every one agrees
(:func:`rows_to_certify`). The ``cosine`` budget is a worst case over the samples, no bound.

**A user metric** (``--metric module:function``, :func:`load_metric`), as NNCF's and Neural
Compressor's accuracy-aware modes take one: ``function(reference, outputs) -> float`` is called
once per sample with the FP32 model's outputs and the candidate's (lists of arrays, in output
order); the figure is the **mean** over the samples (a dataset metric, e.g. a detection score).
The budget ``metric>=X`` then decides; cosine and top-1 are still measured and reported.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence
import importlib

import numpy as np

from onnxmlu.errors import OnnxMluError

METRICS: tuple[str, ...] = ("cosine", "top1", "metric")
#: A user metric: FP32 outputs and candidate outputs of one sample -> a score.
Metric = Callable[[list, list], float]
_BUDGET = re.compile(r"^\s*([a-z0-9]+)\s*>=\s*([-+0-9.eE]+)\s*$")

Outputs = Sequence[np.ndarray]


#: Confidence of the one-sided lower bound a ``top1`` budget must clear.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Accuracy:
    """Both metrics of one model against its reference (``top1`` is nan without class scores);
    ``rows``: how many argmax rows the top-1 figure counts (0: an estimate, not a count)."""

    cosine: float
    top1: float
    rows: int = 0
    metric: float = math.nan  # the user metric's mean over the samples (nan without one)

    def value(self, metric: str) -> float:
        return {"cosine": self.cosine, "top1": self.top1}.get(metric, self.metric)

    def top1_bound(self) -> float:
        """The one-sided 95 % Clopper–Pearson lower bound on the top-1 agreement (nan without
        counted rows)."""
        if self.rows <= 0 or math.isnan(self.top1):
            return math.nan
        return lower_bound(round(self.top1 * self.rows), self.rows)

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
            raise OnnxMluError(f"--accuracy must read METRIC>=VALUE (e.g. cosine>=0.999, top1>=0.99 or metric>=X "
                               f"with --metric), not {text!r}")
        metric, value = match.group(1), float(match.group(2))
        if metric not in METRICS:
            raise OnnxMluError(f"accuracy metric must be one of {', '.join(METRICS)}, not {metric!r}")
        low = -1.0 if metric == "cosine" else 0.0
        if metric != "metric" and not low <= value <= 1.0:  # a user metric has its own scale
            raise OnnxMluError(f"{metric} budget must lie in [{low:g}, 1], not {value:g}")
        return cls(metric, value)

    @classmethod
    def of(cls, value: "Budget | str | None") -> "Budget | None":
        """``value`` as a budget: a :class:`Budget` as it is, the text of ``--accuracy`` parsed
        (:meth:`parse`, the one place it is), None as None. Called where the option enters (the
        option objects, the API's entry points), so what runs below holds a parsed value."""
        return value if value is None or isinstance(value, Budget) else cls.parse(value)

    def met(self, accuracy: Accuracy) -> bool:
        """Whether ``accuracy`` keeps the budget; for ``top1`` measured on counted rows, its lower
        confidence bound must (module docstring)."""
        if self.metric == "top1" and accuracy.rows:
            return accuracy.top1_bound() >= self.threshold
        return accuracy.value(self.metric) >= self.threshold

    def certifiable(self, rows: int) -> bool:
        """Whether ``rows`` counted rows can certify this budget at all (every one agreeing)."""
        return self.metric != "top1" or lower_bound(rows, rows) >= self.threshold

    def __str__(self) -> str:
        return f"{self.metric}>={self.threshold:g}"


def measure(reference: Sequence[Outputs], outputs: Sequence[Outputs], metric: Metric | None = None) -> Accuracy:
    """Both metrics of ``outputs`` against ``reference`` (one list of output arrays per sample),
    and the user ``metric``'s mean when one is given."""
    if len(reference) != len(outputs) or not reference:
        raise ValueError("measure() needs the same, non-zero number of samples on both sides")
    pairs = [(r, y) for ref, out in zip(reference, outputs) for r, y in zip(ref, out) if _is_float(r)]
    cosine = min((cosine_similarity(r, y) for r, y in pairs), default=1.0)
    top1, rows = top1_counts(reference, outputs)
    custom = math.nan if metric is None else float(np.mean([_score(metric, r, y) for r, y in zip(reference, outputs)]))
    return Accuracy(cosine, top1, rows, custom)


def load_metric(spec: str) -> Metric:
    """The function ``module:function`` names (``--metric``); a one-line error when it cannot be had."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise OnnxMluError(f"--metric must read module:function (e.g. mymetrics:map50), not {spec!r}")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise OnnxMluError(f"--metric {spec}: cannot load it: {exc}") from None
    if not callable(found):
        raise OnnxMluError(f"--metric {spec} is not a function")
    return found


def _score(metric: Metric, reference: Outputs, outputs: Outputs) -> float:
    try:
        score = float(metric(list(reference), list(outputs)))
    except Exception as exc:  # noqa: BLE001 - the user's code: its failure as one line
        raise OnnxMluError(f"the --metric function failed: {type(exc).__name__}: {exc}") from None
    if not math.isfinite(score):
        raise OnnxMluError(f"the --metric function returned {score}, not a finite number")
    return score


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
    return top1_counts(reference, outputs)[0]


def top1_counts(reference: Sequence[Outputs], outputs: Sequence[Outputs]) -> tuple[float, int]:
    """:func:`top1_agreement` and the number of rows it counts (0 without class scores)."""
    fractions = []
    for k, first in enumerate(reference[0]):
        if not (_is_float(first) and first.ndim >= 1 and first.shape[-1] >= 2):
            continue
        agree = np.concatenate([(np.argmax(ref[k], axis=-1) == np.argmax(out[k], axis=-1)).ravel()
                                for ref, out in zip(reference, outputs)])
        fractions.append((float(np.mean(agree)), int(agree.size)))
    return min(fractions, default=(math.nan, 0))


def lower_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper–Pearson lower bound on a proportion seen as ``k`` successes in ``n``:
    the ``p`` with ``P(X >= k | n, p) = 1 - confidence``, by bisection (the tail grows with p)."""
    if n <= 0:
        return math.nan
    if k <= 0:
        return 0.0
    alpha = 1.0 - confidence
    if k >= n:
        return alpha ** (1.0 / n)
    lo, hi = 0.0, k / n
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _upper_tail(k, n, mid) < alpha else (lo, mid)
    return lo


def rows_to_certify(threshold: float, confidence: float = CONFIDENCE) -> int:
    """The fewest rows, all agreeing, whose lower bound reaches ``threshold``."""
    if threshold >= 1.0:
        return 0  # never: no finite count bounds the agreement at 1
    return max(1, math.ceil(math.log(1.0 - confidence) / math.log(threshold))) if threshold > 0 else 1


def _upper_tail(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``, summed in log space (n of thousands is fine)."""
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(k, n + 1)]
    top = max(terms)
    return math.exp(top) * sum(math.exp(t - top) for t in terms)


def _is_float(array: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(array).dtype, np.floating)
