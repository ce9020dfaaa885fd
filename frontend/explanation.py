"""What hostir did with a graph that torch.compile handed it, in the user's terms.

A `GraphExplanation` is made while the backend compiles a graph for a set of input shapes:
whether hostir imported it or runs it as torch eager ops, and then why (the FX node, its op,
and the line and module of the user's code it was traced from); what `auto-stream-parallel`
pipelined and what it declined, with the reasons; how many chunks each GEMM + reduce-scatter
or all-reduce was cut into, by whom, and what the cost model predicts; who moves the
collectives' bytes and why. The `hostir.explain` logger says it once per graph, on the first
rank of the graph's ranks; `hostir.explain(model, *inputs)` returns the explanations of a
run (`Explanation`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch
import torch.fx

from hostir_dialect.builder import TORCH_DTYPES
from hostir.passes.analysis.cost_model import (
    NOMINAL_GPU_RATES,
    OverlapKind,
    OverlapProblem,
    PipelineShape,
    choose_pipeline,
    pipeline_time,
)

_TORCH = os.path.dirname(torch.__file__) + os.sep
"""Where torch's own code is."""

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)(?:\n(?!\s*File ")(?P<code>[^\n]*))?')
"""A frame of an FX node's `stack_trace` (Python's traceback format): the file, the line, the code."""


@dataclass(frozen=True)
class SourcePlace:
    """Where in the user's code an FX node was traced from."""

    file: str
    line: int
    code: str
    """The source line, stripped."""
    module: str | None = None
    """The submodule that ran it, by its path in the model and its class (`layers.0.attn (Attention)`)."""

    @classmethod
    def of(cls, node: torch.fx.Node | None) -> SourcePlace | None:
        """The innermost frame of the node's stack trace in the user's code (not torch's: an
        `nn.Linear`'s forward is torch's line), and the module that traced it (a forward
        graph's nodes know it; a backward graph's know only the line)."""
        frames = list(_FRAME.finditer((node.meta.get("stack_trace") or "") if node is not None else ""))
        if not frames:
            return None
        users = [frame for frame in frames if not frame["file"].startswith(_TORCH)]
        frame = (users or frames)[-1]
        stack = node.meta.get("nn_module_stack") or {}
        module = None
        if stack:
            path, kind = list(stack.values())[-1]
            module = f"{_module_path(path)} ({getattr(kind, '__name__', kind)})"
        return cls(frame["file"], int(frame["line"]), (frame["code"] or "").strip(), module)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} in module {self.module}" if self.module else where


def _module_path(path: str) -> str:
    """`L['self'].layers._modules['0'].attn` -> `layers.0.attn`: dynamo's path of a submodule
    (from the compiled module, `L['self']` or `L['fn']`), as the model names it
    (`model.get_submodule`)."""
    path = re.sub(r"^L\['\w+'\]\.?", "", path)
    path = re.sub(r"\._modules\['([^']*)'\]|\['([^']*)'\]", lambda m: "." + (m[1] or m[2]), path)
    return path.lstrip(".") or "the model"


KIND_NAMES = {
    OverlapKind.MATMUL_REDUCE_SCATTER: "GEMM + reduce-scatter",
    OverlapKind.MATMUL_ALLREDUCE: "GEMM + all-reduce",
    OverlapKind.ALLGATHER_MATMUL: "all-gather + GEMM",
}


@dataclass(frozen=True)
class ChunkedCollective:
    """A reduce-scatter or all-reduce of GEMMs that the importer cut into chunks."""

    collective: str
    """The name of its FX node."""
    problem: OverlapProblem
    chunks: int
    chosen_by: str
    """Who chose the count: the `chunks` option, the cost model, one chunk on the CPU."""
    measured: PipelineShape | None = None
    """The cost model's choice on the stages measured on this machine, where it measured them."""

    def __str__(self) -> str:
        p = self.problem
        described = f"%{self.collective}, a {KIND_NAMES[p.kind]} of M={p.m} K={p.k} N={p.n} over {p.world} ranks"
        chunks = f"{self.chunks} chunk{'s' if self.chunks > 1 else ''}"
        if self.measured is not None:
            return f"{described}: {chunks} ({self.chosen_by}): {self.measured.why}"
        model = choose_pipeline(p, NOMINAL_GPU_RATES)
        predicted = f"{pipeline_time(p, NOMINAL_GPU_RATES, self.chunks) * 1e3:.3g} ms in {chunks}"
        if model.chunks != self.chunks:
            predicted += f", {model.predicted_s * 1e3:.3g} ms in its choice of {model.chunks}"
        return (
            f"{described}: {chunks} ({self.chosen_by}); on an H100's nominal "
            f"rates the cost model predicts {predicted}"
        )


@dataclass
class GraphExplanation:
    """What hostir did with one graph, for one set of input shapes (the module docstring)."""

    graph: str
    """The graph's name: `forward_3`, `backward_4`, as the dumps name it."""
    inputs: list[str]
    """Each tensor input, as `f32[8, 16]`."""
    fallback: str | None = None
    """Why the graph runs as torch eager ops; None where hostir runs it."""
    node: torch.fx.Node | None = None
    """The node that holds what hostir cannot run."""
    place: SourcePlace | None = None
    ranks: tuple[int, ...] = ()
    """The ranks that run the program together (one: a graph without collectives)."""
    pipelining: list[str] = field(default_factory=list)
    """What auto-stream-parallel pipelined and declined, with the reasons."""
    chunked: list[ChunkedCollective] = field(default_factory=list)
    backend: str | None = None
    """Who moves the collectives' bytes: `nccl` (the process group: NCCL, gloo on CPU ranks)
    or `cuda` (the copy engines)."""
    backend_why: str = ""

    @property
    def imported(self) -> bool:
        return self.fallback is None

    @property
    def op(self) -> str | None:
        """The ATen op (or other target) of the node that falls back; an input by its name."""
        if self.node is None:
            return None
        return f"the input {self.node.target}" if self.node.op == "placeholder" else str(self.node.target)

    def fell_back(self, reason: str, node: torch.fx.Node | None) -> None:
        self.node, self.place = node, SourcePlace.of(node)
        self.fallback = reason.removeprefix(f"{node.format_node()}: ") if node is not None else reason

    def fallback_line(self) -> str:
        """`aten._to_copy.default at model.py:12 in module inner (Inner): tensors of dtype ...`."""
        where = "" if self.place is None else f" at {self.place}"
        return f"{self.op or 'the graph'}{where}: {self.fallback}"

    def __str__(self) -> str:
        head = f"graph {self.graph} ({', '.join(self.inputs) or 'no tensor inputs'})"
        if not self.imported:
            lines = [f"{head}: runs as torch eager ops", f"  {self.fallback_line()}"]
            if self.place is not None and self.place.code:
                lines.append(f"    {self.place.code}")
            if self.node is not None:
                lines.append(f"  node: {self.node.format_node()}")
            return "\n".join(lines)
        ranks = f"on ranks {list(self.ranks)}" if len(self.ranks) > 1 else "on one device"
        lines = [f"{head}: a host program {ranks}"]
        if len(self.ranks) > 1:
            lines.append(f"  collectives: {self.backend} ({self.backend_why})")
        lines += [f"  pipelining: {decision}" for decision in self.pipelining]
        lines += [f"  chunks: {chunked}" for chunked in self.chunked]
        return "\n".join(lines)


@dataclass
class Explanation:
    """The explanations of the graphs one run compiled, as `hostir.explain` returns them."""

    graphs: list[GraphExplanation]

    @property
    def fallbacks(self) -> list[GraphExplanation]:
        return [graph for graph in self.graphs if not graph.imported]

    def __str__(self) -> str:
        summary = (
            f"{len(self.graphs)} graph(s): {len(self.graphs) - len(self.fallbacks)} run by hostir, "
            f"{len(self.fallbacks)} as torch eager ops"
        )
        return "\n".join([summary, *map(str, self.graphs)])


def tensor_summary(value: object) -> str | None:
    """`bf16[8, 16]` for a tensor (its element type as the fusion dialect names it); None otherwise."""
    if not isinstance(value, torch.Tensor):
        return None
    return f"{TORCH_DTYPES.get(value.dtype, str(value.dtype).removeprefix('torch.'))}{list(value.shape)}"
