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

Options (`torch.compile(..., options={...})`, or `backend=hostir.backend(**options)`,
which checks them where they are written: torch hands a backend named by a string its
options only when it first compiles):

| option | default | meaning |
|---|---|---|
| `pipeline` | `True` | pipeline AG+GEMM, GEMM+RS and GEMM+AR chains (`auto-stream-parallel`) |
| `chunks` | `None` | the chunks of a GEMM+RS or GEMM+AR pipeline; None: the cost model's choice on GPUs, one on the CPU |
| `backend` | `"auto"` | how the collectives move bytes: `nccl`, `cuda` for the copy engines, or `auto`: the copy engines where they can (`why_not_copy_engines`), NCCL for the reductions on more than 2 GPUs, else NCCL (gloo on the CPU) |
| `cuda_graphs` | `True` | replay each program as a CUDA graph on GPUs |
| `fallback` | `True` | run a graph hostir cannot import eagerly, with a warning naming what it met |
| `sequence_layout` | `None` | how a context-parallel sequence is laid out over the ranks, `"head_tail"` or `"contiguous"`: an attention masked causally by its tokens' positions then runs as a ring that skips the blocks the mask empties, and every run checks the positions |

`mode` (torch.compile's) is one of `MODES`, a preset of these options.

What hostir did with each graph, it says on the `hostir` loggers once per graph, on the
first of the graph's ranks (`hostir.logs`: `TORCH_LOGS="+hostir"`, or `HOSTIR_DUMP`), and
keeps in `HostirGraph.explanations` (`hostir.explain`).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import InitVar, dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from xdsl.dialects.builtin import ModuleOp

from hostir_dialect.aten_call import carried
from hostir_dialect.builder import torch_dtype
from hostir_dialect.fusion import DYNAMIC, Causal
from hostir_dialect.text import HostirError, print_module
from hostir import config, logs
from hostir.frontend.explanation import ChunkedCollective, GraphExplanation, tensor_summary
from hostir.frontend.fx_rewrites import complex_as_real_pairs, constants_as_arguments, masked_writes_as_where
from hostir.frontend.importer import GraphLayouts, ImportedGraph, Layout, LayoutValue, UnsupportedGraph, import_graph
from hostir.frontend.partitioning import partition
from hostir.frontend.rules.attention import hides_keys
from hostir.frontend.rules.pointwise import KERNEL_DECOMPOSITIONS
from hostir.passes.analysis.cost_model import ChunksOf, OverlapKind, OverlapProblem, one_chunk
from hostir.passes.analysis.loops import PairPositions, RingPositions
from hostir.runtime.distributed.calibration import MeasuredChunks
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.distributed.copy_engine import why_not_copy_engines
from hostir.runtime.graphs import GraphReplayer, Signature, release_captured_graphs, signature
from hostir.runtime.interpreter import RunContext
from hostir.runtime.interpreter.attention import layout_mask, positions, whole_sequence
from hostir.runtime.program import Program


LAYOUTS = tuple(layout.value for layout in Causal if layout.is_layout)
"""The values of the `sequence_layout` option."""


class HostirFallbackWarning(UserWarning):
    """A graph runs as torch eager ops because hostir cannot import it; the message says why,
    and the warning points at the line of the user's code that the construct comes from."""


MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"cuda_graphs": True},
    "max-autotune": {"cuda_graphs": True},
    "max-autotune-no-cudagraphs": {"cuda_graphs": False},
}
"""torch.compile's modes, each as the options it stands for. hostir replays its programs as
CUDA graphs unless told not to (`reduce-overhead`'s point), and tunes nothing at compilation:
the cost model chooses the chunks, so `max-autotune` is the default's options."""


@dataclass(frozen=True)
class Lowered:
    """A graph's fusion lowered: the program, who moves its collectives' bytes and why, and
    what auto-stream-parallel said while lowering it."""

    program: Program
    pipeline: str
    """The pass pipeline that lowered it, as `hir-opt -p` takes it."""
    backend: str
    why: str
    pipelining: list[str]


COPY_ENGINE_REDUCTION_RANKS = 2
"""The most ranks whose reduce-scatters and allreduces `backend="auto"` gives the copy engines.
On 4 H100 theirs are slower than NCCL's even unpipelined (docs/benchmarks.md), and NCCL's
order of summing is eager DTensor's (in bf16 another order rounds otherwise); over 2 ranks
both orders are one sum."""


