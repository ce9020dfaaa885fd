"""The lit suite, run from pytest, and the behaviour of `hir-opt` that lit cannot express easily.

Most tests call `tools.hir_opt.main` in this process (a subprocess costs a second of
imports); those about the installed console script, the checkout's script and stdin
run it as a process.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, f32
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import VerifyException

from hostir_dialect import fusion
from hostir_dialect.text import HostirError
from hostir.passes import HOSTIR_PASSES, available_passes
from hostir.tools.hir_opt import HOSTIR_HEADING, XDSL_HEADING, XDSL_PASS_SUMMARIES, main

REPOSITORY = Path(__file__).resolve().parents[2]

FUSION = """\
func.func @f(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return %y : !fusion.tensor<[4], f32>
}
"""

INVALID = """\
func.func @g(%x: !fusion.tensor<[4], f32>) {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[5], f32>
  func.return
}
"""


LIT_SHARDS = 4
"""The lit suite runs as this many pytest tests, each one shard of its files (lit's
`--num-shards`), so that pytest-xdist spreads them over its workers. Each shard's lit
starts a process that preloads the tools its RUN lines call (test/lit/preload.py)."""


@pytest.mark.parametrize("shard", range(1, LIT_SHARDS + 1), ids=lambda shard: f"shard{shard}of{LIT_SHARDS}")
def test_lit_suite(shard: int):
    """Every lit test under test/lit passes, in the shard `shard` of LIT_SHARDS."""
    lit = shutil.which("lit")
    assert lit is not None, "lit is not installed (pip install -e '.[test]')"
    # Shards run at once: in lexical order each test falls in one shard whatever times earlier
    # runs recorded, and no shard rewrites the times file that the others read.
    command = [
        lit, "-q", "--order=lexical", "--skip-test-time-recording",
        f"--num-shards={LIT_SHARDS}", f"--run-shard={shard}", str(REPOSITORY / "test" / "lit"),
    ]  # fmt: skip
    if "PYTEST_XDIST_WORKER" in os.environ:
        command.insert(1, "-j1")  # the other workers run the other shards; without xdist lit uses every core
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


PRELOADED_RUNS = {
    "lowering": (["hir-opt", "{fusion}", "-p", "hir-lowering"], None),
    "parse error on stdin": (["hir-opt", "--split-input-file"], FUSION + "// -----\n" + INVALID),
    "help": (["hir-opt", "--help"], None),
    "filecheck mismatch": (["filecheck", "{checks}"], "%y = fusion.neg %x\n"),
}


def _hir_opt_run_lines() -> list[tuple[str, list[str], bool]]:
    """Each RUN line of the lit suite that starts with `hir-opt` (or `not hir-opt`) on a file:
    (the line, hir-opt's arguments with lit's substitutions made, whether it must fail). The
    output's redirection and whatever reads it are lit's, not hir-opt's."""
    lines = []
    for path in sorted((REPOSITORY / "test" / "lit").rglob("*.mlir")):
        if "Output" in path.parts:
            continue
        for line in path.read_text().splitlines():
            match = re.match(r"// RUN: (not )?hir-opt ([^|]*?)\s*(\d?>.*)?(\|.*)?$", line)
            if match is None:
                continue
            words = shlex.split(match[2].replace("%s", str(path)).replace("%S", str(path.parent)))
            lines.append((f"{path.relative_to(REPOSITORY)}: {line}", words, bool(match[1])))
    return lines


def test_the_lit_suites_hir_opt_runs_reach_no_deprecated_api_and_end_as_lit_expects(capsys):
    """Every `hir-opt` of a lit RUN line, run in this process, where a deprecated xDSL or torch
    API that hostir's code reaches is an error (pyproject.toml's filterwarnings): lit runs
    hir-opt as a process, in which such a warning is silent. Each ends with status 0, or 1
    where the line expects a failure, and none raises."""
    lines = _hir_opt_run_lines()
    assert len(lines) > 150, "the RUN lines were not found"
    wrong = []
    for line, args, fails in lines:
        try:
            status, _, err = _run(args, capsys)
        except Exception as error:
            wrong.append(f"{line}\n  raised {type(error).__name__}: {error}")
            continue
        if status != (1 if fails else 0) or (fails and "Traceback" in err):
            wrong.append(f"{line}\n  exit status {status}: {err[-500:]}")
    assert not wrong, "\n".join(wrong)


