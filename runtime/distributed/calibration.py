"""What the cost model (`hostir.passes.analysis.cost_model`) knows of this machine, measured:
a GEMM and collectives timed through a `Communicator`.

    rates = measure_rates(Communicator.from_env())         # the whole problem's rates
    stages = measure_stages(problem, Communicator.from_env(), candidate_chunks(problem))
    shape = choose_pipeline(problem, stages)               # or choose_pipeline(problem, rates)

`MeasuredChunks` is the importer's `chunks_of` that measures the stages of each problem it
is asked about, over the process group of its collective, once per process.

The model is compile-time code and lives with the passes; measuring needs devices and
peers, so it lives here, with the communicator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hostir import config
from hostir.passes.analysis.cost_model import (
    MeasuredStages,
    OverlapKind,
    OverlapProblem,
    PipelineShape,
    Rates,
    Stages,
    candidate_chunks,
    choose_pipeline,
)
from hostir.runtime.distributed.communicator import Communicator, _all_gather_single, _reduce_scatter_single


def measure_rates(
    communicator: Communicator,
    dtype: torch.dtype = torch.bfloat16,
    extent: int | None = None,
    repeats: int = 5,
) -> Rates:
    """The link bandwidth, GEMM rate and transfer latency of this machine, the slowest rank's.

    Times an allgather of [extent, extent] elements over the world, an [extent, extent]
    GEMM and a one-element allgather (the latency), each the mean of `repeats` runs
    after one warm-up; `extent` is 8192 on a GPU and 256 on the CPU unless given. Every
    rank gets the same result (the maximum of each time over the ranks), so every rank
    then chooses the same pipeline. A world of one has no link: its bandwidth is
    reported as infinite, which makes every transfer free in the model.
    """
    device = communicator.device
    extent = extent or (8192 if device.type == "cuda" else 256)
    shard_rows = max(1, extent // communicator.world_size)
    local = torch.randn(shard_rows, extent, device=device).to(dtype)
    # Random, not empty: a GEMM runs faster on constant data than on random data.
    gathered = torch.randn(shard_rows * communicator.world_size, extent, device=device).to(dtype)
    weight = torch.randn(extent, extent, device=device).to(dtype)
    product = gathered.new_empty(gathered.shape[0], extent)
    one, ones = local.new_empty(1), local.new_empty(communicator.world_size)

    if communicator.world_size > 1:
        comm_s = _seconds(lambda: _all_gather_single(gathered, local), device, repeats)
        latency_s = _seconds(lambda: _all_gather_single(ones, one), device, repeats)
    else:
        comm_s = latency_s = 0.0
    gemm_s = _seconds(lambda: torch.matmul(gathered, weight, out=product), device, repeats)
    comm_s, latency_s, gemm_s = _slowest_rank(communicator, [comm_s, latency_s, gemm_s])
    received = (communicator.world_size - 1) * local.numel() * local.element_size()
    return Rates(
        link_bytes_per_s=received / comm_s if comm_s > 0 else float("inf"),
        gemm_flops_per_s=2.0 * product.shape[0] * extent * extent / gemm_s,
        transfer_latency_s=latency_s,
    )


def _seconds(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Mean wall time of `run` over `repeats` runs after one warm-up, the device drained around them."""
    run()
    _drain(device)
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    _drain(device)
    return (time.perf_counter() - start) / repeats


def _drain(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest_rank(communicator: Communicator, values: list[float]) -> list[float]:
    """Each of `values`, the maximum over the communicator's ranks."""
    if len(communicator.ranks) == 1 or not communicator.joined:
        return values
    maxima = torch.tensor(values, dtype=torch.float64, device=communicator.device)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=communicator.group(communicator.ranks))
    return maxima.tolist()


DTYPES = {2: torch.bfloat16, 4: torch.float32}
"""The dtype a problem's elements are measured in, by their size."""


