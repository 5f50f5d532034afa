"""Skips that CI turns into failures.

A test that needs something this machine lacks (the built library, a corpus package that
could not be fetched) is skipped on a developer's machine, but under CI (``ONNXMLU_CI=1``, set
by .ci/run) the same absence is an error: a skip there would hide that nothing was tested.
"""

from __future__ import annotations

import os

import pytest

CI_ENV = "ONNXMLU_CI"


def unavailable(reason: str) -> None:
    """Skip with ``reason``, or fail with it under CI."""
    if os.environ.get(CI_ENV):
        pytest.fail(f"{reason} (${CI_ENV} is set: under CI this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)
