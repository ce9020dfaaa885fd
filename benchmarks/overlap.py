"""Communication hidden behind GEMMs: hostir's lowered programs against their peers.

    torchrun --nproc-per-node 8 benchmarks/overlap.py --out results/   # one rank per GPU
    python benchmarks/overlap.py --nproc 8 --out results/             # the same, ranks started here
    python benchmarks/overlap.py --cpu --nproc 2 --sizes 64,32,16      # CPU ranks, gloo, host timers

Three problems, Y[M, N] = X[M, K] @ W[K, N] in bf16 over D ranks:

  allgather_matmul       X row-sharded [M/D, K] per rank, W replicated: Y = allgather(X) @ W
  matmul_reduce_scatter  X [M, K/D], W [K/D, N] per rank: Y = reduce_scatter(X @ W), [M/D, N] per rank
  matmul_allreduce       X [M, K/D], W [K/D, N] per rank: Y = allreduce(X @ W)

For each problem and size, in one run: the GEMM alone, the collective alone, the limit
(the larger of the two), the two steps in sequence, NCCL per chunk on several streams
written by hand, torch's symmetric-memory fused op (where torch has one) and hostir:
the fusion built with the Python builder, lowered by `Program.compile` (the default
pipeline; the point-to-point allgather and the copy-engine backend where asked), run
with `Program.run`. The chunk count (the stream axis extent) and the streams come from
the cost model (passes/analysis/cost_model.py), for each program in the form its lowering
gave it (a GEMM+RS or a GEMM+AR with its reduction in the GEMM has a timeline of its own),
fed with the stages measured here as the backend measures them (`--model measured`,
`measure_stages`: a chunk's GEMM, its NCCL collective, and both at once, for every chunk
count the model weighs) or with the GEMM-alone and collective-alone times just measured
(`--model rates`); or from `--chunks` (a sweep) and `--streams`. The tables end with the
model's prediction against the measured time of every pipeline.

Every hostir program's output is checked once against plain torch (X @ W on the
unsharded tensors, this rank's piece taken with runtime.reference.shard), with every
allocation of that run filled with NaN first; `--check-peers` checks the peers too.
Then each contender is timed: warm-up runs, then `--reps` runs, each between CUDA
events on the caller's stream (host timers on the CPU); the time of a run is the
slowest rank's, and the result is the median over the runs. Before each run the GPU
sleeps long enough for the host to issue the whole run and then the ranks meet in a
one-element allreduce, so a run's time is GPU time from a common start: neither
Python's launch time (reported apart as host_ms) nor a late peer.

A contender that cannot run here says "unavailable: why"; one that fails says
"failed: why", and the run goes on. Every communication times out after `--timeout`
seconds and the whole run after `--deadline` seconds, leaving the results so far in
`--out` (default: build/overlap in the checkout, which git ignores): overlap.json after
every measurement, overlap.md and overlap.png after every size. docs/benchmarks.md
explains every column.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from xdsl.dialects.builtin import ModuleOp

from hostir_dialect import hir
from hostir_dialect.builder import FusionBuilder
from hostir_dialect.text import HostirError
from overlap_peers import Build, Peers, Unavailable
from overlap_report import LIMIT, Report, Result, machine
from hostir.passes import DEFAULT_PIPELINE
from hostir.passes.analysis.cost_model import (
    DEFAULT_MIN_CHUNK_ROWS,
    OverlapKind,
    OverlapProblem,
    MeasuredStages,
    PipelineShape,
    Rates,
    StageTimes,
    candidate_chunks,
    choose_pipeline,
    pipeline_streams,
    pipeline_time,
)
from hostir.runtime.distributed.calibration import measure_stages
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.distributed.streams import start_together
from hostir.runtime.launch import RankFailed, run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import compare, shard

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "build" / "overlap"
"""Where the results go without `--out`: under the checkout's `build/`, which git ignores."""

