"""The interpreter's handlers of hir's compute ops: segments, matmul, linear, copy, pointwise, reductions.

Compute ops are destination-passing: a step writes into the buffers the program
allocated, on the ranks in the mesh of its first output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from xdsl.dialects import func
from xdsl.ir import Operation
from xdsl.traits import SymbolTable

from hostir_dialect import fusion, hir
from hostir_dialect.text import HostirError
from runtime import fusion_eval
from runtime.interpreter import Environment, Preparation, RunContext, Step, handles, mesh_of

def segment_runner(callee: func.FuncOp) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]:
    """How a segment runs: `run(ins, outs)` evaluates `callee` and writes its results into `outs`.

    The one place a segment is executed, for `hir.launch_kernel` and
    `hir.post_on_stream` alike: a compiled CUDA kernel for launch_kernel plugs in here.
    """
    evaluate = fusion_eval.compile_function(callee)

    def run(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        for out, result in zip(outs, evaluate(ins), strict=True):
            out.copy_(result)

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


@handles(hir.LaunchKernelOp, hir.PostOnStreamOp)
def _segment(op: hir.SegmentCallOp, prep: Preparation) -> Step:
    callee = SymbolTable.lookup_symbol(op, op.callee)
    if not isinstance(callee, func.FuncOp):
        raise HostirError.at(op, f"'{op.callee.string_value()}' is not a function in this module")
    return _compute_step(op, prep, segment_runner(callee))


@handles(hir.MatmulOp)
def _matmul(op: hir.MatmulOp, prep: Preparation) -> Step:
    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        lhs, rhs = ins
        if lhs.dim() == 1 and rhs.dim() > 1:
            # torch computes a vector-matrix product into `out=` by resizing the output to
            # [1, N], which loses the data of a strided view; a [1, K] matrix keeps the view.
            torch.matmul(lhs.unsqueeze(0), rhs, out=outs[0].unsqueeze(-2))
        else:
            torch.matmul(lhs, rhs, out=outs[0])

    return _compute_step(op, prep, compute)


@handles(hir.LinearOp)
def _linear(op: hir.LinearOp, prep: Preparation) -> Step:
    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        outs[0].copy_(torch.nn.functional.linear(*ins))

    return _compute_step(op, prep, compute)


@handles(hir.CopyOp)
def _copy(op: hir.CopyOp, prep: Preparation) -> Step:
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
        return _copy(op, prep)
    function = fusion_eval.POINTWISE_FUNCTIONS[POINTWISE_KINDS[op.kind.data]]

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        outs[0].copy_(function(*map(fusion_eval.upcast, ins)))

    return _compute_step(op, prep, compute)


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
