"""Seeing what hostir did: `hostir.explain`, the `hostir` loggers (TORCH_LOGS, HOSTIR_DUMP),
the fallback warning at the user's line, and torch.compile's options and modes.

Everything said of a graph is said once, on the first of its ranks; the dumps are what
hir-opt reads, and the host program is what hir-opt makes of the dumped fusion with the
pipeline the dump names.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hostir
from hostir import config
from hostir.frontend.backend import MODES, BackendOptions, HostirFallbackWarning
from hostir.runtime.launch import run_on_local_ranks
from hostir_dialect.text import READABLE_WIDTH, parse_module
from hostir.tools import hir_opt
from test_communicator import needs_ranks


class Complex(nn.Module):
    def forward(self, x):
        return (x.to(torch.complex64) * 2).abs()  # COMPLEX LINE


class WithComplex(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 4)
        self.odd = Complex()

    def forward(self, x):
        return self.odd(self.up(x))


LINE_OF = {line.rpartition("# ")[2]: i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.endswith(" LINE")}
"""The lines of this file marked `# ... LINE`, by their mark."""
COMPLEX_LINE = LINE_OF["COMPLEX LINE"]


def test_a_fallback_warning_points_at_the_users_line_and_names_the_op_and_module():
    torch._dynamo.reset()
    x = torch.randn(2, 4)
    model = WithComplex()
    with pytest.warns(HostirFallbackWarning) as caught:
        out = torch.compile(model, backend="hostir")(x)
    torch.testing.assert_close(out, model(x))
    (warning,) = [w for w in caught if issubclass(w.category, HostirFallbackWarning)]
    assert (warning.filename, warning.lineno) == (__file__, COMPLEX_LINE)
    message = str(warning.message)
    assert re.match(r"hostir runs graph forward_\d+ as torch eager ops: aten\._to_copy\.default at ", message), message
    assert f"test_explain.py:{COMPLEX_LINE} in module odd (Complex): tensors of dtype torch.complex64 are not supported" in message


def test_without_fallback_the_error_names_the_op():
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"aten\._to_copy\.default.*: tensors of dtype torch\.complex64 are not supported"):
        torch.compile(Complex(), backend="hostir", options={"fallback": False})(torch.randn(2, 4))


def test_explain_says_what_falls_back_and_why_and_changes_no_gradient():
    model, x = WithComplex(), torch.randn(2, 4, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostirFallbackWarning)  # explain reports it, and does not warn
        explanation = hostir.explain(model, x)
    assert [p.grad for p in model.parameters()] == [None, None] and x.grad is None
    forward, backward = explanation.graphs
    assert (forward.graph.split("_")[0], backward.graph.split("_")[0]) == ("forward", "backward")
    assert explanation.fallbacks == [forward, backward]
    assert (forward.op, forward.place.line, forward.place.module) == ("aten._to_copy.default", COMPLEX_LINE, "odd (Complex)")
    assert forward.fallback.startswith("tensors of dtype torch.complex64 are not supported by this op")
    assert backward.place.line == COMPLEX_LINE
    text = str(explanation)
    assert text.startswith("2 graph(s): 0 run by hostir, 2 as torch eager ops\n")
    assert "    return (x.to(torch.complex64) * 2).abs()  # COMPLEX LINE\n" in text
    assert "runs as torch eager ops" in text and "node: %_to_copy" in text


class Spectrum(nn.Module):
    def forward(self, x):
        return torch.stft(x, n_fft=4, window=torch.ones(4), return_complex=True).abs()  # STFT LINE


def test_the_users_line_is_outside_torchs_code():
    """torch.stft is traced through torch's own Python code: the line is the user's call of it."""
    (forward, *_) = hostir.explain(Spectrum(), torch.randn(16)).graphs
    assert forward.op == "aten._fft_r2c.default"
    assert (forward.place.file, forward.place.line) == (__file__, LINE_OF["STFT LINE"])
    (float8_input,) = hostir.explain(lambda x: x.float() * 2, torch.ones(3, dtype=torch.float8_e4m3fn)).graphs
    assert float8_input.op.startswith("the input ") and float8_input.fallback.startswith("tensors of dtype torch.float8_e4m3fn")


def test_explain_of_a_graph_hostir_runs(monkeypatch):
    def f(x, w):
        return F.gelu(x @ w).sum(dim=-1)

    explanation = hostir.explain(f, torch.randn(4, 8), torch.randn(8, 5, requires_grad=True))
    forward, backward = explanation.graphs
    assert explanation.fallbacks == [] and forward.imported and backward.imported
    assert forward.inputs == ["f32[4, 8]", "f32[8, 5]"] and forward.ranks == (0,)
    assert str(forward).startswith(f"graph {forward.graph} (f32[4, 8], f32[8, 5]): a host program on one device")


def test_modes_are_presets_of_the_options():
    assert set(MODES) == {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}
    assert BackendOptions.of(None, "reduce-overhead") == BackendOptions.of(None, "max-autotune") == BackendOptions()
    assert BackendOptions.of(None, "max-autotune-no-cudagraphs") == BackendOptions(cuda_graphs=False)
    with pytest.raises(ValueError, match="hostir has no mode 'fastest'; torch.compile's modes are default, reduce-overhead"):
        BackendOptions.of(None, "fastest")


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_takes_a_mode(mode):
    def f(x):
        return torch.tanh(x) * 3

    torch._dynamo.reset()
    x = torch.randn(3, 5)
    torch.testing.assert_close(torch.compile(f, backend="hostir", mode=mode)(x), f(x))
    torch.testing.assert_close(torch.compile(f, backend=hostir.backend(mode=mode))(x), f(x))


def test_hostir_backend_checks_its_options_where_they_are_written():
    with pytest.raises(ValueError, match=r"unknown hostir backend option\(s\) \['chunk'\]; known: pipeline, chunks"):
        hostir.backend(chunk=4)
    with pytest.raises(ValueError, match=r"chunks=0: a positive number of chunks"):
        hostir.backend(chunks=0)
    torch._dynamo.reset()
    x = torch.randn(3, 5)
    torch.testing.assert_close(torch.compile(torch.sin, backend=hostir.backend(chunks=2, pipeline=False))(x), torch.sin(x))
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"gave mode to a hostir.backend\(...\), which has its options already"):
        torch.compile(torch.cos, backend=hostir.backend(), mode="reduce-overhead")(x)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"unknown hostir backend option\(s\) \['chunk'\].*hostir\.backend\(\.\.\.\) checks them"):
        torch.compile(torch.cos, backend="hostir", options={"chunk": 4})(x)


# --------------------------------------------------------------------------- #
# On two ranks: once per graph, on the first rank                              #
# --------------------------------------------------------------------------- #


def _what_each_rank_says() -> dict:
    """test_torch_backend's MLP with sequence parallelism in two chunks: what this rank printed
    with every kind of HOSTIR_DUMP, its explanation, and the fallback warnings it gave for a
    graph without collectives."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from examples.tp_decoder_layer import rank_device
    from test_torch_backend import MLP, mlp_plan

    device = rank_device()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_module(MLP().to(device), mesh, mlp_plan(sequence_parallel=True))
    x = torch.randn(16, 16, device=device, requires_grad=True)
    torch._dynamo.reset()
    said = io.StringIO()
    # NCCL's lowering named (on GPUs `auto` may take the copy engines), as on CPU ranks.
    with config.patch(dump=set(config.DUMP_KINDS)), contextlib.redirect_stderr(said):
        model_out = torch.compile(model, backend="hostir", options={"chunks": 2, "backend": "nccl"})(x)
        model_out.sum().backward()
    explanation = hostir.explain(model, x, chunks=2, backend="nccl")
    unpipelined = hostir.explain(model, x, pipeline=False, backend="nccl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(Complex(), backend="hostir")(torch.randn(2, 4))
    return {
        "said": said.getvalue(),
        "explanation": str(explanation),
        "graphs": [
            {"pipelining": g.pipelining, "chunked": [(c.chunks, c.chosen_by) for c in g.chunked], "ranks": g.ranks, "backend": g.backend}
            for g in explanation.graphs
        ],
        "fallback warnings": sum(issubclass(w.category, HostirFallbackWarning) for w in caught),
        "unpipelined": [(g.pipelining, [(c.chunks, c.chosen_by) for c in g.chunked]) for g in unpipelined.graphs],
    }


@needs_ranks(2)
def test_what_hostir_did_is_said_once_on_the_first_rank_and_hir_opt_reproduces_it(tmp_path):
    first, second = run_on_local_ranks(_what_each_rank_says, 2, timeout_s=300)
    assert second["said"] == "" and second["fallback warnings"] == 0
    assert first["fallback warnings"] == 1
    said = first["said"]
    for kind in ("the fusion of graph forward_", "the host program of graph forward_", "the fusion of graph backward_"):
        assert said.count(f"// hostir: {kind}") == 1, said
    # HOSTIR_DUMP=pipelining: the all-gathers of the forward and the backward, as the pass decides;
    # HOSTIR_DUMP=explain: the same, as each graph's explanation says them.
    assert len(re.findall(r"^fusion\.set %\w+ of .* is pipelined: a ring of 2 chunks", said, re.M)) == 2
    assert len(re.findall(r"^  pipelining: fusion\.set %\w+ of .* is pipelined: a ring of 2 chunks", said, re.M)) == 2
    assert len(re.findall(r"^fusion\.sum %reduce_scatter_tensor of .* is pipelined: 2 chunks: chunk i's reduction", said, re.M)) == 2
    assert re.search(r"^graph forward_\d+ \(f32\[16, 16\], .*\): a host program on ranks \[0, 1\]$", said, re.M)
    # Both ranks explain alike.
    assert first["graphs"] == second["graphs"]
    forward, backward = first["graphs"]
    assert forward["ranks"] == (0, 1) and forward["backend"] == "nccl"
    assert forward["chunked"] == [(2, "the chunks option")]
    assert any("is pipelined" in decision for decision in forward["pipelining"])
    assert "the cost model predicts" in first["explanation"]
    # pipeline=False: auto-stream-parallel decides nothing, and nothing is cut into chunks.
    assert first["unpipelined"] == [([], [(1, "pipeline=False: one chunk")])] * 2
    # The dumps read: type aliases, lines cut to 100 characters where they can be (an op
    # whose first words are longer goes on a little).
    dumps = [line for text in re.findall(r"^// hostir: .*?\n}\n", said, re.S | re.M) for line in text.splitlines()]
    assert max(map(len, dumps)) <= READABLE_WIDTH + 20, max(dumps, key=len)
    assert sum(len(line) > READABLE_WIDTH for line in dumps) < len(dumps) / 50
    assert re.search(r"^!f32_2x16x16_didx = !fusion\.tensor<\[2, 16, 16\], f32, mesh = \[0, 1\], axes = \[didx, _, _\]>$", said, re.M)
    assert re.search(r"^ +%\w+ = fusion\.aten \"aten\.t\.default\"\(%primals_\d+\) : \(!f32_2x\d+x\d+_didx\) -> !f32_2x\d+x\d+_didx$", said, re.M)
    # The dumped fusion, lowered by hir-opt with the pipeline the dump names, is the dumped host program.
    fusions = re.findall(r"// hostir: the fusion of graph (\w+)\n(.*?\n}\n)", said, re.S)
    programs = re.findall(
        r"// hostir: the host program of graph (\w+), which its fusion lowers to with\n// hir-opt -p '([^']+)'\n(.*?\n}\n)", said, re.S
    )
    assert [name for name, _ in fusions] == [name for name, _, _ in programs] and len(fusions) == 2
    for (name, fusion_text), (_, pipeline, program_text) in zip(fusions, programs):
        source, lowered = tmp_path / f"{name}.mlir", tmp_path / f"{name}.lowered.mlir"
        source.write_text(fusion_text)
        assert hir_opt.main([str(source), "-p", pipeline, "-o", str(lowered)]) == 0
        assert parse_module(lowered.read_text()).is_structurally_equivalent(parse_module(program_text)), name


# --------------------------------------------------------------------------- #
# TORCH_LOGS and HOSTIR_DUMP in a process of their own                          #
# --------------------------------------------------------------------------- #

SCRIPT = """
import os, sys
import torch
import torch.nn.functional as F

for dump in sys.argv[1:]:
    os.environ["HOSTIR_DUMP"] = dump
    torch._dynamo.reset()
    try:
        torch.compile(lambda x, w: F.silu(x @ w), backend="hostir")(torch.randn(4, 8), torch.randn(8, 5))
    except Exception as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
    print("--- end of the step", file=sys.stderr, flush=True)
"""
"""Compiles a graph with hostir once per argument, with HOSTIR_DUMP set to it (hostir reads
the variable when it dumps, torch TORCH_LOGS as it is imported), and ends what each step
printed on stderr with a line of its own."""


def _stderr_of(tmp_path: Path, *dumps: str, **variables: str) -> list[str]:
    """What each step of SCRIPT printed on stderr, in a fresh process with `variables`."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *dumps], capture_output=True, text=True, cwd=tmp_path,
        env={**config.environment(), **variables},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    *steps, rest = result.stderr.split("--- end of the step\n")
    assert len(steps) == len(dumps) and rest == "", result.stderr
    return steps


def test_torch_logs_shows_what_hostir_did(tmp_path):
    [everything] = _stderr_of(tmp_path, "", TORCH_LOGS="+hostir")
    assert re.search(r"^V\d{4} .*\] // hostir: the fusion of graph forward_1$", everything, re.M), everything
    assert re.search(r"^V\d{4} .*\] // hostir: the host program of graph forward_1, which its fusion lowers to with\nV\d{4} .*\] // hir-opt -p '", everything, re.M)
    assert re.search(r"^I\d{4} .*\] graph forward_1 \(f32\[4, 8\], f32\[8, 5\]\): a host program on one device$", everything, re.M)
    [summary] = _stderr_of(tmp_path, "", TORCH_LOGS="hostir")
    assert "graph forward_1 (f32[4, 8], f32[8, 5]): a host program on one device" in summary
    assert "// hostir: the fusion" not in summary


def test_every_kind_of_hostir_dump_is_taken_by_torch_compile(tmp_path):
    """In one fresh process: without HOSTIR_DUMP (or TORCH_LOGS) nothing is said, from the
    start of the process on; then every kind is dumped, of the second graph (so the first
    was hostir's); then a kind that is none is refused."""
    nothing, printed, refused = _stderr_of(tmp_path, "", "explain,pipelining,fusion,host_ir,cuda_kernel", "kernels")
    assert nothing == ""
    assert printed.startswith("// hostir: the fusion of graph forward_2\n")
    assert "// hostir: the host program of graph forward_2" in printed
    assert "\ngraph forward_2 (f32[4, 8], f32[8, 5]): a host program on one device\n" in printed
    assert "HOSTIR_DUMP: names ['kernels']" in refused


def test_pipelining_decisions_are_said_by_hir_opt_too(tmp_path, capsys):
    """`auto-stream-parallel` says each decision where it is made: HOSTIR_DUMP=pipelining
    prints them from hir-opt as from torch.compile."""
    fusion = tmp_path / "ar.mlir"
    # A GEMM + all-reduce whose rows are cut into 4 chunks, and one whose rows are not.
    fusion.write_text(
        "!in = !fusion.tensor<[2, 4, 2, 16], f32, mesh = [0, 1], axes = [didx, _, _, _]>\n"
        "!w = !fusion.tensor<[2, 1, 16, 4], f32, mesh = [0, 1], axes = [didx, _, _, _]>\n"
        "!p = !fusion.tensor<[2, 4, 2, 4], f32, mesh = [0, 1], axes = [didx, _, _, _]>\n"
        "!out = !fusion.tensor<[4, 2, 4], f32, mesh = [0, 1]>\n"
        "func.func @chunked(%x: !in, %w: !w) -> !out {\n"
        "  %p = fusion.matmul %x, %w : (!in, !w) -> !p\n"
        "  %chunked = fusion.sum %p [0] : !p -> !out\n"
        "  func.return %chunked : !out\n}\n"
        "!in2 = !fusion.tensor<[2, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _]>\n"
        "!w2 = !fusion.tensor<[2, 16, 4], f32, mesh = [0, 1], axes = [didx, _, _]>\n"
        "!p2 = !fusion.tensor<[2, 8, 4], f32, mesh = [0, 1], axes = [didx, _, _]>\n"
        "!out2 = !fusion.tensor<[8, 4], f32, mesh = [0, 1]>\n"
        "func.func @rows(%x: !in2, %w: !w2) -> !out2 {\n"
        "  %p = fusion.matmul %x, %w : (!in2, !w2) -> !p2\n"
        "  %rows = fusion.sum %p [0] : !p2 -> !out2\n"
        "  func.return %rows : !out2\n}\n"
    )
    with config.patch(dump={"pipelining"}):
        assert hir_opt.main([str(fusion), "-p", "auto-stream-parallel"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "fusion.sum %chunked of mesh = [0, 1], axes = [didx, _, _, _] is pipelined: 4 chunks: chunk i's reduction "
        "runs while chunk i + 1's fusion.matmul %p computes it",
        "fusion.sum %rows of mesh = [0, 1], axes = [didx, _, _] is not pipelined: the chunk axis is not a batch axis "
        "of the matmul's left operand",
    ]


def test_a_chunk_count_chosen_on_measured_stages_is_explained_by_the_model_s_reason():
    from hostir.frontend.explanation import ChunkedCollective
    from hostir.passes.analysis.cost_model import MeasuredStages, OverlapKind, OverlapProblem, Stages, choose_pipeline

    problem = OverlapProblem(OverlapKind.MATMUL_REDUCE_SCATTER, 8192, 8192, 3584, 4)
    # A GEMM and a reduce-scatter at once as slow as one after the other: no pipeline gains.
    stages = MeasuredStages(problem, {s: Stages(0.17e-3 / s, 0.19e-3 / s, 0.36e-3 / s + 2e-5) for s in (1, 2)})
    shape = choose_pipeline(problem, stages)
    said = str(ChunkedCollective("reduce_scatter_tensor", problem, shape.chunks, "the cost model's choice", shape))
    assert shape.chunks == 1
    assert said.startswith("%reduce_scatter_tensor, a GEMM + reduce-scatter of M=8192 K=8192 N=3584 over 4 ranks: 1 chunk")
    assert "in 2 chunks against 0.36 ms for the GEMM then the collective" in said
    assert "nominal" not in said
