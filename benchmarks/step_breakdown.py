"""Where one step's time goes, read from a `torch.profiler` trace of it.

    with torch.profiler.profile(activities=...) as profiler:
        with torch.profiler.record_function(STEP):
            step()
        synchronize()
    breakdown = Breakdown.of_trace(profiler_trace_events, device_type)

A step's time splits into what its device does and what it waits for:

* GEMM, attention: the time during which at least one GEMM (attention) kernel runs;
* communication not hidden: the time during which a transfer runs (an NCCL kernel, a
  copy between devices on the copy engines, a gloo call on CPU ranks) and no compute
  kernel does;
* other kernels: every other kernel (norms, pointwise, copies, reductions), their count
  and the time during which one runs;
* host: from the start of the step on the host to its first kernel, and the gaps after
  it during which the device runs nothing (the host is late, or waits), the longest of
  them named by the kernels around them: a copy to the host before a gap is a host that
  read a value back and waited for the device.

Kernels of different streams overlap, so each figure is the length of a union of
intervals, not a sum of durations; the figures add up to more than the step where
compute overlaps compute. On CPU ranks the ATen calls and collectives that no other
ATen call contains stand for the kernels (a gloo collective blocks its rank, so nothing
hides behind it), and the wrappers around them (autograd, dynamo, DTensor's
redistributions) count as host time.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

STEP = "benchmark step"
"""The `record_function` range around the profiled step."""

GEMM = re.compile(r"gemm|cutlass|nvjet|xmma|cublas|_mm_|triton_tem_fused_.*mm|splitk|aten::(mm|addmm|bmm|matmul|linear|_scaled_mm)$", re.I)
ATTENTION = re.compile(r"flash|fmha|attention|sdpa|cudnn.*(fprop|bprop|dgrad)|aten::_scaled_dot_product", re.I)
COMMUNICATION = re.compile(r"nccl|gloo|c10d|record_param_comms|all_gather|allgather|reduce_scatter|all_reduce|allreduce|broadcast_|recv|send", re.I)

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
PEER_COPY = re.compile(r"PtoP|Peer", re.I)
"""A copy between devices, as CUPTI names it: the copy engines' transfers."""

Interval = tuple[float, float]

LONGEST_GAPS = 3
"""How many of the longest idle gaps a breakdown names."""


@dataclass
class Activity:
    """One kernel (or, on CPU ranks, one outermost ATen call), in microseconds."""

    name: str
    start: float
    end: float
    kind: str
    """gemm, attention, communication or other."""


def kind_of(name: str, category: str) -> str:
    if category == "gpu_memcpy":
        return "communication" if PEER_COPY.search(name) else "other"
    if category == "gpu_memset":
        return "other"
    if ATTENTION.search(name):
        return "attention"
    if GEMM.search(name):
        return "gemm"
    if COMMUNICATION.search(name):
        return "communication"
    return "other"


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged where they overlap or touch, in order."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in union(intervals))


def minus(intervals: Sequence[Interval], holes: Sequence[Interval]) -> float:
    """The length of `intervals` outside `holes`."""
    covered = union(intervals)
    return length(covered) - sum(
        max(0.0, min(end, hole_end) - max(start, hole_start))
        for start, end in covered
        for hole_start, hole_end in union(holes)
    )


def idle_gaps(activities: Sequence[Activity]) -> list[tuple[float, Activity, Activity]]:
    """Each gap between the first activity's start and the last one's end during which none
    runs: (its length, the activity that ran last before it, the one that starts it)."""
    gaps: list[tuple[float, Activity, Activity]] = []
    ordered = sorted(activities, key=lambda a: a.start)
    if not ordered:
        return gaps
    last = ordered[0]
    for activity in ordered[1:]:
        if activity.start > last.end:
            gaps.append((activity.start - last.end, last, activity))
        if activity.end > last.end:
            last = activity
    return gaps


def outermost(events: Sequence[dict]) -> list[dict]:
    """The events that no other event of their thread contains (CPU ranks' top-level calls)."""
    kept: list[dict] = []
    open_until: dict[object, float] = {}
    for event in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        thread = (event.get("pid"), event.get("tid"))
        if event["ts"] < open_until.get(thread, float("-inf")):
            continue
        kept.append(event)
        open_until[thread] = event["ts"] + event["dur"]
    return kept


