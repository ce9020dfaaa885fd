"""The rates of the cost model (`hostir.passes.analysis.cost_model.Rates`), measured on this
machine: a GEMM and collectives timed through a `Communicator`.

    rates = measure_rates(Communicator.from_env())
    shape = choose_pipeline(problem, rates)

The model is compile-time code and lives with the passes; measuring needs devices and
peers, so it lives here, with the communicator.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from hostir.passes.analysis.cost_model import Rates
from hostir.runtime.distributed.communicator import Communicator, _all_gather_single


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
    """Each of `values`, the maximum over the ranks of the world."""
    if communicator.world_size == 1:
        return values
    maxima = torch.tensor(values, dtype=torch.float64, device=communicator.device)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
    return maxima.tolist()
