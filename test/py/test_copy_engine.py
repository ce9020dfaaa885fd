"""The copy-engine backend (`backend cuda`, docs/copy-engine.md), from the fusion to the outputs.

Each case lowers a reference fusion with the copy engines chosen (`hir-lowering{backend=cuda}`
or `{p2p_backend=cuda}`): the point-to-point allgather (in ring order, and in pr4515's
device order), the allgather, AG+matmul and AG+linear, in f32 and bf16, and the
point-to-point AG+matmul on a mesh that leaves out device 0. Every rank of a world of 2
and of 4 runs it twice, on new random inputs each time (the second run reuses the
symmetric buffers of the first), with every allocation poisoned, and the parent
compares each rank's output with its piece of plain torch on the unsharded inputs and
with the same fusion lowered for NCCL. On CPU ranks (gloo, CI) the copy engines'
schedule runs over torch.distributed messages; on a machine with enough GPUs the ranks
use torch symmetric memory and copies on the copy stream (HOSTIR_TEST_DEVICE as in
test_e2e.py).

The reductions run the same way: every reference fusion that lowers to an allreduce or a
reduce-scatter (the allreduce, the reduce-scatter, matmul+allreduce and
matmul+reduce-scatter, all stream-parallel) with `hir-lowering{backend=cuda}`, f32 and
bf16, worlds of 2 and 4; and hand-written host programs run the copy-engine allreduce and
reduce-scatter with every reduction op (sum, product, max, min). On a world of 4 the
allreduce runs in two phases: pieces of every size (empty, uneven, strided), the elements
each member reads from its peers and the scratch it reduces into are checked too. On a
machine with a GPU the allreduce's GPU path runs with 2 and with 4 processes sharing
that GPU (`member_on_one_gpu`), and so do GEMM+AR with its sums made in the GEMM
(`allreduce-in-matmul`), which CPU ranks run with 1 to 5 chunks and on devices 1 and 2,
and GEMM+RS over four members as a ring of destinations (`reduce-scatter-ring`), which
CPU ranks also run on devices 1 to 3 of four.

Single-process tests check what the runtime refuses while preparing a program, and how
long a symmetric buffer lives. GPU-only tests profile an AG+matmul and a
matmul+reduce-scatter on 2 GPUs to see the copies run as memcpys on their own stream,
overlapping the GEMMs.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest
import torch
import torch.distributed as dist
from xdsl.dialects.builtin import ModuleOp

from examples.reference_fusions import REFERENCE_FUSIONS
from hostir_dialect import hir
from hostir_dialect.builder import FusionBuilder
from hostir_dialect.text import HostirError
from hostir.runtime.distributed.communicator import REDUCE_OPS, Communicator
from hostir.runtime.distributed.copy_engine import SymmetricAllocation, SymmetricBuffer, reduction
from hostir.runtime.distributed.streams import hold_current_stream
from hostir.runtime.interpreter.communication import _partner, copy_engine_transfers
from hostir.runtime.launch import RankFailed, run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import shard
from hostir.runtime.trace import trace_run
from test_e2e import DEVICE, DTYPES, TOLERANCE, identity, linear, matmul, needs_world
from test_e2e import rank_environment  # noqa: F401 (the ranks' environment, an autouse fixture)
from test_interpreter import poisoned_allocations, tensor
from test_kernels import requires_gpu

COPY_ENGINE = "hir-lowering{backend=cuda}"
P2P_COPY_ENGINE = "hir-lowering{p2p_backend=cuda}"
P2P_COPY_ENGINE_DEVICE_ORDER = "hir-lowering{p2p_backend=cuda p2p_order=device}"
NCCL = "hir-lowering"
SEPARATE_REDUCTION = "hir-lowering{backend=cuda reduce_scatter_in_matmul=false reduce_scatter_ring=false}"

T = TypeVar("T")

S, M, K, N = 2, 3, 4, 5
"""Stream axis, rows of a shard, and the matmul's K and N."""


@dataclass(frozen=True)
class Fusion:
    name: str
    shapes: Callable[[int], list[tuple[int, ...]]]
    """The unsharded input shapes on a mesh of D devices."""
    expected: Callable[..., torch.Tensor]
    pipelines: tuple[str, ...]
    reduces: bool = False
    """Whether it lowers to a reduction, whose sums the copy engines and NCCL may order differently."""


def ag_matmul_p2p_upper(num_devices: int, dtype: str) -> ModuleOp:
    """A [DIDx(D-1), M, K] on devices 1 .. D-1 @ B [K, N] -> [Stream(D-1), M, N]: the ring
    on a mesh that leaves out device 0, whose ranks hold placeholders (static extents)."""
    mesh = range(1, num_devices)
    fb = FusionBuilder("ag_matmul_p2p_upper")
    a = fb.input([len(mesh), M, K], dtype, mesh=mesh, axes=["didx", "_", "_"])
    out = fb.matmul(a, fb.input([K, N], dtype, mesh=mesh))
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


BUILDERS = {**REFERENCE_FUSIONS, "ag_matmul_p2p_upper": ag_matmul_p2p_upper}

P2P_PIPELINES = (COPY_ENGINE, P2P_COPY_ENGINE, P2P_COPY_ENGINE_DEVICE_ORDER)
"""The point-to-point allgather on the copy engines, in ring order and in pr4515's order."""

def matmul_ar(a, b):
    return torch.einsum("sdmk,dkn->smn", a, b)


def matmul_rs(a, b):
    return torch.einsum("sdemk,dkn->semn", a, b)


def sum_over_devices(x):
    return x.sum(1)


FUSIONS = [
    Fusion("allgather_p2p", lambda D: [(D, M)], identity, P2P_PIPELINES),
    Fusion("ag_matmul_p2p", lambda D: [(D, M, K), (K, N)], matmul, P2P_PIPELINES),
    Fusion("ag_matmul_p2p_upper", lambda D: [(D - 1, M, K), (K, N)], matmul, (P2P_COPY_ENGINE,)),
    Fusion("allgather", lambda D: [(S, D)], identity, (COPY_ENGINE,)),
    Fusion("ag_matmul", lambda D: [(S, D, M, K), (K, N)], matmul, (COPY_ENGINE,)),
    Fusion("ag_linear", lambda D: [(S, D, M, K), (N, K), (N,)], linear, (COPY_ENGINE,)),
    Fusion("allreduce", lambda D: [(S, D, M)], sum_over_devices, (COPY_ENGINE,), reduces=True),
    Fusion("reduce_scatter", lambda D: [(S, D, D, M)], sum_over_devices, (COPY_ENGINE,), reduces=True),
    Fusion("matmul_ar", lambda D: [(S, D, M, K), (D, K, N)], matmul_ar, (COPY_ENGINE,), reduces=True),
    Fusion(
        "matmul_rs_through_bcast",
        lambda D: [(S, D, D, M, K), (D, K, N)],
        matmul_rs,
        (COPY_ENGINE, SEPARATE_REDUCTION),
        reduces=True,
    ),
]


@dataclass(frozen=True)
class Case:
    fusion: Fusion
    pipeline: str
    dtype: str
    world: int

    @property
    def id(self) -> str:
        return f"{self.fusion.name}-{self.pipeline}-{self.dtype}-w{self.world}"

    def module(self):
        return BUILDERS[self.fusion.name](num_devices=self.world, dtype=self.dtype)

    def inputs(self) -> list[list[torch.Tensor]]:
        """Two sets of random unsharded inputs, one per run, the same in every process."""
        generator = torch.Generator().manual_seed(sum(map(ord, self.id)))
        return [
            [
                torch.randn(shape, generator=generator).to(DTYPES[self.dtype])
                for shape in self.fusion.shapes(self.world)
            ]
            for _ in range(2)
        ]


CASES = [
    Case(fusion, pipeline, dtype, world)
    for world in (2, 4)
    for fusion in FUSIONS
    for pipeline in fusion.pipelines
    for dtype in DTYPES
]


def run_cases(cases: list[tuple[str, str, str, int, list]]) -> list:
    """On one rank: per case and run, (copy-engine output, NCCL output, inputs unchanged), on the CPU."""
    communicator = Communicator.from_env()
    assert communicator.device.type == DEVICE, f"rank runs on {communicator.device}, expected {DEVICE}"
    results = []
    for name, pipeline, dtype, world, runs in cases:
        module = BUILDERS[name](num_devices=world, dtype=dtype)
        programs = [Program.compile(module, pipeline=p) for p in (pipeline, NCCL)]
        per_run = []
        for inputs in runs:
            local = [
                shard(x, t, communicator.rank).to(communicator.device)
                for x, t in zip(inputs, programs[0].input_types)
            ]
            before = [x.clone() for x in local]
            outputs = []
            for program in programs:
                with poisoned_allocations():
                    (output,) = program.run(local, communicator)
                outputs.append(output.cpu())
            unchanged = all(torch.equal(a, b) for a, b in zip(local, before))
            per_run.append((*outputs, unchanged))
        results.append(per_run)
    return results


@functools.cache
def results_of_world(world: int) -> dict[str, list]:
    """Every case of a world size, run in one spawn; case id -> per-rank results."""
    cases = [c for c in CASES if c.world == world]
    payload = [(c.fusion.name, c.pipeline, c.dtype, c.world, c.inputs()) for c in cases]
    per_rank = run_on_local_ranks(run_cases, world, payload)
    return {case.id: [rank_results[i] for rank_results in per_rank] for i, case in enumerate(cases)}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=needs_world(c.world)) for c in CASES])
