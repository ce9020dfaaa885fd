"""`attention-ring`: attention over keys and values that travel around the devices, computed
block by block as the blocks arrive (the ring of context parallelism).

The forward. Keys and values all-gathered along the sequence, whose blocks are the `stream`
axis (`auto-stream-parallel` makes them so), arrive in the point-to-point ring of
`stream-parallel`: at iteration `i` the block of slot `s` (the device at position `s` of
the mesh, `s = (p + i) mod D` in ring order) lands in its slice. This pass moves the
attention into that loop, after its epilogue, where the caller's stream has waited for the
iteration's transfer:

    scf.for %i = 0 to D {
      ... the ring's transfers of keys and values into slot %s, on pool stream %i mod n ...
      hir.set_current_stream %main; hir.synchronize_stream %stream
      scf.if (%i == 0) {
        hir.attention causal head_tail block %s ins(%q, %k_s, %v_s) outs(%out, %lse)
      } else {
        hir.attention causal head_tail block %s ins(%q, %k_s, %v_s) outs(%block_out, %block_lse)
        hir.launch_kernel @merge_output ins(%out, %lse, %block_out, %block_lse) outs(%out)
        hir.launch_kernel @merge_lse ins(%lse, %block_lse) outs(%lse)
      }
    }

The transfers of every iteration are issued on their pool streams before the caller's
stream gets to the attentions, so the next blocks travel while a block is computed; the
attentions and merges run on the caller's stream, one after the other, since they all
write one running result. The first iteration writes it; each later one merges its
block's output and log-sum-exp into it (online softmax), in f32 (a running output of
bf16 is kept in an f32 buffer; where the number of blocks is known, the last block's
merge writes the output in its own type, else the buffer is cast into it after the
loop; with 2 blocks the one merge reads the first block's output as the kernel gave it,
and there is no f32 buffer). The merge is two
pointwise segments, one kernel each on GPUs: the output's, which recomputes the weights
from both log-sum-exps, then the log-sum-exp's (a kernel writes every output at every
point of its iteration space, and the log-sum-exp has one axis less). A causal layout
(`block %s`) computes only the rows of each block that meet: under head-tail, half a
block per step on every device.

The backward. Its keys and values are the forward's, whole on every device (aot_autograd
saves them), and the gradients of the keys and values, each device's share, are
reduce-scattered back to their owners by blocks: those blocks are the `stream` axis of
the gradients. This pass replaces the attention backward and the two reduce-scatters by a
loop over the other devices' blocks, in ring order, that computes the shares of block `s`
and sends them straight to its owner on a pool stream, then the own block's gradients
(device `p` at step `i` sends to `s = (p + 1 + i) mod D` and receives from `(p - 1 - i) mod
D` its shares of its own block):

    scf.for %i = 0 to D - 1 {
      hir.synchronize_stream %t                        slot i mod 2 is free again
      scf.if (%i == 0) {
        hir.attention_backward block %s ins(...) outs(%dq_sum, %dk_share[i mod 2], %dv_share[..])
      } else {
        hir.attention_backward block %s ins(...) outs(%dq_share, %dk_share[..], %dv_share[..])
        @sum(%dq_sum, %dq_share) -> %dq_sum
        hir.synchronize_stream %t'                     the previous step's transfers
        %dk_sum = the shares they brought (step 1), or @sum(%dk_sum, them); the values' alike
      }
      on pool stream %t (i mod 2), once the attention is done:
        batch: hir.recv %dk_arrived[i mod 2] from (p - 1 - i) mod D, hir.send %dk_share[..] to s
        batch: the values' alike; hir.wait both
    }
    hir.attention_backward block %p ins(...) outs(%dq, %dk, %dv)      while the last shares travel
    hir.synchronize_stream %t_last
    @sum(%dk_sum, %dk_arrived) -> %dk_sum; @sum(%dk, %dk_sum) -> %dk   the values' alike
    @sum(%dq, %dq_sum) -> %dq

Each step's transfers run while the next step's attention is computed, and the last ones
while the own block's is: two slots of shares and two pool streams, so that a step writes
a slot only once the transfers that read it two steps before are done. At 2 devices the
loop has one step and no sums: the shares computed and received are added to the own
block's gradients directly. The shares travel in the gradients' type, which is what
the attention kernel computes them in (bf16 on GPUs); sums are kept in f32, and each
`@sum` is one generated kernel that adds in f32 and rounds once into its output. The
transfers move the bytes of the reduce-scatters they replace (NCCL, or the copy engines,
whose shares are then symmetric buffers the peers read).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, builtin, func, scf
from xdsl.dialects.builtin import Float32Type, IndexType
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from hostir_dialect import fusion, hir
from hostir_dialect.builder import SegmentBuilder, reduction_of_slices
from hostir_dialect.fusion import TensorType, key_block_axis, tensor_type
from hostir.passes.analysis.extents import known_extent
from hostir.passes.analysis.loops import StreamLoop, index_constant, named, runtime_value
from hostir.passes.lowering.stream_axis_checks import streamed_key_blocks

LOGGER = logging.getLogger("hostir.pipelining")

F32 = Float32Type()
LOWEST_F32 = -3.4028234663852886e38
"""The most negative finite f32: the merge's maximum, where both log-sum-exps are -inf."""
TINY_F32 = 1.1754943508222875e-38
"""The least normal f32: the merge's divisor, where a row has seen no key yet."""


