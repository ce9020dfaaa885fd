"""What the overlap benchmark writes: a line per measurement as it comes, then per problem a
table of sizes by contenders (ms and ratio to the limit), a JSON of every number with the
machine and versions, and a PNG of time against size per contender.

Only rank 0 reports. Everything is rewritten after every measurement (the JSON) or every
size (the table and the PNG), so a run cut short leaves what it measured.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from hostir.passes.analysis.cost_model import MeasuredStages, OverlapProblem
from hostir.runtime.distributed.communicator import Communicator

LIMIT = "limit"
"""The contender that is no run: the larger of the GEMM alone and the collective alone."""

TITLES = {
    "allgather_matmul": "AG+GEMM: Y = allgather(X) @ W",
    "matmul_reduce_scatter": "GEMM+RS: Y = reduce_scatter(X @ W)",
    "matmul_allreduce": "GEMM+AR: Y = allreduce(X @ W)",
}


@dataclass
class Result:
    """One contender on one problem at one size, as every rank agreed on it."""

    problem: str
    m: int
    k: int
    n: int
    contender: str
    status: str = "ok"
    """ok, or why there is no time: `unavailable: ...`, `failed: ...`, `skipped: ...`."""
    ms: float | None = None
    """The median over the timed runs of the slowest rank's time of each run."""
    times_ms: list[float] = field(default_factory=list)
    """Each timed run's time, the slowest rank's."""
    host_ms: float | None = None
    """How long the host took to issue one run (the slowest rank's): the launch cost the GPU hides."""
    chunks: int | None = None
    streams: int | None = None
    predicted_ms: float | None = None
    """The cost model's time for this pipeline shape (passes/analysis/cost_model.py)."""
    check_error: float | None = None
    """The largest error of the output against plain torch, relative to the largest |Y| (runtime.reference.compare)."""
    check_tolerance: float | None = None

    @property
    def size(self) -> tuple[int, int, int]:
        return self.m, self.k, self.n

    @property
    def check_ok(self) -> bool | None:
        return None if self.check_error is None else self.check_error <= self.check_tolerance

    @property
    def label(self) -> str:
        """The contender with its pipeline shape when it has one."""
        if self.chunks is None or self.contender == LIMIT:
            return self.contender
        return f"{self.contender} S={self.chunks}"


def machine(communicator: Communicator) -> dict[str, object]:
    """The machine, versions and settings a run measured."""
    info: dict[str, object] = {
        "host": socket.gethostname(),
        "ranks": communicator.world_size,
        "backend": communicator.backend,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "hostir_commit": _commit(),
        "environment": {
            name: os.environ[name]
            for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "HOSTIR_NUM_STREAMS")
            if name in os.environ
        },
    }
    if communicator.device.type == "cuda":
        nccl = torch.cuda.nccl.version()
        info.update(
            gpu=torch.cuda.get_device_name(communicator.device),
            gpus_on_host=torch.cuda.device_count(),
            cuda=torch.version.cuda,
            nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        )
    return info


def _commit() -> str | None:
    try:
        completed = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None


COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
           "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINE_STYLES = ("-", ":", "-.")


