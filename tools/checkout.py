"""The scripts of tools/ run from a checkout (`python3 tools/hir-opt.py ...`): hostir is
imported from the installed package, or, where none is installed, from the checkout's
own folders, which stand for the package `hostir`."""

import importlib.util
import sys
import types
from pathlib import Path


def import_hostir_from_checkout() -> None:
    checkout = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(checkout))
    if importlib.util.find_spec("hostir") is None:
        package = types.ModuleType("hostir")
        package.__path__ = [str(checkout)]
        sys.modules["hostir"] = package
