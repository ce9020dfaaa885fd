"""Buffer liveness: which ops use a buffer of a host program, and until when.

A buffer is used by the ops that name it or a view of it (`hir.alias_select`, views of
views too), and a communication uses its buffers until the `hir.wait` of its work (of its
batch, for a coalesced send or receive), which an `scf.for` may carry to a later iteration
(`buffer_users`). `insert-deallocations` frees a buffer after the last of them,
`forward-buffers` finds the copies and results whose buffers may be one, and the
GEMM-and-reduction rewrites find the buffers that only a matmul and its collective use.
A buffer that only this device's streams use, in its program order, is a *private*
allocation (`is_private_allocation`); `fewer_slices` re-allocates one with fewer slices
along its stream axis.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from xdsl.dialects import arith, builtin, func, scf
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import DYNAMIC, tensor_type
from hostir.passes.analysis.loops import recomputable


def _work_users(work: SSAValue) -> list[Operation]:
    """The ops that use `work`, followed through the iteration arguments and results of the
    `scf.for` loops that carry it (copy-engine-pipelining waits in the next iteration)."""
    users, pending, seen = [], [work], set()
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        for use in value.uses:
            user = use.operation
            if isinstance(user, scf.YieldOp) and isinstance(loop := user.parent_op(), scf.ForOp):
                carried = use.index
            elif isinstance(user, scf.ForOp) and use.index >= (first := len(user.operands) - len(user.iter_args)):
                loop, carried = user, use.index - first
            else:
                users.append(user)
                continue
            pending += [loop.results[carried], loop.body.block.args[carried + 1]]
    return users


def _completions(op: Operation) -> list[Operation]:
    """The hir.wait ops until which an asynchronous `op` still uses its buffers."""
    works = [result for result in op.results if isinstance(result.type, hir.WorkType)]
    if isinstance(op, hir.P2POp) and (batch := op.batch()) is not None:
        works.append(batch[1].work)
    return [user for work in works for user in _work_users(work)]


def buffer_users(buffer: SSAValue) -> list[Operation]:
    """The ops that use `buffer` or a view of it (the views themselves excluded), with the
    waits that end asynchronous uses."""
    users: list[Operation] = []
    values = [buffer]
    while values:
        value = values.pop()
        for use in value.uses:
            if isinstance(use.operation, hir.AliasSelectOp) and use.operation.input is value:
                values.append(use.operation.result)
            else:
                users += [use.operation, *_completions(use.operation)]
    return users


def is_private_allocation(op: Operation | None) -> bool:
    """Whether `op` allocates, in the function body, a buffer that is not symmetric: one that
    only this device's streams use, in the order of its program (peers read or write a
    symmetric one in their own order)."""
    return isinstance(op, hir.AllocateOp) and op.symmetric is None and isinstance(op.parent_op(), func.FuncOp)


def fewer_slices(op: hir.AllocateOp, count: SSAValue, rewriter: PatternRewriter) -> SSAValue:
    """Re-allocates `op`'s buffer with `min(extent, count)` slices along its stream axis (`count`
    defined before `op`); its `hir.dim` of that axis become the old extent, which the loops
    still walk. The new buffer; its slices keep
    their index, which the caller maps onto the fewer slices."""
    buffer_type = tensor_type(op.result)
    axis = buffer_type.stream_axis
    stated = hir.stated_extent(op.result, axis)
    assert stated is not None  # an allocation's axis
    extent_ops, extent = stated
    slots = arith.MinUIOp(extent, count)
    slots.result.name_hint = "stream_slots"
    sizes, shape = list(op.dynamic_sizes), list(buffer_type.get_shape())
    position = shape[:axis].count(DYNAMIC)
    if shape[axis] == DYNAMIC:
        sizes[position] = slots.result
    else:
        sizes.insert(position, slots.result)
        shape[axis] = DYNAMIC
    allocation = hir.AllocateOp(buffer_type.with_(shape=shape), sizes)
    allocation.result.name_hint = op.result.name_hint
    inserted = [*extent_ops, slots, allocation]
    for new_op in inserted:
        new_op.location = op.location
    rewriter.insert(inserted, InsertPoint.before(op))
    for use in list(op.result.uses):
        if isinstance(dim := use.operation, hir.DimOp) and dim.axis.data == axis:
            rewriter.replace(dim, [], [extent])
    rewriter.replace(op, [], [allocation.result])
    return allocation.result


def same_memory(a: SSAValue, b: SSAValue) -> bool:
    """Whether `a` and `b` are the same memory: one value, or views that the same selections
    (`hir.alias_select` of one axis at one index) make of one buffer."""
    if a is b:
        return True
    view_a, view_b = a.owner, b.owner
    return (
        isinstance(view_a, hir.AliasSelectOp)
        and isinstance(view_b, hir.AliasSelectOp)
        and view_a.axis.data == view_b.axis.data
        and view_a.index is view_b.index
        and same_memory(view_a.input, view_b.input)
    )


def sole_writer(reader: Operation, value: SSAValue) -> hir.ComputeOp | None:
    """The compute op before `reader` in its block whose one out is `value`, which `reader`
    reads, where `value` is (a view of) a buffer the program allocates and nothing but the
    two reads or writes that buffer, through any view of it (extents, waits and
    deallocation aside): a rewrite may then leave the buffer holding other values, or drop it."""
    root = hir.view_root(value)
    if not isinstance(root.owner, hir.AllocateOp):
        return None
    users = {
        user for user in buffer_users(root) if not isinstance(user, hir.DimOp | hir.DeallocateOp | hir.WaitOp)
    }
    if reader not in users or len(writers := users - {reader}) != 1:
        return None
    (writer,) = writers
    if (
        not isinstance(writer, hir.ComputeOp)
        or len(writer.outs) != 1
        or not same_memory(writer.outs[0], value)
        or writer.parent_block() is not reader.parent_block()
        or not writer.is_before_in_block(reader)
    ):
        return None
    return writer


def product_of(reader: Operation, value: SSAValue) -> hir.MatmulOp | None:
    """The plain matmul (no bias, not accumulating) that alone writes `value` for `reader`
    (`sole_writer`). A bias would be added by both devices' GEMMs of a chunk."""
    matmul = sole_writer(reader, value)
    if not isinstance(matmul, hir.MatmulOp) or matmul.accumulate is not None or len(matmul.ins) != 2:
        return None
    return matmul


