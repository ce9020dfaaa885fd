"""A pointwise segment of 8 ops on bf16: the fused kernel against torch eager and torch.compile.

    python benchmarks/pointwise_segment.py [--elements N] [--repeats R]

Each way of computing the segment is timed with CUDA events around one run, after
warm-up, as the median of `--repeats` runs; a sleep queued on the GPU before each run
keeps Python's launch time out of the measurement, so every figure is GPU time.
Achieved bandwidth counts the bytes the segment must move (its two inputs read, its
output written once), whatever the way moves in fact: torch eager, which writes and
reads back every intermediate, achieves less. The reference is a device-to-device
copy (`dst.copy_(src)`) moving the same number of bytes, measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
from xdsl.dialects import func

from gpu_timing import gpu_median_ms
from hostir_dialect.builder import FusionBuilder
from hostir.runtime.codegen import kernels
from hostir.runtime.interpreter import fusion_eval

HOLD_MS = 1.0
"""GPU time queued before each timed run: longer than Python takes to launch one."""


def segment() -> func.FuncOp:
    """8 pointwise ops (and a constant) of two bf16 vectors, one bf16 result."""
    fb = FusionBuilder("bench_segment")
    x, y = fb.input([None], "bf16"), fb.input([None], "bf16")
    gate = fb.sigmoid(x * 1.702)  # mul, sigmoid
    shifted = fb.tanh(y - x)  # sub, tanh
    mixed = fb.maximum(x * gate, shifted)  # mul, maximum
    fb.output(fb.abs(mixed) + y)  # abs, add
    return fb.build().body.block.first_op


def eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The segment in torch, op by op, as a user would write it."""
    return torch.abs(torch.maximum(x * torch.sigmoid(x * 1.702), torch.tanh(y - x))) + y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=1 << 28, help="elements per tensor")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per method (>= 20)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "pointwise_segment.py measures GPU bandwidth: it needs a CUDA GPU, none is visible"
        )
    if kernels.cupy is None:
        sys.exit("pointwise_segment.py needs CuPy for the fused kernel: pip install 'hostir[gpu]'")
    if args.repeats < 20:
        sys.exit("--repeats must be at least 20: the medians are of 20 runs or more")

    n = args.elements
    generator = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=generator) for _ in "xy")
    out = torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    moved = 3 * n * x.element_size()  # x and y read, out written

    fused_segment = segment()
    kernel = kernels.SegmentKernel(fused_segment)
    if not kernel.launch([x, y], [out]):
        sys.exit("the fused kernel did not run on these tensors")
    torch.testing.assert_close(out, fusion_eval.evaluate(fused_segment, [x, y])[0])
    compiled = torch.compile(eager)

    copy_source = torch.empty(moved // 2, device="cuda", dtype=torch.uint8)
    copy_target = torch.empty_like(copy_source)
    methods: dict[str, Callable[[], object]] = {
        "device-to-device copy": lambda: copy_target.copy_(copy_source),
        "fused kernel (hostir)": lambda: kernel.launch([x, y], [out]),
        "torch eager": lambda: eager(x, y),
        "torch.compile": lambda: compiled(x, y),
    }
    times = {name: gpu_median_ms(run, args.repeats, HOLD_MS) for name, run in methods.items()}
    copy_bandwidth = moved / times["device-to-device copy"] / 1e6

    device = torch.cuda.get_device_name()
    print(
        f"{n} bf16 elements, {moved / 1e9:.2f} GB moved per run, {device}, median of {args.repeats}"
    )
    print(f"{'method':<24}{'ms':>10}{'GB/s':>10}{'of copy':>10}")
    for name, ms in times.items():
        bandwidth = moved / ms / 1e6
        print(f"{name:<24}{ms:>10.3f}{bandwidth:>10.0f}{bandwidth / copy_bandwidth:>10.0%}")


if __name__ == "__main__":
    main()
