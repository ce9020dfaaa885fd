"""The interpreter's own cost per op: a host program of 1000 small ops, eager and replayed.

    python benchmarks/interpreter_overhead.py [--ops 1000] [--size 16] [--repeat 50] [--device cuda]
    python benchmarks/interpreter_overhead.py --quick      # a smoke run of 100 ops, on the CPU in CI

The program is a chain on tiny f32 vectors written as a host program (no lowering):
two `hir.allocate`, one `hir.copy` and then `hir.pointwise "add"` ops that ping-pong
between the two buffers. Its peer is the same torch calls written by hand in a
Python loop (`torch.empty`, `copy_`, `torch.add` + `copy_`), so

* eager: *interpreter cost per op* = (program time - hand-written loop time) / ops,
  where a program's time is `Program.run` (its input checks included); the absolute
  time per op is shown too;
* replay (CUDA only): `GraphReplayer.run` against a hand-written CUDA graph of the
  same torch calls (`torch.cuda.graph` around the hand-written loop), both copying the
  input into their static input and cloning their static output, so the ratio is the
  replayer's own cost.

Eager times are wall times (the device synchronised before and after each run: tiny
kernels make eager runs host-bound). Replays are also timed on the GPU with CUDA
events behind a queued sleep that hides the host's launch, as benchmarks/pointwise_segment.py
does. Every figure is the median of `--repeat` runs after warm-up. Targets:
at most 10 us of interpreter cost per op eager, replay within 2% of the hand-written graph.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from gpu_timing import gpu_median_ms
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.graphs import GraphReplayer
from hostir.runtime.program import Program

HOLD_MS = 10.0
"""GPU time queued before each GPU-timed run: longer than a replay takes to launch."""

TARGET_US_PER_OP = 10.0
TARGET_REPLAY_RATIO = 1.02


def chain_program(ops: int, size: int) -> str:
    """A host program of `ops` ops (>= 3): 2 allocations, a copy, then ops - 3 adds."""
    vector = f"!fusion.tensor<[{size}], f32>"
    lines = [
        f"func.func @chain(%x: {vector}) -> {vector} {{",
        f"  %b0 = hir.allocate() : {vector}",
        f"  %b1 = hir.allocate() : {vector}",
        f"  hir.copy ins(%x : {vector}) outs(%b0 : {vector})",
    ]
    for i in range(ops - 3):
        source, target = f"%b{i % 2}", f"%b{(i + 1) % 2}"
        lines.append(
            f'  hir.pointwise "add" ins(%x, {source} : {vector}, {vector}) outs({target} : {vector})'
        )
    lines += [f"  func.return %b{(ops - 3) % 2} : {vector}", "}"]
    return "\n".join(lines)


def hand_written(x: torch.Tensor, adds: int) -> torch.Tensor:
    """The torch calls the interpreter makes for `chain_program`, in a plain Python loop."""
    buffers = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for _ in range(2)]
    buffers[0].copy_(x)
    for i in range(adds):
        buffers[(i + 1) % 2].copy_(torch.add(x, buffers[i % 2]))
    return buffers[adds % 2]


def hand_written_graph(x: torch.Tensor, adds: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The hand-written loop captured in a CUDA graph; called like `GraphReplayer.run`."""
    static_input = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            hand_written(static_input, adds)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = hand_written(static_input, adds)

    def replay(value: torch.Tensor) -> torch.Tensor:
        static_input.copy_(value)
        graph.replay()
        return static_output.clone()

    return replay


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(run: Callable[[], object], repeat: int, device: torch.device) -> float:
    """Median wall time of `run`, the device idle before and synchronised after, after 3 warm-ups."""
    for _ in range(3):
        run()
    times = []
    for _ in range(repeat):
        _synchronize(device)
        start = time.perf_counter()
        run()
        _synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _same(what: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    if not torch.equal(actual, expected):
        sys.exit(f"{what} differs from the hand-written loop: the comparison would be meaningless")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000, help="ops in the program (default 1000)")
    parser.add_argument("--size", type=int, default=16, help="elements per vector (default 16)")
    parser.add_argument("--repeat", type=int, default=50, help="timed runs per variant (default 50)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--quick", action="store_true", help="100 ops, 5 runs: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.ops, args.repeat = 100, 5
    if args.ops < 3:
        sys.exit("--ops must be at least 3 (two allocations and a copy)")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)

    ops, adds, repeat = args.ops, args.ops - 3, args.repeat
    program = Program.compile(chain_program(ops, args.size), pipeline=None, filename="<chain>")
    communicator = Communicator.single(device)
    x = torch.randn(args.size, device=device)
    _same("the program's output", program.run([x], communicator)[0], hand_written(x, adds))

    eager_program = wall_ms(lambda: program.run([x], communicator), repeat, device)
    eager_loop = wall_ms(lambda: hand_written(x, adds), repeat, device)
    cost_us = (eager_program - eager_loop) * 1e3 / ops
    print(f"interpreter overhead: {ops} ops on f32[{args.size}], {device}, median of {repeat} runs")
    print(f"{'variant':<36}{'ms per run':>12}{'us per op':>12}")
    print(f"{'hand-written torch loop, eager':<36}{eager_loop:>12.3f}{eager_loop * 1e3 / ops:>12.2f}")
    print(f"{'hostir Program.run, eager':<36}{eager_program:>12.3f}{eager_program * 1e3 / ops:>12.2f}")
    verdict = "ok" if cost_us <= TARGET_US_PER_OP else "MISSED"
    print(f"interpreter cost per op: {cost_us:.2f} us (target <= {TARGET_US_PER_OP:g} us: {verdict})")
    if device.type != "cuda":
        print("graph replay: skipped (CUDA graphs need a CUDA device)")
        return

    replayer = GraphReplayer(program, communicator)
    graph = hand_written_graph(x, adds)
    _same("the replayed program's output", replayer.run([x])[0], graph(x))
    if not replayer.replays:
        sys.exit(f"graph replay did not capture: {replayer.eager_reason}")
    rows = {
        "hand-written CUDA graph": (
            wall_ms(lambda: graph(x), repeat, device),
            gpu_median_ms(lambda: graph(x), repeat, HOLD_MS),
        ),
        "hostir GraphReplayer.run": (
            wall_ms(lambda: replayer.run([x]), repeat, device),
            gpu_median_ms(lambda: replayer.run([x]), repeat, HOLD_MS),
        ),
    }
    print(f"{'variant':<36}{'wall ms':>12}{'GPU ms':>12}")
    for name, (wall, gpu) in rows.items():
        print(f"{name:<36}{wall:>12.3f}{gpu:>12.3f}")
    (hand_wall, hand_gpu), (replay_wall, replay_gpu) = rows.values()
    for what, ratio in (("wall", replay_wall / hand_wall), ("GPU", replay_gpu / hand_gpu)):
        verdict = "ok" if ratio <= TARGET_REPLAY_RATIO else "MISSED"
        print(
            f"replay / hand-written graph, {what} time: {ratio:.3f} (target <= {TARGET_REPLAY_RATIO:g}: {verdict})"
        )
    print(f"eager / replay, wall time: {eager_program / replay_wall:.1f}x")


if __name__ == "__main__":
    main()
