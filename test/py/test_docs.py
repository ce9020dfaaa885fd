"""Every code block of README.md and docs/*.md that can run here runs as written, so that no
example drifts from the code.

* A ```python block runs as a script of its own, as `python -P example.py` runs it: as
  `__main__`, so that the ranks `run_on_local_ranks` spawns import its functions as they
  would from the user's file, with its imports finding what `pip install` installed, not
  the checkout's folders. It runs in a child of the launcher's forkserver, which has
  imported torch, xDSL and hostir once (`run_in_a_preloaded_interpreter`), where a fresh
  interpreter would spend seconds of CPU importing them for each block. After
  `<!-- ci: continues -->` it runs after the document's earlier python blocks that run, in
  one script: a tour read in order, and run in order.
* A ```sh block runs with `bash -e`: every command must succeed. The installed `hir-opt`,
  `hir-run` and `python` come first on the PATH.
* No block may print a `HostirFallbackWarning`: an example of `backend="hostir"` must run
  its graphs as host programs, not as torch eager ops.
* Each runs in a fresh directory that links the repository's top-level entries (`examples/`,
  `benchmarks/`, `tools/` ...), so that paths are those of the checkout and any file a
  command writes lands in the test's own directory, never in the checkout.
* A block right after `<!-- no-ci: reason -->` does not run here: one that needs a GPU,
  several machines, or installs packages. It is still collected, and reported as skipped
  with its place and its reason (`pytest -rs`).
* Blocks of other languages (mlir, text, none) show IR or output, and are not run.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import runpy
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostir.runtime.launch import RankFailed, RankOutput, run_on_local_ranks

REPOSITORY = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
"""The languages of blocks that run, by the name a fence gives them."""

NO_CI = re.compile(r"^\s*<!--\s*no-ci:\s*(?P<reason>\S.*?)\s*-->\s*$")
CONTINUES = re.compile(r"^\s*<!--\s*ci:\s*continues\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []
"""`python -P`: not the script's folder first on its module search path (from Python 3.11)."""
TIMEOUT_S = 900
"""Seconds a block may run: a hang fails, a slow machine does not."""


@dataclass(frozen=True)
class Block:
    """A fenced code block of a document that runs: where it is, its language and its code."""

    document: Path
    line: int
    """The line of the opening fence, from 1."""
    language: str
    code: str
    skip_reason: str | None
    """The reason of its `no-ci` marker, or None when it runs."""
    continues: bool = False
    """Whether it runs after the earlier python blocks of its document (`ci: continues`)."""

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(REPOSITORY)}:{self.line}"


def blocks_of(document: Path) -> list[Block]:
    """The blocks of `document` in a language that runs, in order."""
    lines = document.read_text().splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        end = index + 1
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        language = LANGUAGES.get(opening["info"].lower())
        if language is not None:
            before = next((line for line in reversed(lines[:index]) if line.strip()), "")
            no_ci = NO_CI.match(before)
            code = "\n".join(line[indent:] if line[:indent].isspace() else line for line in lines[index + 1 : end])
            blocks.append(
                Block(document, index + 1, language, code + "\n", no_ci and no_ci["reason"], bool(CONTINUES.match(before)))
            )
        index = end + 1
    return blocks


BLOCKS = [block for document in DOCUMENTS for block in blocks_of(document)]


def _param(block: Block) -> pytest.param:
    marks = [pytest.mark.skip(reason=f"{block.where}: no-ci: {block.skip_reason}")] if block.skip_reason else []
    suffix = "-no-ci" if block.skip_reason else ""
    return pytest.param(block, id=f"{block.where}-{block.language}{suffix}", marks=marks)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A fresh directory that sees the checkout's top-level entries under their own names."""
    for entry in REPOSITORY.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def _environment() -> dict[str, str]:
    """This Python's scripts first on the PATH, as in the virtual environment the README makes."""
    scripts = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}


def script_of(block: Block, blocks: list[Block]) -> str:
    """The block, after the earlier python blocks of its document that run if it continues them."""
    earlier = [
        b.code
        for b in blocks
        if block.continues and b.document == block.document and b.line < block.line
        and b.language == "python" and not b.skip_reason
    ]  # fmt: skip
    return "\n".join([*earlier, block.code])


@functools.cache
def _fresh_sys_path() -> list[str]:
    """The module search path of `python -P script.py`: the interpreter's own, without the
    script's folder or what the test run adds (the checkout's root, test/py). Before Python
    3.11 (no `-P`), the working directory first, the script's folder where the examples run."""
    command = [sys.executable, *SAFE_PATH, "-c", "import json, sys; print(json.dumps(sys.path))"]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def _run_script(path: str, cwd: str, environment: dict[str, str], sys_path: list[str]) -> int:
    """On the launcher's rank: becomes `python -P path` started in `cwd` with `environment`,
    runs the script, and returns the status that interpreter would exit with."""
    multiprocessing.current_process().daemon = False  # as an interpreter's main process, it may start processes
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    sys.path[:] = sys_path
    sys.argv = [path]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except BaseException as error:
        # The traceback from the script's own frame on, as the interpreter prints it: without
        # this function's and runpy's frames, or none at all where the script did not compile.
        frames = error.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename != path:
            frames = frames.tb_next
        traceback.print_exception(type(error), error, frames)
        return 1
    return 0