DEFAULT_SIZES = [(8192, 8192, 3584), (16384, 8192, 3584), (32768, 8192, 1024), (8192, 8192, 8192)]
"""M, K, N of the GPU table: GEMMs of an 8192-wide model's projections (the last, 8192 cubed)."""

CPU_SIZES = [(64, 32, 16), (128, 64, 32)]
"""The default sizes with --cpu: CPU ranks multiply bf16 slowly."""

COLLECTIVES = {
    OverlapKind.ALLGATHER_MATMUL: "allgather",
    OverlapKind.MATMUL_REDUCE_SCATTER: "reduce_scatter",
    OverlapKind.MATMUL_ALLREDUCE: "allreduce",
}

MIN_SLEEP_MS = 1.0
MAX_SLEEP_MS = 100.0


# --------------------------------------------------------------------------- #
# hostir's programs                                                            #
# --------------------------------------------------------------------------- #


def _mesh_input(
    fb: FusionBuilder, world: int, shape: list[int | None], didx_axis: int | None, symmetric: bool = False
):
    axes = ["didx" if axis == didx_axis else "_" for axis in range(len(shape))]
    return fb.input(shape, "bf16", mesh=range(world), axes=axes, symmetric=symmetric)


def allgather_matmul(world: int, symmetric_x: bool = False) -> ModuleOp:
    """X [S, DIDx(D), m, K] @ W [K, N] -> [Stream(S), D, m, N]: chunk s of every rank allgathered,
    then multiplied. `symmetric_x`: X comes in symmetric memory (`hir.symmetric`)."""
    fb = FusionBuilder("allgather_matmul")
    x = _mesh_input(fb, world, [None, world, None, None], 1, symmetric_x)
    y = fb.matmul(x, _mesh_input(fb, world, [None, None], None))
    fb.parallelize(y, 0, "stream")
    fb.output(y)
    return fb.build()


def p2p_allgather_matmul(world: int, symmetric_x: bool = False) -> ModuleOp:
    """X [DIDx(D), M/D, K] @ W [K, N] -> [Stream(D), M/D, N]: rank d's rows received from d in step d.
    `symmetric_x`: X comes in symmetric memory (`hir.symmetric`)."""
    fb = FusionBuilder("p2p_allgather_matmul")
    x = _mesh_input(fb, world, [world, None, None], 0, symmetric_x)
    y = fb.matmul(x, _mesh_input(fb, world, [None, None], None))
    fb.parallelize(y, 0, "stream")
    fb.output(y)
    return fb.build()


def matmul_reduce_scatter(world: int) -> ModuleOp:
    """X [S, DIDx(D), D, m, K/D] @ W [DIDx(D), 1, K/D, N] -> partial sums [Stream(S), DIDx(D), D, m, N]
    -> sum over the first D -> [Stream(S), DIDx(D), m, N]: each chunk's GEMM, then its reduce-scatter."""
    fb = FusionBuilder("matmul_reduce_scatter")
    x = _mesh_input(fb, world, [None, world, world, None, None], 1)
    partial = fb.matmul(x, _mesh_input(fb, world, [world, 1, None, None], 0))
    fb.parallelize(partial, 0, "stream")
    fb.parallelize(partial, 1, "didx")
    y = fb.sum(partial, [1])
    fb.parallelize(y, 0, "stream")
    fb.parallelize(y, 1, "didx")
    fb.output(y)
    return fb.build()


def matmul_allreduce(world: int) -> ModuleOp:
    """X [S, DIDx(D), m, K/D] @ W [DIDx(D), K/D, N] -> [Stream(S), DIDx(D), m, N] -> sum -> [Stream(S), m, N]."""
    fb = FusionBuilder("matmul_allreduce")
    x = _mesh_input(fb, world, [None, world, None, None], 1)
    partial = fb.matmul(x, _mesh_input(fb, world, [world, None, None], 0))
    fb.parallelize(partial, 0, "stream")
    fb.parallelize(partial, 1, "didx")
    y = fb.sum(partial, [1])
    fb.parallelize(y, 0, "stream")
    fb.output(y)
    return fb.build()