def test_a_preloaded_tool_behaves_as_a_fresh_process(tmp_path: Path, fusion_file: Path):
    """What lit's RUN lines run through test/lit/preload.py, a child forked from a process
    that has imported the tool, exits, prints and reports errors as the tool started fresh."""
    spec = importlib.util.spec_from_file_location("preload", REPOSITORY / "test" / "lit" / "preload.py")
    preload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preload)
    checks = tmp_path / "checks.txt"
    checks.write_text("// CHECK: fusion.neg\n// CHECK-NEXT: not there\n")
    directory = tmp_path / "server"
    directory.mkdir()
    server = preload.start_server(str(directory))
    try:
        for name, (words, stdin) in PRELOADED_RUNS.items():
            tool, *args = [word.format(fusion=fusion_file, checks=checks) for word in words]
            fresh, preloaded = (
                subprocess.run(command + args, input=stdin, capture_output=True, text=True, cwd=tmp_path)
                for command in ([sys.executable, *preload.COMMANDS[tool]], preload.client_command(str(directory), tool))
            )
            assert (preloaded.returncode, preloaded.stdout, preloaded.stderr) == (
                fresh.returncode, fresh.stdout, fresh.stderr
            ), name
            assert fresh.returncode == (0 if name in ("lowering", "help") else 1), name
        assert server.poll() is None, "the server ended early, and its clients ran their tools themselves"
    finally:
        server.terminate()
        server.wait()
    assert not directory.exists()  # the server removes its socket and directory


def _processes_marked(marker: str) -> list[int]:
    """The processes whose environment holds `marker` (a NAME=VALUE), by reading /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        if marker.encode() in environment:
            found.append(int(entry.name))
    return found


SERVER_ENDS_S = 120
"""How long the preload server may take to see that lit has gone: its imports, on a loaded machine."""


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the server's process in /proc")
def test_the_preload_server_ends_with_a_lit_run_that_ends_before_the_server_has_started(tmp_path: Path):
    """`lit --show-tests` starts the server and ends long before the server has imported
    the tools: the server, which finds lit gone after its imports, ends then, and removes
    its socket and directory."""
    lit = shutil.which("lit")
    assert lit is not None, "lit is not installed (pip install -e '.[test]')"
    marker = f"HOSTIR_TEST_PRELOAD={os.getpid()}-{tmp_path.name}"
    environment = {**os.environ, "TMPDIR": str(tmp_path), marker.split("=")[0]: marker.split("=")[1]}
    # Into files: the server inherits lit's standard error, which a pipe would keep open.
    with open(tmp_path / "out", "w+") as out, open(tmp_path / "err", "w+") as err:
        listed = subprocess.run([lit, "--show-tests", str(REPOSITORY / "test" / "lit")], env=environment, stdout=out, stderr=err)
    output = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert listed.returncode == 0 and "hostir :: golden/ag_linear.mlir" in output, output
    deadline = time.monotonic() + SERVER_ENDS_S
    while (left := _processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # what a failing run left behind, marked as this test's
        os.kill(pid, signal.SIGKILL)
    assert not left, f"the preload server (pid {left}) outlived lit by {SERVER_ENDS_S} s"
    assert not list(tmp_path.glob("hostir-lit-*")), "the server left its directory"
    assert "Traceback" not in output, output


# --------------------------------------------------------------------------- #
# Passes registered only for these tests                                      #
# --------------------------------------------------------------------------- #


def _first_fusion_op(module: ModuleOp) -> fusion.FusionOp:
    return next(op for op in module.walk() if isinstance(op, fusion.FusionOp))


@dataclass(frozen=True)
class RecordOptions(ModulePass):
    """Writes its options into the module, to show what the pipeline text gave it."""

    name = "record-options"

    count: int = 1
    label: str = "none"
    flag: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        op.attributes["seen"] = StringAttr(f"{self.count}|{self.label}|{self.flag}")


@dataclass(frozen=True)
class ReportHostirError(ModulePass):
    """Fails on the first fusion op, as a hostir pass reports an unsupported case."""

    name = "report-error"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        raise HostirError.at(_first_fusion_op(op), "this op is not supported here")


@dataclass(frozen=True)
class RecurseWithoutEnd(ModulePass):
    """Recurses until Python stops it, as a pass walking IR nested too deeply would."""

    name = "recurse"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        self.apply(ctx, op)


@dataclass(frozen=True)
class RaiseVerifyException(ModulePass):
    """Fails with xDSL's own exception, as an xDSL pass may."""

    name = "raise-verify-exception"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        raise VerifyException("cannot transform this module")


@dataclass(frozen=True)
class BreakTypes(ModulePass):
    """Leaves invalid IR behind: a copy of the first op, at its place, with a wrong result type."""

    name = "break-types"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        neg = _first_fusion_op(op)
        wrong = fusion.NegOp(neg.operands[0], fusion.TensorType([8], f32))
        wrong.location = neg.location
        Rewriter.insert_op(wrong, InsertPoint.before(neg))