def _like(
    buffer: SSAValue, element_type, name: str, symmetric: bool = False, slots: int | None = None
) -> hir.AllocateOp:
    """A new buffer of `buffer`'s type in `element_type`, sized as `buffer`'s allocation; with
    `slots`, that many such tensors along a new axis 0."""
    allocation = hir.allocation_of(buffer)
    assert allocation is not None
    type = tensor_type(buffer).with_(element_type=element_type)
    if slots is not None:
        type = type.with_(shape=[slots, *type.get_shape()], axes=[fusion.SERIAL, *type.axes.data])
    new = hir.AllocateOp(type, allocation.dynamic_sizes, symmetric)
    new.result.name_hint = name
    return new


def _accumulator(buffer: SSAValue, name: str) -> tuple[SSAValue, list[Operation], hir.PointwiseOp | None]:
    """Where an f32 sum into `buffer` is kept: `buffer` itself if it is f32, else a new f32
    buffer (the ops that allocate it) cast into `buffer` by the returned op, after the loop."""
    if tensor_type(buffer).element_type == F32:
        return buffer, [], None
    allocation = _like(buffer, F32, name)
    return allocation.result, [allocation], hir.PointwiseOp("cast", [allocation.result], [buffer])


# --------------------------------------------------------------------------- #
# The merge                                                                    #
# --------------------------------------------------------------------------- #


def _weights(
    build: SegmentBuilder, lse: SSAValue, block_lse: SSAValue
) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
    """The running result's and the block's weights `exp(lse - m)`, `exp(block_lse - m)`, their
    sum, and `m`, the larger log-sum-exp (no less than the lowest f32, so that two -inf give
    weights 0, not NaN)."""
    lowest = build.constant(LOWEST_F32, tensor_type(lse))
    m = build(fusion.MaximumOp, build(fusion.MaximumOp, lse, block_lse), lowest)
    ours = build(fusion.ExpOp, build(fusion.SubOp, lse, m))
    theirs = build(fusion.ExpOp, build(fusion.SubOp, block_lse, m))
    return ours, theirs, build(fusion.AddOp, ours, theirs), m


