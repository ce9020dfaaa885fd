"""CUDA-graph replay (`runtime.graphs`): the eager fallback on the CPU, replays on one GPU (and
on the CPU with CUDA graphs emulated, `emulated_graphs.py`) and on 2 NCCL ranks against plain
torch, and the interpreter-overhead benchmark's smoke run.

Expected outputs are plain torch (einsum in f64) on the unsharded inputs. On GPUs every
allocation of the captured run is poisoned with NaN, and so are the static outputs
before a replay, so a replay that does not write every element shows; the replayer
must leave the caller's inputs as they were and return outputs that a later replay
does not overwrite.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from xdsl.dialects.builtin import ModuleOp

from examples.reference_fusions import ag_linear, allgather_p2p, linear, matmul, matmul_ar, single_binary
from hostir_dialect.builder import FusionBuilder
from hostir_dialect.text import HostirError
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.graphs import (
    BATCHED_COPY_BYTES,
    CapturedRun,
    SignatureCaptures,
    DeviceCaptures,
    GraphReplayer,
    MOST_CAPTURES,
    GraphReplayFallback,
    input_kinds,
    output_kinds,
    release_captured_graphs,
    signature,
)
from hostir.runtime.launch import run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import compare, shard
from test_interpreter import poisoned_allocations

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "interpreter_overhead.py"


@dataclass(frozen=True)
class Case:
    """A fusion, its unsharded input shapes for a trip count S, and its output in plain torch."""

    name: str
    build: Callable[[], ModuleOp]
    shapes: Callable[[int], list[tuple[int, ...]]]
    expected: Callable[..., torch.Tensor]
    pipeline: str = "hir-lowering"

    def inputs(self, seed: int, S: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randn(shape, generator=generator) for shape in self.shapes(S)]


def allgather_p2p_symmetric_input() -> ModuleOp:
    """`allgather_p2p` on 2 devices with its input marked `hir.symmetric`."""
    fb = FusionBuilder("allgather_p2p_symmetric_input")
    x = fb.input([2, None], "f32", mesh=[0, 1], axes=["didx", "_"], symmetric=True)
    out = fb.set(x)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def _linear(x, w, b):
    return torch.einsum("...k,nk->...n", x, w) + b


SINGLE_DEVICE = [
    Case("linear", lambda: linear("f32"), lambda S: [(S, 5, 6), (7, 6), (7,)], _linear),
    Case("matmul_n", lambda: matmul(1, "f32"), lambda S: [(4, 6), (6, S)], lambda a, b: a @ b),
    Case("single_binary", lambda: single_binary("f32"), lambda S: [(S, 6)] * 2, torch.add),
]

TWO_RANKS = [
    Case("ag_linear", lambda: ag_linear(2, "f32"), lambda S: [(S, 2, 5, 6), (7, 6), (7,)], _linear),
    Case(
        "matmul_ar",
        lambda: matmul_ar(2, "f32"),
        lambda S: [(S, 2, 5, 6), (2, 6, 7)],
        lambda a, b: torch.einsum("sdmk,dkn->smn", a, b),
    ),
    Case("allgather_p2p", lambda: allgather_p2p(2, "f32"), lambda S: [(2, S)], lambda x: x),
    # The copy engines: their signals are stream memory operations, captured as graph nodes;
    # each replay must leave the signal pads clear for the next.
    Case(
        "ag_linear_copy_engine",
        lambda: ag_linear(2, "f32"),
        lambda S: [(S, 2, 5, 6), (7, 6), (7,)],
        _linear,
        "hir-lowering{backend=cuda}",
    ),
    Case(
        "matmul_ar_copy_engine",
        lambda: matmul_ar(2, "f32"),
        lambda S: [(S, 2, 5, 6), (2, 6, 7)],
        lambda a, b: torch.einsum("sdmk,dkn->smn", a, b),
        "hir-lowering{backend=cuda}",
    ),
    Case(
        "allgather_p2p_copy_engine",
        lambda: allgather_p2p(2, "f32"),
        lambda S: [(2, S)],
        lambda x: x,
        "hir-lowering{p2p_backend=cuda}",
    ),
    # The caller's input need not be symmetric: the replayer's static copy of it is.
    Case(
        "allgather_p2p_symmetric_input",
        allgather_p2p_symmetric_input,
        lambda S: [(2, S)],
        lambda x: x,
        "hir-lowering{p2p_backend=cuda}",
    ),
]


def replay_checks(case: Case, communicator: Communicator) -> list[str]:
    """Replays `case` on this rank as the GPU tests want it; returns what went wrong (nothing: ok).

    A capture on inputs of trip count 3, a replay of new values into poisoned static
    outputs, a new signature (trip count 4) that is captured anew; after
    `release_captured_graphs`, a run that captures again.
    """
    program = Program.compile(case.build(), pipeline=case.pipeline)
    device, rank = communicator.device, communicator.rank
    replayer = GraphReplayer(program, communicator)
    problems = []

    def run(seed: int, S: int) -> list[torch.Tensor]:
        whole = case.inputs(seed, S)
        local = [shard(x, t, rank).to(device) for x, t in zip(whole, program.input_types)]
        before = [x.clone() for x in local]
        outputs = replayer.run(local)
        if not all(torch.equal(x, y) for x, y in zip(local, before)):
            problems.append(f"seed {seed}: the replayer changed the caller's inputs")
        expected = case.expected(*(x.double() for x in whole)).float()
        comparison = compare(outputs[0].cpu(), shard(expected, program.output_types[0], rank))
        if not comparison.ok:
            problems.append(f"seed {seed}, S = {S}: {comparison}")
        return outputs

    with poisoned_allocations():
        first = run(0, 3)
    first_copy = first[0].clone()
    if not replayer.replays:
        return [f"no replay: {replayer.eager_reason}"]
    (captured,) = replayer.runs()
    if ("cuda" in case.pipeline) != (captured.watch is not None):
        problems.append(f"the watchdog watches the replays: {captured.watch is not None}")
    for output in captured.outputs:
        output.fill_(float("nan"))
    run(1, 3)
    if len(replayer.captured) != 1:
        problems.append(f"inputs of the same signature captured again: {len(replayer.captured)} graphs")
    if not torch.equal(first[0], first_copy):
        problems.append("a replay overwrote the outputs an earlier run returned")
    run(2, 4)
    if len(replayer.captured) != 2:
        problems.append(f"a new signature was not captured: {len(replayer.captured)} graph(s)")
    run(3, 3)
    release_captured_graphs()
    if replayer.captured:
        problems.append(f"release_captured_graphs left {len(replayer.captured)} graph(s)")
    run(4, 3)
    if len(replayer.captured) != 1:
        problems.append(f"a run after release_captured_graphs did not capture anew: {len(replayer.captured)}")
    return problems


# --------------------------------------------------------------------------- #
# CPU                                                                          #
# --------------------------------------------------------------------------- #


def test_cpu_runs_eagerly_says_so_once_and_matches_torch():
    case = SINGLE_DEVICE[0]
    program = Program.compile(case.build())
    with pytest.warns(GraphReplayFallback, match="runs eagerly: CUDA graphs need CUDA devices"):
        replayer = GraphReplayer(program, Communicator.single(torch.device("cpu")))
    assert not replayer.replays and replayer.eager_reason.endswith("this rank runs cpu, no process group")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed, S in ((0, 3), (1, 4)):
            inputs = case.inputs(seed, S)
            (output,) = replayer.run(inputs)
            expected = case.expected(*(x.double() for x in inputs)).float()
            assert compare(output, expected).ok
    assert replayer.captured == {}


def test_signature_distinguishes_shape_strides_dtype():
    x = torch.zeros(3, 4)
    assert signature([x]) == signature([torch.ones(3, 4)])
    assert len({signature([y]) for y in (x, x.t().contiguous(), x.t(), x.double(), x[:2])}) == 5


def test_a_lent_output_blocks_a_replay_while_anything_holds_its_memory():
    """What decides whether a replay may overwrite its outputs, on plain tensors (no graph
    runs): a lent output blocks the next replay while any tensor, the one handed out or
    a view of it, holds its memory; copies and the outputs that are views of parameters
    do not count; a handed-over input blocks it when it is not where the capture read it."""
    lent, copied, weight = torch.zeros(4, 3), torch.zeros(2), torch.zeros(3, 4)
    handed_in = torch.zeros(5)
    run = CapturedRun(
        graph=None,
        inputs=[None, None],
        addresses=[weight.data_ptr(), handed_in.data_ptr()],
        outputs=[lent, copied, weight.t()],
        extents={},
        parameters=frozenset({0}),
        handed_over=frozenset({1}),
        views=frozenset({2}),
        lent=frozenset({0}),
    )
    assert run.lent_memory == {lent.untyped_storage().data_ptr()}
    assert run.blocker([weight, handed_in]) is None
    handed_out = lent.detach()
    assert "still in use" in run.blocker([weight, handed_in])
    rows = handed_out[1:]
    del handed_out
    assert "still in use" in run.blocker([weight, handed_in])
    del rows
    assert run.blocker([weight, handed_in]) is None
    kept = [copied[1:], weight.t()]
    assert run.blocker([weight, handed_in]) is None and kept
    assert "input #1 is not the output" in run.blocker([weight, handed_in.clone()])


def test_a_run_replays_a_capture_whose_outputs_and_later_ones_are_free():
    """Which capture serves a run, on plain tensors (no graph runs): one whose lent outputs
    no caller holds and where no caller holds an output of a capture made after it (which
    may lie in its temporaries), tried from the one asked for around. Lent outputs, on
    loan or not, are memory that other graphs read in place."""
    captures = DeviceCaptures(pool=(0, 0), stream=None)
    gradient, saved, later_saved = torch.zeros(4, 3), torch.zeros(5), torch.zeros(6)
    earlier = CapturedRun(
        graph=None, inputs=[], addresses=[], outputs=[gradient, saved], extents={},
        order=captures.next_order(), lent=frozenset({0, 1}), on_loan=frozenset({0}),
    )
    later = CapturedRun(
        graph=None, inputs=[], addresses=[], outputs=[later_saved], extents={},
        order=captures.next_order(), lent=frozenset({0}),
    )
    runs = [earlier, later]
    assert earlier.lent_memory == {gradient.untyped_storage().data_ptr(), saved.untyped_storage().data_ptr()}
    assert captures.free(runs, []) == 0 and captures.free(runs, [], first=1) == 1
    held = saved[1:]
    assert captures.free(runs, []) == 1, "the earlier capture's output is held"
    captures.lending[later.order] = (later, None)
    held_later = later_saved.detach()
    assert captures.free(runs, []) is None
    del held
    assert captures.free(runs, []) is None, "the earlier capture may overwrite the later one's outputs"
    assert captures.holders_after(earlier) == [(later, None)]
    del held_later
    assert captures.free(runs, []) == 0
    assert captures.lending == {}, "a capture none of whose outputs is held any more is dropped"


def _cpu_replayer() -> GraphReplayer:
    with pytest.warns(GraphReplayFallback, match="runs eagerly"):
        return GraphReplayer(Program.compile(single_binary("f32")), Communicator.single(torch.device("cpu")))


def test_a_kept_output_on_loan_is_copied_from_then_on_by_every_capture():
    """An output on loan (a parameter's gradient) that a caller keeps where it blocks the
    capture that would serve a run (past the next run of its graph) makes its replayer copy
    that output from then on, in every capture: its memory stays blocked while held, then
    is forgotten. A saved activation (handed over, not on loan) stays returned as it is,
    kept or not."""
    captures = DeviceCaptures(pool=(0, 0), stream=None)
    replayer = _cpu_replayer()
    gradient, saved, other_gradient = torch.zeros(4), torch.zeros(5), torch.zeros(4)
    run = CapturedRun(
        graph=None, inputs=[], addresses=[], outputs=[gradient, saved], extents={},
        order=captures.next_order(), lent=frozenset({0, 1}), on_loan=frozenset({0}),
    )
    other = CapturedRun(
        graph=None, inputs=[], addresses=[], outputs=[other_gradient, torch.zeros(5)], extents={},
        order=captures.next_order(), lent=frozenset({0, 1}), on_loan=frozenset({0}),
    )
    replayer.captured[()] = SignatureCaptures([run, other])
    kept_gradient, kept_saved = gradient.detach(), saved.detach()
    assert run.kept_loans(run.on_loan) == {0}
    replayer._copy_kept_loans([run], [], captures)
    assert replayer.copied_outputs == {0}
    assert run.lent == other.lent == {1} and run.on_loan == other.on_loan == set()
    assert "still in use" in run.blocker([]), "the kept gradient still blocks its capture"
    del kept_gradient
    assert "still in use" in run.blocker([]), "and so does the saved activation"
    del kept_saved
    assert run.blocker([]) is None and run.lent_memory == {saved.untyped_storage().data_ptr()}
    assert set(run.unused) == run.lent_memory, "the gradient's memory is forgotten once let go of"


def test_a_later_captures_output_blocks_an_earlier_one_and_is_copied_only_if_passed_on():
    """A later capture's output that a caller holds blocks an earlier capture (which may
    overwrite it). A parameter's gradient held so (by `.grad` until `zero_grad()`, while an
    inference graph runs) is left on loan: the blocked run takes another capture. An
    activation's gradient held so (an input's `.grad` that the last loss keeps alive) is
    passed on, which a caller does at once: its replayer copies it from then on."""
    captures = DeviceCaptures(pool=(0, 0), stream=None)
    inference, backward = _cpu_replayer(), _cpu_replayer()
    early = CapturedRun(graph=None, inputs=[], addresses=[], outputs=[torch.zeros(3)], extents={}, order=captures.next_order())
    inference.captured[()] = SignatureCaptures([early])
    weight_gradient, input_gradient = torch.zeros(4), torch.zeros(6)
    late = CapturedRun(
        graph=None, inputs=[], addresses=[], outputs=[weight_gradient, input_gradient], extents={},
        order=captures.next_order(), lent=frozenset({0, 1}), on_loan=frozenset({0, 1}), passed_on=frozenset({1}),
    )
    backward.captured[()] = SignatureCaptures([late])
    captures.lending[late.order] = (late, backward)
    grad = weight_gradient.detach()
    assert captures.free([early], []) is None
    inference._copy_kept_loans([early], [], captures)
    assert backward.copied_outputs == set() and late.on_loan == {0, 1}, "a .grad held until zero_grad() stays lent"
    held_input_gradient = input_gradient.detach()
    inference._copy_kept_loans([early], [], captures)
    assert backward.copied_outputs == {1} and late.lent == late.on_loan == {0} and late.passed_on == set()
    del grad, held_input_gradient
    assert captures.free([early], []) == 0


class _AtenCalls(TorchDispatchMode):
    """Records the ATen ops called in its block, and the tensors that each copies into."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func), list(args[0]) if isinstance(args[0], (list, tuple)) else [args[0]]))
        return func(*args, **(kwargs or {}))

    def copies(self) -> list[tuple[str, list[torch.Tensor]]]:
        return [(name, targets) for name, targets in self.calls if "copy" in name]


