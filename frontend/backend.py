"""`torch.compile(model, backend="hostir")`: the forward and backward graphs run as host programs.

    model = parallelize_module(model, mesh, plan)          # torch's tensor parallelism
    model = torch.compile(model, backend="hostir")         # found through the entry point
    loss = model(x).sum(); loss.backward()                 # every rank, as with eager

aot_autograd splits what dynamo traces into a forward and a backward graph of ATen ops
and functional collectives; each becomes a `HostirGraph`, which on its first call with
a set of input shapes imports the graph (`frontend/importer.py`), chooses what to
pipeline (`auto-stream-parallel`), lowers it with hir-lowering and prepares the
program, then runs it on this rank's tensors. A new set of shapes compiles again;
dynamo's own recompilation (a new shape, a new dtype) hands over a new graph.

Options (`torch.compile(..., options={...})`):

| option | default | meaning |
|---|---|---|
| `pipeline` | `True` | pipeline AG+GEMM, GEMM+RS and GEMM+AR chains (`auto-stream-parallel`) |
| `chunks` | `None` | the chunks of a GEMM+RS or GEMM+AR pipeline; None: the cost model's choice on GPUs, one on the CPU |
| `backend` | `"auto"` | how the collectives move bytes: `nccl`, `cuda` for the copy engines, or `auto`: the copy engines where they can (`why_not_copy_engines`), else NCCL (gloo on the CPU) |
| `cuda_graphs` | `True` | replay each program as a CUDA graph on GPUs |
| `fallback` | `True` | run a graph hostir cannot import eagerly, with a warning naming what it met |
| `sequence_layout` | `None` | how a context-parallel sequence is laid out over the ranks, `"head_tail"` or `"contiguous"`: an attention masked causally by its tokens' positions then runs as a ring that skips the blocks the mask empties, and every run checks the positions |

`HOSTIR_DUMP=fusion,host_ir` prints the imported fusion and the lowered host program of
every graph to standard error, on the first rank of the graph's mesh.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from xdsl.dialects.builtin import ModuleOp

from hostir_dialect.aten_call import CARRIERS
from hostir_dialect.fusion import Causal
from hostir_dialect.text import HostirError, print_module
from hostir.frontend.fx_rewrites import constants_as_arguments, masked_writes_as_where
from hostir.frontend.importer import ImportedGraph, LayoutValue, UnsupportedGraph, import_graph
from hostir.passes.analysis.cost_model import ChunksOf, modelled_chunks, one_chunk
from hostir.runtime.distributed.communicator import DEFAULT_TIMEOUT_S, Communicator
from hostir.runtime.distributed.copy_engine import why_not_copy_engines
from hostir.runtime.graphs import GraphReplayer
from hostir.runtime.interpreter.attention import layout_mask, positions, whole_sequence
from hostir.runtime.program import Program

DUMP_KINDS = ("fusion", "host_ir")


LAYOUTS = tuple(layout.value for layout in Causal if layout.is_layout)
"""The values of the `sequence_layout` option."""


class HostirFallbackWarning(UserWarning):
    """A graph runs as torch eager ops because hostir cannot import it; the message says why."""


@dataclass(frozen=True)
class BackendOptions:
    pipeline: bool = True
    chunks: int | None = None
    backend: str = "auto"
    cuda_graphs: bool = True
    fallback: bool = True
    sequence_layout: str | None = None

    @classmethod
    def of(cls, options: dict[str, Any] | None) -> BackendOptions:
        options = dict(options or {})
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown hostir backend option(s) {sorted(unknown)}; known: "
                + ", ".join(cls.__dataclass_fields__)
            )
        if options.get("backend", "auto") not in ("auto", "nccl", "cuda"):
            raise ValueError(f"hostir backend option backend={options['backend']!r}: choose auto, nccl or cuda")
        chunks = options.get("chunks")
        if chunks is not None and (not isinstance(chunks, int) or chunks < 1):
            raise ValueError(f"hostir backend option chunks={chunks!r}: a positive number of chunks, or None")
        layout = options.get("sequence_layout")
        if layout is not None and layout not in LAYOUTS:
            raise ValueError(
                f"hostir backend option sequence_layout={layout!r}: choose {' or '.join(map(repr, LAYOUTS))}, or None"
            )
        return cls(**options)

    @property
    def layout(self) -> Causal | None:
        return None if self.sequence_layout is None else Causal(self.sequence_layout)

    def chunks_of(self, device: torch.device) -> ChunksOf:
        """How the importer cuts a GEMM+RS or GEMM+AR: `chunks` if set; else by the cost
        model on GPUs, and in one chunk on the CPU, where gloo's transfers block."""
        if not self.pipeline:
            return one_chunk
        if self.chunks is not None:
            return lambda problem: self.chunks
        return modelled_chunks if device.type == "cuda" else one_chunk

    def backends(self, communicator: Communicator) -> list[str]:
        """The backends to lower with, in order of preference: the one asked for; for
        `auto`, the copy engines where they can serve this world, faster than NCCL on one
        host (docs/benchmarks.md), and NCCL for a graph whose collectives they have no
        form for."""
        if self.backend != "auto":
            return [self.backend]
        return ["nccl"] if why_not_copy_engines(communicator) else ["cuda", "nccl"]

    def lowering(self, backend: str) -> str:
        return f"auto-stream-parallel{{enabled={str(self.pipeline).lower()}}},hir-lowering{{backend={backend}}}"

    def compile(self, module: ModuleOp, communicator: Communicator) -> tuple[Program, str]:
        """`module` lowered with the first of `self.backends(communicator)` whose lowering
        takes it, and that backend; the last one's error where none does."""
        *preferred, last = self.backends(communicator)
        for backend in preferred:
            try:
                return Program.compile(module, self.lowering(backend)), backend
            except HostirError:
                pass  # the next backend's lowering may take it
        return Program.compile(module, self.lowering(last)), last


