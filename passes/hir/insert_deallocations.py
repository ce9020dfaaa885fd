"""`insert-deallocations`: frees every intermediate buffer after its last use.

nvFuser's InsertDeallocations host-IR pass. A buffer made by `hir.allocate` is used
by the ops that name it and by those that name a view of it (`hir.alias_select`,
views of views too). Its `hir.deallocate` goes right after the last of them in the
allocation's own block: a use inside an `scf.for` or `scf.if` counts as a use by
that op, so a buffer that a loop slices is freed after the whole loop. A
communication reads or writes its buffers until the `hir.wait` of its work (of its
batch, for a coalesced send or receive), so that wait is a use too, where an `scf.for`
carries the work to it (copy-engine-pipelining waits for a transfer in the next
iteration, or after the loop). A buffer that
the function returns, directly or through a view, is not freed.

A buffer allocated on the caller's stream that an op uses on a pool stream (after a
`hir.set_current_stream` of a stream that is not the caller's) is in use until the caller's
stream has waited for that stream: where its last use in the allocation's block is
followed there by a `hir.synchronize_stream` on the caller's stream, the buffer is freed
after the first such one. (A loop of `stream-parallel` waits for each iteration's stream
inside the loop; the backward attention ring waits for its last transfers after the loop,
while the own block's gradients are computed.) Freed earlier, its memory could be handed
to the caller's stream while the pool stream still reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.ir import Block, Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from hostir_dialect import hir
from hostir.passes.analysis.buffers import buffer_users


def _last_in_block(block: Block, users: list[Operation]) -> Operation:
    """The last op of `block` that is or holds one of `users`."""
    ancestors = [block.find_ancestor_op_in_block(user) for user in users]
    return max(
        (ancestor for ancestor in ancestors if ancestor is not None),
        key=block.get_operation_index,
    )


def ops_on_pool_streams(module: builtin.ModuleOp) -> frozenset[Operation]:
    """The ops issued on a pool stream: after a `hir.set_current_stream` of a stream other
    than the caller's (`hir.get_current_stream`), in their block or a block around them."""
    found: set[Operation] = set()

    def visit(block: Block, on_pool: bool) -> None:
        for op in block.ops:
            if on_pool:
                found.add(op)
            for region in op.regions:
                for inner in region.blocks:
                    visit(inner, on_pool and not isinstance(op, func.FuncOp))
            if isinstance(op, hir.SetCurrentStreamOp):
                on_pool = not isinstance(op.stream.owner, hir.GetCurrentStreamOp)

    visit(module.body.block, False)
    return frozenset(found)


@dataclass(frozen=True)
class DeallocateAfterLastUse(RewritePattern):
    """Inserts `hir.deallocate` after the last use of an allocated buffer that is not returned."""

    on_pool_streams: frozenset[Operation]
    """The ops of the module issued on a pool stream (`ops_on_pool_streams`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.AllocateOp, rewriter: PatternRewriter, /) -> None:
        users = buffer_users(op.result)
        if any(isinstance(user, hir.DeallocateOp | func.ReturnOp) for user in users):
            return
        block = op.parent_block()
        assert block is not None
        last = _last_in_block(block, users) if users else op
        if op not in self.on_pool_streams and not self.on_pool_streams.isdisjoint(users):
            last = self._caller_waits_after(last) or last
        rewriter.insert(hir.DeallocateOp(op.result), InsertPoint.after(last))

    def _caller_waits_after(self, op: Operation) -> hir.SynchronizeStreamOp | None:
        """The first `hir.synchronize_stream` after `op` in its block issued on the caller's stream."""
        following = op.next_op
        while following is not None:
            if isinstance(following, hir.SynchronizeStreamOp) and following not in self.on_pool_streams:
                return following
            following = following.next_op
        return None


class InsertDeallocations(ModulePass):
    """Frees each buffer that `hir.allocate` made, after its last use."""

    name = "insert-deallocations"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        rewrite = DeallocateAfterLastUse(ops_on_pool_streams(op))
        PatternRewriteWalker(rewrite, apply_recursively=False).rewrite_module(op)
