"""`reduction-in-kernel`: a sum or max over a short axis that is not a buffer's last becomes a
generated kernel that combines the axis's slices point by point.

A ring's reduce-scatter (`reduce-scatter-ring`) ends with the sum of the pieces that the
team's devices computed for this one, stacked in a staging buffer along the team's axis:

    hir.reduction "sum" [1] ins(%staging : [D, T, ?, ?]) outs(%out : [D, ?, ?])

ATen reduces such an outer axis at about 60% of the GPU's bandwidth (66 us for four
pieces of 2048 x 8192 in bf16 on an H200, where a copy of as many bytes takes 43); a
kernel that reads the `T` slices and writes their sum reaches the copy's rate (41 us),
with the same bits there: it converts bf16 and f16 to f32, adds the slices in order, and
rounds once, as `torch.sum` does (whose order of the f32 additions may differ for more
slices, and the rounded sum then by one rounding). So the reduction becomes

    %s_k = hir.alias_select %staging[1 = %ck]          (k = 0 .. T - 1)
    hir.launch_kernel @f_reduction_0 ins(%s_0, ..., %s_(T-1)) outs(%out)

and `@f_reduction_0` a segment of `fusion.cast`, `fusion.add` (`fusion.maximum` for a
max) and `fusion.cast` (`reduction_of_slices`). With `keepdim` the kernel writes slice 0
of the output. It runs after `copy-engine-pipelining` and `per-stream-buffers`, which
find a ring's reduction after its waits as `reduce-scatter-ring` left it.

Rewritten where the reduction has one axis, of a known extent of 2 to `MOST_SLICES` (a
team of one host), over floating-point values (ATen widens a sum of integers), that is
not the input's last (a sum over a row's last axis is a row reduction, which ATen and
the generated kernels compute at bandwidth already) and not a stream axis
(`stream-parallel` slices a loop's buffers along it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import AnyFloat
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from hostir_dialect import fusion, hir
from hostir_dialect.builder import reduction_of_slices
from hostir_dialect.fusion import DYNAMIC, TensorType, tensor_type
from hostir.passes.analysis.loops import index_constant, named

MOST_SLICES = 8
"""The longest axis reduced by a kernel of its slices: the devices of one host."""


def reduced_slices(op: hir.ReductionOp) -> int | None:
    """How many slices a kernel combines to compute `op`, or None where ATen computes it."""
    source = tensor_type(op.ins[0])
    (axis, *others) = fusion.normalize_axes(op.axes.get_values(), source.rank, "reduction")
    extent = source.get_shape()[axis]
    if others or extent == DYNAMIC or not 2 <= extent <= MOST_SLICES:
        return None
    if not isinstance(source.element_type, AnyFloat):
        return None
    if axis == source.rank - 1 or axis == source.stream_axis:
        return None
    return extent


def _enclosing_function(op: Operation) -> func.FuncOp | None:
    """The function of the module that holds `op`, through the loops around it."""
    while (parent := op.parent_op()) is not None and not isinstance(parent, builtin.ModuleOp):
        op = parent
    return op if isinstance(op, func.FuncOp) else None


@dataclass
class ReductionOfSlicesInKernel(RewritePattern):
    """`hir.reduction` over a short axis -> a kernel of the axis's slices (`reduced_slices`).
    Reductions alike (kind, slices' and output's types) share one segment."""

    segments: dict[tuple[str, str, TensorType, TensorType, int], str] = field(default_factory=dict)

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.ReductionOp, rewriter: PatternRewriter, /) -> None:
        count = reduced_slices(op)
        function = _enclosing_function(op)
        if count is None or function is None:
            return
        source = tensor_type(op.ins[0])
        (axis,) = fusion.normalize_axes(op.axes.get_values(), source.rank, "reduction")
        issued: list[Operation] = []
        for k in range(count):
            issued.append(named(hir.AliasSelectOp(op.ins[0], axis, index_constant(rewriter, op, k)), "slice"))
        out = op.outs[0]
        if op.keepdim is not None:
            issued.append(view := named(hir.AliasSelectOp(out, axis, index_constant(rewriter, op, 0)), "reduced"))
            out = view.results[0]
        key = (function.sym_name.data, op.kind.data, source.without_axis(axis), tensor_type(out), count)
        if (name := self.segments.get(key)) is None:
            name = self.segments[key] = hir.segment_name(function, "reduction")
            segment = reduction_of_slices(name, op.kind.data, [key[2]] * count, key[3])
            rewriter.insert(segment, InsertPoint.before(function))
        launch = hir.LaunchKernelOp(name, [view.results[0] for view in issued[:count]], [out])
        for new_op in (*issued, launch):
            new_op.location = op.location
        rewriter.replace(op, [*issued, launch], [])


@dataclass(frozen=True)
class ReductionInKernel(ModulePass):
    """Computes a sum or max over a short axis, not the last, with a kernel of its slices."""

    name = "reduction-in-kernel"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(ReductionOfSlicesInKernel(), apply_recursively=False).rewrite_module(op)