def _missing_module() -> type[ModulePass]:
    """The factory of a pass whose module is not written yet."""
    return importlib.import_module("hostir.passes.no_such_module").NoSuchPass


@pytest.fixture
def extra_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registers the test passes, and one whose module does not exist, for one test."""
    for pass_class in (RecordOptions, ReportHostirError, RaiseVerifyException, BreakTypes, RecurseWithoutEnd):
        monkeypatch.setitem(HOSTIR_PASSES, pass_class.name, lambda p=pass_class: p)
    monkeypatch.setitem(HOSTIR_PASSES, "not-written-yet", _missing_module)


@pytest.fixture
def fusion_file(tmp_path: Path) -> Path:
    path = tmp_path / "fusion.mlir"
    path.write_text(FUSION)
    return path


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out, err


# --------------------------------------------------------------------------- #
# Input, output, passes                                                        #
# --------------------------------------------------------------------------- #


def test_output_file(fusion_file: Path, tmp_path: Path, capsys):
    """`-o` writes what stdout would get, and stdout stays empty."""
    status, printed, _ = _run([fusion_file], capsys)
    assert status == 0
    output = tmp_path / "out.mlir"
    status, out, err = _run([fusion_file, "-o", output], capsys)
    assert (status, out, err) == (0, "", "")
    assert output.read_text() == printed
    assert "%y = fusion.neg %x" in printed


def test_pass_options_reach_the_pass(fusion_file: Path, extra_passes, capsys):
    """xDSL's `name{key=value ...}` syntax: ints, quoted strings with spaces, booleans."""
    status, out, err = _run(
        [fusion_file, "-p", 'record-options{count=3 label="two words" flag=true},cse'], capsys
    )
    assert (status, err) == (0, "")
    assert 'seen = "3|two words|True"' in out
    status, out, _ = _run([fusion_file, "-p", "record-options"], capsys)
    assert 'seen = "1|none|False"' in out


def test_list_passes(extra_passes, capsys):
    """Every pass of xDSL's universe and hostir's, hostir's first, each part sorted, each pass
    with its whole summary and its options (default and choices); exit 0.
    `--list-passes=hostir` lists hostir's alone."""
    with pytest.raises(SystemExit) as exit:
        main(["--list-passes"])
    assert exit.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == HOSTIR_HEADING
    passes = [line for line in lines if not line.startswith(" ") and line not in (HOSTIR_HEADING, XDSL_HEADING)]
    names = [line.split()[0] for line in passes]
    hostir = sorted(HOSTIR_PASSES)
    assert names == hostir + sorted(set(available_passes()) - set(hostir))
    assert lines.index(XDSL_HEADING) == lines.index(next(p for p in passes if p.split()[0] == names[len(hostir)])) - 1
    with pytest.raises(SystemExit) as exit:
        main(["--list-passes=hostir"])
    assert exit.value.code == 0
    only = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in only if not line.startswith(" ")] == hostir
    assert only == lines[1 : lines.index(XDSL_HEADING)]
    with pytest.raises(SystemExit) as exit:
        main(["--list-passes=xdsl"])
    assert exit.value.code == 2
    assert "invalid choice: 'xdsl' (choose from 'all', 'hostir')" in capsys.readouterr().err
    assert {"licm", "convert-scf-to-cf", "cse", *HOSTIR_PASSES} <= set(names)
    summaries = dict(line.split(maxsplit=1) for line in passes)
    assert summaries["record-options"] == RecordOptions.__doc__
    assert summaries["cse"] == XDSL_PASS_SUMMARIES["cse"]
    assert summaries["not-written-yet"].startswith("(unavailable: pass 'not-written-yet'")
    # A summary that goes on over several lines of the docstring is printed whole.
    assert summaries["stream-parallel"].endswith("one loop iteration per slice of the stream axis.")
    options = lines[lines.index(next(p for p in passes if p.startswith("record-options "))) + 1 :][:3]
    assert options == [
        "    count=1  (an integer)",
        "    label=none  (a string)",
        "    flag=false  (true or false)",
    ]
    hir_lowering = lines.index(next(p for p in passes if p.startswith("hir-lowering ")))
    assert "    backend=nccl  (one of nccl, cuda)" in lines[hir_lowering + 1 : hir_lowering + 12]
    assert "    p2p-order=ring  (one of ring, device)" in lines[hir_lowering + 1 : hir_lowering + 12]


