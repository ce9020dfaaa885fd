"""A timeline of one run of a host program: every op's start and end, per rank and per stream.

    outputs, intervals = trace_run(program, local_inputs, communicator)
    write_chrome_trace(intervals, "trace.json", "@ag_linear")    # Perfetto / chrome://tracing
    write_timeline_png(intervals, "trace.png", "@ag_linear")     # one lane per (rank, stream)

`trace_run` runs a copy of the program prepared with every step wrapped
(`Program.run(wrap_step=...)`), so the program that runs untraced pays nothing. The
wrapper marks the time before and after each op on the stream that is current when
the op starts:

* on CUDA, a CUDA event recorded on that stream (when the stream reaches the op, and
  when it is past it) and the host clock (when the interpreter issued it). The events
  are only read after the run, against one reference event recorded on an idle
  device, so tracing adds no synchronisation between streams;
* on the CPU, the host clock alone (`time.perf_counter_ns`): ops run in program order,
  so the CPU has one lane per rank.

A communication is issued by one op and finished by the `hir.wait` of its work; the
span from the issue's start to that wait's end is the communication *in flight*, an
interval of its own (docs/replay-and-trace.md says exactly what each box means).
Every interval is measured from the start of the traced run on its rank, which begins
after a barrier of all ranks, so the ranks' timelines line up.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from xdsl.dialects import scf
from xdsl.ir import Block, Operation, OpResult, SSAValue

from hostir_dialect import hir
from hostir_dialect.text import HostirError, operation_location
from hostir import config
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.distributed.streams import start_together, stream_pool
from hostir.runtime.interpreter import Environment, RunContext, Step
from hostir.runtime.program import Program

KINDS = ("compute", "communication", "wait", "other", "control", "in flight")
"""What an interval is: an op that computes, issues a communication, waits (for a work or
a stream), does anything else (buffers, streams, index arithmetic), runs a loop or an if
(the span of its body), or a communication between its issue and its wait."""

COLOURS = {
    "compute": "#4c72b0",
    "communication": "#dd8452",
    "wait": "#c44e52",
    "other": "#a0a0a0",
    "control": "#303030",
    "in flight": "#f2c09a",
}

HOST_LANE = "host"
"""On CUDA, the lane of every op's issue by the interpreter (host clock)."""
CPU_LANE = "cpu"
"""On the CPU, the one lane of a rank (host clock, program order)."""
MAIN_LANE = "main"
"""The stream that was current when the run started (the caller's)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """One box of the timeline, in microseconds from the start of the traced run on its rank."""

    rank: int
    lane: str
    name: str
    kind: str
    start_us: float
    end_us: float
    location: str = ""
    iteration: tuple[int, ...] = ()
    """The iteration of each enclosing `scf.for`, outermost first, counted from 0."""


# --------------------------------------------------------------------------- #
# What is known of an op before it runs                                        #
# --------------------------------------------------------------------------- #


def op_kind(op: Operation) -> str:
    if isinstance(op, hir.ComputeOp):
        return "compute"
    if isinstance(op, hir.StartCoalescingOp) or _issued_works(op):
        return "communication"
    if isinstance(op, (hir.WaitOp, hir.SynchronizeStreamOp)):
        return "wait"
    if isinstance(op, (scf.ForOp, scf.IfOp)):
        return "control"
    return "other"


def op_label(op: Operation) -> str:
    """The op's name, with the segment it calls or the communication it waits for."""
    if isinstance(op, hir.SegmentCallOp):
        return f"{op.name} @{op.callee.string_value()}"
    if isinstance(op, hir.WaitOp) and isinstance(op.work, OpResult):
        return f"{op.name} {op.work.op.name}"
    return op.name


def _issued_works(op: Operation) -> list[SSAValue]:
    return [result for result in op.results if isinstance(result.type, hir.WorkType)]


def _enclosing_loops(op: Operation) -> tuple[scf.ForOp, ...]:
    loops = []
    parent = op.parent_op()
    while parent is not None:
        if isinstance(parent, scf.ForOp):
            loops.append(parent)
        parent = parent.parent_op()
    return tuple(reversed(loops))


@dataclass(frozen=True, slots=True)
class TracedOp:
    """What an interval of `op` says besides its times; built once, while preparing."""

    name: str
    kind: str
    location: str
    issues: tuple[SSAValue, ...]
    """The works the op issues (a communication, or the batch of an end_coalescing)."""
    waits_for: SSAValue | None
    """The work a `hir.wait` waits for."""

    @classmethod
    def of(cls, op: Operation) -> TracedOp:
        location = operation_location(op)
        return cls(
            op_label(op),
            op_kind(op),
            "" if location is None else str(location),
            tuple(_issued_works(op)),
            op.work if isinstance(op, hir.WaitOp) else None,
        )


