"""`allreduce-in-matmul`: a copy-engine allreduce of a matmul's product over a team of two,
chunk by chunk, becomes chunks whose sum is made in the GEMM's epilogue, the roles of the
two devices alternating with the chunk's parity (docs/copy-engine.md, *The sum in the
GEMM*).

The copy-engine allreduce of a pair pulls the peer's whole partial and, at its wait, adds
the two in a pass of its own on the SMs between two GEMMs; the last chunk's pull and sum
follow the last GEMM. Instead, each chunk's plain GEMM runs on one device and is pulled by
the other, whose GEMM of the same chunk adds into what it pulled (`hir.matmul
accumulate`, cuBLAS's beta = 1), and the sum is pulled back. Chunk `c`'s plain GEMM runs
on the device at team position `c mod 2`. The stream loop of `stream-parallel` then
iterates over pairs of chunks, both devices alike: pair `j` is chunks `2j` and `2j + 1`,
of which the device at position `own` multiplies chunk `2j + own` for its peer and adds
its product of chunk `2j + peer` to the peer's:

    scf.for %i = 0 to %chunks {
      hir.matmul ins(%x[%i], %w) outs(%partial[%i])
      %work = hir.allreduce %partial[%i] into %out[%i] team [a, b] op sum backend cuda
      hir.wait %work
    }

becomes (`%partial` is symmetric: the peers read it)

    scf.for %j = 0 to %chunks / 2 {
      hir.matmul ins(%x[2j + own], %w) outs(%partial[2j])
      batch { send %partial[2j] to peer; recv %partial[2j + 1] from peer }   -> %exchanged
      hir.wait %exchanged
      hir.matmul accumulate ins(%x[2j + peer], %w) outs(%partial[2j + 1])
      batch { send %sum to peer; recv %out[2j + own] from peer }           -> %summed
      hir.copy ins(%sum) outs(%out[2j + peer])
      hir.wait %summed
    }
    scf.if (%chunks is odd) { the last chunk as before: its matmul, allreduce and wait }

with `%sum` the local shard of `%partial[2j + 1]`. A copy-engine recv reads, on the peer,
the buffer that this device sends in its batch, at the same place of its symmetric
allocation, so both devices send the same slices: slice `2j` holds the product that each
sends its peer, slice `2j + 1` the sum that each makes for its peer. The sum must be in
symmetric memory for the peer to pull it, and the output is returned (a symmetric buffer
is reused by the next run), so the device that made it copies it into its output: one
local pass over a chunk per pair, a third of the memory traffic of the two sums it
replaces. An odd last chunk keeps its allreduce.

`copy-engine-pipelining` then software-pipelines the loop of pairs: pair `j`'s plain GEMM
and exchange are issued before pair `j - 1`'s accumulating GEMM, whose product was pulled
during the plain GEMM, and the wait for the sum's pull back is put off until the next
pair's plain GEMM has been issued.

Rewritten only where the allreduce sums, its team of two is the mesh of its input, its
input is the whole product of one plain matmul into a buffer of the program that nothing
else uses, its one use is a wait in the same block with only views and index arithmetic
in between, and all three sit in the body of a stream loop (from 0 by steps of 1) that
does nothing else but make views and indices, with the input and the output the
iteration's slices of their buffers' stream axes. Each other copy-engine allreduce is
left as it is; `explain=true` says why, one remark per allreduce on stderr.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, builtin, scf
from xdsl.dialects.shard import ReductionKind
from xdsl.ir import Block, Operation, Region, SSAValue
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
from hostir_dialect.text import remark
from hostir.passes.analysis.buffers import in_function_body, nothing_writes_between, product_of
from hostir.passes.analysis.extents import known_extent
from hostir.passes.analysis.loops import PairPositions, StreamLoop, index_constant, recomputable

CUDA = hir.CommunicatorBackend.CUDA


@dataclass
class _Chunked:
    """A GEMM+AR chunk of a stream loop that the pass rewrites."""

    loop: StreamLoop
    work: list[Operation]
    """The loop's body between its stream prologue and epilogue."""
    matmul: hir.MatmulOp
    allreduce: hir.AllreduceOp
    partial: hir.AliasSelectOp
    """The iteration's slice of the partial sums."""
    out: hir.AliasSelectOp
    """The iteration's slice of the output."""


def _iteration_slice(value: SSAValue, induction: SSAValue) -> hir.AliasSelectOp | None:
    """The view that makes `value` the slice at `induction` of a buffer's stream axis."""
    view = value.owner
    if (
        isinstance(view, hir.AliasSelectOp)
        and view.index is induction
        and tensor_type(view.input).stream_axis == view.axis.data
    ):
        return view
    return None


