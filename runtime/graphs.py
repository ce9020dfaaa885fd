"""CUDA-graph replay of a whole host program: captured per input signature, replayed after.

    replayer = GraphReplayer(program, communicator)
    outputs = replayer.run(local_inputs)     # every rank, every step; same results as program.run

The interpreter costs some microseconds of Python per op (docs/runtime.md); a CUDA
graph launches the kernels and NCCL calls of a whole run with one call. For each new
input *signature* (the shape, strides, dtype and device of every input) the replayer

1. copies the inputs into static input buffers that it owns (from `Program.symmetric_empty`
   for the inputs marked `hir.symmetric`, so a caller's input need not be symmetric), but
   those that no op of the program reads (`Program.unread_inputs`);
2. runs the program eagerly `warmup_runs` times on the capture stream (torch's rule before
   capture: lazy initialisations, cuBLAS workspaces, NCCL communicators, the process
   groups and the stream pool, the CuPy kernels' compilation all happen here);
3. captures one run with `torch.cuda.graph` (the interpreter's steps called directly:
   `Program.run`'s cross-rank input check communicates and reads back, which a capture
   cannot), keeping the run's outputs as the static outputs;
4. agrees with every rank on whether every capture succeeded (NCCL requires that a
   captured communication be captured on all its ranks).

A run whose signature was captured copies the inputs into the static inputs (the small ones
with one batched copy, `torch._foreach_copy_`, each of at least `BATCHED_COPY_BYTES` with a
copy of its own, and none for an input that is its static input already), waits for the
check of the inputs' values with the peers where the caller started
one (`Program.start_check_values`, which travels during the copy), replays the graph and
returns clones of the static outputs: the caller owns
what it gets (a next replay does not overwrite it) and the caller's inputs are only read.

Outputs that the caller names *handed over* (`hand_over`: the activations that a
forward graph saves for its backward graph, which let go of them once it has run) are
returned as they are, with no copy, and are the caller's until it lets go of them (torch
counts the tensors that use a buffer's memory). Outputs that the caller names *lent*
(`lend`: the gradients of parameters that a backward graph returns, which autograd's
AccumulateGrad takes as `.grad` with no copy and `zero_grad()` lets go of) are returned
as they are too, while callers let go of them before the next run of their graph: a
caller that keeps one past it (a gradient accumulated over steps, a `.grad` kept past
the next backward) gets copies of that output from then on, from every capture. Lent
outputs that the caller names *passed on* (`pass_on`: what a forward returns to the
model's next block, the gradients of activations, which the autograd engine hands to the
backward of what made them) are copied from then on too where one is still held when it
blocks any replay (an output kept in a variable, an input's `.grad` that the last
step's loss keeps alive). A graph captured on inputs that are outputs returned as they
are (the backward graph's, the next block's) reads them in place, with no copy either.

A run therefore may find the outputs of the last replay still held: the next block of a
model whose blocks share one compiled graph (torch compiles a block's code once for all
its instances), a forward run twice before its backward, a gradient kept. It replays
*another capture* of the same program for the same signature, one whose outputs no
caller holds and whose parameters and handed-over inputs are where it reads them, and
captures one more where none is (up to `most_captures` per signature; past that, it runs
the program's steps outside the graph, on buffers of their own, and says why once,
`GraphReplayFallback`). A model of N blocks compiled block by block so replays N captures
of its forward graph and N of its backward graph, each block its own, as CUDA graph
trees do.

Every capture on a device allocates from one memory pool on one stream (`DeviceCaptures`),
so that a capture reuses the temporary memory of those before it (a backward graph the
forward's, one capture of a block the last's): memory near eager's, rather than a pool
per graph. A replay writes only memory that was free at its capture: its temporaries and
its outputs. A capture made later may have put outputs in the temporaries of an earlier
one, so a capture is replayed only while no caller holds an output of a capture made
after it; while one does, another capture, or a new one, serves the run. Which capture
serves a run depends only on which outputs the callers hold, which every rank's autograd
holds alike; a rank that held other outputs than its peers would capture alone, and its
peers would wait for it until the process group's timeout.

Inputs that the caller names *static* (`static_inputs`: a model's parameters, which
every step passes at the same address and an optimizer updates in place) are not
copied: the graph reads the caller's tensor itself, as inductor's CUDA graphs do, and an
output that is a view of one (a weight's transpose) is returned as it is. A run
that passes one at another address (another block's parameters, where blocks share a
graph) replays a capture made on that address, or makes one. An input marked
`hir.symmetric` is always copied, into symmetric memory.

Control flow in a host program depends only on the rank, the shapes and the number of
streams, never on data, so a capture of a signature is exact, dynamic extents (`?`)
included: a new extent is a new signature. Where a graph cannot be used the program
runs eagerly and the replayer says why, once (`GraphReplayFallback`): on the CPU (gloo
has no graphs) or when a capture failed on some rank.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from hostir import config
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.interpreter import RunContext
from hostir.runtime.interpreter.communication import copy_engine_transfers
from hostir.runtime.program import Program

Signature = tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device], ...]

BATCHED_COPY_BYTES = 1 << 20
"""The inputs a replay copies into its static buffers that are smaller than this go in one
batched copy (`torch._foreach_copy_`: one ATen call, where a copy each would launch each);
a larger one is copied alone, a device-to-device memcpy of contiguous buffers: on an H200
a 64 MiB input took 53 µs batched, 35 µs alone (docs/benchmarks.md)."""


class GraphReplayFallback(UserWarning):
    """A program runs eagerly where graph replay was asked for; the message says why."""


def signature(inputs: Sequence[torch.Tensor]) -> Signature:
    """What a capture depends on: each input's shape, strides, dtype and device. Made at every
    run (a torch.Size hashes and compares as the tuple it is)."""
    return tuple((x.shape, x.stride(), x.dtype, x.device) for x in inputs)


def _use_count(storage: torch.UntypedStorage) -> int:
    """How many tensors and storage objects hold `storage`'s memory (views and aliases each count once)."""
    return torch._C._storage_Use_Count(storage._cdata)