Layout = Callable[[torch.Tensor, torch.Tensor, int, int], tuple[list[torch.Tensor], tuple[int, ...]]]
"""(whole X, whole W, D, chunks) -> the fusion's whole inputs (views of X and W), and the shape Y has as its output."""


def _allgather_layout(x, w, world, chunks):
    return [x.view(chunks, world, -1, x.shape[1]), w], (chunks, world, -1, w.shape[1])


def _p2p_layout(x, w, world, chunks):
    return [x.view(world, -1, x.shape[1]), w], (world, -1, w.shape[1])


def _reduce_scatter_layout(x, w, world, chunks):
    # X[s*D*m + j*m + i, r*k + c] is input [s, r, j, i, c]: rank r holds K's share r, chunk s
    # holds the rows that rank j receives summed.
    m, k = x.shape[0] // (chunks * world), x.shape[1] // world
    whole_x = x.view(chunks, world, m, world, k).permute(0, 3, 1, 2, 4)
    return [whole_x, w.view(world, 1, k, w.shape[1])], (chunks, world, m, w.shape[1])


def _allreduce_layout(x, w, world, chunks):
    m, k = x.shape[0] // chunks, x.shape[1] // world
    whole_x = x.view(chunks, m, world, k).permute(0, 2, 1, 3)
    return [whole_x, w.view(world, k, w.shape[1])], (chunks, m, w.shape[1])


@dataclass(frozen=True)
class HostirVariant:
    """A hostir program of a problem: its fusion, its inputs' layout, its pass pipeline."""

    name: str
    kind: OverlapKind
    fusion: Callable[[int], ModuleOp]
    layout: Layout
    pipeline: str = DEFAULT_PIPELINE
    point_to_point: bool = False
    """The stream axis is the device axis: D chunks, whatever the cost model says."""
    copy_engine: bool = False
    """Asks for the copy-engine backend: a lowering that cannot give it makes the contender unavailable."""


COPY_ENGINE_PIPELINES = {
    "hostir (cuda)": "hir-lowering{backend=cuda}",
    "hostir (cuda, pool streams)": "hir-lowering{backend=cuda copy_engine_pipelining=false}",
}
"""The copy-engine programs of each collective problem: software-pipelined on the caller's
stream (the default), and spread over the pool streams as `stream-parallel` makes them."""

def _problem_variants(kind: OverlapKind, fusion: Callable[..., ModuleOp], layout: Layout) -> dict[str, HostirVariant]:
    """The programs of a collective problem, by name: NCCL's and each copy-engine one."""
    return {
        "hostir (nccl)": HostirVariant("hostir (nccl)", kind, fusion, layout),
        **{
            name: HostirVariant(name, kind, fusion, layout, pipeline=pipeline, copy_engine=True)
            for name, pipeline in COPY_ENGINE_PIPELINES.items()
        },
    }


def _with_symmetric_x(variant: HostirVariant) -> HostirVariant:
    """`variant` with X already in symmetric memory, as a model whose layer before writes its
    activations there would pass it: the copy engines read it in place, with no copy first."""
    return replace(
        variant,
        name=variant.name.replace("(cuda)", "(cuda, symmetric X)"),
        fusion=functools.partial(variant.fusion, symmetric_x=True),
    )


