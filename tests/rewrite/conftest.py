"""Fixtures for the rewriter tests.

``onnx_backend_case`` is a callable ``name -> BackendCase`` (model + data sets) over the ONNX
backend node tests of onnx 1.22.0, downloaded and unpacked once per repository checkout (see
``rw_backend``). Parametrize a test over ``rw_backend.FAMILIES[...]`` names and ask for the
fixture; it skips (with the pip error) only when the wheel cannot be downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rw_backend  # noqa: E402


@pytest.fixture(scope="session")
def onnx_backend_root() -> Path:
    root, why = rw_backend.backend_root()
    if root is None:
        pytest.skip(why)
    return root


@pytest.fixture(scope="session")
def onnx_backend_case(onnx_backend_root):
    cache: dict[str, rw_backend.BackendCase] = {}

    def load(name: str) -> rw_backend.BackendCase:
        if name not in cache:
            cache[name] = rw_backend.load_case(onnx_backend_root, name)
        return cache[name]

    return load
