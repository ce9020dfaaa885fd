"""Which axis of an op's output each axis of its operands corresponds to.

Stream parallelisation walks one axis of an op's output in a loop, and must slice
every operand along the axis that feeds that output axis. The correspondence is
the op's semantics (torch's, for shapes): elementwise ops and most collectives
keep positions, broadcasting aligns axes on the right, reductions and matmul
drop the axes they reduce or contract. An `AxisMap` says it for one operand:

    hir.matmul ins(%a : [B, M, K], %b : [K, N]) outs(%c : [B, M, N])
    %a: (0, 1, None)    %b: (None, 2)    %c: (0, 1, 2)

Fused segments (`hir.launch_kernel` / `hir.post_on_stream`) relate their operands
through the fusion ops of their body: `AxisClasses` joins the axes that each op
relates, and two axes correspond when they end in one class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import TensorType, tensor_type
from hostir_dialect.text import HostirError
from hostir.passes.analysis.operands import describe_typed_operand

AxisMap = tuple[int | None, ...]
"""For each axis of an operand, the output axis it corresponds to; None where the op reduces it."""


def right_aligned(operand_rank: int, output_rank: int) -> AxisMap:
    """torch broadcasting: the operand's axes are the output's last ones (same position if equal ranks)."""
    offset = output_rank - operand_rank
    return tuple(offset + axis for axis in range(operand_rank))


def reduction(input_rank: int, reduced: Sequence[int], keepdim: bool) -> AxisMap:
    """A reduction over `reduced`, which keeps them as extent-1 axes when `keepdim`."""
    axes: list[int | None] = []
    kept = 0
    for axis in range(input_rank):
        if axis in reduced:
            axes.append(None)
            kept += keepdim
        else:
            axes.append(kept)
            kept += 1
    return tuple(axes)


def matmul(lhs_rank: int, rhs_rank: int) -> tuple[AxisMap, AxisMap]:
    """torch.matmul: batch axes broadcast on the right, then M of lhs and N of rhs; K is contracted.

    A rank-1 lhs has no M and a rank-1 rhs no N (torch drops them from the output).
    """
    lhs_batch, rhs_batch = max(lhs_rank - 2, 0), max(rhs_rank - 2, 0)
    batch = max(lhs_batch, rhs_batch)
    lhs = [*right_aligned(lhs_batch, batch)]
    rhs = [*right_aligned(rhs_batch, batch)]
    if lhs_rank >= 2:
        lhs.append(batch)
    lhs.append(None)
    rhs.append(None)
    if rhs_rank >= 2:
        rhs.append(batch + (lhs_rank >= 2))
    return tuple(lhs), tuple(rhs)


def matmul_slice_problem(lhs_rank: int, rhs_rank: int, output_axis: int) -> str | None:
    """Why torch.matmul of the slices along `output_axis` is not that slice of the product.

    Slicing drops an axis, and torch.matmul reads the last two axes of each operand
    as its matrix: without M, the last batch axis of the lhs becomes its M, which only
    works while the rhs has no batch axes; without N, the rhs's K becomes its N
    unless the rhs was a plain matrix (its slice is then a vector).
    """
    lhs_map, rhs_map = matmul(lhs_rank, rhs_rank)
    if lhs_rank > 2 and rhs_rank > 2 and output_axis == lhs_map[-2]:
        return "its M axis, while both operands have batch axes"
    if rhs_rank > 2 and output_axis == rhs_map[-1]:
        return "its N axis, while the rhs has batch axes"
    return None


def linear(input_rank: int, weight_rank: int, bias_rank: int | None) -> list[AxisMap]:
    """`input @ weight^T + bias`: the input's batch axes, then N from weight axis 0 and the bias.

    The last axis of the input and of the weight (K) is contracted.
    """
    output_rank = input_rank - 1 + (weight_rank == 2)
    maps = [
        (*range(input_rank - 1), None),
        (input_rank - 1, None) if weight_rank == 2 else (None,),
    ]
    if bias_rank is not None:
        maps.append(right_aligned(bias_rank, output_rank))
    return maps


def without_axis(axes: Sequence[int], removed: int) -> list[int]:
    """Axis numbers once `removed` is gone (and `removed` itself dropped)."""
    return [axis - (axis > removed) for axis in axes if axis != removed]


def broadcast(input_rank: int, new_axes: Sequence[int]) -> AxisMap:
    """`fusion.broadcast`: the input's axes fill the output's positions that are not new."""
    output_rank = input_rank + len(new_axes)
    return tuple(axis for axis in range(output_rank) if axis not in new_axes)


# --------------------------------------------------------------------------- #
# Per-op maps                                                                  #
# --------------------------------------------------------------------------- #


def _rank(value: SSAValue) -> int:
    return tensor_type(value).rank


def _elementwise(op: Operation) -> list[AxisMap]:
    rank = _rank(output_of(op))
    return [right_aligned(_rank(operand), rank) for operand in op.operands]


def _reduced_input(input: SSAValue, output: SSAValue, reduced: Sequence[int]) -> AxisMap:
    return reduction(_rank(input), reduced, keepdim=_rank(input) == _rank(output))


def _fusion_reduction(op: fusion.ReductionOp) -> list[AxisMap]:
    return [reduction(_rank(op.input), op.reduced_axes, op.keeps_dims)]


def _fusion_broadcast(op: fusion.BroadcastOp) -> list[AxisMap]:
    return [
        broadcast(
            _rank(op.input),
            fusion.normalize_axes(op.new_axes.get_values(), _rank(op.result), "broadcast"),
        )
    ]


def _with_bias(maps: tuple[AxisMap, AxisMap], bias: SSAValue | None, output: SSAValue) -> list[AxisMap]:
    """A matmul's maps, and its bias's where it has one: it broadcasts to the product."""
    return [*maps] if bias is None else [*maps, right_aligned(_rank(bias), _rank(output))]


def _fusion_matmul(op: fusion.MatmulOp) -> list[AxisMap]:
    return _with_bias(matmul(_rank(op.lhs), _rank(op.rhs)), op.bias, op.result)


def _fusion_linear(op: fusion.LinearOp) -> list[AxisMap]:
    bias = _rank(op.bias) if op.bias is not None else None
    return linear(_rank(op.input), _rank(op.weight), bias)


def _with_outs(maps: list[AxisMap], op: hir.ComputeOp) -> list[AxisMap]:
    """Appends the maps of the outs: the first is the output itself, the others align on the right."""
    rank = _rank(op.outs[0])
    return [*maps, *(right_aligned(_rank(out), rank) for out in op.outs)]


def _hir_reduction(op: hir.ReductionOp) -> list[AxisMap]:
    reduced = fusion.normalize_axes(op.axes.get_values(), _rank(op.ins[0]), "reduction")
    return _with_outs([reduction(_rank(op.ins[0]), reduced, op.keepdim is not None)], op)


def _hir_matmul(op: hir.MatmulOp) -> list[AxisMap]:
    bias = op.ins[2] if len(op.ins) == 3 else None
    return _with_outs(_with_bias(matmul(_rank(op.ins[0]), _rank(op.ins[1])), bias, op.outs[0]), op)


def _hir_linear(op: hir.LinearOp) -> list[AxisMap]:
    bias = _rank(op.ins[2]) if len(op.ins) == 3 else None
    return _with_outs(linear(_rank(op.ins[0]), _rank(op.ins[1]), bias), op)


def _reducing_collective(op: hir.CommunicationOp) -> list[AxisMap]:
    """allreduce, reduce, reduce_scatter: the input's `didx` axis is the reduced one."""
    didx = tensor_type(op.input).didx_axis
    reduced = () if didx is None else (didx,)
    return [
        _reduced_input(op.input, op.output, reduced),
        right_aligned(_rank(op.output), _rank(op.output)),
    ]


