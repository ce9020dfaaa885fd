#!/usr/bin/env python3
"""`hir-run` run from a checkout: `python3 tools/hir-run.py fusion.mlir --nproc 4 --check`."""

import sys

from checkout import import_hostir_from_checkout  # tools/checkout.py, next to this script

import_hostir_from_checkout()

from hostir.tools.hir_run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
