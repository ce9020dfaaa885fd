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
values (`hir.dim`, `hir.allocate`, constants) move before the loop instead of
ending it; any other op ends it (pr4147's ThreeSetOps). An allgather or copy that
turns the input's `didx` axis into the output's `stream` axis becomes the
point-to-point allgather of pr4515.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, builtin, func, scf
from xdsl.dialects.builtin import (
    DenseArrayBase,
    FunctionType,
    IndexType,
    IntegerAttr,
    StringAttr,
    SymbolRefAttr,
    i64,
)
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import SymbolTable, is_side_effect_free

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import DYNAMIC, ParallelType, tensor_type
from hostir_dialect.text import HostirError
from passes.axis_mapping import (
    AxisClasses,
    AxisMap,
    func_results,
    matmul_slice_problem,
    operand_axis,
    operand_axis_maps,
    output_of,
    segment_function,
)
from passes.copy_engine import parse_backend, peer_readable

PIPELINED_OPS = (hir.ComputeOp, hir.CommunicationOp)
"""The ops that can be stream-parallel: they write an output buffer."""

REDUCING_OPS = (hir.ReductionOp, hir.AllreduceOp, hir.ReduceOp, hir.ReduceScatterOp)
"""Ops whose input has axes that their output lacks or keeps with extent 1."""


def _without_axis(axes: Sequence[int], removed: int) -> list[int]:
    """Axis numbers once `removed` is gone (and `removed` itself dropped)."""
    return [axis - (axis > removed) for axis in axes if axis != removed]


def _stream_axis(op: Operation) -> int | None:
    """The stream axis of a top-level op's output: the axis its loop walks."""
    if not isinstance(op, PIPELINED_OPS) or not isinstance(op.parent_op(), func.FuncOp):
        return None
    if isinstance(op, hir.ComputeOp) and not op.outs:
        return None
    return tensor_type(output_of(op)).stream_axis


def _p2p_gathered_axis(op: Operation) -> int | None:
    """The output stream axis of an allgather or copy whose input is `didx` on that axis.

    Such an op gathers the shards one device per iteration: the point-to-point allgather.
    """
    if not isinstance(op, hir.AllgatherOp | hir.CopyOp):
        return None
    source, output = tensor_type(op.operands[0]), tensor_type(output_of(op))
    axis = output.stream_axis
    if axis is None or source.rank != output.rank:
        return None
    return axis if source.parallel_types()[axis] == ParallelType.DIDX else None


# --------------------------------------------------------------------------- #
# Diagnostics                                                                  #
# --------------------------------------------------------------------------- #


AxisMaps = list[tuple[SSAValue, AxisMap]]


def _reduced_stream_axis(op: Operation, maps: AxisMaps) -> str | None:
    for index, (operand, axis_map) in enumerate(maps):
        stream = tensor_type(operand).stream_axis
        if stream is not None and axis_map[stream] is None:
            verb = "contracts" if isinstance(op, hir.MatmulOp | hir.LinearOp) else "reduces"
            return (
                f"{op.name} {verb} axis {stream} of operand {index} {tensor_type(operand)}, "
                "which is its stream axis; a reduced axis cannot be stream-parallel"
            )
    return None


def _disagreeing_stream_axes(op: Operation, maps: AxisMaps) -> str | None:
    targets: dict[int, str] = {}
    for index, (operand, axis_map) in enumerate(maps):
        stream = tensor_type(operand).stream_axis
        if stream is not None:
            targets.setdefault(axis_map[stream], f"operand {index} {tensor_type(operand)}")
    if len(targets) < 2:
        return None
    return (
        f"the stream axes of the operands of {op.name} map to different axes "
        f"{sorted(targets)} of its output {tensor_type(output_of(op))}: "
        + "; ".join(f"axis {axis} from {what}" for axis, what in sorted(targets.items()))
    )


def _reduced_output_axis(op: Operation, maps: AxisMaps) -> str | None:
    output = tensor_type(output_of(op))
    stream = output.stream_axis
    if stream is None or not isinstance(op, REDUCING_OPS) or operand_axis(maps[0][1], stream) is not None:
        return None
    return (
        f"the stream axis {stream} of the output {output} of {op.name} is an axis it "
        "reduces, kept with extent 1; no slice of the input computes a slice of it"
    )


def _unsliceable_matmul_axis(op: Operation, maps: AxisMaps) -> str | None:
    output = tensor_type(output_of(op))
    if output.stream_axis is None or not isinstance(op, hir.MatmulOp):
        return None
    lhs, rhs = (tensor_type(value).rank for value in op.ins)
    problem = matmul_slice_problem(lhs, rhs, output.stream_axis)
    if problem is None:
        return None
    return (
        f"the stream axis {output.stream_axis} of the output {output} of hir.matmul is "
        f"{problem}: a matmul of the slices would not be a slice of the product"
    )


def _sparse_p2p_mesh(op: Operation, maps: AxisMaps) -> str | None:
    if _p2p_gathered_axis(op) is None:
        return None
    mesh = tensor_type(op.operands[0]).mesh.ids
    if mesh == tuple(range(mesh[0], mesh[0] + len(mesh))):
        return None
    return (
        f"the point-to-point allgather of {op.name} from {tensor_type(op.operands[0])} "
        "needs a mesh of consecutive devices"
    )


def _didx_to_stream(op: Operation, maps: AxisMaps) -> str | None:
    output = tensor_type(output_of(op))
    if output.stream_axis is None or _p2p_gathered_axis(op) is not None:
        return None
    for index, (operand, axis_map) in enumerate(maps):
        source_axis = operand_axis(axis_map, output.stream_axis)
        if source_axis is not None and source_axis == tensor_type(operand).didx_axis:
            return (
                f"the stream axis {output.stream_axis} of the output {output} of {op.name} is "
                f"the didx axis {source_axis} of operand {index} {tensor_type(operand)}; only an "
                "allgather or a copy can turn a didx axis into a stream axis (the "
                "point-to-point allgather)"
            )
    return None


STREAM_AXIS_CHECKS: tuple[Callable[[Operation, AxisMaps], str | None], ...] = (
    _reduced_stream_axis,
    _disagreeing_stream_axes,
    _reduced_output_axis,
    _unsliceable_matmul_axis,
    _sparse_p2p_mesh,
    _didx_to_stream,
)
"""Each returns what no pipeline covers about an op's stream axes, or None."""


def check_stream_axes(op: hir.ComputeOp | hir.CommunicationOp) -> None:
    """Raises a HostirError where no pipeline covers the stream axes of `op`'s buffers."""
    maps = operand_axis_maps(op)
    for check in STREAM_AXIS_CHECKS:
        if (problem := check(op, maps)) is not None:
            raise HostirError.at(op, problem)


# --------------------------------------------------------------------------- #
# Loops                                                                        #
# --------------------------------------------------------------------------- #


def _is_function_value(op: Operation) -> bool:
    """Ops that the loops of a function share, kept at its top."""
    return isinstance(
        op,
        arith.ConstantOp | hir.GetCurrentStreamOp | hir.NumberOfStreamsOp | hir.DeviceIndexOp,
    )


def _function_value(
    rewriter: PatternRewriter,
    anchor: Operation,
    matches: Callable[[Operation], bool],
    build: Callable[[], Operation],
    name: str,
) -> SSAValue:
    """The result of an op of `anchor`'s block, before it, that `matches`; else of a new one at the top."""
    block = anchor.parent_block()
    assert block is not None
    top = block.first_op
    for op in block.ops:
        if op is anchor:
            break
        if matches(op):
            return op.results[0]
    while top is not None and _is_function_value(top):
        top = top.next_op
    new_op = build()
    new_op.results[0].name_hint = name
    rewriter.insert(new_op, InsertPoint.before(top) if top else InsertPoint.at_end(block))
    return new_op.results[0]


def _index_constant(rewriter: PatternRewriter, anchor: Operation, value: int) -> SSAValue:
    attr = IntegerAttr(value, IndexType())
    return _function_value(
        rewriter,
        anchor,
        lambda op: isinstance(op, arith.ConstantOp) and op.value == attr,
        lambda: arith.ConstantOp(attr),
        f"c{value}",
    )


def _runtime_value(
    rewriter: PatternRewriter, anchor: Operation, op_type: type[Operation], name: str
) -> SSAValue:
    return _function_value(rewriter, anchor, lambda op: isinstance(op, op_type), op_type, name)


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
    lower = _index_constant(rewriter, op, 0)
    step = _index_constant(rewriter, op, 1)
    main = _runtime_value(rewriter, op, hir.GetCurrentStreamOp, "main_stream")
    num_streams = _runtime_value(rewriter, op, hir.NumberOfStreamsOp, "num_streams")

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


@dataclass
class StreamLoop:
    """A loop this pass built, as its prologue (select the iteration's stream, and in a
    synchronisation loop or without `separate_sync_loop` wait for the caller's stream),
    its work, and its epilogue (back to the caller's stream, which waits for the iteration).
    """

    loop: scf.ForOp
    prologue: Sequence[Operation]
    epilogue: Sequence[Operation]

    @property
    def is_sync_loop(self) -> bool:
        return not self.epilogue

    @staticmethod
    def match(op: Operation | None) -> StreamLoop | None:
        if not isinstance(op, scf.ForOp) or op.iter_args:
            return None
        body = list(op.body.block.ops)[:-1]
        if len(body) < 4:
            return None
        stream_index, stream, set_stream = body[:3]
        if not (
            isinstance(stream_index, arith.RemUIOp)
            and stream_index.lhs is op.body.block.args[0]
            and isinstance(stream, hir.StreamOp)
            and stream.index is stream_index.result
            and isinstance(set_stream, hir.SetCurrentStreamOp)
            and set_stream.stream is stream.result
        ):
            return None
        waits_for_caller = (
            isinstance(body[3], hir.SynchronizeStreamOp) and body[3].stream is not stream.result
        )
        prologue = body[: 3 + waits_for_caller]
        if len(body) == 4 and waits_for_caller:
            return StreamLoop(op, prologue, ())
        back_to_main, back_sync = body[-2:]
        if (
            len(body) > len(prologue) + 2
            and isinstance(back_to_main, hir.SetCurrentStreamOp)
            and isinstance(back_sync, hir.SynchronizeStreamOp)
            and back_sync.stream is stream.result
        ):
            return StreamLoop(op, prologue, (back_to_main, back_sync))
        return None

    def sync_loop(self) -> StreamLoop | None:
        """The synchronisation loop right before this work loop, if it has one."""
        before = StreamLoop.match(self.loop.prev_op)
        if before is not None and before.is_sync_loop and before.loop.ub is self.loop.ub:
            return before
        return None

    @property
    def start(self) -> Operation:
        """The first op of this loop's code: its synchronisation loop if any."""
        sync = self.sync_loop()
        return sync.loop if sync else self.loop


def _extent(value: SSAValue) -> object:
    """What a loop extent is known to equal: a number, or the axis of an argument it was read from."""
    owner = value.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return owner.value.value.data
    if isinstance(owner, hir.DimOp):
        buffer, axis = owner.buffer, owner.axis.data
        shape = tensor_type(buffer).get_shape()
        if shape[axis] != DYNAMIC:
            return shape[axis]
        if isinstance(buffer.owner, hir.AllocateOp):
            return _extent(buffer.owner.dynamic_sizes[shape[:axis].count(DYNAMIC)])
        return (buffer, axis)
    return value


def _only_defines_values(op: Operation) -> bool:
    """Ops that may move before a loop without changing what the program does."""
    return isinstance(op, hir.DimOp | hir.AllocateOp) or (not op.regions and is_side_effect_free(op))


# --------------------------------------------------------------------------- #
# Segments                                                                     #
# --------------------------------------------------------------------------- #


def _sliced_axes(function: func.FuncOp, axis: int, call: hir.SegmentCallOp) -> dict[SSAValue, int]:
    """The axis of each value of `function` that corresponds to `axis` of its first result."""
    classes = AxisClasses.of_function(function)
    root = classes.find(func_results(function)[0], axis)
    block = function.body.block
    sliced: dict[SSAValue, int] = {}
    for value in [*block.args, *(result for op in block.ops for result in op.results)]:
        axes = classes.axes_in_class(value, root)
        if len(axes) > 1:
            raise HostirError.at(
                call,
                f"segment @{function.sym_name.data} relates axes {axes} of one of its values to "
                f"the stream axis {axis} of its output; they cannot all be sliced",
            )
        if axes:
            sliced[value] = axes[0]
    return sliced


def _renumber_axis_properties(
    function: func.FuncOp, sliced: dict[SSAValue, int], call: hir.SegmentCallOp
) -> list[fusion.BroadcastOp]:
    """Renumbers the axes that reductions and broadcasts name; returns the broadcasts left with none."""
    emptied: list[fusion.BroadcastOp] = []
    for op in function.body.block.ops:
        if isinstance(op, fusion.ReductionOp) and op.input in sliced:
            if sliced[op.input] in op.reduced_axes:
                raise HostirError.at(
                    call,
                    f"segment @{function.sym_name.data} reduces axis {sliced[op.input]} of "
                    f"{tensor_type(op.input)} in {op.name}, which is its stream axis",
                )
            op.axes = DenseArrayBase.from_list(i64, _without_axis(op.reduced_axes, sliced[op.input]))
        elif isinstance(op, fusion.BroadcastOp) and op.result in sliced:
            rank = tensor_type(op.result).rank
            new_axes = fusion.normalize_axes(op.new_axes.get_values(), rank, "broadcast")
            op.new_axes = DenseArrayBase.from_list(i64, _without_axis(new_axes, sliced[op.result]))
            if not op.new_axes.get_values():
                emptied.append(op)
    return emptied


def _slice_function(function: func.FuncOp, axis: int, call: hir.SegmentCallOp) -> None:
    """Removes from every value of `function` the axis that corresponds to `axis` of its first result.

    A broadcast that only inserted that axis becomes a set.
    """
    sliced = _sliced_axes(function, axis, call)
    emptied_broadcasts = _renumber_axis_properties(function, sliced, call)
    for value, removed in sliced.items():
        Rewriter.replace_value_with_new_type(value, tensor_type(value).without_axis(removed))
    for op in emptied_broadcasts:
        Rewriter.replace_op(op, fusion.SetOp(op.input, tensor_type(op.result)))
    block = function.body.block
    function.function_type = FunctionType.from_lists(
        [arg.type for arg in block.args], [result.type for result in func_results(function)]
    )


def _insert_segment(rewriter: PatternRewriter, sliced: func.FuncOp, original: func.FuncOp) -> str:
    """Inserts `sliced` after `original` as `@<original>_slice`; reuses an equal one if there is one."""
    base = f"{original.sym_name.data}_slice"
    for name in itertools.chain([base], (f"{base}_{n}" for n in itertools.count(1))):
        sliced.sym_name = StringAttr(name)
        existing = SymbolTable.lookup_symbol(original, name)
        if existing is None:
            rewriter.insert(sliced, InsertPoint.after(original))
            return name
        if existing.is_structurally_equivalent(sliced):
            return name


def _erase_if_unused(rewriter: PatternRewriter, segment: func.FuncOp) -> None:
    """Erases a private segment that no launch calls any more."""
    module = segment.parent_op()
    assert module is not None
    name = segment.sym_name.data
    used = any(isinstance(op, hir.SegmentCallOp) and op.callee.string_value() == name for op in module.walk())
    if not used and segment.sym_visibility == StringAttr("private"):
        rewriter.erase(segment)


def _slice_segment_call(rewriter: PatternRewriter, call: hir.SegmentCallOp, axis: int) -> None:
    """Makes `call` run a copy of its segment on slices: `@<segment>_slice`."""
    original = segment_function(call)
    sliced = original.clone()
    _slice_function(sliced, axis, call)
    call.callee = SymbolRefAttr(_insert_segment(rewriter, sliced, original))
    _erase_if_unused(rewriter, original)


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
        if axis is None or _p2p_gathered_axis(op) is not None:
            return
        maps = operand_axis_maps(op)
        index, work = _insert_stream_loops(rewriter, op, axis, self.separate_sync_loop)
        first = _index_constant(rewriter, op, 0)
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
            _slice_segment_call(rewriter, op, axis)
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
        op.axes = DenseArrayBase.from_list(i64, _without_axis(reduced, removed))


def _waits(op: Operation) -> list[Operation]:
    """The hir.wait ops of a communication."""
    return [use.operation for result in op.results for use in result.uses]


@dataclass
class PipelineP2PAllgather(RewritePattern):
    """The point-to-point allgather of pr4515, for an allgather (or copy) from `didx` to `stream`.

    Iteration `i` fills slice `i` of the output with the shard of mesh device `i`:
    that device copies its own shard; every other device receives it from device `i`
    and, in the same batch, sends its shard there.

    The copy engines move the bytes when `backend` is cuda or the allgather asks for
    them; the shard that peers then read becomes symmetric before the loops
    (`peer_readable`), so that its copy, if any, is done before the streams start.
    """

    backend: hir.CommunicatorBackend
    separate_sync_loop: bool

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        if _stream_axis(op) is None or (axis := _p2p_gathered_axis(op)) is None:
            return
        backend = self.backend
        if isinstance(op, hir.AllgatherOp) and op.backend.data == hir.CommunicatorBackend.CUDA:
            backend = op.backend.data
        source, output = op.operands[0], output_of(op)
        if backend == hir.CommunicatorBackend.CUDA:
            source = peer_readable(rewriter, source, op)
        first_device = tensor_type(source).mesh.ids[0]
        index, work = _insert_stream_loops(rewriter, op, axis, self.separate_sync_loop)
        rank = _runtime_value(rewriter, op, hir.DeviceIndexOp, "rank")
        own_shard = hir.AliasSelectOp(source, axis, _index_constant(rewriter, op, 0))
        own_shard.result.name_hint = "own_shard"
        received = _select(output, axis, index)
        peer_ops: list[Operation] = []
        peer = index
        if first_device:
            peer_ops = [arith.AddiOp(index, _index_constant(rewriter, op, first_device))]
            peer = peer_ops[0].results[0]
            peer.name_hint = "peer"
        is_own = arith.CmpiOp(peer, rank, "eq")
        is_own.result.name_hint = "is_own"
        batch = hir.EndCoalescingOp()
        exchange = scf.IfOp(
            is_own,
            [],
            [own_shard, hir.CopyOp([own_shard.result], [received.result]), scf.YieldOp()],
            [
                hir.StartCoalescingOp(),
                hir.RecvOp(received.result, peer, backend),
                hir.SendOp(source, peer, backend),
                batch,
                hir.WaitOp(batch.work),
                scf.YieldOp(),
            ],
        )
        rewriter.insert([received, *peer_ops, is_own, exchange], work)
        for wait in _waits(op):
            rewriter.erase(wait)
        rewriter.erase(op)


class MergeStreamLoops(RewritePattern):
    """Moves the work of a stream loop into the previous work loop over the same extent.

    Ops in between that only define values move before the first loop; the second
    loop's synchronisation loop goes, and its slices that the first loop already
    made are reused.
    """

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scf.ForOp, rewriter: PatternRewriter, /) -> None:
        second = StreamLoop.match(op)
        if second is None or second.is_sync_loop:
            return
        between: list[Operation] = []
        previous = second.start.prev_op
        while previous is not None and _only_defines_values(previous):
            between.append(previous)
            previous = previous.prev_op
        first = StreamLoop.match(previous)
        if first is None or first.is_sync_loop or _extent(first.loop.ub) != _extent(op.ub):
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
        rewriter.inline_block(block, InsertPoint.before(first.epilogue[0]), [first.loop.body.block.args[0]])
        extent = op.ub
        rewriter.erase(op)
        if isinstance(extent.owner, hir.DimOp) and not extent.uses:
            rewriter.erase(extent.owner)
        _reuse_slices(rewriter, first.loop.body.block)


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
    """Pipelines stream-parallel ops over CUDA streams (see the module docstring).

    `p2p_backend` moves the bytes of the point-to-point allgather (nccl, or cuda for
    the copy engines, also used for an allgather that has backend cuda itself);
    `separate_sync_loop` puts the synchronisation of the streams
    with the caller's stream in its own loop before each work loop.
    """

    name = "stream-parallel"

    p2p_backend: str = "nccl"
    separate_sync_loop: bool = True

    def apply(self, ctx: Context, op: builtin.ModuleOp) -> None:
        p2p_backend = parse_backend(self.name, "p2p_backend", self.p2p_backend)
        for hir_op in op.walk():
            if isinstance(hir_op, PIPELINED_OPS):
                check_stream_axes(hir_op)
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    PipelineP2PAllgather(p2p_backend, self.separate_sync_loop),
                    PipelineStreamParallelOp(self.separate_sync_loop),
                    MergeStreamLoops(),
                ]
            )
        ).rewrite_module(op)