@dataclass(frozen=True)
class BackendOptions:
    pipeline: bool = True
    chunks: int | None = None
    backend: str = "auto"
    cuda_graphs: bool = True
    fallback: bool = True
    sequence_layout: str | None = None

    @classmethod
    def of(cls, options: dict[str, Any] | None, mode: str | None = None) -> BackendOptions:
        if mode is not None and mode not in MODES:
            raise ValueError(f"hostir has no mode {mode!r}; torch.compile's modes are {', '.join(MODES)}")
        options = {**MODES[mode or "default"], **(options or {})}
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
            return lambda problem, group: self.chunks
        return MeasuredChunks(device, self.lowered_form) if device.type == "cuda" else one_chunk

    def lowered_form(self, problem: OverlapProblem, communicator: Communicator) -> OverlapProblem:
        """`problem` in the form that lowering for `communicator` with the first of `backends`
        gives it, for the cost model: on the copy engines a GEMM+RS or GEMM+AR of a pair sums
        in the GEMM (`reduce-scatter-in-matmul`, `allreduce-in-matmul`), and a GEMM+RS of more
        consecutive ranks is a ring of destinations (`reduce-scatter-ring`), unless NCCL reduces."""
        backend = self.backends(communicator)[0]
        if problem.kind == OverlapKind.ALLGATHER_MATMUL or backend != "cuda" or self.nccl_reductions(backend, communicator):
            return problem
        team = sorted(communicator.ranks)
        if PairPositions.serves(team):
            return replace(problem, reduction_in_matmul=True)
        if problem.kind == OverlapKind.MATMUL_REDUCE_SCATTER and RingPositions.serves(team):
            return replace(problem, destination_ring=True)
        return problem

    def chunks_chosen_by(self, device: torch.device) -> str:
        """Who `chunks_of(device)` is, in words (`hostir.explain`)."""
        if not self.pipeline:
            return "pipeline=False: one chunk"
        if self.chunks is not None:
            return "the chunks option"
        if device.type == "cuda":
            return "the cost model's choice on stages measured here"
        return "one chunk on the CPU, where gloo's transfers block"

    def backends(self, communicator: Communicator) -> list[str]:
        """The backends to lower with, in order of preference: the one asked for; for
        `auto`, the copy engines where they can serve this world, faster than NCCL on one
        host (docs/benchmarks.md), and NCCL for a graph whose collectives they have no
        form for."""
        if self.backend != "auto":
            return [self.backend]
        return ["nccl"] if why_not_copy_engines(communicator) else ["cuda", "nccl"]

    def nccl_reductions(self, backend: str, communicator: Communicator) -> bool:
        """Whether NCCL moves the collectives that reduce while the copy engines move the
        others: `auto` on more than `COPY_ENGINE_REDUCTION_RANKS` ranks."""
        return self.backend == "auto" and backend == "cuda" and len(communicator.ranks) > COPY_ENGINE_REDUCTION_RANKS

    def lowering(self, backend: str, communicator: Communicator) -> str:
        reductions = " nccl_reductions=true" if self.nccl_reductions(backend, communicator) else ""
        enabled = str(self.pipeline).lower()
        return f"auto-stream-parallel{{enabled={enabled}}},hir-lowering{{backend={backend}{reductions}}}"

    def compile(self, module: ModuleOp, communicator: Communicator) -> Lowered:
        """`module` lowered with the first of `self.backends(communicator)` whose lowering
        takes it; the last one's error where none does."""
        *preferred, last = self.backends(communicator)
        if self.backend != "auto":
            why = f"backend={self.backend!r}"
        else:
            why = f"backend='auto': {why_not_copy_engines(communicator) or 'every rank on this host, with peer access'}"
            if self.nccl_reductions("cuda", communicator):
                why += (
                    f"; NCCL reduces: on more than {COPY_ENGINE_REDUCTION_RANKS} GPUs the copy engines' "
                    "reduce-scatter and allreduce are slower than NCCL's"
                )
        for backend in preferred:
            try:
                with logs.recorded("pipelining") as pipelining:
                    pipeline = self.lowering(backend, communicator)
                    return Lowered(Program.compile(module, pipeline), pipeline, backend, why, pipelining)
            except HostirError as error:
                # The next backend's lowering may take it.
                why = f"backend='auto': the copy engines cannot move this graph's collectives: {error.message}"
        with logs.recorded("pipelining") as pipelining:
            pipeline = self.lowering(last, communicator)
            return Lowered(Program.compile(module, pipeline), pipeline, last, why, pipelining)


