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

Where the reduce-scatter's input is a sum of matmuls' products that add kernels make (a
backward's input gradient, dq @ wq + dk @ wk), each of those matmuls computes the rows
in turn, the first one writing them and the others adding into them: the peer's rows
into `%to_peer`, the own rows into `%out` after the wait, and the products, their sums
and the kernels are gone.

`copy-engine-pipelining` then software-pipelines a stream loop of such bodies as it does
the reduce-scatter's: the transfer of chunk `i` is in flight while the matmul of chunk
`i + 1`'s peer rows runs, and the own rows' matmul of chunk `i` follows. Rewritten only
where each matmul writes a whole product, in a buffer of the program that nothing else
reads or writes through any of its views (and each sum alike); the wait is the
reduce-scatter's only use, in the same block; the reduction is a sum; and the team is the
mesh of the product (every device that runs the matmul has a peer) (`ScatteredProduct`).
A team of more than two is `reduce-scatter-ring`'s. A copy-engine reduce-scatter that is
left as it is keeps its reduction at the wait; `explain=true` says why, one remark per
reduce-scatter on stderr.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import builtin
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from hostir_dialect import hir
from hostir.passes.analysis.loops import PairPositions
from hostir.passes.analysis.scattered_products import ScatteredProduct

CUDA = hir.CommunicatorBackend.CUDA


@dataclass
class ReduceScatterIntoMatmul(RewritePattern):
    """A pairwise copy-engine sum reduce-scatter of a matmul's product -> a transfer of the
    peer's rows and an accumulating matmul of the own rows."""

    explain: bool = False

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.ReduceScatterOp, rewriter: PatternRewriter, /) -> None:
        other_size = (
            None
            if PairPositions.serves(op.team_ids)
            else f"its team has {len(op.team_ids)} members; the exchange is one of a pair"
        )
        product = ScatteredProduct.for_pass("reduce-scatter-in-matmul", op, self.explain, other_size)
        if product is None:
            return
        positions = PairPositions.insert(op.team_ids, product.anchor, rewriter, op.location)
        to_peer = hir.AliasSelectOp(op.input, product.axis, positions.zero)
        to_peer.result.name_hint = "to_peer"
        views, matmuls = product.matmuls_at(positions.peer, positions.zero, to_peer.result, accumulate=False)
        peer_rows = [*views, to_peer, *matmuls]
        batch = hir.EndCoalescingOp()
        batch.work.name_hint = "exchanged"
        transfer = [
            hir.StartCoalescingOp(),
            hir.SendOp(to_peer.result, positions.peer_device, CUDA),
            hir.RecvOp(op.output, positions.peer_device, CUDA),
            batch,
        ]
        views, matmuls = product.matmuls_at(positions.own, positions.zero, op.output, accumulate=True)
        own_rows = [*views, *matmuls]
        for new_op in (*peer_rows, *transfer, *own_rows):
            new_op.location = op.location
        # The peer's rows are multiplied where the product was, the own rows after the wait.
        rewriter.insert(peer_rows, InsertPoint.before(product.last))
        rewriter.insert(transfer, InsertPoint.before(op))
        rewriter.insert(own_rows, InsertPoint.after(product.wait))
        rewriter.replace(op, [], [batch.work])
        product.erase_computation(rewriter)


@dataclass(frozen=True)
class ReduceScatterInMatmul(ModulePass):
    """Sums the two pieces of a pairwise copy-engine reduce-scatter of a matmul's product in
    the epilogue of the matmul, instead of in a pass of its own after the transfer."""

    name = "reduce-scatter-in-matmul"

    explain: bool = False

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(ReduceScatterIntoMatmul(self.explain), apply_recursively=False).rewrite_module(op)
