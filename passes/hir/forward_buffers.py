"""`forward-buffers`: marks the copies that need not move a byte and the ATen results that
become their buffers, from buffer liveness (`passes/analysis/buffers.py`).

Buffers are the runtime's to lay out (docs/design.md, *Runtime*), and two of its choices
save copies that the program writes:

* a copy whose source dies at the copy, or whose source and out are only read after it
  (`hir.copy ... forwards_source`; returned counts as read, but not both returned: the
  caller would get one buffer twice): the out becomes the source buffer itself. That is
  the whole copy that a pipelined loop's result gets for the readers after the loop
  (`auto-stream-parallel`): a buffer with a stream axis, copied into one without, the
  same bytes in the same layout, which a kernel fused after the loop may read too.
* an op that makes its results as tensors of its own, ATen's (`hir.aten`), an attention
  kernel's (`hir.attention` and its backward, without a block) or the views of a
  data-movement segment (`hir.post_on_stream`): an out that becomes the tensor itself
  (`... outs(%t : T) adopted [0]`) keeps ATen's layout (flash attention's backward reads
  the forward's output with the strides the forward gave it, and is wrong with any other;
  attention's results, laid out with the heads inside the rows, transpose to the next
  projection's rows as a view) and stays a view where the result is one (a weight's
  transpose, or the weight a matmul reads through a broadcast, is not copied every step).

Both replace a buffer of the program by another tensor, which is right only where nothing
could tell the difference: the buffer is a whole one of the op's block that only this
device uses (`hir.allocate`, not symmetric, in the op's block; not a slice of a larger
buffer, whose other slices the tensor would not share), and the op fills it first (no op
uses it before). A forwarded source must also die at the copy (nothing uses it or a view
of it afterwards but its `hir.deallocate`, a communication's wait counting as a use:
`buffer_users`), or it and the out must only be read after it (no op writes either, so
one buffer holds what both would), and it must hold what the out holds (one local shape,
element type and extents). An ATen op's tensor may be a view of its operands, so an out
becomes it only where no later op adds into it, or into an operand, while another of
those names lives on (`added_into_after`): a GEMM that `sum-in-matmul` has add into rows
selected from an attention's output would otherwise change the output that the backward
reads. The runtime reads the marks and decides nothing; a program
without them (written by hand, or lowered with `hir-lowering{forward_buffers=false}`)
runs with plain copies.

The pass runs after `insert-deallocations`, whose deallocations are where a source dies.
Running it again gives the same marks.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import DenseArrayBase, UnitAttr, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from hostir_dialect import hir
from hostir_dialect.fusion import tensor_type
from hostir.passes.analysis.buffers import buffer_users
from hostir.passes.analysis.extents import known_extent


def whole_buffer(op: Operation, buffer: SSAValue) -> hir.AllocateOp | None:
    """The allocation of `buffer` where it is a whole buffer of `op`'s block that only this
    device uses (`hir.whole_buffer_problem`, the rule the marks' verifiers hold them to)."""
    return None if hir.whole_buffer_problem(op, buffer) is not None else hir.allocation_of(buffer)


class BlockOrder:
    """The position of each op in a block, or of its ancestor there. The pass moves no op,
    so each block's positions are counted once (xDSL counts them at every ask)."""

    def __init__(self) -> None:
        self._positions: dict[Block, dict[Operation, int]] = {}

    def position(self, op: Operation, block: Block) -> int:
        positions = self._positions.get(block)
        if positions is None:
            positions = self._positions[block] = {o: i for i, o in enumerate(block.ops)}
        return positions[block.find_ancestor_op_in_block(op)]


def fills_first(op: Operation, buffer: SSAValue, order: BlockOrder) -> bool:
    """Whether `buffer` is a whole buffer of `op`'s block (`whole_buffer`) that no op uses
    before `op` (a view made before it would not see the tensor that replaces it)."""
    if whole_buffer(op, buffer) is None:
        return False
    block = op.parent_block()
    position = order.position(op, block)
    return all(
        use.operation is op or order.position(use.operation, block) > position for use in buffer.uses
    )


def dies_at(op: Operation, buffer: SSAValue, order: BlockOrder) -> bool:
    """Whether `buffer`, a whole buffer of `op`'s block, is used after `op` (directly, through
    a view, or by a communication until its wait) by nothing but its `hir.deallocate`."""
    if whole_buffer(op, buffer) is None:
        return False
    block = op.parent_block()
    position = order.position(op, block)
    return all(
        user is op or isinstance(user, hir.DeallocateOp) or order.position(user, block) < position
        for user in buffer_users(buffer)
    )


def only_read_after(op: Operation, buffer: SSAValue, order: BlockOrder) -> bool:
    """Whether `buffer`, a whole buffer of `op`'s block, is only read after `op`: each later
    use (directly or through a view) is its `hir.deallocate` or an op that has it among its
    ins and not among its outs (a pipelined loop's result that a fused kernel reads after
    the copy that the readers after the loop get), or a `func.return` (the caller reads
    what the program returns after the program's own reads)."""
    if whole_buffer(op, buffer) is None:
        return False
    block = op.parent_block()
    position = order.position(op, block)

    def reads(user: Operation) -> bool:
        if isinstance(user, hir.DeallocateOp | func.ReturnOp):
            return True
        return isinstance(user, hir.ComputeOp) and all(hir.view_root(out) is not buffer for out in user.outs)

    return all(
        user is op or order.position(user, block) < position or reads(user) for user in buffer_users(buffer)
    )


def returned(buffer: SSAValue) -> bool:
    """Whether the function returns `buffer` or a view of it."""
    return any(isinstance(user, func.ReturnOp) for user in buffer_users(buffer))


def same_buffer_shape(a: hir.AllocateOp, b: hir.AllocateOp) -> bool:
    """Whether the two allocations make buffers of one local shape and element type, and of
    the same extents wherever they are dynamic (`known_extent`)."""
    a_type, b_type = tensor_type(a.result), tensor_type(b.result)
    return (
        (a_type.local_shape(), a_type.element_type) == (b_type.local_shape(), b_type.element_type)
        and len(a.dynamic_sizes) == len(b.dynamic_sizes)
        and all(known_extent(x) == known_extent(y) for x, y in zip(a.dynamic_sizes, b.dynamic_sizes))
    )


def forwards_source(op: hir.CopyOp, order: BlockOrder) -> bool:
    """Whether the copy's out may be its source buffer itself (the module docstring)."""
    source, out = op.ins[0], op.outs[0]
    if not fills_first(op, out, order):
        return False
    read_only = (
        only_read_after(op, source, order)
        and only_read_after(op, out, order)
        and not (returned(source) and returned(out))
    )
    if not dies_at(op, source, order) and not read_only:
        return False
    return same_buffer_shape(whole_buffer(op, source), whole_buffer(op, out))


@dataclass
class ForwardCopySource(RewritePattern):
    """Marks `forwards_source` a copy whose source dies at it, and unmarks one whose no longer does."""

    order: BlockOrder

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.CopyOp, rewriter: PatternRewriter, /) -> None:
        forwarded = forwards_source(op, self.order)
        if forwarded != (op.forwards_source is not None):
            op.forwards_source = UnitAttr() if forwarded else None
            rewriter.notify_op_modified(op)


