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

from xdsl.dialects import arith, func, scf
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint

from hostir_dialect import hir
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


def product_of(reader: Operation, value: SSAValue) -> hir.MatmulOp | None:
    """The plain matmul (no bias, not accumulating) before `reader` in its block that writes
    `value`, which `reader` reads, where `value` is (a view of) a buffer the program
    allocates and nothing but the two reads or writes that buffer, through any view of it
    (extents, waits and deallocation aside): a rewrite may then leave the buffer holding
    other values, or drop it. A bias would be added by both devices' GEMMs of a chunk."""
    root = hir.view_root(value)
    if not isinstance(root.owner, hir.AllocateOp):
        return None
    users = {
        user for user in buffer_users(root) if not isinstance(user, hir.DimOp | hir.DeallocateOp | hir.WaitOp)
    }
    matmuls = [user for user in users if isinstance(user, hir.MatmulOp)]
    if users != {reader, *matmuls} or len(matmuls) != 1:
        return None
    (matmul,) = matmuls
    if (
        matmul.accumulate is not None
        or len(matmul.ins) != 2
        or not same_memory(matmul.outs[0], value)
        or matmul.parent_block() is not reader.parent_block()
        or not matmul.is_before_in_block(reader)
    ):
        return None
    return matmul


def in_function_body(op: Operation) -> Operation | None:
    """The op of a function's body that is or holds `op` (None outside a function)."""
    while not isinstance(parent := op.parent_op(), func.FuncOp):
        if parent is None:
            return None
        op = parent
    return op


def nothing_writes_between(matmul: hir.MatmulOp, wait: hir.WaitOp, op: hir.CommunicationOp) -> bool:
    """Whether the ops strictly between `matmul` and `wait` (of one block) are `op` or only
    make views, buffers and indices: none writes or frees a buffer the matmul reads, so
    its operands may be read at the wait instead."""
    between = matmul.next_op
    while between is not wait:
        if between is None or not (between is op or isinstance(between, hir.AllocateOp) or recomputable(between)):
            return False
        between = between.next_op
    return True
