"""Segments that reduce rows: RMSNorm and its backward as one kernel each.

The importer reads torch's RMSNorm (the decomposition aot_autograd hands the backend: a
mean, an rsqrt, a detach, and in the backward a row sum expanded along the row) as fusion
ops, fusion-to-hir makes each norm one segment whose reduction runs over the rows, and the
kernel of such a segment is one warp or one block per row. Without a GPU every segment
runs eagerly (`fusion_eval`) and the kernel is planned and its source generated; with one,
the kernel runs against torch.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from xdsl.dialects import func

from hostir import parse_module
from hostir.runtime.codegen import kernels
from hostir.runtime.interpreter.compute import segment_runner
from hostir.passes.lowering.fusion_to_hir import FusionToHir
from hostir_dialect import hostir_context
from hostir_dialect.text import HostirError
from test_communicator import needs_ranks
from test_kernels import assert_lines_in_order, requires_gpu
from test_torch_backend import TOLERANCES, _dumped, _max_error, run_on_hostir

EPS = 1e-5


def _segments(text: str) -> dict[str, func.FuncOp]:
    """The segments of a module after fusion-to-hir, by name."""
    module = parse_module(text)
    FusionToHir().apply(hostir_context(), module)
    return {op.sym_name.data: op for op in module.ops if isinstance(op, func.FuncOp) and "_segment_" in op.sym_name.data}


def _rms_norm_text(rows: int, columns: int, dtype: str) -> str:
    """RMSNorm's forward as the importer writes torch's: x (upcast for bf16) times the rsqrt
    of its rows' mean square plus eps, times the weight, cast back; returns the scale too."""
    x, row, w = (f"!fusion.tensor<{shape}, {dtype}>" for shape in ([rows, columns], [rows, 1], [columns]))
    fx, frow, fw = (f"!fusion.tensor<{shape}, f32>" for shape in ([rows, columns], [rows, 1], [columns]))
    s = "!fusion.tensor<[], f32>"
    return f"""
func.func @rms(%x: {x}, %w: {w}) -> ({x}, {frow}) {{
  %xf = fusion.cast %x : {x} -> {fx}
  %wf = fusion.cast %w : {w} -> {fw}
  %two = fusion.constant 2.000000e+00 : f32 : {s}
  %square = fusion.pow %xf, %two : ({fx}, {s}) -> {fx}
  %sum = fusion.sum %square [1] keepdim : {fx} -> {frow}
  %n = fusion.constant {float(columns)} : f32 : {s}
  %mean = fusion.div %sum, %n : ({frow}, {s}) -> {frow}
  %eps = fusion.constant {EPS:e} : f32 : {s}
  %shifted = fusion.add %mean, %eps : ({frow}, {s}) -> {frow}
  %scale = fusion.rsqrt %shifted : {frow} -> {frow}
  %normed = fusion.mul %xf, %scale : ({fx}, {frow}) -> {fx}
  %weighted = fusion.mul %normed, %wf : ({fx}, {fw}) -> {fx}
  %y = fusion.cast %weighted : {fx} -> {x}
  func.return %y, %scale : {x}, {frow}
}}"""


def _rms_norm_segment(rows: int, columns: int, dtype: str) -> func.FuncOp:
    (segment,) = _segments(_rms_norm_text(rows, columns, dtype)).values()
    return segment


def _reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's RMSNorm of x (in f32, as its decomposition computes bf16), and the scale."""
    scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    return F.rms_norm(x, (x.shape[-1],), w, EPS), scale


