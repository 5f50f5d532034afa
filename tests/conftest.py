"""Shared fixtures: zoo models built once per test session, small hand-made graphs, the
custom-op library (tests that need it are skipped when it is not built; under CI that fails:
tests/ci.py)."""

from __future__ import annotations

import pytest

from ci import unavailable
from onnxmlu import runtime
from onnxmlu.errors import RuntimeLibraryError
from onnxmlu.tools.testing import conv_chain_model, zoo_model


@pytest.fixture(scope="session")
def library() -> str:
    """The custom-op library's path; the test is skipped when it is not built (fails under CI)."""
    try:
        return runtime.custom_ops_library()
    except RuntimeLibraryError as error:
        unavailable(str(error))


@pytest.fixture(scope="session")
def zoo():
    return zoo_model


@pytest.fixture
def chain_model():
    return conv_chain_model()


@pytest.fixture(autouse=True)
def _wide_cli_console(monkeypatch):
    """In-process CLI runs print as a wide pipe does, whatever COLUMNS the test runner's
    workers inherit (pytest-xdist's set it to 80): a test reading a sentence out of the output
    must not find it wrapped. The console reads COLUMNS when it prints (onnxmlu/cli.py,
    ``_Console``), so a test that sets it (``CliRunner.invoke(env=...)``) gets that width."""
    monkeypatch.delenv("COLUMNS", raising=False)
