"""CUDA-graph replay of a whole host program: captured once per input signature, replayed after.

    replayer = GraphReplayer(program, communicator)
    outputs = replayer.run(local_inputs)     # every rank, every step; same results as program.run

The interpreter costs some microseconds of Python per op (docs/runtime.md); a CUDA
graph launches the kernels and NCCL calls of a whole run with one call. For each new
input *signature* (the shape, strides, dtype and device of every input) the replayer

1. copies the inputs into static input buffers that it owns (from `Program.symmetric_empty`
   for the inputs marked `hir.symmetric`, so a caller's input need not be symmetric);
2. runs the program eagerly `warmup_runs` times on a side stream (torch's rule before
   capture: lazy initialisations, cuBLAS workspaces, NCCL communicators, the process
   groups and the stream pool, the CuPy kernels' compilation all happen here);
3. captures one run with `torch.cuda.graph` (the interpreter's steps called directly:
   `Program.run`'s cross-rank input check communicates and reads back, which a capture
   cannot), keeping the run's outputs as the static outputs;
4. agrees with every rank on whether every capture succeeded (NCCL requires that a
   captured communication be captured on all its ranks).

A run whose signature was captured copies the inputs into the static inputs, replays
the graph and returns clones of the static outputs: the caller owns what it gets (a
next replay does not overwrite it) and the caller's inputs are only read.

Inputs that the caller names *static* (`static_inputs`: a model's parameters, which
every step passes at the same address and an optimizer updates in place) are not
copied: the graph reads the caller's tensor itself, as inductor's CUDA graphs do, and an
output that is a view of one (a weight's transpose) is returned as it is. A run
that passes one at another address is refused with an error (capturing again on one
rank alone would leave its peers waiting). An input marked `hir.symmetric` is always
copied, into symmetric memory.

Control flow in a host program depends only on the rank, the shapes and the number of
streams, never on data, so one capture per signature is exact, dynamic extents (`?`)
included: a new extent is a new signature. Where a graph cannot be used the program
runs eagerly and the replayer says why, once (`GraphReplayFallback`): on the CPU (gloo
has no graphs) or when a capture failed on some rank.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hostir_dialect.text import HostirError
from hostir.runtime.communication_steps import copy_engine_transfers
from hostir.runtime.communicator import Communicator
from hostir.runtime.interpreter import RunContext
from hostir.runtime.program import Program
from hostir.runtime.streams import configured_num_streams, stream_pool

Signature = tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device], ...]


class GraphReplayFallback(UserWarning):
    """A program runs eagerly where graph replay was asked for; the message says why."""


def signature(inputs: Sequence[torch.Tensor]) -> Signature:
    """What a capture depends on: each input's shape, strides, dtype and device."""
    return tuple((tuple(x.shape), x.stride(), x.dtype, x.device) for x in inputs)


