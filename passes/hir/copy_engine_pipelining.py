"""`copy-engine-pipelining`: a stream loop whose transfers the copy engines make runs on the
caller's stream, each iteration issuing its transfers before finishing the one before.

`stream-parallel` spreads the iterations of a loop over pool streams so that NCCL's
kernels, which need SMs, run beside the compute of other iterations. The copy engines
need no such spread: their transfers run on a copy stream of their own and take no SMs
(docs/copy-engine.md). Spread over streams, the iterations' GEMMs run at once instead,
sharing the SMs: in AG+GEMM every chunk's GEMM starts as soon as its data has landed,
beside the GEMM before it, and in GEMM+RS and GEMM+AR every GEMM starts with the run,
so every transfer waits for the end of them all (docs/benchmarks.md, the timelines of
2 H200). On one stream the GEMMs run one after the other, and the loop is software-
pipelined so that the transfer of an iteration is in flight while the GEMM of another
runs. A work loop of `stream-parallel` (with its synchronisation loop) whose body is

    A(i): views and compute, up to and including  %w = <communication> backend cuda
    hir.wait %w
    B(i): the rest

(or whose A issues several copy-engine transfers, each waited for by one of the waits that
end A: `reduce-scatter-ring`'s exchanges with each peer, all carried alike)

becomes, on the caller's stream,

    scf.if (extent > 0) {
      A(0)
      %last = scf.for %i = 1 to extent iter_args(%previous = %w of A(0)) {
        A(i)
        hir.wait %previous; B(i - 1)
        scf.yield %w of A(i)
      }
      hir.wait %last; B(extent - 1)
    }

AG+GEMM: A is the chunk's allgather and B its GEMM, so the transfer of chunk `i` is in
flight during the GEMM of chunk `i - 1`. GEMM+RS and GEMM+AR: A is the chunk's GEMM and
its transfer, and the GEMM of chunk `i` runs while chunk `i - 1` is in flight, whose
reduction (at its wait) follows. The iterations of a stream loop are independent (they
run at once on the pool streams), so A(i) may run before B(i - 1). A transfer's copy
stream waits for what the caller's stream was given before it, A(0..i-1) and
B(0..i-2): transfer `i` starts once B(i-2) is done. So a buffer that only the loop
slices, at its iteration, needs two slices, not one per iteration: iteration `i` uses
slice `i mod 2`, whose last reader B(i-2) the caller's stream ran before (the rewritten
loop is no stream loop for `per-stream-buffers`, so this pass does it, with
`per-stream-buffers`' re-allocation; `share_slices=false` keeps one slice per
iteration). The ring below keeps one slice per mesh device: its slices are slots
`(p + i) mod D`, not iterations.

B uses values of A (an iteration's slices): their defining views and index arithmetic
are cloned for `i - 1`. A loop is rewritten only where that is all B uses of A, where
its communication before the first wait is one direct op of the body with `backend
cuda`, and where the body does not use the pool stream it was given. B may issue one
more copy-engine transfer of its own whose wait ends B (`allreduce-in-matmul`'s pull of
the sums back): that wait is put off, its work carried to the next iteration, which
waits for it after its A (so that it holds up no GEMM of A), and after the loop the last
two are waited for after the last B:

    %last:2 = scf.for %i = 1 to extent iter_args(%previous = %w of A(0), %deferred = %w of A(0)) {
      A(i)
      hir.wait %previous; hir.wait %deferred; B'(i - 1)      B' issues %v and ends before its wait
      scf.yield %w of A(i), %v of B'(i - 1)
    }
    hir.wait %last#0; B'(extent - 1); hir.wait %last#1; hir.wait %v of B'(extent - 1)

The first iteration has no deferred transfer before it and waits for A(0)'s twice (a
second wait does nothing).

The ring loop of the point-to-point allgather with `p2p_backend=cuda` (stream-parallel's
module docstring) is rewritten the same way, its iteration 0 (the own shard, no
transfer) peeled: over a mesh of D devices,

    A(1)                                   the exchange of iteration 1
    own(0)                                 the own shard's copy, and B(0): its GEMM
    %last = scf.for %i = 2 to D iter_args(%previous = %w of A(1)) {
      A(i); hir.wait %previous; B(i - 1)
    }
    hir.wait %last; B(D - 1)

A(i) is the ring body up to its `scf.if` and the exchange of its `else` without the
wait, so the peer's shard is in flight while the own shard's GEMM runs, and the GEMMs
run one after the other. Where the gathered buffer is an intermediate that only the
ring's view of it uses (AG+GEMM, not an allgather whose result is returned), own(0)
reads the own shard in place instead of copying it into its slot first: that slot is
read by B(0) alone.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, builtin, scf
from xdsl.dialects.builtin import IndexType, LocationAttr
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.traits import is_side_effect_free

from hostir_dialect import hir
from hostir_dialect.fusion import tensor_type
from hostir.passes.analysis.buffers import fewer_slices, is_private_allocation
from hostir.passes.analysis.extents import known_extent
from hostir.passes.analysis.loops import StreamLoop, index_constant, recomputable

TRANSFER_OPS = (hir.CommunicationOp, hir.P2POp, hir.EndCoalescingOp, hir.WaitOp)


def _clone(ops: Sequence[Operation], mapping: dict[SSAValue, SSAValue], block: Block) -> None:
    """Appends clones of `ops` to `block`, reading and extending `mapping`."""
    for op in ops:
        block.add_op(op.clone(mapping))


def _transfers(ops: Sequence[Operation]) -> list[Operation]:
    """The communications, batches and waits in `ops`, nested ones included."""
    return [inner for op in ops for inner in op.walk() if isinstance(inner, TRANSFER_OPS)]


@dataclass
class Stages:
    """A stream loop's body split for software pipelining: A issues the iteration's transfers,
    B is what follows their waits."""

    induction: SSAValue
    issue: list[Operation]
    """A(i), whose ops' `works` are the transfers' works."""
    works: list[SSAValue]
    views: list[Operation]
    """The ops of A that B reads: views and index arithmetic, cloned for B's iteration."""
    finish: list[Operation]
    """B(i)."""
    location: LocationAttr
    """The wait's."""
    reads_induction: bool
    """Whether B reads the iteration index, which it then gets as `i - 1`."""
    deferred: hir.WaitOp | None = None
    """The wait that ended B, for a transfer B issues, put off to the next iteration."""

    @staticmethod
    def split(
        induction: SSAValue,
        issue: list[Operation],
        works: list[SSAValue],
        finish: list[Operation],
        location: LocationAttr,
        deferred: hir.WaitOp | None = None,
    ) -> Stages | None:
        """The stages, if B reads nothing of A but views and index arithmetic."""
        defined = {result: op for op in issue for result in op.results}
        needed: set[Operation] = set()
        pending = [operand for op in finish for inner in op.walk() for operand in inner.operands]
        while pending:
            definer = defined.get(pending.pop())
            if definer is None or definer in needed:
                continue
            if not recomputable(definer):
                return None
            needed.add(definer)
            pending.extend(definer.operands)
        views = [op for op in issue if op in needed]
        reads_induction = any(
            operand is induction for op in (*views, *finish) for inner in op.walk() for operand in inner.operands
        )
        return Stages(induction, issue, works, views, finish, location, reads_induction, deferred)

    def issue_at(self, index: SSAValue, block: Block) -> list[SSAValue]:
        """Appends A(index) to `block`; its works."""
        mapping: dict[SSAValue, SSAValue] = {self.induction: index}
        _clone(self.issue, mapping, block)
        return [mapping[work] for work in self.works]

    def finish_at(
        self, index: SSAValue, works: Sequence[SSAValue], block: Block
    ) -> SSAValue | None:
        """Appends, for iteration `index`: B's views of A, the waits for `works` (the transfers
        of iteration `index`, and the deferred one of an iteration before), and B; the work
        of B's deferred transfer."""
        mapping: dict[SSAValue, SSAValue] = {self.induction: index}
        _clone(self.views, mapping, block)
        for work in works:
            wait = hir.WaitOp(work)
            wait.location = self.location
            block.add_op(wait)
        _clone(self.finish, mapping, block)
        return None if self.deferred is None else mapping[self.deferred.work]

    def pipeline(
        self,
        start: SSAValue,
        end: SSAValue,
        first_works: list[SSAValue],
        one: SSAValue,
        block: Block,
        location: LocationAttr,
    ) -> None:
        """Appends `for i = start to end {A(i); finish i - 1}` and the finish of `end - 1`, given
        the works of iteration `start - 1`; the loop and its index arithmetic at `location`.

        A deferred transfer of B(i - 1) is carried to iteration `i + 1`, which waits for it
        with the transfers of A(i): by then A(i + 1) is issued, so the wait holds up no GEMM
        of A. The first iteration has no deferred transfer before it: it is given a
        transfer of A(start - 1), which it waits for anyway (a second wait does nothing)."""
        count = len(first_works)
        carried = [*first_works, *([] if self.deferred is None else first_works[:1])]
        body = Block(arg_types=[IndexType(), *(hir.WorkType() for _ in carried)])
        index, *previous = body.args
        index.name_hint = self.induction.name_hint
        for i, argument in enumerate(previous):
            argument.name_hint = "previous_work" if i < count else "previous_deferred_work"
        works = self.issue_at(index, body)
        deferred = self.finish_at(self._minus_one(index, one, body, location), previous, body)
        body.add_op(yield_work := scf.YieldOp(*works, *([] if deferred is None else [deferred])))
        loop = scf.ForOp(start, end, one, carried, body)
        for i, result in enumerate(loop.results):
            result.name_hint = "last_work" if i < count else "last_deferred_work"
        yield_work.location = loop.location = location
        block.add_op(loop)
        last_works, last_deferred = loop.results[:count], loop.results[count:]
        deferred = self.finish_at(self._minus_one(end, one, block, location), last_works, block)
        if deferred is not None:
            # Nothing is issued after the last B: both its transfer and the one before are waited
            # for after it, so that it does not wait for the one before (the loop's B waits for
            # that once the next A is issued).
            for work in (*last_deferred, deferred):
                last_wait = hir.WaitOp(work)
                last_wait.location = self.deferred.location
                block.add_op(last_wait)

    def _minus_one(self, index: SSAValue, one: SSAValue, block: Block, location: LocationAttr) -> SSAValue:
        """`index - 1` for B's iteration, appended to `block` where B reads the iteration index."""
        if not self.reads_induction:
            return index
        subtraction = arith.SubiOp(index, one)
        subtraction.location = location
        block.add_op(subtraction)
        return subtraction.result


