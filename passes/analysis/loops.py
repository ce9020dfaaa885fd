"""The stream loops of `stream-parallel`, and the index values that loop bodies use.

`StreamLoop` recognises the loops `stream-parallel` builds (its prologue that picks the
iteration's stream, its epilogue that joins the caller's stream), which the passes after
it rewrite. The index values that every iteration shares are made once, at the top of the
function, and found there again by the next pass that needs them: a constant
(`index_constant`), a runtime value (`runtime_value`: `hir.device_index`, ...), the
positions of a pair of devices (`PairPositions`) or around a team (`RingPositions`). What
only computes an index, or names a view, may be computed again for another iteration
(`is_index_arithmetic`, `recomputable`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import IndexType, IntegerAttr, LocationAttr
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint
from xdsl.traits import is_side_effect_free

from hostir_dialect import hir


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


def named(op: Operation, name: str) -> Operation:
    """`op`, its first result named `name` (the name the printer gives it) for the loops' readers."""
    op.results[0].name_hint = name
    return op


def index_constant(rewriter: PatternRewriter, anchor: Operation, value: int) -> SSAValue:
    """The index constant `value` of `anchor`'s block: one before `anchor`, or a new one at the
    top of the block, with the other values that the loops of a function share."""
    attr = IntegerAttr(value, IndexType())
    return _function_value(
        rewriter,
        anchor,
        lambda op: isinstance(op, arith.ConstantOp) and op.value == attr,
        lambda: arith.ConstantOp(attr),
        f"c{value}",
    )


def runtime_value(
    rewriter: PatternRewriter, anchor: Operation, op_type: type[Operation], name: str
) -> SSAValue:
    """The result of an op of `op_type` (one without operands, like `hir.device_index`) of
    `anchor`'s block, as `index_constant` finds or makes a constant."""
    return _function_value(rewriter, anchor, lambda op: isinstance(op, op_type), op_type, name)


@dataclass
class StreamLoop:
    """A loop `stream-parallel` built, as its prologue (select the iteration's stream, and in a
    synchronisation loop or without `separate_sync_loop` wait for the caller's stream),
    its work, and its epilogue (back to the caller's stream, which waits for the iteration).
    """

    loop: scf.ForOp
    prologue: Sequence[Operation]
    epilogue: Sequence[Operation]

    @property
    def is_sync_loop(self) -> bool:
        return not self.epilogue

    @property
    def stream_index(self) -> arith.RemUIOp:
        """`i mod number_of_streams`, which picks the stream of an iteration."""
        stream_index = self.prologue[0]
        assert isinstance(stream_index, arith.RemUIOp)
        return stream_index

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


def is_index_arithmetic(op: Operation) -> bool:
    """An op that only computes a value from its operands: arith's (whose divisions xDSL does
    not count as side-effect free, as they may trap on zero), or any other without effects
    or regions. Computing it again from the same operands gives the same value."""
    return not op.regions and (op.dialect_name() == "arith" or is_side_effect_free(op))


def recomputable(op: Operation) -> bool:
    """Ops that B may read from A: they only name a view or compute an index, so cloning
    them for another iteration is free."""
    return isinstance(op, hir.AliasSelectOp) or is_index_arithmetic(op)


@dataclass
class PairPositions:
    """This device's and its peer's positions in a team of two, and the peer's device."""

    own: SSAValue
    peer: SSAValue
    peer_device: SSAValue
    zero: SSAValue

    @staticmethod
    def serves(team: Sequence[int]) -> bool:
        """Whether `team` is a pair, whose positions these are."""
        return len(team) == 2

    @staticmethod
    def insert(
        team: tuple[int, ...], anchor: Operation, rewriter: PatternRewriter, location: LocationAttr
    ) -> PairPositions:
        """Computed once, in the function's body before `anchor`, right after the constants
        and the device index they are computed from (every iteration of the loops around
        has the same)."""
        zero, one = index_constant(rewriter, anchor, 0), index_constant(rewriter, anchor, 1)
        first, second = index_constant(rewriter, anchor, team[0]), index_constant(rewriter, anchor, team[1])
        rank = runtime_value(rewriter, anchor, hir.DeviceIndexOp, "rank")
        is_second = arith.CmpiOp(rank, second, "eq")
        own = arith.SelectOp(is_second.result, one, zero)
        peer = arith.SelectOp(is_second.result, zero, one)
        peer_device = arith.SelectOp(is_second.result, first, second)
        ops = [is_second, own, peer, peer_device]
        for new_op, name in zip(ops, ("is_second", "own_position", "peer_position", "peer_device")):
            new_op.result.name_hint = name
            new_op.location = location
        inputs = {value.owner for value in (zero, one, first, second, rank)}
        last_input = [o for o in anchor.parent_block().ops if o in inputs][-1]
        rewriter.insert(ops, InsertPoint.after(last_input))
        return PairPositions(own.result, peer.result, peer_device.result, zero)


@dataclass
class RingPositions:
    """This device's position in a team of consecutive devices, the positions `t` ahead of
    it around the team (`ahead[t]`, `(own + t) mod D`, `ahead[0]` the own), and their
    devices (`devices[t]`)."""

    own: SSAValue
    ahead: list[SSAValue]
    devices: list[SSAValue]
    zero: SSAValue

    @staticmethod
    def serves(team: Sequence[int]) -> bool:
        """Whether `team` is consecutive devices in order, whose positions these are."""
        return bool(team) and list(team) == list(range(team[0], team[0] + len(team)))

    @staticmethod
    def insert(
        team: Sequence[int], anchor: Operation, rewriter: PatternRewriter, location: LocationAttr
    ) -> RingPositions:
        """Computed once, in the function's body before `anchor`, as `PairPositions`; `team`
        must be consecutive devices (a device is its position plus the first's)."""
        assert RingPositions.serves(team), f"team {list(team)} is not consecutive"
        zero, size = index_constant(rewriter, anchor, 0), index_constant(rewriter, anchor, len(team))
        steps = [index_constant(rewriter, anchor, t) for t in range(1, len(team))]
        first = index_constant(rewriter, anchor, team[0]) if team[0] else None
        rank = runtime_value(rewriter, anchor, hir.DeviceIndexOp, "rank")
        ops: list[Operation] = []

        def emitted(op: Operation, name: str) -> SSAValue:
            named(op, name).location = location
            ops.append(op)
            return op.results[0]

        own = emitted(arith.SubiOp(rank, first), "own_position") if first else rank
        ahead, devices = [own], [rank]
        for t, step in enumerate(steps, start=1):
            plus = emitted(arith.AddiOp(own, step), f"ahead_{t}_unwrapped")
            ahead.append(emitted(arith.RemUIOp(plus, size), f"position_{t}_ahead"))
            devices.append(emitted(arith.AddiOp(ahead[t], first), f"device_{t}_ahead") if first else ahead[t])
        inputs = {value.owner for value in (zero, size, *steps, rank, *([first] if first else []))}
        last_input = [o for o in anchor.parent_block().ops if o in inputs][-1]
        rewriter.insert(ops, InsertPoint.after(last_input))
        return RingPositions(own, ahead, devices, zero)
