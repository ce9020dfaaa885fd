"""End to end: every reference fusion, and one fusion per kind of communication, from the fusion
(Program.compile with the default pipeline) to outputs checked against plain torch; and
GEMM+AR and GEMM+RS written without chunks, lowered after auto-stream-parallel, which must
not stream their rows.

The expected outputs are written here in plain torch on the unsharded tensors (einsum
in f64), independently of the fusion dialect's own evaluator. Each case runs in f32
and bf16, at two sets of extents, one of them not powers of two, on every rank of a
world of 1 (in this process), 2 and 4 (one spawn per world size runs all its cases).
Inputs are random; every allocation of the run is poisoned with NaN; every rank's
output is compared with its piece of the expected tensor, and its inputs must come
back unchanged.

HOSTIR_TEST_DEVICE=cuda runs the ranks on GPUs with NCCL (and fails if they do not get
one); =cpu (the default without CUDA) on CPUs with gloo.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from xdsl.dialects.builtin import ModuleOp

from examples.reference_fusions import REFERENCE_FUSIONS
from hostir_dialect.builder import FusionBuilder
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.launch import run_on_local_ranks
from hostir.passes import DEFAULT_PIPELINE
from hostir.runtime.program import Program
from hostir.runtime.reference import shard
from test_interpreter import poisoned_allocations

DEVICE = os.environ.get("HOSTIR_TEST_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
"""Where the ranks compute: `cuda` (NCCL) or `cpu` (gloo)."""

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
"""Error allowed relative to the largest expected magnitude (docs/hir-run.md explains why)."""


@dataclass(frozen=True)
class Extents:
    """The extents of a case: D the mesh size, S the stream axis, M x K times K x N matrices."""

    name: str
    S: int
    M: int
    K: int
    N: int


EXTENTS = [Extents("pow2", S=2, M=4, K=8, N=8), Extents("odd", S=3, M=5, K=6, N=7)]


# --------------------------------------------------------------------------- #
# Fusions of the communications the reference fusions do not produce          #
# --------------------------------------------------------------------------- #


# A rank learns a dynamic extent from its piece of a tensor (hir.dim), so a tensor sent to
# ranks that hold none of its source has static extents.


def scatter(num_devices: int, dtype: str, shape: list[int]) -> ModuleOp:
    """[D, M] on device 0 -> set -> [DIDx(D), M] on 0 .. D-1."""
    fb = FusionBuilder("scatter")
    out = fb.set(fb.input(shape, dtype))
    fb.set_mesh(out, range(num_devices))
    fb.parallelize(out, 0, "didx")
    fb.output(out)
    return fb.build()


def broadcast(num_devices: int, dtype: str, shape: list[int]) -> ModuleOp:
    """[M, N] on the last device -> set -> replicated on 0 .. D-1."""
    fb = FusionBuilder("broadcast")
    out = fb.set(fb.input(shape, dtype, mesh=[num_devices - 1]))
    fb.set_mesh(out, range(num_devices))
    fb.output(out)
    return fb.build()


def gather(num_devices: int, dtype: str) -> ModuleOp:
    """[DIDx(D), M] on 0 .. D-1 -> set -> [D, M] on device 0."""
    fb = FusionBuilder("gather")
    x = fb.input([num_devices, None], dtype, mesh=range(num_devices), axes=["didx", "_"])
    out = fb.set(x)
    fb.set_mesh(out, [0])
    fb.parallelize(out, 0, "_")
    fb.output(out)
    return fb.build()


def reduce(num_devices: int, dtype: str) -> ModuleOp:
    """[DIDx(D), M, N] on 0 .. D-1 -> sum(0) -> [M, N] on the last device."""
    fb = FusionBuilder("reduce")
    x = fb.input([num_devices, None, None], dtype, mesh=range(num_devices), axes=["didx", "_", "_"])
    out = fb.sum(x, [0])
    fb.set_mesh(out, [num_devices - 1])
    fb.output(out)
    return fb.build()


def send_recv(num_devices: int, dtype: str, shape: list[int]) -> ModuleOp:
    """[DIDx(D/2), M] on the first half of the devices -> set -> the same layout on the second half."""
    half = num_devices // 2
    fb = FusionBuilder("send_recv")
    x = fb.input(shape, dtype, mesh=range(half), axes=["didx", "_"])
    out = fb.set(x)
    fb.set_mesh(out, range(half, num_devices))
    fb.parallelize(out, 0, "didx")
    fb.output(out)
    return fb.build()


def allgather_p2p_upper(num_devices: int, dtype: str, shape: list[int]) -> ModuleOp:
    """[DIDx(D-1), M] on devices 1 .. D-1 -> set -> [Stream(D-1), M]: the point-to-point
    allgather (ring order) on a mesh that does not start at device 0; device 0 skips it."""
    fb = FusionBuilder("allgather_p2p_upper")
    x = fb.input(shape, dtype, mesh=range(1, num_devices), axes=["didx", "_"])
    out = fb.set(x)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def matmul_ar_without_chunks(num_devices: int, dtype: str, shape: list[int], n: int) -> ModuleOp:
    """[DIDx(D), M, K] x [DIDx(D), K, N] -> sum(0) -> [M, N] on 0 .. D-1: a K-sharded GEMM and
    the allreduce of its product, whose rows are not cut into chunks. Its first axis is the
    GEMM's M: auto-stream-parallel must leave it (with it streamed, stream-parallel would
    refuse the program: slices of M of a batched matmul are no slices of its product)."""
    k = shape[-1]
    fb = FusionBuilder("matmul_ar_without_chunks")
    a = fb.input(shape, dtype, mesh=range(num_devices), axes=["didx", "_", "_"])
    b = fb.input([num_devices, k, n], dtype, mesh=range(num_devices), axes=["didx", "_", "_"])
    partial = fb.matmul(a, b)
    fb.parallelize(partial, 0, "didx")
    fb.output(fb.sum(partial, [0]))
    return fb.build()


def matmul_rs_without_chunks(num_devices: int, dtype: str, shape: list[int], n: int) -> ModuleOp:
    """[DIDx(D), D, M, K] x [DIDx(D), 1, K, N] -> sum(0) -> [DIDx(D), M, N]: a K-sharded GEMM
    and the reduce-scatter of its product, the rows of each destination not cut into chunks:
    the axis after the scattered one is the GEMM's M, which auto-stream-parallel must leave."""
    k = shape[-1]
    fb = FusionBuilder("matmul_rs_without_chunks")
    a = fb.input(shape, dtype, mesh=range(num_devices), axes=["didx", "_", "_", "_"])
    b = fb.input([num_devices, 1, k, n], dtype, mesh=range(num_devices), axes=["didx", "_", "_", "_"])
    partial = fb.matmul(a, b)
    fb.parallelize(partial, 0, "didx")
    out = fb.sum(partial, [0])
    fb.parallelize(out, 0, "didx")
    fb.output(out)
    return fb.build()