def _segment(op: hir.SegmentCallOp) -> list[AxisMap]:
    callee = op.callee_function()
    classes = AxisClasses.of_function(callee)
    output = func_results(callee)[0]
    class_to_axis = {classes.find(output, axis): axis for axis in range(_rank(output))}
    if len(class_to_axis) < _rank(output):
        raise HostirError.at(
            op,
            f"segment @{callee.sym_name.data} relates two axes of its output "
            f"{tensor_type(output)} to each other, so a slice of one is not a slice of the other",
        )
    values = [*callee.body.block.args, *func_results(callee)]
    return [
        tuple(class_to_axis.get(classes.find(value, axis)) for axis in range(_rank(value)))
        for value in values
    ]


def _aten(op: fusion.AtenOp | hir.AtenOp) -> list[AxisMap]:
    """An ATen op relates only the device axis of its varying tensors: it may reshape,
    transpose or reduce all the others, so no slice of a result is a slice of an operand."""
    output_varies = tensor_type(output_of(op)).didx_axis == 0
    return [
        tuple(
            0 if axis == 0 and output_varies and tensor_type(value).didx_axis == 0 else None
            for axis in range(_rank(value))
        )
        for value in op.operands
    ]


def _keys_map(keys: SSAValue, blocks: bool, batch_rank: int) -> list[int | None]:
    """The keys' (or values') batch axes onto the output's batch, right-aligned; the block
    axis, the rows and the row's extent onto none."""
    type = tensor_type(keys)
    block_axis = fusion.key_block_axis(type) if blocks else None
    batch_axes = [axis for axis in range(type.rank - 2) if axis != block_axis]
    aligned = dict(zip(batch_axes, right_aligned(len(batch_axes), batch_rank)))
    return [aligned.get(axis) for axis in range(type.rank)]