def _work_ops(loop: StreamLoop) -> list[Operation] | None:
    """The body of `loop` between its prologue and epilogue, if it does not use the pool
    stream it was given."""
    work = list(loop.loop.body.block.ops)[len(loop.prologue) : -len(loop.epilogue) - 1]
    given = {result for op in loop.prologue for result in op.results}
    if any(operand in given for top in work for op in top.walk() for operand in op.operands):
        return None
    return work


@dataclass
class StreamLoopPattern(RewritePattern):
    """A pattern on the work loops of stream-parallel that start at 0 by steps of 1; the
    rewrite replaces the loop and its synchronisation loop by ops on the caller's stream."""

    share_slices: bool = True
    """Whether the buffers that only the loop slices get two slices (`_chunk_buffers`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scf.ForOp, rewriter: PatternRewriter, /) -> None:
        loop = StreamLoop.match(op)
        if loop is None or loop.is_sync_loop or known_extent(op.lb) != 0 or known_extent(op.step) != 1:
            return
        work = _work_ops(loop)
        if work is None:
            return
        # Found before the rewrite clones their views.
        chunk_buffers = _chunk_buffers(op, work) if self.share_slices else []
        new_ops = self.rewrite(op, work, rewriter)
        if new_ops is None:
            return
        replaced = [op] + ([] if (sync_loop := loop.sync_loop()) is None else [sync_loop.loop])
        outside = list(
            dict.fromkeys(
                operand.owner
                for loop_op in replaced
                for inner in loop_op.walk()
                for operand in inner.operands
                if isinstance(operand.owner, Operation) and not loop_op.is_ancestor(operand.owner)
            )
        )
        rewriter.replace(op, new_ops)
        for loop_op in replaced[1:]:
            rewriter.erase(loop_op)
        # What only the stream loops used (the caller's stream, the number of streams, the
        # loops' bounds) goes with them, so that a second run of the pass changes nothing.
        for definer in outside:
            if not any(result.uses for result in definer.results) and (
                is_side_effect_free(definer) or isinstance(definer, hir.GetCurrentStreamOp)
            ):
                rewriter.erase(definer)
        for allocation in chunk_buffers:
            two = index_constant(rewriter, allocation, 2)
            buffer = fewer_slices(allocation, two, rewriter)
            for use in list(buffer.uses):
                if isinstance(view := use.operation, hir.AliasSelectOp):
                    slot = arith.RemUIOp(view.index, two)
                    slot.location = view.location
                    rewriter.insert(slot, InsertPoint.before(view))
                    view.operands = [view.input, slot.result]
                    rewriter.notify_op_modified(view)

    @abstractmethod
    def rewrite(self, op: scf.ForOp, work: list[Operation], rewriter: PatternRewriter) -> list[Operation] | None:
        """The ops that replace `op`, whose body without the stream ops is `work`; None to leave it."""


def _copy_engine_transfers(waits: Sequence[hir.WaitOp], work: Sequence[Operation]) -> bool:
    """Whether what `waits` wait for are all the transfers in `work` (`waits` aside), each a
    copy-engine collective or a batch of copy-engine sends and recvs, directly in `work`."""
    covered: list[Operation] = []
    for wait in waits:
        transfer = wait.work.owner
        if transfer not in work:
            return False
        if isinstance(transfer, hir.EndCoalescingOp):
            # The batch: the sends and recvs right between its start and its end, nothing else.
            end = work.index(transfer)
            start = end - 1
            while start >= 0 and isinstance(work[start], hir.P2POp):
                start -= 1
            batch = work[start + 1 : end]
            if start < 0 or not isinstance(work[start], hir.StartCoalescingOp) or not batch:
                return False
            if not all(hir.uses_copy_engines(o) for o in batch):
                return False
            covered += [*batch, transfer]
        elif hir.uses_copy_engines(transfer):
            covered.append(transfer)
        else:
            return False
    others = [o for o in _transfers(work) if o not in waits]
    return len(others) == len(covered) and set(others) == set(covered)


def _deferred_wait(finish: Sequence[Operation]) -> hir.WaitOp | None:
    """The wait that ends B, if it waits for B's one transfer, a copy-engine one directly in
    B (`allreduce-in-matmul`'s pull of the sum back): nothing in B follows it, so it may be
    put off to the next iteration."""
    if finish and isinstance(wait := finish[-1], hir.WaitOp) and _copy_engine_transfers([wait], finish[:-1]):
        return wait
    return None


class PipelineCollectiveLoop(StreamLoopPattern):
    """A loop whose transfers before its first waits are copy-engine collectives or batches of
    copy-engine sends and recvs (one for `reduce-scatter-in-matmul`, one per peer for
    `reduce-scatter-ring`), directly in its body and waited for by the waits that follow
    them, and that after those waits issues at most one more, whose wait ends the body
    (`allreduce-in-matmul`'s)."""

    def rewrite(self, op: scf.ForOp, work: list[Operation], rewriter: PatternRewriter) -> list[Operation] | None:
        wait = next((o for o in work if isinstance(o, hir.WaitOp)), None)
        if wait is None:
            return None
        position = end = work.index(wait)
        while end < len(work) and isinstance(work[end], hir.WaitOp):
            end += 1
        waits = work[position:end]
        issue, finish = work[:position], work[end:]
        # B issues no transfer, or one whose wait ends it (`_deferred_wait` checks it is B's only one).
        deferred = _deferred_wait(finish)
        if deferred is not None:
            finish = finish[:-1]
        elif _transfers(finish):
            return None
        if not _copy_engine_transfers(waits, issue):
            return None
        works = [w.work for w in waits]
        stages = Stages.split(op.body.block.args[0], issue, works, finish, wait.location, deferred)
        if stages is None:
            return None
        one = index_constant(rewriter, op, 1)
        nonempty = arith.CmpiOp(op.ub, op.lb, "ugt")
        nonempty.result.name_hint = "nonempty"
        then = Block()
        first_works = stages.issue_at(op.lb, then)
        stages.pipeline(one, op.ub, first_works, one, then, op.location)
        then.add_op(then_yield := scf.YieldOp())
        otherwise = scf.YieldOp()
        guard = scf.IfOp(nonempty.result, [], Region(then), Region(Block([otherwise])))
        for new_op in (nonempty, then_yield, otherwise, guard):
            new_op.location = op.location
        return [nonempty, guard]


class PipelineRingLoop(StreamLoopPattern):
    """The ring loop of a copy-engine point-to-point allgather over a mesh of 2 or more."""

    def rewrite(self, op: scf.ForOp, work: list[Operation], rewriter: PatternRewriter) -> list[Operation] | None:
        induction = op.body.block.args[0]
        branches = [o for o in work if isinstance(o, scf.IfOp)]
        size = known_extent(op.ub)
        if len(branches) != 1 or not isinstance(size, int) or size < 2:
            return None
        (branch,) = branches
        condition = branch.cond.owner
        if not (
            isinstance(condition, arith.CmpiOp)
            and arith.CMPI_COMPARISON_OPERATIONS[condition.predicate.value.data] == "eq"
            and condition.lhs is induction
            and known_extent(condition.rhs) == 0
        ):
            return None
        own = list(branch.true_region.block.ops)[:-1]
        exchange = list(branch.false_region.block.ops)[:-1]
        wait = exchange[-1] if exchange else None
        if (
            _transfers(own)
            or not isinstance(wait, hir.WaitOp)
            or not isinstance(wait.work.owner, hir.EndCoalescingOp)
            or wait.work.owner not in exchange
            or len(_transfers(work)) != len(_transfers(exchange))
            or any(not hir.uses_copy_engines(o) for o in exchange if isinstance(o, hir.P2POp))
        ):
            return None
        position = work.index(branch)
        # The branch's condition goes with the branch, unless something else reads it.
        before = [o for o in work[:position] if not (o is condition and condition.result.has_one_use())]
        after = work[position + 1 :]
        stages = Stages.split(induction, before + exchange[:-1], [wait.work], after, wait.location)
        if stages is None:
            return None
        in_place = _own_shard_in_place(before, own)
        one, two = index_constant(rewriter, op, 1), index_constant(rewriter, op, 2)
        block = Block()
        first_works = stages.issue_at(one, block)
        mapping: dict[SSAValue, SSAValue] = {induction: op.lb}
        if in_place is None:
            _clone(before + own + after, mapping, block)
        else:
            slot, shard = in_place
            _clone([o for o in before if o is not slot] + [shard], mapping, block)
            mapping[slot.result] = mapping[shard.result]
            _clone(after, mapping, block)
        stages.pipeline(two, op.ub, first_works, one, block, op.location)
        return [block.detach_op(new_op) for new_op in list(block.ops)]


def _chunk_buffers(op: scf.ForOp, work: Sequence[Operation]) -> list[hir.AllocateOp]:
    """The buffers that only the loop `op` slices, each iteration its own slice along the
    stream axis: once the loop is pipelined two slices do, slice `i mod 2` for iteration
    `i`. The caller's stream runs B(i - 2), the last to read slice `i mod 2`, before A(i)
    and before the transfer of A(i) (whose copy stream waits for the caller's), so the
    next writer of a slice waits for its last reader, as in `per-stream-buffers`."""
    induction = op.body.block.args[0]
    views = [o for o in work if isinstance(o, hir.AliasSelectOp) and o.index is induction]
    buffers = []
    for allocation in dict.fromkeys(view.input.owner for view in views):
        if not is_private_allocation(allocation) or (axis := tensor_type(allocation.result).stream_axis) is None:
            continue
        if all(
            isinstance(user := use.operation, hir.DimOp)
            or (user in views and user.axis.data == axis)
            for use in allocation.result.uses
        ):
            buffers.append(allocation)
    return buffers


def _own_shard_in_place(
    before: Sequence[Operation], own: Sequence[Operation]
) -> tuple[hir.AliasSelectOp, hir.AliasSelectOp] | None:
    """(the slot's view, the own shard's view) where the own shard's iteration may read the
    shard in place instead of copying it into its slot: the own branch is that copy of a
    view, and the buffer of the slot is an intermediate that nothing but the ring's view of
    it uses (its slot of the own shard is then never read again)."""
    if len(own) != 2 or not isinstance(shard := own[0], hir.AliasSelectOp):
        return None
    copy = own[1]
    if not isinstance(copy, hir.CopyOp) or copy.ins[0] is not shard.result:
        return None
    slot = copy.outs[0].owner
    if not isinstance(slot, hir.AliasSelectOp) or slot not in before or slot.result.type != shard.result.type:
        return None
    allocation = slot.input.owner
    if not is_private_allocation(allocation):
        return None
    if any(
        use.operation is not slot and not isinstance(use.operation, hir.DimOp | hir.DeallocateOp)
        for use in allocation.result.uses
    ):
        return None
    return slot, shard


@dataclass(frozen=True)
class CopyEnginePipelining(ModulePass):
    """Software-pipelines each stream loop of copy-engine transfers on the caller's stream.

    The transfer of one iteration is in flight while the one before is finished."""

    name = "copy-engine-pipelining"

    share_slices: bool = True
    """Give a buffer that only a pipelined collective loop slices two slices, not one per
    iteration (`false`: as `per-stream-buffers=false` keeps the reference allocations)."""

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        patterns = [PipelineCollectiveLoop(self.share_slices), PipelineRingLoop(self.share_slices)]
        PatternRewriteWalker(GreedyRewritePatternApplier(patterns), apply_recursively=False).rewrite_module(op)
