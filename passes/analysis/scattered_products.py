"""A copy-engine sum reduce-scatter of matmul products, rewritten as matmuls per destination.

Where the reduce-scatter's input is a matmul's product, or the sum of several (the
gradient of an activation that several projections read, which add kernels sum), and it
is scattered over a batch axis of the products (the destination axis: slice `k` is
member `k`'s piece), each device can compute the rows it sends to one member apart from
those of another, slicing the matmuls' operands at that axis: `reduce-scatter-in-matmul`
(a team of two) and `reduce-scatter-ring` (larger teams) both do. `ScatteredProduct.match`
says whether a copy-engine reduce-scatter is such a one (or why not), and
`ScatteredProduct.matmuls_at` computes one destination's rows.

    hir.matmul ins(%x, %w) outs(%partial)        or   hir.matmul ins(%x1, %w1) outs(%p1)
                                                      hir.matmul ins(%x2, %w2) outs(%p2)
                                                      hir.launch_kernel @add ins(%p1, %p2) outs(%partial)
    %work = hir.reduce_scatter %partial into %out team [...] op sum backend cuda
    ...
    hir.wait %work

It is one where the collective is a sum over the products' mesh; its
scattered axis `k` is a batch axis of every matmul that each of its operands either
lacks, holds with an extent of one (broadcast), or holds whole (not `didx`) with one slice
per member; each product and partial sum is written by its op alone and read by the next
alone, in buffers of the program (`summed_products`); and the collective's work has one
use, a wait in the same block, with nothing between the first matmul and the wait but
these ops, views, buffers and index arithmetic (so the matmuls' operands may be read at
the wait instead). The rows of a destination are then the first matmul's product of its
slices and the others' added into it (`hir.matmul accumulate`): the sum rounded where
each product was added, as torch's `addmm` rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.shard import ReductionKind
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter

from hostir_dialect import hir
from hostir_dialect.fusion import tensor_type
from hostir_dialect.text import remark
from hostir import logs
from hostir.passes.analysis.axis_mapping import operand_axis, operand_axis_maps
from hostir.passes.analysis.buffers import (
    erase_computation,
    in_function_body,
    nothing_writes_between,
    summed_products,
)


@dataclass
class ScatteredProduct:
    """A reduce-scatter of matmul products that can be computed destination by destination."""

    op: hir.ReduceScatterOp
    wait: hir.WaitOp
    axis: int
    """The scattered axis of the products (a batch axis of every matmul)."""
    matmuls: list[hir.MatmulOp]
    """The matmuls whose products add up to the reduce-scatter's input."""
    operand_axes: list[list[int | None]]
    """Per matmul, each operand's axis that broadcasts to `axis`, None where it has none."""
    computation: list[hir.ComputeOp]
    """The ops that compute the reduce-scatter's input: the matmuls and the kernels that add them."""
    last: hir.ComputeOp
    """The last of them in the block, after every operand of the matmuls is defined."""
    anchor: Operation
    """The op of the function's body that holds the matmuls, before which values that every
    iteration of the loops around shares are computed."""
    broadcasts: dict[tuple[int, int], hir.AliasSelectOp] = field(default_factory=dict)
    """The views made at 0 of the operands of extent one along `axis`, by (matmul, operand),
    shared by every destination."""

    @staticmethod
    def for_pass(
        name: str,
        op: hir.ReduceScatterOp,
        explain: bool,
        other_size: str | None = None,
        team_problem: str | None = None,
    ) -> ScatteredProduct | None:
        """`op`'s products, where pass `name` rewrites it: a copy-engine reduce-scatter whose
        team is of the pass's size (no `other_size`, which is another pass's) and suits it (no
        `team_problem`), and that `match` accepts; else None, saying why on stderr where
        `explain` (`remark`). What the pass does with a team of its size, and why it leaves
        one, goes to the `hostir.pipelining` logger, as `auto-stream-parallel`'s decisions."""
        if op.backend.data != hir.CommunicatorBackend.CUDA:
            return None
        product = other_size or team_problem or ScatteredProduct.match(op)
        described = f"{op.name} %{op.work.name_hint or 'work'} over {list(op.team_ids)}"
        if not isinstance(product, str):
            logs.say("pipelining", f"{described}: {name} computes its input destination by destination")
            return product
        if other_size is None:
            logs.say("pipelining", f"{described}: {name} leaves it: {product}")
        if explain:
            remark(op, f"{name} leaves this {op.name}: {product}")
        return None

    @staticmethod
    def match(op: hir.ReduceScatterOp) -> ScatteredProduct | str:
        """The reduce-scatter's products, or why it is not such a one (a copy-engine one)."""
        team, mesh = op.team_ids, tensor_type(op.input).mesh.ids
        if op.reduce_op is None or op.reduce_op.data != ReductionKind.SUM:
            return "its reduction is not a sum"
        if sorted(mesh) != sorted(team):
            return f"its team {list(team)} is not the mesh {list(mesh)} of its input"
        if (axis := op.scattered_axis()) is None:
            return "its input or its output has no didx axis"
        if (summed := summed_products(op, op.input)) is None:
            return (
                "its input is not a matmul's product, nor a sum of such products, that only the "
                "matmul (or the kernel that adds them) writes and only the reduce-scatter reads"
            )
        matmuls, kernels = summed
        operand_axes = [_operand_axes(matmul, axis, len(team)) for matmul in matmuls]
        if any(axes is None for axes in operand_axes):
            return (
                f"its scattered axis {axis} is not a batch axis of the matmul that each operand holds "
                f"whole with an extent of 1 or {len(team)}"
            )
        waits = [use.operation for use in op.work.uses]
        if len(waits) != 1 or not isinstance(wait := waits[0], hir.WaitOp) or wait.parent is not op.parent:
            return "its work is not waited for once, in its block"
        computation = [*matmuls, *kernels]
        in_order = sorted(computation, key=lambda computed: computed.parent_block().get_operation_index(computed))
        first, last = in_order[0], in_order[-1]
        if (anchor := in_function_body(first)) is None:
            return "it is not in a function"
        if not nothing_writes_between(first, wait, {*computation, op}):
            return "an op between the matmul and the wait writes or frees a buffer, which the matmul may read"
        return ScatteredProduct(op, wait, axis, matmuls, operand_axes, computation, last, anchor)

    def matmuls_at(
        self, position: SSAValue, zero: SSAValue, into: SSAValue, accumulate: bool
    ) -> tuple[list[Operation], list[Operation]]:
        """The views and the matmuls that compute the rows of destination `position` into
        `into`: each matmul on its operands' slices at `position` (an operand without the
        scattered axis whole, one of extent one at 0, its view made once for every
        destination), the first one writing `into` unless `accumulate`, the others adding
        into it."""
        views: list[Operation] = []
        matmuls: list[Operation] = []
        for term, (matmul, axes) in enumerate(zip(self.matmuls, self.operand_axes)):
            operands = []
            for index, (operand, axis) in enumerate(zip(matmul.ins, axes)):
                if axis is None:
                    operands.append(operand)
                    continue
                if tensor_type(operand).get_shape()[axis] == 1:
                    view = self.broadcasts.get((term, index))
                    if view is None:
                        view = self.broadcasts[term, index] = hir.AliasSelectOp(operand, axis, zero)
                        views.append(view)
                else:
                    views.append(view := hir.AliasSelectOp(operand, axis, position))
                operands.append(view.result)
            matmuls.append(hir.MatmulOp(operands, [into], accumulate=accumulate or term > 0))
        return views, matmuls

    def erase_computation(self, rewriter: PatternRewriter) -> None:
        """Erases the matmuls and kernels that computed the reduce-scatter's input whole, and
        the products and partial sums that only they used."""
        erase_computation(self.computation, rewriter)


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
