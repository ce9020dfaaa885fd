"""hir-run, the launcher: local ranks and torchrun's, inputs random or from .pt files, --check,
saved outputs, and the messages and exit status of every kind of mistake.

The mistakes found before any rank starts call `main` in this process, and so do runs on
local ranks whose report (the launcher's stdout and stderr, files the ranks write) is what
they assert (`run_local_ranks`): the ranks start from this process's forkserver, which has
imported torch and hostir already, where a fresh `hir-run` would import them twice more,
seconds of CPU. What the ranks print on the console reaches the console of the process
that started the forkserver, not this test's: the runs that assert it, or assert that
the ranks print nothing, call the script a user calls (`tools/hir-run.py`) in a
subprocess, and so do those that fault or run under torchrun.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples.reference_fusions import ag_linear, allgather_p2p, matmul, matmul_ar
from hostir_dialect.text import HostirError, print_module
from hostir.tools import hir_run

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "hir-run.py"

TORCHRUN_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def clean_environment(**variables: str) -> dict[str, str]:
    """This process's environment without torchrun's variables or GPUs (the CLI tests run on
    gloo; run_gpu_suite.sh runs hir-run on GPUs), plus `variables`."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    return {**env, "HOSTIR_TIMEOUT_S": "30", "CUDA_VISIBLE_DEVICES": "", **variables}


def run_script(*arguments: str, **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        env=clean_environment(**variables),
        timeout=120,
    )


def assert_no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Fusions written as text: ag_linear and matmul_ar on 2 devices, allgather_p2p on 4, matmul on 1."""
    directory = tmp_path_factory.mktemp("fusions")
    modules = {
        "ag_linear": ag_linear(2),
        "matmul_ar": matmul_ar(2, "f32"),
        "allgather_p2p": allgather_p2p(4),
        "matmul": matmul(),
    }
    paths = {}
    for name, module in modules.items():
        paths[name] = directory / f"{name}.mlir"
        paths[name].write_text(print_module(module))
    return paths


def run_main(capsys, *arguments: str) -> tuple[int, str, str]:
    status = hir_run.main(list(arguments))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def run_local_ranks(capsys, monkeypatch, *arguments: str) -> tuple[int, str, str]:
    """`main` in this process, in the environment `run_script` gives its subprocess: no
    torchrun, gloo on CPU ranks. The ranks, forked from a server that has not initialised
    CUDA, take CUDA_VISIBLE_DEVICES from this process; this process, which may have
    initialised CUDA already (on a GPU machine), is told that no GPU is there."""
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", "30")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return run_main(capsys, *arguments)


# --------------------------------------------------------------------------- #
# Runs                                                                         #
# --------------------------------------------------------------------------- #


def test_check_on_two_local_ranks_with_pt_inputs(files, tmp_path):
    x, w, b = torch.randn(3, 2, 5, 6), torch.randn(7, 6), torch.randn(7)
    paths = []
    for name, value in (("x", x), ("w", w), ("b", b)):
        paths.append(str(tmp_path / f"{name}.pt"))
        torch.save(value.bfloat16(), paths[-1])
    result = run_script(
        str(files["ag_linear"]), "--nproc", "2", "--check", "--repeat", "2",
        "--inputs", *paths, "--save-outputs", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "a quick run stays quiet without --progress"
    lines = result.stdout.splitlines()
    assert lines[0] == "@ag_linear: 2 rank(s), gloo on cpu, 4 stream(s), eager"
    assert lines[1] == "eager because CUDA graphs need CUDA devices, and this rank runs gloo on cpu"
    assert lines[2].startswith("output #0 bf16 [3, 2, 5, 7]: max relative error ")
    assert lines[2].endswith("(tolerance 0.02): ok")
    assert lines[3] == f"saved 1 output(s) in {tmp_path}/output<i>.pt"
    for rank in (0, 1):
        assert any(line.startswith(f"rank {rank}: ") and "of 2 run(s)" in line for line in lines)
    output = torch.load(tmp_path / "output0.pt")
    x, w, b = (torch.load(p).double() for p in paths)
    expected = torch.einsum("sdmk,nk->sdmn", x, w) + b
    assert output.dtype == torch.bfloat16
    torch.testing.assert_close(output.double(), expected, rtol=0, atol=2e-2 * expected.abs().max())


def test_default_nproc_and_sizes_of_random_inputs(files, tmp_path, capsys, monkeypatch):
    status, out, err = run_local_ranks(
        capsys, monkeypatch, str(files["allgather_p2p"]), "--check", "--seed", "7", "--dim", "0:1=5",
        "--save-outputs", str(tmp_path),
    )  # fmt: skip
    assert status == 0, err
    assert out.startswith("@allgather_p2p: 4 rank(s), gloo on cpu, ")
    assert "output #0 f32 [4, 5]: max relative error" in out and "rank 3: " in out
    assert torch.load(tmp_path / "output0.pt").shape == (4, 5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_inputs_marked_symmetric_are_placed_in_symmetric_memory(files, tmp_path, capsys, monkeypatch):
    """hir-run gives an input marked `hir.symmetric` to the program in symmetric memory, which
    the copy engines read in place."""
    path = tmp_path / "allgather_p2p_symmetric.mlir"
    text = files["allgather_p2p"].read_text()
    path.write_text(text.replace("axes = [didx, _]>)", "axes = [didx, _]> {hir.symmetric})", 1))
    assert "{hir.symmetric}" in path.read_text()
    pipeline = "hir-lowering{p2p_backend=cuda}"
    status, out, err = run_local_ranks(capsys, monkeypatch, str(path), "--nproc", "4", "--check", "--repeat", "2", "-p", pipeline)
    assert status == 0, err
    assert re.search(r"^output #0 f32 \[4, \d+\]: max relative error 0 .*: ok$", out, re.MULTILINE)


TORCHRUN_TIMEOUT_S = 300
"""The ranks' `--timeout`, which bounds their join too (at least 120 s, whatever the timeout):
on a GPU machine whose every core ran a test's processes, a rank took over 120 s to start."""


