#!/usr/bin/env python3
"""`hir-opt` run from a checkout: `python3 tools/hir-opt.py input.mlir -p fusion-to-hir`."""

import sys

from checkout import import_hostir_from_checkout  # tools/checkout.py, next to this script

import_hostir_from_checkout()

from hostir.tools.hir_opt import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
