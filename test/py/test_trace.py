"""The timeline: `hir-run --trace` on local ranks (trace JSON and PNG), the tracer on nested loops,
and, on 2 GPUs, ops on several streams whose compute and communication overlap.

The expected order of ops is derived from the lowered program by unrolling its loops
here, independently of the tracer: every op that the interpreter runs as a step (all
but constants, static extents and returns) once per iteration of its loops.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image
from xdsl.dialects import arith, func, scf
from xdsl.ir import Block

from examples.reference_fusions import ag_linear
from hostir_dialect import hir
from hostir_dialect.fusion import DYNAMIC
from hostir_dialect.text import print_module
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.launch import run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import random_inputs, shard
from hostir.runtime.trace import Interval, trace_run
from test_hir_run import SCRIPT, clean_environment

STREAM_ITERATIONS = 3


def _has_step(op) -> bool:
    """Whether the interpreter runs `op` (it folds constants and static extents while preparing)."""
    if isinstance(op, (arith.ConstantOp, func.ReturnOp)):
        return False
    if isinstance(op, scf.YieldOp):
        return bool(op.arguments)
    if isinstance(op, hir.DimOp):
        return (
            op.buffer.type.get_shape()[op.axis.data] == DYNAMIC and op.buffer.type.didx_axis != op.axis.data
        )
    return True


def unrolled(block: Block, trip_count: int, iteration: tuple[int, ...] = ()) -> Iterator[tuple[str, tuple]]:
    """(op name, iteration of its loops) of every op run, in program order; each loop runs
    `trip_count` times (every loop of a stream-parallel program walks the stream axis)."""
    for op in block.ops:
        if not _has_step(op):
            continue
        yield op.name, iteration
        if isinstance(op, scf.ForOp):
            for i in range(trip_count):
                yield from unrolled(op.body.block, trip_count, (*iteration, i))


@pytest.fixture(scope="module")
def traced_ag_linear(tmp_path_factory) -> tuple[Path, Path]:
    """hir-run --trace on the AG+linear fusion at 2 local ranks (gloo), its loops of 3 iterations."""
    directory = tmp_path_factory.mktemp("trace")
    fusion = directory / "ag_linear.mlir"
    fusion.write_text(print_module(ag_linear(2, "f32")))
    trace = directory / "ag_linear.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(fusion), "--nproc", "2", "--num-streams", "2",
         "--dim", f"0:0={STREAM_ITERATIONS}", "--check", "--trace", str(trace)],
        capture_output=True, text=True, env=clean_environment(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        f"trace in {trace} (open it in https://ui.perfetto.dev), timeline in {trace.with_suffix('.png')}"
    )
    return fusion, trace


def test_trace_json_has_every_op_of_every_rank_in_program_order(traced_ag_linear):
    fusion, trace = traced_ag_linear
    events = json.loads(trace.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {0: "rank 0", 1: "rank 1"}
    program = Program.compile(fusion.read_text(), filename=str(fusion))
    expected = list(unrolled(program.host.body.block, STREAM_ITERATIONS))
    assert ("hir.linear", (STREAM_ITERATIONS - 1,)) in expected
    for rank in (0, 1):
        ops = sorted((e for e in events if e["pid"] == rank and e["ph"] == "X"), key=lambda e: e["ts"])
        assert {e["tid"] for e in ops} == {0}, "on the CPU a rank has one lane"
        names = [(e["name"].split(" ")[0], tuple(e["args"].get("iteration", ()))) for e in ops]
        assert names == expected
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ops)
        (linear,) = {e["args"]["location"] for e in ops if e["name"] == "hir.linear"}
        assert linear.startswith(f"{fusion}:") and len(linear.split(":")) == 3
        assert [e["name"] for e in ops if e["name"].startswith("hir.wait")] == ["hir.wait hir.allgather"] * 3


def test_communications_in_flight_span_issue_to_wait(traced_ag_linear):
    _, trace = traced_ag_linear
    events = json.loads(trace.read_text())["traceEvents"]
    for rank in (0, 1):
        ops = [e for e in events if e["pid"] == rank and e["ph"] == "X"]
        issues = sorted(e["ts"] for e in ops if e["name"] == "hir.allgather")
        waits = sorted(e["ts"] + e["dur"] for e in ops if e["name"] == "hir.wait hir.allgather")
        begins = {e["id"]: e for e in events if e["pid"] == rank and e["ph"] == "b"}
        ends = {e["id"]: e for e in events if e["pid"] == rank and e["ph"] == "e"}
        assert begins.keys() == ends.keys() and len(begins) == STREAM_ITERATIONS
        assert {e["name"] for e in begins.values()} == {"hir.allgather in flight"}
        spans = sorted((begins[i]["ts"], ends[i]["ts"]) for i in begins)
        # ts + dur is a sum of floats, exact to within rounding only.
        expected = [t for pair in zip(issues, waits) for t in pair]
        assert [t for span in spans for t in span] == pytest.approx(expected)
        assert [tuple(begins[i]["args"]["iteration"]) for i in sorted(begins)] == [(0,), (1,), (2,)]


def test_trace_png_is_an_image(traced_ag_linear):
    _, trace = traced_ag_linear
    with Image.open(trace.with_suffix(".png")) as image:
        assert image.format == "PNG"
        width, height = image.size
        assert width > 0 and height > 0
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 24)) > 3, "a blank image"


NESTED = """
!x = !fusion.tensor<[2, 3], f32>
!row = !fusion.tensor<[3], f32>
!element = !fusion.tensor<[], f32>
func.func @nested(%x: !x) -> !x {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %out = hir.allocate() : !x
  scf.for %i = %c0 to %c2 step %c1 {
    %row = hir.alias_select %x[0 = %i] : !x -> !row
    %out_row = hir.alias_select %out[0 = %i] : !x -> !row
    scf.for %j = %c0 to %c3 step %c1 {
      %element = hir.alias_select %row[0 = %j] : !row -> !element
      %out_element = hir.alias_select %out_row[0 = %j] : !row -> !element
      hir.pointwise "neg" ins(%element : !element) outs(%out_element : !element)
    }
  }
  func.return %out : !x
}
"""


def test_nested_loop_iterations_and_nesting():
    program = Program.compile(NESTED, pipeline=None)
    x = torch.randn(2, 3)
    (output,), intervals = trace_run(program, [x], Communicator.single(torch.device("cpu")))
    torch.testing.assert_close(output, -x, rtol=0, atol=0)
    assert {i.lane for i in intervals} == {"cpu"} and {i.rank for i in intervals} == {0}
    negations = [i for i in intervals if i.name == "hir.pointwise"]
    assert [i.iteration for i in negations] == [(i, j) for i in range(2) for j in range(3)]
    assert all(n.kind == "compute" for n in negations)
    loops = [i for i in intervals if i.name == "scf.for"]
    assert [loop.iteration for loop in loops] == [(), (0,), (1,)]
    outer, *inner = loops
    assert all(outer.start_us <= i.start_us <= i.end_us <= outer.end_us for i in intervals if i.iteration)
    for loop, i in zip(inner, range(2)):
        assert all(
            loop.start_us <= n.start_us and n.end_us <= loop.end_us for n in negations[3 * i : 3 * i + 3]
        )
    assert [i.start_us for i in intervals] == sorted(i.start_us for i in intervals)


# --------------------------------------------------------------------------- #
# GPUs                                                                         #
# --------------------------------------------------------------------------- #


def _overlap(a: Interval, b: Interval) -> float:
    return min(a.end_us, b.end_us) - max(a.start_us, b.start_us)


def traced_ag_linear_rank() -> list[Interval]:
    """A rank of the GPU test: AG+linear in bf16, big enough for NCCL and cuBLAS to take time."""
    program = Program.compile(ag_linear(2, "bf16"))
    communicator = Communicator.from_env()
    sizes = {(0, 0): 8, (0, 2): 1024, (0, 3): 4096, (1, 0): 4096, (1, 1): 4096, (2, 0): 4096}
    inputs = random_inputs(program.input_types, sizes)
    local = [
        shard(x, t, communicator.rank).to(communicator.device) for x, t in zip(inputs, program.input_types)
    ]
    program.run(local, communicator, 4)
    return trace_run(program, local, communicator, 4)[1]


@pytest.mark.gpu_timing
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL)")
def test_gpu_ops_land_on_streams_and_compute_overlaps_communication():
    for intervals in run_on_local_ranks(traced_ag_linear_rank, 2):
        lanes = {i.lane for i in intervals}
        assert "host" in lanes and "main" in lanes
        compute = [i for i in intervals if i.kind == "compute" and i.lane.startswith("stream ")]
        in_flight = [i for i in intervals if i.kind == "in flight"]
        assert len({i.lane for i in compute}) >= 2, lanes
        assert len(in_flight) == 8
        assert any(_overlap(c, t) > 0 for c in compute for t in in_flight if c.lane != t.lane)
        host = [i for i in intervals if i.lane == "host"]
        device = [i for i in intervals if i.lane != "host" and i.kind != "in flight"]
        assert len(host) == len(device), "every op is on the host lane and on its stream's lane"