@dataclass
class CapturedRun:
    """One captured run: the graph and the static buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor | None]
    """The static buffers that each replay copies the inputs into; None for an input the
    graph reads where the caller has it."""
    addresses: list[int]
    """Where the graph reads each input."""
    outputs: list[torch.Tensor]
    extents: dict[tuple[int, int], int]
    """The inputs' dynamic extents, for a run of these inputs outside the graph."""
    watch: Callable[[torch.cuda.Event, torch.cuda.Event], None] | None = None
    """Watches a replay (`Watchdog.watch`) where the graph waits for peers on the GPU with no
    timeout of its own: the copy engines' signals (runtime/distributed/watchdog.py)."""

    order: int = 0
    """Its place among the captures on its device (`DeviceCaptures`): a replay may overwrite
    the outputs of the captures made after it."""
    parameters: frozenset[int] = frozenset()
    """The inputs read in place that the caller keeps at one address (static inputs)."""
    handed_over: frozenset[int] = frozenset()
    """The inputs read in place that were outputs of a replay when this run was captured
    (the activations a forward graph saves, read by the backward graph)."""
    views: frozenset[int] = frozenset()
    """The outputs that are views of parameters (a weight's transpose), which a replay
    returns as they are: no replay writes them."""
    lent: frozenset[int] = frozenset()
    """The outputs that a replay returns as they are (`GraphReplayer`'s `hand_over` and
    `lend`), which other graphs read in place; it returns copies of the others."""
    on_loan: frozenset[int] = frozenset()
    """The lent outputs that a replay lends only while callers let go of them in time
    (`GraphReplayer`'s `lend` and `pass_on`), and copies once one was kept."""
    passed_on: frozenset[int] = frozenset()
    """The outputs on loan that callers pass on at once (`GraphReplayer`'s `pass_on`): kept,
    as soon as one blocks any replay."""
    unused: dict[int, tuple[torch.UntypedStorage, int]] = field(init=False)
    """Per memory of the outputs lent now or before, its storage and the storage's use count
    while no caller holds it (`_use_count`, this storage object included)."""

    def __post_init__(self) -> None:
        storages = {(storage := self.outputs[i].untyped_storage()).data_ptr(): storage for i in self.lent}
        self.unused = {memory: (storage, _use_count(storage)) for memory, storage in storages.items()}
        self.copied: tuple[tuple[int, torch.Tensor], ...] = tuple(
            (i, static) for i, static in enumerate(self.inputs) if static is not None
        )
        """(input, its static buffer) of each input that a replay copies."""
        self.parameter_addresses: tuple[tuple[int, int], ...] = tuple(
            (i, self.addresses[i]) for i in sorted(self.parameters) if self.inputs[i] is None
        )
        """(input, where the graph reads it) of each parameter, which a replay reads in place."""
        self.lent_memory: set[int] = set(self.unused)
        """The memory of the outputs that a replay returns as they are now, which other graphs
        read in place (`unused` keeps that of those lent before, while held)."""

    def blocker(self, inputs: Sequence[torch.Tensor]) -> str | None:
        """Why a replay on `inputs` would be wrong, or None: an output of the previous
        replay that a caller still holds (a replay would overwrite it), or `misplaced`."""
        if self.held():
            return "an output of its previous replay is still in use, and a replay would overwrite it"
        return self.misplaced(inputs)

    def misplaced(self, inputs: Sequence[torch.Tensor]) -> str | None:
        """A parameter or an input handed over by another replay that is not where the graph
        reads it, said; None where the graph reads every such input where it is."""
        if (parameter := self.misplaced_parameter(inputs)) is not None:
            return parameter
        for i in self.handed_over:
            if inputs[i].data_ptr() != self.addresses[i]:
                return f"input #{i} is not the output of the replay that it was when the graph was captured"
        return None

    def misplaced_parameter(self, inputs: Sequence[torch.Tensor]) -> str | None:
        """A parameter that is not where the graph reads it, said (another block's, where
        blocks share a graph); None where every one is."""
        for i, address in self.parameter_addresses:
            if inputs[i].data_ptr() != address:
                return f"static input #{i} (a parameter) is not where it was when the graph was captured"
        return None

    def held(self) -> bool:
        """Whether a caller holds an output that a replay returned as it is. Memory that no
        replay lends any more is forgotten once no caller holds it."""
        for memory, (storage, unused) in list(self.unused.items()):
            if _use_count(storage) > unused:
                return True
            if memory not in self.lent_memory:
                del self.unused[memory]
        return False

    def kept_loans(self, among: Collection[int]) -> frozenset[int]:
        """The outputs `among` those on loan whose memory a caller holds."""
        kept = set()
        for i in self.on_loan & frozenset(among):
            storage, unused = self.unused[self.outputs[i].untyped_storage().data_ptr()]
            if _use_count(storage) > unused:
                kept.add(i)
        return frozenset(kept)

    def stop_lending(self, outputs: Collection[int]) -> None:
        """Makes the replays copy `outputs` from now on, rather than return them as they are."""
        self.lent -= frozenset(outputs)
        self.on_loan -= frozenset(outputs)
        self.passed_on -= frozenset(outputs)
        self.lent_memory = {self.outputs[i].untyped_storage().data_ptr() for i in self.lent}

    def replay(
        self, inputs: Sequence[torch.Tensor], checked: Callable[[], object] = lambda: None
    ) -> list[torch.Tensor]:
        """The outputs of a replay on `inputs`, which `blocker` allows. `checked` is called, and
        may raise, after the copy of the inputs into the static buffers and before the replay."""
        # The small inputs in one batched copy, the large ones each alone; an input that
        # already is its static buffer (a caller that fills it in place) is not copied.
        sources, targets = [], []
        for i, static in self.copied:
            value = inputs[i]
            if value.data_ptr() != static.data_ptr() or value.stride() != static.stride():
                if static.nbytes >= BATCHED_COPY_BYTES:
                    static.copy_(value)
                else:
                    sources.append(value)
                    targets.append(static)
        if targets:
            torch._foreach_copy_(targets, sources)
        checked()
        if self.watch is None:
            self.graph.replay()
        else:
            started, finished = torch.cuda.Event(), torch.cuda.Event()
            started.record()
            self.graph.replay()
            finished.record()
            self.watch(started, finished)
        return [
            out if i in self.views else out.detach() if i in self.lent else out.clone()
            for i, out in enumerate(self.outputs)
        ]