@dataclass
class Breakdown:
    """One rank's step, in milliseconds (see the module docstring)."""

    step_ms: float
    gemm_ms: float
    attention_ms: float
    communication_ms: float
    exposed_communication_ms: float
    other_kernels: int
    other_ms: float
    host_before_first_kernel_ms: float
    idle_gaps_ms: float
    top_other: list[tuple[str, int, float]] = field(default_factory=list)
    """The other kernels that take the most time: (name, count, ms summed over their runs)."""
    longest_gaps: list[tuple[float, str, str]] = field(default_factory=list)
    """The longest idle gaps, longest first: (ms, the kernel that ran last before it, the
    kernel after it)."""

    COLUMNS = {
        "step_ms": "step",
        "gemm_ms": "GEMM",
        "attention_ms": "attention",
        "exposed_communication_ms": "comm. not hidden",
        "other_ms": "other kernels",
        "host_before_first_kernel_ms": "host before 1st kernel",
        "idle_gaps_ms": "idle gaps",
    }
    """The table's columns: ms each, and the other kernels' count beside their time."""

    @classmethod
    def of_activities(cls, activities: Sequence[Activity], step: Interval) -> Breakdown:
        """The breakdown of the step that ran on the host during `step` and issued `activities`."""
        by_kind: dict[str, list[Interval]] = {k: [] for k in ("gemm", "attention", "communication", "other")}
        for a in activities:
            by_kind[a.kind].append((a.start, a.end))
        compute = by_kind["gemm"] + by_kind["attention"] + by_kind["other"]
        first = min((a.start for a in activities), default=step[1])
        last = max((a.end for a in activities), default=step[1])
        others = Counter()
        other_us = Counter()
        for a in activities:
            if a.kind == "other":
                others[a.name] += 1
                other_us[a.name] += a.end - a.start
        top = [(name, others[name], us / 1e3) for name, us in other_us.most_common(8)]
        gaps = sorted(idle_gaps(activities), key=lambda gap: -gap[0])
        return cls(
            step_ms=(max(last, step[1]) - step[0]) / 1e3,
            gemm_ms=length(by_kind["gemm"]) / 1e3,
            attention_ms=length(by_kind["attention"]) / 1e3,
            communication_ms=length(by_kind["communication"]) / 1e3,
            exposed_communication_ms=minus(by_kind["communication"], compute) / 1e3,
            other_kernels=len(by_kind["other"]),
            other_ms=length(by_kind["other"]) / 1e3,
            host_before_first_kernel_ms=max(0.0, first - step[0]) / 1e3,
            idle_gaps_ms=sum(us for us, _, _ in gaps) / 1e3,
            top_other=top,
            longest_gaps=[(us / 1e3, before.name, after.name) for us, before, after in gaps[:LONGEST_GAPS]],
        )

    @classmethod
    def of_trace(cls, events: Sequence[dict], device_type: str) -> Breakdown:
        """The breakdown of the `STEP` range of a Chrome trace's events (`traceEvents` of
        `torch.profiler.profile.export_chrome_trace`)."""
        marks = [e for e in events if e.get("name") == STEP and e.get("cat") == "user_annotation"]
        if not marks:
            raise ValueError(f"the trace has no {STEP!r} range on the host")
        start = min(e["ts"] for e in marks)
        step = (start, start + max(e["dur"] for e in marks))
        if device_type == "cuda":
            chosen = [e for e in events if e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X" and e["ts"] >= start]
        else:
            calls = [
                e
                for e in events
                if e.get("cat") == "cpu_op"
                and e.get("ph") == "X"
                and step[0] <= e["ts"] <= step[1]
                and (e["name"].startswith("aten::") or COMMUNICATION.search(e["name"]))
            ]
            chosen = outermost(calls)
        activities = [
            Activity(e["name"], e["ts"], e["ts"] + e["dur"], kind_of(e["name"], e.get("cat", ""))) for e in chosen
        ]
        return cls.of_activities(activities, step)

    def cells(self) -> list[str]:
        values = []
        for key in self.COLUMNS:
            value = f"{getattr(self, key):.3f}"
            values.append(f"{value} ({self.other_kernels})" if key == "other_ms" else value)
        return values


def table(rows: Sequence[tuple[str, Breakdown, float | None]]) -> str:
    """A Markdown table of breakdowns, a row per (label, breakdown, how much shorter an
    unprofiled step was with the GPU held 30 ms first, or None where it was not measured): ms,
    the other kernels' count in brackets."""
    columns = [*Breakdown.COLUMNS.values(), "30 ms hold saves, unprofiled"]
    lines = ["| contender, rank | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for label, breakdown, saved in rows:
        cells = [*breakdown.cells(), "" if saved is None else f"{saved:.3f}"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
