"""Shared fixtures of the reliability tests."""

import pytest

from onnxmlu import runtime
from onnxmlu.errors import RuntimeLibraryError


@pytest.fixture(scope="session")
def library() -> str:
    """The custom-op library's path; the test is skipped when it is not built."""
    try:
        return runtime.custom_ops_library()
    except RuntimeLibraryError as error:
        pytest.skip(str(error))
