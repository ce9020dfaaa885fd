"""Runs `hir-run --check` on every example and every reference fusion, as a user would, on this machine's GPUs.

    python3 test/gpu/hir_run_all.py [--max-ranks N] [--jobs J] [--only NAME,...]

* Every `examples/*.mlir` runs on as many ranks as its program has devices (hir-run's
  default); an example that needs more than `--max-ranks` ranks is reported skipped.
* Every fusion of `examples/reference_fusions.py` is written out on a mesh of
  `--max-ranks` devices (the single-device ones on one), in f32 and bf16, and runs on
  `--max-ranks` ranks with dynamic extents of 6 (not a power of two), 2 streams and 2
  timed runs (the first captures a CUDA graph, the second replays it: its outputs are checked).

`--jobs` runs that many `hir-run`s at once (default: a quarter of the CPU cores, at most
8): the runs share the GPUs, each with its own ranks and NCCL communicators, and most of
a run's time is its processes starting, so the runs finish within minutes together.

`--only` runs the examples and reference fusions of those names only (an example's file
name without `.mlir`, a fusion's name in `REFERENCE_FUSIONS`), to rerun what failed or
what a time limit cut off. Each run is `tools/hir-run.py` in a subprocess, so nothing here needs
hostir installed; its output is printed whole once it ends. Exit status 1 if any run fails.
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # examples/; hostir as installed, before the checkout's hostir/ folder

import torch  # noqa: E402

from examples.reference_fusions import REFERENCE_FUSIONS  # noqa: E402
from hostir_dialect.text import HostirError, print_module  # noqa: E402
from hostir.runtime.program import Program  # noqa: E402

HIR_RUN = [sys.executable, str(ROOT / "tools" / "hir-run.py")]
REFERENCE_OPTIONS = ["--check", "--default-extent", "6", "--num-streams", "2", "--repeat", "2"]
PRINTING = threading.Lock()


def devices_of(path: Path) -> int:
    """How many ranks the program in `path` needs; hir-run reports a program it cannot compile."""
    try:
        return Program.compile(path.read_text(), filename=str(path)).largest_device + 1
    except HostirError:
        return 1


def reference_programs(directory: Path, num_devices: int, names: set[str] | None) -> list[Path]:
    """Every reference fusion (of `names`, if given) in f32 and bf16 as a file, the
    multi-device ones on `num_devices`."""
    paths = []
    for name, build in REFERENCE_FUSIONS.items():
        if names is not None and name not in names:
            continue
        for dtype in ("f32", "bf16"):
            arguments = {"dtype": dtype}
            if "num_devices" in inspect.signature(build).parameters:
                arguments["num_devices"] = num_devices
            path = directory / f"{name}-{dtype}.mlir"
            path.write_text(print_module(build(**arguments)))
            paths.append(path)
    return paths


def run(path: Path, options: list[str]) -> bool:
    """hir-run on `path`; prints the command and its output together once it ends."""
    command = [*HIR_RUN, str(path), *options]
    result = subprocess.run(command, text=True, capture_output=True)
    with PRINTING:
        print("$ hir-run", " ".join(command[2:]))
        print(result.stdout + result.stderr, end="", flush=True)
    return result.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--max-ranks", type=int, default=torch.cuda.device_count() or 2,
        help="ranks at most (default: the GPUs of this machine)",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 4) // 4)),
        help="hir-runs at once (default: a quarter of the CPU cores, at most 8)",
    )  # fmt: skip
    parser.add_argument("--only", help="comma-separated names of examples and reference fusions to run")
    arguments = parser.parse_args()
    max_ranks = arguments.max_ranks
    examples = sorted((ROOT / "examples").glob("*.mlir"))
    names = set(arguments.only.split(",")) if arguments.only else None
    if names is not None and (unknown := names - {e.stem for e in examples} - REFERENCE_FUSIONS.keys()):
        parser.error(f"--only: no example or reference fusion named {', '.join(sorted(unknown))}")
    runs, skipped = [], []
    for example in examples:
        if names is not None and example.stem not in names:
            continue
        devices = devices_of(example)
        if devices > max_ranks:
            skipped.append(f"{example.name} (needs {devices} ranks)")
        else:
            runs.append((example, ["--check"]))
    with tempfile.TemporaryDirectory() as directory:
        for path in reference_programs(Path(directory), max_ranks, names):
            runs.append((path, [*REFERENCE_OPTIONS, "--nproc-per-node", str(devices_of(path))]))
        with ThreadPoolExecutor(arguments.jobs) as pool:
            passed = list(pool.map(lambda job: run(*job), runs))
    failed = [path.name for (path, _), ok in zip(runs, passed) if not ok]
    for name in skipped:
        print(f"skipped: {name}")
    for name in failed:
        print(f"FAILED: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