def series_styles(labels: list[str]) -> dict[str, dict[str, str]]:
    """A matplotlib style per contender: the limit black and dashed; the others, in order, a
    colour, a marker and a line style, so that no two series look alike. 10 colours and 7
    markers (coprime) give 70 colour-marker pairs before one repeats; the line style
    changes every 10 series besides."""
    styles = {}
    others = [label for label in labels if label != LIMIT]
    for index, label in enumerate(others):
        styles[label] = dict(
            color=COLOURS[index % len(COLOURS)],
            marker=MARKERS[index % len(MARKERS)],
            linestyle=LINE_STYLES[index // len(COLOURS) % len(LINE_STYLES)],
        )
    if LIMIT in labels:
        styles[LIMIT] = dict(color="black", linestyle="--", marker="")
    return {label: styles[label] for label in labels}


class Report:
    """Rank 0's record of a run: prints each result as it comes and keeps the files in `out` current."""

    def __init__(self, out: Path, machine: dict[str, object], config: dict[str, object]):
        self.out = out
        self.machine = machine
        self.config = config
        self.results: list[Result] = []
        self.stages: list[dict[str, object]] = []
        """The stages measured for the cost model, per problem form and chunk count."""
        out.mkdir(parents=True, exist_ok=True)
        print(f"# {self.describe_machine()}", flush=True)

    def describe_machine(self) -> str:
        device = self.machine.get("gpu", "CPU")
        versions = ", ".join(
            f"{name} {self.machine[name]}" for name in ("torch", "cuda", "nccl") if name in self.machine
        )
        return f"{self.machine['ranks']} x {device} ({self.machine['backend']}; {versions})"

    def add(self, result: Result) -> None:
        self.results.append(result)
        print(self.line(result), flush=True)
        self.write_json()

    def add_stages(self, problem: OverlapProblem, measured: MeasuredStages) -> None:
        """The stages `measure_stages` measured for `problem`'s form, printed and kept in the JSON."""
        form = (
            " (reduction in the GEMM)"
            if problem.reduction_in_matmul
            else " (ring of destinations)" if problem.destination_ring else ""
        )
        size = "x".join(map(str, (problem.m, problem.k, problem.n)))
        for chunks, stages in sorted(measured.by_chunks.items()):
            self.stages.append(
                {**asdict(problem), "chunks": chunks, **{f"{name.removesuffix('_s')}_ms": t * 1e3 for name, t in asdict(stages).items()}}
            )
            print(
                f"{problem.kind.value:22} {size:18} {'stages' + form + f' S={chunks}':28} "
                + "  ".join(f"{name.removesuffix('_s')} {t * 1e3:.3f} ms" for name, t in asdict(stages).items()),
                flush=True,
            )
        self.write_json()

    def limit_ms(self, problem: str, size: tuple[int, int, int]) -> float | None:
        return next(
            (r.ms for r in self.results if r.problem == problem and r.size == size and r.contender == LIMIT),
            None,
        )

    def ratio(self, result: Result) -> float | None:
        limit = self.limit_ms(result.problem, result.size)
        return None if result.ms is None or not limit else result.ms / limit

    def line(self, result: Result) -> str:
        size = "x".join(map(str, result.size))
        if result.ms is None:
            return f"{result.problem:22} {size:18} {result.label:28} {result.status}"
        ratio = self.ratio(result)
        text = f"{result.problem:22} {size:18} {result.label:28} {result.ms:9.3f} ms"
        text += f" {ratio:6.2f}x limit" if ratio is not None else " " * 13
        if result.streams is not None:
            text += f"  {result.streams} streams"
        if result.predicted_ms is not None:
            text += f"  model {result.predicted_ms:.3f} ms"
        if result.check_error is not None:
            text += f"  check {'ok' if result.check_ok else 'WRONG'} ({result.check_error:.1e})"
        return text

    # -- files ------------------------------------------------------------------ #

    def write_json(self) -> None:
        document = {
            "machine": self.machine,
            "command": " ".join(sys.argv),
            "config": self.config,
            "results": [
                {**asdict(r), "label": r.label, "ratio_to_limit": self.ratio(r), "check_ok": r.check_ok}
                for r in self.results
            ],
            "stages": self.stages,
        }
        (self.out / "overlap.json").write_text(json.dumps(document, indent=1) + "\n")

    def tables(self) -> str:
        """Per problem, a Markdown table of sizes by contenders: `ms (ratio to the limit)`."""
        sections = [f"Machine: {self.describe_machine()}", f"Command: `{' '.join(sys.argv)}`"]
        notes: dict[str, str] = {}
        for problem in dict.fromkeys(r.problem for r in self.results):
            results = [r for r in self.results if r.problem == problem]
            labels = list(dict.fromkeys(r.label for r in results))
            sizes = list(dict.fromkeys(r.size for r in results))
            rows = [
                f"### {TITLES.get(problem, problem)} (median ms, ratio to the limit)",
                "",
                "| M, K, N | " + " | ".join(labels) + " |",
                "|---" * (len(labels) + 1) + "|",
            ]
            for size in sizes:
                cells = []
                for label in labels:
                    result = next((r for r in results if r.size == size and r.label == label), None)
                    cells.append(self._cell(result, notes))
                rows.append(f"| {', '.join(map(str, size))} | " + " | ".join(cells) + " |")
            sections.append("\n".join(rows))
        if notes:
            sections.append("\n".join(f"[{mark}] {status}" for status, mark in notes.items()))
        modelled = [r for r in self.results if r.ms is not None and r.predicted_ms]
        if modelled:
            rows = [
                "### The cost model: predicted against measured (ms)",
                "",
                "| problem | M, K, N | pipeline | predicted | measured | measured / predicted |",
                "|---|---|---|---|---|---|",
            ]
            rows += [
                f"| {r.problem} | {', '.join(map(str, r.size))} | {r.label} | {r.predicted_ms:.3f} | {r.ms:.3f} "
                f"| {r.ms / r.predicted_ms:.2f} |"
                for r in modelled
            ]
            sections.append("\n".join(rows))
        return "\n\n".join(sections) + "\n"

    def _cell(self, result: Result | None, notes: dict[str, str]) -> str:
        if result is None:
            return ""
        if result.ms is None:
            mark = notes.setdefault(result.status, str(len(notes) + 1))
            return f"{result.status.split(':')[0]} [{mark}]"
        ratio = self.ratio(result)
        text = f"{result.ms:.3f}" + (
            f" ({ratio:.2f}x)" if ratio is not None and result.contender != LIMIT else ""
        )
        return text + (" WRONG" if result.check_ok is False else "")

    def write_tables(self) -> str:
        text = self.tables()
        (self.out / "overlap.md").write_text(text)
        return text

    def write_plot(self) -> str | None:
        """Writes `plot()` as overlap.png; None, with the reason printed, without matplotlib."""
        try:
            figure = self.plot()
        except ImportError:
            print("# no PNG: matplotlib is not installed (pip install matplotlib)", flush=True)
            return None
        path = self.out / "overlap.png"
        figure.savefig(path, dpi=120)
        return str(path)

    def plot(self):
        """Time against size, one panel per problem (a matplotlib Figure).

        Each contender keeps one style in every panel, no two alike (`series_styles`), and
        one legend for all panels sits below them, clear of the axes and their labels.
        """
        from matplotlib.figure import Figure

        problems = list(dict.fromkeys(r.problem for r in self.results))
        styles = series_styles(list(dict.fromkeys(r.label for r in self.results)))
        panels = max(1, len(problems))
        figure = Figure(figsize=(6.5 * panels, 7.5), layout="constrained")
        axes = figure.subplots(1, panels, squeeze=False)
        lines = {}
        for axis, problem in zip(axes[0], problems):
            results = [r for r in self.results if r.problem == problem]
            sizes = list(dict.fromkeys(r.size for r in results))
            for label in dict.fromkeys(r.label for r in results):
                points = [
                    (sizes.index(r.size), r.ms) for r in results if r.label == label and r.ms is not None
                ]
                if points:
                    (lines[label],) = axis.plot(*zip(*points), label=label, **styles[label])
            axis.set_xticks(range(len(sizes)), ["\n".join(map(str, s)) for s in sizes], fontsize=8)
            axis.set_xlabel("M, K, N")
            axis.set_ylabel("ms (median, slowest rank)")
            axis.set_title(TITLES.get(problem, problem), fontsize=10)
            axis.set_ylim(bottom=0)
        labels = [label for label in styles if label in lines]
        figure.legend(
            [lines[label] for label in labels], labels, loc="outside lower center",
            ncols=min(4, max(1, len(labels))), fontsize=7, frameon=False,
        )  # fmt: skip
        figure.suptitle(self.describe_machine(), fontsize=9)
        return figure
