"""lit configuration: every `*.mlir` file under test/lit, in any subdirectory, is a test.

`hir-opt` in a RUN line is the checkout's `tools/hir-opt.py` (not an installed copy)
and `filecheck` the FileCheck of the `filecheck` Python package, both run by the
Python that runs lit, so that the tests see the code next to them.
"""

import os
import sys

import lit.formats

config.name = "hostir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.test_source_root

repository = os.path.dirname(os.path.dirname(config.test_source_root))
python = f'"{sys.executable}"'

# A tool name counts only as a whole word, not inside a path such as test/lit/hir-opt/.
for tool in ("hir-opt", "hir-run"):
    script = os.path.join(repository, "tools", f"{tool}.py")
    config.substitutions.append((rf"(?<![\w/.-]){tool}(?![\w/.-])", f'{python} "{script}"'))
config.substitutions.append((r"(?<![\w/.-])filecheck(?![\w/.-])", f"{python} -m filecheck"))
config.substitutions.append(("%python", python))