def _end_generator_capture(device: torch.device) -> None:
    """Leaves the device's default random generator as it was before a capture that failed.

    A capture registers the generator, and torch ends that registration only when the
    capture ends without error; after a failed one every later random op on the
    device raises "Offset increment outside graph capture". A clone of the generator's
    state (same seed and offset, not capturing) replaces the stuck one.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    generator.graphsafe_set_state(generator.clone_state())


@dataclass
class DeviceCaptures:
    """What every capture on one device shares: one memory pool and one stream (the caching
    allocator reuses a block only on the stream that freed it), and the order of the
    captures, which says whose outputs a replay may overwrite (see the module's docstring)."""

    pool: tuple[int, int]
    stream: torch.cuda.Stream
    count: int = 0
    """How many captures were made, the last's `order`."""
    lending: dict[int, tuple[CapturedRun, GraphReplayer]] = field(default_factory=dict)
    """By order, the captured runs whose replays returned outputs as they are that a caller
    may still hold, and their replayers (dropped once none is held)."""

    def next_order(self) -> int:
        self.count += 1
        return self.count

    def holders_after(self, run: CapturedRun) -> list[tuple[CapturedRun, GraphReplayer]]:
        """The captures made after `run`'s of which a caller holds an output, which a replay of
        `run` may overwrite (that capture's memory may have been `run`'s temporaries)."""
        holders = []
        for order, (later, replayer) in list(self.lending.items()):
            if order > run.order:
                if later.held():
                    holders.append((later, replayer))
                else:
                    del self.lending[order]
        return holders

    def free(self, runs: Sequence[CapturedRun], inputs: Sequence[torch.Tensor], first: int = 0) -> int | None:
        """The index in `runs` of one that may replay on `inputs`, trying them from `first`
        around: no caller holds its outputs nor those of a capture made after it, and its
        parameters and handed-over inputs are where it reads them. None where none may."""
        for step in range(len(runs)):
            index = (first + step) % len(runs)
            run = runs[index]
            if run.blocker(inputs) is None and not self.holders_after(run):
                return index
        return None


class SignatureCaptures(list[CapturedRun]):
    """A signature's captures, in the order they were made (`GraphReplayer.captured`)."""

    last: int = -1
    """The index of the capture that served the signature's last run: the next run tries the one
    after it first (a model's blocks take the captures in turn)."""


_DEVICE_CAPTURES: dict[torch.device, DeviceCaptures] = {}


def device_captures(device: torch.device) -> DeviceCaptures:
    """The captures of this process on the CUDA `device`."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _DEVICE_CAPTURES:
        _DEVICE_CAPTURES[device] = DeviceCaptures(torch.cuda.graph_pool_handle(), torch.cuda.Stream(device))
    return _DEVICE_CAPTURES[device]


_REPLAYERS: weakref.WeakSet[GraphReplayer] = weakref.WeakSet()
"""The replayers alive in this process, for `release_captured_graphs` and `_handed_out_memory`."""


def _captured_runs() -> Iterator[CapturedRun]:
    return (run for replayer in list(_REPLAYERS) for runs in replayer.captured.values() for run in runs)


def _handed_out_memory() -> set[int]:
    """The memory of the outputs that the replays of this process hand over: an input in
    it is read in place by a graph captured on it."""
    return {memory for run in _captured_runs() for memory in run.lent_memory}


def release_captured_graphs() -> None:
    """Frees every CUDA graph that a replayer of this process captured, and their memory
    pools; a later run of a replayer captures again.

    Call it before `dist.destroy_process_group()`: NCCL cannot destroy a communicator that
    a live graph captured a communication of, and the call hangs
    (pytorch/pytorch#115388). hostir's launchers do so.
    """
    for replayer in list(_REPLAYERS):
        replayer.captured.clear()
    _DEVICE_CAPTURES.clear()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def input_kinds(
    inputs: Sequence[torch.Tensor],
    static: Collection[int],
    symmetric: Collection[int],
    handed_out: set[int],
    unread: Collection[int] = (),
) -> tuple[frozenset[int], frozenset[int]]:
    """How a graph captured on `inputs` takes each: (handed over, copied). The handed-over
    inputs are in the memory `handed_out` of another replay's lent outputs, and read in
    place; the `static` ones (parameters) are read in place too, and the `unread` ones
    (that no op of the program reads) not at all; every other input is copied into a
    static buffer of the graph's own, a `symmetric` one (marked `hir.symmetric`) always,
    into symmetric memory."""
    not_copied = frozenset(static) | (frozenset(unread) - frozenset(symmetric))
    handed_over = (
        frozenset(i for i, x in enumerate(inputs) if i not in symmetric and x.untyped_storage().data_ptr() in handed_out)
        - not_copied
    )
    copied = frozenset(range(len(inputs))) - not_copied - handed_over
    return handed_over, copied


def output_kinds(
    static_inputs: Sequence[torch.Tensor],
    static_outputs: Sequence[torch.Tensor],
    parameters: frozenset[int],
    handed_over: frozenset[int],
    hand_over: Collection[int],
    symmetric_outputs: Collection[int],
) -> tuple[frozenset[int], frozenset[int]]:
    """Which of a captured run's outputs a replay returns as they are: (views, lent). The
    views are in the memory of a parameter (a weight's transpose), which no replay
    writes; the lent ones are those the caller asks to `hand_over`, but for a view, an
    output in the memory of an input that another replay hands over (that replay's to
    overwrite) and one in symmetric memory (every run's, a run outside the graph
    included): those are copied."""

    def memory_of(indices: frozenset[int]) -> set[int]:
        return {static_inputs[i].untyped_storage().data_ptr() for i in indices}

    def outputs_in(memory: set[int]) -> frozenset[int]:
        return frozenset(i for i, out in enumerate(static_outputs) if out.untyped_storage().data_ptr() in memory)

    views = outputs_in(memory_of(parameters))
    lent = frozenset(hand_over) - views - outputs_in(memory_of(handed_over)) - frozenset(symmetric_outputs)
    return views, lent


MOST_CAPTURES = 256
"""The most captures of one program for one signature (`GraphReplayer`'s `most_captures`):
one per block of a model compiled block by block, and a few more."""


class GraphReplayer:
    """Runs a `Program` on one rank by replaying CUDA graphs, or eagerly where it cannot."""

    def __init__(
        self,
        program: Program,
        communicator: Communicator | None = None,
        num_streams: int | None = None,
        warmup_runs: int = 2,
        static_inputs: Sequence[int] = (),
        hand_over: Collection[int] = (),
        lend: Collection[int] = (),
        pass_on: Collection[int] = (),
        most_captures: int = MOST_CAPTURES,
    ):
        self.program = program
        self.static_inputs = sorted(set(static_inputs) - set(program.symmetric_inputs))
        """The inputs read where the caller keeps them (see the module's docstring)."""
        self.hand_over = frozenset(hand_over)
        """The outputs that a replay returns as they are, with no copy (see the module's docstring)."""
        self.pass_on = frozenset(pass_on) - self.hand_over
        """The outputs lent that callers pass on at once (see the module's docstring)."""
        self.lend = (frozenset(lend) - self.hand_over) | self.pass_on
        """The outputs that a replay returns as they are while callers let go of them in time,
        and copies once one was kept (see the module's docstring)."""
        self.communicator = communicator or Communicator.default()
        self.num_streams = config.num_streams if num_streams is None else num_streams
        self.warmup_runs = warmup_runs
        self.most_captures = most_captures
        self.copied_outputs: frozenset[int] = frozenset()
        """The outputs on loan that a caller kept where they blocked a replay, which every
        capture copies from then on (see the module's docstring)."""
        self.captured: dict[Signature, SignatureCaptures] = {}
        """Per signature, its captures; a run looks its signature up once (a signature of many
        inputs takes microseconds to hash and compare)."""
        self.said: set[str] = set()
        """Why runs of this program ran outside their graph, each said once."""
        self.eager_reason: str | None = None
        """Why this replayer runs the program eagerly; None while it replays."""
        _REPLAYERS.add(self)
        if not self.replays_on(self.communicator.device):
            self._run_eagerly(
                f"CUDA graphs need CUDA devices, and this rank runs {self.communicator.where}"
            )

    @staticmethod
    def replays_on(device: torch.device) -> bool:
        """Whether a replayer on `device` replays CUDA graphs, rather than running eagerly."""
        return device.type == "cuda"

    @property
    def replays(self) -> bool:
        return self.eager_reason is None

    def runs(self) -> list[CapturedRun]:
        """Every capture of this replayer."""
        return [run for runs in self.captured.values() for run in runs]

    def run(self, inputs: Sequence[torch.Tensor], checked: Callable[[], object] = lambda: None) -> list[torch.Tensor]:
        """The program's outputs on `inputs` (this rank's), replayed when a graph can be used.

        All ranks call it together with inputs of matching signatures, as they call
        `Program.run`; a replay does not exchange anything between ranks, so it does
        not check inputs across ranks as `Program.run` does (a new signature does).
        `checked`, the wait for a check of the inputs' values that is under way with the
        peers (`Program.start_check_values`), is called before the program communicates:
        a replay calls it once it has copied the inputs, which no peer waits for.
        """
        if self.replays:
            key = signature(inputs)
            runs = self.captured.get(key)
            if runs is None:
                runs = self.captured[key] = SignatureCaptures()
            captures = device_captures(self.communicator.device)
            index = captures.free(runs, inputs, runs.last + 1)
            if index is not None:
                return self._replay(captures, runs, index, inputs, checked)
            self._copy_kept_loans(runs, inputs, captures)
        checked()
        if self.replays and len(runs) >= self.most_captures:
            return self._run_outside(runs[0], inputs, self._why_none_free(runs, inputs))
        if self.replays and self._capture(runs, inputs) is not None:
            return self._replay(device_captures(self.communicator.device), runs, len(runs) - 1, inputs)
        return self.program.run(inputs, self.communicator, self.num_streams, views_of=self.static_inputs)

    def _replay(
        self,
        captures: DeviceCaptures,
        runs: SignatureCaptures,
        index: int,
        inputs: Sequence[torch.Tensor],
        checked: Callable[[], object] = lambda: None,
    ) -> list[torch.Tensor]:
        run = runs[index]
        runs.last = index
        outputs = run.replay(inputs, checked)
        if run.lent:
            captures.lending[run.order] = (run, self)
        return outputs

    def stop_lending(self, outputs: frozenset[int]) -> None:
        """Makes every capture, and those to come, copy `outputs` rather than lend them."""
        self.copied_outputs |= outputs
        for run in self.runs():
            run.stop_lending(outputs)

    def _copy_kept_loans(self, runs: Sequence[CapturedRun], inputs: Sequence[torch.Tensor], captures: DeviceCaptures) -> None:
        """Where no capture may serve `inputs`, the outputs on loan that a caller kept make
        their replayers copy them from then on: those of a capture of these parameters (the
        same block's) held at this next run of their graph, and, where a capture would serve
        but for a later one's outputs, those of them passed on (held at all). So no caller's
        habit makes captures grow run after run; a parameter's gradient held by `.grad`
        until `zero_grad()`, while an inference graph runs, is no such habit: that run
        takes another capture, once."""
        for run in runs:
            if run.misplaced_parameter(inputs) is None and (kept := run.kept_loans(run.on_loan)):
                self.stop_lending(kept)
            if run.misplaced(inputs) is None:
                for holder, owner in captures.holders_after(run):
                    if kept := holder.kept_loans(holder.passed_on):
                        owner.stop_lending(kept)

    def _why_none_free(self, runs: Sequence[CapturedRun], inputs: Sequence[torch.Tensor]) -> str:
        blocker = runs[0].blocker(inputs) or "an output of a graph captured after it is still in use"
        return f"its {len(runs)} captures for these input shapes are all in use (the first: {blocker})"

    def _run_outside(self, captured: CapturedRun, inputs: Sequence[torch.Tensor], why: str) -> list[torch.Tensor]:
        """A run of a captured signature outside its graph, where no capture may replay: the
        program's steps on buffers of their own, with the extents that the capture checked,
        exchanging nothing more than a replay (the peers may be replaying)."""
        if why not in self.said:
            self.said.add(why)
            warnings.warn(
                f"@{self.program.host.sym_name.data} ran outside its CUDA graph, slower: {why} "
                "(said once per program and reason)",
                GraphReplayFallback,
                stacklevel=3,
            )
        context = RunContext.of(self.communicator, self.num_streams, captured.extents)
        return self.program.run_checked(inputs, context, views_of=self.static_inputs)

    def _run_eagerly(self, reason: str) -> None:
        self.eager_reason = reason
        self.captured.clear()
        warnings.warn(
            f"@{self.program.host.sym_name.data} runs eagerly: {reason}", GraphReplayFallback, stacklevel=3
        )

    def _capture(self, earlier: SignatureCaptures, inputs: Sequence[torch.Tensor]) -> CapturedRun | None:
        """Captures a run on copies of `inputs`, appended to `earlier` (the signature's
        captures), having warmed up for its first; None when a rank could not capture, or when
        an input is on the CPU (every rank alike: they run one graph)."""
        program, device = self.program, self.communicator.device
        on_cpu = next((i for i, x in enumerate(inputs) if x.device.type == "cpu" and device.type != "cpu"), None)
        if on_cpu is not None:
            # A kernel reads such a value (an attention kernel's random seed) when it is
            # launched: a replay would reuse the one of the capture.
            self._run_eagerly(f"input #{on_cpu} is on the CPU, and a CUDA graph would keep its value from the capture")
            return None
        handed_over, copied = input_kinds(
            inputs, self.static_inputs, program.symmetric_inputs, _handed_out_memory(), program.unread_inputs
        )
        static_inputs = program.with_symmetric_inputs(
            [x.clone() if i in copied else x for i, x in enumerate(inputs)], self.communicator
        )
        captures = device_captures(device)
        # Another capture of a signature runs what the first warmed up, on the extents it checked.
        extents = earlier[0].extents if earlier else self._warm_up(captures.stream, static_inputs)
        graph, static_outputs, failure = self._record(captures, static_inputs, extents)
        failed_ranks = self._ranks_that_failed(failure is not None)
        if failed_ranks:
            self._run_eagerly(
                f"its CUDA graph capture failed on rank(s) {', '.join(map(str, failed_ranks))}"
                + (f" (here: {failure})" if failure else "")
            )
            return None
        parameters = frozenset(self.static_inputs)
        returned_as_they_are = (self.hand_over | self.lend) - self.copied_outputs
        views, lent = output_kinds(
            static_inputs, static_outputs, parameters, handed_over, returned_as_they_are, program.symmetric_outputs
        )
        run = CapturedRun(
            graph,
            [x if i in copied else None for i, x in enumerate(static_inputs)],
            [x.data_ptr() for x in static_inputs],
            static_outputs,
            extents,
            self._watch(),
            captures.next_order(),
            parameters,
            handed_over,
            views,
            lent,
            lent & self.lend,
            lent & self.pass_on,
        )
        earlier.append(run)
        return run

    def _warm_up(self, side: torch.cuda.Stream, static_inputs: Sequence[torch.Tensor]) -> dict[tuple[int, int], int]:
        """Runs the program `warmup_runs` times on `side` (torch's rule before capture: lazy
        initialisations, cuBLAS workspaces, NCCL communicators, the process groups and the
        stream pool, the CuPy kernels' compilation all happen here); the inputs' dynamic
        extents, checked across ranks as `Program.run` checks them, for the capture."""
        device = self.communicator.device
        with torch.cuda.device(device):
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup_runs):
                    self.program.run(static_inputs, self.communicator, self.num_streams)
            torch.cuda.current_stream(device).wait_stream(side)
        return self.program.check(static_inputs, self.communicator)

    def _record(
        self, captures: DeviceCaptures, static_inputs: Sequence[torch.Tensor], extents: dict[tuple[int, int], int]
    ) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor] | None, str | None]:
        """Captures one run on the device's capture stream into its pool, the interpreter's
        steps called directly (`Program.run`'s cross-rank check communicates and reads back,
        which a capture cannot): the graph, the run's outputs (the static outputs), and why
        the capture failed, if it did."""
        device = self.communicator.device
        context = RunContext.of(self.communicator, self.num_streams, extents)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        caller = torch.cuda.current_stream(device)
        try:
            # thread_local: the process group's watchdog thread queries CUDA events
            # while this thread captures, which the global mode would refuse.
            with torch.cuda.device(device), torch.cuda.graph(
                graph, pool=captures.pool, stream=captures.stream, capture_error_mode="thread_local"
            ):
                static_outputs = self.program.interpreter.run(static_inputs, context)
        except Exception as error:  # whatever the capture refused, the program still runs eagerly
            # torch.cuda.graph leaves its stream current when ending a failed capture raises.
            torch.cuda.set_stream(caller)
            _end_generator_capture(device)
            # A capture that failed leaves its pool recording, which every later capture into
            # it would refuse: the next captures on this device take a new pool.
            captures.pool = torch.cuda.graph_pool_handle()
            return graph, None, f"{type(error).__name__}: {error}"
        return graph, static_outputs, None

    def _watch(self) -> Callable[[torch.cuda.Event, torch.cuda.Event], None] | None:
        """What watches a replay where the graph waits for peers on the GPU with no timeout of
        its own (the copy engines' signals): the copy engine's watchdog; None otherwise."""
        if not copy_engine_transfers(self.program.host):
            return None
        return functools.partial(
            self.communicator.copy_engine.watchdog.watch,
            what=f"a replay of @{self.program.host.sym_name.data} (backend cuda transfers)",
        )

    def _ranks_that_failed(self, failed: bool) -> list[int]:
        """The ranks whose capture failed, known to every rank (one all-gather in a world of several)."""
        communicator = self.communicator
        ranks = sorted(communicator.ranks)
        if len(ranks) == 1:
            return [communicator.rank] if failed else []
        flags = torch.empty(len(ranks), dtype=torch.int32, device=communicator.device)
        local = torch.tensor([int(failed)], dtype=torch.int32, device=communicator.device)
        communicator.allgather(local, flags, ranks, 0).wait()
        return [rank for rank, flag in zip(ranks, flags.tolist()) if flag]
