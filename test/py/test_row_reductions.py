"""Segments that reduce rows: RMSNorm and its backward as one kernel each.

The importer reads torch's RMSNorm (the decomposition aot_autograd hands the backend: a
mean, an rsqrt, a detach, and in the backward a row sum expanded along the row) as fusion
ops, fusion-to-hir makes each norm one segment whose reduction runs over the rows, and the
kernel of such a segment is one warp or one block per row. Without a GPU every segment
runs eagerly (`fusion_eval`) and the kernel is planned and its source generated; with one,
the kernel runs against torch.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from xdsl.dialects import func
from xdsl.dialects.builtin import bf16, f32

from hostir import parse_module
from hostir.runtime.codegen import kernels
from hostir.runtime.interpreter.compute import segment_runner
from hostir.passes.lowering.fusion_to_hir import FusionToHir
from hostir_dialect import hir, hostir_context
from hostir_dialect.fusion import tensor_type
from hostir_dialect.text import HostirError
from test_communicator import needs_ranks
from test_kernels import PLACES, assert_lines_in_order, assert_written_only_within, kernel_arguments, placed, requires_gpu, vectorised
from test_torch_backend import TOLERANCES, _dumped, _layer_on_rank, _max_error, run_on_hostir

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from rmsnorm_segment import backward_segment  # noqa: E402  (a script's folder, not a package)

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
    table's entry for it is exercised on GPUs, and for its backward by
    `test_the_fused_norms_backward_as_gpus_trace_it_is_one_segment`): the forward is one
    segment (the add, the mean's row sum and the scaled output), the backward one segment
    for the input's gradient and the weight's (its column sum over the tokens in the
    segment, which returns it, not the product it sums); both against eager."""
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
    column_sums = re.findall(r"fusion.sum %\S+ \[0, 1\] keepdim : \S+ -> (\S+)", dump.getvalue())
    assert column_sums == ["!f32_1x1x64"], "the weight's gradient, in the backward's segment"
    # The backward: the norm's kernel (its cast to bf16 a kernel of its own), no reduction.
    assert "hir.reduction" not in backward
    assert backward.count("hir.launch_kernel") == (1 if dtype == torch.float32 else 2)


def _fused_rms_norm_backward(grad, h, rstd, w):
    return torch.ops.aten._fused_rms_norm_backward(grad, h, [h.shape[-1]], rstd, w, [True, True])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_norms_backward_as_gpus_trace_it_is_one_segment(dtype):
    """What a GPU's training graph holds for RMSNorm's backward, `_fused_rms_norm_backward`
    (this CPU torch traces `F.rms_norm` into its parts, and has no kernel of the fused op but
    its meta one): the backend's decomposition of it is one segment that sums the weight's
    gradient over the tokens with the summed axes dropped (`[64]`, where the CPU's trace
    keeps them), against the gradients autograd gives `F.rms_norm` on the same values."""
    generator = torch.Generator().manual_seed(0)
    h, grad = (torch.randn(4, 8, 64, generator=generator).to(dtype) for _ in range(2))
    w = torch.randn(64, generator=generator).to(dtype)
    rstd = torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + EPS)
    torch._dynamo.reset()
    with _dumped("host_ir") as dump:
        d_input, d_weight = torch.compile(_fused_rms_norm_backward, backend="hostir", options={"fallback": False})(
            grad, h, rstd, w
        )
    leaves = [t.clone().requires_grad_() for t in (h, w)]
    F.rms_norm(leaves[0], (64,), leaves[1], EPS).backward(grad)
    tolerance = TOLERANCES[dtype]
    assert _max_error(d_input.float(), leaves[0].grad.float()) < tolerance
    assert _max_error(d_weight.float(), leaves[1].grad.float()) < tolerance
    (program,) = (p.split("func.func @", 1)[1] for p in dump.getvalue().split("// hostir: the host program")[1:])
    assert re.findall(r"fusion.sum %\S+ \[0, 1\] : \S+ -> (\S+)", dump.getvalue()) == ["!f32_64"]
    assert "hir.reduction" not in program and not COMPUTING_ATEN.findall(program)
    assert program.count("hir.launch_kernel") == (1 if dtype == torch.float32 else 2)


