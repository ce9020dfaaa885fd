"""`sum-in-matmul`: a kernel that only adds two products, one of them a GEMM's made for that
sum alone, becomes that GEMM adding its product into the other (`hir.matmul accumulate`,
cuBLAS's beta = 1).

A backward sums the gradients of an activation that several projections read: the input
of attention's q, k and v projections, of the MLP's gate and up projections. In the
program each projection's GEMM writes a product of its own, and a kernel adds two of them
into a third buffer, reading both and writing the sum: three passes over a tensor as large
as the activation, per sum. Instead the later GEMM adds into the earlier product in its
epilogue (one more read of that product inside the GEMM), and the kernel, the later
product's buffer and the sum's buffer are gone. The sum is rounded once where the kernel
rounded the later product and then the sum, as torch's own `addmm` rounds.

The operands may be whole buffers or one slice of each (a pipelined loop's iteration,
which `auto-stream-parallel` makes of the sum and the reduce-scatter after it). Rewritten
only where that changes nothing else: the kernel's segment is one `fusion.add` of two
operands of the out's type; the three are whole buffers that this device allocates
(`hir.allocate`, not symmetric) of one type, or the same slice of such buffers; the GEMM
is a plain one (no bias, not accumulating), before the kernel in its block, into such a
buffer (or the slice) that nothing but the GEMM and the kernel uses; the other operand's
buffer is used by nothing but the kernel after the GEMM begins, and the GEMM does not read
it (taken as a slice, no op of the kernel's block takes it otherwise); the out's buffer is
used by nothing before the kernel. The pass runs before `insert-deallocations`. A sum that
a copy-engine reduce-scatter reads (a symmetric buffer) is summed in the GEMMs by
`reduce-scatter-in-matmul` and `reduce-scatter-ring`, which run before it.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import builtin
from xdsl.ir import Operation, OpResult, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from hostir_dialect import hir
from hostir.passes.analysis.buffers import (
    adds_two,
    buffer_users,
    erase_if_unlaunched,
    is_private_allocation,
    product_of,
)

Taken = tuple[SSAValue, tuple[int, SSAValue] | None]
"""A buffer operand as `(buffer, (axis, index))`: the slice `[axis = index]` of a whole
buffer, or `(buffer, None)`: the whole buffer."""


def taken(value: SSAValue) -> Taken | None:
    """How `value` takes a whole private buffer: whole, or as one slice of it; None where it
    is neither."""
    owner = value.owner
    if isinstance(owner, hir.AliasSelectOp) and is_private_allocation(owner.input.owner):
        return owner.input, (owner.axis.data, owner.index)
    if is_private_allocation(owner):
        return value, None
    return None


def precedes(a: Operation, b: Operation) -> bool:
    """Whether `a` comes first in program order: `a`, or the op around it in the innermost
    block that holds both, is before `b`'s there."""
    block = b.parent_block()
    while block is not None:
        if (outer_a := block.find_ancestor_op_in_block(a)) is not None:
            outer_b = block.find_ancestor_op_in_block(b)
            return outer_b is not None and outer_a is not outer_b and outer_a.is_before_in_block(outer_b)
        block = block.parent_block()
    return False


def may_add_into(addend: Taken, gemm: hir.MatmulOp, launch: hir.LaunchKernelOp) -> bool:
    """Whether `gemm` may add its product into `addend`'s buffer, which `launch` alone uses
    once `gemm` begins, and which `gemm` does not read; taken as a slice, no op of the
    kernel's block takes it otherwise (a later iteration would read the sums of the earlier)."""
    buffer, key = addend
    reads = {read[0] for value in gemm.ins if (read := taken(value)) is not None}
    in_block = [use.operation for use in buffer.uses if use.operation.parent_block() is launch.parent_block()]
    if key is not None and any(
        not isinstance(user, hir.AliasSelectOp) or taken(user.result) != addend for user in in_block
    ):
        return False
    return buffer not in reads and all(user is launch or precedes(user, gemm) for user in buffer_users(buffer))


def defined_before(value: SSAValue, op: Operation) -> bool:
    """Whether `value` is defined before `op`: an op's result before it, or an argument of a
    block that holds it."""
    if isinstance(value, OpResult):
        return precedes(value.op, op)
    return value.owner.find_ancestor_op_in_block(op) is not None


class SumIntoMatmul(RewritePattern):
    """`matmul(a, b) -> p; launch add(q, p) -> s` becomes `matmul accumulate(a, b) -> q`, `s` read as `q`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.LaunchKernelOp, rewriter: PatternRewriter, /) -> None:
        if not adds_two(op):
            return
        operands = [taken(value) for value in (*op.ins, op.outs[0])]
        if any(t is None for t in operands) or len({t[1] for t in operands}) != 1:
            return
        if len({t[0].type for t in operands}) != 1:
            return
        (first, second, out) = operands
        if any(user is not op and precedes(user, op) for user in buffer_users(out[0])):
            return
        for read, product, addend in ((op.ins[1], second, first), (op.ins[0], first, second)):
            gemm = product_of(op, read)
            if gemm is not None and may_add_into(addend, gemm, op):
                break
        else:
            return
        buffer, slice_taken = addend
        into = buffer
        if slice_taken is not None:
            if not defined_before(slice_taken[1], gemm):
                return
            select = hir.AliasSelectOp(buffer, *slice_taken)
            rewriter.insert(select, InsertPoint.before(gemm))
            into = select.result
        segment = op.callee_function()
        views = [value.owner for value in (*gemm.outs, *op.ins, *op.outs) if isinstance(value.owner, hir.AliasSelectOp)]
        rewriter.replace(gemm, hir.MatmulOp(gemm.ins, [into], accumulate=True), [])
        rewriter.erase(op)
        for view in dict.fromkeys(views):
            if not view.result.uses:
                rewriter.erase(view)
        rewriter.replace_all_uses_with(out[0], buffer)
        for allocation in (out[0].owner, product[0].owner):
            if not allocation.results[0].uses:
                rewriter.erase(allocation)
        erase_if_unlaunched(segment, rewriter)


class SumInMatmul(ModulePass):
    """Makes the GEMM whose product a kernel only adds to another add it in its epilogue."""

    name = "sum-in-matmul"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(SumIntoMatmul(), apply_recursively=False).rewrite_module(op)