def test_copy_engine_matches_plain_torch_and_nccl(case: Case):
    program = Program.compile(case.module(), pipeline=case.pipeline)
    (output_type,) = program.output_types
    # A mesh of one device (ag_matmul_p2p_upper at world 2) moves nothing: canonicalize
    # drops its ring's transfers, whose single iteration is the device's own slice.
    moves = output_type.mesh.size > 1
    transfers = copy_engine_transfers(program.host)
    assert bool(transfers) == moves, f"copy-engine transfers {transfers} on a mesh of {output_type.mesh.size}"
    dtype = DTYPES[case.dtype]
    for run, inputs in enumerate(case.inputs()):
        expected = case.fusion.expected(*(x.double() for x in inputs))
        tolerance = TOLERANCE[dtype] * expected.abs().max().item()
        for rank, per_run in enumerate(results_of_world(case.world)[case.id]):
            copy_engine, nccl, unchanged = per_run[run]
            where = f"run {run}, rank {rank}"
            assert unchanged, f"{where} changed its inputs"
            piece = shard(expected, output_type, rank)
            assert copy_engine.dtype == dtype and copy_engine.shape == piece.shape, where
            torch.testing.assert_close(
                copy_engine.double(), piece, rtol=0, atol=tolerance, msg=lambda m: f"{where}: {m}"
            )
            if DEVICE == "cpu" and not case.fusion.reduces:
                # The same bytes move, and the same compute runs on them.
                assert torch.equal(copy_engine, nccl), f"{where}: the copy engines and NCCL differ"
            elif case.fusion.reduces:
                # The copy engines add the pulled pieces in one torch reduction (rounded once);
                # NCCL and gloo order and round their sums their own way.
                torch.testing.assert_close(
                    copy_engine.double(), nccl.double(), rtol=0, atol=tolerance, msg=lambda m: f"{where}: {m}"
                )
            else:
                torch.testing.assert_close(copy_engine, nccl, msg=lambda m: f"{where}: {m}")


@pytest.mark.parametrize("world", [2, 4])
def test_a_matmul_reduce_scatter_adds_in_the_gemm_over_two_and_runs_a_ring_over_more(world):
    """Over two devices the reduce-scatter of GEMM+RS is a transfer and an accumulating
    matmul (reduce-scatter-in-matmul), over four a matmul and a transfer per peer and one
    kernel that sums the four pieces (reduce-scatter-ring, reduction-in-kernel); with both
    left out it stays; all match torch above."""
    module = BUILDERS["matmul_rs_through_bcast"](num_devices=world, dtype="f32")
    text = str(Program.compile(module, pipeline=COPY_ENGINE).host)
    assert "hir.reduce_scatter" not in text and "hir.reduction" not in text
    assert ("hir.matmul accumulate" in text) == (world == 2)
    assert ("_reduction_0 ins(%slice, %slice_1, %slice_2, %slice_3 :" in text) == (world > 2)
    # One send per peer, in the first chunk and in the loop (copy-engine-pipelining peels it).
    assert text.count("hir.send") == 2 * (world - 1)
    separate = str(Program.compile(module, pipeline=SEPARATE_REDUCTION).host)
    assert "hir.reduce_scatter" in separate and "hir.send" not in separate


def outputs_of_runs(
    program: Program, communicator: Communicator, runs: list[list[torch.Tensor]]
) -> list[torch.Tensor]:
    """`program`'s output on this rank for each of `runs` (whole inputs, sharded here), each run
    on poisoned allocations (a later one reusing the earlier's symmetric buffers); the
    inputs are left as they were."""
    outputs = []
    for whole in runs:
        local = [shard(x, t, communicator.rank).to(communicator.device) for x, t in zip(whole, program.input_types)]
        before = [x.clone() for x in local]
        with poisoned_allocations():
            (output,) = program.run(local, communicator)
        assert all(torch.equal(a, b) for a, b in zip(local, before)), f"@{program.host.sym_name.data} changed its inputs"
        outputs.append(output.cpu())
    return outputs


def assert_piece(output: torch.Tensor, piece: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, where: str):
    """`output`, a rank's, holds `piece` of plain torch's `expected` (in double), within `dtype`'s
    tolerance of expected's largest |value|."""
    tolerance = TOLERANCE[dtype] * expected.abs().max().item()
    torch.testing.assert_close(
        output.double().reshape(piece.shape), piece, rtol=0, atol=tolerance, msg=lambda m: f"{where}: {m}"
    )


MATMUL_RS_ON_DEVICES_1_2 = f"""
!x = !fusion.tensor<[{S}, 2, 2, {M}, {K}], f32, mesh = [1, 2], axes = [_, didx, _, _, _]>
!w = !fusion.tensor<[2, 1, {K}, {N}], f32, mesh = [1, 2], axes = [didx, _, _, _]>
!partial = !fusion.tensor<[{S}, 2, 2, {M}, {N}], f32, mesh = [1, 2], axes = [stream, didx, _, _, _]>
!y = !fusion.tensor<[{S}, 2, {M}, {N}], f32, mesh = [1, 2], axes = [stream, didx, _, _]>
func.func @matmul_rs(%x: !x, %w: !w) -> !y {{
  %partial = fusion.matmul %x, %w : (!x, !w) -> !partial
  %y = fusion.sum %partial [1] : !partial -> !y
  func.return %y : !y
}}
"""
"""GEMM+RS as benchmarks/overlap.py builds it, on devices 1 and 2 of a world of three."""


def run_matmul_rs_on_devices_1_2(whole: list[torch.Tensor]) -> torch.Tensor:
    program = Program.compile(MATMUL_RS_ON_DEVICES_1_2, pipeline=COPY_ENGINE)
    return outputs_of_runs(program, Communicator.from_env(), [whole])[0]


@needs_world(3)
def test_the_reduction_in_the_gemm_on_a_team_that_is_not_devices_0_and_1():
    """Devices 1 and 2 exchange their peer's rows and add their own in the GEMM; device 0,
    outside the mesh, takes no part; the result is plain torch's."""
    assert "hir.matmul accumulate" in str(Program.compile(MATMUL_RS_ON_DEVICES_1_2, pipeline=COPY_ENGINE).host)
    generator = torch.Generator().manual_seed(5)
    whole = [torch.randn(S, 2, 2, M, K, generator=generator), torch.randn(2, 1, K, N, generator=generator)]
    per_rank = run_on_local_ranks(run_matmul_rs_on_devices_1_2, 3, whole)
    x, w = (t.double() for t in whole)
    expected = torch.einsum("sdemk,dkn->semn", x, w[:, 0])
    for rank, output in enumerate(per_rank[1:], start=1):
        assert_piece(output, expected[:, rank - 1], expected, torch.float32, f"rank {rank}")


MATMUL_RS_ON_DEVICES_1_TO_3 = f"""
!x = !fusion.tensor<[{S}, 3, 3, {M}, {K}], f32, mesh = [1, 2, 3], axes = [_, didx, _, _, _]>
!w = !fusion.tensor<[3, 3, {K}, {N}], f32, mesh = [1, 2, 3], axes = [didx, _, _, _]>
!partial = !fusion.tensor<[{S}, 3, 3, {M}, {N}], f32, mesh = [1, 2, 3], axes = [stream, didx, _, _, _]>
!y = !fusion.tensor<[{S}, 3, {M}, {N}], f32, mesh = [1, 2, 3], axes = [stream, didx, _, _]>
func.func @matmul_rs(%x: !x, %w: !w) -> !y {{
  %partial = fusion.matmul %x, %w : (!x, !w) -> !partial
  %y = fusion.sum %partial [1] : !partial -> !y
  func.return %y : !y
}}
"""
"""GEMM+RS on devices 1 to 3 of a world of four, W with one slice per destination."""