def torchrun_pair(arguments_of_ranks: tuple[list[str], list[str]]) -> list[tuple[int, str, str]]:
    """hir-run as torchrun's ranks 0 and 1 of a world of 2, each with its arguments and
    `--timeout TORCHRUN_TIMEOUT_S`: (status, stdout, stderr)."""
    port = str(_free_port())
    processes = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *arguments_of_ranks[rank], "--timeout", str(TORCHRUN_TIMEOUT_S)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_environment(
                RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
            ),
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=TORCHRUN_TIMEOUT_S + 30) for p in processes]
    return [(p.returncode, *output) for p, output in zip(processes, outputs)]


def test_torchrun_environment_makes_each_process_one_rank(files, tmp_path):
    trace = tmp_path / "matmul_ar.json"
    arguments = [str(files["matmul_ar"]), "--check", "--trace", str(trace)]
    (status0, out0, err0), (status1, out1, err1) = torchrun_pair((arguments, arguments))
    assert [status0, status1] == [0, 0], err0 + err1
    assert out0.startswith("@matmul_ar: 2 rank(s), ")
    assert "output #0 f32 [8, 8, 8]: max relative error" in out0 and "ok" in out0
    assert "rank 1: " in out0
    assert out1 == ""
    assert out0.splitlines()[-1].startswith(f"trace in {trace} ")
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}, "rank 0 writes every rank's timeline"


def torchrun_variables(monkeypatch, **variables: str) -> None:
    """Sets torchrun's variables of rank 0 of a world of one in this process, with `variables`."""
    defaults = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    for name, value in {**defaults, "MASTER_PORT": str(_free_port()), **variables}.items():
        monkeypatch.setenv(name, value)


def test_options_that_contradict_torchrun_are_refused(files, capsys, monkeypatch):
    """Under torchrun, --nproc-per-node must be torchrun's; --nproc (the world, or one
    machine's ranks?) is refused. Both fail before joining any group."""
    torchrun_variables(monkeypatch, LOCAL_WORLD_SIZE="2", WORLD_SIZE="4", MASTER_PORT="1")
    status, _, err = run_main(capsys, str(files["matmul"]), "--nproc", "4")
    assert status == 1
    assert err.startswith("rank 0: error: under torchrun --nproc could mean the world or one machine's ranks")
    monkeypatch.setenv("LOCAL_RANK", "abc")
    status, _, err = run_main(capsys, str(files["matmul"]), "--nproc-per-node", "2")
    assert status == 1
    assert err.strip() == "rank 0: error: LOCAL_RANK: expected a whole number, as torchrun sets it, got 'abc'"
    status, _, err = run_main(capsys, str(files["matmul"]), "--tee")
    assert status == 1
    assert err.strip() == "rank 0: error: under torchrun, torchrun's own --log-dir and --tee say where each rank's output goes"
    torchrun_variables(monkeypatch)
    status, _, err = run_main(capsys, str(files["matmul"]), "--nproc_per_node", "3")
    assert status == 1
    assert err.strip() == "rank 0: error: --nproc-per-node 3 contradicts torchrun's 1 rank(s) on this machine"
    assert not torch.distributed.is_initialized(), "the ranks leave the group they joined"