@dataclass
class CapturedRun:
    """One captured run: the graph and the static buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    watch: Callable[[torch.cuda.Event, torch.cuda.Event], None] | None = None
    """Watches a replay (`Watchdog.watch`) where the graph waits for peers on the GPU with no
    timeout of its own: the copy engines' signals (runtime/watchdog.py)."""

    copied: frozenset[int] = frozenset()
    """The inputs that each replay copies into `inputs`; the others are the caller's own."""
    views: frozenset[int] = frozenset()
    """The outputs that are views of inputs read in place (a weight's transpose), which a
    replay returns as they are: no replay writes them."""

    def replay(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        for i, (static, value) in enumerate(zip(self.inputs, inputs)):
            if i in self.copied:
                static.copy_(value)
            elif value.data_ptr() != static.data_ptr():
                raise HostirError(
                    f"static input #{i} (a parameter) is at another address than when its CUDA graph "
                    "was captured; a replay reads parameters in place. Update parameters in place, "
                    "or compile again (torch._dynamo.reset()), or pass cuda_graphs=False"
                )
        if self.watch is None:
            self.graph.replay()
        else:
            started, finished = torch.cuda.Event(), torch.cuda.Event()
            started.record()
            self.graph.replay()
            finished.record()
            self.watch(started, finished)
        return [output if i in self.views else output.clone() for i, output in enumerate(self.outputs)]


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


_REPLAYERS: weakref.WeakSet[GraphReplayer] = weakref.WeakSet()
"""The replayers alive in this process, for `release_captured_graphs`."""


def release_captured_graphs() -> None:
    """Frees every CUDA graph that a replayer of this process captured; a later run of a
    replayer captures again.

    Call it before `dist.destroy_process_group()`: NCCL cannot destroy a communicator that
    a live graph captured a communication of, and the call hangs
    (pytorch/pytorch#115388). hostir's launchers do so.
    """
    for replayer in list(_REPLAYERS):
        replayer.captured.clear()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


class GraphReplayer:
    """Runs a `Program` on one rank by replaying CUDA graphs, or eagerly where it cannot."""

    def __init__(
        self,
        program: Program,
        communicator: Communicator | None = None,
        num_streams: int | None = None,
        warmup_runs: int = 2,
        static_inputs: Sequence[int] = (),
    ):
        self.program = program
        self.static_inputs = sorted(set(static_inputs) - set(program.symmetric_inputs))
        """The inputs read where the caller keeps them (see the module's docstring)."""
        self.communicator = communicator or Communicator.default()
        self.num_streams = configured_num_streams() if num_streams is None else num_streams
        self.warmup_runs = warmup_runs
        self.captured: dict[Signature, CapturedRun] = {}
        self.eager_reason: str | None = None
        """Why this replayer runs the program eagerly; None while it replays."""
        _REPLAYERS.add(self)
        if self.communicator.device.type != "cuda":
            self._run_eagerly(
                f"CUDA graphs need CUDA devices, and this rank runs {self.communicator.where}"
            )

    @property
    def replays(self) -> bool:
        return self.eager_reason is None

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The program's outputs on `inputs` (this rank's), replayed when a graph can be used.

        All ranks call it together with inputs of matching signatures, as they call
        `Program.run`; a replay does not exchange anything between ranks, so it does
        not check inputs across ranks as `Program.run` does (a new signature does).
        """
        if self.replays:
            key = signature(inputs)
            captured = self.captured.get(key) or self._capture(key, inputs)
            if captured is not None:
                return captured.replay(inputs)
        return self.program.run(inputs, self.communicator, self.num_streams, views_of=self.static_inputs)

    def _run_eagerly(self, reason: str) -> None:
        self.eager_reason = reason
        self.captured.clear()
        warnings.warn(
            f"@{self.program.host.sym_name.data} runs eagerly: {reason}", GraphReplayFallback, stacklevel=3
        )

    def _capture(self, key: Signature, inputs: Sequence[torch.Tensor]) -> CapturedRun | None:
        """Warms up and captures a run on copies of `inputs`; None when a rank could not capture."""
        program, communicator, device = self.program, self.communicator, self.communicator.device
        copied = frozenset(range(len(inputs))) - frozenset(self.static_inputs)
        static_inputs = program.with_symmetric_inputs(
            [x.clone() if i in copied else x for i, x in enumerate(inputs)], communicator
        )
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup_runs):
                    program.run(static_inputs, communicator, self.num_streams)
            torch.cuda.current_stream(device).wait_stream(side)
            context = RunContext(
                communicator.rank,
                device,
                communicator,
                stream_pool(device, self.num_streams),
                input_extents=program.check(static_inputs, communicator),
            )
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            caller, failure = torch.cuda.current_stream(device), None
            try:
                # thread_local: the process group's watchdog thread queries CUDA events
                # while this thread captures, which the global mode would refuse.
                with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                    static_outputs = program.interpreter.run(static_inputs, context)
            except Exception as error:  # whatever the capture refused, the program still runs eagerly
                failure = f"{type(error).__name__}: {error}"
                # torch.cuda.graph leaves its stream current when ending a failed capture raises.
                torch.cuda.set_stream(caller)
                _end_generator_capture(device)
        failed_ranks = self._ranks_that_failed(failure is not None)
        if failed_ranks:
            self._run_eagerly(
                f"its CUDA graph capture failed on rank(s) {', '.join(map(str, failed_ranks))}"
                + (f" (here: {failure})" if failure else "")
            )
            return None
        watch = None
        if copy_engine_transfers(program.host):
            watch = functools.partial(
                communicator.copy_engine.watchdog.watch,
                what=f"a replay of @{program.host.sym_name.data} (backend cuda transfers)",
            )
        in_place = {static_inputs[i].untyped_storage().data_ptr() for i in self.static_inputs}
        views = frozenset(i for i, out in enumerate(static_outputs) if out.untyped_storage().data_ptr() in in_place)
        self.captured[key] = CapturedRun(graph, static_inputs, static_outputs, watch, copied, views)
        return self.captured[key]

    def _ranks_that_failed(self, failed: bool) -> list[int]:
        """The ranks whose capture failed, known to every rank (one all-gather in a world of several)."""
        communicator = self.communicator
        if communicator.world_size == 1:
            return [communicator.rank] if failed else []
        world = tuple(range(communicator.world_size))
        flags = torch.empty(communicator.world_size, dtype=torch.int32, device=communicator.device)
        local = torch.tensor([int(failed)], dtype=torch.int32, device=communicator.device)
        communicator.allgather(local, flags, world, 0).wait()
        return [rank for rank, flag in enumerate(flags.tolist()) if flag]