def measure_stages(
    problem: OverlapProblem, communicator: Communicator, chunk_counts: Sequence[int], repeats: int = 10
) -> MeasuredStages:
    """The stages of `problem` cut into each of `chunk_counts` chunks, the slowest rank's,
    over the communicator's ranks (which must be the problem's world) with NCCL (gloo on
    the CPU): a chunk's GEMM alone, its collective alone, and the GEMM while the collective
    of another chunk runs on a stream of its own, each the mean of `repeats` runs after one
    warm-up. Every rank of the communicator must call it with the same arguments."""
    if len(communicator.ranks) != problem.world:
        raise ValueError(f"{problem} runs over {problem.world} ranks, the communicator has {len(communicator.ranks)}")
    by_chunks = {}
    for chunks in chunk_counts:
        gemm, transfer = _chunk_stages(problem, communicator, chunks)
        together = _at_once(gemm, transfer, communicator.device)
        times = [_seconds(run, communicator.device, repeats) for run in (gemm, transfer, together)]
        by_chunks[chunks] = Stages(*_slowest_rank(communicator, times))
    return MeasuredStages(problem, by_chunks)


def _chunk_stages(
    problem: OverlapProblem, communicator: Communicator, chunks: int
) -> tuple[Callable[[], object], Callable[[], object]]:
    """One chunk's GEMM and collective on random data of the problem's dtype, as the
    pipelines of `problem.kind` run them (the module docstring of the cost model)."""
    device, dtype, world = communicator.device, DTYPES[problem.element_size], problem.world
    group = communicator.group(communicator.ranks)

    def random(*shape: int) -> torch.Tensor:
        # Random, not empty: a GEMM runs faster on constant data than on random data.
        return torch.randn(*shape, device=device).to(dtype)

    rows = problem.m // chunks
    if problem.kind == OverlapKind.ALLGATHER_MATMUL:
        x, w, piece = random(rows, problem.k), random(problem.k, problem.n), random(rows // world, problem.k)
        return lambda: torch.matmul(x, w), lambda: _all_gather_single(x, piece, group=group)
    x, w = random(problem.chunk_gemm_rows(chunks), problem.k // world), random(problem.k // world, problem.n)
    partial = random(rows, problem.n)
    if problem.kind == OverlapKind.MATMUL_REDUCE_SCATTER:
        out = partial.new_empty(rows // world, problem.n)
        return lambda: torch.matmul(x, w), lambda: _reduce_scatter_single(out, partial, dist.ReduceOp.SUM, group=group)
    return lambda: torch.matmul(x, w), lambda: dist.all_reduce(partial, group=group)


def _at_once(gemm: Callable[[], object], transfer: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """`transfer` on a stream of its own while `gemm` runs on the caller's, as a pipeline's
    steady state has them; in program order on the CPU."""
    if device.type != "cuda":
        return lambda: (transfer(), gemm())
    side = torch.cuda.Stream(device)

    def run() -> None:
        caller = torch.cuda.current_stream(device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            transfer()
        gemm()
        caller.wait_stream(side)

    return run


class MeasuredChunks:
    """The importer's `chunks_of` on a device: the cost model's choice among
    `candidate_chunks` on stages measured over the process group of the collective, once per
    problem and group in a process (`choices`). Every rank of the group imports the same
    graph, so every rank measures, at the same point, and chooses alike. `form` gives the
    problem the form that the lowering will give it over the group's communicator (a
    reduction in the GEMM, a ring of destinations), which the model weighs and the stages
    are measured for."""

    choices: dict[tuple[OverlapProblem, tuple[int, ...]], PipelineShape] = {}

    def __init__(
        self,
        device: torch.device,
        form: Callable[[OverlapProblem, Communicator], OverlapProblem] = lambda problem, communicator: problem,
    ):
        self.device = device
        self.form = form

    def __call__(self, problem: OverlapProblem, group: Any) -> int:
        return self.choice(problem, group).chunks

    def choice(self, problem: OverlapProblem, group: Any) -> PipelineShape:
        communicator = Communicator.of_group(group, self.device, config.timeout_s)
        problem = self.form(problem, communicator)
        key = (problem, communicator.ranks)
        if key not in self.choices:
            stages = measure_stages(problem, communicator, candidate_chunks(problem))
            self.choices[key] = choose_pipeline(problem, stages)
        return self.choices[key]