def test_no_graph_runs_eagerly_without_a_reason(files, capsys):
    status, out, err = run_main(capsys, str(files["matmul"]), "--no-graph", "--check", "--repeat", "2")
    assert status == 0, err
    lines = out.splitlines()
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert lines[0] == f"@matmul: 1 rank(s), {device}, no process group, 4 stream(s), eager"
    assert lines[1].startswith("output #0 f32 [8, 8]: max relative error ")


def test_stdin_and_one_rank_in_process(files, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(files["matmul"].read_text()))
    status, out, err = run_main(
        capsys, "--check", "--dim", "0:0=3", "--dim", "1:1=17", "--default-extent", "6"
    )
    assert status == 0, err
    assert "@matmul: 1 rank(s)" in out and "output #0 f32 [3, 17]: max relative error" in out


def test_check_fails_beyond_the_tolerance(files, capsys, monkeypatch):
    reference = hir_run.reference_outputs
    monkeypatch.setattr(
        hir_run, "reference_outputs", lambda f, inputs: [r * 1.01 for r in reference(f, inputs)]
    )
    status, out, _ = run_main(capsys, str(files["matmul"]), "--check")
    assert status == 1
    assert "(tolerance 0.0001): FAILED" in out


def test_entry_selects_one_of_several_functions(files, tmp_path, capsys):
    path = tmp_path / "two.mlir"
    functions = [print_module(m).split("\n", 1)[1].rsplit("}", 1)[0] for m in (matmul(), ag_linear(1))]
    path.write_text("builtin.module {\n" + "".join(functions) + "}\n")
    status, _, err = run_main(capsys, str(path))
    assert status == 1
    assert "error: the module has 2 public functions (@matmul, @ag_linear); name the entry" in err
    status, out, err = run_main(capsys, str(path), "--entry", "ag_linear", "--check")
    assert status == 0, err
    assert out.startswith("@ag_linear: 1 rank(s)")


# --------------------------------------------------------------------------- #
# Mistakes                                                                     #
# --------------------------------------------------------------------------- #


def test_missing_file(capsys, tmp_path):
    status, out, err = run_main(capsys, str(tmp_path / "none.mlir"))
    assert status == 1 and out == ""
    assert err.strip() == f"error: cannot read '{tmp_path / 'none.mlir'}': No such file or directory"


def test_parse_error_is_located(capsys, tmp_path):
    path = tmp_path / "typo.mlir"
    path.write_text("func.func @f(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {\n"
                    "  %y = fusion.nag %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>\n"
                    "  func.return %y : !fusion.tensor<[4], f32>\n}\n")  # fmt: skip
    status, _, err = run_main(capsys, str(path))
    assert status == 1
    first, source, caret = err.rstrip("\n").split("\n")
    assert re.fullmatch(rf"{re.escape(str(path))}:2:\d+: error: .*fusion\.nag.*", first)
    assert source == "  %y = fusion.nag %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>"
    assert re.fullmatch(r" +\^+", caret)


