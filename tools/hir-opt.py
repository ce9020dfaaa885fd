#!/usr/bin/env python3
"""`hir-opt` run from a checkout: `python3 tools/hir-opt.py input.mlir -p fusion-to-hir`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.hir_opt import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
