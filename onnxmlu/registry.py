"""Named extension points (rewriters, strategies): one style for both.

A :class:`Registry` is a dict of name -> object that refuses a second object under a name
already taken and says which names exist when asked for an unknown one (Polygraphy's tool
registry [Polygraphy]). Built-in entries are listed in the module that owns them, in their order.
"""

from __future__ import annotations

from typing import Generic, Iterable, TypeVar

from onnxmlu.errors import DuplicateNameError, OnnxMluError

T = TypeVar("T")
#: No default given to :meth:`Registry.get`: an unknown name is an error.
_REQUIRED = object()


class Registry(dict, Generic[T]):
    """name -> object; :meth:`register` rejects duplicates, :meth:`get` unknown names."""

    def __init__(self, kind: str, entries: Iterable[tuple[str, T]] = ()) -> None:
        super().__init__()
        self.kind = kind
        for name, entry in entries:
            self.register(name, entry)

    def register(self, name: str, entry: T) -> None:
        if name in self:
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered")
        self[name] = entry

    def get(self, name: str, default: object = _REQUIRED) -> T:  # type: ignore[override]
        """The entry under ``name``; an unknown name returns ``default`` when one is given (as
        :meth:`dict.get` does) and raises a one-line :class:`OnnxMluError` naming the known
        entries otherwise."""
        if name in self:
            return self[name]
        if default is not _REQUIRED:
            return default  # type: ignore[return-value]
        raise OnnxMluError(f"unknown {self.kind} {name!r} (known: {', '.join(self)})")

    def names(self) -> tuple[str, ...]:
        return tuple(self)
