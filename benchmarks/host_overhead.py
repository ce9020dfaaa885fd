"""Host time on the hot path: from the call of a module compiled with `backend="hostir"` to the
first op its host program runs, split into torch's share and hostir's.

    python benchmarks/host_overhead.py                    # 1 and 2 local ranks (CPU and gloo without GPUs)
    python benchmarks/host_overhead.py --nproc 2 --size 4096,1,8192 --reps 50    # GPUs: bf16, one per rank
    python benchmarks/host_overhead.py --profile 20       # and the functions of rank 0's hot path (cProfile)
    python benchmarks/host_overhead.py --layers 4         # a stack of 4 layers compiled whole (--per-layer: one by one)
    python benchmarks/host_overhead.py --skip-module-guards   # compiled without dynamo's guards on the modules

The layer is examples/tp_decoder_layer.py's, parallelized with torchtitan's plan over the
ranks and compiled with `torch.compile(layer, backend="hostir", options={"backend": "nccl"})`
(gloo on CPU ranks), as benchmarks/tp_layer.py's `hostir (nccl)` contender; with `--layers N`
a stack of N such layers (`nn.Sequential`), compiled whole as a user compiles a model, or
with `--per-layer` layer by layer as torchtitan does (every layer then calls the same
graphs, and the first graph call of a step is the first layer's forward, or the last
layer's backward); with `--skip-module-guards`, compiled with
`options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}` too, so
that dynamo checks no module's attributes at each call. After warm-up
steps (which compile), each timed step stamps `time.perf_counter_ns()` at three points:

  call     the step calls the compiled module (`model(x)`), or `out.backward(grad)`
  hostir   hostir's callable of the graph is entered (`HostirGraph.__call__`)
  first    the first op of the host program starts (the interpreter's first step), or the
           replay of its CUDA graph (`CUDAGraph.replay`) on GPUs

so that, per graph call, `torch` = hostir - call (dynamo's guards and aot_autograd's
runtime wrappers, or the autograd engine's and aot_autograd's for the backward) and
`hostir` = first - hostir (`HostirGraph.__call__`, `CompiledShapes.run`: the inputs'
views, their checks, `Program.run`'s preamble or `GraphReplayer.run`'s input copies).
The stamps are made by this script around hostir's objects (a subclass of `HostirGraph`
set on each graph, a wrapper of the first step) and around `torch.cuda.CUDAGraph.replay`.
Each figure is a rank's median over `--reps` steps, in microseconds; the slowest rank's is
reported.
`torch alone` is torch's share again, over as many steps in which hostir's graphs run
nothing and return at once what they returned before: torch's wrappers with warm caches
and no program's work before or after them, a floor of torch's share; `step alone` is the
whole of such a step, from the call to its return: all that torch's wrappers cost it.

The timed steps start after the GPU went idle (`torch`, `hostir`, `total`), where the
host's first calls are slow (a core that waited wakes, the driver's first calls after a
synchronisation cost more), and again right after an untimed round of the same steps,
issued while the GPU still runs it, as a training loop issues them (`... warm`): what the
code costs a host that is running.

Steps: `forward` (under `torch.no_grad()`: the inference graph), `train forward` and
`train backward` (forward then backward of the output with a fixed gradient: the
training graphs). Each rank runs the same steps with no barrier between them, as a
training loop does: on several ranks the hostir share includes waiting for peers where
the program exchanges anything with them before its first op.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from tp_layer import HOSTIR, SMOKE_SIZES, LayerSize, model_of, parallelized, wrap  # the layer, as its contender builds it

from hostir.frontend.backend import HostirGraph, compiled_graphs
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.graphs import release_captured_graphs
from hostir.runtime.launch import run_on_local_ranks

TORCHRUN = "RANK" in os.environ and "WORLD_SIZE" in os.environ
"""Started by torchrun: this process is one rank of its world."""
PROFILED = {
    "torch's wrappers": r"torch/(_dynamo|_functorch|autograd|distributed/tensor|nn/modules)/",
    "hostir's calls": r"(frontend/backend|runtime/program|runtime/graphs|runtime/interpreter/core)\.py",
}
"""What `--profile` lists: the functions of each side whose file matches the pattern."""
STEPS = ("forward", "train forward", "train backward")


@dataclass
class Stamps:
    """The times of one graph call: when the step called, when hostir was entered, when the first op ran."""

    call: int = 0
    hostir: list[int] = field(default_factory=list)
    first: list[int] = field(default_factory=list)

    def shares(self) -> tuple[float, float]:
        """(torch's, hostir's) share in microseconds; the first graph call of the step counts."""
        if not self.hostir or not self.first:
            raise RuntimeError("the step called no hostir graph, or its program ran no op")
        return (self.hostir[0] - self.call) / 1e3, (self.first[0] - self.hostir[0]) / 1e3


STAMPS = Stamps()


class StampedGraph(HostirGraph):
    """A `HostirGraph` that stamps the time it is called. While `hollow`, it runs nothing and
    returns what its last call while `keeping` returned: what is left of a step is torch's."""

    keeping = False
    hollow = False

    def __call__(self, *args):
        STAMPS.hostir.append(time.perf_counter_ns())
        if StampedGraph.hollow:
            STAMPS.first.append(STAMPS.hostir[-1])
            return self.kept
        outputs = super().__call__(*args)
        if StampedGraph.keeping:
            self.kept = outputs
        return outputs