@dataclass
class CompiledShapes:
    """A graph compiled for one set of input shapes, and run on arguments of those shapes.

    A call does only what its arguments can change. How each argument becomes a program input,
    and each result a graph output, depends on the shapes and dtypes alone and is decided once,
    from the first call's arguments (`input_views`, `output_views`); the constants' inputs are
    made once. The program's check of its inputs across ranks (`Program.check`, which exchanges
    a row with every peer) runs at the first call; later calls, whose inputs have the shapes,
    strides, dtypes and devices of those it accepted (`checked`), run the checked program
    directly (`Program.run_checked`). The graph's key, or dynamo's guards for a graph of static
    shapes, keep them so, but for what torch's guard filters let through (a parameter replaced
    by one of another shape where `skip_guard_on_all_nn_modules_unsafe` skips the modules'
    guards): a call whose inputs differ is checked again, on every rank alike as the ranks
    change their modules alike, and raises what contradicts the program. A replayed CUDA
    graph does the same: a new signature is checked before its capture. Where the program
    checks the values of an input (`Program.value_checked_inputs`), which any call may break
    on one rank alone, every call checks those inputs with the peers before the program
    communicates (`Program.check_values`; a replay copies its inputs while the verdicts travel).
    """

    imported: ImportedGraph
    program: Program
    communicator: Communicator
    replayer: GraphReplayer | None
    backend: str
    """Who moves the collectives' bytes: `nccl` or `cuda` (the copy engines)."""
    args: InitVar[Sequence[Any]]
    """The first call's arguments, the graph's constants after them, which the views are decided on."""
    arity: InitVar[int]
    """How many arguments a call passes (the constants are the graph's own)."""
    extents: dict[tuple[int, int], int] | None = field(default=None, init=False)
    """The inputs' dynamic extents that the last check agreed on; None before the first."""
    checked: Signature | None = field(default=None, init=False)
    """The signature of the inputs that the last check accepted; None before the first."""

    def __post_init__(self, args: Sequence[Any], arity: int) -> None:
        imported = self.imported
        self.checks_values = bool(self.program.value_checked_inputs)
        """Whether every call checks its inputs across ranks (the program checks their values)."""
        self.input_template: list[Any] = [None] * len(imported.inputs)
        """The program's inputs, those of the constants in place: each call fills in a copy."""
        views = []
        for position, (i, varying, piece) in enumerate(
            zip(imported.inputs, imported.input_varying, imported.input_pieces, strict=True)
        ):
            carrier, shape = _input_view(args[i], piece, varying)
            if i < arity:
                views.append((position, i, carrier, shape))
            else:
                self.input_template[position] = _viewed(args[i], carrier, shape)
        self.input_views: tuple[tuple[int, int, torch.dtype | None, tuple[int, ...] | None], ...] = tuple(views)
        """(program input, argument, the dtype that carries its bits or None, the shape to read it as or None)."""
        self.output_views: tuple[tuple[str, Any], ...] = tuple(
            _output_view(self.program, kind, what, args, arity) for kind, what in imported.outputs
        )
        """The graph's outputs: ("result", (index, shape or None, dtype or None)): a program result,
        read as that shape and dtype where it has another; ("argument", i); ("constant", value)."""

    def inputs_of(self, args: Sequence[Any]) -> list[Any]:
        """The program's inputs on the graph's arguments `args`."""
        inputs = self.input_template.copy()
        for position, i, carrier, shape in self.input_views:
            inputs[position] = _viewed(args[i], carrier, shape)
        return inputs

    def outputs_of(self, args: Sequence[Any], results: Sequence[Any]) -> list[Any]:
        """The graph's outputs, from the program's `results` on `args`."""
        outputs = []
        for kind, what in self.output_views:
            if kind == "result":
                index, shape, dtype = what
                result = results[index] if shape is None else results[index].reshape(shape)
                if dtype is not None:
                    result = torch.view_as_complex(result) if dtype.is_complex else result.view(dtype)
                outputs.append(result)
            elif kind == "argument":
                outputs.append(args[what])
            else:
                outputs.append(what)
        return outputs

    def run(self, args: Sequence[Any]) -> list[Any]:
        inputs = self.inputs_of(args)
        program = self.program
        if self.replayer is not None:
            if program.expected_values:
                # Any call may break a promised value on one rank alone, and a replay checks
                # nothing: every rank checks with its peers, so that all raise, or none
                # replays to wait for a peer that raised. The replay waits for the peers'
                # verdicts only once it has copied the inputs.
                results = self.replayer.run(inputs, program.start_check_values(inputs, self.communicator))
            else:
                results = self.replayer.run(inputs)
        else:
            if (key := signature(inputs)) != self.checked:
                context = program.checked_context(inputs, self.communicator)
                self.extents, self.checked = context.input_extents, key
            else:
                if self.checks_values:
                    program.check_values(inputs, self.communicator)
                context = RunContext.of(self.communicator, None, self.extents)
            results = program.run_checked(inputs, context, views_of=range(len(inputs)))
        return self.outputs_of(args, results)


