"""`reduce-scatter-in-matmul`: a copy-engine reduce-scatter of a matmul's product over a team
of two becomes one transfer and a matmul that adds into the output, so that no reduction
pass runs on the SMs (docs/copy-engine.md, *The reduction in the GEMM*).

The copy-engine reduce-scatter pulls the peer's piece of the product into a staging buffer
and, at its wait, sums the two pieces in a pass of its own between two GEMMs; the last
chunk's pull and sum follow the last GEMM. Where the product comes from a matmul over the
scattered axis, each device can instead compute the peer's rows first, let the peer pull
them straight into its output, and then add its own rows' product into that output in the
GEMM's epilogue (cuBLAS's beta = 1):

    hir.matmul ins(%x, %w) outs(%partial)
    %work = hir.reduce_scatter %partial into %out team [a, b] op sum backend cuda
    ...
    hir.wait %work

becomes, with `own` this device's position in the team, `peer` the other's, `k` the
scattered axis of `%partial` (a batch axis of the matmul) and `%x`, `%w` sliced at `k`
where they have it (a broadcast extent of one at 0),

    %to_peer = hir.alias_select %partial[k = 0]
    hir.matmul ins(%x[k = peer], %w[k = peer]) outs(%to_peer)
    hir.start_coalescing
    %sent = hir.send %to_peer to %peer_device backend cuda
    %received = hir.recv %out from %peer_device backend cuda
    %work = hir.end_coalescing
    ...
    hir.wait %work
    hir.matmul accumulate ins(%x[k = own], %w[k = own]) outs(%out)

The copy engines' recv reads, on the peer, the buffer that this device sends in the batch,
at the same place in its symmetric allocation: both devices write the product for their
peer into slice 0 of the scattered axis, which is therefore the one they read. Slice 1 is
left unused: the buffer keeps its type, so that its other views stay as they are.

`copy-engine-pipelining` then software-pipelines a stream loop of such bodies as it does
the reduce-scatter's: the transfer of chunk `i` is in flight while the matmul of chunk
`i + 1`'s peer rows runs, and the own rows' matmul of chunk `i` follows. Rewritten only
where the matmul writes the whole product, in a buffer of the program that nothing else
reads or writes through any of its views; the wait is the reduce-scatter's only use, in
the same block; the reduction is a sum; and the team is the mesh of the product (every
device that runs the matmul has a peer). A team of more than two keeps its
reduce-scatter (a ring of such matmuls would serve it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import arith, builtin, func
from xdsl.dialects.shard import ReductionKind
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from hostir_dialect import hir
from hostir_dialect.fusion import tensor_type
from passes.stream_parallel import index_constant, runtime_value

CUDA = hir.CommunicatorBackend.CUDA


def _product_of(op: hir.ReduceScatterOp) -> hir.MatmulOp | None:
    """The matmul that writes the reduce-scatter's whole input, before it in its block, if
    the input is (a view of) a buffer the program allocates and nothing else reads or
    writes it, through any view of that buffer (extents and deallocation aside): the
    rewrite leaves the buffer holding other values."""
    root = op.input
    while isinstance(root.owner, hir.AliasSelectOp):
        root = root.owner.input
    if not isinstance(root.owner, hir.AllocateOp):
        return None
    users, views = set(), [root]
    while views:
        for use in views.pop().uses:
            if isinstance(use.operation, hir.AliasSelectOp):
                views.append(use.operation.result)
            elif not isinstance(use.operation, hir.DimOp | hir.DeallocateOp):
                users.add(use.operation)
    matmuls = [user for user in users if isinstance(user, hir.MatmulOp)]
    if users != {op, *matmuls} or len(matmuls) != 1:
        return None
    (matmul,) = matmuls
    if (
        matmul.accumulate is not None
        or matmul.outs[0] is not op.input
        or matmul.parent is not op.parent
        or not matmul.is_before_in_block(op)
    ):
        return None
    return matmul


def _in_function_body(op: Operation) -> Operation:
    """The op of the function's body that is or holds `op`."""
    while not isinstance(op.parent_op(), func.FuncOp):
        op = op.parent_op()
    return op


def _operand_axis(operand: SSAValue, product: SSAValue, axis: int) -> int | None:
    """The axis of a matmul `operand` that broadcasts to `axis` of its `product` (None where
    it has none: the operand is of lower rank)."""
    offset = tensor_type(product).rank - tensor_type(operand).rank
    return axis - offset if axis >= offset else None