def dump_kinds() -> set[str]:
    """The kinds HOSTIR_DUMP asks for; an unknown kind is refused with the known ones."""
    kinds = {k.strip() for k in os.environ.get("HOSTIR_DUMP", "").split(",") if k.strip()}
    unknown = kinds - set(DUMP_KINDS)
    if unknown:
        raise ValueError(f"HOSTIR_DUMP names {sorted(unknown)}; it takes a list of {', '.join(DUMP_KINDS)}")
    return kinds


@dataclass
class CompiledShapes:
    """A graph compiled for one set of input shapes."""

    imported: ImportedGraph
    program: Program
    communicator: Communicator
    replayer: GraphReplayer | None
    backend: str
    """Who moves the collectives' bytes: `nccl` or `cuda` (the copy engines)."""

    def run(self, args: Sequence[Any]) -> list[Any]:
        imported = self.imported
        inputs = [
            _carried(args[i]).unsqueeze(0) if varying else _carried(args[i])
            for i, varying in zip(imported.inputs, imported.input_varying)
        ]
        if self.replayer is not None:
            # A replay checks no input across ranks (Program.run does): this rank's promised values here.
            for index, value in enumerate(inputs):
                problem = self.program.value_problem(index, value)
                if problem is not None:
                    raise HostirError(f"input #{index} of @{self.program.host.sym_name.data}: {problem}")
            results = self.replayer.run(inputs)
        else:
            results = self.program.run(inputs, self.communicator, views_of=range(len(inputs)))
        outputs: list[Any] = []
        for kind, what in imported.outputs:
            if kind == "fusion":
                index, shape, dtype = what
                outputs.append(results[index].reshape(shape).view(dtype))
            elif kind == "input":
                outputs.append(args[what])
            else:
                outputs.append(what)
        return outputs


@functools.cache
def layout_tensor(
    value: LayoutValue, dtype: torch.dtype, position: int, devices: int, device: torch.device
) -> torch.Tensor:
    """What a sequence laid out as `value.layout` over `devices` ranks gives the rank at `position`
    (`LayoutValue`), in `dtype` (a float mask holds 0 and -inf); made once, and shared by every
    graph that asks for it: a mask of `rows x sequence` elements."""
    queries = positions(position, devices, value.rows, value.layout, device)
    if value.kind == "queries":
        return queries.to(dtype)
    keys = whole_sequence(devices, value.rows, value.layout, device)
    if value.kind == "keys":
        return keys.to(dtype)
    seen = layout_mask(queries, keys)
    if dtype == torch.bool:
        return seen
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, -math.inf)