def _input_view(
    value: torch.Tensor, piece: tuple[int, ...] | None, varying: bool
) -> tuple[torch.dtype | None, tuple[int, ...] | None]:
    """How a graph argument like `value` is read as a program input: the dtype that carries its
    bits in the IR (`carried`: the real dtype of a complex tensor's pairs) or None, and the
    shape to read it as, None where it is read as it is: the `piece` of a layout, and a device
    axis of extent 1 in front where it `varying`."""
    shape = tuple(value.shape) if piece is None else tuple(piece)
    if varying:
        shape = (1, *shape)
    held, carrier = carried(shape, value.dtype)
    viewed, _ = carried(value.shape, value.dtype)  # what the carrier's view alone gives
    return None if carrier == value.dtype else carrier, None if held == viewed else held


def _viewed(value: torch.Tensor, carrier: torch.dtype | None, shape: tuple[int, ...] | None) -> torch.Tensor:
    """`value` read with `carrier` as `shape` (a complex tensor as its real pairs); as it is
    where it has another number of elements than the graph was compiled for, so that the
    program's check says so, on every rank."""
    if carrier is not None:
        value = torch.view_as_real(value) if value.is_complex() else value.view(carrier)
    if shape is None:
        return value
    try:
        return value.reshape(shape)
    except RuntimeError:
        return value


def _output_view(program: Program, kind: str, what: Any, args: Sequence[Any], arity: int) -> tuple[str, Any]:
    """An output of the imported graph (`ImportedGraph.outputs`) as `CompiledShapes.output_views` reads it."""
    if kind == "fusion":
        index, shape, dtype = what
        declared = program.output_types[index]
        local = declared.local_shape()
        held, _ = carried(shape, dtype)
        same_shape = DYNAMIC not in local and tuple(local) == held
        # Only a dtype the IR carries in another (`carried`) needs a view.
        same_dtype = torch_dtype(declared.element_type) == dtype
        return "result", (index, None if same_shape else held, None if same_dtype else dtype)
    if kind == "input":
        return ("argument", what) if what < arity else ("constant", args[what])
    return kind, what


@functools.cache
def layout_tensor(
    value: LayoutValue, dtype: torch.dtype, position: int, devices: int, device: torch.device
) -> torch.Tensor:
    """What a sequence laid out as `value.layout` over `devices` ranks gives the rank at `position`
    (`LayoutValue`), in `dtype` (a float mask holds 0 and the value's `hidden`); made once, and
    shared by every graph that asks for it: a mask of `rows x sequence` elements."""
    queries = positions(position, devices, value.rows, value.layout, device)
    if value.kind == "queries":
        return queries.to(dtype)
    keys = whole_sequence(devices, value.rows, value.layout, device)
    if value.kind == "keys":
        return keys.to(dtype)
    seen = layout_mask(queries, keys)
    mask = seen if dtype == torch.bool else torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, value.hidden)
    return mask.expand(*value.batch, *mask.shape)


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
        if value.kind == "mask" and given.is_floating_point() and hides_keys(lowest := given.amin().item()):
            # A saved mask, made by the forward's graph: it hides keys by its own value.
            value = replace(value, hidden=lowest)
        expected = layout_tensor(value, given.dtype, position, devices, given.device)
        what = LAYOUT_MEANINGS[value.kind].format(value.layout.value)
        program.expect(index, expected.unsqueeze(0) if imported.input_varying[index] else expected, what)
    device = communicator.device
    imported.outputs = [
        ("constant", layout_tensor(what[0], what[1], position, devices, device)) if kind == "layout" else (kind, what)
        for kind, what in imported.outputs
    ]


def _keyed_alike(value: object) -> bool:
    """Whether every argument of a placeholder whose traced value is `value` has the same `_key`:
    a tensor of static shape, or an object whose key is its type alone (a DTensor's mesh, which
    aot_autograd passes as an opaque script object); not an int, whose key is its value."""
    if isinstance(value, torch.Tensor):
        return all(isinstance(extent, int) for extent in value.shape)
    return value is not None and not isinstance(value, (int, torch.SymInt))


class ValuesProp(FakeTensorProp):
    """FakeTensorProp that records every node's value for this compilation's arguments, the
    ints of shape arithmetic too (a graph traced with dynamic shapes: the size of a sequence's
    rows, which a forward saves for its backward). torch 2.11's FakeTensorProp records
    tensors and symbols alone, and leaves such a node the trace's symbol, whose value is the
    first trace's: a compilation for another sequence length returned the first one's size."""

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, (int, float, bool)):
            n.meta["val"] = result
        return result


