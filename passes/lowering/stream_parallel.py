"""`stream-parallel`: pipelines every op whose output has a `stream` axis over CUDA streams.

nvFuser's StreamParallelType host-IR pass. An op is stream-parallel when its output
(a collective's `output`, a compute op's first out) has a `stream` axis. It moves
into a loop over that axis; iteration `i` runs on pool stream `i mod
number_of_streams`, on slices (`hir.alias_select`) of the operands:

    %main = hir.get_current_stream                   once, at the top of the function
    scf.for %i = %c0 to %n step %c1 {                the synchronisation loop
      %s = hir.stream (%i mod number_of_streams); hir.set_current_stream %s
      hir.synchronize_stream %main                   stream %s starts after the caller's work
    }
    scf.for %i = %c0 to %n step %c1 {                the work loop
      %s = ...; hir.set_current_stream %s
      slices, the op (and the hir.wait of a communication)
      hir.set_current_stream %main
      hir.synchronize_stream %s                      the caller waits for the iteration
    }

The synchronisation has its own loop (reference pr4401): at the top of the work loop,
stream `i` would also wait for the back-synchronisation of every earlier iteration,
which serialises the pipeline. `separate_sync_loop=false` puts it there anyway, as
pr4147 did. Consecutive loops over the same extent merge; ops that only define
values (`hir.dim`, `hir.allocate`, constants), and data-movement segments whose
buffers the first loop does not use (a weight's broadcast), move before the loop
instead of ending it; any other op ends it (pr4147's ThreeSetOps).

An allgather or copy that turns the input's `didx` axis into the output's `stream`
axis becomes the point-to-point allgather of pr4515, in ring order by default. With
`p` this device's position in the mesh (`hir.device_index` minus the mesh's first
device) and `D` the mesh size, iteration `i` works on slot `s = (p + i) mod D`:

    %slot = (p + i) mod D; %out_slice = hir.alias_select %out[axis = %slot]
    scf.if (i == 0) {                                the own shard
      hir.copy ins(own shard) outs(%out_slice)
    } else {                                         one coalesced batch
      hir.recv %out_slice from device first + s
      hir.send own shard to device first + (p + D - i) mod D
      hir.wait (the batch)
    }

At every step each device receives from one peer and sends to another, so every link
is busy, and the two sides of each pair issue their send and recv at the same
iteration. Every slice of that iteration is at the slot: an op merged into the loop
later (the matmul of AG+matmul) reads the slice that has just arrived. So a plain
loop merged into a ring loop gets the slot for its induction variable, and a ring
loop does not merge into a loop that visits the slots in another order (a plain
loop, or a ring over another mesh). `p2p_order=device` emits pr4515's order instead:
iteration `i` fills slot `i` with the shard of mesh device `i`, which that device
copies and every other device exchanges with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from xdsl.context import Context
from xdsl.dialects import arith, builtin, func, scf
from xdsl.dialects.builtin import DenseArrayBase, IndexType, i64
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
from xdsl.traits import is_side_effect_free

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import tensor_type
from hostir.passes.analysis.axis_mapping import operand_axis, operand_axis_maps, output_of, without_axis
from hostir.passes.analysis.extents import known_extent
from hostir.passes.analysis.loops import StreamLoop, index_constant, is_index_arithmetic, named, runtime_value
from hostir.passes.lowering.peer_readable import peer_readable
from hostir.passes.lowering.segment_slicing import slice_segment_call
from hostir.passes.lowering.stream_axis_checks import check_stream_axes, p2p_gathered_axis
from hostir.passes.options import check_choice

PIPELINED_OPS = (hir.ComputeOp, hir.CommunicationOp)
"""The ops that can be stream-parallel: they write an output buffer."""


def _stream_axis(op: Operation) -> int | None:
    """The stream axis of a top-level op's output: the axis its loop walks."""
    if not isinstance(op, PIPELINED_OPS) or not isinstance(op.parent_op(), func.FuncOp):
        return None
    if isinstance(op, hir.ComputeOp) and not op.outs:
        return None
    return tensor_type(output_of(op)).stream_axis


# --------------------------------------------------------------------------- #
# Loops                                                                        #
# --------------------------------------------------------------------------- #


def _iteration_stream(index: SSAValue, num_streams: SSAValue) -> list[Operation]:
    """Makes pool stream `index mod num_streams` current."""
    stream_index = arith.RemUIOp(index, num_streams)
    stream_index.result.name_hint = "stream_index"
    stream = hir.StreamOp(stream_index.result)
    stream.result.name_hint = "stream"
    return [stream_index, stream, hir.SetCurrentStreamOp(stream.result)]