def _layer_programs_on_rank(dtype: torch.dtype, batch: int = 2) -> str:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from examples.tp_decoder_layer import DecoderLayer, parallelize, rank_device

    device = rank_device()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    layer = parallelize(DecoderLayer().to(device, dtype), mesh)
    compiled = torch.compile(layer, backend="hostir", options={"backend": "nccl"})
    x = torch.randn(batch, 16, 64, dtype=dtype).chunk(dist.get_world_size(), dim=1)[dist.get_rank()].to(device)
    with _dumped("host_ir") as dump:
        compiled(x.requires_grad_()).float().sum().backward()
    return dump.getvalue()


def test_a_cast_to_a_dense_result_is_a_fusion_cast():
    """torch 2.11's decomposition of RMSNorm's backward casts with `memory_format=
    torch.contiguous_format`, which every fusion value is: a `fusion.cast` that joins the
    norm's kernel (each was an ATen copy of the activations to f32 on GPUs). Another memory
    format stays ATen's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from hostir.frontend.importer import import_graph

    def cast(x, memory_format):
        return (x.to(torch.float32, memory_format=memory_format) * 2,)

    x = torch.randn(2, 3, 4, 5, dtype=torch.bfloat16)
    for memory_format, ops in ((torch.contiguous_format, {"fusion.cast"}), (torch.channels_last, {"fusion.aten"})):
        graph = make_fx(lambda x: cast(x, memory_format))(x)
        assert [n.kwargs.get("memory_format") for n in graph.graph.nodes if n.target is torch.ops.aten._to_copy.default] == [memory_format]
        names = {op.name for op in import_graph(graph).module.walk()}
        assert ops <= names and not ({"fusion.cast", "fusion.aten"} - ops) & names, names


def test_a_reshape_that_puts_unit_axes_in_is_a_broadcast():
    """A reshape that only puts extent-1 axes in (RMSNorm's backward reading its gradient
    `[16, 64]` as `[1, 16, 64]`) is a `fusion.broadcast` of those axes, which a kernel holds
    with its neighbours; one that moves elements between axes stays ATen's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from hostir.frontend.importer import import_graph

    x = torch.randn(16, 64)
    for shape, ops in (((1, 16, 1, 64), {"fusion.broadcast"}), ((2, 8, 64), {"fusion.aten"})):
        graph = make_fx(lambda x: (x.exp().reshape(shape) * 2,))(x)
        module = import_graph(graph).module
        names = {op.name for op in module.walk()}
        assert ops <= names and not ({"fusion.broadcast", "fusion.aten"} - ops) & names, names
        if "fusion.broadcast" in ops:
            (broadcast,) = [op for op in module.walk() if op.name == "fusion.broadcast"]
            assert list(broadcast.new_axes.get_values()) == [0, 2]


COMPUTING_ATEN = re.compile(
    r'hir.aten "aten\.(_fused_rms_norm\w*|mean|rsqrt|pow|mul|add|sub|div|sum|expand|detach|_to_copy|convert_element_type)\.'
)
"""ATen calls that would compute part of a norm, its casts included, or its residual add,
outside the kernels."""