def _attention_maps(
    query: SSAValue, key: SSAValue, value: SSAValue, mask: SSAValue | None, output: SSAValue, blocks: bool
) -> list[AxisMap]:
    """An attention's operands onto an output `[*batch, Lq, Ev]`: the queries' batch and rows
    through, their width contracted; the keys' batch through (the block axis, the rows and
    their width reduced); the values' too, their width the output's last axis; a mask's batch
    and query rows through, its key rows reduced."""
    rank = _rank(output)
    batch = rank - 2
    q = (*right_aligned(_rank(query) - 2, batch), batch, None)
    v = _keys_map(value, blocks, batch)
    v[-1] = rank - 1
    maps = [q, tuple(_keys_map(key, blocks, batch)), tuple(v)]
    if mask is not None:
        maps.append((*right_aligned(_rank(mask) - 2, batch), batch, None))
    return maps


def _fusion_attention(op: fusion.AttentionOp) -> list[AxisMap]:
    return _attention_maps(op.query, op.key, op.value, op.mask, op.out, op.blocks is not None)


def _fusion_attention_backward(op: fusion.AttentionBackwardOp) -> list[AxisMap]:
    """Onto the queries' gradient: the output, its gradient and the log-sum-exp relate through
    the queries' batch and rows; the queries are it."""
    operands = (op.grad_output, op.query, op.key, op.value, op.output, op.lse)
    return _attention_backward_maps(*operands, op.mask, op.grad_query, op.blocks is not None)


def _attention_backward_maps(
    grad_output: SSAValue,
    query: SSAValue,
    key: SSAValue,
    value: SSAValue,
    output: SSAValue,
    lse: SSAValue,
    mask: SSAValue | None,
    grad_query: SSAValue,
    blocks: bool,
) -> list[AxisMap]:
    rank = _rank(grad_query)
    batch = rank - 2
    rows = (*right_aligned(_rank(grad_output) - 2, batch), batch, None)
    maps: list[AxisMap] = [
        rows,
        right_aligned(_rank(query), rank),
        tuple(_keys_map(key, blocks, batch)),
        tuple(_keys_map(value, blocks, batch)),
        rows,
        right_aligned(_rank(lse), rank - 1),
    ]
    if mask is not None:
        maps.append((*right_aligned(_rank(mask) - 2, batch), batch, None))
    return maps


def _hir_attention(op: hir.AttentionOp) -> list[AxisMap]:
    """`fusion.attention`'s maps, then the outs: the output itself, the log-sum-exp its batch
    and rows."""
    q, k, v = op.ins[:3]
    maps = _attention_maps(q, k, v, op.mask, op.outs[0], op.blocks is not None)
    return [*maps, right_aligned(_rank(op.outs[0]), _rank(op.outs[0])), tuple(range(_rank(op.outs[1])))]


def _hir_attention_backward(op: hir.AttentionBackwardOp) -> list[AxisMap]:
    """`fusion.attention_backward`'s maps, then the outs: the queries' gradient itself, the
    keys' and values' gradients their batch axes."""
    blocks = op.blocks is not None
    grad_query, grad_key, grad_value = op.outs
    maps = _attention_backward_maps(*op.ins[:6], op.mask, grad_query, blocks)
    batch = _rank(grad_query) - 2
    return [
        *maps,
        right_aligned(_rank(grad_query), _rank(grad_query)),
        tuple(_keys_map(grad_key, blocks, batch)),
        tuple(_keys_map(grad_value, blocks, batch)),
    ]