_ALLGATHER_MATMUL = _problem_variants(OverlapKind.ALLGATHER_MATMUL, allgather_matmul, _allgather_layout)
_P2P_CUDA = HostirVariant(
    "hostir p2p (cuda)",
    OverlapKind.ALLGATHER_MATMUL,
    p2p_allgather_matmul,
    _p2p_layout,
    pipeline="hir-lowering{p2p_backend=cuda}",
    point_to_point=True,
    copy_engine=True,
)
HOSTIR_VARIANTS = [
    *_ALLGATHER_MATMUL.values(),
    *_problem_variants(OverlapKind.MATMUL_REDUCE_SCATTER, matmul_reduce_scatter, _reduce_scatter_layout).values(),
    *_problem_variants(OverlapKind.MATMUL_ALLREDUCE, matmul_allreduce, _allreduce_layout).values(),
    HostirVariant(
        "hostir p2p (nccl)",
        OverlapKind.ALLGATHER_MATMUL,
        p2p_allgather_matmul,
        _p2p_layout,
        point_to_point=True,
    ),
    _P2P_CUDA,
    # The reductions of GEMM+RS and GEMM+AR in a pass of their own, as before
    # `reduce-scatter-in-matmul`, `reduce-scatter-ring` and `allreduce-in-matmul`.
    HostirVariant(
        "hostir (cuda, separate reduction)",
        OverlapKind.MATMUL_REDUCE_SCATTER,
        matmul_reduce_scatter,
        _reduce_scatter_layout,
        pipeline="hir-lowering{backend=cuda reduce_scatter_in_matmul=false reduce_scatter_ring=false}",
        copy_engine=True,
    ),
    HostirVariant(
        "hostir (cuda, separate reduction)",
        OverlapKind.MATMUL_ALLREDUCE,
        matmul_allreduce,
        _allreduce_layout,
        pipeline="hir-lowering{backend=cuda allreduce_in_matmul=false}",
        copy_engine=True,
    ),
    _with_symmetric_x(_ALLGATHER_MATMUL["hostir (cuda)"]),
    _with_symmetric_x(_P2P_CUDA),
]


# --------------------------------------------------------------------------- #
# Clocks                                                                       #
# --------------------------------------------------------------------------- #


class HostClock:
    """Wall time of each run on the CPU, where gloo and torch finish before the call returns."""

    def times_ms(self, run: Callable[[], object], warmup: int, reps: int) -> tuple[list[float], float]:
        for _ in range(warmup):
            run()
        times = []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        return times, statistics.median(times)


class CudaClock:
    """GPU time between CUDA events on the caller's stream, from a start common to all ranks.

    Before each run the stream sleeps for twice the host's launch time of one run (at
    least MIN_SLEEP_MS), so that the whole run is queued before its start event fires,
    and then the ranks' streams meet in a one-element allreduce. A run whose start event
    had passed on some rank before that rank's host had issued the whole run (the GPU
    may then have waited for Python) is run again with twice the sleep, up to
    MAX_SLEEP_MS, and not counted.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def _events(self) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def times_ms(self, run: Callable[[], object], warmup: int, reps: int) -> tuple[list[float], float]:
        for _ in range(warmup):
            run()
        torch.cuda.synchronize(self.device)
        launched = time.perf_counter()
        run()
        host_ms = (time.perf_counter() - launched) * 1e3
        torch.cuda.synchronize(self.device)
        sleep_ms = min(MAX_SLEEP_MS, max(MIN_SLEEP_MS, 2 * host_ms))
        times = []
        while len(times) < reps:
            start, end = self._events()
            start_together(self.device, sleep_ms)
            start.record()
            run()
            issued_late = start.query()
            end.record()
            end.synchronize()
            late = torch.tensor([float(issued_late)], device=self.device)
            dist.all_reduce(late, op=dist.ReduceOp.MAX)
            if late.item() and sleep_ms < MAX_SLEEP_MS:
                sleep_ms = min(MAX_SLEEP_MS, 2 * sleep_ms)
                continue
            times.append(start.elapsed_time(end))
        return times, host_ms


# --------------------------------------------------------------------------- #
# One rank's run                                                               #
# --------------------------------------------------------------------------- #


@contextmanager
def poisoned_allocations() -> Iterator[None]:
    """Fills every floating-point tensor that torch.empty makes with NaN, so values nobody wrote show."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    with mock.patch.object(torch, "empty", poisoned):
        yield