def run_in_a_preloaded_interpreter(
    path: Path, cwd: Path, environment: dict[str, str], logs: Path
) -> subprocess.CompletedProcess[str]:
    """Runs the script `path` as `python -P path` would in `cwd` with `environment`, and says
    how it ended as `subprocess.run(..., capture_output=True, text=True)` would. It runs on a
    rank of one forked from the launcher's forkserver, which has imported torch and hostir
    (`run_on_local_ranks`), its stdout and stderr into files under `logs`; past TIMEOUT_S
    it is killed, and a script killed or dead by a signal exits -1."""
    failure = ""
    try:
        [returncode] = run_on_local_ranks(
            _run_script, 1, str(path), str(cwd), environment, _fresh_sys_path(),
            join_group=False, timeout_s=TIMEOUT_S, output=RankOutput(log_dir=logs),
        )  # fmt: skip
    except RankFailed as error:
        returncode, failure = -1, str(error)
    stdout, stderr = ((logs / "rank0" / f"{name}.log").read_text() for name in ("stdout", "stderr"))
    return subprocess.CompletedProcess([sys.executable, *SAFE_PATH, str(path)], returncode, stdout, stderr + failure)


@pytest.mark.parametrize("block", [_param(block) for block in BLOCKS])
def test_code_block_runs(block: Block, workdir: Path, tmp_path_factory: pytest.TempPathFactory):
    if block.language == "python":
        path = workdir / "example.py"
        path.write_text(script_of(block, BLOCKS))
        result = run_in_a_preloaded_interpreter(path, workdir, _environment(), tmp_path_factory.mktemp("logs"))
    else:
        result = subprocess.run(
            ["bash", "-e", "-c", block.code], cwd=workdir, env=_environment(), capture_output=True, text=True,
            timeout=TIMEOUT_S,
        )  # fmt: skip
    assert result.returncode == 0, (
        f"the {block.language} block at {block.where} failed (exit {result.returncode}):\n"
        f"{block.code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    # An example of the torch.compile backend whose graph ran as torch eager ops would pass
    # on eager's results.
    assert "HostirFallbackWarning" not in result.stderr, f"{block.where}:\n{result.stderr}"


FRESH_OR_NOT = {
    "exits": """\
import os, sys
print(__name__, sys.argv == [__file__], os.getcwd(), os.environ["HOSTIR_TEST_PROBE"], sys.path)
print("on stderr", file=sys.stderr)
sys.exit(3)
""",
    "raises": """\
def fails():
    raise ValueError("no")


fails()
""",
    "does not compile": "print(1\n",
    "exits with a message": "import sys\nsys.exit('a message')\n",
}


@pytest.mark.parametrize("script", FRESH_OR_NOT, ids=list(FRESH_OR_NOT))
def test_a_script_run_in_a_preloaded_interpreter_behaves_as_in_a_fresh_one(script: str, tmp_path: Path):
    """Its name, arguments, working directory, environment and module search path, what it
    prints on stdout and stderr, its traceback and its exit status are those of `python -P`."""
    (tmp_path / "cwd").mkdir()
    path = tmp_path / "cwd" / "script.py"
    path.write_text(FRESH_OR_NOT[script])
    environment = {**_environment(), "HOSTIR_TEST_PROBE": "probed"}
    preloaded = run_in_a_preloaded_interpreter(path, tmp_path / "cwd", environment, tmp_path / "logs")
    fresh = subprocess.run(
        [sys.executable, *SAFE_PATH, str(path)], cwd=tmp_path / "cwd", env=environment, capture_output=True, text=True
    )
    assert (preloaded.returncode, preloaded.stdout, preloaded.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == (3 if script == "exits" else 1)


DOCUMENT = """\
Text.

```python
print("runs alone")
```

<!-- ci: continues -->
```python
print("runs after the block above")
```

<!-- no-ci: needs a GPU -->

```sh
nvidia-smi
```

1. A list item's block, indented, in a language that does not run, then one that does:

   ```mlir
   func.func @f() { func.return }
   ```
   ```bash
   hir-opt --version
   ```
"""


def test_blocks_their_markers_and_the_scripts_they_make(tmp_path: Path):
    document = tmp_path / "doc.md"
    document.write_text(DOCUMENT)
    blocks = blocks_of(document)
    assert [(b.line, b.language, b.skip_reason, b.continues) for b in blocks] == [
        (3, "python", None, False),
        (8, "python", None, True),
        (14, "sh", "needs a GPU", False),
        (23, "sh", None, False),
    ]
    assert blocks[3].code == "hir-opt --version\n"
    assert script_of(blocks[0], blocks) == 'print("runs alone")\n'
    assert script_of(blocks[1], blocks) == 'print("runs alone")\n\nprint("runs after the block above")\n'


def test_every_document_is_read():
    """Every document's blocks are collected, those of README.md among them."""
    assert {b.document for b in BLOCKS} >= {REPOSITORY / "README.md", REPOSITORY / "docs" / "replay-and-trace.md"}
    assert any(b.language == "python" and not b.skip_reason for b in BLOCKS if b.document.name == "README.md")