def test_bad_pt_inputs(files, tmp_path, capsys):
    wrong_shape, wrong_dtype, not_a_tensor = (tmp_path / n for n in ("shape.pt", "dtype.pt", "junk.pt"))
    torch.save(torch.zeros(3, 3, 4, 4, dtype=torch.bfloat16), wrong_shape)
    torch.save(torch.zeros(3, 2, 4, 4), wrong_dtype)
    not_a_tensor.write_bytes(b"not a pickle")
    weight, bias = tmp_path / "w.pt", tmp_path / "b.pt"
    torch.save(torch.zeros(5, 4, dtype=torch.bfloat16), weight)
    torch.save(torch.zeros(5, dtype=torch.bfloat16), bias)
    fusion = str(files["ag_linear"])

    status, _, err = run_main(capsys, fusion, "--inputs", str(wrong_shape), str(weight), str(bias))
    assert status == 1
    assert f"input #0 ({wrong_shape}) (mesh = [0, 1], axes = [_, didx, _, _]): axis 1 is didx" in err
    assert "its extent must be 2; got shape [3, 3, 4, 4]" in err

    status, _, err = run_main(capsys, fusion, "--inputs", str(wrong_dtype), str(weight), str(bias))
    assert status == 1
    assert "expected dtype torch.bfloat16, got torch.float32" in err

    status, _, err = run_main(capsys, fusion, "--inputs", str(not_a_tensor), str(weight), str(bias))
    assert status == 1
    assert err.strip() == f"error: cannot load input #0 from '{not_a_tensor}': it is not a file that torch.save wrote"

    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    status, _, err = run_main(capsys, fusion, "--inputs", str(weight), str(empty), str(bias))
    assert status == 1 and err.strip() == f"error: cannot load input #1 from '{empty}': the file is empty"

    status, _, err = run_main(capsys, fusion, "--inputs", str(weight), str(bias))
    assert status == 1 and "the function takes 3 input(s), got 2" in err


def test_inputs_the_fusion_cannot_take(files, capsys):
    # matmul's K is axis 1 of argument 0 and axis 0 of argument 1: 3 against 8 does not multiply.
    for check in ([], ["--check"]):
        status, _, err = run_main(capsys, str(files["matmul"]), "--dim", "0:1=3", *check)
        assert status == 1
        assert err.startswith(
            f"{files['matmul']}:3:5: error: the inputs of @matmul do not fit together (input #0 is [8, 3], "
            "input #1 is [8, 8]): matmul contracts axis of extent 3 of [8, 3] with extent 8 of [8, 8]"
        ), err
        assert "\n    %2 = fusion.matmul %0, %1 : " in err, "the source line of the op"
    # Every rank checks the extents against each other before the program communicates.
    program = hir_run.Program.compile(files["matmul"].read_text())
    with pytest.raises(HostirError, match=r"do not fit together \(input #0 is \[2, 3\], input #1 is \[4, 5\]\)"):
        program.run([torch.zeros(2, 3), torch.zeros(4, 5)], hir_run.Communicator.single(torch.device("cpu")))
    status, _, err = run_main(capsys, str(files["matmul"]), "--dim", "2:0=3")
    assert status == 1
    assert "a size is given for argument 2, but the function has 2 argument(s)" in err


def test_too_few_ranks(files, capsys):
    status, _, err = run_main(capsys, str(files["allgather_p2p"]), "--nproc", "2")
    assert status == 1 and "uses devices up to 3; run it with --nproc-per-node 4 or more" in err


def test_inputs_too_large_to_allocate(files, capsys):
    status, _, err = run_main(capsys, str(files["matmul"]), "--dim", f"0:0={2**62}")
    assert status == 1
    assert err.startswith(f"error: cannot make random inputs of shapes [{2**62}, 8], [8, 8]: RuntimeError: ")
    assert "\n" not in err.strip(), "one line, without torch's C++ frames"


@pytest.mark.parametrize("value", ["abc", "-1", "0", "0.001", "inf", "nan"])
def test_a_timeout_that_is_not_one(files, capsys, monkeypatch, value):
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", value)
    status, out, err = run_main(capsys, str(files["matmul"]))
    assert status == 1 and out == ""
    assert err.strip() == f"error: HOSTIR_TIMEOUT_S: expected a finite number of seconds, at least 1, got '{value}'"
    with pytest.raises(SystemExit) as exit:
        hir_run.main([str(files["matmul"]), "--timeout", value])
    assert exit.value.code == 2
    assert f"argument --timeout: expected a finite number of seconds, at least 1, got '{value}'" in capsys.readouterr().err


def test_check_needs_the_fusion(files, tmp_path, capsys):
    lowered = tmp_path / "lowered.mlir"
    lowered.write_text(print_module(hir_run.Program.compile(matmul()).module))
    status, out, err = run_main(capsys, str(lowered), "-p", "none")
    assert status == 0, err
    assert out.startswith("@matmul: 1 rank(s)")
    status, _, err = run_main(capsys, str(lowered), "-p", "none", "--check")
    assert status == 1 and "a module given with -p none has none" in err