def _insert_stream_loops(
    rewriter: PatternRewriter, op: Operation, axis: int, separate_sync_loop: bool
) -> tuple[SSAValue, InsertPoint]:
    """Inserts before `op` the loops over `axis` of its output; returns the index and where the work goes."""
    extent = hir.DimOp(output_of(op), axis)
    extent.result.name_hint = "extent"
    rewriter.insert(extent, InsertPoint.before(op))
    lower = index_constant(rewriter, op, 0)
    step = index_constant(rewriter, op, 1)
    main = runtime_value(rewriter, op, hir.GetCurrentStreamOp, "main_stream")
    num_streams = runtime_value(rewriter, op, hir.NumberOfStreamsOp, "num_streams")

    def insert_loop(body: Callable[[SSAValue], list[Operation]]) -> scf.ForOp:
        block = Block(arg_types=[IndexType()])
        block.args[0].name_hint = "i"
        prologue = _iteration_stream(block.args[0], num_streams)
        block.add_ops([*prologue, *body(prologue[1].results[0]), scf.YieldOp()])
        loop = scf.ForOp(lower, extent.result, step, [], block)
        rewriter.insert(loop, InsertPoint.before(op))
        return loop

    if separate_sync_loop:
        insert_loop(lambda stream: [hir.SynchronizeStreamOp(main)])
    back_to_main = hir.SetCurrentStreamOp(main)
    sync_in_loop = [] if separate_sync_loop else [hir.SynchronizeStreamOp(main)]
    work = insert_loop(lambda stream: [*sync_in_loop, back_to_main, hir.SynchronizeStreamOp(stream)])
    return work.body.block.args[0], InsertPoint.before(back_to_main)


def _only_defines_values(op: Operation) -> bool:
    """Ops that may move before a loop without changing what the program does."""
    return isinstance(op, hir.DimOp | hir.AllocateOp) or (not op.regions and is_side_effect_free(op))


def _buffers(ops: Sequence[Operation]) -> set[SSAValue]:
    """The buffers that `ops` (and the ops they hold) read or write, through any view."""
    return {
        hir.view_root(value)
        for op in ops
        for inner in op.walk()
        for value in inner.operands
        if isinstance(value.type, fusion.TensorType)
    }


# --------------------------------------------------------------------------- #
# Patterns                                                                     #
# --------------------------------------------------------------------------- #


@dataclass
class PipelineStreamParallelOp(RewritePattern):
    """Moves a stream-parallel op into its own stream loops, on slices of its buffers.

    Each buffer is sliced along the axis that corresponds to the output's stream axis;
    a buffer without one is used whole, and an extent-1 (broadcast) axis is sliced at
    index 0 so that the slices keep the ranks that the op's semantics align.
    """

    separate_sync_loop: bool

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        axis = _stream_axis(op)
        if axis is None or p2p_gathered_axis(op) is not None:
            return
        maps = operand_axis_maps(op)
        index, work = _insert_stream_loops(rewriter, op, axis, self.separate_sync_loop)
        first = index_constant(rewriter, op, 0)
        operands: list[SSAValue] = []
        for operand, axis_map in maps:
            source_axis = operand_axis(axis_map, axis)
            if source_axis is None:
                operands.append(operand)
                continue
            broadcast = tensor_type(operand).get_shape()[source_axis] == 1
            view = _select(operand, source_axis, first if broadcast else index)
            rewriter.insert(view, work)
            operands.append(view.result)
        if isinstance(op, hir.ReductionOp):
            _renumber_reduced_axes(op, operand_axis(maps[0][1], axis))
        if isinstance(op, hir.SegmentCallOp):
            slice_segment_call(rewriter, op, axis)
        op.operands = operands
        for moved in (op, *_waits(op)):
            moved.detach()
            rewriter.insert(moved, work)


def _select(buffer: SSAValue, axis: int, index: SSAValue) -> hir.AliasSelectOp:
    view = hir.AliasSelectOp(buffer, axis, index)
    view.result.name_hint = f"{buffer.name_hint}_slice" if buffer.name_hint else None
    return view


def _renumber_reduced_axes(op: hir.ReductionOp, removed: int | None) -> None:
    """The reduced axes of `op` once its input has lost axis `removed`."""
    if removed is not None:
        reduced = fusion.normalize_axes(op.axes.get_values(), tensor_type(op.ins[0]).rank, "reduction")
        op.axes = DenseArrayBase.from_list(i64, without_axis(reduced, removed))