def adds_two(op: Operation) -> bool:
    """Whether `op` is a kernel launch whose segment only adds its two inputs, all three of one type."""
    if not isinstance(op, hir.LaunchKernelOp):
        return False
    body = op.callee_function().body.block
    ops = list(body.ops)
    return (
        len(op.ins) == 2
        and len(op.outs) == 1
        and len(ops) == 2
        and isinstance(ops[0], fusion.AddOp)
        and tuple(ops[0].operands) == tuple(body.args)
        and isinstance(ops[1], func.ReturnOp)
        and op.ins[0].type == op.ins[1].type == op.outs[0].type
    )


def summed_products(reader: Operation, value: SSAValue) -> tuple[list[hir.MatmulOp], list[hir.LaunchKernelOp]] | None:
    """The plain matmuls whose products add up to `value` for `reader`, and the kernels that
    add them (`adds_two`), where each product and partial sum alone is written by its op and
    read by the next (`sole_writer`): `value` itself a matmul's product, or the sum of two
    such values (the gradient of an activation that several projections read)."""
    if (matmul := product_of(reader, value)) is not None:
        return [matmul], []
    kernel = sole_writer(reader, value)
    if kernel is None or not adds_two(kernel) or same_memory(*kernel.ins):
        return None
    matmuls, kernels = [], [kernel]
    for operand in kernel.ins:
        if (terms := summed_products(kernel, operand)) is None:
            return None
        matmuls += terms[0]
        kernels += terms[1]
    return matmuls, kernels


def erase_computation(ops: Sequence[hir.ComputeOp], rewriter: PatternRewriter) -> None:
    """Erases `ops`, whose results a rewrite computes otherwise, then what only they used:
    the views and buffers of their operands that nothing uses any more, and the segments
    of their kernels that nothing launches any more."""
    values = [value for op in ops for value in op.operands]
    segments = [op.callee_function() for op in ops if isinstance(op, hir.SegmentCallOp)]
    for op in ops:
        rewriter.erase(op)
    while values:
        owner = values.pop().owner
        if isinstance(owner, hir.AliasSelectOp | hir.AllocateOp) and owner.parent is not None and not owner.results[0].uses:
            values += owner.operands
            rewriter.erase(owner)
    for segment in dict.fromkeys(segments):
        erase_if_unlaunched(segment, rewriter)


def erase_if_unlaunched(segment: func.FuncOp, rewriter: PatternRewriter) -> None:
    """Erases a kernel's segment that no op of its module launches any more."""
    symbol = builtin.SymbolRefAttr(segment.sym_name)
    module = segment.parent_op()
    if not any(isinstance(user, hir.SegmentCallOp) and user.callee == symbol for user in module.walk()):
        rewriter.erase(segment)


def in_function_body(op: Operation) -> Operation | None:
    """The op of a function's body that is or holds `op` (None outside a function)."""
    while not isinstance(parent := op.parent_op(), func.FuncOp):
        if parent is None:
            return None
        op = parent
    return op


def nothing_writes_between(first: Operation, last: Operation, rewritten: Collection[Operation]) -> bool:
    """Whether the ops strictly between `first` and `last` (of one block) are the ops a
    rewrite replaces (`rewritten`) or only make views, buffers and indices: none writes or
    frees a buffer that `first` reads, so its operands may be read at `last` instead."""
    between = first.next_op
    while between is not last:
        if between is None or not (between in rewritten or isinstance(between, hir.AllocateOp) or recomputable(between)):
            return False
        between = between.next_op
    return True