def run_matmul_rs_on_devices_1_to_3(runs: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Both runs of the ring on this rank, on new inputs (`outputs_of_runs`)."""
    program = Program.compile(MATMUL_RS_ON_DEVICES_1_TO_3, pipeline=COPY_ENGINE)
    return outputs_of_runs(program, Communicator.from_env(), runs)


@needs_world(4)
def test_the_ring_of_destinations_on_three_devices_that_are_not_devices_0_to_2():
    """Devices 1 to 3 send each other their rows step by step, with W sliced per
    destination too; device 0, outside the mesh, takes no part; both runs give plain
    torch's result."""
    text = str(Program.compile(MATMUL_RS_ON_DEVICES_1_TO_3, pipeline=COPY_ENGINE).host)
    assert text.count("hir.send") == 2 * 2 and "hir.reduce_scatter" not in text  # chunk 0 peeled
    generator = torch.Generator().manual_seed(6)
    whole = [
        [torch.randn(S, 3, 3, M, K, generator=generator), torch.randn(3, 3, K, N, generator=generator)]
        for _ in range(2)
    ]
    per_rank = run_on_local_ranks(run_matmul_rs_on_devices_1_to_3, 4, whole)
    for run, (x, w) in enumerate(whole):
        expected = torch.einsum("sdemk,dekn->semn", x.double(), w.double())
        for rank in (1, 2, 3):
            assert_piece(per_rank[rank][run], expected[:, rank - 1], expected, torch.float32, f"run {run}, rank {rank}")


def summed_matmuls_rs_program(world: int) -> str:
    """dx = dq @ wq + dk @ wk reduce-scattered over `world` devices (the input gradient of two
    projections, as a backward sums it), in S chunks."""
    d = tensor([S, world, world, M, K], "f32", list(range(world)), "_ didx _ _ _")
    w = tensor([world, 1, K, N], "f32", list(range(world)), "didx _ _ _")
    p = tensor([S, world, world, M, N], "f32", list(range(world)), "stream didx _ _ _")
    y = tensor([S, world, M, N], "f32", list(range(world)), "stream didx _ _")
    return f"""
func.func @summed_rs(%dq: {d}, %wq: {w}, %dk: {d}, %wk: {w}) -> {y} {{
  %q = fusion.matmul %dq, %wq : ({d}, {w}) -> {p}
  %k = fusion.matmul %dk, %wk : ({d}, {w}) -> {p}
  %s = fusion.add %q, %k : ({p}, {p}) -> {p}
  %y = fusion.sum %s [1] : {p} -> {y}
  func.return %y : {y}
}}
"""


def run_summed_matmuls_rs(world: int, runs: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Each run of the summed GEMM+RS on this rank (`outputs_of_runs`)."""
    program = Program.compile(summed_matmuls_rs_program(world), pipeline=COPY_ENGINE)
    return outputs_of_runs(program, Communicator.from_env(), runs)


@pytest.mark.parametrize("world", [pytest.param(w, id=f"w{w}", marks=needs_world(w)) for w in (2, 4)])
def test_a_reduce_scatter_of_summed_products_adds_them_in_the_gemms(world):
    """A sum of two matmuls' products, reduce-scattered (a backward's input gradient): over
    two devices in the GEMMs of the pair's exchange (reduce-scatter-in-matmul), over four
    in those of the ring of destinations (reduce-scatter-ring), with no add kernel left
    (over four, the one kernel launched sums the pieces received: reduction-in-kernel);
    both runs give plain torch's result."""
    text = str(Program.compile(summed_matmuls_rs_program(world), pipeline=COPY_ENGINE).host)
    launched = {line.split()[1] for line in text.splitlines() if "hir.launch_kernel" in line}
    assert "hir.reduce_scatter" not in text
    assert all("_reduction_" in callee for callee in launched) and len(launched) == (world > 2)
    assert "hir.matmul accumulate" in text and "hir.send" in text
    generator = torch.Generator().manual_seed(23)
    shapes = [(S, world, world, M, K), (world, 1, K, N)] * 2
    runs = [[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(2)]
    per_rank = run_on_local_ranks(run_summed_matmuls_rs, world, world, runs)
    for run, (dq, wq, dk, wk) in enumerate(runs):
        expected = matmul_rs(dq.double(), wq[:, 0].double()) + matmul_rs(dk.double(), wk[:, 0].double())
        for rank, outputs in enumerate(per_rank):
            assert_piece(outputs[run], expected[:, rank], expected, torch.float32, f"run {run}, rank {rank}")


def matmul_ar_program(dtype: str, mesh: list[int]) -> str:
    """GEMM+AR as benchmarks/overlap.py builds it, over `mesh`, every extent but the mesh's dynamic."""
    x = tensor(["?", 2, "?", "?"], dtype, mesh, "_ didx _ _")
    w = tensor([2, "?", "?"], dtype, mesh, "didx _ _")
    partial = tensor(["?", 2, "?", "?"], dtype, mesh, "stream didx _ _")
    y = tensor(["?", "?", "?"], dtype, mesh, "stream _ _")
    return f"""
func.func @matmul_ar(%x: {x}, %w: {w}) -> {y} {{
  %partial = fusion.matmul %x, %w : ({x}, {w}) -> {partial}
  %y = fusion.sum %partial [1] : {partial} -> {y}
  func.return %y : {y}
}}
"""


@functools.cache
def compiled_matmul_ar(dtype: str, mesh: tuple[int, ...], pipeline: str) -> Program:
    """GEMM+AR over `mesh` lowered with `pipeline`, once per process (its extents are dynamic)."""
    return Program.compile(matmul_ar_program(dtype, list(mesh)), pipeline=pipeline)


ALLREDUCE_IN_MATMUL = {
    "pipelined": COPY_ENGINE,
    "pool streams": "hir-lowering{backend=cuda copy_engine_pipelining=false}",
}
SUM_IN_THE_GEMM_CHUNKS = (1, 2, 3, 4, 5)
"""Chunk counts of the GEMM+AR runs: the odd ones end in a chunk that keeps its allreduce."""


def run_sum_in_the_gemm(mesh: list[int], cases: list[tuple[str, str, list[torch.Tensor]]]) -> list[list]:
    """On one rank: per (dtype, pipeline, whole inputs) case, the GEMM+AR's output of two runs
    on poisoned allocations (the second reusing the first's symmetric buffers)."""
    return sum_in_the_gemm_outputs(Communicator.from_env(), mesh, cases)


def sum_in_the_gemm_outputs(communicator: Communicator, mesh: list[int], cases: list[tuple]) -> list[list]:
    """`run_sum_in_the_gemm` with `communicator`."""
    return [
        outputs_of_runs(compiled_matmul_ar(dtype, tuple(mesh), pipeline), communicator, [whole, whole])
        for dtype, pipeline, whole in cases
    ]


def sum_in_the_gemm_cases(chunks: tuple[int, ...], dtypes: tuple[str, ...]) -> list[tuple]:
    """(dtype, pipeline, whole X [s, 2, M, K] and W [2, K, N]) for each chunk count s."""
    generator = torch.Generator().manual_seed(20)
    return [
        (dtype, pipeline, [torch.randn(shape, generator=generator).to(DTYPES[dtype]) for shape in shapes])
        for s in chunks
        for shapes in [((s, 2, M, K), (2, K, N))]
        for dtype in dtypes
        for pipeline in ALLREDUCE_IN_MATMUL.values()
    ]


def assert_sums_in_the_gemm(program: str, pipeline: str) -> None:
    """The lowered GEMM+AR adds in the GEMM, and only its odd last chunk has an allreduce."""
    text = str(Program.compile(program, pipeline=pipeline).host)
    assert "hir.matmul accumulate" in text and text.count("hir.allreduce") == 1, pipeline


def check_sum_in_the_gemm(cases, per_rank: list[list[list[torch.Tensor]]]) -> None:
    """Each member's output is plain torch's GEMM+AR, and the members' are the same bits: the
    sum of each chunk is made once, by one member's GEMM, and pulled by the other."""
    for i, (dtype, pipeline, (x, w)) in enumerate(cases):
        expected = matmul_ar(x.double(), w.double())
        tolerance = TOLERANCE[DTYPES[dtype]] * expected.abs().max().item()
        for run in range(2):
            where = f"{len(x)} chunk(s), {dtype}, {pipeline}, run {run}"
            for rank, outputs in enumerate(per_rank):
                torch.testing.assert_close(
                    outputs[i][run].double(),
                    expected,
                    rtol=0,
                    atol=tolerance,
                    msg=lambda m: f"{where}, member {rank}: {m}",
                )
            assert torch.equal(per_rank[0][i][run], per_rank[1][i][run]), f"{where}: the members differ"


@needs_world(2)
def test_the_sum_of_a_pairwise_matmul_allreduce_is_made_in_the_gemm():
    """Over two devices the GEMM+AR's allreduce becomes pairs of chunks, each member's plain
    GEMM of one pulled by its peer, whose accumulating GEMM of it makes the sum, pulled back
    (allreduce-in-matmul); an odd last chunk keeps its allreduce. Pipelined and on the pool
    streams, f32 and bf16, 1 to 5 chunks: plain torch's result, bitwise equal on both."""
    for pipeline in ALLREDUCE_IN_MATMUL.values():
        assert_sums_in_the_gemm(matmul_ar_program("f32", [0, 1]), pipeline)
    cases = sum_in_the_gemm_cases(SUM_IN_THE_GEMM_CHUNKS, tuple(DTYPES))
    check_sum_in_the_gemm(cases, run_on_local_ranks(run_sum_in_the_gemm, 2, [0, 1], cases))


@needs_world(3)
def test_the_sum_in_the_gemm_on_a_team_that_is_not_devices_0_and_1():
    """Devices 1 and 2 of a world of three pair their chunks; device 0, outside the mesh,
    takes no part; an even and an odd number of chunks."""
    assert_sums_in_the_gemm(matmul_ar_program("f32", [1, 2]), COPY_ENGINE)
    cases = sum_in_the_gemm_cases((3, 4), ("f32",))
    per_rank = run_on_local_ranks(run_sum_in_the_gemm, 3, [1, 2], cases)
    assert all(output.numel() == 0 for runs in per_rank[0] for output in runs), "device 0 holds a piece"
    check_sum_in_the_gemm(cases, per_rank[1:])


# --------------------------------------------------------------------------- #
# Every reduction op, in hand-written host programs                            #
# --------------------------------------------------------------------------- #

TORCH_REDUCTIONS = {"sum": torch.sum, "product": torch.prod, "max": torch.amax, "min": torch.amin}


@dataclass(frozen=True)
class ReductionCase:
    """A copy-engine allreduce or reduce-scatter of one reduction op over a world.

    `layout` says where the reduce-scatter's scattered axis lies: `outer` right after
    the reduced axis (each piece a contiguous block), `inner` the last axis (each piece
    strided). For an allreduce, whose teams of more than two cut the partial into one
    piece per member: `outer` has fewer elements than a team of four (one piece empty),
    `uneven` a number that four does not divide, and `inner` reads a strided view of
    its partial (one column of it) into a strided view of its output.
    """

    collective: str
    op: str
    world: int
    layout: str = "outer"
    dtype: str = "f32"

    @property
    def id(self) -> str:
        return f"{self.collective}-{self.op}-{self.layout}-{self.dtype}-w{self.world}"

    def types(self) -> tuple[str, str]:
        mesh, dtype = list(range(self.world)), self.dtype
        if self.collective == "allreduce":
            shape = {"outer": [3], "uneven": [5, 7], "inner": [5]}[self.layout]
            return (
                tensor([self.world, *shape], dtype, mesh=mesh, axes="didx" + " _" * len(shape)),
                tensor(shape, dtype, mesh=mesh),
            )
        if self.layout == "outer":
            return (
                tensor([self.world, self.world, 3], dtype, mesh=mesh, axes="didx _ _"),
                tensor([self.world, 3], dtype, mesh=mesh, axes="didx _"),
            )
        return (
            tensor([self.world, 3, self.world], dtype, mesh=mesh, axes="didx _ _"),
            tensor([3, self.world], dtype, mesh=mesh, axes="_ didx"),
        )

    def program(self, symmetric: str = "symmetric") -> str:
        partial, result = self.types()
        team = list(range(self.world))
        if self.layout == "inner" and self.collective == "allreduce":
            mesh, dtype = list(range(self.world)), self.dtype
            whole = tensor([self.world, 5, 2], dtype, mesh=mesh, axes="didx _ _")
            columns = tensor([5, 2], dtype, mesh=mesh)
            return f"""
        func.func @main(%x: {whole}) -> {result} {{
          %s = hir.allocate() {symmetric} : {whole}
          hir.copy ins(%x : {whole}) outs(%s : {whole})
          %c1 = arith.constant 1 : index
          %column = hir.alias_select %s[2 = %c1] : {whole} -> {partial}
          %y = hir.allocate() : {columns}
          %y_column = hir.alias_select %y[1 = %c1] : {columns} -> {result}
          %w = hir.allreduce %column into %y_column team {team} op {self.op} backend cuda : {partial}, {result}
          hir.wait %w
          %r = hir.allocate() : {result}
          hir.copy ins(%y_column : {result}) outs(%r : {result})
          func.return %r : {result}
        }}"""
        return f"""
        func.func @main(%x: {partial}) -> {result} {{
          %s = hir.allocate() {symmetric} : {partial}
          hir.copy ins(%x : {partial}) outs(%s : {partial})
          %y = hir.allocate() : {result}
          %w = hir.{self.collective} %s into %y team {team} op {self.op} backend cuda : {partial}, {result}
          hir.wait %w
          func.return %y : {result}
        }}"""

    def input(self) -> torch.Tensor:
        """The unsharded partials (the reduced axis first), the same in every process."""
        generator = torch.Generator().manual_seed(sum(map(ord, self.id)))
        if self.collective == "allreduce":
            shape = (self.world, *{"outer": (3,), "uneven": (5, 7), "inner": (5, 2)}[self.layout])
        elif self.layout == "outer":
            shape = (self.world, self.world, 3)
        else:
            shape = (self.world, 3, self.world)
        return torch.randn(shape, generator=generator).to(DTYPES[self.dtype])

    def expected(self) -> torch.Tensor:
        reduced = TORCH_REDUCTIONS[self.op](self.input().double(), 0)
        if self.collective == "allreduce" and self.layout == "inner":
            return reduced[:, 1]
        return reduced


REDUCTION_CASES = [
    ReductionCase(collective, op, world, layout)
    for world in (2, 4)
    for collective, layouts in (("allreduce", ("outer", "uneven", "inner")), ("reduce_scatter", ("outer", "inner")))
    for layout in layouts
    for op in TORCH_REDUCTIONS
] + [ReductionCase("allreduce", "sum", world, dtype="bf16") for world in (2, 4)]
"""Every op in f32; the allreduce's sum in bf16 too, whose replicas must be bitwise equal as well."""


def run_reductions(cases: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
    """On one rank: each program run on this rank's shard of its input, allocations poisoned."""
    communicator = Communicator.from_env()
    outputs = []
    for text, whole in cases:
        program = Program.compile(text, pipeline=None)
        local = shard(whole, program.input_types[0], communicator.rank).to(communicator.device)
        with poisoned_allocations():
            (output,) = program.run([local], communicator)
        outputs.append(output.cpu())
    return outputs


@functools.cache
def reductions_of_world(world: int) -> dict[str, list[torch.Tensor]]:
    """Every reduction case of a world size, run in one spawn; case id -> per-rank outputs."""
    cases = [c for c in REDUCTION_CASES if c.world == world]
    per_rank = run_on_local_ranks(run_reductions, world, [(c.program(), c.input()) for c in cases])
    return {case.id: [outputs[i] for outputs in per_rank] for i, case in enumerate(cases)}


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=needs_world(c.world)) for c in REDUCTION_CASES]
)
def test_copy_engine_reductions_of_every_op(case: ReductionCase):
    output_type = Program.compile(case.program(), pipeline=None).output_types[0]
    outputs = reductions_of_world(case.world)[case.id]
    for rank, output in enumerate(outputs):
        piece = shard(case.expected(), output_type, rank)
        # bf16 inputs are summed in float32 and rounded once: within bf16's tolerance.
        rounding = {}
        if case.dtype == "bf16":
            rounding = {"rtol": 0, "atol": TOLERANCE[torch.bfloat16] * piece.abs().max().item()}
        torch.testing.assert_close(output.double(), piece, **rounding, msg=lambda m: f"rank {rank}: {m}")
    if case.collective == "allreduce":
        # Every member reduces the same operands in the same order: the replicas are bitwise equal.
        assert all(torch.equal(output, outputs[0]) for output in outputs)