COMMUNICATION_FUSIONS = {
    f.__name__: f
    for f in (
        scatter, broadcast, gather, reduce, send_recv, allgather_p2p_upper,
        matmul_ar_without_chunks, matmul_rs_without_chunks,
    )
}  # fmt: skip


def build(fusion: str, **arguments) -> ModuleOp:
    return {**REFERENCE_FUSIONS, **COMMUNICATION_FUSIONS}[fusion](**arguments)


# --------------------------------------------------------------------------- #
# Cases: the fusion, the unsharded input shapes, the expected result in torch  #
# --------------------------------------------------------------------------- #


def linear(x, w, b):
    return torch.einsum("...k,nk->...n", x, w) + b


def matmul(a, b):
    return torch.einsum("...mk,kn->...mn", a, b)


def identity(x):
    return x


def tp_mlp(x, w1, b1, w2):
    """The tensor-parallel MLP on whole tensors: every device's GEMMs of every device's rows,
    summed over the devices (the reduce-scatter), each device keeping its own rows."""
    h = torch.einsum("semk,dkn->sdemn", x, w1) + b1[None, :, None, None, :]
    gelu = torch.nn.functional.gelu(h, approximate="tanh")
    return torch.einsum("sdemn,dnk->semk", gelu, w2)


@dataclass(frozen=True)
class Fusion:
    name: str
    shapes: Callable[[int, Extents], list[tuple[int, ...]]]
    """The unsharded input shapes for mesh size D and the extents."""
    expected: Callable[..., torch.Tensor]
    """The output, from the unsharded inputs (in f64)."""
    arguments: dict = field(default_factory=dict)
    multi_device: bool = True
    static_shape: bool = False
    """Whether the builder takes the shape of its first input (`shape`) instead of leaving extents dynamic."""
    pipeline: str = DEFAULT_PIPELINE