def _waits(op: Operation) -> list[Operation]:
    """The hir.wait ops of a communication."""
    return [use.operation for result in op.results for use in result.uses]


class P2POrder(StrEnum):
    """The order in which the point-to-point allgather visits the shards."""

    RING = "ring"
    """Iteration `i` fills slot `(p + i) mod D`: every device sends to one peer and receives
    from another at every step, so every link is busy (the default)."""
    DEVICE = "device"
    """Iteration `i` fills slot `i` from mesh device `i`, as pr4515 does: every device talks
    to device `i` at once."""


class _Exchange:
    """The index arithmetic of one iteration of the point-to-point allgather.

    `slot_ops` (at the top of the iteration) select `received`, the slice of the output
    that the iteration fills, and compute `is_own`, whether the device copies its own
    shard there; `peer_ops` (in the branch that exchanges) compute `recv_peer` and
    `send_peer`, the devices it receives from and sends to. Values that every iteration
    shares go before the loops.
    """

    def __init__(self, rewriter: PatternRewriter, op: Operation, mesh: Sequence[int], index: SSAValue):
        self.rewriter, self.op, self.mesh, self.index = rewriter, op, mesh, index
        self.rank = runtime_value(rewriter, op, hir.DeviceIndexOp, "rank")
        self.zero = index_constant(rewriter, op, 0)
        self.first = index_constant(rewriter, op, mesh[0]) if mesh[0] else None
        self.slot_ops: list[Operation] = []
        self.peer_ops: list[Operation] = []

    def _device(self, slot: SSAValue, name: str, ops: list[Operation]) -> SSAValue:
        """The mesh device of `slot`, computed by ops appended to `ops`."""
        if self.first is None:
            return slot
        ops.append(named(arith.AddiOp(slot, self.first), name))
        return ops[-1].results[0]

    def _before_loops(self, ops: list[Operation]) -> None:
        loop = self.index.owner.parent_op()
        assert isinstance(loop, scf.ForOp)
        # Before the extent that the loops walk, which comes right before them.
        self.rewriter.insert(ops, InsertPoint.before(loop.ub.owner))

    def in_ring_order(self, output: SSAValue, axis: int) -> None:
        """Iteration i fills slot (p + i) mod D from mesh device (p + i) mod D, and sends
        the own shard to mesh device (p + D - i) mod D; p is the position of this device."""
        index, size = self.index, index_constant(self.rewriter, self.op, len(self.mesh))
        invariant: list[Operation] = []
        position = self.rank
        if self.first is not None:
            invariant.append(named(arith.SubiOp(self.rank, self.first), "position"))
            position = invariant[-1].results[0]
        # (p - i) mod D as (p + D - i) mod D: index arithmetic is unsigned.
        invariant.append(named(arith.AddiOp(position, size), "position_plus_size"))
        self._before_loops(invariant)
        ahead = named(arith.AddiOp(position, index), "ahead")
        slot = named(arith.RemUIOp(ahead.results[0], size), "slot")
        self.received = _select(output, axis, slot.results[0])
        is_own = named(arith.CmpiOp(index, self.zero, "eq"), "is_own")
        self.slot_ops = [ahead, slot, self.received, is_own]
        self.is_own = is_own.results[0]
        self.recv_peer = self._device(slot.results[0], "recv_peer", self.peer_ops)
        behind = named(arith.SubiOp(invariant[-1].results[0], index), "behind")
        send_slot = named(arith.RemUIOp(behind, size), "send_slot" if self.first else "send_peer")
        self.peer_ops += [behind, send_slot]
        self.send_peer = self._device(send_slot.results[0], "send_peer", self.peer_ops)

    def in_device_order(self, output: SSAValue, axis: int) -> None:
        """pr4515: iteration i fills slot i, exchanging with mesh device i."""
        self.received = _select(output, axis, self.index)
        self.slot_ops = [self.received]
        peer = self._device(self.index, "peer", self.slot_ops)
        self.recv_peer = self.send_peer = peer
        is_own = named(arith.CmpiOp(peer, self.rank, "eq"), "is_own")
        self.slot_ops.append(is_own)
        self.is_own = is_own.results[0]


