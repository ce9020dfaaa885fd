"""`buffer-layouts`: allocates a buffer that a permute reads in the permuted order, so that
the permute's result is one block and the reshape after it a view.

A pipelined loop's result has its stream axis outermost in memory (`hir.allocate`), the
chunks the loop makes one after the other. Where the stream axis cuts the rows of several
sequences (an all-gather feeding the projections of sequence-parallel attention: chunk `d`
holds the rows `d` of every sequence, `[D, B, s, width]`), the program puts the sequences
back in order with a permute (`[B, D, s, width]`) and a reshape (`[B, D s, width]`), which
copies the whole result: twice per projection in the forward, and more in the backward.
Laid out in the permute's order instead, the buffer's chunks are strided views that the
GEMMs write as they are (a batched GEMM's output takes any batch stride), the permute's
result is one block, and the reshape is a view.

Given only where nothing could tell the difference: the permute reads (directly, or through
copies that `forward-buffers` forwarded) a whole buffer that this device allocates with no
order of its own, and every other op that uses it, or a view of it, is a GEMM, an ATen
call, a generated kernel (which walks its buffers through their strides), a forwarded copy
of it, a `hir.dim` or its deallocation: no communication, whose pieces must be blocks, and
no return, whose caller sees the layout. So the kernel that computes the keys and values of
attention (their rotary embedding) writes them in the order of the heads' transpose that
the attention and the ring's transfers read, and no copy makes that transpose one block.
The runtime allocates as the `order` says and decides nothing.

The pass runs after `forward-buffers`, whose forwarded copies it follows. Running it again
gives the same orders.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import builtin
from xdsl.dialects.builtin import DenseArrayBase, i64
from xdsl.ir import Operation, OpResult, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from hostir_dialect import hir
from hostir_dialect.fusion import tensor_type
from hostir.passes.analysis.buffers import buffer_users, is_private_allocation


def forwarded_into(buffer: SSAValue) -> SSAValue | None:
    """The source whose buffer `buffer` becomes, where a copy marked `forwards_source` fills
    it; None where no such copy does."""
    for use in buffer.uses:
        copy = use.operation
        if isinstance(copy, hir.CopyOp) and copy.forwards_source is not None and copy.outs[0] is buffer:
            return copy.ins[0]
    return None


def holding_allocation(buffer: SSAValue) -> tuple[hir.AllocateOp, list[SSAValue]] | None:
    """The allocation whose memory `buffer` is, through forwarded copies, and the buffers on
    the way (`buffer` first); None where that is not a whole private allocation."""
    chain = [buffer]
    while (source := forwarded_into(chain[-1])) is not None:
        chain.append(source)
    root = chain[-1]
    if not isinstance(root, OpResult) or not is_private_allocation(root.op):
        return None
    return root.op, chain


def reads_any_layout(op: Operation, chain: list[SSAValue]) -> bool:
    """Whether `op`, a user of the buffers of `chain`, works on them whatever their layout, and
    leaves their memory theirs (an op that adopts one replaces its memory with its result)."""
    if isinstance(op, hir.CopyOp):
        return op.forwards_source is not None and op.ins[0] in chain and op.outs[0] in chain
    if isinstance(op, hir.AtenOp) and op.adopted is not None:
        return not any(op.outs[index] in chain for index in hir.adopted_outs(op))
    return isinstance(op, hir.MatmulOp | hir.LinearOp | hir.AtenOp | hir.SegmentCallOp | hir.DimOp | hir.DeallocateOp)


def permuted_order(permute: hir.AtenOp, axes: tuple[int, ...]) -> list[int] | None:
    """The order of the axes of the permute's buffer (its type's, the device axis first where
    it varies) that lays the permute's result out in one block; None where the type has a
    device axis elsewhere."""
    device_axis = tensor_type(permute.ins[0]).didx_axis
    if device_axis is None:
        return list(axes)
    if device_axis != 0:
        return None
    return [0, *(axis + 1 for axis in axes)]


class LayOutPermutedBuffer(RewritePattern):
    """Gives the buffer that a permute reads the permute's order (`order [...]`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.AtenOp, rewriter: PatternRewriter, /) -> None:
        axes = op.permuted_axes()
        held = holding_allocation(op.ins[0]) if axes is not None else None
        if held is None:
            return
        allocation, chain = held
        order = permuted_order(op, axes)
        if order is None or allocation.order is not None or tuple(order) == allocation.memory_order():
            return
        if tensor_type(allocation.result).rank != len(order):
            return
        users = [user for buffer in chain for user in buffer_users(buffer)]
        if not all(user is op or reads_any_layout(user, chain) for user in users):
            return
        allocation.order = DenseArrayBase.from_list(i64, order)
        rewriter.notify_op_modified(allocation)


class BufferLayouts(ModulePass):
    """Allocates the buffers that a permute reads in the permuted order (`order`)."""

    name = "buffer-layouts"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(LayOutPermutedBuffer(), apply_recursively=False).rewrite_module(op)