def stamp_cuda_graph_replays() -> None:
    """Stamps the start of every CUDA graph's replay in this process, of captures made later
    too (hostir replays a graph once its inputs are in the graph's buffers)."""
    replay = torch.cuda.CUDAGraph.replay

    def stamped(graph: torch.cuda.CUDAGraph) -> None:
        STAMPS.first.append(time.perf_counter_ns())
        replay(graph)

    torch.cuda.CUDAGraph.replay = stamped


def stamped_step(step: Callable) -> Callable:
    """`step`, stamping its start."""

    def first_step(env, context):
        STAMPS.first.append(time.perf_counter_ns())
        step(env, context)

    first_step.op = step.op
    return first_step


def stamp_graphs() -> None:
    """Stamps every compiled graph of this process, once."""
    for graph in compiled_graphs():
        graph.__class__ = StampedGraph
        for compiled in graph.compiled.values():
            if compiled is None:
                raise RuntimeError(f"graph {graph.name} runs as torch eager ops: nothing of hostir to time")
            steps = compiled.program.interpreter.steps
            steps[0] = stamped_step(steps[0])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_rank(size: LayerSize, warmup: int, reps: int, dtype: str, profile: int) -> dict:
    """This rank's median shares of each step, in microseconds, and rank 0's profile if asked."""
    from torch.distributed.device_mesh import init_device_mesh

    device = Communicator.from_env().device
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    torch.manual_seed(0)
    mesh = init_device_mesh(device.type, (world,))
    with torch.device(device):
        layer = parallelized(model_of(size, dtype), mesh)
        x = torch.randn(size.batch, size.sequence // world, size.dim, dtype=dtype)
        grad = torch.randn(size.batch, size.sequence // world, size.dim, dtype=dtype)
    model = wrap(HOSTIR, layer, mesh, size.whole, size.module_guards)

    def forward() -> None:
        with torch.no_grad():
            STAMPS.call = time.perf_counter_ns()
            model(x)

    def train_forward() -> torch.Tensor:
        for parameter in layer.parameters():
            parameter.grad = None
        STAMPS.call = time.perf_counter_ns()
        return model(x.detach().requires_grad_())

    def train_backward(out: torch.Tensor) -> None:
        STAMPS.call = time.perf_counter_ns()
        out.backward(grad)

    for _ in range(max(warmup, 2)):  # the first compiles, the second captures on GPUs
        forward()
        train_backward(train_forward())
    synchronize(device)
    stamp_graphs()
    stamp_cuda_graph_replays()

    def medians(warm: bool = False) -> dict[str, tuple[float, float, float]]:
        """Each step's median shares over `reps` steps, and its median time from the call to its
        return: each step of a triple after the GPU went idle, or (`warm`) right after an untimed
        triple, as a training loop issues its steps while the GPU runs the ones before."""
        shares: dict[str, list[tuple[float, float, float]]] = {step: [] for step in STEPS}

        def timed(step: str, run: Callable[[], object]) -> object:
            STAMPS.hostir.clear()
            STAMPS.first.clear()
            result = run()
            returned = time.perf_counter_ns()
            shares[step].append((*STAMPS.shares(), (returned - STAMPS.call) / 1e3))
            return result

        for _ in range(reps):
            if warm:
                forward()
                train_backward(train_forward())
            timed("forward", forward)
            out = timed("train forward", train_forward)
            timed("train backward", lambda: train_backward(out))
            synchronize(device)
        return {step: tuple(statistics.median(column) for column in zip(*values)) for step, values in shares.items()}

    measured, warm = medians(), medians(warm=True)
    # Torch alone: hostir's graphs return at once what they returned in the step before.
    StampedGraph.keeping = True
    forward()
    train_backward(train_forward())
    synchronize(device)
    StampedGraph.keeping, StampedGraph.hollow = False, True
    alone = medians()
    StampedGraph.hollow = False
    for graph in compiled_graphs():
        graph.__dict__.pop("kept", None)
    profiled = ""
    if profile:
        profiler = cProfile.Profile()
        for _ in range(profile):
            profiler.enable()
            forward()
            out = train_forward()
            train_backward(out)
            profiler.disable()
            synchronize(device)
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).sort_stats("cumulative")
        for what, files in PROFILED.items():
            text.write(f"{what}, {profile} steps of each kind (cumulative):\n")
            stats.print_stats(files, 15)
        profiled = text.getvalue() if rank == 0 else ""
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "medians": measured,
        "warm": warm,
        "torch_alone": {step: (shares[0], shares[2]) for step, shares in alone.items()},
        "profile": profiled,
    }