def _merge_output_segment(
    host: func.FuncOp,
    out: SSAValue,
    lse: SSAValue,
    block_out: SSAValue,
    block_lse: SSAValue,
    result_type: TensorType | None = None,
) -> func.FuncOp:
    """`(out, lse, block_out, block_lse) -> out`: the output over the keys of both, `(w out + w'
    block_out) / (w + w')` with the weights of `_weights` (their rows broadcast along the output's),
    computed in f32 and rounded into `result_type` (default: `out`'s type)."""
    out_type, lse_type = tensor_type(out), tensor_type(lse)
    wide = out_type.with_(element_type=F32)
    build = SegmentBuilder(
        [out_type, lse_type, tensor_type(block_out), tensor_type(block_lse)], ["out", "lse", "block_out", "block_lse"]
    )
    running, running_lse, arrived, arrived_lse = build.block.args
    rows = lse_type.rank
    column = TensorType([*lse_type.get_shape(), 1], F32, lse_type.mesh, [*lse_type.axes.data, fusion.SERIAL])
    ours, theirs, total, _ = _weights(
        build,
        build(fusion.BroadcastOp, running_lse, [rows], type=column),
        build(fusion.BroadcastOp, arrived_lse, [rows], type=column),
    )
    running, arrived = build.widened(running), build.widened(arrived)
    divisor = build(fusion.MaximumOp, total, build.constant(TINY_F32, wide))
    numerator = build(
        fusion.AddOp,
        build(fusion.MulOp, ours, running, type=wide),
        build(fusion.MulOp, theirs, arrived, type=wide),
    )
    merged = build(fusion.DivOp, numerator, divisor, type=wide)
    build.block.add_op(func.ReturnOp(build.rounded(merged, result_type or out_type)))
    return build.function(hir.segment_name(host, "merge_output"))


def _merge_lse_segment(host: func.FuncOp, lse: SSAValue, block_lse: SSAValue) -> func.FuncOp:
    """`(lse, block_lse) -> lse`: the log-sum-exp over the keys of both, `m + log(w + w')`."""
    build = SegmentBuilder([tensor_type(lse), tensor_type(block_lse)], ["lse", "block_lse"])
    _, _, total, m = _weights(build, *build.block.args)
    build.block.add_op(func.ReturnOp(build(fusion.AddOp, m, build(fusion.LogOp, total))))
    return build.function(hir.segment_name(host, "merge_lse"))


# --------------------------------------------------------------------------- #
# The forward                                                                  #
# --------------------------------------------------------------------------- #


def _ring_slot(loop: StreamLoop, buffers: Sequence[SSAValue]) -> SSAValue | None:
    """The slot that an iteration of `loop` fills in every one of `buffers`: the index of the
    views along axis 0 that its `hir.recv`s receive into (one slot for all)."""
    body = loop.loop.body.block
    slots = {}
    for op in body.ops:
        if isinstance(op, hir.AliasSelectOp) and op.input in buffers and op.axis.data == 0:
            received = any(isinstance(use.operation, hir.RecvOp) for use in op.result.uses)
            if received:
                slots[op.input] = op
    if set(slots) != set(buffers) or len({view.index for view in slots.values()}) != 1:
        return None
    return next(iter(slots.values())).index


def _views(loop: StreamLoop, buffers: Sequence[SSAValue], slot: SSAValue) -> list[SSAValue]:
    body = loop.loop.body.block
    return [
        next(op.result for op in body.ops if isinstance(op, hir.AliasSelectOp) and op.input is b and op.index is slot)
        for b in buffers
    ]


def _filling_loop(op: hir.AttentionOp, keys: Sequence[SSAValue]) -> tuple[StreamLoop, SSAValue] | None:
    """The ring loop before `op` in its block that receives the blocks of `keys`, and its slot."""
    previous = op.prev_op
    while previous is not None:
        loop = StreamLoop.match(previous)
        if loop is not None and not loop.is_sync_loop:
            slot = _ring_slot(loop, keys)
            if slot is not None:
                return loop, slot
        previous = previous.prev_op
    return None


def _move_before(op: Operation, anchor: Operation, rewriter: PatternRewriter) -> None:
    """Moves the allocation of `op`'s buffer before `anchor` where it comes after it."""
    if anchor.is_before_in_block(op):
        op.detach()
        rewriter.insert(op, InsertPoint.before(anchor))


