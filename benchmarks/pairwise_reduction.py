"""The reduction at a copy-engine wait in a team of two: one pairwise op against copy + reduce.

    python benchmarks/pairwise_reduction.py [--rows 1024,2048] [--cols 8192] [--repeats 50]

A reduce-scatter or allreduce on the copy engines ends, at its `hir.wait`, with a
memory-bound pass on the SMs between two GEMMs (docs/copy-engine.md). In a team of two
the runtime runs `PAIRWISE` (the own piece read in place, the peer's from the staging
buffer); in a larger team it copies the own piece into its staging slot and runs
`REDUCTIONS` over the slots. This times both, with `runtime.distributed.copy_engine.reduction`, on bf16
pieces of `rows x cols` (1024 x 8192 is a chunk of GEMM+RS at 8192³ in 4 chunks on 2
GPUs; 2048 x 8192 one of GEMM+AR), GPU time with CUDA events (benchmarks/gpu_timing.py).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from gpu_timing import gpu_median_ms
from hostir.runtime.distributed.copy_engine import reduction

HOLD_MS = 1.0
"""GPU time queued before each timed run: longer than Python takes to launch one."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1024,2048", help="comma-separated rows of a piece")
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=50)
    arguments = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("pairwise_reduction: needs a CUDA GPU", file=sys.stderr)
        return 1
    generator = torch.Generator(device="cuda").manual_seed(0)
    device = torch.cuda.get_device_name()
    print(f"reduction of two bf16 pieces, {device}, median GPU time of {arguments.repeats}")
    print(f"{'piece':>14}  {'copy + reduce':>14}  {'pairwise':>10}  ratio")
    for rows in map(int, arguments.rows.split(",")):
        shape = (rows, arguments.cols)
        staging = torch.randn(2, *shape, device="cuda", generator=generator).bfloat16()
        piece = torch.randn(*shape, device="cuda", generator=generator).bfloat16()
        output = torch.empty_like(piece)

        slots, pairwise = (
            reduction(staging, 0, piece, output, dist.ReduceOp.SUM, in_place=in_place) for in_place in (False, True)
        )
        slow, fast = (gpu_median_ms(run, arguments.repeats, HOLD_MS) * 1e3 for run in (slots, pairwise))
        print(f"{rows:>6} x {arguments.cols:<6}  {slow:>11.1f} us  {fast:>7.1f} us  {slow / fast:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