def allreduce_traffic(text: str, runs: list[torch.Tensor]) -> list[tuple[int, int, int, torch.Tensor]]:
    """On one rank: per run of `text` on its shard of each input, the elements it read from
    its peers (pulled from their mappings on GPUs, received as messages on the CPU), the
    symmetric buffers made, the bytes of the staging buffers the peers' pieces landed in,
    and the output."""
    communicator = Communicator.from_env()
    engine = communicator.copy_engine
    counts = {"read": 0, "made": 0, "staged": 0}
    peer_view, batch, allocate = SymmetricBuffer.peer_view, dist.batch_isend_irecv, engine.allocate
    staging = engine._staging

    def counted_peer_view(buffer, view, device):
        counts["read"] += view.numel()
        return peer_view(buffer, view, device)

    def counted_batch(operations):
        counts["read"] += sum(o.tensor.numel() for o in operations if o.op is dist.irecv)
        return batch(operations)

    def counted_allocate(*args):
        counts["made"] += 1
        return allocate(*args)

    def counted_staging(*args):
        made = staging(*args)
        counts["staged"] += made.untyped_storage().nbytes()
        return made

    SymmetricBuffer.peer_view, dist.batch_isend_irecv, engine.allocate, engine._staging = (
        counted_peer_view,
        counted_batch,
        counted_allocate,
        counted_staging,
    )
    program = Program.compile(text, pipeline=None)
    results = []
    for whole in runs:
        counts.update(read=0, made=0, staged=0)
        local = shard(whole, program.input_types[0], communicator.rank).to(communicator.device)
        with poisoned_allocations():
            (output,) = program.run([local], communicator)
        results.append((counts["read"], counts["made"], counts["staged"], output.cpu()))
    return results


PIECES_OF_35 = (9, 9, 9, 8)
"""A partial of 35 elements in a team of four, in pieces (`AllreducePieces`)."""