@dataclass
class PipelineP2PAllgather(RewritePattern):
    """The point-to-point allgather, for an allgather (or copy) from `didx` to `stream`.

    In ring order (the default), with `p` this device's position in the mesh and `D`
    the mesh size, iteration `i` fills slot `s = (p + i) mod D` of the output: at
    `i == 0` the device copies its own shard there; otherwise, in one coalesced batch,
    it receives slot `s` from mesh device `s` and sends its own shard to mesh device
    `(p + D - i) mod D` (whose slot at iteration `i` is `p`), then waits for the batch.
    In device order (pr4515), iteration `i` fills slot `i` with the shard of mesh device
    `i`: that device copies its own shard; every other device receives it from device
    `i` and, in the same batch, sends its shard there.

    The copy engines move the bytes when `backend` is cuda or the allgather asks for
    them; the shard that peers then read becomes symmetric before the loops
    (`peer_readable`), so that its copy, if any, is done before the streams start.
    """

    backend: hir.CommunicatorBackend
    separate_sync_loop: bool
    order: P2POrder = P2POrder.RING

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        if _stream_axis(op) is None or (axis := p2p_gathered_axis(op)) is None:
            return
        backend = self.backend
        if isinstance(op, hir.AllgatherOp) and op.backend.data == hir.CommunicatorBackend.CUDA:
            backend = op.backend.data
        source, output = op.operands[0], output_of(op)
        if backend == hir.CommunicatorBackend.CUDA:
            source = peer_readable(rewriter, source, op)
        index, work = _insert_stream_loops(rewriter, op, axis, self.separate_sync_loop)
        exchange = _Exchange(rewriter, op, tensor_type(source).mesh.ids, index)
        if self.order == P2POrder.RING:
            exchange.in_ring_order(output, axis)
        else:
            exchange.in_device_order(output, axis)
        own_shard = named(hir.AliasSelectOp(source, axis, exchange.zero), "own_shard")
        received = exchange.received.result
        batch = hir.EndCoalescingOp()
        branches = scf.IfOp(
            exchange.is_own,
            [],
            [own_shard, hir.CopyOp([own_shard.results[0]], [received]), scf.YieldOp()],
            [
                *exchange.peer_ops,
                hir.StartCoalescingOp(),
                hir.RecvOp(received, exchange.recv_peer, backend),
                hir.SendOp(source, exchange.send_peer, backend),
                batch,
                hir.WaitOp(batch.work),
                scf.YieldOp(),
            ],
        )
        rewriter.insert([*exchange.slot_ops, branches], work)
        for wait in _waits(op):
            rewriter.erase(wait)
        rewriter.erase(op)


def _p2p_slot(loop: StreamLoop) -> SSAValue | None:
    """The slot that an iteration of `loop` receives (the index of the slice that a `hir.recv`
    of the loop fills), if the loop holds a point-to-point allgather."""
    block = loop.loop.body.block
    for op in block.ops:
        if not isinstance(op, scf.IfOp):
            continue
        for inner in op.walk():
            if (
                isinstance(inner, hir.RecvOp)
                and isinstance(view := inner.buffer.owner, hir.AliasSelectOp)
                and view.parent_block() is block
            ):
                return view.index
    return None


def _expression(value: SSAValue, induction: SSAValue) -> object:
    """What `value` computes from the loop's `induction` variable, comparable across loops:
    the tree of the arith and side-effect-free ops that compute it, with the induction
    variable as `"i"` and any other value as itself."""
    if value is induction:
        return "i"
    owner = value.owner
    if not isinstance(owner, Operation) or not is_index_arithmetic(owner):
        return value
    return (
        owner.name,
        value.index,
        tuple(sorted(owner.properties.items())),
        tuple(_expression(operand, induction) for operand in owner.operands),
    )


DATA_MOVEMENT = (hir.PostOnStreamOp, hir.CopyOp)
"""Ops between two stream loops that only move data, which move before the first if it does not
touch their buffers."""


