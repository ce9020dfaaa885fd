"""A copy-engine sum reduce-scatter of a matmul's product, rewritten as matmuls per destination.

Where a matmul's product is reduce-scattered over a batch axis of the product (the
destination axis: slice `k` is member `k`'s piece), each device can compute the rows it
sends to one member apart from those of another, slicing the matmul's operands at that
axis: `reduce-scatter-in-matmul` (a team of two) and `reduce-scatter-ring` (larger teams)
both do. `ScatteredProduct.match` says whether a reduce-scatter is such a one, and
`ScatteredProduct.operands_at` makes the matmul's operands for one destination.

    hir.matmul ins(%x, %w) outs(%partial)
    %work = hir.reduce_scatter %partial into %out team [...] op sum backend cuda
    ...
    hir.wait %work

It is one where the collective is a copy-engine sum over the product's mesh; its
scattered axis `k` is a batch axis of the matmul that each operand either lacks, holds
with an extent of one (broadcast), or holds whole (not `didx`) with one slice per member;
the matmul writes the whole product, in a buffer of the program that nothing else reads or
writes through any of its views (`product_of`); and the collective's work has one use, a
wait in the same block, with nothing but views, buffers and index arithmetic between the
matmul and the wait (so the matmul's operands may be read at the wait instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.shard import ReductionKind
from xdsl.ir import Operation, SSAValue

from hostir_dialect import hir
from hostir_dialect.fusion import tensor_type
from hostir.passes.analysis.axis_mapping import operand_axis, operand_axis_maps
from hostir.passes.analysis.buffers import in_function_body, nothing_writes_between, product_of


@dataclass
class ScatteredProduct:
    """A reduce-scatter of a matmul's product that can be computed destination by destination."""

    op: hir.ReduceScatterOp
    matmul: hir.MatmulOp
    wait: hir.WaitOp
    axis: int
    """The scattered axis of the product (a batch axis of the matmul)."""
    operand_axes: list[int | None]
    """Each matmul operand's axis that broadcasts to `axis`, None where it has none."""
    anchor: Operation
    """The op of the function's body that holds the matmul, before which values that every
    iteration of the loops around shares are computed."""
    broadcasts: dict[int, hir.AliasSelectOp] = field(default_factory=dict)
    """The views made at 0 of the operands of extent one along `axis`, by operand index,
    shared by every destination."""

    @staticmethod
    def match(op: hir.ReduceScatterOp) -> ScatteredProduct | None:
        team = op.team_ids
        if (
            op.backend.data != hir.CommunicatorBackend.CUDA
            or op.reduce_op is None
            or op.reduce_op.data != ReductionKind.SUM
            or sorted(tensor_type(op.input).mesh.ids) != sorted(team)
            or (axis := op.scattered_axis()) is None
            or (matmul := product_of(op, op.input)) is None
            or (axes := _operand_axes(matmul, axis, len(team))) is None
            or (anchor := in_function_body(matmul)) is None
        ):
            return None
        waits = [use.operation for use in op.work.uses]
        if len(waits) != 1 or not isinstance(wait := waits[0], hir.WaitOp) or wait.parent is not op.parent:
            return None
        if not nothing_writes_between(matmul, wait, op):
            return None
        return ScatteredProduct(op, matmul, wait, axis, axes, anchor)

    def operands_at(self, position: SSAValue, zero: SSAValue) -> tuple[list[Operation], list[SSAValue]]:
        """The views that destination `position` needs made, and the matmul's operands for it:
        an operand without the scattered axis whole, one of extent one at 0 (its view made
        once, for every destination), else its slice at `position`."""
        views, operands = [], []
        for index, (operand, axis) in enumerate(zip(self.matmul.ins, self.operand_axes)):
            if axis is None:
                operands.append(operand)
                continue
            if tensor_type(operand).get_shape()[axis] == 1:
                view = self.broadcasts.get(index)
                if view is None:
                    view = self.broadcasts[index] = hir.AliasSelectOp(operand, axis, zero)
                    views.append(view)
            else:
                views.append(view := hir.AliasSelectOp(operand, axis, position))
            operands.append(view.result)
        return views, operands


def _operand_axes(matmul: hir.MatmulOp, axis: int, members: int) -> list[int | None] | None:
    """Each operand's axis that broadcasts to batch axis `axis` of the product (None where it
    has none), if `axis` is a batch axis that each operand that has it holds whole (not
    `didx`) with an extent of one (broadcast) or `members` (one slice per member)."""
    lhs, rhs = (tensor_type(operand) for operand in matmul.ins)
    if axis >= max(lhs.rank - 2, rhs.rank - 2, 0):
        return None
    axes = [operand_axis(axis_map, axis) for _, axis_map in operand_axis_maps(matmul)[:2]]
    for operand, sliced in zip((lhs, rhs), axes):
        if sliced is not None and (sliced == operand.didx_axis or operand.get_shape()[sliced] not in (1, members)):
            return None
    return axes
