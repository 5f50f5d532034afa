"""The package's version: pyproject.toml's, as installed (one source).

A leaf below every module that writes it into a file (:mod:`onnxmlu.schema`'s metadata), so
none of them imports the package's root for it.
"""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("onnxmlu")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