class _Doubling:
    """Stands for a captured CUDA graph on plain tensors: a replay writes twice its static input
    into its static output, and records what the static inputs held."""

    def __init__(self, inputs: list[torch.Tensor], output: torch.Tensor):
        self.inputs, self.output, self.seen = inputs, output, []

    def replay(self) -> None:
        self.seen.append([x.clone() for x in self.inputs if x is not None])
        torch.mul(self.inputs[0], 2, out=self.output)


def test_a_replay_copies_its_small_inputs_in_one_batched_op_and_not_those_already_in_place():
    """Before the graph replays, the inputs it does not read in place reach their static
    buffers in one ATen op (`_foreach_copy_`), whatever their number, but each one of
    BATCHED_COPY_BYTES or more in a copy of its own; an input that is its static buffer
    already is not copied, and with nothing to copy no op runs; a parameter read in place is
    never copied (`blocker` checks its address)."""
    weight = torch.randn(3)
    static = [torch.zeros(3), torch.zeros(2), torch.zeros(4), None]
    graph = _Doubling(static, torch.zeros(3))
    run = CapturedRun(
        graph=graph,
        inputs=static,
        addresses=[x.data_ptr() for x in static[:3]] + [weight.data_ptr()],
        outputs=[graph.output],
        extents={},
        parameters=frozenset({3}),
    )
    inputs = [torch.randn(3), torch.randn(2), torch.randn(4), weight]
    with _AtenCalls() as calls:
        (out,) = run.replay(inputs)
    ((name, targets),) = calls.copies()
    assert name == "aten._foreach_copy_.default" and [t.data_ptr() for t in targets] == [
        x.data_ptr() for x in static[:3]
    ]
    assert all(torch.equal(seen, given) for seen, given in zip(graph.seen[-1], inputs))
    torch.testing.assert_close(out, 2 * inputs[0])
    assert out.data_ptr() != graph.output.data_ptr(), "the caller gets a copy of the static output"

    # The second input is its static buffer: the batched copy takes the other two.
    static[1].copy_(torch.tensor([5.0, 6.0]))
    inputs = [torch.randn(3), static[1], torch.randn(4), weight]
    with _AtenCalls() as calls:
        run.replay(inputs)
    ((name, targets),) = calls.copies()
    assert [t.data_ptr() for t in targets] == [static[0].data_ptr(), static[2].data_ptr()]
    assert torch.equal(graph.seen[-1][1], torch.tensor([5.0, 6.0]))
    # An input of BATCHED_COPY_BYTES or more is copied alone, the others still in one op.
    large = torch.zeros(BATCHED_COPY_BYTES // 4)
    doubling = _Doubling([static[0], large], torch.zeros(3))
    run_with_large = CapturedRun(
        graph=doubling,
        inputs=[static[0], large],
        addresses=[static[0].data_ptr(), large.data_ptr()],
        outputs=[doubling.output],
        extents={},
    )
    given = [torch.randn(3), torch.randn(BATCHED_COPY_BYTES // 4)]
    with _AtenCalls() as calls:
        run_with_large.replay(given)
    assert [(name, [t.data_ptr() for t in targets]) for name, targets in calls.copies()] == [
        ("aten.copy_.default", [large.data_ptr()]),
        ("aten._foreach_copy_.default", [static[0].data_ptr()]),
    ]
    assert all(torch.equal(seen, value) for seen, value in zip(doubling.seen[-1], given))
    # Every input in place: nothing is copied before the replay.
    with _AtenCalls() as calls:
        run.replay([static[0], static[1], static[2], weight])
    assert calls.copies() == []
    assert "static input #3 (a parameter) is not where" in run.blocker([*inputs[:3], weight.clone()])


def test_a_replay_waits_for_the_check_of_its_inputs_after_copying_them_and_before_replaying():
    """A check of the inputs' values with the peers travels while the replay copies the inputs
    (which no peer waits for); the replay waits for its verdict before the graph runs, and a
    verdict that raises leaves the graph unreplayed."""
    static = [torch.zeros(3)]
    graph = _Doubling(static, torch.zeros(3))
    run = CapturedRun(graph=graph, inputs=static, addresses=[static[0].data_ptr()], outputs=[graph.output], extents={})
    x = torch.randn(3)
    seen_at_the_wait = []

    def checked() -> None:
        seen_at_the_wait.append((static[0].clone(), len(graph.seen)))

    (out,) = run.replay([x], checked)
    ((copied, replays_before),) = seen_at_the_wait
    assert torch.equal(copied, x) and replays_before == 0 and len(graph.seen) == 1
    torch.testing.assert_close(out, 2 * x)

    def refused() -> None:
        raise HostirError("input #0 is wrong on rank 1")

    with pytest.raises(HostirError, match="wrong on rank 1"):
        run.replay([torch.randn(3)], refused)
    assert len(graph.seen) == 1, "a refused check leaves the graph unreplayed"


def test_a_capture_copies_the_inputs_it_does_not_read_in_place():
    """How a capture takes its inputs, on plain tensors: a parameter (static) and an output
    another replay hands over are read in place, unless the input is marked symmetric
    (always copied, into symmetric memory); one the program does not read is not copied,
    handed over or not (a replay never reads it); the others are copied."""
    weight, saved, marked, fresh = torch.zeros(3), torch.zeros(4), torch.zeros(5), torch.zeros(6)
    handed_out = {saved.untyped_storage().data_ptr(), marked.untyped_storage().data_ptr()}
    handed_over, copied = input_kinds([weight, saved[1:], marked, fresh], [0], [2], handed_out)
    assert handed_over == {1} and copied == {2, 3}
    unread, unread_saved = torch.zeros(7), torch.zeros(8)
    handed_out.add(unread_saved.untyped_storage().data_ptr())
    handed_over, copied = input_kinds([weight, saved[1:], marked, fresh, unread, unread_saved], [0], [2], handed_out, [4, 5])
    assert handed_over == {1} and copied == {2, 3}


def test_a_replay_lends_the_outputs_it_is_asked_to_but_copies_those_it_cannot():
    """Which outputs a replay returns as they are, on plain tensors: a view of a parameter
    always (no replay writes it); of those the caller asks to hand over, not one in the
    memory of a handed-over input (the other replay's to overwrite) nor one in symmetric
    memory (every run's)."""
    weight, saved = torch.zeros(3, 4), torch.zeros(8)
    outputs = [weight.t(), saved[2:], torch.zeros(2), torch.zeros(2), torch.zeros(2)]
    views, lent = output_kinds(
        [weight, saved], outputs, frozenset({0}), frozenset({1}), {0, 1, 2, 3}, [3]
    )
    assert views == {0} and lent == {2}


def test_benchmark_quick_on_cpu():
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), "--quick", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "interpreter overhead: 100 ops on f32[16], cpu, median of 5 runs"
    for line, name in zip(lines[2:4], ("hand-written torch loop, eager", "hostir Program.run, eager")):
        assert line.startswith(name)
        milliseconds, microseconds = map(float, line[len(name) :].split())
        assert milliseconds > 0 and microseconds == pytest.approx(milliseconds * 10, abs=0.02)
    assert lines[4].startswith("interpreter cost per op: ")
    assert lines[5] == "graph replay: skipped (CUDA graphs need a CUDA device)"


# --------------------------------------------------------------------------- #
# GPUs                                                                         #
# --------------------------------------------------------------------------- #

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("case", SINGLE_DEVICE, ids=lambda case: case.name)
def test_replay_matches_torch_on_one_device(replay_device, case):
    assert replay_checks(case, Communicator.single(replay_device)) == []


def _two_rank_checks(case_name: str) -> list[str]:
    (case,) = (case for case in TWO_RANKS if case.name == case_name)
    return replay_checks(case, Communicator.from_env())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL)")
@pytest.mark.parametrize("case", TWO_RANKS, ids=lambda case: case.name)
def test_gpu_replay_matches_torch_on_two_nccl_ranks(case):
    assert run_on_local_ranks(_two_rank_checks, 2, case.name) == [[], []]


@needs_cuda
def test_gpu_failed_capture_falls_back_to_eager(monkeypatch):
    case = SINGLE_DEVICE[0]
    program = Program.compile(case.build())

    def host_read_inside_capture(inputs, context):
        return [torch.zeros(1, device="cuda").item()]  # a capture refuses reading device data

    replayer = GraphReplayer(program, Communicator.single(torch.device("cuda", 0)))
    inputs = [x.cuda() for x in case.inputs(0, 3)]
    monkeypatch.setattr(program.interpreter, "run", host_read_inside_capture)
    with pytest.warns(GraphReplayFallback, match="capture failed on rank\\(s\\) 0"):
        replayer.run(inputs)
    monkeypatch.undo()
    assert not replayer.replays
    assert torch.cuda.current_stream() == torch.cuda.default_stream(), "the caller's stream is current again"
    torch.randn(4, device="cuda")  # the random generator is out of the failed capture (torch raised here)
    (output,) = replayer.run(inputs)
    expected = case.expected(*(x.double().cpu() for x in inputs)).float()
    assert compare(output.cpu(), expected).ok
    # The failed capture left its memory pool recording; the next capture takes another.
    again = GraphReplayer(program, Communicator.single(torch.device("cuda", 0)))
    (output,) = again.run(inputs)
    assert again.replays and len(again.runs()) == 1 and compare(output.cpu(), expected).ok


def test_replay_reads_static_inputs_in_place(replay_device):
    """The linear's weight and bias are static inputs (a model's parameters): a replay
    reads them where the caller keeps them, so an update in place (an optimizer step) is
    seen with no copy; others passed at another address (another block's, where blocks
    share a graph) get a capture of their own, and the first still serves the first."""
    case = SINGLE_DEVICE[0]
    program = Program.compile(case.build())
    replayer = GraphReplayer(program, Communicator.single(replay_device), static_inputs=[1, 2])
    x, w, b = (t.to(replay_device) for t in case.inputs(0, 3))
    torch.testing.assert_close(replayer.run([x, w, b])[0], _linear(x, w, b))
    (captured,) = replayer.runs()
    assert [i for i, static in enumerate(captured.inputs) if static is not None] == [0]
    assert captured.addresses[1:] == [w.data_ptr(), b.data_ptr()]
    w.mul_(-2.0)
    b.add_(1.0)
    x2 = torch.randn_like(x)
    torch.testing.assert_close(replayer.run([x2, w, b])[0], _linear(x2, w, b))
    w2 = torch.randn_like(w)
    torch.testing.assert_close(replayer.run([x2, w2, b])[0], _linear(x2, w2, b))
    first, second = replayer.runs()
    assert first is captured and second.addresses[1:] == [w2.data_ptr(), b.data_ptr()]
    x3 = torch.randn_like(x)
    torch.testing.assert_close(replayer.run([x3, w, b])[0], _linear(x3, w, b))
    assert replayer.captured[signature([x3, w, b])].last == 0
    release_captured_graphs()


@needs_cuda
def test_gpu_replay_runs_eagerly_when_an_input_is_on_the_cpu():
    """A 0-dim CPU input that only an ATen call reads (as attention kernels take their
    random seed back): a captured kernel would keep its value from the capture, so the
    program runs eagerly, says why, and sees each run's value."""
    from test_program import SEEDED

    with pytest.warns(GraphReplayFallback, match=r"input #0 is on the CPU"):
        replayer = GraphReplayer(Program.compile(SEEDED), Communicator.single(torch.device("cuda", 0)))
        x = torch.randn(4, device="cuda")
        for seed in (3, 5):
            torch.testing.assert_close(replayer.run([torch.tensor(seed), x])[0], (x + seed) - x)
    assert not replayer.replays and replayer.captured == {}


def test_replay_lends_an_output_until_a_caller_keeps_it(replay_device):
    """An output on loan (`lend`: a parameter's gradient) is the static output itself while
    the caller lets go of it before the next run. A caller that keeps it and accumulates
    into it (gradient accumulation) gets the next runs from a second capture, with no
    warning and its accumulated values right, and copies of that output from then on; once
    it lets go, the first capture serves again. With one capture allowed, those runs run
    outside the graph instead, said once, and are right too."""
    device = replay_device

    def inputs(seed: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randn(3, 6, generator=generator).to(device) for _ in range(2)]

    for most_captures in (MOST_CAPTURES, 1):
        replayer = GraphReplayer(
            Program.compile(single_binary("f32")), Communicator.single(device), lend=[0], most_captures=most_captures
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", GraphReplayFallback)
            with poisoned_allocations():
                (first,) = replayer.run(a_b := inputs(0))
            (captured,) = replayer.runs()
            assert captured.on_loan == {0} and first.data_ptr() == captured.outputs[0].data_ptr()
            torch.testing.assert_close(first, sum(a_b))
            del first
            (accumulated,) = replayer.run(a_b := inputs(1))
            assert accumulated.data_ptr() == captured.outputs[0].data_ptr()
            expected = sum(a_b)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for seed in (2, 3):
                (gradient,) = replayer.run(a_b := inputs(seed))
                accumulated += gradient
                expected += sum(a_b)
                del gradient
        said = [str(w.message) for w in caught if issubclass(w.category, GraphReplayFallback)]
        torch.testing.assert_close(accumulated, expected)
        assert replayer.copied_outputs == {0} and all(run.lent == set() for run in replayer.runs())
        if most_captures == 1:
            assert len(said) == 1 and "captures for these input shapes are all in use" in said[0], said
            assert len(replayer.runs()) == 1
        else:
            assert said == [] and len(replayer.runs()) == 2
        del accumulated
        with warnings.catch_warnings():
            warnings.simplefilter("error", GraphReplayFallback)
            (again,) = replayer.run(a_b := inputs(4))
        assert replayer.captured[signature(a_b)].last == 0, "the first capture serves again"
        assert again.data_ptr() != captured.outputs[0].data_ptr(), "and returns a copy"
        torch.testing.assert_close(again, sum(a_b))
        del again
        release_captured_graphs()


def test_replay_hands_its_outputs_over_to_the_next_graph(replay_device):
    """A replay hands over the outputs it is asked to (the activations a forward graph
    saves): it returns its static outputs themselves, and a graph captured on them (the
    backward graph) reads them in place: no copy on either side. While the caller holds
    the last outputs (two forwards before their backwards), the next run replays a
    second capture of each graph, the second graph's reading the second's outputs, with no
    warning, and the outputs held are left as they were. With one capture allowed, the
    runs run outside the graph instead, say why once, and are right."""
    device = replay_device
    communicator = Communicator.single(device)
    for most_captures in (MOST_CAPTURES, 1):
        first = GraphReplayer(
            Program.compile(single_binary("f32")), communicator, hand_over=[0], most_captures=most_captures
        )
        second = GraphReplayer(Program.compile(matmul(0, "f32")), communicator, most_captures=most_captures)

        def step(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            generator = torch.Generator().manual_seed(seed)
            a, b, w = (torch.randn(shape, generator=generator).to(device) for shape in ((3, 6), (3, 6), (6, 7)))
            (hidden,) = first.run([a, b])
            (out,) = second.run([hidden, w])
            torch.testing.assert_close(out, (a + b) @ w)
            return hidden, out, a + b

        with warnings.catch_warnings():
            warnings.simplefilter("error", GraphReplayFallback)
            with poisoned_allocations():
                hidden, _, _ = step(0)
            (forward,) = first.runs()
            (backward,) = second.runs()
            assert hidden.data_ptr() == forward.outputs[0].data_ptr()
            assert backward.handed_over == {0} and backward.inputs[0] is None
            del hidden
            for seed in (1, 2):
                step(seed)
        held, expected = step(3)[::2]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for seed in (4, 5):
                step(seed)
        said = [str(w.message) for w in caught if issubclass(w.category, GraphReplayFallback)]
        if most_captures == 1:
            assert len(said) == 2 and all("all in use" in m for m in said), said
            assert "input #0 is not the output" in said[1], said
        else:
            assert said == [] and len(first.runs()) == 2 and len(second.runs()) == 2
            assert second.runs()[1].addresses[0] == first.runs()[1].outputs[0].data_ptr()
        torch.testing.assert_close(held, expected)
        del held
        ones = torch.ones(3, 6, device=device)
        (hidden,) = first.run([ones, ones])
        (out,) = second.run([hidden * 3, torch.ones(6, 7, device=device)])
        torch.testing.assert_close(out, torch.full((3, 7), 36.0, device=device))
        del hidden
        release_captured_graphs()