def measure(
    nproc: int, size: LayerSize, warmup: int, reps: int, dtype: str | None = None, profile: int = 0
) -> list[dict]:
    """`run_rank` on `nproc` local ranks, or on torchrun's ranks (`nproc` is then theirs); every
    rank's result, in rank order."""
    if not TORCHRUN:
        return run_on_local_ranks(run_rank, nproc, size, warmup, reps, dtype, profile)
    result = run_rank(size, warmup, reps, dtype, profile)
    results = [None] * dist.get_world_size()
    dist.all_gather_object(results, result)
    release_captured_graphs()
    dist.destroy_process_group()
    return results


def report(nproc: int, size: LayerSize, per_rank: list[dict]) -> str:
    """The table of one world: per step, the slowest rank's median of each share."""
    first = per_rank[0]
    lines = [
        f"{nproc} rank(s), {first['device'].split(':')[0]}, {first['dtype']}, {size.label} (us, median per step, slowest rank)",
        f"{'step':<16}{'torch':>10}{'hostir':>10}{'total':>10}{'torch alone':>13}{'step alone':>12}"
        f"{'torch warm':>12}{'hostir warm':>13}{'total warm':>12}",
    ]
    for step in STEPS:
        idle, warm = ([max(f(rank[kind][step]) for rank in per_rank) for f in SHARES] for kind in ("medians", "warm"))
        alone, step_alone = (max(rank["torch_alone"][step][k] for rank in per_rank) for k in (0, 1))
        lines.append(
            f"{step:<16}{idle[0]:>10.1f}{idle[1]:>10.1f}{idle[2]:>10.1f}{alone:>13.1f}{step_alone:>12.1f}"
            f"{warm[0]:>12.1f}{warm[1]:>13.1f}{warm[2]:>12.1f}"
        )
    return "\n".join(lines)


SHARES = (lambda m: m[0], lambda m: m[1], lambda m: m[0] + m[1])
"""torch's share, hostir's, and the two, of a step's medians; each the slowest rank's."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, action="append", help="local ranks (repeatable; default: 1 and 2)")
    parser.add_argument("--size", default=None, help="DIM,BATCH,SEQUENCE (default 64,2,16, head dim 16)")
    parser.add_argument("--head-dim", type=int, default=None, help="default 16 at the default size, else 128")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--dtype", default=None, help="default bfloat16 on GPUs, float32 on CPU ranks")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also profile STEPS steps of each kind with cProfile, and list rank 0's costliest "
                        "functions of torch's wrappers and of hostir's calls")
    parser.add_argument("--layers", type=int, default=1, help="a stack of N layers, compiled whole (default: one layer)")
    parser.add_argument("--per-layer", action="store_true", help="with --layers: compile the layers one by one")
    parser.add_argument("--skip-module-guards", action="store_true",
                        help="compile with torch.compiler.skip_guard_on_all_nn_modules_unsafe as the guard filter")
    args = parser.parse_args(argv)
    if args.per_layer and args.layers < 2:
        parser.error("--per-layer needs --layers 2 or more")
    if args.size is None:
        size = replace(SMOKE_SIZES[0], head_dim=args.head_dim or SMOKE_SIZES[0].head_dim)
    else:
        dim, batch, sequence = (int(part) for part in args.size.split(","))
        size = LayerSize(dim, batch, sequence, args.head_dim or 128)
    # A stack is compiled whole unless --per-layer says otherwise (tp_layer.py's default is the reverse).
    size = replace(size, layers=args.layers, whole=not args.per_layer, module_guards=not args.skip_module_guards)
    worlds = [int(os.environ["WORLD_SIZE"])] if TORCHRUN else args.nproc or [1, 2]
    for nproc in worlds:
        per_rank = measure(nproc, size, args.warmup, args.reps, args.dtype, args.profile)
        if TORCHRUN and int(os.environ["RANK"]) != 0:
            continue
        print(report(nproc, size, per_rank))
        if args.profile:
            print(per_rank[0]["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