LAYOUT_MEANINGS = {
    "queries": "this rank's positions in a sequence laid out {}",
    "keys": "the positions of a sequence laid out {}",
    "mask": "the causal mask of this rank's rows in a sequence laid out {}",
}


def with_layout_values(
    imported: ImportedGraph, args: Sequence[Any], program: Program, communicator: Communicator
) -> None:
    """Promises the values of the program's inputs that hold what the `sequence_layout` option
    says (`Program.expect`), and makes the masks the layout fixes that the graph returns."""
    devices, position = len(imported.mesh), imported.mesh.index(communicator.rank)
    for graph_index, value in imported.layout_inputs:
        index = imported.inputs.index(graph_index)
        given = args[graph_index]
        expected = layout_tensor(value, given.dtype, position, devices, given.device)
        what = LAYOUT_MEANINGS[value.kind].format(value.layout.value)
        program.expect(index, expected.unsqueeze(0) if imported.input_varying[index] else expected, what)
    device = communicator.device
    imported.outputs = [
        ("constant", layout_tensor(what[0], what[1], position, devices, device)) if kind == "layout" else (kind, what)
        for kind, what in imported.outputs
    ]


def _carried(tensor: torch.Tensor) -> torch.Tensor:
    """A graph input as the program takes it: its bits in the IR's dtype (`CARRIERS`)."""
    return tensor.view(CARRIERS[tensor.dtype]) if tensor.dtype in CARRIERS else tensor