@needs_ranks(2)
@pytest.mark.parametrize("batch", [1, 2], ids=["one_sequence", "two_sequences"])
@pytest.mark.parametrize(("dtype", "kernels"), [(torch.float32, [4, 3]), (torch.bfloat16, [4, 5])], ids=["f32", "bf16"])
def test_the_decoder_layers_norms_are_one_kernel_each(dtype, kernels, batch):
    """The TP decoder layer of examples/ on 2 ranks: each RMSNorm with the residual add before
    it is one kernel in the forward, each norm's backward one kernel and a column sum; no part
    of a norm is an ATen call (on the CPU every ATen call left is a view: 20 in the forward, 67
    in the backward; on GPUs the attention kernel adds its own). Before row reductions joined
    kernels the forward launched 8 kernels (f32; 12 in bf16) and 27 ATen calls, the backward
    11 (17) kernels and 72 ATen calls. With one sequence the norm's backward reads its
    gradient with the batch axis put back: before that reshape was a `fusion.broadcast` (and
    the kernels' spaces local), it cut the backward into 11 (15) kernels; before a run of
    pointwise ops passed over the GEMMs between its ops, SwiGLU's backward was two kernels
    (the backward 7 (9)), and with the partitioner's recomputation of the activation, before
    a run took ops that read a view it passed over, three (7 in bf16); before the sums of
    the projections' input gradients were made in their GEMMs (`sum-in-matmul`), three
    kernels more made them (6 (8)). Each norm's backward sums its weight's gradient over the
    tokens in its kernel: before, the kernel wrote the product in f32 and a reduction (an
    ATen sum) read it back."""
    text = run_on_hostir(_layer_programs_on_rank, 2, dtype, batch, timeout_s=300)[0]
    programs = [p.split("func.func @", 1)[1] for p in text.split("// hostir: the host program")[1:]]
    assert [p.count("hir.launch_kernel") for p in programs] == kernels
    # The backward recomputes SwiGLU's silu (torch's min-cut partitioner, as for inductor):
    # the forward's kernel of it writes the product alone, not the activation as well.
    forward = text.split("// hostir: the host program")[1]
    (swiglu,) = [f for f in forward.split("func.func private @")[1:] if "fusion.sigmoid" in f]
    returned = swiglu.split("func.return", 1)[1].split(":", 1)[0]  # the values, before their types
    assert returned.count("%") == 1, swiglu
    for program in programs:
        assert not COMPUTING_ATEN.findall(program)
        assert "hir.reduction" not in program, "the norms' weight gradients are summed in their kernels"
    # Each norm's weight gradient, a sum over the tokens in f32, in a kernel's segment: on
    # the CPU torch writes it with the token axes kept (`[1, 1, 64]`), on GPUs through
    # `_fused_rms_norm_backward`'s decomposition, which drops them (`[64]`).
    backward = text.split("// hostir: the host program")[2]
    column_sum = r"fusion.sum %\S+ \[1(?:, 2)?\](?: keepdim)? : \S+ -> !f32_2x(?:1x)*64_didx"
    assert len(re.findall(column_sum, backward)) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_on_one_rank_two_sequences_launch_as_many_kernels_as_one(dtype):
    """The TP decoder layer on one rank, where no collective stands between the norms and the
    MLP: with two sequences the graphs compute SwiGLU's backward and the norms partly per
    sequence and partly on rows (the form of the linear layers' products), joined by ATen
    reshapes that would end a kernel; `flatten-rows` computes them on rows, so the forward
    and the backward launch as many kernels for two sequences as for one (without it the
    backward launched 7 in f32 where one sequence takes 3). Output, input gradient and every
    parameter's gradient against eager DTensor's, both batches."""
    kernels = {}
    for batch in (1, 2):
        (result,) = run_on_hostir(_layer_on_rank, 1, (16,), dtype, batch, timeout_s=300)
        bad = {what: error for what, error in result["errors"].items() if error > TOLERANCES[dtype]}
        assert not bad, f"{batch} sequence(s): {bad}"
        programs = result["dump"].split("// hostir: the host program")[1:]
        kernels[batch] = [p.split("func.func @", 1)[1].split("// hostir:")[0].count("hir.launch_kernel") for p in programs]
    assert len(kernels[1]) == 2 and kernels[2] == kernels[1], kernels


def test_a_bf16_layers_kernels_write_float32_only_per_row_or_per_column():
    """The bf16 layer on one rank, two sequences: its kernels compute in float32 but write
    float32 only where a value has one element per row (a norm's scale, saved for the
    backward) or per column (a norm weight's gradient, before its cast), never one of the
    activation's size. Before a run left the work it took from beyond a GEMM to the kernel
    that reads it, the kernel of the post-attention norm's backward also recomputed the
    input norm's normalized input from the saved bf16 activation and wrote it, and its
    upcast, in float32 for the input norm's kernel to read back (two values of 4 bytes per
    element, where that kernel now reads the saved one of 2). Values against eager DTensor's."""
    (result,) = run_on_hostir(_layer_on_rank, 1, (16,), torch.bfloat16, 2, timeout_s=300)
    bad = {what: error for what, error in result["errors"].items() if error > TOLERANCES[torch.bfloat16]}
    assert not bad, bad
    dims, tokens = 64, 2 * 16
    sections = result["dump"].split("// hostir: the host program")[1:]
    programs = [parse_module(p.split("\n", 1)[1].split("// hostir:")[0]) for p in sections]
    assert len(programs) == 2
    for program in programs:
        launches = [op for op in program.walk() if isinstance(op, hir.LaunchKernelOp)]
        assert launches
        written = [tensor_type(v) for launch in launches for v in launch.outs]
        assert any(t.element_type == bf16 for t in written)
        float32 = [t.local_shape() for t in written if t.element_type == f32]
        assert all(math.prod(shape) in (tokens, dims) for shape in float32), float32


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