_NOT_YET = object()
"""`HostirGraph.compiled`'s answer for a key not compiled yet (None is a graph run eagerly)."""


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
        saved_layouts: SavedLayouts | None = None,
    ):
        self.static = all(_keyed_alike(node.meta.get("val")) for node in gm.graph.nodes if node.op == "placeholder")
        """Whether the graph was traced with static shapes: dynamo's guards then let it be called
        with those alone, and a call needs no look at its arguments' shapes (`_key`)."""
        self.gm, self.constants = constants_as_arguments(gm)
        """The graph, reading the tensors it held as attributes from arguments after its own."""
        self.name = name
        self.options = options
        self.parameters = parameters
        self.forward = forward
        self.saved = saved
        """The outputs of a forward graph that aot_autograd saves for the backward graph."""
        self.saved_layouts = saved_layouts if saved_layouts is not None else SavedLayouts()
        """The layouts in which the forward graph of this one's module hands its saved activations on."""
        self.compiled: dict[tuple, CompiledShapes | None] = {}
        """Per set of input shapes, what it compiled to; None where the graph runs eagerly."""
        self.eager_layouts: dict[tuple, GraphLayouts] = {}
        """Per set of input shapes that runs eagerly, the layouts its tensors must be turned from or to."""
        self.explanations: list[GraphExplanation] = []
        """What hostir did with the graph, per set of input shapes in the order they came."""
        _GRAPHS.add(self)

    def _key(self, args: Sequence[Any]) -> tuple:
        """What a compilation depends on: each argument's shape, dtype and device (an int's
        value); nothing for a graph of static shapes, called with those alone."""
        if self.static:
            return ()
        return tuple(
            (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a if isinstance(a, int) else None)
            for a in args
        )

    def _outputs(self) -> list[Any]:
        """The items of the graph's output node, in order."""
        return list(next(node for node in reversed(self.gm.graph.nodes) if node.op == "output").args[0])

    def _layouts(self, args: Sequence[Any]) -> GraphLayouts:
        """The layouts of this graph's saved activations: those the forward graph handed
        over (the backward's inputs), or those it may choose or must keep (its outputs)."""
        if not self.forward:
            return GraphLayouts(inputs=self.saved_layouts.of_inputs(self.gm, args))
        return self.saved_layouts.of_outputs(self.saved, self._outputs())

    def __call__(self, *args: Any) -> list[Any]:
        if self.saved is not None and not self.parameters.backward_compiled:
            self.parameters.record(args)
        key = self._key(args)
        compiled = self.compiled.get(key, _NOT_YET)
        if compiled is _NOT_YET:
            compiled = self.compiled[key] = self._compile(args)
        if compiled is None:
            return self._eagerly(args, self.eager_layouts[key])
        return compiled.run(args)

    def _eagerly(self, args: Sequence[Any], layouts: GraphLayouts) -> list[Any]:
        """The graph run as torch eager ops, its saved activations in the layouts in which
        the backward graph takes them (`SavedLayouts`)."""
        args = [
            layouts.inputs[i].to_fx(arg, arg.shape) if i in layouts.inputs else arg for i, arg in enumerate(args)
        ]
        outputs = list(self.gm(*args, *self.constants))
        for position, layout in layouts.outputs.items():
            if layout is not None:
                outputs[position] = layout.from_fx(outputs[position])
        return outputs

    def _compile(self, args: Sequence[Any]) -> CompiledShapes | None:
        if not self.forward:
            self.parameters.backward_compiled = True
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        # The program's tensors are on its device, a constant too (the trace makes scalars on the CPU).
        self.constants = [constant.to(device) for constant in self.constants]
        arity = len(args)
        args = (*args, *self.constants)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with mode:
            ValuesProp(self.gm, mode).propagate_dont_convert_inputs(*fake)
            if masked_writes_as_where(self.gm) | complex_as_real_pairs(self.gm):
                ValuesProp(self.gm, mode).propagate_dont_convert_inputs(*fake)
        layouts = self._layouts(args)
        explanation = GraphExplanation(self.name, [s for s in map(tensor_summary, args) if s is not None])
        self.explanations.append(explanation)
        chunks_of = self.options.chunks_of(device)
        try:
            imported = import_graph(self.gm, self.name, chunks_of, layouts, self.options.layout)
        except UnsupportedGraph as error:
            explanation.fell_back(error.message, error.node)
            if not self.options.fallback:
                raise
            if _speaks_for(error.group):
                message = f"hostir runs graph {self.name} as torch eager ops: {explanation.fallback_line()}"
                _warn_at_users_code(message, explanation)
                logs.say("explain", str(explanation))
            self.eager_layouts[self._key(args[: len(args) - len(self.constants)])] = self.saved_layouts.eager(
                self.saved, layouts, self._outputs()
            )
            return None
        if self.forward:
            self.saved_layouts.record(self.saved, imported.output_layouts, self._outputs())
        if imported.group is None or not dist.is_initialized():
            communicator = Communicator.single(device)
        elif imported.mesh == tuple(range(dist.get_world_size())):
            communicator = Communicator(
                dist.get_rank(), dist.get_world_size(), device, dist.get_backend(), config.timeout_s
            )
        else:  # a group of part of the world (tensor parallel on one axis of a 2-D mesh)
            communicator = Communicator.of_group(imported.group, device, config.timeout_s)
        says = _speaks_for(imported.group)
        if says and logs.wanted("fusion"):
            logs.say("fusion", f"// hostir: the fusion of graph {self.name}\n{print_module(imported.module, aliases=True)}")
        lowered = self.options.compile(imported.module, communicator)
        program, backend = lowered.program, lowered.backend
        with_layout_values(imported, args, program, communicator)
        explanation.ranks = communicator.ranks if communicator.joined else (communicator.rank,)
        explanation.pipelining, explanation.backend, explanation.backend_why = lowered.pipelining, backend, lowered.why
        chosen_by = self.options.chunks_chosen_by(device)
        measured = chunks_of.choice if isinstance(chunks_of, MeasuredChunks) else lambda problem, group: None
        explanation.chunked = [
            ChunkedCollective(name, problem, chunks, chosen_by, measured(problem, imported.group))
            for name, (problem, chunks) in imported.chunked.items()
        ]
        if says:
            for decision in [*map(str, explanation.chunked), *lowered.pipelining]:
                logs.say("pipelining", decision)
            if logs.wanted("host_ir"):
                logs.say(
                    "host_ir",
                    f"// hostir: the host program of graph {self.name}, which its fusion lowers to with\n"
                    f"// hir-opt -p '{lowered.pipeline}'\n{print_module(program.module, aliases=True)}",
                )
            logs.say("explain", str(explanation))
        replayer = None
        if self.options.cuda_graphs and GraphReplayer.replays_on(device):
            parameters = self.parameters.among(args, self.forward)
            constants = range(len(args) - len(self.constants), len(args))
            static = [j for j, i in enumerate(imported.inputs) if i in parameters or i in constants]
            replayer = GraphReplayer(
                program,
                communicator,
                static_inputs=static,
                hand_over=self._saved_only(imported),
                lend=self._parameter_gradients(imported),
                pass_on=self._input_gradients(imported) | self._forward_results(imported),
            )
        return CompiledShapes(imported, program, communicator, replayer, backend, args, arity)

    def _saved_only(self, imported: ImportedGraph) -> set[int]:
        """The program's outputs that the graph returns only as activations saved for the
        backward graph, which lets go of them once it has run: a CUDA-graph replay hands
        them over with no copy (`GraphReplayer`'s `hand_over`). An output that the graph
        also returns to the caller is copied, since the caller may keep it."""
        if self.saved is None:
            return set()
        return _outputs_only_at(imported, range(*self.saved.indices(len(imported.outputs))))

    def _forward_results(self, imported: ImportedGraph) -> set[int]:
        """The program's outputs that a forward graph returns only to the caller, not saved:
        a model's next block takes them at once (in a model compiled block by block, as the
        input of the same forward graph, which reads them in place). A CUDA-graph replay lends
        them (`GraphReplayer`'s `pass_on`): a caller that keeps one where it blocks a replay
        (the last output, kept past the next step) gets copies from then on."""
        if not self.forward:
            return set()
        saved = set(range(*self.saved.indices(len(imported.outputs)))) if self.saved is not None else set()
        return _outputs_only_at(imported, set(range(len(imported.outputs))) - saved)

    def _parameter_gradients(self, imported: ImportedGraph) -> set[int]:
        """The program's outputs that a backward graph returns only as gradients of the
        forward's parameters: autograd's AccumulateGrad takes each as the parameter's `.grad`
        with no copy, and `zero_grad()` lets go of it before the next step, so a CUDA-graph
        replay lends them (`GraphReplayer`'s `lend`) instead of copying up to the size of
        the weights every step."""
        if not self._returns_gradients(imported):
            return set()
        return _outputs_only_at(imported, self.parameters.forward)

    def _input_gradients(self, imported: ImportedGraph) -> set[int]:
        """The program's outputs that a backward graph returns only as gradients of the
        forward's other inputs, the activations it took: the autograd engine hands each to
        the backward of what made that activation, in a model compiled block by block the
        previous block's backward graph, and lets go of it once that has run. A CUDA-graph
        replay lends them (`GraphReplayer`'s `pass_on`), and that graph reads them in place:
        no copy on either side."""
        if not self._returns_gradients(imported):
            return set()
        return _outputs_only_at(imported, set(range(self.parameters.forward_inputs)) - self.parameters.forward)

    def _returns_gradients(self, imported: ImportedGraph) -> bool:
        """Whether this is a backward graph whose outputs are a gradient per input of the
        forward, in their order, as aot_autograd's are."""
        return not self.forward and len(imported.outputs) == self.parameters.forward_inputs


