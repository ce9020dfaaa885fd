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

A fusion input whose `stream` axis no op streams is refused first, as nvFuser's
stream lowering refuses a stream-parallel input (its test
InputsAreNotStreamParallelized): the caller passes an input whole, and what streams is
the loop of an op whose result streams, which reads the input slice by slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
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

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import (
    SERIAL,
    FusionOp,
    TensorType,
    reduction_shape,
    tensor_type,
)
from hostir_dialect.text import HostirError
from hostir.passes.analysis.axis_mapping import operand_axis_maps
from hostir.passes.analysis.operands import describe_operand, describe_value
from hostir.passes.analysis.sharding import (
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
        which = " and ".join(describe_operand(op, index) for index in indices)
        raise HostirError.at(
            op,
            f"{op.name}: {which} must {'' if len(indices) == 1 else 'each '}be resharded from {source.sharding_str()} to "
            f"{target.sharding_str()} (by a fusion.set that insert-reshardings inserts), "
            f"and no communication does that: {error.reason}",
        ) from None


def refuse_inputs_streamed_alone(module: ModuleOp) -> None:
    """Refuses a fusion input whose `stream` axis no op streams, at the op that drops it.

    A fusion is a public function of fusion ops; a host program (it holds hir ops) and
    its segments (private) are left alone. An input's stream axis is kept when each op
    that uses it has its result stream the axis it maps to. `stream-parallel` refuses,
    saying why, an op that reduces or contracts it, and one whose operands' stream axes
    map to different axes of its result. Any other use, or no use at all, would drop it
    in silence.
    """
    for function in module.ops:
        if not isinstance(function, func.FuncOp) or function.is_declaration:
            continue
        if function.sym_visibility is not None and function.sym_visibility.data == "private":
            continue
        if any(inner.dialect_name() == hir.Hir.name for inner in function.walk()):
            continue
        for argument in function.args:
            stream = argument.type.stream_axis if isinstance(argument.type, TensorType) else None
            if stream is not None:
                _refuse_stream_dropped(function, argument, stream)


def _refuse_stream_dropped(function: func.FuncOp, argument: SSAValue, stream: int) -> None:
    name = describe_value(argument)
    why = (
        "a fusion's input cannot be stream-parallel alone (nvFuser's "
        "InputsAreNotStreamParallelized): the caller passes it whole, and what streams is "
        "the loop of an op whose result streams"
    )
    fusion_uses = [use.operation for use in argument.uses if isinstance(use.operation, FusionOp)]
    if not fusion_uses:
        raise HostirError.at(
            function, f"{name} has a stream axis ({argument.type.sharding_str()}) that no op uses; {why}"
        )
    for op in fusion_uses:
        result = tensor_type(op.results[0])
        maps = operand_axis_maps(op)
        targets = {axis_map[stream] for operand, axis_map in maps if operand is argument} - {None}
        others = {
            axis_map[tensor_type(operand).stream_axis]
            for operand, axis_map in maps
            if operand is not argument and tensor_type(operand).stream_axis is not None
        }
        for target in targets:
            if target != result.stream_axis and result.stream_axis not in others:
                raise HostirError.at(
                    op,
                    f"{op.name}: {name} has stream axis {stream} ({argument.type.sharding_str()}), "
                    f"which is axis {target} of the result ({result.sharding_str()}), not its "
                    f"stream axis; {why}",
                )


@dataclass(frozen=True)
class InsertReshardings(ModulePass):
    """Makes every fusion op but sets and `didx` reductions local (nvFuser's InsertReshardings)."""

    name = "insert-reshardings"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        refuse_inputs_streamed_alone(op)
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [SplitShardedReduction(), InsertReshardingSets()], dce_enabled=False
            )
        ).rewrite_module(op)
