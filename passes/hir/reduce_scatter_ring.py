"""`reduce-scatter-ring`: a copy-engine reduce-scatter of a matmul's product over a team of more
than two becomes a ring of matmuls, one per destination, each sent as soon as it is computed,
and one reduction of what arrived (docs/copy-engine.md, *The ring of destinations*).

The copy-engine reduce-scatter of a larger team waits for the whole product, then pulls
every peer's piece at once and reduces them at its wait: nothing of the transfer overlaps
the matmul it follows. Each device can instead compute the product destination by
destination (the scattered axis is a batch axis of the matmul: slice `k` of the product
is member `k`'s), and send each member its rows while it computes the next member's, as
torch's `fused_matmul_reduce_scatter` does:

    hir.matmul ins(%x, %w) outs(%partial)
    %work = hir.reduce_scatter %partial into %out team [f, ..., f + D - 1] op sum backend cuda
    ...
    hir.wait %work

becomes, with `p` this device's position in the team, `k` the scattered axis of `%partial`
and `%x`, `%w` sliced at `k` where they have it (a broadcast extent of one at 0),

    %staging = hir.allocate(...) : <the type of %partial>
    // for t = 1 .. D - 1: the rows of the member t ahead, sent to it; those of the member
    // t behind, which computed this device's rows at its step t, received from it
    %to_t = hir.alias_select %partial[k = t]
    hir.matmul ins(%x[k = (p + t) mod D], %w[k = ...]) outs(%to_t)
    hir.start_coalescing
    %sent_t = hir.send %to_t to f + (p + t) mod D backend cuda
    %received_t = hir.recv %staging[k = (p - t) mod D] from f + (p - t) mod D backend cuda
    %work_t = hir.end_coalescing
    // the own rows, while the last transfers travel
    hir.matmul ins(%x[k = p], %w[k = ...]) outs(%staging[k = p])
    ...
    hir.wait %work_1 ... hir.wait %work_(D-1)
    hir.reduction "sum" [k] ins(%staging) outs(%out)

Where the reduce-scatter's input is a sum of matmuls' products that add kernels make (a
backward's input gradient), each destination's rows are computed by each of those
matmuls in turn, the first one writing them and the others adding into them
(`hir.matmul accumulate`), and the products, their sums and the kernels are gone.

The copy engines' recv reads, on the peer, the buffer this device sends in the same batch,
at the same place in its symmetric allocation: at step `t` every device sends slice `t` of
`%partial`, which the member `t` ahead reads; slice 0 is left unused (the buffer keeps its
type, so that its other views stay as they are). The staging buffer is this device's
alone (allocated with the buffer of `%partial`, and viewed as `%partial` is of that one),
slice `q` the rows member `q` computed for it, its own among them: the reduction adds them
in team order on every device, as the copy-engine reduce-scatter does. At step
`t` the team's devices send along the ring `t` places ahead, so no two of them read from
the same peer at once.

Rewritten where `ScatteredProduct.match` accepts the reduce-scatter (a copy-engine sum of
matmul products over their scattered batch axis, each product's buffer its matmul's and
its reader's alone, the wait in the same block) and the team, of three members or
more, is consecutive devices (a position's device is then the first's plus the position).
A team of two is `reduce-scatter-in-matmul`'s, which adds its own rows in the GEMM. A
copy-engine reduce-scatter that is left as it is pulls its pieces once the whole product is
computed; `explain=true` says why, one remark per reduce-scatter on stderr.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import builtin
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
from hostir.passes.analysis.loops import RingPositions, index_constant, named
from hostir.passes.analysis.scattered_products import ScatteredProduct

CUDA = hir.CommunicatorBackend.CUDA


def _staging_like(partial: SSAValue, rewriter: PatternRewriter) -> tuple[hir.AllocateOp, list[hir.AliasSelectOp]]:
    """A buffer of this device's own like the buffer that `partial` is a view of, allocated
    after it, and the views that make of it what `partial` is of that buffer: in a stream
    loop, each iteration's slice of one buffer, which later passes may give fewer slices
    (`per-stream-buffers`, `copy-engine-pipelining`), not a buffer per iteration."""
    root = hir.view_root(partial)
    allocation = root.owner
    assert isinstance(allocation, hir.AllocateOp), "ScatteredProduct takes products in buffers of the program"
    staging = named(hir.AllocateOp(tensor_type(root), allocation.dynamic_sizes), "staging")
    staging.location = allocation.location
    rewriter.insert(staging, InsertPoint.after(allocation))
    selections = []
    while partial is not root:
        selections.append(view := partial.owner)
        partial = view.input
    views, value = [], staging.results[0]
    for selection in reversed(selections):
        views.append(view := hir.AliasSelectOp(value, selection.axis.data, selection.index))
        value = view.result
    return staging, views


@dataclass
class ReduceScatterIntoRing(RewritePattern):
    """A copy-engine sum reduce-scatter of a matmul's product over a team of more than two ->
    a matmul and a transfer per destination, and a reduction of the pieces received."""

    explain: bool = False

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.ReduceScatterOp, rewriter: PatternRewriter, /) -> None:
        team, size = op.team_ids, len(op.team_ids)
        other_size = f"its team has {size} member(s); the ring is one of 3 or more" if size < 3 else None
        team_problem = None if RingPositions.serves(team) else f"its team {list(team)} is not consecutive devices"
        product = ScatteredProduct.for_pass("reduce-scatter-ring", op, self.explain, other_size, team_problem)
        if product is None:
            return
        ring = RingPositions.insert(team, product.anchor, rewriter, op.location)
        axis = product.axis
        allocation, staging_views = _staging_like(op.input, rewriter)
        staging = staging_views[-1] if staging_views else allocation
        issued: list[Operation] = [*staging_views]
        works: list[SSAValue] = []
        for t in range(1, size):
            slot = index_constant(rewriter, product.anchor, t)
            to_member = named(hir.AliasSelectOp(op.input, axis, slot), f"to_{t}_ahead")
            from_member = named(hir.AliasSelectOp(staging.results[0], axis, ring.ahead[size - t]), f"from_{t}_behind")
            batch = named(hir.EndCoalescingOp(), f"exchanged_{t}_ahead")
            views, matmuls = product.matmuls_at(ring.ahead[t], ring.zero, to_member.results[0], accumulate=False)
            issued += [
                *views,
                to_member,
                *matmuls,
                from_member,
                hir.StartCoalescingOp(),
                hir.SendOp(to_member.results[0], ring.devices[t], CUDA),
                hir.RecvOp(from_member.results[0], ring.devices[size - t], CUDA),
                batch,
            ]
            works.append(batch.results[0])
        own_rows = named(hir.AliasSelectOp(staging.results[0], axis, ring.own), "own_rows")
        views, matmuls = product.matmuls_at(ring.own, ring.zero, own_rows.results[0], accumulate=False)
        issued += [*views, own_rows, *matmuls]
        reduction = hir.ReductionOp("sum", [axis], False, [staging.results[0]], [op.output])
        reduced = [*(hir.WaitOp(work) for work in works), reduction]
        for new_op in (*issued, *reduced):
            new_op.location = op.location
        rewriter.insert(issued, InsertPoint.before(op))
        rewriter.replace(product.wait, reduced, [])
        rewriter.erase(op)
        product.erase_computation(rewriter)


@dataclass(frozen=True)
class ReduceScatterRing(ModulePass):
    """Sends each destination's rows of a copy-engine reduce-scatter's matmul as soon as they
    are computed, in a team of more than two, and reduces what arrived once."""

    name = "reduce-scatter-ring"

    explain: bool = False

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(ReduceScatterIntoRing(self.explain), apply_recursively=False).rewrite_module(op)
