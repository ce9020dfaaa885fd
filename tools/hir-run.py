#!/usr/bin/env python3
"""`hir-run` run from a checkout: `python3 tools/hir-run.py fusion.mlir --nproc 4 --check`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.hir_run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
