"""hostir's version, and the line `hir-opt --version` and `hir-run --version` print."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"


def version_line(program: str) -> str:
    """`hir-opt 0.1.0 (xDSL 0.74.0, torch 2.13.0)`: hostir's version beside those of what it
    runs on, as the distributions say (torch is not imported for it)."""

    def of(distribution: str) -> str:
        try:
            return version(distribution)
        except PackageNotFoundError:
            return "not installed"

    return f"{program} {__version__} (xDSL {of('xdsl')}, torch {of('torch')})"