# --------------------------------------------------------------------------- #
# Clocks                                                                       #
# --------------------------------------------------------------------------- #


class HostClock:
    """The CPU: a mark is the host time in ns; every op is on the one lane of its rank."""

    def __init__(self) -> None:
        self.origin = time.perf_counter_ns()

    def mark(self, stream: object) -> int:
        return time.perf_counter_ns()

    def host_us(self, mark: int) -> float:
        return (mark - self.origin) / 1e3

    device_us = host_us
    """Where a mark lies on the lane of its stream: on the CPU, the host time."""

    def lane(self, stream: object) -> str:
        return CPU_LANE

    def placements(self, stream: object) -> list[tuple[str, Callable[[object], float]]]:
        """The lanes an op run on `stream` is drawn on, each with how to read a mark's time there."""
        return [(CPU_LANE, self.host_us)]


class CudaClock(HostClock):
    """CUDA: a mark is the host time and an event recorded on the op's stream.

    The origin is an event recorded on the idle device right after the host origin, so
    device times and host times share one origin (to the microsecond or so). With a
    hold of `hold_ms`, every stream of the pool waits for the held caller's stream, the
    ranks' devices meet in a one-element all-reduce after their holds, and the device's
    origin is the end of that: the host origin comes a hold earlier.
    """

    def __init__(
        self, device: torch.device, pool_streams: Sequence[torch.cuda.Stream], hold_ms: float = 0.0
    ) -> None:
        torch.cuda.synchronize(device)
        caller = torch.cuda.current_stream(device)
        if hold_ms > 0:
            start_together(device, hold_ms)
            for stream in pool_streams:
                stream.wait_stream(caller)
        super().__init__()
        self.reference = torch.cuda.Event(enable_timing=True)
        self.reference.record(caller)
        self.lanes = {s.cuda_stream: f"stream {i}" for i, s in enumerate(pool_streams)}
        self.lanes.setdefault(torch.cuda.current_stream(device).cuda_stream, MAIN_LANE)

    def mark(self, stream: torch.cuda.Stream) -> tuple[int, torch.cuda.Event]:
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return time.perf_counter_ns(), event

    def host_us(self, mark: tuple[int, torch.cuda.Event]) -> float:
        return (mark[0] - self.origin) / 1e3

    def device_us(self, mark: tuple[int, torch.cuda.Event]) -> float:
        return self.reference.elapsed_time(mark[1]) * 1e3

    def lane(self, stream: torch.cuda.Stream) -> str:
        return self.lanes.get(stream.cuda_stream, f"stream {stream.cuda_stream:#x}")

    def placements(self, stream: torch.cuda.Stream) -> list[tuple[str, Callable[[object], float]]]:
        return [(HOST_LANE, self.host_us), (self.lane(stream), self.device_us)]


# --------------------------------------------------------------------------- #
# The tracer                                                                   #
# --------------------------------------------------------------------------- #


@dataclass(slots=True)
class _Record:
    """One run of one op: the stream current when it started, its begin and end marks."""

    traced: TracedOp
    stream: object
    begin: object
    end: object
    iteration: tuple[int, ...]

    def interval(self, rank: int, lane: str, kind: str, start_us: float, end_us: float) -> Interval:
        traced = self.traced
        return Interval(rank, lane, traced.name, kind, start_us, end_us, traced.location, self.iteration)