def _outputs_only_at(imported: ImportedGraph, positions: Collection[int]) -> set[int]:
    """The program's outputs that the graph returns at `positions` of its outputs and at no other."""
    outputs = [what[0] if kind == "fusion" else None for kind, what in imported.outputs]
    elsewhere = {index for j, index in enumerate(outputs) if j not in positions}
    return {index for j, index in enumerate(outputs) if j in positions and index is not None} - elsewhere


def _speaks_for(group: dist.ProcessGroup | None) -> bool:
    """Whether this rank says what hostir did with a graph whose collectives name `group`:
    every rank compiles it alike, and the first of its ranks (of the world, for a graph
    without collectives) speaks for all."""
    if not dist.is_initialized():
        return True
    ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
    return dist.get_rank() == min(ranks)


def _warn_at_users_code(message: str, explanation: GraphExplanation) -> None:
    """A `HostirFallbackWarning` located at the line of the user's code the construct comes
    from (where the trace knows it), as a warning of that line would be."""
    place = explanation.place
    if place is None:
        warnings.warn(message, HostirFallbackWarning, stacklevel=3)
    else:
        warnings.warn_explicit(message, HostirFallbackWarning, place.file, place.line)


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
class SavedLayouts:
    """The layouts in which a forward graph hands the activations it saves to its backward
    graph: where it computed one in a layout of its own (`Layout`: the pieces of an
    all-gather of several sequences, say), the backward reads it there, and no copy turns it
    into the FX layout and back.

    A saved activation is known by its place among the saved tensors, its shape and its
    dtype, the same in the forward's outputs and the backward's inputs: aot_autograd passes
    the saved tensors first (after the saved sizes of a graph of symbolic shapes), in
    order, in placeholders named after the forward's nodes, which the backward checks. The first compilation of the forward to hand one
    over decides its layout; later ones, a graph run eagerly included, hand it over in that
    layout too, so that every backward reads what it is given. Only an activation that
    the forward returns to no caller (`_saved_only`) is handed over so."""

    layouts: dict[tuple[int, tuple[int, ...], torch.dtype], tuple[str, Layout | None]] = field(default_factory=dict)
    """(place among the saved tensors, shape, dtype) -> the forward's node name, the layout (None: FX)."""

    @staticmethod
    def _saved(saved: slice | None, items: Sequence[Any]) -> dict[int, tuple[int, tuple[int, ...], torch.dtype]]:
        """Position of each saved tensor among the outputs (FX nodes) -> its key."""
        if saved is None:
            return {}
        keys = {}
        for k, position in enumerate(range(*saved.indices(len(items)))):
            value = items[position].meta.get("val") if isinstance(items[position], torch.fx.Node) else None
            if isinstance(value, torch.Tensor):
                keys[position] = (k, tuple(value.shape), value.dtype)
        return keys

    def of_outputs(self, saved: slice | None, items: Sequence[Any]) -> GraphLayouts:
        """The forward's: a saved tensor that no caller gets may keep the layout of its piece,
        or must keep the layout an earlier compilation chose."""
        keys = self._saved(saved, items)
        returned = {items[p] for p in range(len(items)) if p not in keys and isinstance(items[p], torch.fx.Node)}
        handed = {p: key for p, key in keys.items() if items[p].op != "placeholder" and items[p] not in returned}
        fixed = {p: self.layouts[key][1] for p, key in handed.items() if key in self.layouts}
        return GraphLayouts(outputs=fixed, free_outputs=frozenset(handed.keys() - fixed.keys()))

    def record(self, saved: slice | None, chosen: dict[int, Layout], items: Sequence[Any]) -> None:
        """The layouts a compilation of the forward chose, first come first kept."""
        for position, key in self._saved(saved, items).items():
            self.layouts.setdefault(key, (items[position].name, chosen.get(position)))

    def eager(self, saved: slice | None, layouts: GraphLayouts, items: Sequence[Any]) -> GraphLayouts:
        """What a graph run eagerly must turn: its inputs from their layouts, and its outputs
        into the layouts already chosen for them (the others are recorded as FX)."""
        self.record(saved, {}, items)
        return GraphLayouts(inputs=layouts.inputs, outputs=layouts.outputs)

    def of_inputs(self, gm: torch.fx.GraphModule, args: Sequence[Any]) -> dict[int, Layout]:
        """The backward's: its leading tensor inputs, the saved tensors (after the saved
        sizes of a graph of symbolic shapes, which are no tensors), in their layouts."""
        placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
        tensors = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)]
        layouts = {}
        for k, i in enumerate(tensors):
            name, layout = self.layouts.get((k, tuple(args[i].shape), args[i].dtype), ("", None))
            if layout is None:
                continue
            if placeholders[i].name != name:
                raise HostirError(
                    f"the backward graph's saved tensor #{k} is {placeholders[i].name!r}, where the forward "
                    f"graph handed over {name!r} in a layout of its own: hostir cannot tell what it reads"
                )
            layouts[i] = layout
        return layouts