@dataclass
class RingAttention(RewritePattern):
    """An attention whose keys and values arrive in the blocks of a ring loop -> computed in that
    loop, block by block, and merged into its running result (the module docstring)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.AttentionOp, rewriter: PatternRewriter, /) -> None:
        if op.block is not None or not all(streamed_key_blocks(op, x) for x in op.ins[1:3]):
            return
        if op.causal_mask == fusion.Causal.TOP_LEFT:
            return _declined(op, TOP_LEFT)
        found = _filling_loop(op, op.ins[1:3])
        if found is None:
            return _declined(op, "no ring loop before it receives the blocks of its keys and values")
        loop, slot = found
        host = op.parent_op()
        out, lse = op.outs
        start = loop.start
        for buffer in (out, lse):
            _move_before(hir.allocation_of(buffer), start, rewriter)
        steps = _constant_extent(loop.loop)
        if steps == 2:
            # One merge, of two kernel outputs: the first block's, in the output's own type as
            # the kernel gives it, is merged with the second's in f32 and rounded once.
            running, running_ops, cast = out, [], None
        else:
            running, running_ops, cast = _accumulator(out, f"{out.name_hint or 'out'}_running")
        block_out = _like(out, tensor_type(op.ins[0]).element_type, "block_out")
        block_lse = _like(lse, F32, "block_lse")
        rewriter.insert([*running_ops, block_out, block_lse], InsertPoint.before(start))
        merge_ins = [running, lse, block_out.result, block_lse.result]
        # With a known number of blocks, the last one's merge writes the output in its own type:
        # no cast after the loop.
        last_writes_out = cast is not None and steps is not None and steps > 2
        merge_running = _merge_output_segment(host, *merge_ins)
        rewriter.insert(merge_running, InsertPoint.before(host))  # named before the next segment is
        if last_writes_out:
            merge_last = _merge_output_segment(host, *merge_ins, result_type=tensor_type(out))
            rewriter.insert(merge_last, InsertPoint.before(host))
        merge_lse = _merge_lse_segment(host, lse, block_lse.result)
        rewriter.insert(merge_lse, InsertPoint.before(host))

        q, k, v = op.ins[:3]
        k_block, v_block = _views(loop, [k, v], slot)
        source = [slot] if op.causal_mask is not None else []
        properties = _block_properties(op)
        iteration = loop.loop.body.block.args[0]
        first = named(arith.CmpiOp(iteration, index_constant(rewriter, loop.loop, 0), "eq"), "first_block")
        write = hir.AttentionOp([q, k_block, v_block], [running, lse], properties, *source)
        compute = hir.AttentionOp([q, k_block, v_block], [block_out.result, block_lse.result], properties, *source)
        into_running = hir.LaunchKernelOp(merge_running.sym_name.data, merge_ins, [running])
        merges: list[Operation] = [into_running]
        if last_writes_out:
            last = named(arith.CmpiOp(iteration, index_constant(rewriter, loop.loop, steps - 1), "eq"), "last_block")
            into_out = hir.LaunchKernelOp(merge_last.sym_name.data, merge_ins, [out])
            merges = [last, scf.IfOp(last.result, [], [into_out, scf.YieldOp()], [into_running, scf.YieldOp()])]
        after = [cast] if cast is not None and not last_writes_out else []
        merges.append(hir.LaunchKernelOp(merge_lse.sym_name.data, [lse, block_lse.result], [lse]))
        branches = scf.IfOp(first.result, [], [write, scf.YieldOp()], [compute, *merges, scf.YieldOp()])
        for new_op in (first, *branches.walk()):
            new_op.location = op.location
        rewriter.insert([first, branches], InsertPoint.before(loop.loop.body.block.last_op))
        rewriter.replace(op, after, [])


def _constant_extent(loop: scf.ForOp) -> int | None:
    """How many iterations `loop` runs where the program fixes its bounds and step, else None."""
    lower, upper, step = (known_extent(value) for value in (loop.lb, loop.ub, loop.step))
    if not all(isinstance(bound, int) for bound in (lower, upper, step)) or not step:
        return None
    return max(0, -(-(upper - lower) // step))


def _declined(op: Operation, reason: str) -> None:
    LOGGER.info("%s is not a ring: %s", op.name, reason)


KINDS = ("keys", "values")

TOP_LEFT = "SDPA's top-left causal mask is not a mask of positions: no block of a ring is known empty"


def _block_properties(op: hir.AttentionComputeOp) -> dict:
    """The properties of the attention of one block of `op`'s keys: its own, but `blocks`."""
    return {name: value for name, value in op.properties.items() if name not in ("blocks", "operandSegmentSizes")}


