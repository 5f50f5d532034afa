"""Shared fixtures: zoo models built once per test session, small hand-made graphs."""

from __future__ import annotations

import functools

import onnx
import pytest

from onnxmlu.testing import conv_chain_model


@functools.lru_cache(maxsize=None)
def _zoo_bytes(name: str, batch) -> bytes:
    from onnxmlu.zoo import build_model

    return build_model(name, batch=batch, seed=0).SerializeToString()


def zoo_model(name: str, batch=1) -> onnx.ModelProto:
    """A fresh copy of a zoo model (the bytes are cached, the proto is new each call)."""
    return onnx.load_from_string(_zoo_bytes(name, batch))


@pytest.fixture(scope="session")
def zoo():
    return zoo_model


@pytest.fixture
def chain_model():
    return conv_chain_model()