def test_version_names_hostir_xdsl_and_torch(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert re.fullmatch(r"hir-opt \d+\.\d+\.\d+ \(xDSL 0\.74\.0, torch \d+\.\d+\.\d+\S*\)\n", capsys.readouterr().out)


def test_print_ir_before_and_after_named_passes(capsys):
    """`--print-ir-before` and `--print-ir-after` print the IR around the passes they name,
    also passes of a pipeline such as hir-lowering (a comma list, or the option repeated); a
    name that is no pass, or that the pipeline does not run, is an error before any input."""
    example = str(REPOSITORY / "examples" / "ag_linear.mlir")
    status, out, err = _run(
        [example, "-p", "hir-lowering", "--print-ir-before=stream-parallel", "--print-ir-after", "fusion-to-hir,per-stream-buffers"],
        capsys,
    )
    assert status == 0
    headers = [line for line in err.splitlines() if line.startswith("// -----// IR Dump")]
    assert headers == [
        "// -----// IR Dump After fusion-to-hir //----- //",
        "// -----// IR Dump Before stream-parallel //----- //",
        "// -----// IR Dump After per-stream-buffers //----- //",
    ]
    after_fusion_to_hir, before_stream_parallel = err.split("// -----// IR Dump")[1:3]
    assert after_fusion_to_hir.split("\n", 1)[1] == before_stream_parallel.split("\n", 1)[1]  # nothing ran between
    assert "fusion.linear" not in after_fusion_to_hir and "scf.for" not in after_fusion_to_hir
    assert "scf.for" in err.split("// -----// IR Dump After per-stream-buffers //----- //")[1]
    status, out, err = _run([example, "-p", "hir-lowering", "--print-ir-after=cse2"], capsys)
    assert (status, out) == (1, "")
    assert err.startswith("error: --print-ir-after: unknown pass 'cse2' (did you mean 'cse'?); hostir's passes are ")
    status, out, err = _run([example, "-p", "fusion-to-hir", "--print-ir-before=cse"], capsys)
    assert (status, out, err) == (1, "", "error: --print-ir-before names 'cse', which the pipeline does not run; it runs fusion-to-hir\n")


@pytest.mark.parametrize(
    ("text", "line", "caret", "message"),
    [
        # The module's region, left open at the end of the file: the place is after its last character.
        (FUSION.rstrip().removesuffix("}") + "\n\n", 3, "  func.return %y : !fusion.tensor<[4], f32>", "line 1"),
        ("// a module whose brace is missing\nbuiltin.module {\n" + FUSION, 6, "}", "line 2"),
    ],
)
def test_a_brace_missing_at_the_end_of_the_input_is_expected_there(tmp_path, capsys, text, line, caret, message):
    path = tmp_path / "open.mlir"
    path.write_text(text)
    status, out, err = _run([path], capsys)
    source = caret
    assert (status, out) == (1, "")
    assert err == (
        f"{path}:{line}:{len(source) + 1}: error: expected '}}' to close the region opened at {message}, before the end of the input\n"
        f"{source}\n{' ' * len(source)}^\n"
    )


def test_a_region_that_goes_on_with_something_else_says_what_was_expected(tmp_path, capsys):
    path = tmp_path / "stray.mlir"
    path.write_text("func.func @f() {\n  func.return\n  ]\n}\n")
    status, _, err = _run([path], capsys)
    assert status == 1
    assert err == f"{path}:3:3: error: expected an operation, a block label or '}}', got ']'\n  ]\n  ^\n"


def test_a_missing_pass_module_breaks_only_its_pass(fusion_file: Path, extra_passes, capsys):
    status, _, err = _run([fusion_file, "-p", "cse,not-written-yet"], capsys)
    assert status == 1
    assert err.startswith(
        "pass-pipeline:1:5: error: pass 'not-written-yet' is not available: "
        "No module named 'hostir.passes.no_such_module'\ncse,not-written-yet\n    ^^^^^^^^^^^^^^^\n"
    )
    status, out, err = _run([fusion_file, "-p", "cse,record-options"], capsys)
    assert (status, err) == (0, "")


def test_split_input_file_outputs_and_errors(tmp_path: Path, capsys):
    """Every chunk is processed: valid ones print, each invalid one reports its error."""
    path = tmp_path / "chunks.mlir"
    path.write_text("\n// -----\n".join([FUSION, INVALID, FUSION, INVALID]))
    status, out, err = _run([path, "--split-input-file"], capsys)
    assert status == 1
    chunks = out.split("// -----\n")
    assert len(chunks) == 4
    assert "fusion.neg" in chunks[0] and "fusion.neg" in chunks[2]
    assert chunks[1] == chunks[3] == ""
    bad_lines = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if "[5]" in line]
    assert [line.split(":")[1] for line in err.splitlines() if ": error: " in line] == [
        str(n) for n in bad_lines
    ]