_MAPS: dict[type[Operation], Callable[[Operation], list[AxisMap]]] = {
    fusion.SetOp: _elementwise,
    fusion.CastOp: _elementwise,
    fusion.ConstantOp: _elementwise,
    fusion.ExpandOp: _elementwise,
    fusion.RotateHalfOp: _elementwise,
    **{op: _elementwise for op in (*fusion.UNARY_OPS, *fusion.BINARY_OPS)},
    **{op: _fusion_reduction for op in fusion.REDUCTION_OPS},
    fusion.BroadcastOp: _fusion_broadcast,
    fusion.MatmulOp: _fusion_matmul,
    fusion.LinearOp: _fusion_linear,
    fusion.AtenOp: _aten,
    fusion.AttentionOp: _fusion_attention,
    fusion.AttentionBackwardOp: _fusion_attention_backward,
    hir.AtenOp: _aten,
    hir.AttentionOp: _hir_attention,
    hir.AttentionBackwardOp: _hir_attention_backward,
    hir.CopyOp: _elementwise,
    hir.PointwiseOp: _elementwise,
    hir.ReductionOp: _hir_reduction,
    hir.MatmulOp: _hir_matmul,
    hir.LinearOp: _hir_linear,
    hir.LaunchKernelOp: _segment,
    hir.PostOnStreamOp: _segment,
    **{
        op: _elementwise
        for op in (hir.AllgatherOp, hir.GatherOp, hir.ScatterOp, hir.BroadcastOp, hir.SendRecvOp)
    },
    **{op: _reducing_collective for op in (hir.AllreduceOp, hir.ReduceOp, hir.ReduceScatterOp)},
}


def has_axis_maps(op: Operation) -> bool:
    return type(op) in _MAPS


def output_of(op: Operation) -> SSAValue:
    """The tensor the maps refer to: a fusion op's result, a collective's output, a compute op's first out."""
    if isinstance(op, hir.CommunicationOp):
        return op.output
    if isinstance(op, hir.ComputeOp):
        return op.outs[0]
    return op.results[0]


def operand_axis_maps(op: Operation) -> list[tuple[SSAValue, AxisMap]]:
    """Every tensor operand of `op` (outs included) with its map onto `output_of(op)`."""
    maps = _MAPS[type(op)](op)
    output_rank = _rank(output_of(op))
    tensors = [(i, operand) for i, operand in enumerate(op.operands) if isinstance(operand.type, TensorType)]
    for (index, operand), axis_map in zip(tensors, maps, strict=True):
        if len(axis_map) != _rank(operand) or any(
            axis is not None and not 0 <= axis < output_rank for axis in axis_map
        ):
            raise HostirError.at(
                op,
                f"{op.name}: cannot relate the axes of {describe_typed_operand(op, index)} "
                f"to the output {tensor_type(output_of(op))}",
            )
    return [(operand, axis_map) for (_, operand), axis_map in zip(tensors, maps)]


def operand_axis(axis_map: AxisMap, output_axis: int) -> int | None:
    """The operand axis that corresponds to `output_axis`, or None if the operand has none."""
    return axis_map.index(output_axis) if output_axis in axis_map else None


# --------------------------------------------------------------------------- #
# Segments                                                                     #
# --------------------------------------------------------------------------- #


def func_results(function: func.FuncOp) -> Sequence[SSAValue]:
    terminator = function.body.block.last_op
    assert isinstance(terminator, func.ReturnOp)
    return terminator.arguments


class AxisClasses:
    """The axes of a function's values that its ops relate, as classes of (value, axis) pairs.

    A union-find: every op joins each operand axis with the result axis its map names.
    """

    def __init__(self) -> None:
        self._parent: dict[tuple[SSAValue, int], tuple[SSAValue, int]] = {}

    @classmethod
    def of_function(cls, function: func.FuncOp) -> AxisClasses:
        classes = cls()
        for op in function.body.block.ops:
            if not has_axis_maps(op):
                continue
            for operand, axis_map in operand_axis_maps(op):
                for axis, output_axis in enumerate(axis_map):
                    if output_axis is not None:
                        classes.union((operand, axis), (output_of(op), output_axis))
        return classes

    def find(self, value: SSAValue, axis: int) -> tuple[SSAValue, int]:
        key = (value, axis)
        while key in self._parent:
            key = self._parent[key]
        return key

    def union(self, a: tuple[SSAValue, int], b: tuple[SSAValue, int]) -> None:
        root_a, root_b = self.find(*a), self.find(*b)
        if root_a != root_b:
            self._parent[root_a] = root_b

    def axes_in_class(self, value: SSAValue, root: tuple[SSAValue, int]) -> list[int]:
        return [axis for axis in range(_rank(value)) if self.find(value, axis) == root]
