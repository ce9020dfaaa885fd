"""RMSNorm's forward and backward as hostir's row kernels, against ATen's ops and inductor.

    python benchmarks/rmsnorm_segment.py [--rows R] [--columns 4096 8192] [--dtype bfloat16] [--repeats N]

Each segment is the one fusion-to-hir makes of torch's RMSNorm as the importer reads it
(the mean a row sum divided by the row's length; bf16 computed in f32 and rounded once):
the forward writes the output and the per-row scale that the backward reads; the backward
writes the input's gradient and the weight's gradient in f32 (the column sum of the
output's gradient times the normalized input, over the rows). Three ways run each: the fused kernel (hostir), the
same ops as eager ATen calls (torch's decomposition run op by op, what hostir launched
before), and inductor (`torch.compile` of that decomposition). Every figure is GPU time
(CUDA events around one run after warm-up, the stream held before each so that Python's
launch time stays out), the median of `--repeats`, with the bandwidth of the bytes each
must move (inputs read once, outputs written once). Every way is checked against the
others' results first.
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

HOLD_MS = 1.0
EPS = 1e-5
NAMES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def forward_segment(rows: int, columns: int, dtype: torch.dtype) -> func.FuncOp:
    """y = x * rsqrt(mean(x^2) + eps) * w in f32, cast back; and the scale, per row."""
    fb = FusionBuilder("rms_norm_forward")
    x, w = fb.input([rows, columns], NAMES[dtype]), fb.input([columns], NAMES[dtype])
    xf, wf = fb.cast(x, "f32"), fb.cast(w, "f32")
    scale = fb.rsqrt(fb.sum(fb.pow(xf, 2.0), 1, keepdim=True) / float(columns) + EPS)
    fb.output(scale)
    fb.output(fb.cast(xf * scale * wf, NAMES[dtype]))
    return fb.build().body.block.first_op


def backward_segment(rows: int, columns: int, dtype: torch.dtype, keepdim: bool = True) -> func.FuncOp:
    """torch's decomposition of RMSNorm's backward, as fusion-to-hir makes it one segment: the
    weight's gradient in f32 (the product of the output's gradient and the normalized
    input, summed over the rows, of shape [1, columns], or [columns] without `keepdim`, as
    torch's decomposition of the fused RMSNorm's backward sums it), and the input's gradient."""
    fb = FusionBuilder("rms_norm_backward")
    g, x, w = (fb.input(shape, NAMES[dtype]) for shape in ([rows, columns], [rows, columns], [columns]))
    scale = fb.input([rows, 1], "f32")
    gf, xf, wf = fb.cast(g, "f32"), fb.cast(x, "f32"), fb.cast(w, "f32")
    fb.output(fb.sum(gf * (xf * scale), 0, keepdim=keepdim))
    dx_hat = gf * wf
    row = fb.sum(dx_hat * xf, 1, keepdim=True) * -0.5 * fb.pow(scale, 3.0)
    spread = fb.expand(row, [rows, columns]) / float(columns)
    fb.output(fb.cast(dx_hat * scale + spread * (xf * 2.0), NAMES[dtype]))
    return fb.build().body.block.first_op


def eager_forward(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's ops as ATen calls, as the importer reads torch's RMSNorm."""
    xf = x.float()
    scale = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / x.shape[-1] + EPS)
    return scale, (xf * scale * w.float()).to(x.dtype)


def eager_backward(g, x, w, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's ops as ATen calls."""
    gf, xf, wf = g.float(), x.float(), w.float()
    dx_hat = gf * wf
    row = (dx_hat * xf).sum(-1, keepdim=True) * -0.5 * scale.pow(3)
    spread = row.expand_as(xf) / x.shape[-1]
    return (gf * (xf * scale)).sum(0, keepdim=True), (dx_hat * scale + spread * (xf * 2.0)).to(x.dtype)


def measure(rows: int, columns: int, dtype: torch.dtype, repeats: int) -> list[tuple[str, str, float, float]]:
    """(pass, method, ms, GB/s) of the forward and the backward at one size."""
    generator = torch.Generator(device="cuda").manual_seed(columns)
    x, g = (torch.randn(rows, columns, device="cuda", generator=generator).to(dtype) for _ in "xg")
    w = torch.randn(columns, device="cuda", generator=generator).to(dtype)
    scale = torch.empty(rows, 1, device="cuda")
    y = torch.empty(rows, columns, device="cuda", dtype=dtype)
    gw, dx = torch.empty(1, columns, device="cuda"), torch.empty(rows, columns, device="cuda", dtype=dtype)
    row_bytes = rows * columns * x.element_size()
    passes = {
        "forward": (forward_segment(rows, columns, dtype), [x, w], [scale, y], eager_forward, 2 * row_bytes),
        "backward": (backward_segment(rows, columns, dtype), [g, x, w, scale], [gw, dx], eager_backward, 3 * row_bytes),
    }
    results = []
    for name, (segment, ins, outs, eager, moved) in passes.items():
        kernel = kernels.SegmentKernel(segment)
        if not kernel.launch(ins, outs):
            sys.exit("the fused kernel did not run on these tensors")
        compiled = torch.compile(eager)
        for reference in (eager(*ins), compiled(*ins)):
            for out, expected in zip(outs, reference, strict=True):
                # (inductor's compiled sum may drop the kept axis of the weight's gradient)
                torch.testing.assert_close(
                    out.reshape(expected.shape), expected, rtol=1e-5 if dtype == torch.float32 else 1.6e-2, atol=1e-5
                )
        methods: dict[str, Callable[[], object]] = {
            "fused kernel (hostir)": lambda: kernel.launch(ins, outs),
            "ATen ops (eager)": lambda: eager(*ins),
            "inductor": lambda: compiled(*ins),
        }
        for method, run in methods.items():
            ms = gpu_median_ms(run, repeats, HOLD_MS)
            results.append((name, method, ms, moved / ms / 1e6))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16384, help="rows (tokens) per run")
    parser.add_argument("--columns", type=int, nargs="+", default=[4096, 8192], help="row lengths (model dims)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per method (>= 20)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rmsnorm_segment.py measures GPU kernels: it needs a CUDA GPU, none is visible")
    if kernels.cupy is None:
        sys.exit("rmsnorm_segment.py needs CuPy for the fused kernel: pip install 'hostir[gpu]'")
    if args.repeats < 20:
        sys.exit("--repeats must be at least 20: the medians are of 20 runs or more")
    dtype = getattr(torch, args.dtype)
    print(f"RMSNorm, {args.rows} rows, {args.dtype}, {torch.cuda.get_device_name()}, median of {args.repeats}")
    print(f"{'columns':>8}  {'pass':<9}{'method':<24}{'ms':>9}{'GB/s':>8}")
    for columns in args.columns:
        for name, method, ms, bandwidth in measure(args.rows, columns, dtype, args.repeats):
            print(f"{columns:>8}  {name:<9}{method:<24}{ms:>9.3f}{bandwidth:>8.0f}")


if __name__ == "__main__":
    main()