# --------------------------------------------------------------------------- #
# The backward                                                                 #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Scatter:
    """The reduce-scatter that sends a gradient's blocks to their owners, and its wait."""

    collective: hir.ReduceScatterOp
    wait: hir.WaitOp

    @staticmethod
    def of(gradient: SSAValue, producer: Operation) -> Scatter | None:
        """The reduce-scatter of `gradient`, if it is the only reader of what `producer` writes there."""
        readers = [use.operation for use in gradient.uses if use.operation is not producer]
        if len(readers) != 1 or not isinstance(collective := readers[0], hir.ReduceScatterOp):
            return None
        waits = [use.operation for use in collective.work.uses]
        if collective.input is not gradient or len(waits) != 1 or not isinstance(waits[0], hir.WaitOp):
            return None
        if collective.scattered_axis() != key_block_axis(tensor_type(gradient)):
            return None
        return Scatter(collective, waits[0])


@dataclass
class RingAttentionBackward(RewritePattern):
    """An attention backward whose key and value gradients' blocks are reduce-scattered to their
    owners -> a ring that sends each block's shares to its owner as they are computed (the
    module docstring)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: hir.AttentionBackwardOp, rewriter: PatternRewriter, /) -> None:
        grad_query, grad_key, grad_value = op.outs
        if op.block is not None or not all(streamed_key_blocks(op, x) for x in (grad_key, grad_value)):
            return
        if op.causal_mask == fusion.Causal.TOP_LEFT:
            return _declined(op, TOP_LEFT)
        scatters = [Scatter.of(grad, op) for grad in (grad_key, grad_value)]
        if None in scatters:
            return _declined(op, "its keys' and values' gradients are not reduce-scattered to their blocks' owners")
        mesh = scatters[0].collective.team_ids
        if mesh != tuple(range(mesh[0], mesh[0] + len(mesh))) or scatters[1].collective.team_ids != mesh:
            return _declined(op, "the ring visits the devices of a mesh of consecutive ids only")
        _RingBackward(op, scatters, mesh, rewriter).rewrite()


class _RingBackward:
    """The rewrite of `RingAttentionBackward`, step by step."""

    def __init__(self, op: hir.AttentionBackwardOp, scatters: Sequence[Scatter], mesh: tuple[int, ...], rewriter):
        self.op, self.scatters, self.mesh, self.rewriter = op, scatters, mesh, rewriter
        self.backend = scatters[0].collective.backend.data
        self.host = op.parent_op()
        self.steps = len(mesh) - 1
        """The loop's steps: one per other device's block; the own block comes after the loop."""
        self.slots = min(2, self.steps)
        """The slots of the shares sent and received: a step's transfer overlaps the next step's attention."""
        self.before: list[Operation] = []
        """Ops inserted before the loop."""
        self.sum_segments: dict[tuple[TensorType, ...], func.FuncOp] = {}

    def _buffer(
        self, like: SSAValue, element_type, name: str, symmetric: bool = False, slots: int | None = None
    ) -> SSAValue:
        allocation = _like(like, element_type, name, symmetric, slots)
        self.before.append(allocation)
        return allocation.result

    def _slotted(self, like: SSAValue, name: str, symmetric: bool = False) -> SSAValue:
        """A buffer of `self.slots` tensors like `like`, one per slot along axis 0."""
        return self._buffer(like, tensor_type(like).element_type, name, symmetric, self.slots)

    def _sum(self, a: SSAValue, b: SSAValue, out: SSAValue) -> hir.LaunchKernelOp:
        """`out = a + b`, summed in f32 and rounded once into `out`: one kernel."""
        types = (tensor_type(a), tensor_type(b), tensor_type(out))
        segment = self.sum_segments.get(types)
        if segment is None:
            name = hir.segment_name(self.host, "sum")
            segment = self.sum_segments[types] = reduction_of_slices(name, "sum", types[:2], types[2], ["a", "b"])
            self.rewriter.insert(segment, InsertPoint.before(self.host))
        return hir.LaunchKernelOp(segment.sym_name.data, [a, b], [out])

    def rewrite(self) -> None:
        op, rewriter = self.op, self.rewriter
        grad_query = op.outs[0]
        owners = [scatter.collective.output for scatter in self.scatters]
        for buffer in (grad_query, *owners):
            _move_before(hir.allocation_of(buffer), op, rewriter)
        copy_engines = self.backend == hir.CommunicatorBackend.CUDA
        several = self.steps > 1
        gradients = tensor_type(grad_query).element_type
        # With one step, the queries' share of the other block is added to the own block's
        # once, and needs no more precision than the kernel gave it.
        self.query_sum = self._buffer(grad_query, F32 if several else gradients, "dq_sum" if several else "dq_share")
        shares = [self._slotted(o, f"{what}_share", copy_engines) for o, what in zip(owners, KINDS)]
        arrived = [self._slotted(o, f"{what}_arrived") for o, what in zip(owners, KINDS)]
        query_share = self._buffer(grad_query, gradients, "dq_share") if several else None
        self.key_sums = [self._buffer(o, F32, f"{what}_sum") for o, what in zip(owners, KINDS)] if several else []
        rewriter.insert(self.before, InsertPoint.before(op))

        position, size, first_device = self._positions()
        self.main = runtime_value(rewriter, op, hir.GetCurrentStreamOp, "main_stream")
        zero, one = index_constant(rewriter, op, 0), index_constant(rewriter, op, 1)
        self.zero, self.slot_count = zero, index_constant(rewriter, op, self.slots)
        streams: list[Operation] = []
        if several:  # slot k's transfers go on pool stream k (one stream where the pool has one)
            pool = runtime_value(rewriter, op, hir.NumberOfStreamsOp, "streams")
            streams.append(named(arith.MinUIOp(pool, self.slot_count), "transfer_streams"))
            self.transfer_streams = streams[0].results[0]
        # Step i sends the shares of block (p + 1 + i) mod D and receives from (p - 1 - i) mod D,
        # as (p + D - 1 - i) mod D: index arithmetic is unsigned.
        next_position = named(arith.AddiOp(position, one), "next_position")
        last_position = named(arith.AddiOp(position, index_constant(rewriter, op, len(self.mesh) - 1)), "last_position")
        rewriter.insert([*streams, next_position, last_position, *self._join_transfer_streams()], InsertPoint.before(op))

        body = Block(arg_types=[IndexType()])
        step = body.args[0]
        step.name_hint = "i"
        ahead = named(arith.AddiOp(next_position.results[0], step), "ahead")
        block = named(arith.RemUIOp(ahead.results[0], size), "block")
        behind = named(arith.SubiOp(last_position.results[0], step), "behind")
        from_block = named(arith.RemUIOp(behind.results[0], size), "from_block")
        ops: list[Operation] = [ahead, block, behind, from_block]
        send_peer = self._device(block.results[0], first_device, "send_peer", ops)
        recv_peer = self._device(from_block.results[0], first_device, "recv_peer", ops)
        slot, stream = self._slot_and_stream(step, ops)
        ins = self._block_ins(block.results[0], ops)
        share_views = self._views(shares, slot, ops)
        arrived_views = self._views(arrived, slot, ops)
        ops.append(hir.SynchronizeStreamOp(stream))  # the slot's last transfer is over
        source = [block.results[0]] if op.causal_mask is not None else []
        properties = _block_properties(op)
        first = hir.AttentionBackwardOp(ins, [self.query_sum, *share_views], properties, *source)
        if several:
            is_first = named(arith.CmpiOp(step, zero, "eq"), "is_first")
            later = hir.AttentionBackwardOp(ins, [query_share, *share_views], properties, *source)
            added = self._sum(self.query_sum, query_share, self.query_sum)
            previous = self._add_previous_arrival(step, arrived, one)
            ops += [is_first, scf.IfOp(is_first.results[0], [], [first, scf.YieldOp()], [later, added, *previous, scf.YieldOp()])]
        else:
            ops.append(first)
        ops += self._transfers(stream, share_views, arrived_views, send_peer, recv_peer)
        body.add_ops([*ops, scf.YieldOp()])
        loop = scf.ForOp(zero, index_constant(rewriter, op, self.steps), one, [], body)
        own = self._own_block(position, owners, arrived)
        for new_op in (loop, *own):
            for inner in new_op.walk():
                inner.location = op.location
        rewriter.insert([loop, *own], InsertPoint.before(op))
        for scatter in self.scatters:
            rewriter.erase(scatter.wait)
            rewriter.erase(scatter.collective)
        gradients = [hir.allocation_of(grad) for grad in op.outs[1:]]
        rewriter.erase(op)
        for allocation in gradients:  # computed block by block now, never whole
            if allocation is not None and not allocation.result.uses:
                rewriter.erase(allocation)

    def _slot_and_stream(self, step: SSAValue, ops: list[Operation]) -> tuple[SSAValue, SSAValue]:
        """The slot of step `step` and the pool stream of its transfers, by ops appended to `ops`."""
        if self.slots == 1:
            stream = named(hir.StreamOp(self.zero), "transfer_stream")
            ops.append(stream)
            return self.zero, stream.result
        slot = named(arith.RemUIOp(step, self.slot_count), "slot")
        index = named(arith.RemUIOp(step, self.transfer_streams), "stream_index")
        stream = named(hir.StreamOp(index.results[0]), "transfer_stream")
        ops += [slot, index, stream]
        return slot.results[0], stream.result

    def _join_transfer_streams(self) -> list[Operation]:
        """Each transfer stream waits for the caller's before the loop: the caller's stream waits
        for a slot's stream before the slot's first use, and a stream it waits for must have
        waited for it first while a CUDA graph is captured (else the capture fails)."""
        ops: list[Operation] = []
        for slot in range(self.slots):
            _, stream = self._slot_and_stream(index_constant(self.rewriter, self.op, slot), ops)
            ops += [hir.SetCurrentStreamOp(stream), hir.SynchronizeStreamOp(self.main)]
        return [*ops, hir.SetCurrentStreamOp(self.main)]

    def _block_ins(self, block: SSAValue, ops: list[Operation]) -> list[SSAValue]:
        """The attention backward's operands with the keys and values of `block`."""
        keys = [
            named(hir.AliasSelectOp(x, key_block_axis(tensor_type(x)), block), f"{what}_block")
            for x, what in zip(self.op.ins[2:4], KINDS)
        ]
        ops += keys
        return [*self.op.ins[:2], *(view.result for view in keys), *self.op.ins[4:]]

    @staticmethod
    def _views(buffers: Sequence[SSAValue], slot: SSAValue, ops: list[Operation]) -> list[SSAValue]:
        views = [named(hir.AliasSelectOp(b, 0, slot), f"{b.name_hint}_slot") for b in buffers]
        ops += views
        return [view.result for view in views]

    def _add_previous_arrival(self, step: SSAValue, arrived: Sequence[SSAValue], one: SSAValue) -> list[Operation]:
        """At step `step` > 0, after its attention: the caller's stream waits for the previous
        step's transfers and adds the shares they brought to the sums (the first ones written)."""
        previous = named(arith.SubiOp(step, one), "previous")
        ops: list[Operation] = [previous]
        slot, stream = self._slot_and_stream(previous.results[0], ops)
        views = self._views(arrived, slot, ops)
        ops.append(hir.SynchronizeStreamOp(stream))
        is_second = named(arith.CmpiOp(step, one, "eq"), "is_second")
        writes = [hir.PointwiseOp("cast", [view], [total]) for view, total in zip(views, self.key_sums)]
        adds = [self._sum(total, view, total) for view, total in zip(views, self.key_sums)]
        ops += [is_second, scf.IfOp(is_second.results[0], [], [*writes, scf.YieldOp()], [*adds, scf.YieldOp()])]
        return ops

    def _transfers(
        self, stream: SSAValue, shares: Sequence[SSAValue], arrived: Sequence[SSAValue], send_peer, recv_peer
    ) -> list[Operation]:
        """On `stream`, once the step's attention is done: each share sent to its block's owner and
        the own block's share received from the device behind, in a batch each."""
        batches = [hir.EndCoalescingOp() for _ in shares]
        ops: list[Operation] = [hir.SetCurrentStreamOp(stream), hir.SynchronizeStreamOp(self.main)]
        for share, landing, batch in zip(shares, arrived, batches):
            ops += [
                hir.StartCoalescingOp(),
                hir.RecvOp(landing, recv_peer, self.backend),
                hir.SendOp(share, send_peer, self.backend),
                batch,
            ]
        return [*ops, *(hir.WaitOp(batch.work) for batch in batches), hir.SetCurrentStreamOp(self.main)]

    def _own_block(self, position: SSAValue, owners: Sequence[SSAValue], arrived: Sequence[SSAValue]) -> list[Operation]:
        """After the loop, while the last step's shares travel: the own block's gradients, written
        into the outputs, to which the shares received are then added."""
        op = self.op
        ops: list[Operation] = []
        ins = self._block_ins(position, ops)
        source = [position] if op.causal_mask is not None else []
        grad_query = op.outs[0]
        ops.append(hir.AttentionBackwardOp(ins, [grad_query, *owners], _block_properties(op), *source))
        last = index_constant(self.rewriter, op, self.steps - 1)
        slot, stream = self._slot_and_stream(last, ops)
        views = self._views(arrived, slot, ops)
        ops.append(hir.SynchronizeStreamOp(stream))
        for owner, view, total in zip(owners, views, self.key_sums or views):
            if total is not view:
                ops.append(self._sum(total, view, total))
            ops.append(self._sum(owner, total, owner))
        ops.append(self._sum(grad_query, self.query_sum, grad_query))
        return ops

    def _positions(self) -> tuple[SSAValue, SSAValue, SSAValue | None]:
        """This device's position in the mesh, the mesh's size, and its first device (None: 0),
        computed once before the loop."""
        op, rewriter = self.op, self.rewriter
        rank = runtime_value(rewriter, op, hir.DeviceIndexOp, "rank")
        size = index_constant(rewriter, op, len(self.mesh))
        if not self.mesh[0]:
            return rank, size, None
        first = index_constant(rewriter, op, self.mesh[0])
        position = named(arith.SubiOp(rank, first), "position")
        rewriter.insert(position, InsertPoint.before(op))
        return position.results[0], size, first

    @staticmethod
    def _device(slot: SSAValue, first: SSAValue | None, name: str, ops: list[Operation]) -> SSAValue:
        """The mesh device of `slot`, computed by an op appended to `ops`."""
        if first is None:
            return slot
        ops.append(named(arith.AddiOp(slot, first), name))
        return ops[-1].results[0]


@dataclass(frozen=True)
class AttentionRing(ModulePass):
    """Computes the attentions whose keys' blocks are a `stream` axis as rings: the forward's in
    the ring loop that brings the blocks, the backward's in a ring that sends each block's
    gradients to its owner."""

    name = "attention-ring"

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier([RingAttention(), RingAttentionBackward()]), apply_recursively=False
        ).rewrite_module(op)
