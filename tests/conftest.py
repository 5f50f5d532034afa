"""Shared fixtures: zoo models built once per test session, small hand-made graphs."""

from __future__ import annotations

import onnx
import pytest

from onnxmlu.testing import conv_chain_model, zoo_model


@pytest.fixture(scope="session")
def zoo():
    return zoo_model


@pytest.fixture
def chain_model():
    return conv_chain_model()