def adoptable(op: hir.AdoptingOp, index: int, order: BlockOrder) -> bool:
    """Whether out #`index` of `op` may become the tensor the op makes: one the op fills
    first; of an attention kernel, one with the element type the kernel makes, of an op
    without a block (a ring's step writes its rows into the outs it is given); of an ATen op
    or a data-movement segment, whose tensor may be a view of its operands (`select`, `t`,
    `reshape`), one that no later op adds into while an operand lives on, nor adds into a
    living operand (`added_into_after`): a GEMM that adds into rows selected from an
    attention's output (`sum-in-matmul`'s) would change the output that the backward reads.
    Where an operand dies at the op (a residual sum viewed as sequences) the view is its
    memory's only name; a later op that writes the out whole (the GEMM that
    `allreduce-in-place` has write through an `aten.alias`) makes the op's values dead, and
    is the view's purpose."""
    out = op.outs[index]
    if isinstance(op, hir.AttentionComputeOp):
        if op.block is not None or tensor_type(out).element_type != op.kernel_element_type(index):
            return False
    else:
        living = [value for value in op.ins if not dies_at(op, value, order)]
        if living and any(added_into_after(op, value, order) for value in (out, *living)):
            return False
    return fills_first(op, out, order)


def added_into_after(op: Operation, buffer: SSAValue, order: BlockOrder) -> bool:
    """Whether an op after `op` in its block adds into `buffer`, a view of it, or the out of an
    ATen op or data-movement segment that reads it (which may become a view of it too):
    reads what it writes there (`hir.matmul accumulate`, or an op with the buffer among its
    ins and outs). A use outside `op`'s block (of a buffer from outside it) counts, before
    `op` or not."""
    block = op.parent_block()
    position = order.position(op, block)

    def after(user: Operation) -> bool:
        return block.find_ancestor_op_in_block(user) is None or order.position(user, block) > position

    names, unseen = {buffer}, [buffer]
    while unseen:
        for user in buffer_users(unseen.pop()):
            if user is not op and isinstance(user, hir.AtenOp | hir.PostOnStreamOp):
                made = set(user.outs) - names
                names |= made
                unseen += made

    def adds_into(user: Operation) -> bool:
        written = {hir.view_root(out) for out in user.outs} & names if isinstance(user, hir.ComputeOp) else set()
        if not written or isinstance(user, hir.AdoptingOp):  # those make their outs anew
            return False
        accumulates = isinstance(user, hir.MatmulOp) and user.accumulate is not None
        return accumulates or any(hir.view_root(value) in written for value in user.ins)

    return any(
        user is not op and after(user) and adds_into(user) for name in names for user in buffer_users(name)
    )


@dataclass
class AdoptResults(RewritePattern):
    """Marks `adopted` the outs of an `hir.aten`, an `hir.attention` or its backward, or an
    `hir.post_on_stream` that may become the tensors the op makes (`adoptable`)."""

    order: BlockOrder

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        if not isinstance(op, hir.AdoptingOp):
            return
        adopted = [index for index in range(len(op.outs)) if adoptable(op, index, self.order)]
        marked = list(hir.adopted_outs(op))
        if adopted != marked:
            op.adopted = DenseArrayBase.from_list(i64, adopted) if adopted else None
            rewriter.notify_op_modified(op)


class ForwardBuffers(ModulePass):
    """Marks the copies whose out may be their source (`forwards_source`) and the outs that
    may be the tensors their ATen op or data-movement segment makes (`adopted`)."""

    name = "forward-buffers"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        order = BlockOrder()
        PatternRewriteWalker(
            GreedyRewritePatternApplier([ForwardCopySource(order), AdoptResults(order)]), apply_recursively=False
        ).rewrite_module(op)
