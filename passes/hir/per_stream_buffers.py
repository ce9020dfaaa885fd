"""`per-stream-buffers`: a buffer that a stream loop fills and uses slice by slice gets one
slice per stream, not one per iteration.

pr4147 notes the optimisation its host programs leave out: "the allocation of the
intermediate buffer could be only of length numberOfStreams". In a work loop of
`stream-parallel`, iteration `i` runs on pool stream `i mod number_of_streams`, so
iterations `i` and `i + number_of_streams` run one after the other on the same
stream; if each of them touches only its own slice of a buffer, they may as well
share one. The buffer then has `min(extent, number_of_streams)` slices and iteration
`i` uses slice `i mod number_of_streams`: the gathered input of AG+GEMM in 8 chunks
on 3 streams takes 3/8 of the memory, and a program's peak memory no longer grows
with its number of chunks.

A buffer qualifies when all of these hold, and is left as it is otherwise:

* it is allocated in the function body and is not symmetric (peers read or write a
  symmetric buffer in their own order, not in the order of this device's streams);
* it is only sliced (`hir.alias_select`) along its stream axis, directly in the body
  of one stream loop, with one index that is not already the iteration's stream
  index (which makes the pass idempotent); every other use is a `hir.dim` or a
  `hir.deallocate`. In particular it is not returned.

Every communication of an iteration is ordered after the work its stream had
before it (NCCL's stream and the copy stream wait for the issuing stream), so the
next writer of a shared slice waits for the last reader of it.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import arith, builtin
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
from hostir.passes.analysis.buffers import fewer_slices, is_private_allocation
from hostir.passes.analysis.loops import StreamLoop


def _defined_before(value: SSAValue, op: Operation) -> bool:
    """Whether `value` is defined in `op`'s block before `op` (so that it may be used there)."""
    owner = value.owner
    return isinstance(owner, Operation) and owner.parent_block() is op.parent_block() and (
        owner.is_before_in_block(op)
    )


def _shared_slices(op: hir.AllocateOp) -> tuple[arith.RemUIOp, list[hir.AliasSelectOp]] | None:
    """The slices of `op`'s buffer and the stream index of the loop that makes them, if the
    buffer qualifies (see the module docstring)."""
    axis = tensor_type(op.result).stream_axis
    if axis is None or not is_private_allocation(op):
        return None
    users = [use.operation for use in op.result.uses]
    slices = [user for user in users if isinstance(user, hir.AliasSelectOp)]
    allowed = (hir.AliasSelectOp, hir.DimOp, hir.DeallocateOp)
    if not slices or any(not isinstance(user, allowed) for user in users):
        return None
    loop = StreamLoop.match(slices[0].parent_op())
    if loop is None or loop.is_sync_loop:
        return None
    index, stream_index = slices[0].index, loop.stream_index
    if index is stream_index.result or any(
        s.parent_op() is not loop.loop or s.axis.data != axis or s.index is not index for s in slices
    ):
        return None
    return stream_index, slices


class OneSlicePerStream(RewritePattern):
    """Re-allocates a qualifying buffer with `min(extent, number_of_streams)` slices along its
    stream axis, and slices it at the iteration's stream index."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.AllocateOp, rewriter: PatternRewriter, /) -> None:
        if (shared := _shared_slices(op)) is None:
            return
        stream_index, slices = shared
        num_streams = stream_index.rhs
        if not _defined_before(num_streams, op):
            number_of_streams = hir.NumberOfStreamsOp()
            number_of_streams.location = op.location
            rewriter.insert(number_of_streams, InsertPoint.before(op))
            num_streams = number_of_streams.result
        fewer_slices(op, num_streams, rewriter)
        for view in slices:
            view.operands = [view.input, stream_index.result]
            rewriter.notify_op_modified(view)


class PerStreamBuffers(ModulePass):
    """Gives a buffer that a stream loop uses slice by slice one slice per stream, not per iteration."""

    name = "per-stream-buffers"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(OneSlicePerStream(), apply_recursively=False).rewrite_module(op)
