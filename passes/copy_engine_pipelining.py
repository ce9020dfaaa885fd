"""`copy-engine-pipelining`: a stream loop whose transfer the copy engines make runs on the
caller's stream, each iteration issuing its transfer before finishing the one before.

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
reduction (at its wait) follows. A transfer's copy stream waits for what the caller's
stream was given before it, that is A(0..i-1) and B(0..i-2), so transfer `i` starts
once B(i-2) is done with the memory it shares (a per-stream buffer's slot), never later.

B uses values of A (an iteration's slices): their defining views and index arithmetic
are cloned for `i - 1`. A loop is rewritten only where that is all B uses of A, where
its one communication is a direct op of the body with `backend cuda` and its wait the
only one, and where the body does not use the pool stream it was given.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.context import Context
from xdsl.dialects import arith, builtin, scf
from xdsl.dialects.builtin import IndexType, IntegerAttr
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.traits import is_side_effect_free

from hostir_dialect import hir
from passes.stream_parallel import StreamLoop


def _is_constant(value: SSAValue, number: int) -> bool:
    return (
        isinstance(value.owner, arith.ConstantOp)
        and isinstance(value.owner.value, IntegerAttr)
        and value.owner.value.value.data == number
    )


def _recomputable(op: Operation) -> bool:
    """Ops that B may read from A: they only name a view or an index, so cloning them is free."""
    return isinstance(op, hir.AliasSelectOp) or (is_side_effect_free(op) and not op.regions)


def _split(loop: StreamLoop) -> tuple[list[Operation], list[Operation], list[Operation]] | None:
    """The work of `loop` as (A, the views B reads from A, B), if the loop qualifies."""
    work = list(loop.loop.body.block.ops)[len(loop.prologue) : -len(loop.epilogue) - 1]
    waits = [op for op in work if isinstance(op, hir.WaitOp)]
    if len(waits) != 1:
        return None
    (wait,) = waits
    communication = wait.work.owner
    if (
        not isinstance(communication, hir.CommunicationOp)
        or communication.backend.data != hir.CommunicatorBackend.CUDA
        or communication not in work
    ):
        return None
    nested = (hir.CommunicationOp, hir.P2POp, hir.EndCoalescingOp, hir.WaitOp)
    if sum(isinstance(op, nested) for top in work for op in top.walk()) != 2:
        return None
    given = {result for op in loop.prologue for result in op.results}
    if any(operand in given for top in work for op in top.walk() for operand in op.operands):
        return None
    position = work.index(wait)
    issue, finish = work[:position], work[position + 1 :]
    defined_in_issue = {result: op for op in issue for result in op.results}
    needed: set[Operation] = set()
    pending = [operand for op in finish for inner in op.walk() for operand in inner.operands]
    while pending:
        definer = defined_in_issue.get(pending.pop())
        if definer is None or definer in needed:
            continue
        if not _recomputable(definer):
            return None
        needed.add(definer)
        pending.extend(definer.operands)
    return issue, [op for op in issue if op in needed], finish


def _clone(ops: Sequence[Operation], mapping: dict[SSAValue, SSAValue], block: Block) -> None:
    """Appends clones of `ops` to `block`, reading and extending `mapping`."""
    for op in ops:
        block.add_op(op.clone(mapping))


class PipelineCopyEngineLoop(RewritePattern):
    """Rewrites one qualifying work loop (and its synchronisation loop) as the module says."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scf.ForOp, rewriter: PatternRewriter, /) -> None:
        loop = StreamLoop.match(op)
        if loop is None or loop.is_sync_loop:
            return
        if not (_is_constant(op.lb, 0) and _is_constant(op.step, 1)):
            return
        split = _split(loop)
        if split is None:
            return
        issue, views, finish = split
        (wait,) = (o for o in op.body.block.ops if isinstance(o, hir.WaitOp))
        induction = op.body.block.args[0]

        one = arith.ConstantOp(IntegerAttr(1, IndexType()))
        one.result.name_hint = "c1"
        nonempty = arith.CmpiOp(op.ub, op.lb, "ugt")
        nonempty.result.name_hint = "nonempty"
        then = Block()
        first: dict[SSAValue, SSAValue] = {induction: op.lb}
        _clone(issue, first, then)

        body = Block(arg_types=[IndexType(), hir.WorkType()])
        index, previous = body.args
        index.name_hint = induction.name_hint
        previous.name_hint = "previous_work"
        current: dict[SSAValue, SSAValue] = {induction: index}
        _clone(issue, current, body)
        before = arith.SubiOp(index, one.result)
        body.add_op(before)
        waits = [self._finish(views, finish, before.result, previous, induction, body)]
        body_yield = scf.YieldOp(current[wait.work])
        body.add_op(body_yield)
        pipelined = scf.ForOp(one.result, op.ub, one.result, [first[wait.work]], body)
        pipelined.results[0].name_hint = "last_work"
        then.add_op(pipelined)

        last = arith.SubiOp(op.ub, one.result)
        then.add_op(last)
        waits.append(self._finish(views, finish, last.result, pipelined.results[0], induction, then))
        then_yield = scf.YieldOp()
        then.add_op(then_yield)
        otherwise = scf.YieldOp()
        guard = scf.IfOp(nonempty.result, [], Region(then), Region(Block([otherwise])))
        for new_op in (one, nonempty, before, body_yield, pipelined, last, then_yield, otherwise, guard):
            new_op.location = op.location
        for new_wait in waits:
            new_wait.location = wait.location
        sync_loop = loop.sync_loop()
        caller_stream = loop.epilogue[0].stream
        rewriter.replace_op(op, [one, nonempty, guard])
        if sync_loop is not None:
            rewriter.erase_op(sync_loop.loop)
        if not caller_stream.uses and isinstance(caller_stream.owner, hir.GetCurrentStreamOp):
            rewriter.erase_op(caller_stream.owner)

    @staticmethod
    def _finish(
        views: Sequence[Operation],
        finish: Sequence[Operation],
        index: SSAValue,
        work: SSAValue,
        induction: SSAValue,
        block: Block,
    ) -> hir.WaitOp:
        """Appends, for iteration `index`: B's views of A, the wait for `work`, and B."""
        mapping: dict[SSAValue, SSAValue] = {induction: index}
        _clone(views, mapping, block)
        wait = hir.WaitOp(work)
        block.add_op(wait)
        _clone(finish, mapping, block)
        return wait


class CopyEnginePipelining(ModulePass):
    """Software-pipelines each stream loop of copy-engine transfers on the caller's stream.

    The transfer of one iteration is in flight while the one before is finished."""

    name = "copy-engine-pipelining"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(PipelineCopyEngineLoop(), apply_recursively=False).rewrite_module(op)
