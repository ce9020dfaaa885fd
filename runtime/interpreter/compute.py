"""The interpreter's handlers of hir's compute ops: segments, matmul, linear, copy, pointwise, reductions.

Compute ops are destination-passing: a step writes into the buffers the program
allocated, on the ranks in the mesh of its first output.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import torch
from xdsl.dialects import func
from xdsl.ir import Operation

from hostir_dialect import fusion, hir
from hostir_dialect.text import HostirError
from hostir.runtime.codegen import kernels
from hostir.runtime.interpreter import aten_calls, fusion_eval
from hostir.runtime.interpreter.core import Environment, Preparation, RunContext, Step, fill_outs, handles, mesh_of


SegmentRun = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]
"""`run(ins, outs)`: a segment evaluated on `ins`, its results written into `outs`."""


def segment_runner(callee: func.FuncOp) -> SegmentRun:
    """How a fused segment (`hir.launch_kernel`) runs.

    The one place a fused segment is executed, bound once per op while the program is
    prepared. On CUDA tensors it runs as its generated kernel (`kernels.SegmentKernel`,
    compiled at its first launch, cached by structure) on the current stream, writing
    `outs` in place; anything else is evaluated eagerly by `fusion_eval` and copied into
    `outs`. A segment the generator refuses runs eagerly too, and says so with a
    `KernelFallbackWarning` at its first launch on CUDA tensors.
    """
    evaluate = fusion_eval.compile_function(callee)

    def eagerly(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        for out, result in zip(outs, evaluate(ins, outs[0].device), strict=True):
            out.copy_(result)

    try:
        kernel = kernels.SegmentKernel(callee)
    except HostirError as refusal:
        return _warning_once(eagerly, callee, refusal)

    def run(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        if not kernel.launch(ins, outs):
            eagerly(ins, outs)

    return run


def _warning_once(eagerly: SegmentRun, callee: func.FuncOp, refusal: HostirError) -> SegmentRun:
    """`eagerly`, warning at the first launch where the segment's kernel would have run."""
    warned = False

    def run(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        nonlocal warned
        if not warned and kernels.launchable((*ins, *outs)):
            warned = True
            warnings.warn(
                f"segment @{callee.sym_name.data} runs as torch eager ops, one kernel per op, "
                f"because no fused kernel can compute it: {refusal}",
                kernels.KernelFallbackWarning,
                stacklevel=2,
            )
        eagerly(ins, outs)

    return run


Compute = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


def _compute_step(op: hir.ComputeOp, prep: Preparation, compute: Compute) -> Step:
    """The step of a compute op: `compute(ins, outs)` on ranks in the mesh of its first output."""
    if not op.outs:
        raise HostirError.at(op, f"{op.name} has no output to write")
    for out in op.outs:
        prep.check_writable(op, out)
    ins, outs = prep.slots_of(op.ins), prep.slots_of(op.outs)
    mesh = mesh_of(op.outs[0])

    def step(env: Environment, context: RunContext) -> None:
        if context.rank in mesh:
            compute([env[s] for s in ins], [env[s] for s in outs])

    return step


@handles(hir.LaunchKernelOp)
def _launch_kernel(op: hir.LaunchKernelOp, prep: Preparation) -> Step:
    return _compute_step(op, prep, segment_runner(op.callee_function()))


@handles(hir.PostOnStreamOp)
def _post_on_stream(op: hir.PostOnStreamOp, prep: Preparation) -> Step:
    """A segment that only moves data (broadcasts, sets): its results are views of its
    inputs, which its `adopted` outs become (`_adopting_step`). The weight that a matmul
    reads through a broadcast stays the weight, where a copy would move every byte of it
    every step."""
    evaluate = fusion_eval.compile_function(op.callee_function())
    return _adopting_step(op, prep, evaluate, [False] * len(op.ins))


def matmul_into(lhs: torch.Tensor, rhs: torch.Tensor, out: torch.Tensor) -> None:
    """`torch.matmul(lhs, rhs)` written into `out`, whatever its strides, without resizing it.

    torch's `out=` resizes in two cases, which prints a UserWarning and leaves a view's
    data in a new storage (torch 2.13 raises for the second instead): a vector-matrix
    product, computed as a [1, N] product; and a batched matrix times a matrix or a
    vector, computed by folding the batch into the rows of `out` viewed as one matrix,
    which a strided view (a slice of an inner axis) cannot be. There the vector becomes
    a [1, K] matrix, and `rhs` is expanded over the batch so that torch runs a batched
    product into `out` as it is.
    """
    if lhs.dim() == 1 and rhs.dim() > 1:
        lhs, out = lhs.unsqueeze(0), out.unsqueeze(-2)
    if lhs.dim() > 2 and rhs.dim() <= 2 and not out.is_contiguous():
        if rhs.dim() == 1:
            rhs, out = rhs.unsqueeze(-1), out.unsqueeze(-1)
        rhs = rhs.expand(*lhs.shape[:-2], *rhs.shape)
    torch.matmul(lhs, rhs, out=out)


def matmul_accumulate_into(lhs: torch.Tensor, rhs: torch.Tensor, out: torch.Tensor) -> None:
    """`out += torch.matmul(lhs, rhs)`, in the GEMM's epilogue (beta = 1: no pass of its own
    over `out`) where the product is one matrix product (`addmm_`: a batch of matrices times
    one matrix, its rows folded into one) or one batch of them (`baddbmm_`, a matrix of
    either side broadcast along the batch), one per slice of the outermost of several batch
    axes; a vector's product is added after it."""
    if min(lhs.dim(), rhs.dim(), out.dim()) >= 2:
        batch = out.shape[:-2]
        if lhs.shape[:-2] == batch and math.prod(rhs.shape[:-2]) == 1:
            rows, out_rows = _as_rows(lhs), _as_rows(out)
            if rows is not None and out_rows is not None:
                out_rows.addmm_(rows, rhs.reshape(rhs.shape[-2:]))
                return
        if torch.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2]) == batch:
            lhs, rhs = lhs.expand(*batch, *lhs.shape[-2:]), rhs.expand(*batch, *rhs.shape[-2:])
            if len(batch) == 1:
                out.baddbmm_(lhs, rhs)
            else:  # a GEMM per slice of the outermost axis, where the batch axes do not merge
                for index in range(batch[0]):
                    matmul_accumulate_into(lhs[index], rhs[index], out[index])
            return
    out.add_(torch.matmul(lhs, rhs))


