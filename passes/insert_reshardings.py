"""insert-reshardings: a `fusion.set` in front of every operand an op cannot use where it lives.

nvFuser's pre-segmentation pass InsertReshardings. An op computes locally when each
operand is on the op's mesh with its `didx` axis where the result's is
(`sharding.local_operand_type`); any other operand gets a `fusion.set` into that
layout, and the set is what `fusion-to-hir` turns into communication:

    %out = fusion.linear %in, %w, %b : ([S, DIDx(D), M, K], ...) -> [Stream(S), D, M, N]
becomes
    %g = fusion.set %in : [S, DIDx(D), M, K] -> [Stream(S), D, M, K]     (an allgather)
    %out = fusion.linear %g, %w, %b : ...

The set takes the result's parallel types on the axes that map to it, `stream`
included, so a streamed result streams the gather too (nvFuser's AG+GEMM pipeline).
A reduction over its input's `didx` axis is itself a communication and stays; one
that also reduces other axes is split so that the communication reduces the `didx`
axis alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from hostir_dialect import fusion
from hostir_dialect.fusion import SERIAL, FusionOp, TensorType, reduction_shape, tensor_type
from hostir_dialect.text import HostirError
from passes.sharding import (
    UnsupportedResharding,
    local_operand_type,
    plan_resharding,
    reduces_didx_axis,
    resharded_operands,
)


class SplitShardedReduction(RewritePattern):
    """`sum(x, [d, a])` over the `didx` axis `d` and others: `sum(sum(x, [a]), [d'])`.

    The inner reduction is local and keeps its input's layout; the outer one reduces
    only the `didx` axis, which is one allreduce, reduce_scatter or reduce.
    """

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.ReductionOp, rewriter: PatternRewriter, /) -> None:
        source = tensor_type(op.input)
        others = [axis for axis in op.reduced_axes if axis != source.didx_axis]
        if not reduces_didx_axis(op) or not others:
            return
        kept = [axis for axis in range(source.rank) if op.keeps_dims or axis not in others]
        partial_type = TensorType(
            reduction_shape(source.get_shape(), others, op.keeps_dims),
            source.element_type,
            source.mesh,
            [SERIAL if axis in others else source.axes.data[axis] for axis in kept],
        )
        partial = type(op)(op.input, others, op.keeps_dims, partial_type)
        total = type(op)(
            partial.result, [kept.index(source.didx_axis)], op.keeps_dims, op.result.type
        )
        rewriter.replace(op, [partial, total])


class InsertReshardingSets(RewritePattern):
    """Moves each operand that an op cannot use where it lives with a `fusion.set`.

    Sets and reductions over a `didx` axis are communications themselves and keep
    their operands. One set serves every use of a value in the same layout.

    A set has the location of the op it is inserted for, and so do the hir ops
    `fusion-to-hir` lowers it to. A set that no communication implements is refused
    here, naming the user's op and the operand, rather than later as a `fusion.set`
    the user never wrote.
    """

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        if not isinstance(op, FusionOp) or isinstance(op, fusion.SetOp) or reduces_didx_axis(op):
            return
        resharded = resharded_operands(op)
        if not resharded:
            return
        # One set per (operand, type it is needed in), with the operand indices it serves.
        sets: dict[tuple[SSAValue, TensorType], tuple[fusion.SetOp, list[int]]] = {}
        operands = list(op.operands)
        for index in resharded:
            key = (operands[index], local_operand_type(op, index))
            if key not in sets:
                sets[key] = (fusion.SetOp(*key), [])
                sets[key][0].location = op.location
            inserted, served = sets[key]
            served.append(index)
            operands[index] = inserted.result
        for inserted, served in sets.values():
            check_lowerable(op, served, inserted)
        rewriter.insert([inserted for inserted, _ in sets.values()])
        op.operands = operands
        rewriter.notify_op_modified(op)


def check_lowerable(op: Operation, indices: list[int], inserted: fusion.SetOp) -> None:
    """Refuses, at `op`, the set for its operands `indices` if no communication implements it."""
    try:
        plan_resharding(inserted)
    except UnsupportedResharding as error:
        source, target = tensor_type(inserted.input), tensor_type(inserted.result)
        which = ("operand " if len(indices) == 1 else "operands ") + ", ".join(map(str, indices))
        raise HostirError.at(
            op,
            f"{op.name}: {which} must be resharded from {source.sharding_str()} to "
            f"{target.sharding_str()} (by a fusion.set that insert-reshardings inserts), "
            f"and no communication does that: {error.reason}",
        ) from None


@dataclass(frozen=True)
class InsertReshardings(ModulePass):
    """Makes every fusion op but sets and `didx` reductions local (nvFuser's InsertReshardings)."""

    name = "insert-reshardings"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [SplitShardedReduction(), InsertReshardingSets()], dce_enabled=False
            )
        ).rewrite_module(op)
