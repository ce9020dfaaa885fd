"""`hir-run`: runs a fusion (or a lowered host program) on N ranks and checks it against plain torch.

    hir-run examples/ag_linear.mlir --nproc-per-node 4 --check
    hir-run lowered.mlir -p none --entry ag_linear --inputs x.pt w.pt b.pt --repeat 20
    hir-run examples/ag_linear.mlir --repeat 20 --trace ag_linear.json   # + ag_linear.png
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 tools/hir-run.py f.mlir --check

Without torchrun's environment it starts `--nproc-per-node` local ranks itself
(`runtime.launch.run_on_local_ranks`; one rank runs in this process); under torchrun
every process is one rank of torchrun's world, so the same command runs on several
machines. NCCL on GPUs, gloo on CPUs. `--timeout` bounds how long a communication waits
for its peers, never how long a run computes.

Every rank holds the same whole inputs (random from `--seed`, or loaded from `.pt`
files) and runs on its piece of them (`runtime.reference.shard`). The local outputs
go to one reporter (this process, or rank 0 under torchrun) that reassembles them
(`unshard`) and, with `--check`, compares each with the fusion evaluated by plain
torch on the whole inputs (`reference_outputs`), within the tolerance of its dtype
(`runtime.reference.compare`). On GPUs the runs replay a CUDA graph of the program
(`runtime.graphs`, off with --no-graph); --trace adds one traced eager run whose
timeline (`runtime.trace`) the reporter writes. docs/hir-run.md is the user's reference.
"""

from __future__ import annotations

import argparse
import functools
import re
import signal
import statistics
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from xdsl.dialects import func

from hostir_dialect.fusion import TensorType, element_type_name, shape_str
from hostir_dialect.text import HostirError
from hostir import config
from hostir.config import DEFAULT_TIMEOUT_S, timeout_seconds
from hostir.passes import DEFAULT_PIPELINE
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.graphs import GraphReplayer, GraphReplayFallback, release_captured_graphs
from hostir.runtime.launch import RankFailed, RankOutput, plain_message, run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import (
    DEFAULT_EXTENT,
    check_full_inputs,
    compare,
    full_shape,
    random_inputs,
    reference_outputs,
    shard,
    unshard,
)
from hostir.runtime.trace import Interval, trace_run, write_chrome_trace, write_timeline_png
from hostir.version import version_line

QUIET_S = 2.0
"""How long a run goes before the progress that a terminal gets by default says what it is
doing: a quick run stays quiet. `--progress` says everything from the start."""
NO_GRAPH = "--no-graph"
"""Why the runs were eager when the user asked for it."""


@dataclass(frozen=True)
class RunOptions:
    """What every rank needs to compile and run the program (sent to spawned ranks)."""

    source: str
    filename: str
    pipeline: str | None
    entry: str | None
    repeat: int
    num_streams: int | None
    keep_outputs: bool
    """Whether a rank sends its local outputs to the reporter (for --check, --save-outputs)."""
    graph: bool
    """Whether the runs replay a CUDA graph where they can (not --no-graph)."""
    trace: bool
    """Whether a rank traces one more run after the timed ones (--trace)."""
    progress: Progress
    """Where a rank says what it is doing."""


@dataclass
class RankResult:
    """What one rank reports: where and how it ran, the wall time of each run, its local outputs,
    and the timeline of its traced run."""

    rank: int
    where: str
    eager_reason: str | None
    """Why the runs were eager; None when they replayed a CUDA graph."""
    seconds: list[float]
    outputs: list[torch.Tensor]
    trace: list[Interval]


@dataclass
class Progress:
    """Says on stderr what the run is doing, one line per event: the launcher's steps, and
    the ranks' (compiling, warming up, run k of K, tracing), which rank 0 says for all of
    them, so that no two processes write at once. Enabled by --progress, or where stderr is
    a terminal, and then only once the run has gone on for `quiet_s`; "run k of K" at most
    once a second, but always its first and its last."""

    enabled: bool
    start: float
    """When hir-run started (time.time(), which the spawned ranks share)."""
    quiet_s: float = 0.0
    said: float = 0.0
    """When this process last said something."""

    def say(self, message: str, rank: int | None = None) -> None:
        """Says `message`: the launcher's (`rank` None), or rank `rank`'s, said by rank 0 for all."""
        now = time.time()
        if not self.enabled or rank not in (None, 0) or now - self.start < self.quiet_s:
            return
        self.said = now
        print(f"hir-run: {message}", file=sys.stderr, flush=True)

    def say_run(self, rank: int, index: int, count: int) -> None:
        """Says that the ranks start run `index` (from 0) of `count`."""
        if index in (0, count - 1) or time.time() - self.said >= 1.0:
            self.say(f"run {index + 1} of {count}", rank)


