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
bf16 is kept in an f32 buffer, cast into the output after the loop). The merge is two
pointwise segments, one kernel each on GPUs: the output's, which recomputes the weights
from both log-sum-exps, then the log-sum-exp's (a kernel writes every output at every
point of its iteration space, and the log-sum-exp has one axis less). A causal layout
(`block %s`) computes only the rows of each block that meet: under head-tail, half a
block per step on every device.

The backward. Its keys and values are the forward's, whole on every device (aot_autograd
saves them), and the gradients of the keys and values, each device's share, are
reduce-scattered back to their owners by blocks: those blocks are the `stream` axis of
the gradients. This pass replaces the attention backward and the two reduce-scatters by
one loop on the caller's stream, in ring order, that computes the shares of block `s`
and sends them straight to its owner, which adds them to its own as they arrive (the
mirror of the forward's exchange: at iteration `i`, device `p` sends to `s = (p + i) mod
D` and receives from `(p - i) mod D` the share of its own block):

    scf.for %i = 0 to D {
      scf.if (%i == 0) {
        hir.attention_backward block %s ins(...) outs(%dq, %dk, %dv)     the own block writes
      } else {
        hir.attention_backward block %s ins(...) outs(%dq_share, %dk_share, %dv_share)
        hir.pointwise "add" ins(%dq, %dq_share) outs(%dq)
        batch: hir.recv %dk_arrived from (p - i) mod D, hir.send %dk_share to s; hir.wait
        batch: the values' alike
        hir.pointwise "add" ins(%dk, %dk_arrived) outs(%dk); the values' alike
      }
    }

Sums are kept in f32, and the shares travel in f32, as torch's ring sums them. The
transfers move the bytes of the reduce-scatters they replace (NCCL, or the copy engines,
whose shares are then symmetric buffers the peers read).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, builtin, func, scf
from xdsl.dialects.builtin import Float32Type, FloatAttr, IndexType
from xdsl.ir import Block, Operation, OpResult, Region, SSAValue
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
from hostir_dialect.fusion import TensorType, key_block_axis, tensor_type
from hostir.passes.analysis.loops import StreamLoop, index_constant, runtime_value
from hostir.passes.lowering.stream_axis_checks import streamed_key_blocks

LOGGER = logging.getLogger("hostir.pipelining")

F32 = Float32Type()
LOWEST_F32 = -3.4028234663852886e38
"""The most negative finite f32: the merge's maximum, where both log-sum-exps are -inf."""
TINY_F32 = 1.1754943508222875e-38
"""The least normal f32: the merge's divisor, where a row has seen no key yet."""


def _named(op: Operation, name: str) -> Operation:
    op.results[0].name_hint = name
    return op


def _allocation(buffer: SSAValue) -> hir.AllocateOp | None:
    return buffer.op if isinstance(buffer, OpResult) and isinstance(buffer.op, hir.AllocateOp) else None


def _like(buffer: SSAValue, element_type, name: str, symmetric: bool = False) -> hir.AllocateOp:
    """A new buffer of `buffer`'s type in `element_type`, sized as `buffer`'s allocation."""
    allocation = _allocation(buffer)
    assert allocation is not None
    new = hir.AllocateOp(tensor_type(buffer).with_(element_type=element_type), allocation.dynamic_sizes, symmetric)
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


class _SegmentBuilder:
    """Fusion ops appended to a segment's body, each result of a type like a given one."""

    def __init__(self, types: Sequence[TensorType], names: Sequence[str]):
        self.block = Block(arg_types=types)
        for argument, name in zip(self.block.args, names, strict=True):
            argument.name_hint = name

    def __call__(self, op_class, *operands: SSAValue, type: TensorType | None = None) -> SSAValue:
        result_type = type or tensor_type(operands[0])
        op = op_class(*operands, result_type)
        self.block.add_op(op)
        return op.results[0]

    def constant(self, value: float, like: TensorType) -> SSAValue:
        constant = fusion.ConstantOp(FloatAttr(value, F32), TensorType([], F32, like.mesh))
        self.block.add_op(constant)
        return constant.result


def _weights(
    build: _SegmentBuilder, lse: SSAValue, block_lse: SSAValue
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
    host: func.FuncOp, out: SSAValue, lse: SSAValue, block_out: SSAValue, block_lse: SSAValue
) -> func.FuncOp:
    """`(out, lse, block_out, block_lse) -> out`: the output over the keys of both, `(w out + w'
    block_out) / (w + w')` with the weights of `_weights` (their rows broadcast along the output's)."""
    out_type, lse_type = tensor_type(out), tensor_type(lse)
    build = _SegmentBuilder(
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
    if tensor_type(arrived).element_type != F32:
        arrived = build(fusion.CastOp, arrived, type=out_type)
    divisor = build(fusion.MaximumOp, total, build.constant(TINY_F32, out_type))
    numerator = build(
        fusion.AddOp,
        build(fusion.MulOp, ours, running, type=out_type),
        build(fusion.MulOp, theirs, arrived, type=out_type),
    )
    merged = build(fusion.DivOp, numerator, divisor, type=out_type)
    build.block.add_op(func.ReturnOp(merged))
    return _segment(host, "merge_output", build.block)


def _merge_lse_segment(host: func.FuncOp, lse: SSAValue, block_lse: SSAValue) -> func.FuncOp:
    """`(lse, block_lse) -> lse`: the log-sum-exp over the keys of both, `m + log(w + w')`."""
    build = _SegmentBuilder([tensor_type(lse), tensor_type(block_lse)], ["lse", "block_lse"])
    _, _, total, m = _weights(build, *build.block.args)
    build.block.add_op(func.ReturnOp(build(fusion.AddOp, m, build(fusion.LogOp, total))))
    return _segment(host, "merge_lse", build.block)


def _segment(host: func.FuncOp, stem: str, body: Block) -> func.FuncOp:
    results = [value.type for value in body.last_op.operands]
    return func.FuncOp(hir.segment_name(host, stem), ([a.type for a in body.args], results), Region(body), "private")


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
            _move_before(_allocation(buffer), start, rewriter)
        running, running_ops, cast = _accumulator(out, f"{out.name_hint or 'out'}_running")
        block_out = _like(out, tensor_type(op.ins[0]).element_type, "block_out")
        block_lse = _like(lse, F32, "block_lse")
        rewriter.insert([*running_ops, block_out, block_lse], InsertPoint.before(start))
        merge_output = _merge_output_segment(host, running, lse, block_out.result, block_lse.result)
        merge_lse = _merge_lse_segment(host, lse, block_lse.result)
        rewriter.insert([merge_output, merge_lse], InsertPoint.before(host))

        q, k, v = op.ins[:3]
        k_block, v_block = _views(loop, [k, v], slot)
        source = [slot] if op.causal_mask is not None else []
        properties = _block_properties(op)
        iteration = loop.loop.body.block.args[0]
        first = _named(arith.CmpiOp(iteration, index_constant(rewriter, loop.loop, 0), "eq"), "first_block")
        write = hir.AttentionOp([q, k_block, v_block], [running, lse], properties, *source)
        compute = hir.AttentionOp([q, k_block, v_block], [block_out.result, block_lse.result], properties, *source)
        merges = [
            hir.LaunchKernelOp(
                merge_output.sym_name.data, [running, lse, block_out.result, block_lse.result], [running]
            ),
            hir.LaunchKernelOp(merge_lse.sym_name.data, [lse, block_lse.result], [lse]),
        ]
        branches = scf.IfOp(first.result, [], [write, scf.YieldOp()], [compute, *merges, scf.YieldOp()])
        for new_op in (first, write, compute, *merges, branches):
            new_op.location = op.location
        rewriter.insert([first, branches], InsertPoint.before(loop.loop.body.block.last_op))
        after = [cast] if cast is not None else []
        rewriter.replace(op, after, [])


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
        self.before: list[Operation] = []
        """Ops inserted before the loop."""
        self.after: list[Operation] = []
        """Ops inserted after it: the casts of the sums kept in f32."""

    def _sum(self, buffer: SSAValue, name: str) -> SSAValue:
        running, ops, cast = _accumulator(buffer, name)
        self.before += ops
        self.after += [cast] if cast is not None else []
        return running

    def _buffer(self, like: SSAValue, name: str, symmetric: bool = False) -> SSAValue:
        allocation = _like(like, F32, name, symmetric)
        self.before.append(allocation)
        return allocation.result

    def rewrite(self) -> None:
        op, rewriter = self.op, self.rewriter
        grad_query = op.outs[0]
        owners = [scatter.collective.output for scatter in self.scatters]
        for buffer in (grad_query, *owners):
            _move_before(_allocation(buffer), op, rewriter)
        sums = [self._sum(grad_query, "dq_sum"), *(self._sum(o, f"{o.name_hint or 'grad'}_sum") for o in owners)]
        copy_engines = self.backend == hir.CommunicatorBackend.CUDA
        query_share = self._buffer(grad_query, "dq_share")
        shares = [self._buffer(o, f"{what}_share", symmetric=copy_engines) for o, what in zip(owners, KINDS)]
        arrived = [self._buffer(o, f"{what}_arrived") for o, what in zip(owners, KINDS)]
        rewriter.insert(self.before, InsertPoint.before(op))

        position, size, first_device = self._positions()
        # (p - i) mod D as (p + D - i) mod D: index arithmetic is unsigned.
        plus_size = _named(arith.AddiOp(position, size), "position_plus_size")
        rewriter.insert(plus_size, InsertPoint.before(op))
        zero, one = index_constant(rewriter, op, 0), index_constant(rewriter, op, 1)
        body = Block(arg_types=[IndexType()])
        iteration = body.args[0]
        iteration.name_hint = "i"
        ahead = _named(arith.AddiOp(position, iteration), "ahead")
        slot = _named(arith.RemUIOp(ahead.results[0], size), "slot")
        keys = [
            _named(hir.AliasSelectOp(x, key_block_axis(tensor_type(x)), slot.results[0]), f"{what}_block")
            for x, what in zip(op.ins[2:4], KINDS)
        ]
        ins = [*op.ins[:2], *(view.result for view in keys), *op.ins[4:]]
        properties = _block_properties(op)
        source = [slot.results[0]] if op.causal_mask is not None else []
        is_own = _named(arith.CmpiOp(iteration, zero, "eq"), "is_own")
        own = hir.AttentionBackwardOp(ins, sums, properties, *source)
        other = hir.AttentionBackwardOp(ins, [query_share, *shares], properties, *source)
        behind = _named(arith.SubiOp(plus_size.results[0], iteration), "behind")
        from_slot = _named(arith.RemUIOp(behind.results[0], size), "from_slot")
        peers: list[Operation] = [behind, from_slot]
        send_peer = self._device(slot.results[0], first_device, "send_peer", peers)
        recv_peer = self._device(from_slot.results[0], first_device, "recv_peer", peers)
        exchange: list[Operation] = [hir.PointwiseOp("add", [sums[0], query_share], [sums[0]])]
        for share, landing, running in zip(shares, arrived, sums[1:]):
            batch = hir.EndCoalescingOp()
            exchange += [
                hir.StartCoalescingOp(),
                hir.RecvOp(landing, recv_peer, self.backend),
                hir.SendOp(share, send_peer, self.backend),
                batch,
                hir.WaitOp(batch.work),
                hir.PointwiseOp("add", [running, landing], [running]),
            ]
        branches = scf.IfOp(is_own.results[0], [], [own, scf.YieldOp()], [other, *peers, *exchange, scf.YieldOp()])
        body.add_ops([ahead, slot, *keys, is_own, branches, scf.YieldOp()])
        loop = scf.ForOp(zero, size, one, [], body)
        for new_op in loop.walk():
            new_op.location = op.location
        rewriter.insert(loop, InsertPoint.before(op))
        for scatter in self.scatters:
            rewriter.erase(scatter.wait)
            rewriter.erase(scatter.collective)
        gradients = [_allocation(grad) for grad in op.outs[1:]]
        rewriter.replace(op, self.after, [])
        for allocation in gradients:  # computed block by block now, never whole
            if allocation is not None and not allocation.result.uses:
                rewriter.erase(allocation)

    def _positions(self) -> tuple[SSAValue, SSAValue, SSAValue | None]:
        """This device's position in the mesh, the mesh's size, and its first device (None: 0),
        computed once before the loop."""
        op, rewriter = self.op, self.rewriter
        rank = runtime_value(rewriter, op, hir.DeviceIndexOp, "rank")
        size = index_constant(rewriter, op, len(self.mesh))
        if not self.mesh[0]:
            return rank, size, None
        first = index_constant(rewriter, op, self.mesh[0])
        position = _named(arith.SubiOp(rank, first), "position")
        rewriter.insert(position, InsertPoint.before(op))
        return position.results[0], size, first

    @staticmethod
    def _device(slot: SSAValue, first: SSAValue | None, name: str, ops: list[Operation]) -> SSAValue:
        """The mesh device of `slot`, computed by an op appended to `ops`."""
        if first is None:
            return slot
        ops.append(_named(arith.AddiOp(slot, first), name))
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
