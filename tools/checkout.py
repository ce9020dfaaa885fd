"""The scripts of tools/ run from a checkout (`python3 tools/hir-opt.py ...`): hostir is
imported from the installed package, or, where none is installed, from the checkout's own
folders: `hostir/` is the package, and `passes/`, `runtime/`, `frontend/` and `tools/`, beside
it, are its subpackages, as pyproject.toml's `package-dir` installs them."""

import importlib.util
import sys
from pathlib import Path


def import_hostir_from_checkout() -> None:
    if importlib.util.find_spec("hostir") is not None:
        # Installed: its packages. The checkout's root on the path would put the checkout's
        # hostir/ folder, which holds none of the rooms, before the installed package.
        return
    checkout = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(checkout))  # hostir_dialect
    package = checkout / "hostir"
    spec = importlib.util.spec_from_file_location(
        "hostir", package / "__init__.py", submodule_search_locations=[str(package), str(checkout)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostir"] = module
    spec.loader.exec_module(module)