@dataclass
class Bench:
    """What every measurement of a rank needs."""

    communicator: Communicator
    clock: HostClock | CudaClock
    arguments: argparse.Namespace
    report: Report | None
    """Rank 0's; None on the other ranks."""

    @property
    def rank(self) -> int:
        return self.communicator.rank

    @property
    def world(self) -> int:
        return self.communicator.world_size

    def agree(self, status: str | None, check_error: float | None = None) -> tuple[str | None, float | None]:
        """The status every rank reports, or the first failing rank's, named (None if all are ok);
        and the largest check error."""
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, (status, check_error))
        statuses = [s for s, _ in everyone]
        failures = [f"{s} (rank {r})" for r, s in enumerate(statuses) if s is not None]
        errors = [e for _, e in everyone if e is not None]
        agreed = statuses[0] if len(set(statuses)) == 1 else failures[0]
        return agreed, (max(errors) if errors else None)

    def slowest(self, values: list[float]) -> list[float]:
        maxima = torch.tensor(values, dtype=torch.float64, device=self.communicator.device)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        return maxima.tolist()

    def measure(self, result: Result, build: Build, y: torch.Tensor, check: bool) -> Result:
        """Builds, checks once (if `check`) and times a contender; `result` says which, and gets the numbers."""
        status, error, tolerance, run = None, None, None, None
        try:
            with poisoned_allocations():
                run, expected = build()
                if check and expected is not None:
                    comparison = compare(run(), expected(y))
                    error, tolerance = comparison.error, comparison.tolerance
                    if comparison.problem:
                        status = f"failed: {comparison.problem}"
        except Unavailable as reason:
            status = f"unavailable: {reason}"
        except Exception as failure:  # noqa: BLE001 - any failure is reported, and the run goes on
            status = f"failed: {type(failure).__name__}: {failure}"
        result.status, result.check_error = self.agree(status, error)
        result.check_tolerance = tolerance if result.check_error is not None else None
        if result.status is None:
            try:
                times, host_ms = self.clock.times_ms(run, self.arguments.warmup, self.arguments.reps)
            except Exception as failure:  # noqa: BLE001
                times, host_ms, status = [], 0.0, f"failed: {type(failure).__name__}: {failure}"
            result.status, _ = self.agree(status)
            if result.status is None:
                *result.times_ms, result.host_ms = self.slowest([*times, host_ms])
                result.ms = statistics.median(result.times_ms)
        result.status = result.status or "ok"
        self.record(result)
        return result

    def record(self, result: Result) -> None:
        if self.report is not None:
            self.report.add(result)


