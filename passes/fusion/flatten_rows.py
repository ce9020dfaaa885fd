"""flatten-rows: the pointwise work on a batch of sequences computed on its rows, `[tokens,
width]`, where the graph computes part of it as `[batch, sequence, width]`.

torch's linear layers multiply the two-dimensional view of their input, `[batch *
sequence, width]`, and aot_autograd saves their products in that form: in a backward the
SwiGLU activation recomputed from the saved product is `[tokens, hidden]` while the
incoming gradient is `[batch, sequence, hidden]`, and ATen reshapes pass values between the
two. A kernel's iteration space is one shape, and no run passes a reshape (an ATen call), so
the pointwise work of SwiGLU's backward, one kernel for one sequence (where the two forms
differ by an axis of extent 1, which broadcasts), was three kernels for two sequences,
writing and reading float32 intermediates as large as the MLP's hidden activation.

A reshape that keeps the last axis commutes with pointwise ops and with reductions over the
rows' last axis or over all the rows, so each cluster of such ops that the graph links (by
the values they pass each other, directly or through such reshapes) is computed on the
rows: a value of the cluster as `[rows, width]`, a row's values (a norm's scale) as
`[rows, 1]`, a value broadcast over the rows as `[1, width]`, a value of rank 0 or 1 as it
is (a device's piece, where the value is varying: its device axis stays first):

    %r = fusion.aten "aten.reshape.default"(%mm, [2, 32, 224]) : (!t64x224) -> !t2x32x224
    %p = fusion.mul %g, %r : (!t2x32x224, !t2x32x224) -> !t2x32x224
becomes
    %g2 = fusion.aten "aten.reshape.default"(%g, [64, 224]) : (!t2x32x224) -> !t64x224
    %p2 = fusion.mul %g2, %mm : (!t64x224, !t64x224) -> !t64x224
    %p = fusion.aten "aten.reshape.default"(%p2, [2, 32, 224]) : (!t64x224) -> !t2x32x224

and a reshape of a reshape is one reshape (none where it gives the value back), so that
within a cluster no reshape is left, and at its edges a reshape of a GEMM's product or of
an input reads it as it is (a view). A cluster is left as it is where one of its values
has rows of another number (a value broadcast over one of the leading axes but not all:
the rotation tables of rotary embeddings), a stream axis, a device axis other than the
first, or dynamic extents, where it holds a broadcast, which puts axes of its own, or
where none of its ops reads a reshape of a value on rows (it is in one form already). An
add of a GEMM's product is left as well: `sum-in-matmul` makes it in the GEMM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, i64
from xdsl.ir import Operation, OpResult, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from hostir_dialect import fusion
from hostir_dialect.aten_call import encode_call
from hostir_dialect.fusion import DYNAMIC, ParallelType, TensorType, tensor_type
from hostir.passes.analysis.components import read_components

RESHAPES = frozenset({"aten.reshape.default", "aten.view.default", "aten._unsafe_view.default"})
"""ATen calls whose result is their operand's values in another shape, row-major."""

ROW_WISE = (*fusion.UNARY_OPS, *fusion.BINARY_OPS, fusion.CastOp, fusion.RotateHalfOp, fusion.ExpandOp)
"""Pointwise ops of their operands' rank: each element of the result from the elements of
the operands at its place, or along its row (a rotation), or an extent-1 axis stretched."""


def reshape_source(value: SSAValue) -> SSAValue | None:
    """The value that `value` is a reshape of (`RESHAPES`); None where it is none."""
    op = value.owner
    if isinstance(op, fusion.AtenOp) and op.target.data in RESHAPES and len(op.inputs) == 1 and len(op.outputs) == 1:
        return op.inputs[0]
    return None


def reshape_root(value: SSAValue) -> SSAValue:
    """The value that `value` is reshapes of, through every reshape; `value` where it is none."""
    while (source := reshape_source(value)) is not None:
        value = source
    return value


