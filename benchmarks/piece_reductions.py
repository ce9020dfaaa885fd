"""The reduction at a copy-engine wait: the own piece's copy and ATen's reduction over the
staging slots, against the generated kernel of the pieces and, in a team of two, one
pairwise op.

    python benchmarks/piece_reductions.py [--members 2,4,8] [--rows 1024,2048] [--cols 8192] [--repeats 50]

A reduce-scatter or allreduce on the copy engines ends, at its `hir.wait`, with a
memory-bound pass on the SMs between two GEMMs (docs/copy-engine.md); a ring's
reduce-scatter ends with the same sum of the pieces (`reduction-in-kernel`). Before the
generated kernel, a team of more than two copied the own piece into its staging slot and
ran ATen's `torch.sum` over the slots' axis (`reduction_in_slots`); now
`runtime.distributed.copy_engine.reduction` launches a kernel that reads the peers'
slots and the own piece in place; a team of two may instead run `PAIRWISE` (one
elementwise op). This times each, on bf16 pieces of `rows x cols` for each team size, GPU
time with CUDA events (benchmarks/gpu_timing.py), and checks that they give the same bits
(1024 x 8192 is a chunk of GEMM+RS at 8192³ in 4 chunks on 2 GPUs; 2048 x 8192 one of
GEMM+AR).
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch
import torch.distributed as dist

from gpu_timing import gpu_median_ms
from hostir.runtime.distributed.copy_engine import reduction, reduction_in_slots

HOLD_MS = 1.0
"""GPU time queued before each timed run: longer than Python takes to launch one."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", default="2,4,8", help="comma-separated team sizes")
    parser.add_argument("--rows", default="1024,2048", help="comma-separated rows of a piece")
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=50)
    arguments = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("piece_reductions: needs a CUDA GPU", file=sys.stderr)
        return 1
    generator = torch.Generator(device="cuda").manual_seed(0)
    print(f"reduction of bf16 pieces, {torch.cuda.get_device_name()}, median GPU time of {arguments.repeats}")
    print(f"{'members':>7}  {'piece':>14}  {'copy + ATen':>12}  {'kernel':>10}  {'pairwise':>10}  ATen / kernel  same bits")
    for members in map(int, arguments.members.split(",")):
        for rows in map(int, arguments.rows.split(",")):
            shape = (rows, arguments.cols)
            staging = torch.randn(members, *shape, device="cuda", generator=generator).bfloat16()
            piece = torch.randn(*shape, device="cuda", generator=generator).bfloat16()
            outputs = {way: torch.full_like(piece, float("nan")) for way in ("aten", "kernel", "pairwise")}

            runs = {
                "aten": functools.partial(reduction_in_slots, staging, 0, piece, outputs["aten"], dist.ReduceOp.SUM),
                "kernel": reduction(staging, 0, piece, outputs["kernel"], dist.ReduceOp.SUM, in_place=False),
            }
            if members == 2:
                runs["pairwise"] = reduction(staging, 0, piece, outputs["pairwise"], dist.ReduceOp.SUM, in_place=True)
            times = {way: gpu_median_ms(run, arguments.repeats, HOLD_MS) * 1e3 for way, run in runs.items()}
            same = all(torch.equal(outputs[way], outputs["aten"]) for way in runs)
            pairwise = f"{times['pairwise']:>7.1f} us" if "pairwise" in times else f"{'-':>10}"
            print(
                f"{members:>7}  {rows:>6} x {arguments.cols:<6}  {times['aten']:>9.1f} us  {times['kernel']:>7.1f} us  "
                f"{pairwise}  {times['aten'] / times['kernel']:>12.2f}x  {same}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