class MergeStreamLoops(RewritePattern):
    """Moves the work of a stream loop into the previous work loop over the same extent.

    Ops in between that only define values move before the first loop, and so does an op
    that only moves data (a `hir.post_on_stream` segment: a weight read through a
    broadcast; a `hir.copy`: the copy into symmetric memory of the shard that a
    copy-engine ring sends) whose buffers the first loop does not use: it cannot depend
    on the loop, nor the loop on it, so it is loop-invariant, and left between the loops
    it would split the pipeline (the intermediate between them would then be allocated
    whole, not one slice per stream; two rings would run one after the other). The second loop's synchronisation loop goes, and its slices that the
    first loop already made are reused.

    An iteration of a ring point-to-point allgather works on its slot, not on slot `i`:
    the work of a plain loop merged into it runs on that slot too (its induction
    variable becomes the slot), so that it reads the slice that has just arrived. A ring
    loop merges into a previous loop only if that loop visits the slots in the same
    order; after a plain loop, or a ring over another mesh, it stays a loop of its own.
    """

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scf.ForOp, rewriter: PatternRewriter, /) -> None:
        second = StreamLoop.match(op)
        if second is None or second.is_sync_loop:
            return
        between: list[Operation] = []
        previous = second.start.prev_op
        while previous is not None and (_only_defines_values(previous) or isinstance(previous, DATA_MOVEMENT)):
            between.append(previous)
            previous = previous.prev_op
        first = StreamLoop.match(previous)
        if first is None or first.is_sync_loop or known_extent(first.loop.ub) != known_extent(op.ub):
            return
        movements = [between_op for between_op in between if isinstance(between_op, DATA_MOVEMENT)]
        if movements and _buffers(movements) & _buffers([first.start, first.loop]):
            return
        first_index, second_index = first.loop.body.block.args[0], op.body.block.args[0]
        first_slot = _p2p_slot(first)
        if first_slot is None:
            first_slot = first_index
        second_slot = _p2p_slot(second)
        if second_slot is None:
            # Plain work: it runs on the slot of the first loop's iteration.
            index, same_slot = first_slot, None
        elif _expression(second_slot, second_index) == _expression(first_slot, first_index):
            # Exchanges in the same order: the second loop's slot is the first's.
            index, same_slot = first_index, (second_slot if second_slot is not second_index else None)
        else:
            return
        for value_op in reversed(between):
            value_op.detach()
            rewriter.insert(value_op, InsertPoint.before(first.start))
        if (second_sync := second.sync_loop()) is not None:
            rewriter.erase(second_sync.loop)
        block = op.body.block
        rewriter.erase(block.last_op)
        for stream_op in reversed((*second.prologue, *second.epilogue)):
            rewriter.erase(stream_op)
        rewriter.inline_block(block, InsertPoint.before(first.epilogue[0]), [index])
        extent = op.ub
        rewriter.erase(op)
        if isinstance(extent.owner, hir.DimOp) and not extent.uses:
            rewriter.erase(extent.owner)
        if same_slot is not None:
            # The second ring computes the same slot again: its ops use the first's.
            rewriter.replace_all_uses_with(same_slot, first_slot)
            _erase_unused_arith(rewriter, same_slot)
        _reuse_slices(rewriter, first.loop.body.block)


def _erase_unused_arith(rewriter: PatternRewriter, value: SSAValue) -> None:
    """Erases the arith op of `value` if nothing uses it, then those of its operands."""
    owner = value.owner
    if not isinstance(owner, Operation) or owner.dialect_name() != "arith" or value.uses:
        return
    operands = list(owner.operands)
    rewriter.erase(owner)
    for operand in operands:
        _erase_unused_arith(rewriter, operand)


def _reuse_slices(rewriter: PatternRewriter, block: Block) -> None:
    """Replaces each slice that an earlier op of `block` already made by that one."""
    made: dict[tuple[SSAValue, int, SSAValue], SSAValue] = {}
    for op in list(block.ops):
        if not isinstance(op, hir.AliasSelectOp):
            continue
        key = (op.input, op.axis.data, op.index)
        if key in made:
            rewriter.replace_all_uses_with(op.result, made[key])
            rewriter.erase(op)
        else:
            made[key] = op.result


@dataclass(frozen=True)
class StreamParallelLowering(ModulePass):
    """Pipelines stream-parallel ops over CUDA streams, one loop iteration per slice of the stream axis.

    `p2p_backend` moves the bytes of the point-to-point allgather (nccl, or cuda for
    the copy engines, also used for an allgather that has backend cuda itself);
    `separate_sync_loop` puts the synchronisation of the streams
    with the caller's stream in its own loop before each work loop; `p2p_order` is the
    order of the point-to-point allgather's exchanges (ring, or device for pr4515's).
    """

    name = "stream-parallel"

    p2p_backend: str = "nccl"
    separate_sync_loop: bool = True
    p2p_order: str = "ring"

    def __post_init__(self) -> None:
        # A value the pass cannot use is refused when the pass is built, before it runs.
        check_choice(self.name, "p2p_backend", self.p2p_backend, hir.CommunicatorBackend)
        check_choice(self.name, "p2p_order", self.p2p_order, P2POrder)

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        p2p_backend = hir.CommunicatorBackend(self.p2p_backend)
        p2p_order = P2POrder(self.p2p_order)
        for hir_op in op.walk():
            if isinstance(hir_op, PIPELINED_OPS):
                check_stream_axes(hir_op)
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    PipelineP2PAllgather(p2p_backend, self.separate_sync_loop, p2p_order),
                    PipelineStreamParallelOp(self.separate_sync_loop),
                    MergeStreamLoops(),
                ]
            )
        ).rewrite_module(op)