def _as_rows(tensor: torch.Tensor) -> torch.Tensor | None:
    """`tensor [*b, rows, columns]` viewed as one matrix `[b rows, columns]`; None where its
    strides do not allow a view (each axis but the last must step over the next whole)."""
    shape, strides = tensor.shape, tensor.stride()
    if any(shape[i] != 1 and strides[i] != strides[i + 1] * shape[i + 1] for i in range(tensor.dim() - 2)):
        return None
    return tensor.view(-1, shape[-1])


@handles(hir.MatmulOp)
def _matmul(op: hir.MatmulOp, prep: Preparation) -> Step:
    if len(op.ins) == 3:
        product = fusion_eval.matmul_with_bias_into
    else:
        product = matmul_accumulate_into if op.accumulate else matmul_into

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        product(*ins, outs[0])

    return _compute_step(op, prep, compute)


def linear_into(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """`torch.nn.functional.linear(x, w, bias)` written into `out`.

    Where `x` folds into a matrix and `out` is contiguous, this is what `linear` itself
    runs for such inputs (one `addmm`, bias added in the GEMM's epilogue), with `out=`
    so the result lands in place; anywhere else, `linear`'s result is copied in.
    """
    if out.is_contiguous() and (x.dim() <= 2 or x.is_contiguous()):
        rows = x.reshape(-1, x.shape[-1])
        out_rows = out.view(-1, out.shape[-1])
        if bias is None:
            torch.mm(rows, w.t(), out=out_rows)
        else:
            torch.addmm(bias, rows, w.t(), out=out_rows)
        return
    out.copy_(torch.nn.functional.linear(x, w, bias))


@handles(hir.LinearOp)
def _linear(op: hir.LinearOp, prep: Preparation) -> Step:
    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        linear_into(ins[0], ins[1], ins[2] if len(ins) == 3 else None, outs[0])

    return _compute_step(op, prep, compute)


@handles(hir.CopyOp)
def _copy(op: hir.CopyOp, prep: Preparation) -> Step:
    """The copy; or, marked `forwards_source` (`forward-buffers`: the source dies at the
    copy), its out becomes the source buffer itself, with no byte moved."""
    if op.forwards_source is None:
        return _copy_step(op, prep)
    prep.check_writable(op, op.outs[0])
    source, out = prep.slot(op.ins[0]), prep.slot(op.outs[0])
    mesh = mesh_of(op.outs[0])

    def step(env: Environment, context: RunContext) -> None:
        if context.rank in mesh:
            env[out] = env[source]

    return step


def _copy_step(op: hir.CopyOp | hir.PointwiseOp, prep: Preparation) -> Step:
    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        outs[0].copy_(ins[0])

    return _compute_step(op, prep, compute)


POINTWISE_KINDS: dict[str, type[Operation]] = {
    op.name.removeprefix("fusion."): op for op in fusion_eval.POINTWISE_FUNCTIONS
}


@handles(hir.PointwiseOp)
def _pointwise(op: hir.PointwiseOp, prep: Preparation) -> Step:
    """One pointwise op with fusion_eval's precision, rounded once into the output.

    `copy_` rather than torch's `out=`: the f32 result of a bf16 op must be rounded on
    store, which `out=` does not do (and torch.relu has no `out=`). A cast is the copy.
    """
    if op.kind.data == "cast":
        return _copy_step(op, prep)
    function = fusion_eval.POINTWISE_FUNCTIONS[POINTWISE_KINDS[op.kind.data]]

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        outs[0].copy_(function(*map(fusion_eval.upcast, ins)))

    return _compute_step(op, prep, compute)


def local_pieces(values: Sequence) -> list[bool]:
    """Which of the values vary between devices: their device axis (axis 0) is dropped for ATen."""
    return [fusion.tensor_type(value).didx_axis == 0 for value in values]


@handles(hir.AtenOp)
def _aten(op: hir.AtenOp, prep: Preparation) -> Step:
    """The ATen op on the local pieces, its results adopted by the outs `adopted` names
    (`_adopting_step`). A view stays a view (a copy would move every byte of a weight's
    transpose, every step), and a result keeps its strides (flash attention's backward
    reads the forward's output with the layout the forward gave it, and is wrong with
    any other)."""
    call = aten_calls.prepare_call(op.target.data, op.call.data)
    pick = aten_calls.picker(op.target.data, op.returns, len(op.outs))
    return _adopting_step(op, prep, lambda operands, device: pick(call(operands, device)), local_pieces(op.ins))


Results = Callable[[list[torch.Tensor], torch.device], Sequence[torch.Tensor | None]]
"""`results(operands, device)`: an op's results, made from its operands' tensors."""


def _adopting_step(
    op: hir.AtenOp | hir.PostOnStreamOp,
    prep: Preparation,
    results: Results,
    piece_ins: list[bool],
) -> Step:
    """The step of an op whose results are tensors it makes (ATen's, or views of its
    operands). An out that the op's `adopted` names (`forward-buffers` marks the whole
    buffers of the program that the op fills first) becomes the result itself; any other
    out gets the result copied in. The host-program contract lets only the op that fills
    a buffer write it, so a result that aliases an operand is never written through. The
    program's allocation of an adopted out holds no memory (`hir.AllocateOp.is_adopted`).

    A `piece` operand is given without its device axis (ATen sees local pieces), and a
    result of a varying out gets it back (`fill_outs`); a None result is one the op leaves
    undefined, which no op reads.
    """
    adopted = frozenset(hir.adopted_outs(op))
    for out in op.outs:
        prep.check_writable(op, out)
    ins, outs = prep.slots_of(op.ins), prep.slots_of(op.outs)
    mesh = mesh_of(op.outs[0])

    def step(env: Environment, context: RunContext) -> None:
        if context.rank not in mesh:
            return
        operands = [env[s][0] if piece else env[s] for s, piece in zip(ins, piece_ins)]
        fill_outs(env, outs, results(operands, context.device), adopted)

    return step


REDUCTIONS: dict[str, Callable[..., torch.Tensor]] = {"sum": torch.sum, "max": torch.amax}


@handles(hir.ReductionOp)
def _reduction(op: hir.ReductionOp, prep: Preparation) -> Step:
    reduce = REDUCTIONS[op.kind.data]
    rank = fusion.tensor_type(op.ins[0]).rank
    axes = fusion.normalize_axes(op.axes.get_values(), rank, "reduction")
    keepdim = op.keepdim is not None

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        reduce(ins[0], dim=axes, keepdim=keepdim, out=outs[0])

    return _compute_step(op, prep, compute)