FUSIONS = [
    # pr4147: one device, stream-parallel loops
    Fusion("single_set", lambda D, e: [(e.M, e.N)], identity, {"stream_axis": 0}, False),
    Fusion("single_set", lambda D, e: [(e.M, e.N)], identity, {"stream_axis": 1}, False),
    Fusion("two_sets", lambda D, e: [(e.M, e.N)], identity, multi_device=False),
    Fusion("three_sets", lambda D, e: [(e.M, e.N)], identity, multi_device=False),
    Fusion("reduction", lambda D, e: [(e.S, e.M, e.N)], lambda x: x.sum(2), multi_device=False),
    Fusion("single_binary", lambda D, e: [(e.M, e.N)] * 2, torch.add, multi_device=False),
    Fusion("matmul", lambda D, e: [(e.M, e.K), (e.K, e.N)], matmul, {"stream_axis": 0}, False),
    Fusion("matmul", lambda D, e: [(e.M, e.K), (e.K, e.N)], matmul, {"stream_axis": 1}, False),
    Fusion(
        "linear", lambda D, e: [(e.S, e.M, e.K), (e.N, e.K), (e.N,)], linear, multi_device=False
    ),
    # pr3736, pr4387, pr4515: over the mesh 0 .. D-1
    Fusion("ag_linear", lambda D, e: [(e.S, D, e.M, e.K), (e.N, e.K), (e.N,)], linear),
    Fusion("allgather", lambda D, e: [(e.S, D)], identity),
    Fusion("allreduce", lambda D, e: [(e.S, D, e.M)], lambda x: x.sum(1)),
    Fusion("reduce_scatter", lambda D, e: [(e.S, D, D, e.M)], lambda x: x.sum(1)),
    Fusion("ag_matmul", lambda D, e: [(e.S, D, e.M, e.K), (e.K, e.N)], matmul),
    Fusion(
        "matmul_ar",
        lambda D, e: [(e.S, D, e.M, e.K), (D, e.K, e.N)],
        lambda a, b: torch.einsum("sdmk,dkn->smn", a, b),
    ),
    Fusion(
        "matmul_rs_through_bcast",
        lambda D, e: [(e.S, D, D, e.M, e.K), (D, e.K, e.N)],
        lambda a, b: torch.einsum("sdemk,dkn->semn", a, b),
    ),
    Fusion("tp_mlp", lambda D, e: [(e.S, D, e.M, e.K), (D, e.K, e.N), (D, e.N), (D, e.N, e.K)], tp_mlp),
    Fusion("allgather_p2p", lambda D, e: [(D, e.M)], identity),
    Fusion("ag_matmul_p2p", lambda D, e: [(D, e.M, e.K), (e.K, e.N)], matmul),
]

