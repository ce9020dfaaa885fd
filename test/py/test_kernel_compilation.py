"""Every kind of generated kernel compiles, and moves the vectors its plan chose.

A table of launches (pointwise and row kernels; f32, bf16 and other dtypes; vector and scalar
layouts; 32-bit and 64-bit indices) planned on CPU or meta tensors; each source is compiled
to PTX for sm_90 with nvcc, and the PTX's global loads and stores are as wide as the plan
says: 16-byte `.v4` instructions for 16-byte vectors, none wider than an element for scalar
layouts. So the GPU tests only have to check numbers. Skips where nvcc is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from xdsl.dialects import func

from hostir.runtime.codegen import kernels
from test_kernels import _rotary, _rows_plus_bias_times_column, build_segment, empty
from test_row_reductions import _rms_norm_segment, _softmax_segment, backward_segment

NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")

BF16, F32 = torch.bfloat16, torch.float32


class Case(NamedTuple):
    segment: Callable[[], func.FuncOp]
    ins: Callable[[], list[torch.Tensor]]
    outs: Callable[[], list[torch.Tensor]]
    vector_bytes: int
    """The bytes of the widest vector the plan gives the launch's accesses; 0 for scalar."""


def _bias_case(x: Callable[[], torch.Tensor], vector_bytes: int, device: str = "cpu") -> Case:
    def ins() -> list[torch.Tensor]:
        rows, columns = (tensor := x()).shape
        return [tensor, empty([columns], tensor.dtype, device), empty([rows], tensor.dtype, device)]

    def outs() -> list[torch.Tensor]:
        tensor = x()
        return [empty(list(tensor.shape), tensor.dtype, device)]

    return Case(lambda: _rows_plus_bias_times_column({F32: "f32", BF16: "bf16"}[x().dtype]), ins, outs, vector_bytes)


def _casts() -> func.FuncOp:
    def define(fb):
        x = fb.input([None], "f32")
        return [fb.cast(x, target) for target in ("bf16", "f16", "f64", "i64", "i32", "i8", "i1")]

    return build_segment(define, "casts")


def _integers() -> func.FuncOp:
    def define(fb):
        x, y = fb.input([None, None], "i8"), fb.input([None], "i8")
        return [fb.maximum(fb.pow(x, y), fb.abs(x - y))]

    return build_segment(define, "integers")


def _rotary_case(head_dim: int, vector_bytes: int, backward: bool = False) -> Case:
    """The rotary embedding's multiply-add (or its backward's), bf16, heads of `head_dim`: x
    loaded as it is and rotated, at the other half of the head."""
    shape, table = [2, 16, 4, head_dim], [16, 1, head_dim]
    second = shape if backward else table  # the backward's g where the forward's cos
    return Case(
        lambda: _rotary("bf16", backward),
        lambda: [empty(shape, BF16), empty(second, BF16), empty(table, BF16)],
        lambda: [empty(shape, BF16)],
        vector_bytes,
    )


def _rms_norm_case(rows: int, columns: int, dtype: torch.dtype, vector_bytes: int, x=None) -> Case:
    def ins() -> list[torch.Tensor]:
        return [empty([rows, columns], dtype) if x is None else x(), empty([columns], dtype)]

    return Case(
        lambda: _rms_norm_segment(rows, columns, {F32: "f32", BF16: "bf16"}[dtype]),
        ins,
        lambda: [empty([rows, 1], F32), empty([rows, columns], dtype)],
        vector_bytes,
    )


def _backward_case(rows: int, columns: int) -> Case:
    """RMSNorm's backward (benchmarks/rmsnorm_segment.py): three bf16 loads kept in registers,
    a per-row f32 input read once per vector, and the weight's gradient summed over the rows."""
    return Case(
        lambda: backward_segment(rows, columns, BF16),
        lambda: [*(empty([rows, columns], BF16) for _ in "gx"), empty([columns], BF16), empty([rows, 1], F32)],
        lambda: [empty([1, columns], F32), empty([rows, columns], BF16)],
        16,
    )


