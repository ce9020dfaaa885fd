"""What the lowerings do for the copy-engine backend (`backend cuda`, docs/copy-engine.md).

A copy-engine transfer is pulled: each device copies its peers' data straight out of
their memory, so a buffer that a peer reads (the input of an allgather, of an
allreduce or of a reduce_scatter: the partial sums that each device pulls and reduces
locally; the buffer of a send) must come from `hir.allocate symmetric`, memory that
every device of the mesh has mapped. The lowerings that emit such a transfer
(`fusion-to-hir{backend=cuda}`, `stream-parallel{p2p_backend=cuda}`) call
`peer_readable` on the buffer it reads:

* a buffer that already is symmetric (a view of a symmetric allocation, or of an input
  that the caller passes in symmetric memory: `hir.symmetric`) is read where it is;
* a buffer that the program allocates in its body and does not return becomes
  symmetric where it is allocated, at no cost;
* any other buffer (a program input not marked `hir.symmetric`, a returned buffer, a
  view) is first copied into a new symmetric buffer, right before the op that transfers
  it, and the transfer reads that copy. Peers cannot map the memory of such an input,
  which the caller allocated where it liked; and
  the runtime reuses a symmetric buffer in the next run, so a returned one would be
  overwritten under the caller. The copy is one local pass over the local shard, a
  fraction 1/(D-1) of the bytes the transfer then moves over the links.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint

from hostir_dialect import hir
from hostir_dialect.fusion import DYNAMIC, tensor_type


def _symmetric_in_place(buffer: SSAValue) -> hir.AllocateOp | None:
    """The allocation of `buffer` if making it symmetric is enough: in the function body, not returned."""
    allocation = hir.allocation_of(buffer)
    if allocation is None or not isinstance(allocation.parent_op(), func.FuncOp):
        return None
    if any(isinstance(use.operation, func.ReturnOp) for use in buffer.uses):
        return None
    return allocation


def peer_readable(rewriter: PatternRewriter, buffer: SSAValue, before: Operation) -> SSAValue:
    """`buffer` if symmetric or made so, or a symmetric copy of it made right before `before` (in the body)."""
    if hir.is_symmetric(buffer):
        return buffer
    allocation = _symmetric_in_place(buffer)
    if allocation is not None:
        allocation.symmetric = UnitAttr()
        rewriter.notify_op_modified(allocation)
        return buffer
    buffer_type = tensor_type(buffer)
    extents = [
        hir.DimOp(buffer, axis) for axis, extent in enumerate(buffer_type.get_shape()) if extent == DYNAMIC
    ]
    staged = hir.AllocateOp(buffer_type, [extent.result for extent in extents], symmetric=True)
    staged.result.name_hint = f"{buffer.name_hint or 'buffer'}_symmetric"
    copy = hir.CopyOp([buffer], [staged.result])
    for new_op in (*extents, staged, copy):
        new_op.location = before.location
    rewriter.insert([*extents, staged, copy], InsertPoint.before(before))
    return staged.result