COMMUNICATIONS = [
    Fusion("scatter", lambda D, e: [(D, e.M)], identity, static_shape=True),
    Fusion("broadcast", lambda D, e: [(e.M, e.N)], identity, static_shape=True),
    Fusion("gather", lambda D, e: [(D, e.M)], identity),
    Fusion("reduce", lambda D, e: [(D, e.M, e.N)], lambda x: x.sum(0)),
    Fusion("send_recv", lambda D, e: [(D // 2, e.M)], identity, static_shape=True),
    Fusion("allgather_p2p_upper", lambda D, e: [(D - 1, e.M)], identity, static_shape=True),
]

AUTO_PIPELINED = [
    Fusion(
        "matmul_ar_without_chunks",
        lambda D, e: [(D, e.M, e.K), (D, e.K, 3)],
        lambda a, b: torch.einsum("dmk,dkn->mn", a, b),
        {"n": 3},
        static_shape=True,
        pipeline=f"auto-stream-parallel,{DEFAULT_PIPELINE}",
    ),
    Fusion(
        "matmul_rs_without_chunks",
        lambda D, e: [(D, D, e.M, e.K), (D, 1, e.K, 3)],
        lambda a, b: torch.einsum("demk,dkn->emn", a, b[:, 0]),
        {"n": 3},
        static_shape=True,
        pipeline=f"auto-stream-parallel,{DEFAULT_PIPELINE}",
    ),
]
"""Fusions written without stream axes, which auto-stream-parallel pipelines (as it does the
graphs of the torch.compile backend), or must leave as they are."""


@dataclass(frozen=True)
class Case:
    """One fusion at one mesh size, dtype and set of extents, run on a world of `world` ranks."""

    fusion: Fusion
    world: int
    num_devices: int
    dtype: str
    extents: Extents

    @property
    def id(self) -> str:
        arguments = "".join(f"-{k}={v}" for k, v in self.fusion.arguments.items())
        return f"{self.fusion.name}{arguments}-{self.dtype}-{self.extents.name}-D{self.num_devices}-w{self.world}"

    @property
    def build_arguments(self) -> dict:
        arguments = {**self.fusion.arguments, "dtype": self.dtype}
        if self.fusion.multi_device:
            arguments["num_devices"] = self.num_devices
        if self.fusion.static_shape:
            arguments["shape"] = self.fusion.shapes(self.num_devices, self.extents)[0]
        return arguments

    def inputs(self) -> list[torch.Tensor]:
        """Random unsharded inputs, the same in every process that builds the case."""
        generator = torch.Generator().manual_seed(sum(map(ord, self.id)))
        return [
            torch.randn(shape, generator=generator).to(DTYPES[self.dtype])
            for shape in self.fusion.shapes(self.num_devices, self.extents)
        ]


def _cases() -> list[Case]:
    variants = [(dtype, extents) for dtype in DTYPES for extents in EXTENTS]
    cases = [Case(f, 1, 1, d, e) for f in FUSIONS for d, e in variants]
    for world in (2, 4):
        cases += [
            Case(f, world, world, d, e)
            for f in FUSIONS + COMMUNICATIONS + AUTO_PIPELINED
            if f.multi_device
            for d, e in variants
        ]
    # A mesh smaller than the world: ranks 2 and 3 hold empty placeholders and skip the work.
    # Only with static extents: a rank outside a buffer's mesh cannot learn its dynamic
    # extents, and the runtime refuses the hir.dim that asks.
    cases += [Case(f, 4, 2, "f32", EXTENTS[1]) for f in COMMUNICATIONS if f.static_shape]
    return cases


CASES = _cases()


# --------------------------------------------------------------------------- #
# Running                                                                      #
# --------------------------------------------------------------------------- #


def run_cases(
    cases: list[tuple[str, dict, str, list[torch.Tensor]]], communicator: Communicator | None = None
) -> list[tuple[list[torch.Tensor], bool] | str]:
    """On one rank: each case's local outputs (on the CPU) and whether its inputs came back unchanged.

    A case that raises gives its error message instead, so the others still run.
    """
    if communicator is None:  # a rank of a launched world: where HOSTIR_TEST_DEVICE says
        communicator = Communicator.from_env()
        assert communicator.device.type == DEVICE, f"rank runs on {communicator.device}, expected {DEVICE}"
    results = []
    for fusion, arguments, pipeline, inputs in cases:
        try:
            program = Program.compile(build(fusion, **arguments), pipeline)
            local = [
                shard(x, t, communicator.rank).to(communicator.device)
                for x, t in zip(inputs, program.input_types)
            ]
            before = [x.clone() for x in local]
            with poisoned_allocations():
                outputs = program.run(local, communicator)
            unchanged = all(torch.equal(a, b) for a, b in zip(local, before))
            results.append(([output.cpu() for output in outputs], unchanged))
        except Exception as error:  # reported by the case's test
            results.append(f"{type(error).__name__}: {error}")
    return results


@functools.cache
def results_of_world(world: int) -> dict[str, list]:
    """Every case of world size `world` run at once; case id -> the per-rank results."""
    cases = [c for c in CASES if c.world == world]
    payload = [(c.fusion.name, c.build_arguments, c.fusion.pipeline, c.inputs()) for c in cases]
    if world == 1:
        communicator = Communicator.single(torch.device("cpu") if DEVICE == "cpu" else None)
        per_rank = [run_cases(payload, communicator)]
    else:
        per_rank = run_on_local_ranks(run_cases, world, payload)
    return {case.id: [rank_results[i] for rank_results in per_rank] for i, case in enumerate(cases)}


@pytest.fixture(scope="module", autouse=True)
def rank_environment():
    """What the spawned ranks inherit: no GPUs when the suite runs on the CPU of a GPU machine,
    a communication timeout that fails a hanging case in seconds rather than minutes, and
    2 streams: fewer than the 3 chunks of the "odd" extents, so that iterations share a
    stream and the buffers of per-stream-buffers hand a slice to a second iteration."""
    with pytest.MonkeyPatch.context() as patch:
        if DEVICE == "cpu":
            patch.setenv("CUDA_VISIBLE_DEVICES", "")
        patch.setenv("HOSTIR_TIMEOUT_S", "30")
        patch.setenv("HOSTIR_NUM_STREAMS", "2")
        yield


def needs_world(world: int):
    """On GPUs, a world needs one GPU per rank; with none at all, HOSTIR_TEST_DEVICE=cuda fails."""
    available = torch.cuda.device_count()
    return pytest.mark.skipif(
        DEVICE == "cuda" and 0 < available < world,
        reason=f"needs {world} GPUs, one per NCCL rank; {available} here",
    )


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=needs_world(c.world)) for c in CASES]
)
def test_end_to_end(case: Case):
    inputs = case.inputs()
    expected = case.fusion.expected(*(x.double() for x in inputs))
    dtype = DTYPES[case.dtype]
    tolerance = TOLERANCE[dtype] * expected.abs().max().item()
    program = Program.compile(build(case.fusion.name, **case.build_arguments), case.fusion.pipeline)
    (output_type,) = program.output_types
    for rank, result in enumerate(results_of_world(case.world)[case.id]):
        assert not isinstance(result, str), f"rank {rank}: {result}"
        (output,), inputs_unchanged = result
        assert inputs_unchanged, f"rank {rank} changed its inputs"
        piece = shard(expected, output_type, rank)
        assert output.dtype == dtype and output.shape == piece.shape, f"rank {rank}"
        torch.testing.assert_close(
            output.double(), piece, rtol=0, atol=tolerance, msg=lambda m: f"rank {rank}: {m}"
        )