CASES = {
    "pointwise bf16 vector": _bias_case(lambda: empty([64, 4096], BF16), 16),
    "pointwise f32 vector": _bias_case(lambda: empty([64, 4096], F32), 16),
    "pointwise bf16 vectors of 4": _bias_case(lambda: empty([64, 4100], BF16), 8),
    "pointwise bf16 scalar odd extent": _bias_case(lambda: empty([64, 4095], BF16), 0),
    "pointwise f32 scalar transposed": _bias_case(lambda: empty([4096, 64], F32).t(), 0),
    "pointwise bf16 64-bit indices": _bias_case(
        lambda: empty([2**31], BF16, "meta").as_strided([4, 8], [2**29, 1]), 16, "meta"
    ),
    "pointwise casts, one axis and a tail": Case(
        _casts,
        lambda: [empty([1001], F32)],
        lambda: [empty([1001], d) for d in (BF16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8, torch.bool)],
        16,
    ),
    "pointwise i8 vectors of 16": Case(
        _integers, lambda: [empty([8, 64], torch.int8), empty([64], torch.int8)], lambda: [empty([8, 64], torch.int8)], 16
    ),
    "pointwise bf16 rotary vector": _rotary_case(128, 16),
    "pointwise bf16 rotary backward vector": _rotary_case(128, 16, backward=True),
    "pointwise bf16 rotary vectors of 4": _rotary_case(8, 8),
    "pointwise bf16 rotary scalar": _rotary_case(6, 0),
    "rows f32 warp vector": _rms_norm_case(300, 64, F32, 16),
    "rows bf16 4096 vector": _rms_norm_case(300, 4096, BF16, 16),
    "rows bf16 8192 vector": _rms_norm_case(300, 8192, BF16, 16),
    "rows bf16 scalar odd": _rms_norm_case(30, 4097, BF16, 0),
    "rows f32 scalar transposed": _rms_norm_case(30, 4096, F32, 0, lambda: empty([4096, 30], F32).t()),
    "rows f32 read twice": _rms_norm_case(2, 65536, F32, 16),
    "rows bf16 backward 8192": _backward_case(16, 8192),
    "rows bf16 backward warp": _backward_case(300, 64),
    "rows f32 softmax warp": Case(lambda: _softmax_segment(1024), lambda: [empty([4, 1024], F32)], lambda: [empty([4, 1024], F32)], 16),
    "rows f32 softmax block": Case(lambda: _softmax_segment(4096), lambda: [empty([4, 4096], F32)], lambda: [empty([4, 4096], F32)], 16),
}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed: the generated CUDA C cannot be compiled here")
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_generated_source_compiles_to_the_planned_accesses(case, tmp_path):
    kernel = kernels.SegmentKernel(case.segment())
    ins, outs = case.ins(), case.outs()
    layout = kernel.plan(ins, outs).layout
    assert (layout.vector > 1) == (case.vector_bytes > 0)
    source = tmp_path / "kernel.cu"
    source.write_text(kernel.source(ins, outs))
    ptx = tmp_path / "kernel.ptx"
    compiled = subprocess.run(
        [NVCC, "--ptx", "-arch=sm_90", "-o", str(ptx), str(source)], capture_output=True, text=True, timeout=300
    )
    assert compiled.returncode == 0, compiled.stderr
    code = ptx.read_text()
    assert f".entry {kernels.KERNEL_NAME}(" in code
    if case.vector_bytes:
        assert max(_widest(code, "ld"), _widest(code, "st")) == case.vector_bytes
    else:
        assert not re.search(r"\b(ld|st)\.global(\.nc)?\.v\d", code), "a scalar layout moves an element an instruction"


def _widest(ptx: str, op: str) -> int:
    """The bytes of the widest global `op` (ld, st) of `ptx`: `ld.global.v4.u32` moves 16."""
    widths = re.findall(rf"\b{op}\.global(?:\.nc)?(?:\.v(\d))?\.[a-z]+(\d+)\b", ptx)
    return max((int(count or 1) * int(bits) // 8 for count, bits in widths), default=0)