def _poisoned(shape: list[int], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """An output buffer of NaN, which the segment must overwrite."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _inputs(rows: int, columns: int, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rows + columns)
    x = torch.randn(rows, columns, generator=generator) * 3
    w = torch.randn(columns, generator=generator)
    return [x.to(device, dtype), w.to(device, dtype)]


# --------------------------------------------------------------------------- #
# The pass: one segment per norm                                               #
# --------------------------------------------------------------------------- #


def _rms_norm_with_residual(x, r, w):
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), w, EPS), h


def _fused_rms_norm_with_residual(x, r, w):
    """As `F.rms_norm` is on GPUs: ATen's fused RMSNorm, which the backend decomposes."""
    h = x + r
    return torch.ops.aten._fused_rms_norm(h, [h.shape[-1]], w, EPS)[0], h


@pytest.mark.parametrize("norm", [_rms_norm_with_residual, _fused_rms_norm_with_residual], ids=["rms_norm", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_its_backward_are_one_segment_each(dtype, norm):
    """torch.compile of a residual add and RMSNorm (as the CPU calls it, and `_fused_rms_norm`,
    which GPUs call; this CPU torch decomposes the latter without the backend's table, so the
    table's entry for it is exercised on GPUs alone): the forward is one segment (the add, the mean's row sum and the
    scaled output), the backward one segment for the input's gradient and a column sum for
    the weight's; both against eager."""
    generator = torch.Generator().manual_seed(0)
    x, r, w = (torch.randn(*shape, generator=generator).to(dtype) for shape in ((4, 8, 64), (4, 8, 64), (64,)))
    leaves = [[t.clone().requires_grad_() for t in (x, r, w)] for _ in range(2)]
    grad = torch.randn(4, 8, 64, generator=generator).to(dtype)
    torch._dynamo.reset()
    with _dumped("host_ir") as dump:
        out, h = torch.compile(norm, backend="hostir", options={"fallback": False})(*leaves[0])
        (out * grad).sum().backward()
    expected, expected_h = norm(*leaves[1])
    (expected * grad).sum().backward()
    tolerance = TOLERANCES[dtype]
    assert _max_error(out.float(), expected.float()) < tolerance and torch.equal(h, expected_h)
    for actual, reference in zip(leaves[0], leaves[1], strict=True):
        assert _max_error(actual.grad.float(), reference.grad.float()) < tolerance

    forward, backward = (p.split("func.func @", 1)[1] for p in dump.getvalue().split("// hostir: the host program")[1:])
    assert forward.count("hir.launch_kernel") == 1 and "hir.reduction" not in forward and "hir.aten" not in forward
    row_sums = re.findall(r"fusion.sum %\S+ \[2\] keepdim", dump.getvalue())
    assert len(row_sums) == 2, "the forward's and the backward's row sums, each in its segment"
    # The backward: the norm's kernel, the weight's column sum (its cast to bf16 a kernel of its own).
    assert re.findall(r"hir.reduction \"sum\" \[(.*?)\]", backward) == ["0, 1"]
    assert backward.count("hir.launch_kernel") == (1 if dtype == torch.float32 else 2)


def _layer_programs_on_rank(dtype: torch.dtype) -> str:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from examples.tp_decoder_layer import DecoderLayer, parallelize, rank_device

    device = rank_device()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    layer = parallelize(DecoderLayer().to(device, dtype), mesh)
    compiled = torch.compile(layer, backend="hostir", options={"backend": "nccl"})
    x = torch.randn(2, 16, 64, dtype=dtype).chunk(dist.get_world_size(), dim=1)[dist.get_rank()].to(device)
    with _dumped("host_ir") as dump:
        compiled(x.requires_grad_()).float().sum().backward()
    return dump.getvalue()


COMPUTING_ATEN = re.compile(
    r'hir.aten "aten\.(_fused_rms_norm\w*|mean|rsqrt|pow|mul|add|sub|div|sum|expand|detach)\.'
)
"""ATen calls that would compute part of a norm, or its residual add, outside the kernels (a
norm's casts are in its kernel, which the kernel count shows; torch 2.11's GPU graph of the
bf16 backward keeps six `_to_copy` calls of its own elsewhere)."""


@needs_ranks(2)
@pytest.mark.parametrize(("dtype", "kernels"), [(torch.float32, [4, 7]), (torch.bfloat16, [4, 9])], ids=["f32", "bf16"])
def test_the_decoder_layers_norms_are_one_kernel_each(dtype, kernels):
    """The TP decoder layer of examples/ on 2 ranks: each RMSNorm with the residual add before
    it is one kernel in the forward, each norm's backward one kernel and a column sum; no part
    of a norm is an ATen call (on the CPU every ATen call left is a view: 20 in the forward, 67
    in the backward; on GPUs the attention kernel adds its own). Before row reductions joined
    kernels the forward launched 8 kernels (f32; 12 in bf16) and 27 ATen calls, the backward
    11 (17) kernels and 72 ATen calls."""
    text = run_on_hostir(_layer_programs_on_rank, 2, dtype, timeout_s=300)[0]
    programs = [p.split("func.func @", 1)[1] for p in text.split("// hostir: the host program")[1:]]
    assert [p.count("hir.launch_kernel") for p in programs] == kernels
    for program in programs:
        assert not COMPUTING_ATEN.findall(program)
        assert all(axes == "1, 2" for axes in re.findall(r"hir.reduction \"sum\" \[(.*?)\]", program))


# --------------------------------------------------------------------------- #
# The segment on the CPU                                                        #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_segment_computes_rms_norm_as_torch(dtype):
    """The CPU path of a launch (fusion_eval) against torch's RMSNorm, into poisoned outputs:
    f32 to the rounding of a reordered sum, bf16 to one rounding."""
    rows, columns = 48, 96
    segment = _rms_norm_segment(rows, columns, {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype])
    ins = _inputs(rows, columns, dtype)
    outs = [_poisoned([rows, 1], torch.float32), _poisoned([rows, columns], dtype)]
    segment_runner(segment)(ins, outs)
    expected, scale = _reference(*ins)
    torch.testing.assert_close(outs[0], scale, rtol=1e-6, atol=0)
    torch.testing.assert_close(outs[1], expected, **({} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}))


# --------------------------------------------------------------------------- #
# The kernel's plan and source (any machine)                                    #
# --------------------------------------------------------------------------- #


def _source(rows: int, columns: int, dtype: torch.dtype) -> str:
    segment = _rms_norm_segment(rows, columns, {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype])
    ins = _inputs(rows, columns, dtype)
    return kernels.generated_source(segment, ins, [torch.empty(rows, 1), torch.empty(rows, columns, dtype=dtype)])


def test_a_short_row_is_one_warps():
    """Rows of 64: one warp per row, the sum of the squares accumulated by each lane and
    reduced by shuffles, the row's elements stored by every lane, the scale by lane 0."""
    source = _source(16, 64, torch.float32)
    assert_lines_in_order(
        source,
        [
            "template <bool Max, typename T>",
            "__device__ __forceinline__ T hostir_warp_reduce(T value) {",
            "__device__ __forceinline__ float hostir_segment_reduce0(const float a0) {",
            "  const float v3 = powf(v1, v2);",
            "  return v3;",
            "__device__ __forceinline__ void hostir_segment_body(const float a0, const float a1, const float s0, float& r1) {",
            "  const float v8 = rsqrtf(v7);",
            "__device__ __forceinline__ void hostir_segment_row(const float s0, float& r0) {",
            "  // One warp per row.",
            "  for (long long row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {",
            "    float s0 = 0.0f;",
            "      const float e = hostir_segment_reduce0(in0[in0_row + j]);",
            "      s0 = s0 + e;",
            "    s0 = hostir_warp_reduce<false>(s0);",
            "      hostir_segment_body(in0[in0_row + j], in1[in1_row + j], s0, r1);",
            "      out1[out1_row + j] = r1;",
            "    if (first == 0) {",
            "      hostir_segment_row(s0, r0);",
            "      out0[out0_row] = r0;",
        ],
    )
    assert "__shared__" not in source and "hostir_block_reduce" not in source


@pytest.mark.parametrize("columns", [4096, 8192])
def test_a_long_row_is_one_blocks(columns):
    """Rows of 4096 and 8192 in bf16: one block per row, the warps' partial sums through
    shared memory; bf16 loaded into f32 and the output rounded once."""
    source = _source(4, columns, torch.bfloat16)
    assert_lines_in_order(
        source,
        [
            "__device__ __forceinline__ T hostir_block_reduce(T value, T* partials, T identity) {",
            "__device__ __forceinline__ float hostir_segment_reduce0(const unsigned short a0) {",
            "  const float v0 = hostir_bf16_to_f32(a0);",
            "  r1 = hostir_f32_to_bf16(v11);",
            "  // One block per row; each warp's partial reductions meet in shared memory.",
            "  __shared__ float partials0[32];",
            "  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {",
            "    s0 = hostir_block_reduce<false>(s0, partials0, 0.0f);",
        ],
    )
    segment = _rms_norm_segment(4, columns, "bf16")
    launch = kernels.SegmentKernel(segment).plan(_inputs(4, columns, torch.bfloat16), [torch.empty(4, 1), torch.empty(4, columns, dtype=torch.bfloat16)])
    assert (launch.elements, launch.extents, launch.layout.warp_per_row) == (4, [4, columns], False)


def test_a_row_output_of_the_wrong_shape_is_refused():
    segment = _rms_norm_segment(4, 64, "f32")
    ins = _inputs(4, 64, torch.float32)
    with pytest.raises(HostirError, match=r"output #0 has shape \[4, 64\] but the segment computes \[4, 1\]"):
        kernels.generated_source(segment, ins, [torch.empty(4, 64), torch.empty(4, 64)])


def test_a_reduced_axis_that_a_buffer_broadcasts_is_refused():
    """A row sum of an input of dynamic extent that is 1 at run time, beside an output whose
    rows are longer: the sum would count one element where the kernel would count a row."""
    text = """
func.func @f(%x: !fusion.tensor<[4, ?], f32>, %y: !fusion.tensor<[4, ?], f32>) -> !fusion.tensor<[4, ?], f32> {
  %s = fusion.sum %x [1] keepdim : !fusion.tensor<[4, ?], f32> -> !fusion.tensor<[4, 1], f32>
  %z = fusion.mul %y, %s : (!fusion.tensor<[4, ?], f32>, !fusion.tensor<[4, 1], f32>) -> !fusion.tensor<[4, ?], f32>
  func.return %z : !fusion.tensor<[4, ?], f32>
}"""
    (segment,) = _segments(text).values()
    with pytest.raises(HostirError, match="reduction #0 reduces rows of extent 1 in a space whose rows have extent 8"):
        kernels.generated_source(segment, [torch.empty(4, 1), torch.empty(4, 8)], [torch.empty(4, 8)])


# --------------------------------------------------------------------------- #
# On a GPU                                                                      #
# --------------------------------------------------------------------------- #


@requires_gpu
@pytest.mark.parametrize("columns", [64, 4096, 8192])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_kernel_computes_rms_norm_as_torch(dtype, columns):
    """The CuPy kernel (one warp per row of 64, a block per row of 4096 and 8192) against
    eager ATen's RMSNorm on the GPU, into poisoned outputs: f32 to the rounding of a
    reordered sum, bf16 to one rounding."""
    rows = 300  # not a multiple of the warps per block
    segment = _rms_norm_segment(rows, columns, {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype])
    ins = _inputs(rows, columns, dtype, "cuda")
    outs = [_poisoned([rows, 1], torch.float32, "cuda"), _poisoned([rows, columns], dtype, "cuda")]
    assert kernels.SegmentKernel(segment).launch(ins, outs)
    expected, scale = _reference(*ins)
    torch.testing.assert_close(outs[0], scale, rtol=1e-5, atol=0)
    torch.testing.assert_close(outs[1], expected, **({} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}))


@requires_gpu
@pytest.mark.parametrize("columns", [64, 4096, 8192])
def test_the_kernel_computes_softmax_as_torch(columns):
    """Two reductions of one row, the second reading the first: a max, then the sum of the
    exponentials less the max."""
    f32 = "!fusion.tensor<[?, COLUMNS], f32>".replace("COLUMNS", str(columns))
    row = "!fusion.tensor<[?, 1], f32>"
    (segment,) = _segments(f"""
func.func @softmax(%x: {f32}) -> {f32} {{
  %max = fusion.max %x [1] keepdim : {f32} -> {row}
  %shifted = fusion.sub %x, %max : ({f32}, {row}) -> {f32}
  %e = fusion.exp %shifted : {f32} -> {f32}
  %sum = fusion.sum %e [1] keepdim : {f32} -> {row}
  %y = fusion.div %e, %sum : ({f32}, {row}) -> {f32}
  func.return %y : {f32}
}}""").values()
    x = torch.randn(77, columns, generator=torch.Generator().manual_seed(columns)).cuda() * 4
    out = _poisoned([77, columns], torch.float32, "cuda")
    assert kernels.SegmentKernel(segment).launch([x], [out])
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-7)
