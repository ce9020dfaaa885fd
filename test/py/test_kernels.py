"""Fused CUDA kernels of pointwise segments (runtime/codegen/kernels.py).

On any machine: the generated CUDA C (exact text and FileCheck-style line checks),
the cache key (the source) across sizes, dtypes and layouts, refusals, and the
CPU path, which leaves a segment to fusion_eval. On a GPU with CuPy: every
pointwise op and cast in every dtype torch defines it for, against torch eager
through fusion_eval on the same device, with broadcasting, non-contiguous inputs
and outputs, random data and outputs poisoned before each run; compilation counts;
the stream the kernel runs on; HOSTIR_DUMP.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from examples.reference_fusions import REFERENCE_FUSIONS
from hostir_dialect import fusion
from hostir_dialect.builder import FusionBuilder, Tensor
from hostir_dialect.text import HostirError, parse_module
from hostir.runtime.codegen import kernels
from hostir.runtime.codegen.body import Access, SegmentBody, fusable_ops, needed_axis_maps
from hostir.runtime.codegen.expressions import HELPERS
from hostir.runtime.codegen.layout import merge_axes
from hostir.runtime.codegen.source import KERNEL_NAME
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.interpreter import fusion_eval
from hostir.runtime.interpreter.compute import segment_runner
from hostir.runtime.program import Program
from hostir.runtime.reference import compare, random_inputs
from test_interpreter import poisoned_allocations

EXAMPLES = Path(__file__).parents[2] / "examples"

DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "i8": torch.int8,
    "i1": torch.bool,
}
FLOATS = ("f64", "f32", "f16", "bf16")
INTEGERS = ("i64", "i32", "i8")

UNARY_OPS: dict[str, tuple[str, ...]] = {
    "neg": FLOATS + INTEGERS,
    "abs": FLOATS + INTEGERS,
    "exp": FLOATS,
    "log": FLOATS,
    "sqrt": FLOATS,
    "rsqrt": FLOATS,
    "relu": FLOATS + INTEGERS,
    "tanh": FLOATS,
    "sigmoid": FLOATS,
    "erf": FLOATS,
}
"""Each unary op and the dtypes on which torch gives a result of the operand's dtype."""

BINARY_OPS: dict[str, tuple[str, ...]] = {
    "add": FLOATS + INTEGERS + ("i1",),
    "sub": FLOATS + INTEGERS,
    "mul": FLOATS + INTEGERS + ("i1",),
    "div": FLOATS,
    "maximum": FLOATS + INTEGERS + ("i1",),
    "minimum": FLOATS + INTEGERS + ("i1",),
    "pow": FLOATS + INTEGERS,
}


def build_segment(
    define: Callable[[FusionBuilder], Sequence[Tensor]], name: str = "seg"
) -> func.FuncOp:
    """A segment built with the FusionBuilder: `define(fb)` makes inputs and returns the outputs."""
    fb = FusionBuilder(name)
    for output in define(fb):
        fb.output(output)
    return fb.build().body.block.first_op


def parse_segment(text: str) -> func.FuncOp:
    return parse_module(text).body.block.first_op


def assert_lines_in_order(text: str, lines: Sequence[str]) -> None:
    """FileCheck's CHECK: each line occurs in `text`, after the previous one."""
    position = 0
    for line in lines:
        found = text.find(line, position)
        assert found >= 0, f"{line!r} not found after offset {position} in:\n{text}"
        position = found + len(line)