@pytest.mark.parametrize("world", [pytest.param(w, id=f"w{w}", marks=needs_world(w)) for w in (2, 4)])
def test_an_allreduce_reads_and_stages_what_a_ring_moves(world):
    """Of a partial of 35 elements, per run: a pair reads its own in place (`reduction`),
    so it pulls the peer's 35 elements into a staging buffer of those alone. In a team of
    four each member reduces one piece and gathers the others' (`AllreducePieces`), pieces
    of 9, 9, 9 and 8: the member at position p reads 3 peers' piece p into a slot per
    member, then the 3 other reduced pieces, 35 + 2 n_p elements where pulling the whole
    partials would read 105; the scratch it reduces into is made by the first run alone,
    beside the program's symmetric partial."""
    case = ReductionCase("allreduce", "sum", world, layout="uneven")
    generator = torch.Generator().manual_seed(11)
    runs = [torch.randn(world, 5, 7, generator=generator) for _ in range(2)]
    per_rank = run_on_local_ranks(allreduce_traffic, world, case.program(), runs)
    for rank, results in enumerate(per_rank):
        if world == 2:
            read, made, staged = 35, 1, 35 * 4
        else:
            piece = PIECES_OF_35[rank]
            read, made, staged = 35 + 2 * piece, 2, world * piece * 4
        assert [(r, m, s) for r, m, s, _ in results] == [(read, made, staged), (read, 0, staged)]
        for whole, (*_, output) in zip(runs, results):
            torch.testing.assert_close(output, whole.sum(0), msg=lambda m: f"rank {rank}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("op", list(REDUCE_OPS.values()), ids=list(REDUCE_OPS))
def test_a_pair_reduces_in_place_to_the_same_bits_as_the_slots(op, dtype):
    """A team of two reduces the own piece, read in place, with the peer's in one elementwise
    op; that gives the bits of copying it into its slot and reducing the slots, in either
    member's order."""
    generator = torch.Generator().manual_seed(3)
    pieces = (torch.randn(2, 4, 6, generator=generator) * 50).to(dtype)
    outputs = []
    for own in (0, 1):
        staging = torch.full_like(pieces, 9)
        staging[1 - own] = pieces[1 - own]
        for in_place in (True, False):
            output = torch.full((4, 6), 7, dtype=dtype)
            reduction(staging.clone(), own, pieces[own], output, op, in_place=in_place)()
            outputs.append(output)
    assert all(torch.equal(output, outputs[0]) for output in outputs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("op", list(REDUCE_OPS.values()), ids=list(REDUCE_OPS))
def test_four_members_reduce_their_pieces_in_team_order_into_a_poisoned_output(op, dtype, device):
    """A team of four reduces the three pieces its peers sent and its own in team order: on
    a GPU a generated kernel reads the own piece where it lies (its staging slot, left
    poisoned, is not read), on the CPU (and for an op no kernel computes) the own piece is
    copied into its slot and ATen reduces the slots; against the op on the four pieces."""
    generator = torch.Generator().manual_seed(5)
    pieces = (torch.randn(4, 37, 6, generator=generator) * 50).to(device=device, dtype=dtype)
    expected = {"sum": lambda p: p.double().sum(0), "max": lambda p: p.amax(0), "min": lambda p: p.amin(0),
                "product": lambda p: p.double().prod(0)}
    name = next(n for n, o in REDUCE_OPS.items() if o == op)
    for own in (0, 2):
        staging = pieces.clone()
        staging[own] = 9
        output = torch.full((37, 6), 7, dtype=dtype, device=device)
        reduction(staging, own, pieces[own].clone(), output, op)()
        torch.testing.assert_close(output, expected[name](pieces).to(dtype), msg=lambda m: f"own {own}: {m}")


# --------------------------------------------------------------------------- #
# Preparing: what the runtime refuses before anything runs                     #
# --------------------------------------------------------------------------- #

SHARD = tensor([2, 3], mesh=[0, 1], axes="didx _")
FULL = tensor([2, 3], mesh=[0, 1])
ROW = tensor([3], mesh=[0, 1])


def allgather_program(symmetric: str, shards: str = SHARD, gathered: str = FULL) -> str:
    """An allgather in the team [0, 1] of a copy of the input, symmetric or not."""
    return f"""
    func.func @main(%x: {shards}) -> {gathered} {{
      %s = hir.allocate() {symmetric} : {shards}
      hir.copy ins(%x : {shards}) outs(%s : {shards})
      %y = hir.allocate() : {gathered}
      %w = hir.allgather %s into %y team [0, 1] backend cuda : {shards}, {gathered}
      hir.wait %w
      func.return %y : {gathered}
    }}"""


def exchange_program(batch: str) -> str:
    return f"""
    func.func @main(%x: {SHARD}) -> {FULL} {{
      %c0 = arith.constant 0 : index
      %peer = hir.device_index
      %s = hir.allocate() symmetric : {SHARD}
      hir.copy ins(%x : {SHARD}) outs(%s : {SHARD})
      %y = hir.allocate() : {FULL}
      %slot = hir.alias_select %y[0 = %c0] : {FULL} -> {ROW}
      {batch}
      func.return %y : {FULL}
    }}"""


RECV = f"%r = hir.recv %slot from %peer backend cuda : {ROW}"
SEND = f"%t = hir.send %s to %peer backend cuda : {SHARD}"
SEND_TO_DEVICE_0 = f"%t = hir.send %s to %c0 backend cuda : {SHARD}"


@pytest.mark.parametrize(
    "program,message",
    [
        *(
            (
                program,
                f"hir.{collective} with backend cuda lets its peers read its input, which must "
                "therefore be (a view of) a buffer of 'hir.allocate symmetric'",
            )
            for collective, program in [
                ("allgather", allgather_program("")),
                *(
                    (collective, ReductionCase(collective, "sum", 2).program(symmetric=""))
                    for collective in ("allreduce", "reduce_scatter")
                ),
            ]
        ),
        (
            exchange_program(f"{RECV}\n{SEND}"),
            "hir.recv with backend cuda must sit between hir.start_coalescing and hir.end_coalescing",
        ),
        (
            exchange_program(f"hir.start_coalescing\n{RECV}\n%e = hir.end_coalescing"),
            "hir.recv with backend cuda pairs with exactly one hir.send with backend cuda of the same "
            "peer in its batch",
        ),
        (
            exchange_program(
                f"hir.start_coalescing\n{RECV}\n%u = hir.send %x to %peer backend cuda : {SHARD}\n"
                "%e = hir.end_coalescing"
            ),
            "hir.send with backend cuda lets its peers read its buffer, which must therefore be",
        ),
        (
            exchange_program(f"hir.start_coalescing\n{SEND}\n%e = hir.end_coalescing"),
            "hir.send with backend cuda pairs with exactly one hir.recv",
        ),
        (
            exchange_program(
                f"hir.start_coalescing\n{RECV}\n{SEND_TO_DEVICE_0}\n"
                f"%u = hir.send %s to %c0 backend cuda : {SHARD}\n%e = hir.end_coalescing"
            ),
            "hir.recv with backend cuda pairs with exactly one hir.send with backend cuda of the same "
            "peer in its batch, or else with the only one of its batch (the copy engines read, on the "
            "peer, the buffer this rank sends in the batch); the batch has 0 of the same peer and 2 in all",
        ),
    ],
    ids=[
        *(f"{collective}-not-symmetric" for collective in ("allgather", "allreduce", "reduce_scatter")),
        "recv-outside-a-batch",
        "recv-without-send",
        "send-not-symmetric",
        "send-alone",
        "recv-between-two-sends-to-another-peer",
    ],
)
def test_preparing_refuses_what_the_copy_engines_cannot_do(program, message):
    with pytest.raises(HostirError, match=r"^<string>:\d+:\d+: error: ") as error:
        Program.compile(program, pipeline=None)
    assert message in str(error.value)


TEAM_SMALLER_THAN_ITS_BUFFER = allgather_program(
    "symmetric", tensor([3, 2], mesh=[0, 1, 2], axes="didx _"), tensor([2, 2], mesh=[0, 1, 2])
)
"""An allgather in the team [0, 1] of a buffer of the devices 0, 1 and 2."""


def run_team_smaller_than_its_buffer() -> str | None:
    """On one rank: the error of the program above, None if it ran."""
    communicator = Communicator.from_env()
    program = Program.compile(TEAM_SMALLER_THAN_ITS_BUFFER, pipeline=None)
    try:
        program.run([torch.ones(1, 2, device=communicator.device)], communicator)
    except HostirError as error:
        return str(error)
    return None


@needs_world(3)
def test_an_allgather_whose_team_is_not_its_buffers_mesh_is_refused():
    """Every member of the buffer's mesh takes part in its barriers: a team of two reading a
    buffer of three would wait for the third forever. The team's members refuse it; the
    device outside the team has nothing to do."""
    errors = run_on_local_ranks(run_team_smaller_than_its_buffer, 3)
    for rank in (0, 1):
        assert errors[rank] is not None and (
            "an allgather with backend cuda in the team [0, 1] reads a symmetric buffer of the mesh "
            "[0, 1, 2]: the team must be the buffer's mesh"
        ) in errors[rank], errors[rank]
    assert errors[2] is None


def test_a_recv_pairs_with_the_send_of_its_batch_to_another_peer():
    """The ring order of the point-to-point allgather: a batch receives from one peer and
    sends to another; the recv reads, on its peer, the buffer this rank sends."""
    program = exchange_program(f"hir.start_coalescing\n{RECV}\n{SEND_TO_DEVICE_0}\n%e = hir.end_coalescing")
    host = Program.compile(program, pipeline=None).host
    (recv,) = (op for op in host.walk() if isinstance(op, hir.RecvOp))
    (send,) = (op for op in host.walk() if isinstance(op, hir.SendOp))
    assert send.peer is not recv.peer
    assert _partner(recv, hir.SendOp) is send and _partner(send, hir.RecvOp) is recv


def test_a_recv_pairs_with_the_send_to_its_own_peer_before_any_other():
    """A batch that also sends to another device: the recv reads, on its peer, the buffer
    this rank sends to that same peer, not the other one."""
    program = exchange_program(
        f"hir.start_coalescing\n{RECV}\n{SEND_TO_DEVICE_0.replace('%t', '%u')}\n{SEND}\n%e = hir.end_coalescing"
    )
    host = Program.compile(program, pipeline=None).host
    (recv,) = (op for op in host.walk() if isinstance(op, hir.RecvOp))
    (to_peer,) = (op for op in host.walk() if isinstance(op, hir.SendOp) and op.peer is recv.peer)
    assert _partner(recv, hir.SendOp) is to_peer


def test_a_symmetric_buffer_is_made_once_per_shape_and_reused_by_every_run():
    """The runtime hands each run the same symmetric buffer (hence the lowering never
    returns one); an output in it is the caller's copy, which the next run leaves alone."""
    dynamic = tensor(["?", 3])
    program = Program.compile(
        f"""
        func.func @main(%x: {dynamic}) -> {dynamic} {{
          %n = hir.dim %x, 0 : {dynamic}
          %s = hir.allocate(%n) symmetric : {dynamic}
          hir.copy ins(%x : {dynamic}) outs(%s : {dynamic})
          func.return %s : {dynamic}
        }}""",
        pipeline=None,
    )
    (allocate,) = (op for op in program.host.walk() if isinstance(op, hir.AllocateOp))
    made = SymmetricAllocation.of(allocate, [0], torch.float32).buffers
    communicator = Communicator.single(torch.device("cpu"))

    def buffer(rows: int) -> int:
        return made[(communicator, (rows, 3))].tensor.data_ptr()

    first, second, other_shape = (torch.randn(n, 3) for n in (2, 2, 5))
    (a,) = program.run([first], communicator)
    held = buffer(2)
    (b,) = program.run([second], communicator)
    assert buffer(2) == held and len(made) == 1
    assert torch.equal(a, first) and torch.equal(b, second) and a.data_ptr() != held
    (c,) = program.run([other_shape], communicator)
    assert len(made) == 2 and buffer(5) != held and torch.equal(c, other_shape)
    # A traced run prepares a copy of the program; it gets the same buffer too (making
    # another would rendezvous again, a collective that waits for the GPU).
    (traced,), _ = trace_run(program, [first], communicator)
    assert len(made) == 2 and buffer(2) == held and torch.equal(traced, first)


def allocations_of_teams(plan: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> list[str]:
    """On one rank: the symmetric allocations of `plan` ((team, shape), in order) whose team
    holds this rank; what each gave, or the error."""
    engine = Communicator.from_env().copy_engine
    made = []
    try:
        for team, shape in plan:
            if dist.get_rank() in team:
                buffer = engine.allocate(shape, torch.float32, team, "an allocation")
                made.append(f"{list(team)}: {list(buffer.tensor.shape)}")
        return made
    except HostirError as error:
        return [*made, str(error)]


@needs_world(4)
def test_teams_that_leave_out_ranks_number_their_symmetric_allocations_each_their_own():
    """Ranks 1 to 3 make symmetric buffers of their team first, then every rank one of the
    whole world, then a pair: each team's allocations are counted apart (torch's symmetric
    memory counts every rendezvous of the process alike, so there rank 0 came to the
    world's with a count three short and the others waited for it forever)."""
    plan = [((1, 2, 3), (2, 3)), ((1, 2, 3), (4,)), ((1, 2, 3), (1, 5)), ((0, 1, 2, 3), (1, 2)), ((0, 2), (3,))]
    per_rank = run_on_local_ranks(allocations_of_teams, 4, plan, timeout_s=120)
    assert per_rank[0] == ["[0, 1, 2, 3]: [1, 2]", "[0, 2]: [3]"]
    assert per_rank[1] == per_rank[3] == ["[1, 2, 3]: [2, 3]", "[1, 2, 3]: [4]", "[1, 2, 3]: [1, 5]", "[0, 1, 2, 3]: [1, 2]"]
    assert per_rank[2] == [*per_rank[1], "[0, 2]: [3]"]


def different_allocations(timeout_s: float) -> list[str]:
    """Rank 0 allocates a [4] buffer, rank 1 a [5] one; rank 2 (of a world of 3) none, and
    waits until the others are done."""
    communicator = Communicator(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), "gloo", timeout_s)
    began = time.monotonic()
    try:
        if communicator.rank < 2:
            communicator.copy_engine.allocate((4 + communicator.rank,), torch.float32, [0, 1, 2], "x")
        return ["allocated"]
    except HostirError as error:
        return [str(error), f"{time.monotonic() - began:.1f}"]


@needs_world(3)
def test_members_that_disagree_on_a_symmetric_allocation_fail_at_once_naming_it_and_the_ranks():
    """Ranks 0 and 1 allocate different shapes; rank 2 never comes. Every member of the team
    fails, each with the allocation and the ranks, before any memory is mapped: the two
    that came, once the third's absence passes the timeout; none hangs."""
    per_rank = run_on_local_ranks(different_allocations, 3, 2.0)
    assert per_rank[2] == ["allocated"]
    for rank in (0, 1):
        message, _ = per_rank[rank]
        assert message == (
            "error: symmetric allocation #0 of the team [0, 1, 2] (x: "
            f"[{4 + rank}] x float32): rank(s) [2] did not reach it within 2 s"
        )


def disagreeing_members() -> list[str]:
    communicator = Communicator.from_env()
    began = time.monotonic()
    try:
        shape = (4,) if communicator.rank == 0 else (5,)
        communicator.copy_engine.allocate(shape, torch.float32, [0, 1, 2], f"'hir.allocate' of rank {communicator.rank}")
        return ["allocated"]
    except HostirError as error:
        return [str(error), time.monotonic() - began]


@needs_world(3)
def test_members_that_allocate_differently_all_fail_at_once_naming_each_ranks_allocation():
    per_rank = run_on_local_ranks(disagreeing_members, 3)
    for message, seconds in per_rank:
        assert message == (
            "error: the members of the team [0, 1, 2] disagree on their symmetric allocation #0: "
            "rank(s) [0] allocate 'hir.allocate' of rank 0: [4] x float32; "
            "rank(s) [1] allocate 'hir.allocate' of rank 1: [5] x float32; "
            "rank(s) [2] allocate 'hir.allocate' of rank 2: [5] x float32. The members of a team "
            "must make the same symmetric allocations in the same order, as ranks that run the same program do"
        )
        assert seconds < 30, "no member waits for a timeout: all of them came"


# --------------------------------------------------------------------------- #
# Inputs in symmetric memory (hir.symmetric), read in place                    #
# --------------------------------------------------------------------------- #


def symmetric_ag_matmul(world: int, dtype: str, first: int = 0) -> ModuleOp:
    """A [DIDx(D), M, K] in symmetric memory @ B [K, N] -> [Stream(D), M, N] on devices
    `first` .. `world - 1`: the point-to-point AG+matmul whose gathered operand the caller
    passes symmetric."""
    mesh = range(first, world)
    fb = FusionBuilder("symmetric_ag_matmul")
    a = fb.input([len(mesh), None, K], dtype, mesh=mesh, axes=["didx", "_", "_"], symmetric=True)
    out = fb.matmul(a, fb.input([K, N], dtype, mesh=mesh))
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


SYMMETRIC_PIPELINES = (P2P_COPY_ENGINE, COPY_ENGINE, NCCL)
"""The ring and the collective on the copy engines, and NCCL, which ignores `hir.symmetric`."""


def run_symmetric_inputs(world: int, whole: list[torch.Tensor]) -> list[list[object]]:
    """On one rank: per pipeline, two runs of `symmetric_ag_matmul` on inputs placed by
    `with_symmetric_inputs`, each output, and whether the caller's inputs came back unchanged;
    then, once, the error of a run given the symmetric input as a view of one."""
    communicator = Communicator.from_env()
    results = []
    for pipeline in SYMMETRIC_PIPELINES:
        program = Program.compile(symmetric_ag_matmul(world, "f32"), pipeline=pipeline)
        local = [
            shard(x, t, communicator.rank).to(communicator.device) for x, t in zip(whole, program.input_types)
        ]
        placed = program.with_symmetric_inputs(local, communicator)
        before = [x.clone() for x in placed]
        outputs = []
        for _ in range(2):
            with poisoned_allocations():
                (output,) = program.run(placed, communicator)
            outputs.append(output.cpu())
        unchanged = all(torch.equal(a, b) for a, b in zip(placed, before))
        results.append([outputs, unchanged])
    program = Program.compile(symmetric_ag_matmul(world, "f32"), pipeline=P2P_COPY_ENGINE)
    (x, w) = program.with_symmetric_inputs(
        [shard(x, t, communicator.rank).to(communicator.device) for x, t in zip(whole, program.input_types)],
        communicator,
    )
    view = x.view(-1)[: x.numel() - K].view(x.shape[0], -1, K) if communicator.rank == 1 else x
    try:
        program.run([view, w], communicator)
        results.append(None)
    except HostirError as error:
        results.append(str(error))
    return results


@needs_world(2)
def test_an_input_in_symmetric_memory_is_read_in_place_by_the_copy_engines():
    """`hir.symmetric`: the lowering copies nothing into symmetric memory, the runtime reads the
    caller's tensor where it is (a view, which peers would read at another offset, is refused
    on every rank before anything moves), and the result is plain torch's."""
    world, rows = 2, 3
    for pipeline in SYMMETRIC_PIPELINES[:2]:
        host = Program.compile(symmetric_ag_matmul(world, "f32"), pipeline=pipeline).host
        assert not any(isinstance(op, hir.CopyOp) for op in host.walk() if op.parent_op() is host), pipeline
        assert not any(isinstance(op, hir.AllocateOp) and op.symmetric for op in host.walk()), pipeline
    generator = torch.Generator().manual_seed(7)
    whole = [torch.randn(world, rows, K, generator=generator), torch.randn(K, N, generator=generator)]
    per_rank = run_on_local_ranks(run_symmetric_inputs, world, world, whole)
    expected = matmul(*(x.double() for x in whole))
    for rank, results in enumerate(per_rank):
        for pipeline, (outputs, unchanged) in zip(SYMMETRIC_PIPELINES, results):
            assert unchanged, f"rank {rank}, {pipeline}: the inputs changed"
            for output in outputs:
                tolerance = 1e-5 * expected.abs().max().item()
                torch.testing.assert_close(output.double(), expected, rtol=0, atol=tolerance)
    assert per_rank[1][-1].startswith(
        "error: input #0 of @symmetric_ag_matmul on rank 1: it is marked 'hir.symmetric', so it must be a whole "
        "tensor of Program.symmetric_empty for the mesh [0, 1], which peers read in place; got a view of one"
    )
    assert per_rank[0][-1].startswith("error: the inputs of @symmetric_ag_matmul are wrong on another rank")


def run_symmetric_input_on_upper_mesh(world: int, whole: list[torch.Tensor]) -> tuple[int, torch.Tensor]:
    """On one rank: the placed symmetric input's size, and the output of a run on devices 1 .. D-1."""
    communicator = Communicator.from_env()
    program = Program.compile(symmetric_ag_matmul(world, "f32", first=1), pipeline=P2P_COPY_ENGINE)
    local = [
        shard(x, t, communicator.rank).to(communicator.device) for x, t in zip(whole, program.input_types)
    ]
    placed = program.with_symmetric_inputs(local, communicator)
    with poisoned_allocations():
        (output,) = program.run(placed, communicator)
    return placed[0].numel(), output.cpu()


@needs_world(3)
def test_a_rank_outside_a_symmetric_inputs_mesh_holds_a_placeholder():
    """A rank outside the mesh of an input marked `hir.symmetric` gets an empty placeholder
    from `symmetric_empty`, which the input check accepts; the mesh's ranks compute torch's result."""
    world, rows = 3, 2
    generator = torch.Generator().manual_seed(11)
    whole = [torch.randn(world - 1, rows, K, generator=generator), torch.randn(K, N, generator=generator)]
    per_rank = run_on_local_ranks(run_symmetric_input_on_upper_mesh, world, world, whole)
    expected = matmul(*(x.double() for x in whole))
    assert per_rank[0][0] == 0 and all(size == rows * K for size, _ in per_rank[1:])
    tolerance = 1e-5 * expected.abs().max().item()
    for rank, (_, output) in enumerate(per_rank[1:], start=1):
        where = f"rank {rank}"
        torch.testing.assert_close(output.double(), expected, rtol=0, atol=tolerance, msg=lambda m: f"{where}: {m}")


def test_symmetric_empty_is_for_inputs_marked_symmetric():
    program = Program.compile(symmetric_ag_matmul(1, "f32"), pipeline=P2P_COPY_ENGINE)
    communicator = Communicator.single(torch.device("cpu"))
    with pytest.raises(HostirError, match=r"input #1 of @symmetric_ag_matmul is not marked 'hir.symmetric'"):
        program.symmetric_empty(1, (K, N), communicator)
    with pytest.raises(HostirError, match=r"must be a whole tensor of Program.symmetric_empty .* got memory"):
        program.run([torch.randn(1, 2, K), torch.randn(K, N)], communicator)


# --------------------------------------------------------------------------- #
# GPUs: the copies are memcpys on the copy stream, beside the GEMMs             #
# --------------------------------------------------------------------------- #


CHUNKS = 4

PROFILED = {
    "ag_matmul": [(CHUNKS, 1, 2048, 4096), (4096, 4096)],
    "matmul_rs_through_bcast": [(CHUNKS, 1, 2, 2048, 2048), (1, 2048, 4096)],
}
"""Each rank's input shapes on 2 GPUs: CHUNKS chunks whose GEMMs take long enough to see overlap."""

HOLD_MS = 50.0
"""GPU idle time queued before the profiled run: longer than the host takes to issue it."""


def profile(name: str) -> dict:
    """On one GPU rank: the kernels and memcpys of one profiled run of a large copy-engine fusion."""
    communicator = Communicator.from_env()
    module = REFERENCE_FUSIONS[name](num_devices=2, dtype="bf16")
    program = Program.compile(module, pipeline=COPY_ENGINE)
    generator = torch.Generator().manual_seed(communicator.rank)
    inputs = [
        torch.randn(shape, generator=generator).bfloat16().to(communicator.device)
        for shape in PROFILED[name]
    ]
    program.run(inputs, communicator)  # warm-up: rendezvous, cuBLAS handles
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        # The GPU starts once the host has issued the whole run (profiling slows the host):
        # what overlaps is then what the streams allow, not what the host's pace leaves.
        hold_current_stream(communicator.device, HOLD_MS)
        program.run(inputs, communicator)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.json")
        profile.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace)["traceEvents"]
    return {
        category: [
            (event["name"], event["args"]["stream"], event["ts"], event["ts"] + event["dur"])
            for event in events
            if event.get("cat") == category and "stream" in event.get("args", {})
        ]
        for category in ("kernel", "gpu_memcpy")
    }


needs_two_gpus = pytest.mark.skipif(
    DEVICE != "cuda" or torch.cuda.device_count() < 2, reason="needs 2 GPUs (peer memory)"
)


@pytest.mark.gpu_timing
@needs_two_gpus
@pytest.mark.parametrize("name", list(PROFILED))
def test_copies_are_memcpys_on_their_own_stream_beside_the_gemms(name):
    """The pulls are memcpys on the copy stream, which runs no kernel at all (its signals are
    stream memory operations; a reduce-scatter's reduction runs on the waiting stream), and
    they overlap the GEMMs."""
    for rank, trace in enumerate(run_on_local_ranks(profile, 2, name)):
        kernels, memcpys = trace["kernel"], trace["gpu_memcpy"]
        kernel_streams = {stream for _, stream, *_ in kernels}
        copy_streams = {stream for _, stream, *_ in memcpys} - kernel_streams
        assert len(copy_streams) == 1, f"rank {rank}: memcpys on streams that run no kernel: {copy_streams}"
        (copy_stream,) = copy_streams
        pulls = [m for m in memcpys if m[1] == copy_stream]
        assert (
            len(pulls) >= CHUNKS
        ), f"rank {rank}: {len(pulls)} memcpys on the copy stream, expected one per chunk"
        compute = [k for k in kernels if k[3] - k[2] >= 10]
        overlapping = [
            (pull, kernel)
            for pull in pulls
            for kernel in compute
            if pull[2] < kernel[3] and kernel[2] < pull[3]
        ]
        assert overlapping, f"rank {rank}: no copy overlapped a kernel of the compute streams"


def member_on_one_gpu(rank: int, size: int) -> Communicator:
    """This process as member `rank` of a team of `size` processes that share GPU 0.

    The copy engine maps each member's buffers into the others' processes by CUDA IPC, as
    between separate GPUs (runtime/distributed/symmetric_memory.py): each member's context with its own
    streams, the signals as stream memory operations waiting on the GPU, the pulls from the
    peers' memory, the reductions. The members exchange their handles over a gloo process
    group's store. (Members as threads of one process would share one context, where CUDA
    does not promise that a stream waiting for a signal lets the streams that would send
    it run.)"""
    dist.init_process_group("gloo")
    return Communicator(rank, size, torch.device("cuda", 0), "gloo", 30.0)


ALLREDUCES_ON_ONE_GPU = [
    ("uneven", (5, 7), torch.float32, "sum"),
    ("fewer elements than members", (3,), torch.float32, "max"),
    ("strided", (5,), torch.float32, "sum"),
    ("bf16", (6, 10), torch.bfloat16, "sum"),
]
"""What each member of a team on one GPU allreduces: (name, output shape, dtype, op)."""


def as_member_on_one_gpu(size: int, done, work: Callable[[Communicator], T]) -> T:
    """`work` on this rank as a member of a team of `size` on one GPU (`member_on_one_gpu`);
    what it returns, once every member is done with the others' memory (`done`)."""
    try:
        result = work(member_on_one_gpu(int(os.environ["RANK"]), size))
        done.wait()
        return result
    except BaseException:
        done.abort()  # the peers waiting there fail at once, not at their timeout
        raise


def allreduce_member_on_one_gpu(size: int, done, partials) -> list[list[torch.Tensor]]:
    """This rank as a member of a team of `size` on one GPU (`as_member_on_one_gpu`): the cases
    of `ALLREDUCES_ON_ONE_GPU`, each issued twice before either is waited for; its outputs."""
    return as_member_on_one_gpu(size, done, functools.partial(_allreduces_on_one_gpu, partials))


def _allreduces_on_one_gpu(partials, communicator: Communicator) -> list[list[torch.Tensor]]:
    rank, team = communicator.rank, tuple(range(communicator.world_size))
    engine, device = communicator.copy_engine, communicator.device
    outputs = []
    for (name, shape, dtype, op), runs in zip(ALLREDUCES_ON_ONE_GPU, partials):
        works, finishes, results_of_case = [], [], []
        for partial in runs:
            if name == "strided":
                # Column 1 of a symmetric [5, 2] into column 1 of a [5, 2] output.
                symmetric = engine.allocate((*shape, 2), dtype, team, name).tensor
                symmetric[:, 1] = partial[rank].to(device)
                input = symmetric[:, 1]
                output = torch.full((*shape, 2), float("nan"), dtype=dtype, device=device)[:, 1]
            else:
                input = engine.allocate(shape, dtype, team, name).tensor
                input.copy_(partial[rank].to(device))
                output = torch.full(shape, float("nan"), dtype=dtype, device=device)
            issued = engine.allreduce(input, output, team, REDUCE_OPS[op])
            works += issued[0]
            finishes += issued[1]
            results_of_case.append(output)
        for work in works:
            work.wait()
        for finish in finishes:
            finish()
        outputs.append([result.cpu() for result in results_of_case])
    return outputs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("size", [2, 4], ids=["pair", "two-phase-of-four"])
def test_the_allreduce_of_a_team_on_the_copy_engines_of_one_gpu(size, monkeypatch):
    """The GPU path of the copy-engine allreduce (`SymmetricMemoryEngine`), a pair's (the
    own partial reduced in place with the peer's, staged in one slot) and a team of four's
    (two phases), its members processes sharing one GPU (`member_on_one_gpu`): every case
    issued twice before either is waited for (as a pipelined loop does; for four, through
    one scratch per shape), on poisoned outputs; each member's output is plain torch's
    reduction of the partials, the same bits on every member.

    The members load every kernel when they start (`CUDA_MODULE_LOADING=EAGER`): loading
    one at its first launch may wait for the whole GPU, here every member's, which a
    peer's transfer waiting for this member's next signal would keep busy."""
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    generator = torch.Generator().manual_seed(5)
    partials = [
        [torch.randn(size, *shape, generator=generator).to(dtype) for _ in range(2)]
        for _, shape, dtype, _ in ALLREDUCES_ON_ONE_GPU
    ]
    done = torch.multiprocessing.get_context("spawn").Barrier(size, timeout=90)
    per_member = run_on_local_ranks(allreduce_member_on_one_gpu, size, size, done, partials, timeout_s=120, join_group=False)
    for i, ((name, _, dtype, op), runs) in enumerate(zip(ALLREDUCES_ON_ONE_GPU, partials)):
        for run, partial in enumerate(runs):
            expected = TORCH_REDUCTIONS[op](partial.double(), 0)
            tolerance = TOLERANCE[dtype] * expected.abs().max().item()
            for rank, outputs in enumerate(per_member):
                torch.testing.assert_close(
                    outputs[i][run].double(),
                    expected,
                    rtol=0,
                    atol=tolerance,
                    msg=lambda m: f"{name}, run {run}, member {rank}: {m}",
                )
                assert torch.equal(outputs[i][run], per_member[0][i][run]), f"{name}: members differ"


SUMS_IN_THE_GEMM_ON_ONE_GPU = [
    ("f32", ALLREDUCE_IN_MATMUL["pipelined"], 4),
    ("bf16", ALLREDUCE_IN_MATMUL["pipelined"], 3),
    ("f32", ALLREDUCE_IN_MATMUL["pool streams"], 3),
]
"""The GEMM+AR programs that a pair on one GPU runs: (dtype, pipeline, chunks)."""


def load_the_gemms_kernels(device: torch.device) -> None:
    """Runs once, on this member alone, the kernels of the programs (cuBLAS's first of all,
    which sets itself up on its first GEMM): loading a kernel may wait for the whole GPU,
    which a peer's transfer waiting for this member's next signal would keep busy."""
    for dtype in DTYPES.values():
        x, w = torch.ones(1, M, K, dtype=dtype, device=device), torch.ones(1, K, N, dtype=dtype, device=device)
        product = torch.matmul(x, w)
        product[0].addmm_(x[0], w[0])
        torch.add(product, product, out=product)
        product.fill_(float("nan")).copy_(torch.matmul(x, w))
    torch.cuda.synchronize(device)


def sum_in_the_gemm_member_on_one_gpu(done, cases: list[tuple]) -> list[list[torch.Tensor]]:
    """This rank as a member of a pair on one GPU (`as_member_on_one_gpu`): the GEMM+AR programs
    of `cases`, their sums made in the GEMM (allreduce-in-matmul), each run twice; its outputs.
    (The ranks of `Program.run` agree on their inputs over the gloo process group too.)"""

    def work(communicator: Communicator) -> list[list[torch.Tensor]]:
        load_the_gemms_kernels(communicator.device)
        return sum_in_the_gemm_outputs(communicator, [0, 1], cases)

    return as_member_on_one_gpu(2, done, work)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_sum_in_the_gemm_on_the_copy_engines_of_one_gpu(monkeypatch):
    """The GPU path of the GEMM+AR with its sums made in the GEMM (the copy engines' batches
    of sends and recvs, pipelined with a deferred wait, an odd last chunk's allreduce), its
    two members processes sharing one GPU (`member_on_one_gpu`), each program run twice on
    poisoned allocations: plain torch's result, the same bits on both members."""
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    generator = torch.Generator().manual_seed(21)
    cases = [
        (dtype, pipeline, [torch.randn(shape, generator=generator).to(DTYPES[dtype]) for shape in shapes])
        for dtype, pipeline, chunks in SUMS_IN_THE_GEMM_ON_ONE_GPU
        for shapes in [((chunks, 2, M, K), (2, K, N))]
    ]
    done = torch.multiprocessing.get_context("spawn").Barrier(2, timeout=90)
    per_member = run_on_local_ranks(sum_in_the_gemm_member_on_one_gpu, 2, done, cases, timeout_s=120, join_group=False)
    check_sum_in_the_gemm(cases, per_member)


def ring_of_destinations_member_on_one_gpu(done, cases: list[tuple]) -> list[list[torch.Tensor]]:
    """This rank as a member of a team of four on one GPU (`as_member_on_one_gpu`): GEMM+RS
    (`matmul_rs_through_bcast`) on the copy engines, its reduce-scatter a ring of
    destinations (reduce-scatter-ring), each case run twice (`outputs_of_runs`); its outputs."""

    def work(communicator: Communicator) -> list[list[torch.Tensor]]:
        load_the_gemms_kernels(communicator.device)
        return [
            outputs_of_runs(
                Program.compile(BUILDERS["matmul_rs_through_bcast"](num_devices=4, dtype=dtype), pipeline=COPY_ENGINE),
                communicator,
                [whole, whole],
            )
            for dtype, whole in cases
        ]

    return as_member_on_one_gpu(4, done, work)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_ring_of_destinations_on_the_copy_engines_of_one_gpu(monkeypatch):
    """The GPU path of GEMM+RS over four members whose reduce-scatter is a ring of
    destinations (three batches of a send and a recv with different peers, then one
    reduction), the members processes sharing one GPU (`member_on_one_gpu`), f32 and bf16,
    each run twice: every member's piece of plain torch's result."""
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    generator = torch.Generator().manual_seed(22)
    cases = [
        (dtype, [torch.randn(shape, generator=generator).to(DTYPES[dtype]) for shape in ((S, 4, 4, M, K), (4, K, N))])
        for dtype in ("f32", "bf16")
    ]
    done = torch.multiprocessing.get_context("spawn").Barrier(4, timeout=90)
    per_member = run_on_local_ranks(
        ring_of_destinations_member_on_one_gpu, 4, done, cases, timeout_s=120, join_group=False
    )
    for i, (dtype, (x, w)) in enumerate(cases):
        expected = matmul_rs(x.double(), w.double())
        for rank, outputs in enumerate(per_member):
            for run in range(2):
                where = f"{dtype}, run {run}, member {rank}"
                assert_piece(outputs[i][run], expected[:, rank], expected, DTYPES[dtype], where)


STAY_AWAY_S = 30.0
"""How long rank 1 stays away from the allgather of `allgather_without_its_peer`, at most."""

WATCHED_TIMEOUT_S = 2.0
"""The watchdog's timeout for the allgather of `allgather_without_its_peer`."""


def allgather_without_its_peer(started, stderr: str) -> None:
    """Both ranks map a symmetric buffer; then rank 1 stays away, watching rank 0's process,
    and rank 0 allgathers from it. Rank 0 writes in `started` (a shared double) when it
    begins the allgather, on the system's monotonic clock, which every process reads alike;
    rank 1 says how long after that rank 0's process ended. Rank 0's stderr goes to the
    file `stderr` (a rank's own stderr is the launcher's forkserver's, which a test that
    did not start it cannot read)."""
    communicator = Communicator.from_env()
    if communicator.rank == 0:
        sys.stderr = open(stderr, "w")  # the process ends with it open
    buffer = communicator.copy_engine.allocate((1, 4), torch.float32, [0, 1], "a test's buffer")
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    torch.cuda.synchronize()
    # The setup's store waits (the exchange of the buffers' handles) take the group's timeout too,
    # and a loaded machine can keep a peer away from them for longer than 2 s: the setup runs
    # under HOSTIR_TIMEOUT_S, the watched transfer under WATCHED_TIMEOUT_S.
    watchdog = communicator.copy_engine.watchdog
    assert watchdog.timeout_s == communicator.timeout_s == float(os.environ["HOSTIR_TIMEOUT_S"])
    watchdog.timeout_s = WATCHED_TIMEOUT_S
    if communicator.rank == 1:
        watched = time.monotonic()
        while time.monotonic() - watched < STAY_AWAY_S:
            try:
                os.kill(pids[0], 0)
            except ProcessLookupError:
                raise RuntimeError(f"rank 0 ended after {time.monotonic() - started.value:.1f} s") from None
            time.sleep(0.05)
        raise RuntimeError(f"rank 0 still runs after {STAY_AWAY_S:g} s")
    output = torch.empty(2, 4, device=communicator.device)
    started.value = time.monotonic()
    communicator.allgather(buffer.tensor, output, (0, 1), 0, hir.CommunicatorBackend.CUDA).wait()
    torch.cuda.synchronize()
    raise AssertionError("the allgather ended, yet its peer never signalled")


@needs_two_gpus
def test_a_peer_that_never_signals_ends_the_process_within_the_timeout(monkeypatch, tmp_path):
    """The signals wait on the GPU without a timeout of their own; the watchdog ends the
    process once the transfer has waited its timeout (HOSTIR_TIMEOUT_S's, shortened after
    the setup), saying why, instead of hanging. The time is measured from rank 0's own start
    of the allgather, so a rank slowed by a loaded machine cannot make the 2 s look shorter."""
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", "60")
    started = torch.multiprocessing.get_context("spawn").Value("d", 0.0)
    with pytest.raises(RankFailed) as failed:
        run_on_local_ranks(allgather_without_its_peer, 2, started, str(tmp_path / "stderr"), timeout_s=90)
    failures = failed.value.failures
    assert failures[0] == "exited with code 1 before returning a result", failures[0]
    ended = re.search(r"rank 0 ended after (\d+\.\d) s", failures[1])
    assert ended, failures[1]
    assert WATCHED_TIMEOUT_S <= float(ended[1]) < 15.0, f"rank 0 ended {ended[1]} s after its transfer"
    assert (
        "hostir: rank 0: an allgather in the team [0, 1] (backend cuda) has waited more than 2 s "
        "for its peers: a peer is dead, stuck, or not running the same program; ending the process"
        in (tmp_path / "stderr").read_text()
    )