def whole_operands(
    m: int, k: int, n: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bf16 X [M, K] and W [K, N], equal on every rank; Y = X @ W has entries of order one."""
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=generator, device=device) / k**0.5
    w = torch.randn(k, n, generator=generator, device=device)
    return x.to(torch.bfloat16), w.to(torch.bfloat16)


_programs: dict[tuple[HostirVariant, int], Program] = {}


def compiled(variant: HostirVariant, world: int) -> Program:
    """`variant`'s program for `world` ranks, compiled once (its extents are dynamic, so it serves every size)."""
    key = (variant, world)
    if key not in _programs:
        try:
            _programs[key] = Program.compile(variant.fusion(world), pipeline=variant.pipeline)
        except HostirError as error:
            if variant.copy_engine:
                raise Unavailable(f"no copy-engine lowering here: {error}") from None
            raise
    return _programs[key]


def lowered_problem(variant: HostirVariant, problem: OverlapProblem, world: int) -> OverlapProblem:
    """`problem` in the form `variant`'s lowering gave it, for the cost model: a GEMM+RS or
    GEMM+AR whose program adds into a product (`hir.matmul accumulate`,
    `reduce-scatter-in-matmul`, `allreduce-in-matmul`) has its reduction in the GEMM, and a
    GEMM+RS over more than two ranks that sends its rows (`reduce-scatter-ring`) is a ring
    of destinations. A program that does not compile keeps the plain form; its build says
    why it cannot run."""
    if problem.kind == OverlapKind.ALLGATHER_MATMUL:
        return problem
    try:
        program = compiled(variant, world)
    except (HostirError, Unavailable):
        return problem
    adds_into_output = any(isinstance(op, hir.MatmulOp) and op.accumulate for op in program.host.walk())
    sends = any(isinstance(op, hir.SendOp) for op in program.host.walk())
    ring = problem.kind == OverlapKind.MATMUL_REDUCE_SCATTER and world > 2 and sends
    return replace(problem, reduction_in_matmul=adds_into_output, destination_ring=ring)


def hostir_build(
    bench: Bench, variant: HostirVariant, x: torch.Tensor, w: torch.Tensor, shape: PipelineShape
) -> Build:
    """`variant`'s program run on this rank's shards of X and W laid out in `shape.chunks` chunks."""

    def build():
        program = compiled(variant, bench.world)
        whole, output_shape = variant.layout(x, w, bench.world, shape.chunks)
        local = program.with_symmetric_inputs(
            [shard(tensor, type, bench.rank) for tensor, type in zip(whole, program.input_types)],
            bench.communicator,
        )
        output_type = program.output_types[0]

        def run() -> torch.Tensor:
            return program.run(local, bench.communicator, num_streams=shape.streams)[0]

        return run, lambda y: shard(y.view(output_shape), output_type, bench.rank)

    return build


def pipeline_shapes(
    arguments: argparse.Namespace, problem: OverlapProblem, costs: StageTimes | None
) -> list[PipelineShape]:
    """The cost model's choice, or one shape per `--chunks` (streams from `--streams` or the model's rule)."""
    if not arguments.chunks:
        if costs is None:
            return [PipelineShape(1, 1, float("nan"))]
        return [choose_pipeline(problem, costs, arguments.min_chunk_rows)]
    return [shape_of(problem, costs, chunks, arguments.streams) for chunks in arguments.chunks]


def shape_of(
    problem: OverlapProblem, costs: StageTimes | None, chunks: int, streams: int | None = None
) -> PipelineShape:
    """`chunks` chunks on `streams` streams (default: the model's rule), with the model's time if it has costs."""
    predicted = pipeline_time(problem, costs, chunks) if costs and costs.covers(problem, chunks) else float("nan")
    return PipelineShape(chunks, streams or pipeline_streams(chunks), predicted)


def model_costs(bench: Bench, gemm_ms: float, comm_ms: float) -> Callable[[OverlapProblem], StageTimes]:
    """The costs the model is fed for each form of a problem (`--model`): the stages measured
    here for the chunk counts it may weigh (reported once per form), or the rates of the
    whole problem's GEMM and collective alone."""
    arguments = bench.arguments
    if arguments.model == "rates":
        latency = arguments.transfer_latency_us * 1e-6
        return lambda form: Rates.from_times(form, comm_ms * 1e-3, gemm_ms * 1e-3, transfer_latency_s=latency)

    @functools.cache
    def measured(form: OverlapProblem) -> MeasuredStages:
        counts = {*candidate_chunks(form, arguments.min_chunk_rows), *(arguments.chunks or ())}
        if form.kind == OverlapKind.ALLGATHER_MATMUL:
            counts.add(bench.world)  # the point-to-point ring's
        scattered = form.kind != OverlapKind.MATMUL_ALLREDUCE  # a chunk's rows split over the ranks
        counts = sorted(c for c in counts if form.cuts_into(c) and not (scattered and form.m // c % bench.world))
        stages = measure_stages(form, bench.communicator, counts, repeats=arguments.reps)
        if bench.report is not None:
            bench.report.add_stages(form, stages)
        return stages

    return measured


def bench_problem(bench: Bench, kind: OverlapKind, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    """Every contender of `kind` at the size of X and W."""
    (m, k), n = x.shape, w.shape[1]

    def entry(contender: str, shape: PipelineShape | None = None, **fields) -> Result:
        if shape is not None:
            predicted = shape.predicted_s * 1e3 if math.isfinite(shape.predicted_s) else None
            fields.update(chunks=shape.chunks, streams=shape.streams, predicted_ms=predicted)
        return Result(kind.value, m, k, n, contender, **fields)

    try:
        problem = OverlapProblem(kind, m, k, n, bench.world, x.element_size())
    except HostirError as error:
        bench.record(entry("every contender", status=f"skipped: {error}"))
        return
    peers = Peers(kind, x, w, bench.rank, bench.world)
    check_peers = bench.arguments.check_peers
    gemm = bench.measure(entry("GEMM alone"), peers.alone("gemm"), y, check=False)
    comm = bench.measure(entry(f"{COLLECTIVES[kind]} alone"), peers.alone("communicate"), y, check=False)
    costs_of = None
    if gemm.ms and comm.ms:
        bench.record(entry(LIMIT, ms=max(gemm.ms, comm.ms)))
        costs_of = model_costs(bench, gemm.ms, comm.ms)
    sequence = "AG then GEMM" if kind == OverlapKind.ALLGATHER_MATMUL else f"GEMM then {COLLECTIVES[kind]}"
    bench.measure(entry(sequence), peers.in_sequence(), y, check_peers)
    bench.measure(entry("symm_mem fused"), peers.symmetric_memory_fused(), y, check_peers)
    contenders = [
        ("NCCL per chunk", problem, lambda shape: peers.per_chunk(shape.chunks, shape.streams), check_peers)
    ] + [
        (
            variant.name,
            lowered_problem(variant, problem, bench.world),
            functools.partial(hostir_build, bench, variant, x, w),
            True,
        )
        for variant in HOSTIR_VARIANTS
        if variant.kind == kind and not variant.point_to_point
    ]
    for name, contender_problem, build_of, check in contenders:
        costs = costs_of(contender_problem) if costs_of else None
        for shape in pipeline_shapes(bench.arguments, contender_problem, costs):
            if problem.chunked_rows % shape.chunks:
                reason = f"skipped: {shape.chunks} chunks do not divide the {problem.chunked_rows} rows of a rank"
                bench.record(entry(name, shape, status=reason))
            else:
                bench.measure(entry(name, shape), build_of(shape), y, check)
    for variant in HOSTIR_VARIANTS:
        if variant.kind == kind and variant.point_to_point:
            point_to_point = shape_of(problem, costs_of(problem) if costs_of else None, bench.world)
            build = hostir_build(bench, variant, x, w, point_to_point)
            bench.measure(entry(variant.name, point_to_point), build, y, check=True)


def run_rank(arguments: argparse.Namespace) -> None:
    """One rank's whole benchmark; rank 0 reports."""
    deadline = threading.Timer(arguments.deadline, _past_deadline, (arguments,))
    deadline.daemon = True
    deadline.start()
    communicator = Communicator.from_env(arguments.timeout)
    device = communicator.device
    # The ranks share the host's cores (CPU ranks compute on them, GPU ranks check outputs
    # on them): without this each rank's torch would take them all.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // communicator.world_size))
    clock = CudaClock(device) if device.type == "cuda" else HostClock()
    report = None
    if communicator.rank == 0:
        config = {name: value for name, value in vars(arguments).items() if name != "out"}
        report = Report(Path(arguments.out), machine(communicator), config)
    bench = Bench(communicator, clock, arguments, report)
    for m, k, n in arguments.sizes:
        x, w = whole_operands(m, k, n, device, arguments.seed)
        y = torch.matmul(x, w)
        for kind in arguments.problems:
            bench_problem(bench, kind, x, w, y)
        del x, w, y
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if report is not None:
            # Written at every size, so that a run stopped by its deadline leaves its results.
            tables = report.write_tables()
            plot = report.write_plot()
    deadline.cancel()
    if report is not None:
        print("\n" + tables, flush=True)
        written = [report.out / "overlap.json", report.out / "overlap.md", plot]
        print(f"# wrote {', '.join(str(path) for path in written if path)}", flush=True)


def _past_deadline(arguments: argparse.Namespace) -> None:
    print(
        f"overlap: still running after --deadline {arguments.deadline:g} s; stopping. "
        f"The results so far are in {arguments.out}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(124)


# --------------------------------------------------------------------------- #
# Command line                                                                 #
# --------------------------------------------------------------------------- #


def _sizes(text: str) -> list[tuple[int, int, int]]:
    try:
        sizes = [tuple(int(e) for e in size.split(",")) for size in text.split(";") if size.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(len(size) != 3 or min(size) < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"expected sizes as 'M,K,N;M,K,N;...', got '{text}'")
    return sizes


def _counts(text: str) -> list[int]:
    try:
        counts = [int(c) for c in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers as '1,2,4', got '{text}'")
    return counts


def _problems(text: str) -> list[OverlapKind]:
    try:
        return [OverlapKind(name) for name in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected problems among {', '.join(OverlapKind)}, got '{text}'"
        ) from None


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(
        prog="overlap.py",
        description="Times hostir's pipelined GEMM + communication programs against their peers.",
    )
    options.add_argument("--nproc", type=int, help="local ranks to start (default: every GPU; 2 on the CPU)")
    options.add_argument(
        "--cpu", action="store_true", help="CPU ranks with gloo and host timers, even with GPUs"
    )
    options.add_argument(
        "--sizes", type=_sizes, help="'M,K,N;M,K,N;...' (default: the four GPU sizes of DEFAULT_SIZES; small with --cpu)"
    )
    options.add_argument(
        "--problems", type=_problems, default=list(OverlapKind), help="comma-separated, default: all three"
    )
    options.add_argument(
        "--chunks", type=_counts, help="chunk counts to sweep, '1,2,4' (default: the cost model's)"
    )
    options.add_argument("--streams", type=int, help="streams of every pipeline (default: min(chunks, 3))")
    options.add_argument(
        "--min-chunk-rows", type=int, default=DEFAULT_MIN_CHUNK_ROWS, help="the cost model's"
    )
    options.add_argument(
        "--model",
        choices=("measured", "rates"),
        default="measured",
        help="what the cost model is fed: the stages measured here (as the backend does) or the "
        "whole GEMM's and collective's rates",
    )
    options.add_argument(
        "--transfer-latency-us",
        type=float,
        default=20.0,
        help="the cost model's fixed cost per chunk transfer, with --model rates",
    )
    options.add_argument("--warmup", type=int, default=5, help="untimed runs before timing (default 5)")
    options.add_argument(
        "--reps", type=int, default=20, help="timed runs; the median is reported (default 20)"
    )
    options.add_argument(
        "--check-peers", action="store_true", help="check the peers' outputs too, not only hostir's"
    )
    options.add_argument("--seed", type=int, default=0)
    options.add_argument(
        "--out",
        default=str(DEFAULT_OUT),
        help=f"folder of overlap.json, .md, .png (default {DEFAULT_OUT}, which git ignores)",
    )
    options.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a communication may wait (default 60)"
    )
    options.add_argument(
        "--deadline", type=float, default=900.0, help="seconds the whole run may take (default 900)"
    )
    return options


def main(argv: list[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    if arguments.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    cuda = torch.cuda.is_available()
    arguments.sizes = arguments.sizes or (DEFAULT_SIZES if cuda else CPU_SIZES)
    if "RANK" in os.environ:
        run_rank(arguments)
        dist.destroy_process_group()
        return 0
    nproc = arguments.nproc or (torch.cuda.device_count() if cuda else 2)
    if cuda and nproc > torch.cuda.device_count():
        print(
            f"overlap: {nproc} ranks need {nproc} GPUs; this machine has {torch.cuda.device_count()}",
            file=sys.stderr,
        )
        return 2
    os.environ["HOSTIR_TIMEOUT_S"] = str(arguments.timeout)
    try:
        run_on_local_ranks(run_rank, nproc, arguments, timeout_s=arguments.deadline + 60)
    except RankFailed as failure:
        print(f"overlap: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