def empty(shape: Sequence[int], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


# --------------------------------------------------------------------------- #
# Generated source (any machine)                                               #
# --------------------------------------------------------------------------- #

F32_CHAIN = """\
__device__ __forceinline__ void hostir_segment_body(const float a0, const float a1, float& r0) {
  const float v0 = a0;
  const float v1 = a1;
  const float v2 = v0 * v1;
  const float v3 = expf(v2);
  const float v4 = v3 + v0;
  r0 = v4;
}

extern "C" __global__ void hostir_segment(const float* in0, const float* in1, float* out0, int n) {
  const int step = static_cast<int>(gridDim.x) * blockDim.x;
  const int first = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Vectors of 4 elements; a thread moves one a step.
  const int vectors = n / 4;
  for (int k = first; k < vectors; k += step) {
    const int i = k * 4;
    const hostir_vector<float, 4> a0 = hostir_load<4>(in0 + i);
    const hostir_vector<float, 4> a1 = hostir_load<4>(in1 + i);
    hostir_vector<float, 4> r0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      hostir_segment_body(a0.v[e], a1.v[e], r0.v[e]);
    }
    hostir_store(out0 + i, r0);
  }
  for (int i = vectors * 4 + first; i < n; i += step) {
    hostir_segment_body(in0[i], in1[i], out0[i]);
  }
}
"""


def f32_chain() -> func.FuncOp:
    def define(fb):
        x, y = fb.input([None, 8], "f32"), fb.input([None, 8], "f32")
        return [fb.exp(x * y) + x]

    return build_segment(define)


def test_f32_chain_source_is_one_vectorised_grid_stride_loop():
    x, y, out = torch.randn(4, 8), torch.randn(4, 8), empty([4, 8], torch.float32)
    source = kernels.generated_source(f32_chain(), [x, y], [out])
    helpers = [HELPERS[name] for name in ("hostir_vector", "hostir_load", "hostir_store")]
    assert source == "\n\n".join([*helpers, F32_CHAIN])


def test_bf16_is_loaded_as_bits_computed_in_f32_and_rounded_once_on_store():
    def define(fb):
        x, y = fb.input([64], "bf16"), fb.input([64], "bf16")
        return [fb.sigmoid(fb.tanh(x) * y)]

    x, y, out = (torch.randn(64, dtype=torch.bfloat16) for _ in range(3))
    source = kernels.generated_source(build_segment(define), [x, y], [out])
    assert_lines_in_order(
        source,
        [
            "unsigned short hostir_f32_to_bf16(float value)",
            "(bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16",
            "void hostir_segment_body(const unsigned short a0, const unsigned short a1, unsigned short& r0)",
            "const float v0 = hostir_bf16_to_f32(a0);",
            "const float v1 = hostir_bf16_to_f32(a1);",
            "const float v2 = tanhf(v0);",
            "const float v3 = v2 * v1;",
            "const float v4 = 1 / (1 + expf(-v3));",
            "r0 = hostir_f32_to_bf16(v4);",
            "const int vectors = n / 8;",
            "hostir_vector<unsigned short, 8> a0",
        ],
    )
    assert source.count("hostir_f32_to_bf16(") == 2, "one definition, one rounding on store"


@pytest.mark.parametrize(
    ("exponent", "expected"),
    [(1.0, "= v0;"), (2.0, "(v0 * v0)"), (3.0, "(v0 * v0 * v0)"), (4.0, "powf(v0, "), (0.5, "powf(v0, ")],
)
def test_small_powers_are_products_and_other_powers_call_libm(exponent, expected):
    """`x ** 2` (RMSNorm's) is `x * x`, and `x ** 1` and `x ** 3` (its backward's) `x` and
    `x * x * x`, as ATen computes them: libm's powf costs tens of instructions an element,
    which made the norm's row kernels compute-bound."""

    def define(fb):
        x = fb.input([64], "f32")
        return [x**exponent]

    x, out = torch.randn(64), empty([64], torch.float32)
    source = kernels.generated_source(build_segment(define), [x], [out])
    assert expected in source and ("powf" in source) == (exponent not in (1.0, 2.0, 3.0)), source


def test_broadcast_operand_walks_only_its_axes_with_its_strides():
    """A bias added to the rows: it walks axis 1 of the space alone. With stride 1 it is
    loaded in vectors as the rows are (its lines start at its address); with stride 2 it takes
    its stride as an argument, and the whole launch is scalar."""

    def define(fb):
        x, bias = fb.input([4, 8], "f32"), fb.input([8], "f32")
        return [x + bias]

    segment = build_segment(define)
    source = kernels.generated_source(segment, [torch.randn(4, 8), torch.randn(8)], [empty([4, 8], torch.float32)])
    assert_lines_in_order(
        source,
        [
            "(const float* in0, const float* in1, float* out0, int n, int extent1) {",
            "for (int k = first; k < vectors; k += step) {",
            "const int i = k * 4;",
            "int rest = i;",
            "const int i1 = rest % extent1;",
            "const hostir_vector<float, 4> a0 = hostir_load<4>(in0 + i);",
            "const hostir_vector<float, 4> a1 = hostir_load<4>(in1 + i1);",
            "hostir_segment_body(a0.v[e], a1.v[e], r0.v[e]);",
            "hostir_store(out0 + i, r0);",
        ],
    )
    every_other = torch.randn(16)[::2]
    source = kernels.generated_source(segment, [torch.randn(4, 8), every_other], [empty([4, 8], torch.float32)])
    assert_lines_in_order(
        source,
        [
            "(const float* in0, const float* in1, float* out0, int n, int extent1, int in1_stride1) {",
            "for (int i = first; i < n; i += step) {",
            "const int i1 = rest % extent1;",
            "hostir_segment_body(in0[i], in1[i1 * in1_stride1], out0[i]);",
        ],
    )
    assert "hostir_vector" not in source


def test_broadcast_op_maps_its_input_to_the_outer_axis():
    def define(fb):
        x, column = fb.input([4, 8], "f32"), fb.input([4], "f32")
        return [x * fb.broadcast(column, 1)]

    source = kernels.generated_source(
        build_segment(define), [torch.randn(4, 8), torch.randn(4)], [empty([4, 8], torch.float32)]
    )
    # The column is broadcast along the innermost axis: one element of it per vector of x.
    assert_lines_in_order(
        source,
        [
            "(const float* in0, const float* in1, float* out0, int n, int extent1) {",
            "rest /= extent1;",
            "const int i0 = rest;",
            "const hostir_vector<float, 4> a0 = hostir_load<4>(in0 + i);",
            "const float a1 = in1[i0];",
            "hostir_segment_body(a0.v[e], a1, r0.v[e]);",
        ],
    )


def test_value_read_through_two_axis_maps_is_loaded_twice():
    """x[j] + x[i] for a square x: one input, two loads of it."""

    def define(fb):
        x = fb.input([4], "f32")
        return [fb.broadcast(x, 1) + x]

    source = kernels.generated_source(
        build_segment(define), [torch.randn(4)], [empty([4, 4], torch.float32)]
    )
    assert_lines_in_order(
        source,
        [
            "(const float a0, const float a1, float& r0)",
            "const float v0 = a0;",
            "const float v1 = a1;",
            "const float v2 = v1 + v0;",
            "(const float* in0, const float* in1, float* out0, int n, int extent1)",
            "const hostir_vector<float, 4> a0 = hostir_load<4>(in0 + i1);",
            "const float a1 = in1[i0];",
            "hostir_segment_body(a0.v[e], a1, r0.v[e]);",
        ],
    )


def test_the_axis_maps_each_value_is_needed_under_follow_its_readers_back():
    """The analysis alone, x[j] + x[i] again: the add reads x right-aligned (axis 1 of the
    iteration space), the broadcast inserts axis 1 and leaves it axis 0; both loads, in the
    order the walk back from the output finds them."""

    def define(fb):
        x = fb.input([4], "f32")
        return [fb.broadcast(x, 1) + x]

    segment = build_segment(define)
    ops, outputs = fusable_ops(segment)
    maps = needed_axis_maps(ops, outputs, [(0, 1)])
    assert list(maps[segment.args[0]]) == [(1,), (0,)]
    assert list(maps[outputs[0]]) == [(0, 1)]


def test_constants_hold_the_value_rounded_to_their_dtype():
    constants = [
        (0.1, "bf16"),
        (0.1, "f64"),
        (-(2**63), "i64"),
        (True, "i1"),
        (float("inf"), "f32"),
    ]

    def define(fb):
        return [fb.input([8], dtype) * fb.constant(value, dtype) for value, dtype in constants]

    buffers = [empty([8], DTYPES[dtype]) for _, dtype in constants]
    source = kernels.generated_source(build_segment(define), buffers, buffers)
    assert_lines_in_order(
        source,
        [
            "= 0.10009765625f;",  # 0.1 in bf16
            "= 0.1;",
            "= (-9223372036854775807LL - 1);",
            "= true;",
            "= __uint_as_float(0x7f800000u);",  # +inf
        ],
    )


def test_casts_convert_round_and_test_for_nonzero():
    def define(fb):
        x = fb.input([16], "f32")
        return [
            fb.cast(x, "bf16"),
            fb.cast(x, "i32"),
            fb.cast(x, "i1"),
            fb.cast(fb.cast(x, "f16"), "f64"),
        ]

    x = torch.randn(16)
    outs = [empty([16], DTYPES[d]) for d in ("bf16", "i32", "i1", "f64")]
    source = kernels.generated_source(build_segment(define), [x], outs)
    assert_lines_in_order(
        source,
        [
            "const float v1 = hostir_bf16_to_f32(hostir_f32_to_bf16(v0));",
            "const int v2 = static_cast<int>(v0);",
            "const bool v3 = (v0 != 0);",
            "const float v4 = hostir_f16_to_f32(hostir_f32_to_f16(v0));",
            "const double v5 = static_cast<double>(v4);",
            "r0 = hostir_f32_to_bf16(v1);",
            "r1 = v2;",
            "r2 = v3;",
            "r3 = v5;",
            # The widest element (f64) sets the vector width: 16 bytes.
            "hostir_vector<unsigned short, 2> r0;",
            "hostir_vector<double, 2> r3;",
        ],
    )


def test_non_contiguous_output_is_written_through_its_strides():
    def define(fb):
        return [fb.neg(fb.input([4, 8], "f32"))]

    segment, x = build_segment(define), torch.randn(4, 8)
    every_other = empty([4, 16], torch.float32)[:, ::2]  # one axis of stride 2
    source = kernels.generated_source(segment, [x], [every_other])
    assert "hostir_segment_body(in0[i], out0[i0 * out0_stride0]);" in source
    # Rows of 16 floats start on whole vectors of 4: the left half of each is stored in vectors.
    left_half = empty([4, 16], torch.float32)[:, :8]
    source = kernels.generated_source(segment, [x], [left_half])
    assert "hostir_store(out0 + i0 * out0_stride0 + i1, r0);" in source
    # A transposed input walks the innermost axis with stride 4: the launch is scalar.
    source = kernels.generated_source(segment, [torch.randn(8, 4).t()], [left_half])
    assert "hostir_segment_body(in0[i0 + i1 * in0_stride1], out0[i0 * out0_stride0 + i1]);" in source


def test_misaligned_buffers_take_narrower_vectors():
    def define(fb):
        return [fb.relu(fb.input([64], "bf16"))]

    storage = torch.randn(72, dtype=torch.bfloat16)
    segment = build_segment(define)
    assert "hostir_vector<unsigned short, 8>" in kernels.generated_source(
        segment, [storage[:64]], [storage[8:]]
    )
    # Two elements in: 4-byte aligned only.
    assert "hostir_vector<unsigned short, 2>" in kernels.generated_source(
        segment, [storage[2:66]], [storage[8:]]
    )
    assert "hostir_vector" not in kernels.generated_source(segment, [storage[1:65]], [storage[8:]])


def test_one_axis_vectorises_any_length_and_finishes_it_with_scalars():
    segment = build_segment(lambda fb: [fb.relu(fb.input([None], "bf16"))])
    x, out = torch.randn(1001, dtype=torch.bfloat16), empty([1001], torch.bfloat16)
    assert kernels.SegmentKernel(segment).plan([x], [out]).layout.vector == 8
    assert_lines_in_order(
        kernels.generated_source(segment, [x], [out]),
        [
            "const int vectors = n / 8;",
            "hostir_store(out0 + i, r0);",
            "for (int i = vectors * 8 + first; i < n; i += step) {",
            "hostir_segment_body(in0[i], out0[i]);",
        ],
    )


def _rows_plus_bias_times_column(dtype: str) -> func.FuncOp:
    """(x + bias) * column: x [rows, columns], the bias broadcast along the rows, the column
    along the columns (stride 0 on the innermost axis)."""

    def define(fb):
        x, bias, column = fb.input([None, None], dtype), fb.input([None], dtype), fb.input([None], dtype)
        return [(x + bias) * fb.broadcast(column, 1)]

    return build_segment(define)


def _planned(x: torch.Tensor, bias: torch.Tensor | None = None, column: torch.Tensor | None = None) -> kernels.Launch:
    """The plan of `_rows_plus_bias_times_column` on x, a contiguous output and, by default,
    a contiguous bias and column."""
    rows, columns = x.shape
    bias = empty([columns], x.dtype, x.device.type) if bias is None else bias
    column = empty([rows], x.dtype, x.device.type) if column is None else column
    segment = _rows_plus_bias_times_column({torch.float32: "f32", torch.bfloat16: "bf16"}[x.dtype])
    return kernels.SegmentKernel(segment).plan([x, bias, column], [empty([rows, columns], x.dtype, x.device.type)])


BF16 = torch.bfloat16


@pytest.mark.parametrize(
    ("buffers", "vector"),
    [
        ({"x": empty([64, 4096], BF16)}, 8),
        ({"x": empty([64, 4096], torch.float32)}, 4),
        # The innermost extent decides: no vector divides 4095, 4 elements divide 4100.
        ({"x": empty([64, 4095], BF16)}, 1),
        ({"x": empty([64, 4100], BF16)}, 4),
        # x one element (2 bytes) past an aligned address; four elements (8 bytes) past it.
        ({"x": empty([64 * 4096 + 1], BF16)[1:].view(64, 4096)}, 1),
        ({"x": empty([64 * 4096 + 4], BF16)[4:].view(64, 4096)}, 4),
        # Rows of 4097 elements: the second row of x starts off a vector.
        ({"x": empty([64, 4097], BF16)[:, :4096]}, 1),
        # Transposed: x walks the innermost axis with stride 64.
        ({"x": empty([4096, 64], BF16).t()}, 1),
        ({"x": empty([64, 4096], BF16), "bias": empty([4097], BF16)[1:]}, 1),
        # The column is read one element per vector: its alignment does not matter.
        ({"x": empty([64, 4096], BF16), "column": empty([65], BF16)[1:]}, 8),
    ],
    ids=["bf16", "f32", "odd extent", "extent of 4s", "offset view", "8-byte offset view",
         "rows off vectors", "transposed", "bias offset view", "column offset view"],  # fmt: skip
)
def test_vector_width_follows_extents_alignment_and_strides(buffers, vector):
    launch = _planned(**buffers)
    assert launch.layout.vector == vector
    # The bias walks the rows' elements with stride 1, the column walks the rows.
    assert launch.layout.patterns[1:3] == (("broadcast", "unit"), ("unit", "broadcast"))


def test_indices_are_32_bit_only_where_every_count_and_offset_fits():
    """Meta tensors: plans of launches whose buffers are never allocated."""

    def index(x: torch.Tensor) -> str:
        return _planned(x).layout.index

    assert index(empty([64, 4096], BF16)) == "int"
    assert index(empty([2**14, 2**16 - 8], BF16, "meta")) == "int"  # 2^30 - 2^17 elements
    assert index(empty([2**15, 2**15], BF16, "meta")) == "long long"  # 2^30 elements
    # 32 elements, but 3 * 2^29 elements apart in x.
    far_apart = empty([2**31], BF16, "meta").as_strided([4, 8], [2**29, 1])
    assert index(far_apart) == "long long"
    segment = _rows_plus_bias_times_column("bf16")
    ins = [far_apart, empty([8], BF16, "meta"), empty([4], BF16, "meta")]
    source = kernels.generated_source(segment, ins, [empty([4, 8], BF16, "meta")])
    assert "long long n, long long extent1, long long in0_stride0)" in source
    assert "for (long long k = first; k < vectors; k += step) {" in source


def kernel_arguments(kernel: kernels.SegmentKernel, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> dict:
    """The names of the kernel's parameters after the pointers, with the values a launch on
    these buffers passes them."""
    source = kernel.source(ins, outs)
    parameters = source[source.index(f"{KERNEL_NAME}(") :].split(")", 1)[0].split(", ")
    names = [p.split()[-1] for p in parameters if "*" not in p]
    sizes = kernels.kernel_sizes(kernel.plan(ins, outs), kernel.body.rotates)
    assert len(names) == len(sizes)
    return dict(zip(names, sizes))


def test_sizes_are_passed_in_the_order_of_the_parameters():
    x = empty([8, 4], torch.float32).t()
    bias = empty([16], torch.float32)[::2]
    kernel = kernels.SegmentKernel(_rows_plus_bias_times_column("f32"))
    arguments = kernel_arguments(kernel, [x, bias, empty([4], torch.float32)], [empty([4, 8], torch.float32)])
    assert arguments == {"n": 32, "extent1": 8, "in0_stride1": 4, "in1_stride1": 2}


def _rotary(dtype: str, backward: bool = False, rank: int = 4, table_extents: str = "?, 1, ?") -> func.FuncOp:
    """The rotary embedding's multiply-add, x * cos + rotate_half(x) * sin, x of [batch,
    sequence, heads, head_dim] (or of `rank` axes) and cos, sin of [sequence, 1, head_dim]
    (or of `table_extents`); or its backward's, g * cos - rotate_half(gs), gs = g * sin
    computed before."""
    x = f"!fusion.tensor<[{', '.join('?' * rank)}], {dtype}>"
    table = f"!fusion.tensor<[{table_extents}], {dtype}>"
    if backward:
        body = f"""func.func private @rotary_backward(%gs: {x}, %g: {x}, %cos: {table}) -> {x} {{
  %r = fusion.rotate_half %gs : {x} -> {x}
  %n = fusion.neg %r : {x} -> {x}
  %gc = fusion.mul %g, %cos : ({x}, {table}) -> {x}
  %o = fusion.add %gc, %n : ({x}, {x}) -> {x}
  func.return %o : {x}
}}"""
    else:
        body = f"""func.func private @rotary(%x: {x}, %cos: {table}, %sin: {table}) -> {x} {{
  %r = fusion.rotate_half %x : {x} -> {x}
  %a = fusion.mul %x, %cos : ({x}, {table}) -> {x}
  %b = fusion.mul %r, %sin : ({x}, {table}) -> {x}
  %o = fusion.add %a, %b : ({x}, {x}) -> {x}
  func.return %o : {x}
}}"""
    return parse_segment(body)


def _rotary_buffers(shape: Sequence[int], dtype: torch.dtype, device: str = "cpu") -> tuple[list, list]:
    batch, sequence, heads, head_dim = shape
    x = torch.randn(shape, device=device).to(dtype)
    cos, sin = (torch.randn(sequence, 1, head_dim, device=device).to(dtype) for _ in range(2))
    return [x, cos, sin], [torch.full(shape, float("nan"), dtype=dtype, device=device)]


def _rotated(x: torch.Tensor) -> torch.Tensor:
    """Llama's rotate_half, as the model writes it."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def test_a_rotation_is_a_load_of_its_input_at_the_other_half():
    """x is loaded twice, as it is and rotated: the rotated load reads the other half of the
    last axis, which stays apart from the others, and negates the first half; bf16 moves
    vectors of 8 where the half is a multiple of 8."""
    kernel = kernels.SegmentKernel(_rotary("bf16"))
    ins, outs = _rotary_buffers([2, 16, 4, 128], torch.bfloat16)
    source = kernel.source(ins, outs)
    assert_lines_in_order(
        source,
        [
            "const bool f3, unsigned short& r0) {",
            "const float v3 = f3 ? -hostir_bf16_to_f32(a3) : hostir_bf16_to_f32(a3);",
            "const float v5 = v3 * v2;",
            "int half, ",
            "const int i3 = rest % extent3;",
            "hostir_load<8>(in3 + i0 * in3_stride0 + i1 * in3_stride1 + i2 * in3_stride2 + (i3 < half ? i3 + half : i3 - half));",
            "hostir_segment_body(a0.v[e], a1.v[e], a2.v[e], a3.v[e], i3 < half, r0.v[e]);",
        ],
    )
    plan = kernel.plan(ins, outs)
    assert plan.extents[-1] == 128 and plan.layout.vector == 8
    assert kernel_arguments(kernel, ins, outs)["half"] == 64
    assert [a.rotated for a in kernel.body.loads] == [False, False, False, True]


@pytest.mark.parametrize(("head_dim", "vector"), [(8, 4), (6, 1), (16, 8)])
def test_a_rotated_loads_vectors_lie_in_one_half(head_dim, vector):
    kernel = kernels.SegmentKernel(_rotary("bf16"))
    ins, outs = _rotary_buffers([1, 3, 2, head_dim], torch.bfloat16)
    assert kernel.plan(ins, outs).layout.vector == vector


def test_a_rotation_on_cpu_is_evaluated_as_the_models_cat():
    """fusion_eval (the CPU path, and a GPU's where no kernel runs): the model's own
    `cat((-second, first))`, rounded once."""
    ins, _ = _rotary_buffers([2, 5, 3, 8], torch.bfloat16)
    (out,) = fusion_eval.evaluate(_rotary("bf16"), ins)
    x, cos, sin = (t.float() for t in ins)
    assert torch.equal(out, (x * cos + _rotated(x) * sin).to(torch.bfloat16))


def test_a_rotated_table_of_lower_rank_is_read_along_the_spaces_last_axis():
    """A rotation of cos (of [sequence, 1, head_dim]) in a space of [batch, sequence, heads,
    head_dim]: its last axis is the space's, so the kernel reads it rotated like any input."""
    x, table = "!fusion.tensor<[?, ?, ?, ?], bf16>", "!fusion.tensor<[?, 1, ?], bf16>"
    segment = parse_segment(f"""func.func private @seg(%x: {x}, %cos: {table}) -> {x} {{
  %r = fusion.rotate_half %cos : {table} -> {table}
  %o = fusion.mul %x, %r : ({x}, {table}) -> {x}
  func.return %o : {x}
}}""")
    kernel = kernels.SegmentKernel(segment)
    assert kernel.body.loads == (Access(0, (0, 1, 2, 3)), Access(1, (1, 2, 3), rotated=True))
    (x, cos, _), outs = _rotary_buffers([2, 16, 4, 32], torch.bfloat16)
    assert "hostir_load<8>(in1 + i1 * in1_stride1 + (i3 < half ? i3 + half : i3 - half));" in kernel.source([x, cos], outs)
    (out,) = fusion_eval.evaluate(segment, [x, cos])
    assert torch.equal(out, (x.float() * _rotated(cos.float())).to(torch.bfloat16))


def _rotated_times(dtype: str) -> func.FuncOp:
    """rotate_half(x) * y, of [rows, columns]."""
    t = f"!fusion.tensor<[?, ?], {dtype}>"
    return parse_segment(f"""func.func private @seg(%x: {t}, %y: {t}) -> {t} {{
  %r = fusion.rotate_half %x : {t} -> {t}
  %o = fusion.mul %r, %y : ({t}, {t}) -> {t}
  func.return %o : {t}
}}""")


def test_a_rotated_loads_sign_reads_the_index_where_no_access_walks_the_last_axis():
    """x expanded along the last axis (stride 0) and y and the output contiguous (linear):
    no offset needs the index on the last axis, the sign of the rotated load does. An x of
    extent 1 there is refused: its rotation, a negation, is broadcast whole, not by halves."""
    kernel = kernels.SegmentKernel(_rotated_times("f32"))
    y, out = torch.randn(4, 8), empty([4, 8], torch.float32)
    source = kernel.source([torch.randn(4, 1).expand(4, 8), y], [out])
    assert_lines_in_order(
        source,
        ["const int i1 = rest % extent1;", "const float a1 = in1[i0];", "hostir_segment_body(a0.v[e], a1, i1 < half, r0.v[e]);"],
    )
    with pytest.raises(HostirError, match="input #0 is rotated along a last axis of extent 1, which no rotation halves"):
        kernel.plan([torch.randn(4, 1), y], [out])


def test_a_rotation_no_kernel_reads_is_refused_and_runs_eagerly(monkeypatch):
    """A kernel reads the rotation of an input of its segment, along the last axis of its
    iteration space, in a kernel of no row reductions. Any other rotation leaves its segment
    to torch eager ops, with a KernelFallbackWarning where a kernel would have run (faked)."""
    x, wide = "!fusion.tensor<[4, 8], f32>", "!fusion.tensor<[4, 8, 6], f32>"
    computed = parse_segment(f"""func.func private @seg(%x: {x}) -> {x} {{
  %e = fusion.exp %x : {x} -> {x}
  %r = fusion.rotate_half %e : {x} -> {x}
  func.return %r : {x}
}}""")
    rows = parse_segment(f"""func.func private @seg(%x: {x}) -> {x} {{
  %r = fusion.rotate_half %x : {x} -> {x}
  %s = fusion.sum %x [1] keepdim : {x} -> !fusion.tensor<[4, 1], f32>
  %o = fusion.mul %r, %s : ({x}, !fusion.tensor<[4, 1], f32>) -> {x}
  func.return %o : {x}
}}""")
    inner = parse_segment(f"""func.func private @seg(%x: {x}, %y: {wide}) -> {wide} {{
  %r = fusion.rotate_half %x : {x} -> {x}
  %b = fusion.broadcast %r [2] : {x} -> !fusion.tensor<[4, 8, 1], f32>
  %o = fusion.mul %b, %y : (!fusion.tensor<[4, 8, 1], f32>, {wide}) -> {wide}
  func.return %o : {wide}
}}""")
    monkeypatch.setattr(kernels, "launchable", lambda buffers: True)
    for segment, refusal in [
        (computed, "cannot be part of the fused kernel of segment @seg: a kernel reads the rotation of an input"),
        (rows, "cannot be part of the fused kernel of segment @seg: a kernel reads the rotation of an input"),
        (inner, "in segment @seg rotates another axis than the last of the kernel's iteration space"),
    ]:
        with pytest.raises(HostirError, match=f"'fusion.rotate_half' {refusal}"):
            SegmentBody.of(segment)
        ins = [torch.randn(fusion.tensor_type(arg).get_shape()) for arg in segment.args]
        outs = [torch.full(fusion.tensor_type(segment.get_return_op().arguments[0]).get_shape(), float("nan"))]
        with pytest.warns(kernels.KernelFallbackWarning, match="segment @seg runs as torch eager ops"):
            segment_runner(segment)(ins, outs)
        assert torch.equal(outs[0], fusion_eval.evaluate(segment, ins)[0])


def test_merge_axes_merges_what_every_access_walks_alike():
    assert merge_axes([4, 8, 16], [(128, 16, 1), (128, 16, 1)]) == ([512], [[1], [1]])
    # A broadcast bias keeps the axes apart; extent-1 axes go.
    assert merge_axes([4, 1, 8], [(8, 8, 1), (0, 0, 1)]) == ([4, 8], [[8, 1], [0, 1]])
    assert merge_axes([1, 1], [(1, 1)]) == ([], [[]])


# --------------------------------------------------------------------------- #
# Cache key                                                                    #
# --------------------------------------------------------------------------- #


def _affine(dtype: str, shape: list[int | None]) -> func.FuncOp:
    def define(fb):
        x = fb.input(shape, dtype)
        return [fb.relu(x * x - x)]

    return build_segment(define)


def test_key_ignores_sizes():
    small = kernels.generated_source(
        _affine("f32", [4, 8]), [torch.randn(4, 8)], [empty([4, 8], torch.float32)]
    )
    large = kernels.generated_source(
        _affine("f32", [None, 32]), [torch.randn(16, 32)], [empty([16, 32], torch.float32)]
    )
    assert small == large


def test_key_differs_by_dtype_and_by_broadcast_pattern():
    def key(dtype: str, x: torch.Tensor) -> str:
        return kernels.generated_source(_affine(dtype, [None, 8]), [x], [empty([4, 8], x.dtype)])

    f32 = key("f32", torch.randn(4, 8))
    assert f32 != key("bf16", torch.randn(4, 8, dtype=torch.bfloat16))
    assert f32 != key("f32", torch.randn(1, 8))  # broadcast along axis 0
    assert f32 != key("f32", torch.randn(8, 4).t())  # transposed


# --------------------------------------------------------------------------- #
# Refusals and mismatched buffers                                             #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "op, dtype",
    [("exp", "i32"), ("sqrt", "i64"), ("div", "i32"), ("sub", "i1"), ("neg", "i1"), ("pow", "i1")],
)
def test_ops_torch_does_not_compute_in_the_dtype_are_refused(op, dtype):
    def define(fb):
        x = fb.input([8], dtype)
        return [getattr(fb, op)(x) if op in UNARY_OPS else getattr(fb, op)(x, x)]

    with pytest.raises(
        HostirError, match=rf"'fusion.{op}' on {dtype} cannot be fused into a kernel"
    ):
        kernels.SegmentKernel(build_segment(define))


def test_non_pointwise_op_is_refused():
    def define(fb):
        return [fb.sum(fb.input([4, 8], "f32"), 1)]

    with pytest.raises(
        HostirError,
        match="'fusion.sum' cannot be part of the fused kernel of segment @seg: a kernel reduces only the last axis",
    ):
        kernels.SegmentKernel(build_segment(define))


@pytest.mark.parametrize(
    "ins, outs, message",
    [
        (
            [torch.randn(4, 8, dtype=torch.float64)],
            [empty([4, 8], torch.float32)],
            "input #0 has dtype torch.float64",
        ),
        ([torch.randn(4, 8)], [empty([4, 8], torch.float32)] * 2, r"takes 1 output\(s\), got 2"),
        ([torch.randn(4, 8)], [empty([4, 6], torch.float32)], "extents 8 and 6 meet on one axis"),
        (
            [torch.randn(4, 8)],
            [empty([1, 8], torch.float32)],
            r"output #0 has shape \[1, 8\] but the segment computes \[4, 8\]",
        ),
        (
            [torch.randn(32)],
            [empty([32], torch.float32)],
            "input #0 has rank 1, the segment declares rank 2",
        ),
    ],
)
def test_buffers_that_do_not_fit_the_segment_are_reported(ins, outs, message):
    segment = _affine("f32", [None, None])
    with pytest.raises(HostirError, match=message):
        kernels.generated_source(segment, ins, outs)


# --------------------------------------------------------------------------- #
# The CPU path                                                                 #
# --------------------------------------------------------------------------- #


def test_cpu_tensors_are_left_to_the_caller():
    kernel = kernels.SegmentKernel(f32_chain())
    out = torch.full([4, 8], float("nan"))
    assert kernel.launch([torch.randn(4, 8), torch.randn(4, 8)], [out]) is False
    assert out.isnan().all()


HOST_PROGRAM = """
func.func private @seg(%x: {T}, %y: {B}) -> ({T}, {T}) {{
  %s = fusion.mul %x, %y : ({T}, {B}) -> {T}
  %t = fusion.tanh %s : {T} -> {T}
  %c = fusion.constant 0.5 : bf16 : !fusion.tensor<[], bf16>
  %u = fusion.add %t, %c : ({T}, !fusion.tensor<[], bf16>) -> {T}
  func.return %u, %s : {T}, {T}
}}
func.func @host(%x: {T}, %y: {B}) -> ({T}, {T}) {{
  %n = hir.dim %x, 0 : {T}
  %u = hir.allocate(%n) : {T}
  %s = hir.allocate(%n) : {T}
  hir.launch_kernel @seg ins(%x, %y : {T}, {B}) outs(%u, %s : {T}, {T})
  func.return %u, %s : {T}, {T}
}}
""".format(T="!fusion.tensor<[?, 8], bf16>", B="!fusion.tensor<[8], bf16>")


def test_host_program_on_cpu_gives_what_fusion_eval_gives():
    program = Program.compile(HOST_PROGRAM, pipeline=None)
    x, y = torch.randn(5, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16)
    segment = program.module.body.block.first_op
    outputs = program.run([x, y], Communicator.single(torch.device("cpu")))
    for actual, expected in zip(outputs, fusion_eval.evaluate(segment, [x, y]), strict=True):
        assert torch.equal(actual, expected)


REFUSED_SEGMENT = """
func.func private @int_exp(%x: {T}) -> {T} {{
  %y = fusion.exp %x : {T} -> {T}
  func.return %y : {T}
}}
func.func @host(%x: {T}) -> {T} {{
  %n = hir.dim %x, 0 : {T}
  %y = hir.allocate(%n) : {T}
  hir.launch_kernel @int_exp ins(%x : {T}) outs(%y : {T})
  func.return %y : {T}
}}
""".format(T="!fusion.tensor<[?], i32>")


def test_a_segment_no_kernel_computes_runs_eagerly_and_warns_once_where_a_kernel_would_run(monkeypatch):
    """exp on i32 has no kernel (torch computes it in f32): the program runs eagerly anyway.

    On CPU tensors there is no kernel to miss, so no warning; where a kernel would run
    (`kernels.launchable`, faked here; the GPU test below makes it true) it warns once
    per prepared segment, however often the segment runs.
    """
    program = Program.compile(REFUSED_SEGMENT, pipeline=None)
    x = torch.arange(-3, 5, dtype=torch.int32)
    cpu = Communicator.single(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = program.run([x], cpu)
    assert torch.equal(y, torch.exp(x).to(torch.int32))
    monkeypatch.setattr(kernels, "launchable", lambda buffers: True)
    with pytest.warns(kernels.KernelFallbackWarning) as warned:
        for _ in range(3):
            (y,) = program.run([x], cpu)
    assert torch.equal(y, torch.exp(x).to(torch.int32))
    with pytest.raises(HostirError) as refusal:
        kernels.SegmentKernel(program.module.body.block.first_op)
    assert len(warned) == 1
    assert str(warned[0].message) == (
        "segment @int_exp runs as torch eager ops, one kernel per op, because no fused kernel can "
        f"compute it: {refusal.value}"
    )


# Example programs and the launches of their segments


def _gelu_like(dtype: str, stream_axis: int | None) -> ModuleOp:
    """A chain with constants and a broadcast operand; optionally pipelined over `stream_axis`."""
    fb = FusionBuilder(f"gelu_{dtype}" + ("" if stream_axis is None else f"_stream{stream_axis}"))
    x, b = fb.input([None, None], dtype), fb.input([None], dtype)
    y = x + b
    g = y * (fb.tanh(y) + 1.0) * 0.5
    if stream_axis is not None:
        fb.parallelize(g, stream_axis, "stream")
    fb.output(g)
    fb.output(fb.cast(g, "f32"))
    return fb.build()


def _segments_around_a_matmul() -> ModuleOp:
    """Two segments with a matmul between them; the second reads a broadcast of an input."""
    fb = FusionBuilder("around_matmul")
    x, w, c = fb.input([None, 8], "f32"), fb.input([8, None], "f32"), fb.input([None], "f32")
    h = fb.matmul(fb.exp(x * 0.25), w)
    fb.output(fb.relu(h - fb.broadcast(c, 0)))
    return fb.build()


def _integers() -> ModuleOp:
    fb = FusionBuilder("integers")
    x, y = fb.input([None, None], "i32"), fb.input([None, None], "i32")
    fb.output(fb.maximum(x * y, fb.abs(x - y)) + 3)
    return fb.build()


def example_modules() -> dict[str, ModuleOp]:
    """Every example: the .mlir files, the reference fusions (on one device), and chains of our own.

    The .mlir examples of several devices are reference fusions (examples/reference_fusions.py)
    with a fixed mesh; they appear here through the same fusion on a mesh of one device.
    """
    modules = {
        path.stem: parse_module(path.read_text(), str(path)) for path in sorted(EXAMPLES.glob("*.mlir"))
    }
    for name, build in REFERENCE_FUSIONS.items():
        multi_device = "num_devices" in inspect.signature(build).parameters
        modules[f"reference {name}"] = build(1) if multi_device else build()
    for dtype in ("f32", "bf16", "f16"):
        modules[f"gelu {dtype}"] = _gelu_like(dtype, None)
    modules["gelu streamed outer"] = _gelu_like("bf16", 0)
    modules["gelu streamed inner"] = _gelu_like("f32", 1)
    modules["around a matmul"] = _segments_around_a_matmul()
    modules["integers"] = _integers()
    return modules


class Launch(NamedTuple):
    kernel: kernels.SegmentKernel
    ins: list[torch.Tensor]
    outs: list[torch.Tensor]
    launched: bool


def recording_launches(monkeypatch) -> list[Launch]:
    """Every `SegmentKernel.launch` from now on: its kernel, buffers, and whether it ran."""
    launches: list[Launch] = []
    launch = kernels.SegmentKernel.launch

    def recorded(kernel, ins, outs):
        launched = launch(kernel, ins, outs)
        launches.append(Launch(kernel, list(ins), list(outs), launched))
        return launched

    monkeypatch.setattr(kernels.SegmentKernel, "launch", recorded)
    return launches


def run_example(program: Program, inputs: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """One run at world size 1 on `device`, every allocation poisoned first."""
    with poisoned_allocations():
        return program.run([x.to(device) for x in inputs], Communicator.single(device))


def test_every_launch_of_every_example_plans_a_kernel_on_its_buffers(monkeypatch):
    """On the CPU the segments run eagerly, but each launch's buffers must make a kernel."""
    launches = recording_launches(monkeypatch)
    with_segments = set()
    for name, module in example_modules().items():
        program = Program.compile(module)
        if program.largest_device > 0:
            continue
        launches.clear()
        run_example(program, random_inputs(program.input_types, seed=5), torch.device("cpu"))
        for launch in launches:
            assert not launch.launched
            assert f"void {KERNEL_NAME}(" in launch.kernel.source(launch.ins, launch.outs)
        if launches:
            with_segments.add(name)
    expected = {"single_binary", "gelu bf16", "gelu streamed inner", "around a matmul", "integers"}
    assert expected <= with_segments


# --------------------------------------------------------------------------- #
# On the GPU                                                                   #
# --------------------------------------------------------------------------- #

requires_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or kernels.cupy is None, reason="needs a CUDA GPU and CuPy"
)


SLICE_REDUCTIONS = """
func.func @pieces(%x: !fusion.tensor<[4, ?, 24], {dt}>) -> (!fusion.tensor<[?, 24], {dt}>, !fusion.tensor<[1, ?, 24], {dt}>) {{
  %s = fusion.sum %x [0] : !fusion.tensor<[4, ?, 24], {dt}> -> !fusion.tensor<[?, 24], {dt}>
  %m = fusion.max %x [0] keepdim : !fusion.tensor<[4, ?, 24], {dt}> -> !fusion.tensor<[1, ?, 24], {dt}>
  func.return %s, %m : !fusion.tensor<[?, 24], {dt}>, !fusion.tensor<[1, ?, 24], {dt}>
}}
"""


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
def test_a_sum_and_a_max_over_four_slices_are_a_kernel_each(dtype, device):
    """A reduction over a short axis that is not the last (as a ring's pieces are stacked)
    is a kernel of that axis's slices (reduction-in-kernel), not an ATen reduction: the sum
    in f32 and rounded once, the max exact, into poisoned outputs, against torch on the
    values in f64."""
    program = Program.compile(SLICE_REDUCTIONS.format(dt={torch.bfloat16: "bf16", torch.float32: "f32"}[dtype]))
    host = str(program.host)
    assert "hir.reduction" not in host and host.count("hir.launch_kernel") == 2
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, 37, 24, generator=generator).to(device=device, dtype=dtype)
    before = x.clone()
    with poisoned_allocations():
        total, largest = program.run([x], Communicator.single(x.device))
    torch.testing.assert_close(total, x.double().sum(0).to(dtype))
    assert torch.equal(largest, x.amax(0, keepdim=True))
    assert torch.equal(x, before)


def random(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Random values on the GPU in a range where every op and cast is defined for the dtype."""
    if dtype == torch.bool:
        values = torch.randint(0, 2, shape, generator=generator) == 1
    elif dtype.is_floating_point:
        values = (torch.randn(shape, generator=generator, dtype=torch.float64) * 3).clamp(-90, 90)
    else:
        values = torch.randint(-6, 7, shape, generator=generator)
    return values.to(device="cuda", dtype=dtype)


def poisoned(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An output buffer full of a value the kernel must overwrite: NaN, or the largest integer."""
    if dtype.is_floating_point:
        value = float("nan")
    elif dtype == torch.bool:
        value = True
    else:
        value = torch.iinfo(dtype).max
    return torch.full(shape, value, dtype=dtype, device="cuda")


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Within the dtype's tolerance (torch's defaults: about an ulp for bf16/f16), NaN where NaN."""
    torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{what}: {m}")


class Layout:
    """Where a test's buffers live: contiguous, or broadcast, transposed and strided views."""

    @staticmethod
    def contiguous(shape: Sequence[int], dtype: torch.dtype, generator) -> torch.Tensor:
        return random(shape, dtype, generator)

    @staticmethod
    def transposed(shape: Sequence[int], dtype: torch.dtype, generator) -> torch.Tensor:
        return random(list(reversed(shape)), dtype, generator).permute(*reversed(range(len(shape))))

    @staticmethod
    def strided_output(
        shape: Sequence[int], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A poisoned buffer twice as wide and the view of every other column of it."""
        whole = poisoned([*shape[:-1], 2 * shape[-1]], dtype)
        return whole, whole[..., ::2]


PLACES = ("aligned", "one element in", "two elements in", "transposed")
"""Where `placed` puts a [rows, columns] tensor: in the first columns of a buffer of rows of
`columns + 8` elements, one element into them (no row starts on a vector), two elements into
them (vectors of two fit), or transposed (a [columns, rows] buffer's transpose: the rows
walked with stride 1, their elements with stride `rows`)."""


def placed(values: torch.Tensor, place: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A buffer of NaN and the view of it that holds `values` where `place` says."""
    rows, columns = values.shape
    if place == "transposed":
        base = torch.full([columns, rows], float("nan"), dtype=values.dtype, device=values.device)
        view = base.t()
    else:
        base = torch.full([rows, columns + 8], float("nan"), dtype=values.dtype, device=values.device)
        start = {"aligned": 0, "one element in": 1, "two elements in": 2}[place]
        view = base[:, start : start + columns]
    view.copy_(values)
    return base, view


def vectorised(place: str, columns: int) -> bool:
    """Whether a kernel on rows of `columns` placed where `place` says moves vectors: every
    row starts on a whole vector of two elements at least."""
    return place in ("aligned", "two elements in") and columns % 2 == 0


def assert_written_only_within(base: torch.Tensor, view: torch.Tensor) -> None:
    """Every element of the NaN buffer `base` outside the output `view` is still NaN."""
    view.zero_()
    assert int(base.isnan().sum()) == base.numel() - view.numel(), "the kernel wrote outside its output"


def run_and_check(
    segment: func.FuncOp,
    ins: Sequence[torch.Tensor],
    outs: Sequence[torch.Tensor],
    names: Sequence[str],
) -> None:
    """Launches `segment` and checks every output against fusion_eval on the same inputs."""
    assert kernels.SegmentKernel(segment).launch(ins, outs)
    expected = fusion_eval.evaluate(segment, ins)
    torch.cuda.synchronize()
    for name, actual, reference in zip(names, outs, expected, strict=True):
        assert_matches(actual, reference.expand_as(actual), name)


def _all_ops_segment(
    dtype: str, ops: dict[str, tuple[str, ...]], shapes: Sequence[list[int | None]]
):
    """A segment returning every op of `ops` defined on `dtype`, applied to inputs of `shapes`."""
    names = [op for op, dtypes in ops.items() if dtype in dtypes]

    def define(fb):
        inputs = [fb.input(shape, dtype) for shape in shapes]
        return [getattr(fb, op)(*inputs) for op in names]

    return build_segment(define, f"{dtype}_ops"), names


@requires_gpu
@pytest.mark.parametrize("dtype", [d for d in DTYPES if any(d in ds for ds in UNARY_OPS.values())])
def test_unary_ops_match_torch(dtype):
    generator = torch.Generator().manual_seed(0)
    segment, names = _all_ops_segment(dtype, UNARY_OPS, [[None, None]])
    torch_dtype = DTYPES[dtype]
    shape = [33, 65]  # not a multiple of the vector width: the tail loop runs too
    outs = [poisoned(shape, torch_dtype) for _ in names]
    run_and_check(segment, [Layout.contiguous(shape, torch_dtype, generator)], outs, names)

    wholes, views = zip(*(Layout.strided_output(shape, torch_dtype) for _ in names))
    run_and_check(segment, [Layout.transposed(shape, torch_dtype, generator)], views, names)
    for whole in wholes:
        assert_matches(whole[..., 1::2], poisoned(shape, torch_dtype), "the columns the view skips")


@requires_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_binary_ops_match_torch(dtype):
    generator = torch.Generator().manual_seed(1)
    torch_dtype = DTYPES[dtype]
    segment, names = _all_ops_segment(dtype, BINARY_OPS, [[None, None], [None, None]])
    shape = [17, 40]
    ins = [Layout.contiguous(shape, torch_dtype, generator) for _ in range(2)]
    run_and_check(segment, ins, [poisoned(shape, torch_dtype) for _ in names], names)

    # A [5, 1, 7] and a [6, 1] operand broadcast to [5, 6, 7], through strided views.
    segment, names = _all_ops_segment(dtype, BINARY_OPS, [[5, 1, 7], [6, 1]])
    lhs = Layout.transposed([5, 1, 7], torch_dtype, generator)
    rhs = random([6, 3], torch_dtype, generator)[:, 1:2]
    run_and_check(
        segment,
        [lhs, rhs],
        [Layout.strided_output([5, 6, 7], torch_dtype)[1] for _ in names],
        names,
    )


@requires_gpu
@pytest.mark.parametrize("source", list(DTYPES))
def test_casts_match_torch(source):
    generator = torch.Generator().manual_seed(2)

    def define(fb):
        x = fb.input([None], source)
        return [fb.cast(x, target) for target in DTYPES]

    segment = build_segment(define, f"cast_{source}")
    x = random([1000], DTYPES[source], generator)
    run_and_check(
        segment,
        [x],
        [poisoned([1000], d) for d in DTYPES.values()],
        [f"{source} -> {t}" for t in DTYPES],
    )
    run_and_check(
        segment,
        [random([2000], DTYPES[source], generator)[::2]],
        [Layout.strided_output([1000], d)[1] for d in DTYPES.values()],
        [f"{source} -> {t} (strided)" for t in DTYPES],
    )


@requires_gpu
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("columns", [64, 100, 4096, 4097, 8192])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_vector_and_scalar_launches_match_torch(dtype, columns, place):
    """(x + bias) * column, x and the output placed in buffers of `place` (for "one element
    in", the bias too): vector kernels where every row starts on a whole vector, scalar ones
    elsewhere, against fusion_eval, into poisoned outputs whose other elements stay poisoned."""
    generator = torch.Generator().manual_seed(columns)
    torch_dtype, rows = DTYPES[dtype], 300
    x = random([rows, columns], torch_dtype, generator)
    bias, column = random([columns + 1], torch_dtype, generator), random([rows], torch_dtype, generator)
    bias = bias[1:] if place == "one element in" else bias[:columns]
    _, x_view = placed(x, place)
    out_base, out = placed(poisoned([rows, columns], torch_dtype), place)
    segment = _rows_plus_bias_times_column(dtype)
    planned = kernels.SegmentKernel(segment).plan([x_view, bias, column], [out])
    assert (planned.layout.vector > 1) == vectorised(place, columns)
    run_and_check(segment, [x_view, bias, column], [out], [f"(x + bias) * column, {place}"])
    assert_written_only_within(out_base, out)


def _bf16_chain(fb: FusionBuilder) -> list[Tensor]:
    x, y = fb.input([None, None], "bf16"), fb.input([None], "bf16")
    s = fb.maximum(x * y - 0.375, fb.neg(fb.abs(x)))
    return [fb.relu(s + fb.broadcast(y, 0)), s]


@requires_gpu
def test_bf16_chain_rounds_once_bit_for_bit():
    """Exact f32 ops (mul, sub, max, neg, abs, add) give fusion_eval's bits: one rounding."""
    generator = torch.Generator().manual_seed(3)
    segment = build_segment(_bf16_chain)
    x, y = random([300, 129], torch.bfloat16, generator), random([129], torch.bfloat16, generator)
    outs = [poisoned([300, 129], torch.bfloat16) for _ in range(2)]
    assert kernels.SegmentKernel(segment).launch([x, y], outs)
    for actual, expected in zip(outs, fusion_eval.evaluate(segment, [x, y])):
        assert torch.equal(actual, expected)
    eager = torch.maximum(x * y - 0.375, -x.abs())  # rounds after every op
    assert not torch.equal(outs[1], eager), "the data should tell rounding once from rounding often"


@requires_gpu
def test_scalar_and_empty_launches():
    segment = build_segment(lambda fb: [fb.exp(fb.input([], "f32"))], "scalar")
    x, out = torch.tensor(0.5, device="cuda"), poisoned([], torch.float32)
    run_and_check(segment, [x], [out], ["exp of a scalar"])
    segment = build_segment(lambda fb: [fb.exp(fb.input([None], "f32"))], "vector")
    assert kernels.SegmentKernel(segment).launch(
        [torch.empty(0, device="cuda")], [torch.empty(0, device="cuda")]
    )


@requires_gpu
def test_each_layout_compiles_once():
    def define(fb):
        x = fb.input([None, None], "f32")
        return [fb.sqrt(fb.abs(x)) * 0.8125]

    segment = build_segment(define)
    kernel = kernels.SegmentKernel(segment)
    generator = torch.Generator().manual_seed(4)
    before = kernels.CACHE.compilations
    # Each shape twice: the second launch reuses the preparation with new buffers.
    for shape in ([64, 64], [128, 32], [1024, 8], [64, 64], [128, 32], [1024, 8]):
        x = random(shape, torch.float32, generator)
        out = poisoned(shape, torch.float32)
        assert kernel.launch([x], [out])
        torch.cuda.synchronize()
        assert_matches(out, fusion_eval.evaluate(segment, [x])[0], f"shape {shape}")
    assert kernels.CACHE.compilations == before + 1
    # A program prepared again builds a new SegmentKernel: the process cache has the kernel.
    assert kernels.SegmentKernel(segment).launch([x], [out])
    assert kernels.CACHE.compilations == before + 1


@requires_gpu
def test_kernel_runs_on_the_current_stream():
    """The input is written on a side stream after a long sleep: only a kernel on it sees it."""
    segment = build_segment(lambda fb: [fb.neg(fb.input([None], "f32"))], "stream")
    kernel = kernels.SegmentKernel(segment)
    x = torch.zeros(1 << 20, device="cuda")
    out = poisoned([1 << 20], torch.float32)
    kernel.launch([x], [out])  # compile before timing matters
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s
        x.fill_(2.0)
        assert kernel.launch([x], [out])
    assert not side.query(), "the side stream should still be sleeping"
    side.synchronize()
    assert torch.equal(out, torch.full_like(out, -2.0))


@requires_gpu
def test_dump_prints_each_kernel_when_compiled(monkeypatch, capsys):
    monkeypatch.setenv("HOSTIR_DUMP", "cuda_kernel")
    # A constant no other test uses: this kernel is compiled here.
    segment = build_segment(lambda fb: [fb.input([None], "f32") * 0.0712890625], "dumped")
    x, out = torch.ones(8, device="cuda"), poisoned([8], torch.float32)
    assert kernels.SegmentKernel(segment).launch([x], [out])
    printed = capsys.readouterr().err
    assert "// hostir: the CUDA kernel of segment @dumped" in printed
    assert "const float v1 = 0.0712890625f;" in printed
    assert kernels.SegmentKernel(segment).launch([x], [out])
    assert capsys.readouterr().err == "", "a cached kernel is not compiled, so not printed, again"


@requires_gpu
def test_every_fused_segment_of_every_example_runs_as_one_kernel_compiled_once(monkeypatch):
    """Each launch_kernel runs its generated kernel (never the eager path) and gives what
    the eager path gives on the CPU; a second run compiles nothing."""
    launches = recording_launches(monkeypatch)
    cuda, cpu = torch.device("cuda", torch.cuda.current_device()), torch.device("cpu")
    for name, module in example_modules().items():
        program = Program.compile(module)
        if program.largest_device > 0:
            continue
        inputs = random_inputs(program.input_types, seed=6)
        launches.clear()
        expected = run_example(program, inputs, cpu)
        eager_launches = len(launches)
        launches.clear()
        actual = run_example(program, inputs, cuda)
        assert len(launches) == eager_launches and all(launch.launched for launch in launches), name
        compiled = kernels.CACHE.compilations
        again = run_example(program, inputs, cuda)
        assert kernels.CACHE.compilations == compiled, f"{name}: the second run compiled"
        assert len(launches) == 2 * eager_launches and all(launch.launched for launch in launches), name
        for i, (first, second, reference) in enumerate(zip(actual, again, expected, strict=True)):
            for output in (first, second):
                comparison = compare(output.cpu(), reference)
                assert comparison.ok, f"{name} output #{i}: {comparison}"


@requires_gpu
def test_a_segment_no_kernel_computes_warns_once_on_the_gpu_and_runs_eagerly():
    program = Program.compile(REFUSED_SEGMENT, pipeline=None)
    x = torch.arange(-3, 5, dtype=torch.int32, device="cuda")
    fallback = "segment @int_exp runs as torch eager ops"
    with pytest.warns(kernels.KernelFallbackWarning, match=fallback) as warned:
        for _ in range(2):
            with poisoned_allocations():
                (y,) = program.run([x], Communicator.single(x.device))
    assert len(warned) == 1
    assert torch.equal(y.cpu(), torch.exp(x.cpu()).to(torch.int32))


def assert_rotations_match(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """A rotary kernel against fusion_eval: bit for bit in bf16, whose products are exact in
    f32, so that where the compiler contracts a product and a sum into one FMA it rounds as
    eager's product then sum; within f32's tolerance in f32, where it need not."""
    if actual.dtype == torch.bfloat16:
        assert torch.equal(actual, expected), what
    else:
        assert_matches(actual, expected, what)


@requires_gpu
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize(
    ("shape", "table", "place"),
    [
        ([2, 16, 4, 128], [16, 1, 128], "contiguous"),
        ([1, 3, 2, 6], [3, 1, 6], "contiguous"),
        ([2, 1, 16, 4, 16], [1, 1, 16, 1, 16], "contiguous"),
        ([2, 16, 4, 16], [16, 1, 16], "second half of a split"),
        ([2, 16, 4, 128], [16, 1, 128], "transposed"),
    ],
)
def test_rotary_kernels_match_the_models_cat(dtype, shape, table, place):
    """The rotary embedding's multiply-add and its backward's, one kernel each, against the
    model's `x * cos + cat((-second, first)) * sin` in f64 rounded once and against
    fusion_eval, with x contiguous, the second half of a `split` (rows of twice its width) or
    a transpose (heads and sequence swapped), cos and sin broadcast along the batch and the
    heads (`table`), and the output poisoned."""
    torch_dtype = DTYPES[dtype]
    generator = torch.Generator().manual_seed(sum(shape))
    if place == "second half of a split":
        x = random([*shape[:-1], 2 * shape[-1]], torch_dtype, generator).split(shape[-1], dim=-1)[1]
    elif place == "transposed":
        x = random([shape[0], shape[2], shape[1], shape[3]], torch_dtype, generator).transpose(1, 2)
    else:
        x = random(shape, torch_dtype, generator)
    g = random(shape, torch_dtype, generator)
    cos, sin = (random(table, torch_dtype, generator) for _ in range(2))
    types = {"rank": len(shape), "table_extents": ", ".join("1" if extent == 1 else "?" for extent in table)}
    forward_segment, backward_segment = _rotary(dtype, **types), _rotary(dtype, backward=True, **types)
    forward, backward = [poisoned(shape, torch_dtype)], [poisoned(shape, torch_dtype)]
    assert kernels.SegmentKernel(forward_segment).launch([x, cos, sin], forward)
    assert kernels.SegmentKernel(backward_segment).launch([x, g, cos], backward)
    torch.cuda.synchronize()
    xf, gf, cosf, sinf = (t.double() for t in (x, g, cos, sin))
    expected_forward = (xf * cosf + _rotated(xf) * sinf).to(torch_dtype)
    expected_backward = (gf * cosf - _rotated(xf)).to(torch_dtype)
    assert_matches(forward[0], expected_forward, "forward")
    assert_matches(backward[0], expected_backward, "backward")
    assert_rotations_match(forward[0], fusion_eval.evaluate(forward_segment, [x, cos, sin])[0], "forward, eagerly")
    assert_rotations_match(backward[0], fusion_eval.evaluate(backward_segment, [x, g, cos])[0], "backward, eagerly")


@requires_gpu
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_rotations_of_broadcast_inputs_match_fusion_eval(dtype):
    """A rotated table of lower rank than the space, and a rotated input expanded along the
    last axis beside linear accesses (only the sign reads the index there)."""
    torch_dtype = DTYPES[dtype]
    generator = torch.Generator().manual_seed(5)
    x, t = f"!fusion.tensor<[?, ?, ?, ?], {dtype}>", f"!fusion.tensor<[?, 1, ?], {dtype}>"
    table = parse_segment(f"""func.func private @seg(%x: {x}, %cos: {t}) -> {x} {{
  %r = fusion.rotate_half %cos : {t} -> {t}
  %o = fusion.mul %x, %r : ({x}, {t}) -> {x}
  func.return %o : {x}
}}""")
    ins = [random([2, 16, 4, 64], torch_dtype, generator), random([16, 1, 64], torch_dtype, generator)]
    outs = [poisoned([2, 16, 4, 64], torch_dtype)]
    assert kernels.SegmentKernel(table).launch(ins, outs)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], fusion_eval.evaluate(table, ins)[0])
    ins = [random([300, 1], torch_dtype, generator).expand(300, 32), random([300, 32], torch_dtype, generator)]
    outs = [poisoned([300, 32], torch_dtype)]
    assert kernels.SegmentKernel(_rotated_times(dtype)).launch(ins, outs)
    torch.cuda.synchronize()
    assert torch.equal(outs[0], fusion_eval.evaluate(_rotated_times(dtype), ins)[0])


@requires_gpu
@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 4.0])
def test_powers_are_torchs_to_the_bit(exponent):
    """The products are ATen's own for those exponents: the kernel's powers equal torch's."""

    def define(fb):
        return [fb.input([4096], "f32") ** exponent]

    x = torch.randn(4096, device="cuda")
    out = torch.full((4096,), float("nan"), device="cuda")
    assert kernels.SegmentKernel(build_segment(define)).launch([x], [out])
    assert torch.equal(out, x**exponent)