# --------------------------------------------------------------------------- #
# Command line                                                                 #
# --------------------------------------------------------------------------- #


def _dim(text: str) -> tuple[tuple[int, int], int]:
    match = re.fullmatch(r"(-?\d+):(-?\d+)=(-?\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not ARG:AXIS=EXTENT (e.g. 0:2=64: argument 0, axis 2, extent 64)"
        )
    argument, axis, extent = map(int, match.groups())
    for what, value in (("argument", argument), ("axis", axis), ("extent", extent)):
        if value < 0:
            raise argparse.ArgumentTypeError(f"'{text}': the {what} is {value}; it cannot be negative")
    if extent > torch.iinfo(torch.int64).max:
        raise argparse.ArgumentTypeError(f"'{text}': an extent holds in 64 bits; {extent} does not")
    return (argument, axis), extent


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got '{text}'")
    return int(text)


def _seconds(text: str) -> float:
    try:
        return timeout_seconds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hir-run",
        description="Lowers a fusion and runs it on N ranks (local, or torchrun's); "
        "optionally checks every output against plain torch on the unsharded tensors.",
    )
    parser.add_argument("file", nargs="?", default="-", help="a .mlir file; '-' or nothing: stdin")
    parser.add_argument(
        "-v", "--version", action="version", version=version_line("hir-run"), help="print hostir's version, and xDSL's and torch's, and exit"
    )
    parser.add_argument(
        "-p",
        "--pipeline",
        default=DEFAULT_PIPELINE,
        help=f"the pass pipeline that lowers it (default: {DEFAULT_PIPELINE}); 'none' if already lowered",
    )
    parser.add_argument("--entry", help="the function to run when the module has several")
    ranks = parser.add_mutually_exclusive_group()
    ranks.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=_positive,
        metavar="N",
        help="local ranks to start (default: as many as the program's devices); under torchrun, "
        "torchrun's own --nproc-per-node, which this must equal if given",
    )
    ranks.add_argument(
        "--nproc",
        type=_positive,
        metavar="N",
        help="the same as --nproc-per-node, for local runs only: under torchrun it could mean "
        "the world or one machine's ranks, and is refused",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument(
        "--dim",
        type=_dim,
        action="append",
        default=[],
        metavar="ARG:AXIS=EXTENT",
        help="extent of a dynamic axis of an input, e.g. --dim 0:0=64 (repeatable)",
    )
    parser.add_argument(
        "--default-extent",
        type=_positive,
        default=DEFAULT_EXTENT,
        help=f"extent of every other dynamic axis (default {DEFAULT_EXTENT}); a didx axis has the mesh size",
    )
    parser.add_argument(
        "--inputs",
        nargs="+",
        metavar="FILE.pt",
        help="whole (unsharded) input tensors saved with torch.save, one per argument, instead of random ones",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare every output with plain torch on the whole inputs; exit 1 beyond tolerance",
    )
    parser.add_argument("--repeat", type=_positive, default=1, help="runs per rank, timed (default 1)")
    parser.add_argument(
        "--num-streams",
        type=_positive,
        help="size of the stream pool (default: HOSTIR_NUM_STREAMS or 4)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        help=f"seconds a communication may wait for its peers, at least 1 (default HOSTIR_TIMEOUT_S, "
        f"else {DEFAULT_TIMEOUT_S:g}); a run may compute for as long as it takes",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="say on stderr what the run is doing, one line per event (rank 0 speaks for every rank); "
        "the default when stderr is a terminal, for a run longer than a couple of seconds",
    )
    parser.add_argument(
        "--log-dir",
        metavar="DIR",
        type=Path,
        help="as torchrun's: each local rank's stdout and stderr go to DIR/rank<k>/stdout.log and "
        "stderr.log instead of the console",
    )
    parser.add_argument(
        "--tee",
        action="store_true",
        help="as torchrun's: the local ranks' stdout and stderr go to the console (with --log-dir, "
        "there too), each line prefixed [rank k]",
    )
    parser.add_argument(
        "--save-outputs",
        metavar="DIR",
        type=Path,
        help="save the whole outputs as DIR/output<i>.pt",
    )
    parser.add_argument(
        "--no-graph",
        dest="graph",
        action="store_false",
        help="run the program eagerly every time instead of replaying a CUDA graph of it",
    )
    parser.add_argument(
        "--trace",
        metavar="FILE",
        type=_trace_file,
        help="after the timed runs, trace one more (eager) run: a Chrome/Perfetto trace JSON in "
        "FILE and a PNG timeline next to it (FILE with .png)",
    )
    return parser


def _trace_file(text: str) -> Path:
    path = Path(text)
    if path.suffix == ".png":
        raise argparse.ArgumentTypeError(
            f"'{text}' is where the JSON trace goes; the PNG goes next to it: give e.g. "
            f"{path.with_suffix('.json')}"
        )
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"'{path.parent}', where the trace would go, is not a directory")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    start = time.time()
    arguments = argument_parser().parse_args(argv)
    progress = Progress(arguments.progress or sys.stderr.isatty(), start, 0.0 if arguments.progress else QUIET_S)
    # --timeout is the timeout of this process and of the ranks it starts (hostir.config).
    timeout = {} if arguments.timeout is None else {"timeout_s": arguments.timeout}
    try:
        with config.patch(**timeout):
            if config.under_torchrun():
                return run_under_torchrun(arguments, progress)
            return run_locally(arguments, progress)
    except HostirError as error:
        print(_prefixed(str(error)), file=sys.stderr)
    except RankFailed as failure:
        print(failure, file=sys.stderr)
    except KeyboardInterrupt:
        print(_prefixed("interrupted; every rank stopped"), file=sys.stderr)
        return 128 + signal.SIGINT
    return 1


def _prefixed(message: str) -> str:
    """The message, with the rank in front under torchrun (where every rank prints its own)."""
    return f"rank {config.rank}: {message}" if config.under_torchrun() else message


# --------------------------------------------------------------------------- #
# Preparing and running                                                        #
# --------------------------------------------------------------------------- #


def run_options(arguments: argparse.Namespace, progress: Progress) -> RunOptions:
    if arguments.file == "-":
        source, filename = sys.stdin.read(), "<stdin>"
    else:
        try:
            source, filename = Path(arguments.file).read_text(), arguments.file
        except (OSError, UnicodeDecodeError) as error:
            raise HostirError(f"cannot read '{arguments.file}': {error.strerror or error}") from None
    return RunOptions(
        source=source,
        filename=filename,
        pipeline=None if arguments.pipeline == "none" else arguments.pipeline,
        entry=arguments.entry,
        repeat=arguments.repeat,
        num_streams=arguments.num_streams,
        keep_outputs=arguments.check or arguments.save_outputs is not None,
        graph=arguments.graph,
        trace=arguments.trace is not None,
        progress=progress,
    )


def compile_program(options: RunOptions) -> Program:
    return Program.compile(options.source, options.pipeline, options.entry, options.filename)


def whole_inputs(program: Program, arguments: argparse.Namespace) -> list[torch.Tensor]:
    """The unsharded inputs, loaded from --inputs or random; their extents checked against each
    other through the fusion, before any rank starts."""
    if arguments.inputs is None:
        sizes = dict(arguments.dim)
        try:
            inputs = random_inputs(program.input_types, sizes, arguments.seed, arguments.default_extent)
        except (RuntimeError, MemoryError) as error:
            shapes = [
                shape_str(full_shape(type, i, sizes, arguments.default_extent))
                for i, type in enumerate(program.input_types)
            ]
            raise HostirError(
                f"cannot make random inputs of shapes {', '.join(shapes)}: {plain_message(error)}"
            ) from None
    else:
        if arguments.dim:
            raise HostirError("--dim gives the extents of random inputs; the tensors of --inputs have theirs")
        inputs = [_load(path, index) for index, path in enumerate(arguments.inputs)]
        check_full_inputs(program.input_types, inputs, arguments.inputs)
    program.check_extents([value.shape for value in inputs])
    return inputs


def _load(path: str, index: int) -> torch.Tensor:
    what = f"cannot load input #{index} from '{path}'"
    try:
        with open(path, "rb") as file:
            head = file.read(4)
    except OSError as error:
        raise HostirError(f"{what}: {error.strerror or error}") from None
    if not head:
        raise HostirError(f"{what}: the file is empty")
    # torch.save writes a zip archive; torch before 1.6 wrote a pickle (protocol 2 opens with 0x80).
    if head != b"PK\x03\x04" and head[0] != 0x80:
        raise HostirError(f"{what}: it is not a file that torch.save wrote")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises whatever its unpickler or the file system does
        raise HostirError(f"{what}: {plain_message(error)}") from None


def run_rank(
    program: Program,
    inputs: Sequence[torch.Tensor],
    communicator: Communicator,
    options: RunOptions,
) -> RankResult:
    """Runs the program `options.repeat` times on this rank's pieces of `inputs`, timing each run;
    then traces one more run with `options.trace`."""
    device = communicator.device
    local = program.with_symmetric_inputs(
        [shard(value, type, communicator.rank).to(device) for value, type in zip(inputs, program.input_types)],
        communicator,
    )
    options.progress.say("warming up", communicator.rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphReplayFallback)  # the report says why, once
        replayer = GraphReplayer(program, communicator, options.num_streams) if options.graph else None
        run = (
            replayer.run
            if replayer is not None
            else functools.partial(program.run, communicator=communicator, num_streams=options.num_streams)
        )
        seconds = []
        for run_index in range(options.repeat):
            options.progress.say_run(communicator.rank, run_index, options.repeat)
            if dist.is_initialized():
                dist.barrier()
            _synchronize(device)
            start = time.perf_counter()
            outputs = run(local)
            _synchronize(device)
            seconds.append(time.perf_counter() - start)
    if options.trace:
        options.progress.say("tracing one more run", communicator.rank)
    trace = trace_run(program, local, communicator, options.num_streams)[1] if options.trace else []
    return RankResult(
        communicator.rank,
        communicator.where,
        NO_GRAPH if replayer is None else replayer.eager_reason,
        seconds,
        [output.cpu() for output in outputs] if options.keep_outputs else [],
        trace,
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def spawned_rank(options: RunOptions, inputs: list[torch.Tensor]) -> RankResult:
    """A local rank started by `run_on_local_ranks`: compiles the program and runs it."""
    with plain_errors():
        options.progress.say("compiling on every rank", config.rank)
        return run_rank(compile_program(options), inputs, Communicator.from_env(), options)


@contextmanager
def plain_errors() -> Iterator[None]:
    """Turns an unexpected exception into a `HostirError` that says what it was, without a traceback."""
    try:
        yield
    except HostirError:
        raise
    except Exception as error:
        raise HostirError(plain_message(error)) from None


def run_locally(arguments: argparse.Namespace, progress: Progress) -> int:
    config.check()  # a bad HOSTIR_TIMEOUT_S fails here, once, not on every rank
    options = run_options(arguments, progress)
    progress.say("compiling")
    program = compile_program(options)
    inputs = whole_inputs(program, arguments)
    nproc = arguments.nproc_per_node or arguments.nproc or program.largest_device + 1
    if nproc <= program.largest_device:
        raise HostirError(
            f"the program uses devices up to {program.largest_device}; "
            f"run it with --nproc-per-node {program.largest_device + 1} or more"
        )
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise HostirError(
            f"{nproc} local ranks need {nproc} GPUs (one per NCCL rank); this machine has "
            f"{torch.cuda.device_count()}"
        )
    if arguments.check:
        progress.say("computing the reference outputs")
    with plain_errors():
        # Before any rank starts, so that inputs the fusion cannot take fail once, here.
        expected = reference_outputs(_fusion(program), inputs) if arguments.check else None
    output = RankOutput(arguments.log_dir, arguments.tee)
    if nproc == 1 and output == RankOutput():
        with plain_errors():
            results = [run_rank(program, inputs, Communicator.single(), options)]
    else:
        progress.say(f"starting {nproc} local rank{'s' if nproc > 1 else ''}")
        results = run_on_local_ranks(spawned_rank, nproc, options, inputs, output=output)
    return report(program, results, expected, arguments)


def run_under_torchrun(arguments: argparse.Namespace, progress: Progress) -> int:
    """This process is one rank of torchrun's world; rank 0 reports.

    What the ranks do before the runs (reading the file, compiling, making the inputs) fails
    alike on every rank, mostly: they agree on their failures first, and rank 0 says them
    once for all, ranks that failed alike named together."""
    if arguments.nproc is not None:
        raise HostirError(
            "under torchrun --nproc could mean the world or one machine's ranks; torchrun's "
            "--nproc-per-node says how many ranks each machine runs"
        )
    if arguments.log_dir is not None or arguments.tee:
        raise HostirError("under torchrun, torchrun's own --log-dir and --tee say where each rank's output goes")
    with plain_errors():
        communicator = Communicator.from_env(arguments.timeout)
    try:
        with plain_errors():
            local_ranks = config.local_world_size or communicator.world_size
            if arguments.nproc_per_node not in (None, local_ranks):
                raise HostirError(
                    f"--nproc-per-node {arguments.nproc_per_node} contradicts torchrun's "
                    f"{local_ranks} rank(s) on this machine"
                )
            options = run_options(arguments, progress)
            progress.say("compiling on every rank", communicator.rank)
            program = compile_program(options)
            fusion = _fusion(program) if arguments.check else None
            inputs = whole_inputs(program, arguments)
        problem = None
    except HostirError as error:
        problem = str(error)
    problems: list[str | None] = [None] * communicator.world_size
    dist.all_gather_object(problems, problem)
    failed = {rank: problem for rank, problem in enumerate(problems) if problem is not None}
    if failed:
        if communicator.rank == 0:
            print(RankFailed(failed), file=sys.stderr)
        dist.destroy_process_group()  # every rank is here: leave the group as the runs would
        return 1
    with plain_errors():
        result = run_rank(program, inputs, communicator, options)
        results = [None] * communicator.world_size if communicator.rank == 0 else None
        dist.gather_object(result, results, dst=0)
        release_captured_graphs()
        dist.destroy_process_group()
        if communicator.rank != 0:
            return 0
        expected = None if fusion is None else reference_outputs(fusion, inputs)
        return report(program, results, expected, arguments)


def _fusion(program: Program) -> func.FuncOp:
    if program.fusion is None:
        raise HostirError(
            "--check compares with the fusion, and a module given with -p none has none; "
            "give the fusion and let hir-run lower it"
        )
    return program.fusion


# --------------------------------------------------------------------------- #
# Reporting                                                                    #
# --------------------------------------------------------------------------- #


def report(
    program: Program,
    results: Sequence[RankResult],
    expected: Sequence[torch.Tensor] | None,
    arguments: argparse.Namespace,
) -> int:
    """Prints the timings and the check, saves the outputs; the exit status (1: a check failed)."""
    streams = arguments.num_streams or config.num_streams
    eager_reason = results[0].eager_reason
    print(
        f"@{program.host.sym_name.data}: {len(results)} rank(s), {results[0].where}, {streams} stream(s), "
        + ("graph replay" if eager_reason is None else "eager")
    )
    if eager_reason not in (None, NO_GRAPH):
        print(f"eager because {eager_reason}")
    failed = False
    if expected is not None or arguments.save_outputs is not None:
        outputs = [
            unshard([results[device].outputs[index] for device in type.mesh.ids], type)
            for index, type in enumerate(program.output_types)
        ]
        if expected is not None:
            failed = not print_check(outputs, expected, program.output_types)
        if arguments.save_outputs is not None:
            save_outputs(outputs, arguments.save_outputs)
    for result in results:
        times_ms = [s * 1e3 for s in result.seconds]
        print(
            f"rank {result.rank}: {min(times_ms):.3f} ms min, "
            f"{statistics.median(times_ms):.3f} ms median of {len(times_ms)} run(s)"
        )
    if arguments.trace is not None:
        save_trace([i for result in results for i in result.trace], arguments.trace, program)
    return 1 if failed else 0


def save_trace(intervals: Sequence[Interval], path: Path, program: Program) -> None:
    """Writes the trace JSON and, where matplotlib is installed, the PNG timeline next to it."""
    title = f"@{program.host.sym_name.data}"
    write_chrome_trace(intervals, path, title)
    try:
        write_timeline_png(intervals, path.with_suffix(".png"), title)
    except ModuleNotFoundError as missing:
        print(
            f"trace in {path} (open it in https://ui.perfetto.dev); no PNG: {missing} (pip install matplotlib)"
        )
        return
    print(f"trace in {path} (open it in https://ui.perfetto.dev), timeline in {path.with_suffix('.png')}")


def print_check(
    outputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], types: Sequence[TensorType]
) -> bool:
    """Prints each output's error against its reference; whether all are within tolerance."""
    all_ok = True
    for index, (actual, reference, type) in enumerate(zip(outputs, expected, types)):
        comparison = compare(actual, reference)
        all_ok &= comparison.ok
        what = f"output #{index} {element_type_name(type.element_type)} {shape_str(tuple(reference.shape))}"
        if comparison.problem:
            print(f"{what}: FAILED: {comparison.problem}")
        else:
            verdict = "ok" if comparison.ok else "FAILED"
            print(
                f"{what}: max relative error {comparison.error:.3g} "
                f"(tolerance {comparison.tolerance:.3g}): {verdict}"
            )
    return all_ok


def save_outputs(outputs: Sequence[torch.Tensor], directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for index, output in enumerate(outputs):
            torch.save(output, directory / f"output{index}.pt")
    except OSError as error:
        raise HostirError(f"cannot save the outputs in '{directory}': {error.strerror or error}") from None
    print(f"saved {len(outputs)} output(s) in {directory}/output<i>.pt")


if __name__ == "__main__":
    sys.exit(main())