@dataclass
class _Slicer:
    """Slices of the matmul's operands at one position of the scattered axis."""

    matmul: hir.MatmulOp
    axis: int
    zero: SSAValue
    ops: list[Operation]
    """The views made, to be inserted before their first use."""
    broadcasts: dict[SSAValue, SSAValue] = field(default_factory=dict)
    """Operand -> its slice 0 along an axis of extent one, which every position shares."""

    def operands(self, position: SSAValue) -> list[SSAValue]:
        sliced = []
        for operand in self.matmul.ins:
            axis = _operand_axis(operand, self.matmul.outs[0], self.axis)
            if axis is None:
                sliced.append(operand)
            elif tensor_type(operand).get_shape()[axis] == 1:
                if operand not in self.broadcasts:
                    self.ops.append(view := hir.AliasSelectOp(operand, axis, self.zero))
                    self.broadcasts[operand] = view.result
                sliced.append(self.broadcasts[operand])
            else:
                self.ops.append(view := hir.AliasSelectOp(operand, axis, position))
                sliced.append(view.result)
        return sliced


class ReduceScatterIntoMatmul(RewritePattern):
    """A pairwise copy-engine sum reduce-scatter of a matmul's product -> a transfer of the
    peer's rows and an accumulating matmul of the own rows."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.ReduceScatterOp, rewriter: PatternRewriter, /) -> None:
        team = op.team_ids
        if (
            op.backend.data != CUDA
            or op.reduce_op is None
            or op.reduce_op.data != ReductionKind.SUM
            or len(team) != 2
            or sorted(tensor_type(op.input).mesh.ids) != sorted(team)
        ):
            return
        axis = op.scattered_axis()
        matmul = _product_of(op)
        waits = [use.operation for use in op.work.uses]
        if axis is None or matmul is None or axis >= tensor_type(op.input).rank - 2:
            return
        if len(waits) != 1 or not isinstance(wait := waits[0], hir.WaitOp) or wait.parent is not op.parent:
            return
        if any(
            (operand_axis := _operand_axis(operand, op.input, axis)) is not None
            and tensor_type(operand).get_shape()[operand_axis] not in (1, 2)
            for operand in matmul.ins
        ):
            return

        # The positions are the same in every iteration of the loops around: computed once,
        # in the function's body, with the values they are computed from.
        anchor = _in_function_body(op)
        zero, one = index_constant(rewriter, anchor, 0), index_constant(rewriter, anchor, 1)
        first, second = index_constant(rewriter, anchor, team[0]), index_constant(rewriter, anchor, team[1])
        rank = runtime_value(rewriter, anchor, hir.DeviceIndexOp, "rank")
        is_second = arith.CmpiOp(rank, second, "eq")
        own = arith.SelectOp(is_second.result, one, zero)
        peer = arith.SelectOp(is_second.result, zero, one)
        peer_device = arith.SelectOp(is_second.result, first, second)
        positions = [is_second, own, peer, peer_device]
        for value, name in zip(positions, ("is_second", "own_position", "peer_position", "peer_device")):
            value.result.name_hint = name
            value.location = op.location
        inputs = {value.owner for value in (zero, one, first, second, rank)}
        last_input = [o for o in anchor.parent_block().ops if o in inputs][-1]
        rewriter.insert(positions, InsertPoint.after(last_input))
        slicer = _Slicer(matmul, axis, zero, [])
        to_peer = hir.AliasSelectOp(op.input, axis, zero)
        to_peer.result.name_hint = "to_peer"
        peer_rows = hir.MatmulOp(slicer.operands(peer.result), [to_peer.result])
        batch = hir.EndCoalescingOp()
        batch.work.name_hint = "exchanged"
        transfer = [
            to_peer,
            peer_rows,
            hir.StartCoalescingOp(),
            hir.SendOp(to_peer.result, peer_device.result, CUDA),
            hir.RecvOp(op.output, peer_device.result, CUDA),
            batch,
        ]
        before = slicer.ops
        slicer.ops = []
        own_rows = hir.MatmulOp(slicer.operands(own.result), [op.output], accumulate=True)
        for new_op in (*before, *transfer, *slicer.ops, own_rows):
            new_op.location = op.location
        rewriter.insert(before, InsertPoint.before(matmul))
        rewriter.insert(transfer, InsertPoint.before(op))
        rewriter.insert([*slicer.ops, own_rows], InsertPoint.after(wait))
        rewriter.replace(op, [], [batch.work])
        rewriter.erase(matmul)


@dataclass(frozen=True)
class ReduceScatterInMatmul(ModulePass):
    """Sums the two pieces of a pairwise copy-engine reduce-scatter of a matmul's product in
    the epilogue of the matmul, instead of in a pass of its own after the transfer."""

    name = "reduce-scatter-in-matmul"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(ReduceScatterIntoMatmul(), apply_recursively=False).rewrite_module(op)