# --------------------------------------------------------------------------- #
# Every error class: one message, exit status 1, no traceback                  #
# --------------------------------------------------------------------------- #

ERROR_CASES = {
    "parse error": (
        FUSION.replace("[4], f32>)", "[4], f32)"),
        [],
        "{file}:1:41: error: '>' expected",
    ),
    "verifier error": (
        INVALID,
        [],
        "{file}:2:3: error: result shape [5] does not match the shape [4] that the operands give",
    ),
    "unknown pass": (
        FUSION,
        ["-p", "cse,fold-everything"],
        "pass-pipeline:1:5: error: unknown pass 'fold-everything'; hostir's passes are {known}; "
        "`hir-opt --list-passes` lists them with xDSL's {others} others\n"
        "cse,fold-everything\n"
        "    ^^^^^^^^^^^^^^^\n",
    ),
    "bad pass option": (
        FUSION,
        ["-p", "record-options{count=many}"],
        "pass-pipeline:1:16: error: option 'count' of pass 'record-options' takes an integer, "
        "got 'many'\nrecord-options{{count=many}}\n               ^^^^^^^^^^\n",
    ),
    "pipeline syntax": (
        FUSION,
        ["-p", "cse,,dce"],
        "pass-pipeline:1:5: error: cannot parse the pass pipeline: Expected pass name here\n"
        "cse,,dce\n"
        "    ^\n",
    ),
    "HostirError from a pass": (
        FUSION,
        ["-p", "report-error"],
        "{file}:2:3: error: this op is not supported here",
    ),
    "xDSL exception from a pass": (
        FUSION,
        ["-p", "cse,raise-verify-exception"],
        "error: pass 'raise-verify-exception' failed: cannot transform this module",
    ),
    "pass recurses without end": (
        FUSION,
        ["-p", "recurse"],
        "error: nesting too deep: the IR nests too deeply to process\n",
    ),
    "pass leaves invalid IR": (
        FUSION,
        ["-p", "break-types,cse"],
        "{file}:2:3: error: pass 'break-types' produced invalid IR: result shape [8] does not match",
    ),
    "missing input file": (
        None,
        [],
        "error: cannot open input file '{file}': No such file or directory",
    ),
    "not UTF-8": (
        b"// ok\n  \xff\xfe",
        [],
        "{file}:2:3: error: input is not UTF-8 text (invalid start byte: byte 0xff)\n",
    ),
    "unwritable output": (
        FUSION,
        ["-o", "/nonexistent/out.mlir"],
        "error: cannot open output file",
    ),
    "unsupported xdsl-opt option": (
        FUSION,
        ["--shrink"],
        "error: hir-opt does not support xdsl-opt's option --shrink\n",
    ),
}


@pytest.mark.parametrize("case", ERROR_CASES, ids=list(ERROR_CASES))
def test_error_is_one_message_and_exit_1(case: str, tmp_path: Path, extra_passes, capsys):
    text, args, expected = ERROR_CASES[case]
    path = tmp_path / "input.mlir"
    if isinstance(text, str):
        path.write_text(text)
    elif isinstance(text, bytes):
        path.write_bytes(text)
    status, out, err = _run([path, *args], capsys)
    assert status == 1
    assert out == ""
    known = ", ".join(sorted(HOSTIR_PASSES))
    others = len(available_passes()) - len(HOSTIR_PASSES)
    assert err.startswith(expected.format(file=path, known=known, others=others)), err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- #
# As a process: the console script, the checkout's script, stdin               #
# --------------------------------------------------------------------------- #


def test_console_script_reads_stdin():
    hir_opt = shutil.which("hir-opt")
    assert hir_opt is not None, "the hir-opt console script is not installed (pip install -e .)"
    result = subprocess.run([hir_opt, "-p", "cse"], input=FUSION, capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    assert "%y = fusion.neg %x" in result.stdout


def test_console_script_locates_stdin_errors():
    result = subprocess.run(
        [shutil.which("hir-opt") or "hir-opt"],
        input=FUSION.replace("[4], f32>)", "[4], f32)"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("<stdin>:1:41: error: '>' expected\n")
    assert "Traceback" not in result.stderr


def test_checkout_script_runs_from_anywhere(tmp_path: Path, fusion_file: Path):
    result = subprocess.run(
        [
            sys.executable,
            str(REPOSITORY / "tools" / "hir-opt.py"),
            str(fusion_file),
            "--print-op-generic",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert '"fusion.neg"(%x)' in result.stdout