def _softmax_segment(columns: int) -> func.FuncOp:
    """Softmax over rows of `columns` f32: two reductions of one row, the second reading the
    first (a max, then the sum of the exponentials less the max)."""
    f32 = f"!fusion.tensor<[?, {columns}], f32>"
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
    return segment


# --------------------------------------------------------------------------- #
# The kernel's plan and source (any machine)                                    #
# --------------------------------------------------------------------------- #


def _source(rows: int, columns: int, dtype: torch.dtype) -> str:
    segment = _rms_norm_segment(rows, columns, {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype])
    ins = _inputs(rows, columns, dtype)
    return kernels.generated_source(segment, ins, [torch.empty(rows, 1), torch.empty(rows, columns, dtype=dtype)])


def test_a_short_row_is_one_warps():
    """Rows of 64 f32: one warp per row, each lane loading one vector of 4 of the row, which
    it keeps for the output; the sum of the squares accumulated by each lane and reduced by
    shuffles, the row's elements stored by every lane in vectors, the scale by lane 0."""
    source = _source(16, 64, torch.float32)
    assert_lines_in_order(
        source,
        [
            "template <bool Max, typename T>",
            "__device__ __forceinline__ T hostir_warp_reduce(T value) {",
            "__device__ __forceinline__ float hostir_segment_reduce0(const float a0) {",
            "  const float v3 = (v1 * v1);",
            "  return v3;",
            "__device__ __forceinline__ void hostir_segment_body(const float a0, const float a1, const float s0, float& r1) {",
            "  const float v8 = rsqrtf(v7);",
            "__device__ __forceinline__ void hostir_segment_row(const float s0, float& r0) {",
            "  // One warp per row.",
            "  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {",
            "    // This thread's 1 vector of 4 of the row, read once.",
            "    hostir_vector<float, 4> a0[1];",
            "    for (int c = 0; c < 1; ++c) {",
            "      const int j = (first + c * step) * 4;",
            "      if (j < columns) {",
            "        a0[c] = hostir_load<4>(in0 + in0_row + j);",
            "    float s0 = 0.0f;",
            "        for (int e = 0; e < 4; ++e) {",
            "          const float x = hostir_segment_reduce0(a0[c].v[e]);",
            "          s0 = s0 + x;",
            "    s0 = hostir_warp_reduce<false>(s0);",
            "        const hostir_vector<float, 4> a1 = hostir_load<4>(in1 + in1_row + j);",
            "          hostir_segment_body(a0[c].v[e], a1.v[e], s0, r1.v[e]);",
            "        hostir_store(out1 + out1_row + j, r1);",
            "    if (first == 0) {",
            "      hostir_segment_row(s0, out0[out0_row]);",
        ],
    )
    assert "__shared__" not in source and "hostir_block_reduce" not in source
    assert source.count("hostir_load<4>(in0") == 1, "the row is read once"


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
            "  for (int row = blockIdx.x; row < rows; row += gridDim.x) {",
            "    // This thread's 2 vectors of 8 of the row, read once.",
            "        a0[c] = hostir_load<8>(in0 + in0_row + j);",
            "    s0 = hostir_block_reduce<false>(s0, partials0, 0.0f);",
        ],
    )
    launch = _plan(4, columns, torch.bfloat16)
    assert (launch.elements, launch.extents, launch.layout.warp_per_row) == (4, [4, columns], False)
    # 2 vectors of 8 a thread: 256 threads for 4096, 512 for 8192.
    assert (launch.layout.vector, launch.layout.cached, launch.threads) == (8, 2, columns // 16)


def _plan(rows: int, columns: int, dtype: torch.dtype, x: torch.Tensor | None = None) -> kernels.Launch:
    """The plan of RMSNorm's kernel on `x` (random and contiguous by default)."""
    segment = _rms_norm_segment(rows, columns, {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype])
    default, w = _inputs(rows, columns, dtype)
    outs = [torch.empty(rows, 1), torch.empty(rows, columns, dtype=dtype)]
    return kernels.SegmentKernel(segment).plan([default if x is None else x, w], outs)


@pytest.mark.parametrize(
    ("rows", "columns", "dtype", "x", "planned"),
    [
        (300, 64, torch.float32, None, (4, True, 1, 256)),
        (300, 1024, torch.bfloat16, None, (8, True, 4, 256)),
        (300, 4096, torch.float32, None, (4, False, 2, 512)),
        (300, 8192, torch.float32, None, (4, False, 2, 1024)),
        # An odd row: no vector divides it; 4097 elements in 1024 threads, 5 each, kept.
        (30, 4097, torch.bfloat16, None, (1, False, 5, 1024)),
        # Rows of 4100: vectors of 4 elements (8 bytes) divide them, of 8 do not.
        (30, 4100, torch.bfloat16, None, (4, False, 2, 544)),
        # A view one element into each row: no row starts on a vector.
        (30, 4096, torch.bfloat16, torch.empty(30, 4097, dtype=torch.bfloat16)[:, 1:], (1, False, 4, 1024)),
        # Rows of 4104 elements, 8 bytes past an aligned address: vectors of 4.
        (30, 4096, torch.bfloat16, torch.empty(30, 4104, dtype=torch.bfloat16)[:, 4:4100], (4, False, 2, 512)),
        # A transposed input walks its rows with stride 30: scalar, kept in registers still.
        (30, 4096, torch.float32, torch.empty(4096, 30).t(), (1, False, 4, 1024)),
        # 16 vectors of 4 f32 a thread would take 256 bytes of registers: read twice instead.
        (2, 65536, torch.float32, None, (4, False, 0, 1024)),
    ],
    ids=["warp f32", "warp bf16 1024", "f32 4096", "f32 8192", "odd", "vectors of 4", "offset view",
         "offset rows", "transposed", "too long to keep"],  # fmt: skip
)
def test_the_plan_vectorises_rows_that_start_on_whole_vectors(rows, columns, dtype, x, planned):
    """(vector width, a warp per row, vectors of the row kept per thread, threads per block)
    of RMSNorm's kernel on rows of several lengths and layouts."""
    layout = (launch := _plan(rows, columns, dtype, x)).layout
    assert (layout.vector, layout.warp_per_row, layout.cached, launch.threads) == planned


def test_a_row_kept_in_registers_is_read_once_and_one_too_long_twice():
    kept = _source(30, 4097, torch.bfloat16)
    assert_lines_in_order(
        kept,
        [
            "    // This thread's 5 elements of the row, read once.",
            "    unsigned short a0[5];",
            "    for (int c = 0; c < 5; ++c) {",
            "      const int j = first + c * step;",
            "        a0[c] = in0[in0_row + j];",
            "        const float x = hostir_segment_reduce0(a0[c]);",
            "        hostir_segment_body(a0[c], in1[in1_row + j], s0, out1[out1_row + j]);",
        ],
    )
    assert "hostir_vector" not in kept and kept.count("in0[") == 1
    again = _source(2, 65536, torch.float32)
    assert_lines_in_order(
        again,
        [
            "    for (int j = first * 4; j < columns; j += step * 4) {",
            "      const hostir_vector<float, 4> a0 = hostir_load<4>(in0 + in0_row + j);",
            "        const float x = hostir_segment_reduce0(a0.v[e]);",
            "    for (int j = first * 4; j < columns; j += step * 4) {",
            "      const hostir_vector<float, 4> a0 = hostir_load<4>(in0 + in0_row + j);",
            "        hostir_segment_body(a0.v[e], a1.v[e], s0, r1.v[e]);",
        ],
    )


@pytest.mark.parametrize(
    ("columns", "planned"),
    [(64, (8, True, 1, 1, 256)), (4096, (8, False, 2, 2, 256)), (65536, (8, False, 0, 8, 1024))],
    ids=["warp", "block", "too long to keep"],
)
def test_a_column_sum_keeps_the_rows_vectors_and_sums_each_threads_columns(columns, planned):
    """RMSNorm's backward with the weight's gradient summed in the kernel: the f32 sums are no
    vector access of the row, so its bf16 rows still move 8 elements a vector (with the f32
    product written whole, they moved 4); each thread walks a fixed number of vectors of each
    row (`steps`, kept or not), sums its columns over the rows in registers, and writes them
    as its block's (or its warp's) row of partial sums once every row is walked."""
    rows, dtype = 300, torch.bfloat16
    g, x = (torch.empty(rows, columns, dtype=dtype) for _ in "gx")
    ins = [g, x, torch.empty(columns, dtype=dtype), torch.empty(rows, 1)]
    outs = [torch.empty(1, columns), torch.empty(rows, columns, dtype=dtype)]
    kernel = kernels.SegmentKernel(backward_segment(rows, columns, dtype))
    launch = kernel.plan(ins, outs)
    layout = launch.layout
    assert (layout.vector, layout.warp_per_row, layout.cached, layout.steps, launch.threads) == planned
    steps = layout.steps
    partial = "blockIdx.x * warps + threadIdx.x / 32" if layout.warp_per_row else "blockIdx.x"
    assert_lines_in_order(
        kernel.source(ins, outs),
        [
            "__device__ __forceinline__ float hostir_segment_column_sum0(",
            f"  float column_sum0[{steps}][8] = {{}};",
            "  for (int row = ",
            f"    for (int c = 0; c < {steps}; ++c) {{",
            "          hostir_segment_body(",
            "          column_sum0[c][e] += hostir_segment_column_sum0(",
            f"  const int partial = {partial};",
            f"  for (int c = 0; c < {steps}; ++c) {{",
            "        out0[partial * columns + j + e] = column_sum0[c][e];",
        ],
    )
    # A buffer of the product's shape for the sum is refused.
    with pytest.raises(HostirError, match=rf"output #0 has shape \[{rows}, {columns}\] but the segment computes \[1, {columns}\]"):
        kernel.plan(ins, [torch.empty(rows, columns), outs[1]])


def test_row_sizes_are_passed_in_the_order_of_the_parameters():
    """A transposed input: it walks the rows with stride 1 and their elements with stride 30."""
    segment = _rms_norm_segment(30, 4096, "f32")
    ins = [torch.empty(4096, 30).t(), torch.empty(4096)]
    arguments = kernel_arguments(kernels.SegmentKernel(segment), ins, [torch.empty(30, 1), torch.empty(30, 4096)])
    assert arguments == {"rows": 30, "columns": 4096, "in0_stride1": 30, "out1_stride0": 4096}


def test_indices_are_32_bit_where_every_offset_fits():
    """2^20 rows of 2^10 bf16 in a buffer of rows twice as long (meta tensors: nothing is
    allocated): the largest offset is 2^31 - 2^10 - 1, over 32-bit indices' limit."""
    assert _plan(4, 64, torch.bfloat16).layout.index == "int"
    x = torch.empty(2**20, 2**11, dtype=torch.bfloat16, device="meta")[:, : 2**10]
    segment = _rms_norm_segment(2**20, 2**10, "bf16")
    w = torch.empty(2**10, dtype=torch.bfloat16, device="meta")
    outs = [torch.empty(2**20, 1, device="meta"), torch.empty(2**20, 2**10, dtype=torch.bfloat16, device="meta")]
    kernel = kernels.SegmentKernel(segment)
    assert kernel.plan([x, w], outs).layout.index == "long long"
    assert "long long rows, long long columns" in kernel.source([x, w], outs)


def test_a_row_output_of_the_wrong_shape_is_refused():
    segment = _rms_norm_segment(4, 64, "f32")
    ins = _inputs(4, 64, torch.float32)
    with pytest.raises(HostirError, match=r"output #0 has shape \[4, 64\] but the segment computes \[4, 1\]"):
        kernels.generated_source(segment, ins, [torch.empty(4, 64), torch.empty(4, 64)])


@pytest.mark.parametrize(
    ("body", "dtype"),
    [("", "f32"), ("%r = fusion.sum %p [1] keepdim : !t -> !fusion.tensor<[4, 1], {0}>", "bf16")],
    ids=["no row reduced", "bf16 sums"],
)
def test_a_column_sum_a_kernel_cannot_compute_is_refused(body, dtype):
    """A segment returning a column sum, written by hand (fusion-to-hir makes one only where
    a kernel computes it): of a segment that reduces no rows, or of bf16 values."""
    text = f"""
!t = !fusion.tensor<[4, 8], {dtype}>
func.func private @f(%x: !t) -> !fusion.tensor<[1, 8], {dtype}> {{
  %p = fusion.mul %x, %x : (!t, !t) -> !t
  {body.format(dtype)}
  %c = fusion.sum %p [0] keepdim : !t -> !fusion.tensor<[1, 8], {dtype}>
  func.return %c : !fusion.tensor<[1, 8], {dtype}>
}}"""
    segment = parse_module(text).body.block.first_op
    with pytest.raises(HostirError, match="a kernel sums columns only in a kernel that reduces rows, of f32 or f64 values"):
        kernels.SegmentKernel(segment)


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
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("columns", [64, 100, 4096, 4097, 8192])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_kernel_computes_rms_norm_as_torch(dtype, columns, place):
    """The CuPy kernel (one warp per row of 64 and 100, a block per row of 4096 and more)
    against eager ATen's RMSNorm on the GPU, its input and output placed where `place` says
    (vector and scalar kernels), into poisoned outputs whose other elements stay poisoned:
    f32 to the rounding of a reordered sum, bf16 to one rounding."""
    rows = 300  # not a multiple of the warps per block
    segment = _rms_norm_segment(rows, columns, {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype])
    x, w = _inputs(rows, columns, dtype, "cuda")
    _, x_view = placed(x, place)
    y_base, y = placed(_poisoned([rows, columns], dtype, "cuda"), place)
    outs = [_poisoned([rows, 1], torch.float32, "cuda"), y]
    kernel = kernels.SegmentKernel(segment)
    assert (kernel.plan([x_view, w], outs).layout.vector > 1) == vectorised(place, columns)
    assert kernel.launch([x_view, w], outs)
    expected, scale = _reference(x, w)
    torch.testing.assert_close(outs[0], scale, rtol=1e-5, atol=0)
    torch.testing.assert_close(y, expected, **({} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}))
    assert_written_only_within(y_base, y)