def _match(op: hir.AllreduceOp) -> _Chunked | str:
    """What the rewrite needs, or why the allreduce is left as it is."""
    team = op.team_ids
    if op.reduce_op is None or op.reduce_op.data != ReductionKind.SUM:
        return "its reduction is not a sum, which a GEMM's epilogue cannot make"
    if not PairPositions.serves(team):
        return f"its team has {len(team)} members; the schedule is one of a pair"
    if sorted(tensor_type(op.input).mesh.ids) != sorted(team):
        return "its team is not the mesh of its input, so a device of the product would have no peer"
    matmul = product_of(op, op.input)
    if matmul is None:
        return (
            "its input is not the whole product of one plain matmul before it, into a buffer "
            "of the program that nothing else reads or writes"
        )
    waits = [use.operation for use in op.work.uses]
    if len(waits) != 1 or not isinstance(wait := waits[0], hir.WaitOp) or wait.parent is not op.parent:
        return "its work is not waited for once, in its own block"
    if not nothing_writes_between(matmul, wait, {op}):
        return "something between its matmul and its wait does more than make views and indices"
    loop = StreamLoop.match(op.parent_op())
    if (
        loop is None
        or loop.is_sync_loop
        or known_extent(loop.loop.lb) != 0
        or known_extent(loop.loop.step) != 1
        or in_function_body(loop.loop) is not loop.loop
    ):
        return (
            "it is not in the body of a stream loop of the function (from 0 by steps of 1), "
            "whose chunks the schedule pairs"
        )
    induction = loop.loop.body.block.args[0]
    partial, out = _iteration_slice(op.input, induction), _iteration_slice(op.output, induction)
    if partial is None or out is None:
        return "its input and output are not the iteration's slices of their buffers' stream axes"
    work = list(loop.loop.body.block.ops)[len(loop.prologue) : -len(loop.epilogue) - 1]
    if any(o not in (matmul, op, wait) and not recomputable(o) for o in work):
        return (
            "its loop does more than this matmul and allreduce (its other work would need "
            "pairs of chunks too)"
        )
    given = {result for prologue_op in loop.prologue for result in prologue_op.results}
    if any(operand in given for o in work for operand in o.operands):
        return "its loop's work uses the pool stream it runs on"
    return _Chunked(loop, work, matmul, op, partial, out)


def _at(
    ops: Sequence[Operation], induction: SSAValue, index: SSAValue, values: Sequence[SSAValue]
) -> tuple[list[Operation], list[SSAValue]]:
    """Clones of the ops of `ops` that `values` need, with `index` for `induction`, and
    `values` as those clones compute them."""
    defined = {result: op for op in ops for result in op.results}
    needed: set[Operation] = set()
    pending = list(values)
    while pending:
        definer = defined.get(pending.pop())
        if definer is not None and definer not in needed:
            needed.add(definer)
            pending.extend(definer.operands)
    mapping: dict[SSAValue, SSAValue] = {induction: index}
    clones = [op.clone(mapping) for op in ops if op in needed]
    return clones, [mapping.get(value, value) for value in values]


def _view(buffer: SSAValue, axis: int, index: SSAValue, name: str) -> hir.AliasSelectOp:
    view = hir.AliasSelectOp(buffer, axis, index)
    view.result.name_hint = name
    return view


def _exchange(send: SSAValue, recv: SSAValue, peer: SSAValue, name: str) -> list[Operation]:
    """The batch that lets the peer read `send` and reads the peer's `send` into `recv`."""
    end = hir.EndCoalescingOp()
    end.work.name_hint = name
    return [hir.StartCoalescingOp(), hir.SendOp(send, peer, CUDA), hir.RecvOp(recv, peer, CUDA), end]


class AllreduceIntoMatmuls(RewritePattern):
    """A pairwise copy-engine sum allreduce of a matmul's product, in a stream loop -> a loop
    over pairs of chunks, each device's plain matmul of one pulled by its peer, whose
    accumulating matmul of the same chunk makes the sum, pulled back."""

    def __init__(self, explain: bool = False):
        self.explain = explain

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.AllreduceOp, rewriter: PatternRewriter, /) -> None:
        if op.backend.data != CUDA:
            return
        chunked = _match(op)
        if isinstance(chunked, str):
            if self.explain:
                remark(op, f"allreduce-in-matmul leaves this {op.name}: {chunked}")
            return
        _rewrite(chunked, rewriter)


