#!/usr/bin/env python3
"""`hir-run` run from a checkout: `python3 tools/hir-run.py fusion.mlir --nproc 4 --check`."""

import importlib.util
import sys
import types
from pathlib import Path

checkout = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(checkout))
if importlib.util.find_spec("hostir") is None:  # not installed: the checkout's folders are hostir's
    sys.modules["hostir"] = types.ModuleType("hostir")
    sys.modules["hostir"].__path__ = [str(checkout)]

from hostir.tools.hir_run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