@pytest.mark.parametrize("in_place", [True, False], ids=["allreduce_in_place", "left_out"])
def test_an_allreduce_sums_its_matmuls_product_where_the_gemm_wrote_it(monkeypatch, in_place):
    """allreduce-in-place: each chunk's GEMM writes into the output's slice and the allreduce
    sums it there, its input the output's memory, so that nothing is copied before the
    collective; with the pass left out, the product has a buffer of its own, which the
    allreduce copies into the output first. The same values either way."""
    case = next(c for c in CASES if c.id == "matmul_ar-f32-odd-D1-w1")
    pipeline = DEFAULT_PIPELINE if in_place else f"{DEFAULT_PIPELINE}{{allreduce_in_place=false}}"
    program = Program.compile(build("matmul_ar", **case.build_arguments), pipeline)
    allreduce, in_output = Communicator.allreduce, []

    def recorded(communicator, input, output, *arguments, **options):
        in_output.append(input.data_ptr() == output.data_ptr())
        return allreduce(communicator, input, output, *arguments, **options)

    monkeypatch.setattr(Communicator, "allreduce", recorded)
    communicator = Communicator.single(torch.device("cpu") if DEVICE == "cpu" else None)
    inputs = [x.to(communicator.device) for x in case.inputs()]
    with poisoned_allocations():
        (output,) = program.run(inputs, communicator)
    torch.testing.assert_close(output.cpu(), case.fusion.expected(*case.inputs()))
    assert len(in_output) == inputs[0].shape[0] and set(in_output) == {in_place}


def test_every_segment_launched_on_one_device_has_a_kernel_on_its_buffers(monkeypatch):
    """What a GPU does at each `hir.launch_kernel`, planned on the CPU: the kernel's iteration
    space from the buffers the launch gets (`SegmentKernel.plan`). A segment that joined
    computations of unrelated dynamic extents (a weight's broadcast beside an activation)
    has none, and would fail on GPUs alone."""
    from hostir.runtime.codegen import kernels

    planned = []

    def launch(kernel, ins, outs):
        planned.append(kernel.plan(ins, outs))
        return False  # then evaluated eagerly, as on the CPU

    monkeypatch.setattr(kernels.SegmentKernel, "launch", launch)
    cases = [c for c in CASES if c.world == 1]
    payload = [(c.fusion.name, c.build_arguments, c.fusion.pipeline, c.inputs()) for c in cases]
    results = run_cases(payload, Communicator.single(torch.device("cpu")))
    assert planned and not [(c.id, r) for c, r in zip(cases, results) if isinstance(r, str)]


def test_each_worker_of_the_gpu_suite_sees_the_gpus_rotated(monkeypatch):
    """Worker gwN of the GPU suite (HOSTIR_TEST_GPUS) sees the GPUs from N mod their count, so
    that the rank 0s of the workers' tests spread over every GPU; an explicit
    CUDA_VISIBLE_DEVICES, no count, or no worker, leaves it as it is."""
    from conftest import _rotate_gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("HOSTIR_TEST_GPUS", "4")
    for worker, visible in (("gw0", "0,1,2,3"), ("gw5", "1,2,3,0"), ("gw7", "3,0,1,2")):
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        _rotate_gpus(worker)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == visible
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    _rotate_gpus("gw1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _rotate_gpus(None)
    monkeypatch.setenv("HOSTIR_TEST_GPUS", "0")
    _rotate_gpus("gw1")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
