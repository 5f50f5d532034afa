"""Fixtures of the precision tests."""

from __future__ import annotations

import onnx
import pytest

from precision_models import RESIDUAL_FILE_SEED, residual_model


@pytest.fixture
def residual_file(tmp_path):
    """The residual test model saved as a file, for the command line."""
    path = tmp_path / "residual.onnx"
    onnx.save(residual_model(seed=RESIDUAL_FILE_SEED), path)
    return path