def test_dim_names_a_dynamic_axis(files, capsys, tmp_path):
    """--dim on an axis whose extent the type gives, or on a didx axis (the mesh's size), is
    refused with the axis named; and with --inputs, whose tensors have their extents."""
    static = tmp_path / "static.mlir"
    static.write_text(
        "func.func @f(%x: !fusion.tensor<[?, 8], f32>) -> !fusion.tensor<[?, 8], f32> {\n"
        "  %y = fusion.neg %x : !fusion.tensor<[?, 8], f32> -> !fusion.tensor<[?, 8], f32>\n"
        "  func.return %y : !fusion.tensor<[?, 8], f32>\n}\n"
    )
    status, out, err = run_main(capsys, str(static), "--dim", "0:1=3")
    assert (status, out) == (1, "")
    assert err.strip() == "error: a size is given for axis 1 of argument 0 (!fusion.tensor<[?, 8], f32>), which is not dynamic: its extent is 8"
    status, _, err = run_main(capsys, str(files["ag_linear"]), "--dim", "0:1=3")
    assert status == 1 and "a size is given for axis 1 of argument 0 (" in err
    assert "its didx axis, whose extent is the size of its mesh, 2" in err
    weight = tmp_path / "w.pt"
    torch.save(torch.zeros(8, 8), weight)
    status, _, err = run_main(capsys, str(files["matmul"]), "--inputs", str(weight), str(weight), "--dim", "0:0=3")
    assert status == 1 and err.strip() == "error: --dim gives the extents of random inputs; the tensors of --inputs have theirs"


def test_progress_says_each_event_once_for_every_rank(files):
    """--progress: one line per event from the start, rank 0 speaking for the ranks, and the
    first and last of the runs always."""
    result = run_script(str(files["ag_linear"]), "--nproc", "2", "--progress", "--repeat", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[:5] == [
        "hir-run: compiling",
        "hir-run: starting 2 local ranks",
        "hir-run: compiling on every rank",
        "hir-run: warming up",
        "hir-run: run 1 of 3",
    ], lines
    assert lines[-1] == "hir-run: run 3 of 3" and set(lines[5:-1]) <= {"hir-run: run 2 of 3"}


def test_log_dir_and_tee_send_each_ranks_output_as_torchrun_does(files, tmp_path, capsys, monkeypatch):
    logs = tmp_path / "logs"
    status, _, err = run_local_ranks(capsys, monkeypatch, str(files["ag_linear"]), "--nproc", "2", "--progress", "--log-dir", str(logs))
    assert status == 0, err
    assert err.splitlines() == ["hir-run: compiling", "hir-run: starting 2 local ranks"]
    assert (logs / "rank0" / "stderr.log").read_text().splitlines() == [
        "hir-run: compiling on every rank", "hir-run: warming up", "hir-run: run 1 of 1"
    ]  # fmt: skip
    assert {path.name: path.stat().st_size for path in (logs / "rank1").iterdir()} == {"stdout.log": 0, "stderr.log": 0}
    teed = run_script(str(files["ag_linear"]), "--nproc", "2", "--progress", "--tee", "--log-dir", str(logs))
    assert teed.returncode == 0, teed.stderr
    assert teed.stderr.splitlines()[2:] == [
        "[rank 0]: hir-run: compiling on every rank", "[rank 0]: hir-run: warming up", "[rank 0]: hir-run: run 1 of 1"
    ]  # fmt: skip
    assert (logs / "rank0" / "stderr.log").read_text().count("hir-run: warming up") == 2, "appended, as torchrun's"
    one = run_script(str(files["matmul"]), "--progress", "--tee")
    assert one.returncode == 0 and "[rank 0]: hir-run: run 1 of 1" in one.stderr, "even one rank runs as a rank of its own"


def test_under_torchrun_a_failure_before_the_runs_is_said_once(files, tmp_path):
    """The ranks agree on what failed before the runs, and rank 0 says it for all of them:
    ranks that failed alike together, a rank that failed alone by its rank."""
    broken = tmp_path / "broken.mlir"
    broken.write_text("func.func @f(%x: !fusion.tensor<[4], f32>) {\n  func.return\n")
    (status0, out0, err0), (status1, out1, err1) = torchrun_pair(([str(broken)], [str(broken)]))
    assert (status0, status1, out0, out1, err1) == (1, 1, "", "", "")
    assert err0 == (
        f"ranks 0, 1: {broken}:2:14: error: expected '}}' to close the region opened at line 1, before the end of the input\n"
        "  func.return\n             ^\n"
    )
    (status0, out0, err0), (status1, out1, err1) = torchrun_pair(([str(files["ag_linear"])], [str(tmp_path / "absent.mlir")]))
    assert (status0, status1, out0, out1, err1) == (1, 1, "", "", "")
    assert err0 == f"rank 1: error: cannot read '{tmp_path / 'absent.mlir'}': No such file or directory\n"


def test_version_names_hostir_xdsl_and_torch(capsys):
    with pytest.raises(SystemExit) as exit:
        hir_run.main(["--version"])
    assert exit.value.code == 0
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"hir-run \d+\.\d+\.\d+ \(xDSL 0\.\d+\.\d+, torch \d+\.\d+\.\d+\S*\)", line), line