class Tracer:
    """Wraps every step of a program while it is prepared; records each run of each op."""

    def __init__(self, clock: HostClock) -> None:
        self.clock = clock
        self.records: list[_Record] = []
        self.iterations: dict[scf.ForOp, int] = {}
        self._started_blocks: set[Block] = set()

    def wrap_step(self, op: Operation, step: Step) -> Step:
        traced = TracedOp.of(op)
        loops = _enclosing_loops(op)
        begins_iteration = self._first_step_of_loop_body(op)
        own_loop = op if isinstance(op, scf.ForOp) else None
        iterations, records, mark = self.iterations, self.records, self.clock.mark

        def traced_step(env: Environment, context: RunContext) -> None:
            if begins_iteration is not None:
                iterations[begins_iteration] += 1
            if own_loop is not None:
                iterations[own_loop] = -1
            stream = context.streams.current()
            begin = mark(stream)
            step(env, context)
            end = mark(stream)
            records.append(_Record(traced, stream, begin, end, tuple(iterations[l] for l in loops)))

        return traced_step

    def _first_step_of_loop_body(self, op: Operation) -> scf.ForOp | None:
        """The loop whose iteration `op` begins, if it is the first op with a step in a loop body.

        The interpreter prepares a block's ops in order, so the first one wrapped in a
        block is the first that runs in each iteration.
        """
        block = op.parent_block()
        if block in self._started_blocks or not isinstance(block.parent_op(), scf.ForOp):
            return None
        self._started_blocks.add(block)
        return block.parent_op()

    def intervals(self, rank: int, end: object) -> list[Interval]:
        """Every op's interval(s), and each communication in flight, in the order the ops started.

        `end` is the mark of the run's end: a communication that no `hir.wait` waited
        for was completed by the run before it returned.
        """
        clock = self.clock
        intervals: list[Interval] = []
        in_flight: dict[SSAValue, list[_Record]] = defaultdict(list)
        for record in self.records:
            traced = record.traced
            intervals += [
                record.interval(rank, lane, traced.kind, at(record.begin), at(record.end))
                for lane, at in clock.placements(record.stream)
            ]
            if traced.waits_for is not None and in_flight[traced.waits_for]:
                issue = in_flight[traced.waits_for].pop(0)
                intervals.append(self._in_flight(issue, record.end, rank))
            for work in traced.issues:
                in_flight[work].append(record)
        for issues in in_flight.values():
            intervals += [self._in_flight(issue, end, rank) for issue in issues]
        return sorted(intervals, key=lambda i: (i.start_us, -i.end_us))

    def _in_flight(self, issue: _Record, end: object, rank: int) -> Interval:
        """A communication from its issue's begin mark to `end`, on the lane it was issued from."""
        clock = self.clock
        return issue.interval(
            rank, clock.lane(issue.stream), "in flight", clock.device_us(issue.begin), clock.device_us(end)
        )


def trace_run(
    program: Program,
    inputs: Sequence[torch.Tensor],
    communicator: Communicator,
    num_streams: int | None = None,
    hold_ms: float | None = None,
) -> tuple[list[torch.Tensor], list[Interval]]:
    """Runs `program` once on this rank, traced; returns its outputs and this rank's intervals.

    Every rank of a world of several calls it together: it starts with a barrier so that
    the ranks' timelines share their origin.

    On CUDA, tracing costs the host time per op (two events and a clock read), enough to
    leave the GPU waiting for the host on small ops and hide the overlap the program has
    untraced. So the caller's stream is first held idle for `hold_ms` (`None`: twice the
    host time of a first traced run, whose timeline is dropped), and the GPU starts once
    the host has issued the run: the stream lanes show the schedule the streams follow
    when the host keeps ahead, from the end of the hold; the host lane shows the host's
    own pace from the start. `hold_ms=0` traces without a hold.
    """
    device = communicator.device
    if device.type == "cuda" and hold_ms is None:
        first = _traced(program, inputs, communicator, num_streams, 0.0)[1]
        issued_ms = max((i.end_us for i in first if i.lane == HOST_LANE), default=0.0) / 1e3
        hold_ms = min(MAX_HOLD_MS, 2 * issued_ms + 1.0)
    return _traced(program, inputs, communicator, num_streams, hold_ms or 0.0)


MAX_HOLD_MS = 10_000.0
"""The longest automatic hold: beyond it a run's timeline starts before the host has issued it all."""


def _traced(
    program: Program,
    inputs: Sequence[torch.Tensor],
    communicator: Communicator,
    num_streams: int | None,
    hold_ms: float,
) -> tuple[list[torch.Tensor], list[Interval]]:
    device = communicator.device
    if communicator.world_size > 1 and dist.is_initialized():
        dist.barrier()
    if device.type == "cuda":
        size = config.num_streams if num_streams is None else num_streams
        clock = CudaClock(device, stream_pool(device, size).streams, hold_ms)
    else:
        clock = HostClock()
    tracer = Tracer(clock)
    outputs = program.run(inputs, communicator, num_streams, wrap_step=tracer.wrap_step)
    current = torch.cuda.current_stream(device) if device.type == "cuda" else None
    end = clock.mark(current)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return outputs, tracer.intervals(communicator.rank, end)


# --------------------------------------------------------------------------- #
# Writing the timeline                                                         #
# --------------------------------------------------------------------------- #