@dataclass
class Parameters:
    """The parameters of one compiled module, which its forward and backward graphs take
    as arguments at the same address every step: a CUDA graph replay reads them in place
    (`GraphReplayer`'s static inputs), as inductor's CUDA graphs do."""

    forward: frozenset[int] = frozenset()
    """The forward graph's arguments that are parameters and buffers."""
    forward_inputs: int = 0
    """How many arguments the forward graph takes (the backward returns a gradient for each)."""
    storages: set[int] = field(default_factory=set)
    """The addresses of their storages, from the calls of the forward (`record`): a backward
    argument in one of them (a weight's transpose that the forward saved) is a parameter too."""
    backward_compiled: bool = False
    """Whether the backward graph was compiled: until then every call of the training forward
    records where its parameters are. A model compiled block by block calls one forward
    graph with each block's, and the backward, compiled at the first backward call, is the
    last block's: its parameters must be known to be parameters."""

    def record(self, args: Sequence[Any]) -> None:
        """Notes where the forward graph's parameters among `args` are."""
        self.storages.update(args[i].untyped_storage().data_ptr() for i in self.forward if isinstance(args[i], torch.Tensor))

    def among(self, args: Sequence[Any], forward: bool) -> set[int]:
        """The arguments of a call of the forward (`forward`) or backward graph that are parameters."""
        if forward:
            self.record(args)
            return {i for i in self.forward if isinstance(args[i], torch.Tensor)}
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