def reshape(value: SSAValue, result_type: TensorType) -> fusion.AtenOp:
    """An ATen reshape of `value` into `result_type` (the local piece's shape: a varying
    value's device axis is not passed to the call)."""
    shape = list(result_type.piece_shape)
    call = encode_call([value, shape], {}, lambda v: 0 if v is value else None)
    return fusion.AtenOp("aten.reshape.default", call, [value], [result_type])


def _device_axes(value_type: TensorType) -> int:
    """1 where the type's first axis is its device axis, else 0."""
    return int(value_type.didx_axis == 0)


def _piece(value_type: TensorType) -> tuple[int, ...] | None:
    """The shape of a device's piece where a cluster may hold the type: no stream axis, no
    device axis but the first, no dynamic extent; else None."""
    types = value_type.parallel_types()
    if ParallelType.STREAM in types or value_type.axes_of(ParallelType.DIDX) not in ((), (0,)):
        return None
    piece = value_type.piece_shape
    return None if DYNAMIC in piece else piece


def rows_type(value_type: TensorType) -> TensorType:
    """The type computed on rows (see the module's docstring): the piece's leading axes as one."""
    piece = value_type.piece_shape
    if len(piece) <= 2:
        return value_type
    flat = (math.prod(piece[:-1]), piece[-1])
    device = value_type.get_shape()[: _device_axes(value_type)]
    axes = [ParallelType.DIDX] * len(device) + [ParallelType.SERIAL] * 2
    return TensorType((*device, *flat), value_type.element_type, value_type.mesh, axes)


def _reduces_rows(op: fusion.ReductionOp) -> bool:
    """A reduction over the piece's last axis, kept, or over every axis of the piece but the last."""
    value_type = tensor_type(op.input)
    rank, first = value_type.rank, _device_axes(value_type)
    reduced = op.reduced_axes
    return (reduced == (rank - 1,) and op.keeps_dims) or (rank - first >= 2 and reduced == tuple(range(first, rank - 1)))


def _is_member(op: Operation) -> bool:
    """An op that a cluster may hold: a pointwise op of its operands' rank (`ROW_WISE`) but an
    add of a GEMM's product, or a reduction of rows (`_reduces_rows`)."""
    if isinstance(op, fusion.AddOp) and op.gemms_added():
        return False
    if isinstance(op, fusion.ReductionOp):
        return _reduces_rows(op)
    return isinstance(op, ROW_WISE)


def _linked(value: SSAValue) -> Operation | None:
    """The op that computes `value`, through reshapes that keep the last axis."""
    while (source := reshape_source(value)) is not None:
        if tensor_type(source).get_shape()[-1:] != tensor_type(value).get_shape()[-1:]:
            return None
        value = source
    return value.owner if isinstance(value, OpResult) else None


def flattened_ops(function: func.FuncOp) -> set[Operation]:
    """The ops of `function` to compute on rows: those of every cluster that may be (see the
    module's docstring) and is computed on both forms."""
    candidates = (op for op in function.body.walk() if _is_member(op) or isinstance(op, fusion.BroadcastOp))
    return {op for ops in read_components(candidates, _linked) if _flattens(ops) for op in ops}


def _flattens(ops: Sequence[Operation]) -> bool:
    """Whether a cluster is computed on rows: every value has as many rows as the others (or one
    row, or is of rank 1 or less), none puts axes of its own (a broadcast), some value has
    more than two axes, and some op reads a reshape of a value on rows (else the cluster is
    in one form already)."""
    if any(not _is_member(op) for op in ops):
        return False
    pieces = []
    for op in ops:
        for value in (*op.operands, *op.results):
            if (piece := _piece(tensor_type(value))) is None:
                return False
            pieces.append(piece)
    rows = {math.prod(piece[:-1]) for piece in pieces if len(piece) >= 2}
    return len(rows - {1}) <= 1 and any(len(piece) > 2 for piece in pieces) and any(map(_reads_rows, ops))