def _rewrite(chunked: _Chunked, rewriter: PatternRewriter) -> None:
    loop, op, matmul = chunked.loop, chunked.allreduce, chunked.matmul
    induction, location = loop.loop.body.block.args[0], op.location
    chunks = loop.loop.ub
    start = loop.start
    one, two = index_constant(rewriter, start, 1), index_constant(rewriter, start, 2)
    positions = PairPositions.insert(op.team_ids, start, rewriter, location)

    # An odd last chunk keeps its allreduce, after the loop, on the caller's stream.
    pairs, odd = arith.DivUIOp(chunks, two), arith.RemUIOp(chunks, two)
    has_last = arith.CmpiOp(odd.result, positions.zero, "ne")
    pairs.result.name_hint, odd.result.name_hint, has_last.result.name_hint = "pairs", "odd", "has_last_chunk"
    last = arith.SubiOp(chunks, one)
    last.result.name_hint = "last_chunk"
    last_body = Block([last])
    mapping: dict[SSAValue, SSAValue] = {induction: last.result}
    for work_op in chunked.work:
        last_body.add_op(work_op.clone(mapping))
    last_body.add_op(scf.YieldOp())
    last_chunk = scf.IfOp(has_last.result, [], Region(last_body), Region(Block([scf.YieldOp()])))

    # Pair j: chunks 2j + own (multiplied for the peer) and 2j + peer (added to the peer's).
    twice = arith.MuliOp(induction, two)
    sum_slice = arith.AddiOp(twice.result, one)
    own_chunk, peer_chunk = arith.AddiOp(twice.result, positions.own), arith.AddiOp(twice.result, positions.peer)
    names = ("pair_start", "sum_slice", "own_chunk", "peer_chunk")
    for new_op, name in zip((twice, sum_slice, own_chunk, peer_chunk), names):
        new_op.result.name_hint = name
    partial, out = chunked.partial.input, chunked.out.input
    partial_axis, out_axis = chunked.partial.axis.data, chunked.out.axis.data
    own_views, own_operands = _at(chunked.work, induction, own_chunk.result, matmul.ins)
    to_peer = _view(partial, partial_axis, twice.result, "to_peer")
    for_peer = _view(partial, partial_axis, sum_slice.result, "for_peer")
    exchanged = _exchange(to_peer.result, for_peer.result, positions.peer_device, "exchanged")
    peer_views, peer_operands = _at(chunked.work, induction, peer_chunk.result, matmul.ins)
    total = _view(for_peer.result, tensor_type(for_peer.result).didx_axis, positions.zero, "sum")
    own_out = _view(out, out_axis, own_chunk.result, "own_out")
    peer_out = _view(out, out_axis, peer_chunk.result, "peer_out")
    summed = _exchange(total.result, own_out.result, positions.peer_device, "summed")
    new_work = [
        twice,
        sum_slice,
        own_chunk,
        peer_chunk,
        *own_views,
        to_peer,
        hir.MatmulOp(own_operands, [to_peer.result]),
        for_peer,
        *exchanged,
        hir.WaitOp(exchanged[-1].results[0]),
        *peer_views,
        hir.MatmulOp(peer_operands, [for_peer.result], accumulate=True),
        total,
        own_out,
        peer_out,
        *summed,
        hir.CopyOp([total.result], [peer_out.result]),
        hir.WaitOp(summed[-1].results[0]),
    ]
    for new_op in (pairs, odd, has_last, last, last_chunk, *new_work):
        new_op.location = location
    rewriter.insert([pairs, odd, has_last], InsertPoint.before(start))
    rewriter.insert(last_chunk, InsertPoint.after(loop.loop))
    for stream_loop in {loop.loop, start}:
        stream_loop.operands = [stream_loop.lb, pairs.result, stream_loop.step, *stream_loop.iter_args]
        rewriter.notify_op_modified(stream_loop)
    rewriter.insert(new_work, InsertPoint.before(chunked.work[0]))
    for old in reversed(chunked.work):
        rewriter.erase(old)


@dataclass(frozen=True)
class AllreduceInMatmul(ModulePass):
    """Makes the sum of a pairwise copy-engine allreduce of a matmul's product, chunk by
    chunk, in the epilogue of the GEMMs, the devices' roles alternating per chunk."""

    name = "allreduce-in-matmul"

    explain: bool = False
    """Say on stderr why each copy-engine allreduce that is left is left."""

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(AllreduceIntoMatmuls(self.explain), apply_recursively=False).rewrite_module(op)
