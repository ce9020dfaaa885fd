"""lit configuration: every `*.mlir` file under test/lit, in any subdirectory, is a test.

`hir-opt` in a RUN line is the checkout's `tools/hir-opt.py` (not an installed copy)
and `filecheck` the FileCheck of the `filecheck` Python package, both run by the
Python that runs lit, so that the tests see the code next to them. Both are forked from
a process that has imported them once (preload.py), which this file starts, since
importing is nearly all of their start; `lit --param preload=0` runs each in a fresh
process instead.
"""

import os
import sys
import tempfile

import lit.formats

config.name = "hostir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.test_source_root

repository = os.path.dirname(os.path.dirname(config.test_source_root))
python = f'"{sys.executable}"'


commands = {tool: f'{python} "{os.path.join(repository, "tools", f"{tool}.py")}"' for tool in ("hir-opt", "hir-run")}
commands["filecheck"] = f"{python} -m filecheck"
if lit_config.params.get("preload", "1") != "0":
    sys.path.insert(0, config.test_source_root)
    import preload

    directory = tempfile.mkdtemp(prefix="hostir-lit-")  # the server removes it when lit exits
    preload.start_server(directory)
    for tool in ("hir-opt", "filecheck"):
        commands[tool] = " ".join(f'"{word}"' for word in preload.client_command(directory, tool))
# A tool name counts only as a whole word, not inside a path such as test/lit/hir-opt/.
for tool, command in commands.items():
    config.substitutions.append((rf"(?<![\w/.-]){tool}(?![\w/.-])", command))
config.substitutions.append(("%python", python))