class HostirBackend:
    """The hostir backend with its options, as torch.compile calls a backend: once per graph
    that dynamo traces."""

    def __init__(self, options: BackendOptions):
        config.check()
        self.options = options
        self._graphs: list[weakref.ref[HostirGraph]] = []

    @property
    def graphs(self) -> list[HostirGraph]:
        """The forward and backward graphs it made that are still in use (dynamo holds them
        while it may call them), in the order it made them."""
        return [graph for reference in self._graphs if (graph := reference()) is not None]

    def reset(self) -> None:
        """What `torch._dynamo.reset()` calls on every backend torch compiled with (`reset_backend`)."""
        reset_backend()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **given: Any) -> Callable[..., Any]:
        if given:
            raise ValueError(
                f"torch.compile gave {' and '.join(sorted(given))} to a hostir.backend(...), which has its "
                "options already: give them to it, as in hostir.backend(mode='reduce-overhead', chunks=2)"
            )
        parameters = Parameters()
        saved_layouts = SavedLayouts()

        def compiler(kind: str):
            def compile_graph(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[[list[Any]], list[Any]]:
                forward = kind == "forward"
                if forward:
                    parameters.forward = _forward_parameters()
                    parameters.forward_inputs = sum(node.op == "placeholder" for node in graph.graph.nodes)
                saved = _saved_for_backward() if forward else None
                made = HostirGraph(graph, _graph_name(kind), self.options, parameters, forward, saved, saved_layouts)
                self._graphs.append(weakref.ref(made))
                # aot_autograd's boxed convention: the arguments come as one list.
                return make_boxed_func(made)

            return compile_graph

        return aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            partition_fn=partition,
            decompositions=KERNEL_DECOMPOSITIONS,
        )(gm, example_inputs)


def reset_backend() -> None:
    """Frees the CUDA graphs that hostir's programs captured, as `torch._dynamo.reset()` frees
    inductor's: dynamo drops its compiled code, but torch's autograd wrappers keep the graphs
    they called alive, and with them each replay's captured graphs and the memory pools that
    hold their buffers. A graph still called later captures again."""
    release_captured_graphs()


def backend(mode: str | None = None, **options: Any) -> HostirBackend:
    """The hostir backend with `options` (the module docstring's), checked here:
    `torch.compile(model, backend=hostir.backend(chunks=2))` refuses an unknown option or
    value at that line, where `backend="hostir", options={...}` can only at the first call."""
    return HostirBackend(BackendOptions.of(options, mode))


def hostir(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None, mode: str | None = None
) -> Callable[..., Any]:
    """The `hostir` backend of torch.compile (registered under that name by the package's entry
    point), which torch calls with the `options` and `mode` given to torch.compile."""
    try:
        backend_options = BackendOptions.of(options, mode)
    except ValueError as error:
        raise ValueError(
            f"{error} (torch hands a backend named by a string its options when it first compiles; "
            "backend=hostir.backend(...) checks them at the torch.compile line)"
        ) from None
    return HostirBackend(backend_options)(gm, example_inputs)


hostir.reset = reset_backend  # what torch._dynamo.reset() calls on the backend named "hostir"