class HostirGraph:
    """The callable that stands for one FX graph: compiles per set of input shapes, then runs."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        options: BackendOptions,
        parameters: Parameters,
        forward: bool,
        saved: slice | None = None,
    ):
        self.gm, self.constants = constants_as_arguments(gm)
        """The graph, reading the tensors it held as attributes from arguments after its own."""
        self.name = name
        self.options = options
        self.parameters = parameters
        self.forward = forward
        self.saved = saved
        """The outputs of a forward graph that aot_autograd saves for the backward graph."""
        self.compiled: dict[tuple, CompiledShapes | None] = {}
        """Per set of input shapes, what it compiled to; None where the graph runs eagerly."""
        _GRAPHS.add(self)

    def __call__(self, *args: Any) -> list[Any]:
        key = tuple(
            (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a if isinstance(a, int) else None)
            for a in args
        )
        if key not in self.compiled:
            self.compiled[key] = self._compile(args)
        compiled = self.compiled[key]
        if compiled is None:
            return self.gm(*args, *self.constants)
        return compiled.run((*args, *self.constants))

    def _compile(self, args: Sequence[Any]) -> CompiledShapes | None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        # The program's tensors are on its device, a constant too (the trace makes scalars on the CPU).
        self.constants = [constant.to(device) for constant in self.constants]
        args = (*args, *self.constants)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with mode:
            FakeTensorProp(self.gm, mode).propagate_dont_convert_inputs(*fake)
            if masked_writes_as_where(self.gm):
                FakeTensorProp(self.gm, mode).propagate_dont_convert_inputs(*fake)
        try:
            imported = import_graph(self.gm, self.name, self.options.chunks_of(device), self.options.layout)
        except UnsupportedGraph as error:
            if not self.options.fallback:
                raise
            warnings.warn(
                f"hostir runs graph {self.name} as torch eager ops: {error}", HostirFallbackWarning, stacklevel=2
            )
            return None
        if imported.group is None or not dist.is_initialized():
            communicator = Communicator.single(device)
        elif imported.mesh == tuple(range(dist.get_world_size())):
            communicator = Communicator(
                dist.get_rank(), dist.get_world_size(), device, dist.get_backend(), DEFAULT_TIMEOUT_S
            )
        else:  # a group of part of the world (tensor parallel on one axis of a 2-D mesh)
            communicator = Communicator.of_group(imported.group, device, DEFAULT_TIMEOUT_S)
        kinds = dump_kinds()
        dumps = kinds and communicator.rank == imported.mesh[0]
        if dumps and "fusion" in kinds:
            print(f"// hostir: the fusion of graph {self.name}\n{print_module(imported.module)}", file=sys.stderr)
        program, backend = self.options.compile(imported.module, communicator)
        with_layout_values(imported, args, program, communicator)
        if dumps and "host_ir" in kinds:
            print(f"// hostir: the host program of graph {self.name}\n{print_module(program.module)}", file=sys.stderr)
        replayer = None
        if self.options.cuda_graphs and device.type == "cuda":
            parameters = self.parameters.among(args, self.forward)
            constants = range(len(args) - len(self.constants), len(args))
            static = [j for j, i in enumerate(imported.inputs) if i in parameters or i in constants]
            replayer = GraphReplayer(program, communicator, static_inputs=static, hand_over=self._saved_only(imported))
        return CompiledShapes(imported, program, communicator, replayer, backend)

    def _saved_only(self, imported: ImportedGraph) -> set[int]:
        """The program's outputs that the graph returns only as activations saved for the
        backward graph, which lets go of them once it has run: a CUDA-graph replay hands
        them over with no copy (`GraphReplayer`'s `hand_over`). An output that the graph
        also returns to the caller is copied, since the caller may keep it."""
        if self.saved is None:
            return set()
        saved = range(*self.saved.indices(len(imported.outputs)))
        outputs = [what[0] if kind == "fusion" else None for kind, what in imported.outputs]
        returned = {index for j, index in enumerate(outputs) if j not in saved}
        return {index for j, index in enumerate(outputs) if j in saved and index is not None} - returned


_GRAPHS: weakref.WeakSet[HostirGraph] = weakref.WeakSet()


def compiled_graphs() -> list[HostirGraph]:
    """The graphs of this process that the backend compiled and that are still in use, in
    the order they were made: their programs (`compiled`), to inspect or to time."""
    return sorted(_GRAPHS, key=lambda graph: int(graph.name.rpartition("_")[2]))


_graph_count = 0


def _graph_name(kind: str) -> str:
    global _graph_count
    _graph_count += 1
    return f"{kind}_{_graph_count}"


@dataclass
class Parameters:
    """The parameters of one compiled module, which its forward and backward graphs take
    as arguments at the same address every step: a CUDA graph replay reads them in place
    (`GraphReplayer`'s static inputs), as inductor's CUDA graphs do."""

    forward: frozenset[int] = frozenset()
    """The forward graph's arguments that are parameters and buffers."""
    storages: set[int] = field(default_factory=set)
    """The addresses of their storages, from each compilation of the forward: a backward
    argument in one of them (a weight's transpose that the forward saved) is a parameter too."""

    def among(self, args: Sequence[Any], forward: bool) -> set[int]:
        """The arguments of a call of the forward (`forward`) or backward graph that are parameters."""
        if forward:
            tensors = {i for i in self.forward if isinstance(args[i], torch.Tensor)}
            self.storages.update(args[i].untyped_storage().data_ptr() for i in tensors)
            return tensors
        return {
            i
            for i, arg in enumerate(args)
            if isinstance(arg, torch.Tensor) and arg.untyped_storage().data_ptr() in self.storages
        }


def _forward_parameters() -> frozenset[int]:
    """The forward graph's arguments that are parameters and buffers, which every step
    passes at the same address (aot_autograd's `static_input_indices`, as inductor's
    CUDA graphs read them)."""
    context = torch._guards.TracingContext.try_get()
    if context is None or context.fw_metadata is None:
        return frozenset()
    return frozenset(context.fw_metadata.static_input_indices)


def _saved_for_backward() -> slice | None:
    """The outputs of the forward graph being compiled that aot_autograd saves for the
    backward graph; None for a graph without a backward (inference)."""
    context = torch._guards.TracingContext.try_get()
    try:
        return context.fw_metadata.tensors_saved_for_backwards_slice
    except (AttributeError, AssertionError):  # no context, or no backward: nothing saved
        return None


def hostir(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None):
    """The `hostir` backend of torch.compile (registered under that name by the package's entry point)."""
    backend_options = BackendOptions.of(options)
    dump_kinds()

    parameters = Parameters()

    def compiler(kind: str):
        def compile_graph(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[[list[Any]], list[Any]]:
            forward = kind == "forward"
            if forward:
                parameters.forward = _forward_parameters()
            saved = _saved_for_backward() if forward else None
            # aot_autograd's boxed convention: the arguments come as one list.
            return make_boxed_func(HostirGraph(graph, _graph_name(kind), backend_options, parameters, forward, saved))

        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))(gm, example_inputs)