def _reads_rows(op: Operation) -> bool:
    """Whether `op` reads a reshape of a value on rows (of two axes)."""
    return any(
        reshape_source(operand) is not None and len(_piece(tensor_type(reshape_root(operand))) or ()) == 2
        for operand in op.operands
    )


@dataclass
class ComputeOnRows(RewritePattern):
    """An op of `ops` -> the op on its operands' rows (`rows_type`), its result reshaped back.

    An operand's rows are the value its reshapes reshape, where that is of the rows' type; else
    one reshape of that value, made right after it and shared by the ops that read it, so
    that a kernel that reads it waits for nothing more than for the value."""

    ops: set[Operation]
    on_rows: dict[tuple[SSAValue, TensorType], SSAValue] = field(default_factory=dict)
    """The reshapes made, by the value they reshape and their type."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        if op not in self.ops:
            return
        self.ops.discard(op)
        operands = [self._rows_of(operand, rewriter) for operand in op.operands]
        result_type = tensor_type(op.results[0])
        properties = dict(op.properties)
        if isinstance(op, fusion.ReductionOp):
            input_type = tensor_type(op.input)
            rank, first = len(rows_type(input_type).get_shape()), _device_axes(input_type)
            rows_axes = [rank - 1] if op.reduced_axes == (input_type.rank - 1,) else [first]
            properties["axes"] = DenseArrayBase.from_list(i64, rows_axes)
        on_rows = type(op).create(
            operands=operands,
            result_types=[rows_type(result_type)],
            properties=properties,
            attributes=dict(op.attributes),
        )
        on_rows.results[0].name_hint = op.results[0].name_hint
        new_ops: list[Operation] = [on_rows]
        if tensor_type(on_rows.results[0]) != result_type:
            new_ops.append(reshape(on_rows.results[0], result_type))
        for new_op in new_ops:
            new_op.location = op.location
        rewriter.replace(op, new_ops, [new_ops[-1].results[0]])

    def _rows_of(self, operand: SSAValue, rewriter: PatternRewriter) -> SSAValue:
        """`operand` on rows: itself, the value it is a reshape of, or a reshape of that value."""
        wanted = rows_type(tensor_type(operand))
        value = reshape_root(operand)
        if value.type == wanted:
            return value
        if operand.type == wanted:
            return operand
        key = (value, wanted)
        if key not in self.on_rows:
            made = reshape(value, wanted)
            if isinstance(value, OpResult):
                made.location = value.op.location
                where = InsertPoint.after(value.op)
            else:
                where = InsertPoint.at_start(value.block)
            rewriter.insert(made, where)
            self.on_rows[key] = made.results[0]
        return self.on_rows[key]


class ReshapeOfReshape(RewritePattern):
    """A reshape of a reshape -> one reshape of the first one's operand, or that operand where
    it is of the result's type; the first reshape goes where nothing else reads it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.AtenOp, rewriter: PatternRewriter, /) -> None:
        inner = reshape_source(op.outputs[0]) if len(op.outputs) == 1 else None
        source = reshape_source(inner) if inner is not None else None
        if source is None:
            return
        result_type = op.outputs[0].type
        if source.type == result_type:
            rewriter.replace(op, [], [source])
        else:
            one = reshape(source, result_type)
            one.location = op.location
            rewriter.replace(op, [one], [one.results[0]])
        if not inner.uses:
            rewriter.erase(inner.owner)


@dataclass(frozen=True)
class FlattenRows(ModulePass):
    """Computes on rows, `[tokens, width]`, the pointwise work and row reductions that a graph
    computes partly per sequence, `[batch, sequence, width]`, so that one kernel holds them."""

    name = "flatten-rows"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        ops = {o for function in op.walk() if isinstance(function, func.FuncOp) for o in flattened_ops(function)}
        PatternRewriteWalker(
            GreedyRewritePatternApplier([ComputeOnRows(ops), ReshapeOfReshape()]), apply_recursively=True
        ).rewrite_module(op)
