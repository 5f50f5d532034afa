"""Print ``name==lowest`` for every runtime dependency in pyproject.toml: the versions
`make smoke-lowest` installs, so the declared lower bounds are the ones tested.

Every dependency must have a ``>=`` bound; one without is an error (its lowest version would
be whatever pip has never been asked about).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def dependencies(pyproject: str) -> list[str]:
    """The strings of ``[project] dependencies`` (a TOML array of plain strings)."""
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", pyproject, re.S | re.M)
    if block is None:
        raise SystemExit("error: pyproject.toml has no [project] dependencies array")
    lines = (line.split("#", 1)[0] for line in block.group(1).splitlines())
    return re.findall(r'"([^"]+)"', "\n".join(lines))


def lowest(requirement: str) -> str:
    """``name==X`` for a requirement with a ``>=X`` bound."""
    name, _, spec = _REQUIREMENT.match(requirement.split(";", 1)[0]).groups()
    bound = re.search(r">=\s*([0-9][^,\s]*)", spec)
    if bound is None:
        raise SystemExit(f"error: dependency {requirement!r} has no >= lower bound to test")
    return f"{name}=={bound.group(1)}"


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    for requirement in dependencies((root / "pyproject.toml").read_text()):
        print(lowest(requirement))


if __name__ == "__main__":
    main()