def _lane_order(lane: str) -> tuple[int, int, str]:
    """host, main, stream 0, stream 1, ..., then any other stream."""
    if lane in (HOST_LANE, CPU_LANE):
        return (0, 0, lane)
    if lane == MAIN_LANE:
        return (1, 0, lane)
    number = lane.removeprefix("stream ")
    return (2, int(number), lane) if number.isdigit() else (3, 0, lane)


def lanes_of(intervals: Sequence[Interval]) -> dict[int, list[str]]:
    """Each rank's lanes, in display order."""
    lanes: dict[int, set[str]] = defaultdict(set)
    for interval in intervals:
        lanes[interval.rank].add(interval.lane)
    return {rank: sorted(lanes[rank], key=_lane_order) for rank in sorted(lanes)}


def chrome_trace(intervals: Sequence[Interval], title: str) -> dict:
    """The trace-event JSON: a process per rank, a thread per lane, a complete event per op,
    and an async event per communication in flight."""
    events: list[dict] = []
    lane_ids = {}
    for rank, lanes in lanes_of(intervals).items():
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for tid, lane in enumerate(lanes):
            lane_ids[rank, lane] = tid
            for name, args in (("thread_name", {"name": lane}), ("thread_sort_index", {"sort_index": tid})):
                events.append({"ph": "M", "name": name, "pid": rank, "tid": tid, "args": args})
    for number, interval in enumerate(intervals):
        args = {}
        if interval.location:
            args["location"] = interval.location
        if interval.iteration:
            args["iteration"] = list(interval.iteration)
        common = {
            "name": interval.name,
            "cat": interval.kind,
            "pid": interval.rank,
            "tid": lane_ids[interval.rank, interval.lane],
            "args": args,
        }
        if interval.kind == "in flight":
            common["name"] += " in flight"
            events += [
                {**common, "ph": phase, "id": number, "ts": ts}
                for phase, ts in (("b", interval.start_us), ("e", interval.end_us))
            ]
        else:
            events.append(
                {**common, "ph": "X", "ts": interval.start_us, "dur": interval.end_us - interval.start_us}
            )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"program": title}}


def write_chrome_trace(intervals: Sequence[Interval], path: str | Path, title: str) -> None:
    _write(path, lambda p: p.write_text(json.dumps(chrome_trace(intervals, title))))


def write_timeline_png(intervals: Sequence[Interval], path: str | Path, title: str) -> None:
    """A PNG of the stream lanes (on CUDA; the host lane is in the JSON only), boxes coloured by kind.

    Each lane shows the ops that ran on it in its upper part and the communications
    issued from it, while in flight, in its lower part; a loop or an if is a thin bar
    on top of the ops it ran.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    shown = [i for i in intervals if i.lane != HOST_LANE]
    rows = [(rank, lane) for rank, lanes in lanes_of(shown).items() for lane in lanes]
    row_of = {row: number for number, row in enumerate(rows)}
    figure = Figure(figsize=(14, 1.2 + 0.45 * len(rows)), layout="constrained")
    axes = figure.add_subplot()
    # (offset from the top of the lane, height): loops on top, ops, communications in flight below.
    bands = {"control": (0.1, 0.1), "in flight": (0.7, 0.25)}
    for interval in shown:
        top, height = bands.get(interval.kind, (0.25, 0.4))
        width = max(interval.end_us - interval.start_us, 0.0) / 1e3
        axes.broken_barh(
            [(interval.start_us / 1e3, width)],
            (row_of[interval.rank, interval.lane] + top, height),
            facecolors=COLOURS[interval.kind],
            edgecolors="black" if interval.kind in ("compute", "communication") else "none",
            linewidth=0.3,
        )
    axes.set_yticks([number + 0.5 for number in range(len(rows))])
    axes.set_yticklabels([f"rank {rank} · {lane}" for rank, lane in rows])
    axes.set_ylim(len(rows), 0)
    axes.set_xlabel("ms since the start of the run")
    axes.set_title(title)
    figure.legend(
        handles=[Patch(facecolor=COLOURS[kind], label=kind) for kind in KINDS],
        loc="outside lower center",
        ncol=len(KINDS),
        fontsize="small",
        frameon=False,
    )
    _write(path, lambda p: figure.savefig(p, dpi=120))


def _write(path: str | Path, write: Callable[[Path], object]) -> None:
    try:
        write(Path(path))
    except OSError as error:
        raise HostirError(f"cannot write the trace '{path}': {error.strerror or error}") from None