@requires_gpu
@pytest.mark.parametrize("keepdim", [True, False], ids=["kept", "dropped"])
@pytest.mark.parametrize("place", ["aligned", "one element in"])
@pytest.mark.parametrize("columns", [64, 4096, 8192])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_backward_kernel_computes_rms_norms_gradient_as_autograd(dtype, columns, place, keepdim):
    """RMSNorm's backward (benchmarks/rmsnorm_segment.py: three loads kept in registers, a
    per-row input, the weight's gradient summed over the rows in the kernel) against
    autograd of F.rms_norm in f32: the input's gradient, and the weight's, the output's
    gradient placed where `place` says. Twice: the second launch's sums start from zero."""
    rows = 300
    x, w = _inputs(rows, columns, dtype, "cuda")
    g = torch.randn(rows, columns, generator=torch.Generator().manual_seed(7)).to("cuda", dtype)
    _, g_view = placed(g, place)
    scale = _reference(x, w)[1]
    kernel = kernels.SegmentKernel(backward_segment(rows, columns, dtype, keepdim))
    leaves = [t.float().requires_grad_() for t in (x, w)]
    F.rms_norm(leaves[0], (columns,), leaves[1], EPS).backward(g.float())
    for _ in range(2):
        summed = _poisoned([1, columns] if keepdim else [columns], torch.float32, "cuda")
        outs = [summed, _poisoned([rows, columns], dtype, "cuda")]
        assert (kernel.plan([g_view, x, w, scale], outs).layout.vector > 1) == (place == "aligned")
        assert kernel.launch([g_view, x, w, scale], outs)
        # The weight's gradient is summed in f32 from the same elements as autograd's.
        torch.testing.assert_close(outs[0].view(columns), leaves[1].grad, rtol=1e-4, atol=1e-4)
        tolerance = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
        torch.testing.assert_close(outs[1], leaves[0].grad.to(dtype), **tolerance)


@requires_gpu
def test_a_column_sum_of_no_rows_is_zeros():
    """No tokens: the kernel has nothing to walk, and the weight's gradient is zeros, as autograd's."""
    x, g = (torch.empty(0, 64, device="cuda") for _ in "xg")
    ins = [g, x, torch.randn(64, device="cuda"), torch.empty(0, 1, device="cuda")]
    outs = [_poisoned([1, 64], torch.float32, "cuda"), torch.empty(0, 64, device="cuda")]
    assert kernels.SegmentKernel(backward_segment(0, 64, torch.float32)).launch(ins, outs)
    assert torch.equal(outs[0], torch.zeros(1, 64, device="cuda"))


@requires_gpu
@pytest.mark.parametrize("columns", [64, 4096, 8192])
def test_the_kernel_computes_softmax_as_torch(columns):
    """Two reductions of one row, the second reading the first: a max, then the sum of the
    exponentials less the max."""
    segment = _softmax_segment(columns)
    x = torch.randn(77, columns, generator=torch.Generator().manual_seed(columns)).cuda() * 4
    out = _poisoned([77, columns], torch.float32, "cuda")
    assert kernels.SegmentKernel(segment).launch([x], [out])
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-7)