def test_bad_pipeline(files, capsys):
    status, _, err = run_main(capsys, str(files["matmul"]), "-p", "no-such-pass")
    assert status == 1 and err.startswith("pass-pipeline:1:1: error: unknown pass 'no-such-pass'")


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--dim", "0:1"], "'0:1' is not ARG:AXIS=EXTENT"),
        (["--dim", "0:1=-3"], "'0:1=-3': the extent is -3; it cannot be negative"),
        (["--dim=-1:1=3"], "'-1:1=3': the argument is -1; it cannot be negative"),
        (["--dim", f"0:1={2**64}"], f"an extent holds in 64 bits; {2**64} does not"),
        (["--nproc", "2", "--nproc-per-node", "2"], "argument --nproc-per-node/--nproc_per_node: not allowed with argument --nproc"),
        (
            ["--trace", "t.png"],
            "'t.png' is where the JSON trace goes; the PNG goes next to it: give e.g. t.json",
        ),
        (
            ["--trace", "/no/such/directory/t.json"],
            "'/no/such/directory', where the trace would go, is not a directory",
        ),
    ],
)
def test_bad_command_line_is_a_usage_error(capsys, arguments, message):
    with pytest.raises(SystemExit) as exit:
        hir_run.main(["x.mlir", *arguments])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


FAILS_ON_RANK_1 = """
func.func @fails_on_rank_1(%x: !fusion.tensor<[4], f32, mesh = [0, 1]>) -> !fusion.tensor<[4], f32, mesh = [0, 1]> {
  %c5 = arith.constant 5 : index
  %rank = hir.device_index
  %i = arith.muli %rank, %c5 : index
  %element = hir.alias_select %x[0 = %i] : !fusion.tensor<[4], f32, mesh = [0, 1]> -> !fusion.tensor<[], f32, mesh = [0, 1]>
  %out = hir.allocate() : !fusion.tensor<[4], f32, mesh = [0, 1]>
  hir.copy ins(%x : !fusion.tensor<[4], f32, mesh = [0, 1]>) outs(%out : !fusion.tensor<[4], f32, mesh = [0, 1]>)
  func.return %out : !fusion.tensor<[4], f32, mesh = [0, 1]>
}
"""

WAITS_FOREVER_ON_RANK_1 = """
func.func @waits_forever_on_rank_1(%x: !fusion.tensor<[4], f32, mesh = [0, 1]>) -> !fusion.tensor<[4], f32, mesh = [0, 1]> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %rank = hir.device_index
  %out = hir.allocate() : !fusion.tensor<[4], f32, mesh = [0, 1]>
  %second = arith.cmpi eq, %rank, %c1 : index
  scf.if %second {
    %r = hir.recv %out from %c0 backend nccl : !fusion.tensor<[4], f32, mesh = [0, 1]>
    hir.wait %r
  }
  func.return %out : !fusion.tensor<[4], f32, mesh = [0, 1]>
}
"""


def test_a_failing_rank_is_reported_by_rank(tmp_path):
    path = tmp_path / "fails.mlir"
    path.write_text(FAILS_ON_RANK_1)
    result = run_script(str(path), "-p", "none", "--nproc", "2")
    assert result.returncode == 1
    assert_no_traceback(result.stderr)
    assert result.stderr.startswith(f"rank 1: {path}:6:3: error: failed on rank 1: IndexError")
    assert "rank 0:" not in result.stderr


def test_a_rank_that_waits_forever_is_stopped_by_the_timeout(tmp_path):
    path = tmp_path / "waits.mlir"
    path.write_text(WAITS_FOREVER_ON_RANK_1)
    result = run_script(str(path), "-p", "none", "--nproc-per-node", "2", "--timeout", "3")
    assert result.returncode == 1
    assert_no_traceback(result.stderr)
    assert result.stderr.startswith("rank 1: ")
