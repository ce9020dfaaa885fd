"""From an FX graph of ATen ops and functional collectives (one rank's view) to a fusion.

torch.compile with aot_autograd hands a backend the forward and backward graphs of each
rank: ATen ops on that rank's local tensors, and `torch.ops._c10d_functional`
collectives, each followed by `wait_tensor`, on a process group named by a string. The
importer writes the same computation as a fusion whose shapes are global, so that the
passes that hir-opt runs apply unchanged:

* the mesh is the ranks of the process group the collectives name (one device, with no
  collective);
* a tensor that may differ between ranks (every input, everything computed from one) is
  *varying*: its fusion type has the device axis first, `didx` over the mesh, and each
  device's local piece is its FX tensor; a tensor that every rank holds whole (what an
  all-gather or an all-reduce gives, and what is computed from such tensors alone) is
  *replicated* and has no device axis;
* `all_gather_into_tensor` is a `fusion.set` from varying to replicated (an allgather),
  `reduce_scatter_tensor` and `all_reduce` are `fusion.sum`s over the device axis (a
  reduce-scatter, an allreduce), `wait_tensor` is nothing (the host program waits);
* matmuls and the pointwise ops and reductions that the fusion dialect has become those
  ops, with ATen's dtype rules made explicit by casts;
* any other ATen op becomes a `fusion.aten` that calls it on the local pieces
  (`docs/frontend.md` has the table, with the sharding rule of each op).

An FX tensor is its fusion value's piece read in the FX shape (`Value`): views and
reshapes write no op, an all-gather's result keeps the gathered pieces as an axis of
their own (the *chunk* axis: `[D, rows, ...]` for the FX tensor `[D * rows, ...]`)
through the matmuls that read it, and a GEMM that a reduce-scatter reads is computed in
the chunks of its pipeline; that is where `auto-stream-parallel` finds what to
pipeline. An op that needs the FX shape gets a reshape first. All shapes are static:
the backend imports a graph once per set of input shapes.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from xdsl.dialects import func
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, ModuleOp
from xdsl.ir import Block, Operation, Region, SSAValue

from hostir_dialect import fusion
from hostir_dialect.aten_call import CARRIERS, NotEncodable, carried, encode_call
from hostir_dialect.builder import TORCH_DTYPES, element_type, scalar_attr, torch_dtype
from hostir_dialect.fusion import DIDX, SERIAL, Causal, DeviceMeshAttr, TensorType
from hostir_dialect.text import HostirError
from hostir.frontend.fx_rewrites import complex_dtype
from hostir.passes.analysis.cost_model import ChunksOf, OverlapProblem, one_chunk

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


class UnsupportedGraph(HostirError):
    """A construct of the graph that hostir cannot run; the message names it, and `node` is the
    FX node that holds it (None where no one node does), `group` the process group the graph's
    collectives name (None: none, or several)."""

    def __init__(self, message: str, node: torch.fx.Node | None = None, group: dist.ProcessGroup | None = None):
        super().__init__(message)
        self.node = node
        self.group = group


# --------------------------------------------------------------------------- #
# Values                                                                       #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Value:
    """The fusion value that holds an FX tensor.

    A device's piece of the fusion value has the shape `local` (None: the FX shape), and
    the FX tensor is that piece, its axes permuted by `order` (None: as they are), then
    reshaped: an all-gather keeps its pieces as an axis of their own, a product that a
    reduce-scatter reads is computed in the chunks of the reduce-scatter's pipeline, the
    sequence pieces of a batch stay apart (`order`), and FX views and reshapes change
    `shape` alone.
    """

    ssa: SSAValue
    shape: tuple[int, ...]
    dtype: torch.dtype
    varying: bool
    local: tuple[int, ...] | None = None
    order: tuple[int, ...] | None = None

    @property
    def local_shape(self) -> tuple[int, ...]:
        """The shape of a device's piece in the fusion."""
        return self.shape if self.local is None else self.local

    @property
    def is_flat(self) -> bool:
        return self.local_shape == self.shape and self.order is None

    @property
    def keeps_last_axis(self) -> bool:
        """Whether the piece's last axis is the FX tensor's last axis."""
        last = len(self.local_shape) - 1
        return self.local_shape[-1:] == self.shape[-1:] and (self.order is None or self.order[-1] == last)

    def reshaped(self, shape: tuple[int, ...]) -> Value:
        """The same piece, read as an FX tensor of `shape` (a view or a reshape of it)."""
        return Value(self.ssa, shape, self.dtype, self.varying, self.local_shape, self.order)

    @property
    def layout(self) -> Layout | None:
        """How the FX tensor lies in the piece, where it is not the FX layout itself."""
        return None if self.order is None else Layout(self.local_shape, self.order)


@dataclass(frozen=True)
class Layout:
    """A tensor held as a piece of shape `local` whose axes, permuted by `order`, then
    reshaped, are the FX tensor (a `Value`'s `local` and `order`).

    A forward graph hands the backward graph the activations it saves in the layout in
    which it computed them (`GraphLayouts`): the pieces of an all-gather of several
    sequences, say, which the FX layout would interleave, and the backward reads again in
    the pieces' order, by a copy each way."""

    local: tuple[int, ...]
    order: tuple[int, ...]

    @property
    def permuted(self) -> tuple[int, ...]:
        """The piece's shape with its axes permuted: the FX tensor's, before the reshape."""
        return tuple(self.local[axis] for axis in self.order)

    def to_fx(self, held: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        """The FX tensor of `shape` that `held` holds in this layout (its elements in the
        piece's order): a copy."""
        return held.reshape(self.local).permute(self.order).reshape(shape)

    def from_fx(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` held in this layout, in its own shape (its elements in the piece's order): a copy."""
        back = [self.order.index(axis) for axis in range(len(self.order))]
        return tensor.reshape(self.permuted).permute(back).contiguous().reshape(tensor.shape)


@dataclass(frozen=True)
class GraphLayouts:
    """The layouts of a graph's tensors where they are not the FX layout: the graph's
    inputs that hold pieces (`inputs`, by placeholder), and its outputs that may be handed
    on in the layout of their piece (`free_outputs`, by position in the output) or must be
    in a given one (`outputs`, None for the FX layout)."""

    inputs: dict[int, Layout] = field(default_factory=dict)
    outputs: dict[int, Layout | None] = field(default_factory=dict)
    free_outputs: frozenset[int] = frozenset()


@dataclass(frozen=True)
class LayoutValue:
    """What a sequence laid out over the mesh in `layout` gives a rank with `rows` rows of it:
    "queries", the positions of its rows; "keys", those of every rank's rows in mesh order;
    "mask", the causal mask of the first against the second, broadcast to `batch` leading
    axes (efficient attention's bias is expanded to `[batch, heads, rows, keys]`), a float
    mask holding 0 where a key is seen and `hidden` where it is not."""

    kind: str
    rows: int
    layout: Causal
    batch: tuple[int, ...] = ()
    hidden: float = -math.inf


@dataclass
class ImportedGraph:
    """A graph's fusion, and how the graph's inputs and outputs map to the fusion's."""

    module: ModuleOp
    inputs: list[int]
    """For each fusion input, the index of the graph input it is."""
    input_varying: list[bool]
    outputs: list[tuple[str, Any]]
    """For each graph output: ("fusion", (index, FX shape, dtype)), ("input", index), ("constant",
    value), or ("layout", (LayoutValue, dtype)): a value that the layout fixes (the causal mask,
    the key positions), which the program does not compute (the backend makes it once)."""
    mesh: tuple[int, ...]
    group: dist.ProcessGroup | None = None
    """The process group the graph's collectives name, whose ranks are the mesh; None without collectives."""
    chunked: dict[str, tuple[OverlapProblem, int]] = field(default_factory=dict)
    """The problem and the chunk count of each reduce-scatter or all-reduce of GEMMs cut into
    chunks, by the name of its FX node (`hostir.explain` reports them)."""
    input_pieces: list[tuple[int, ...] | None] = field(default_factory=list)
    """For each fusion input, the shape to read the graph input as (a piece of a `Layout`), or None."""
    output_layouts: dict[int, Layout] = field(default_factory=dict)
    """The graph outputs (by position) that the fusion returns as pieces of a layout of their own."""
    layout_inputs: list[tuple[int, LayoutValue]] = field(default_factory=list)
    """The graph inputs (by index) that an attention's mask was read from as the causal mask of
    the sequence's layout (`sequence_layout`), and what each holds: their values must be that
    layout's, at every run."""


def chunked_shape(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with its first axis cut into `chunks` and the rows of each."""
    return (*chunks, shape[0] // math.prod(chunks), *shape[1:])


def inserted_axes(shape: tuple[int, ...], reshaped: tuple[int, ...]) -> list[int] | None:
    """The axes of `reshaped` that are extent-1 axes put in among those of `shape`, where that
    is all the reshape does (`[16, 64]` to `[1, 16, 64]`: `[0]`); None for any other."""
    if len(reshaped) <= len(shape):
        return None
    inserted, kept = [], 0
    for axis, extent in enumerate(reshaped):
        if kept < len(shape) and extent == shape[kept]:
            kept += 1
        elif extent == 1:
            inserted.append(axis)
        else:
            return None
    return inserted if kept == len(shape) else None


def dtype_supported(dtype: torch.dtype) -> bool:
    return dtype in TORCH_DTYPES


class Importer:
    """Imports one graph; see the module docstring."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        chunks_of: ChunksOf,
        layouts: GraphLayouts = GraphLayouts(),
        sequence_layout: Causal | None = None,
    ):
        self.gm = gm
        self.name = name
        self.chunks_of = chunks_of
        self.layouts = layouts
        self.sequence_layout = sequence_layout
        """How a sequence is laid out over the mesh, by the backend's option: an attention whose
        mask is the causal mask of its tokens' positions then has that layout's causal mask."""
        self.layout_inputs: list[tuple[int, LayoutValue]] = []
        self.layout_values: dict[torch.fx.Node, LayoutValue] = {}
        """The values computed in the graph that the layout fixes (`sequence_layout`): its causal
        mask, and the key positions gathered from the queries'."""
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.collective_chunks: dict[torch.fx.Node, tuple[OverlapProblem, int]] = {}
        """The problem and the chunk count of each reduce-scatter or all-reduce that reads
        chunked GEMMs."""
        self.flattened: dict[tuple[SSAValue, tuple[int, ...], tuple[int, ...] | None], Value] = {}
        """The FX-shaped copy of each value that a reader needed flat."""
        self.group, self.mesh = self._group()
        self.devices = len(self.mesh)
        self.block = Block()
        self.values: dict[torch.fx.Node, Any] = {}
        self.values_returned: list[SSAValue] = []

    # -- the mesh ------------------------------------------------------------- #

    def _group(self) -> tuple[dist.ProcessGroup | None, tuple[int, ...]]:
        """The one process group that the graph's collectives name, and its ranks (the
        mesh); None and a mesh of device 0 if the graph has no collective."""
        groups = {}
        for node in self.gm.graph.nodes:
            if node.op == "call_function" and node.target in COLLECTIVES:
                name = node.args[COLLECTIVES[node.target]]
                groups.setdefault(name, node)
        if not groups:
            return None, (0,)
        resolved = {name: _resolve_group(name, node) for name, node in groups.items()}
        if len(groups) > 1:
            second = list(groups.values())[1]
            raise UnsupportedGraph(
                f"{second.format_node()}: the graph communicates over several process groups ("
                + ", ".join(f"group {name!r} of ranks {list(ranks)}" for name, (_, ranks) in resolved.items())
                + "); hostir maps one group, the mesh of the graph, so a graph whose collectives "
                "run over two axes of a device mesh (tensor parallel with data or context parallel "
                "in one graph) is not supported",
                second,
            )
        (group_and_ranks,) = resolved.values()
        return group_and_ranks

    # -- types ------------------------------------------------------------------ #

    def tensor_type(self, local_shape: Sequence[int], dtype: torch.dtype, varying: bool) -> TensorType:
        local_shape, dtype = carried(local_shape, dtype)  # complex: its real pairs (`complex_as_real_pairs`)
        if not dtype_supported(dtype):
            raise UnsupportedGraph(f"tensors of dtype {dtype} are not supported")
        shape = [self.devices, *local_shape] if varying else list(local_shape)
        axes = [DIDX, *[SERIAL] * len(local_shape)] if varying else [SERIAL] * len(local_shape)
        return TensorType(shape, element_type(dtype), mesh=DeviceMeshAttr(self.mesh), axes=axes)

    def varies(self, *values: Value) -> bool:
        return self.devices > 1 and any(v.varying for v in values)

    def emit(self, op: Operation) -> Operation:
        self.block.add_op(op)
        return op

    # -- the walk --------------------------------------------------------------- #

    def run(self) -> ImportedGraph:
        inputs: list[int] = []
        input_varying: list[bool] = []
        input_pieces: list[tuple[int, ...] | None] = []
        placeholders = self.placeholders
        for index, node in enumerate(placeholders):
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                varying = self.devices > 1
                layout = self.layouts.inputs.get(index)
                local = tuple(value.shape) if layout is None else layout.local
                with self.naming(node):
                    type = self.tensor_type(local, value.dtype, varying)
                argument = self.block.insert_arg(type, len(self.block.args))
                argument.name_hint = name_of(node)
                self.values[node] = (
                    Value(argument, tuple(value.shape), value.dtype, varying)
                    if layout is None
                    else Value(argument, tuple(value.shape), value.dtype, varying, layout.local, layout.order)
                )
                inputs.append(index)
                input_varying.append(varying)
                input_pieces.append(None if layout is None else layout.local)
            else:
                # A symbolic size of a graph traced with dynamic shapes: this compilation's value.
                self.values[node] = concrete(value)
        outputs: list[tuple[str, Any]] = []
        for node in self.gm.graph.nodes:
            with self.naming(node):
                if node.op == "call_function":
                    self.values[node] = self.call(node)
                elif node.op == "output":
                    outputs = self.output(node, placeholders)
                elif node.op != "placeholder":
                    raise UnsupportedGraph(f"FX nodes of kind {node.op!r} are not supported")
        self.emit(func.ReturnOp(*self.values_returned))
        function = func.FuncOp(
            self.name,
            ([a.type for a in self.block.args], [v.type for v in self.values_returned]),
            Region(self.block),
        )
        chunked = {node.name: chosen for node, chosen in self.collective_chunks.items()}
        return ImportedGraph(
            ModuleOp([function]),
            inputs,
            input_varying,
            outputs,
            self.mesh,
            self.group,
            chunked,
            input_pieces,
            self.output_layouts,
            self.layout_inputs,
        )

    @contextmanager
    def naming(self, node: torch.fx.Node) -> Iterator[None]:
        """Within: what hostir cannot run is said of `node`, which holds it: the message names
        the node, and so its op, and the error carries it."""
        try:
            yield
        except UnsupportedGraph as error:
            described = node.format_node()
            named = error.message if error.message.startswith(described) else f"{described}: {error.message}"
            raise UnsupportedGraph(named, node, self.group) from None

    def output(self, node: torch.fx.Node, placeholders: list[torch.fx.Node]) -> list[tuple[str, Any]]:
        """The plan of the graph's outputs; the values of the fusion's, each in the FX layout
        but where `layouts` lets or makes it keep a layout of its own (`output_layouts`)."""
        plan: list[tuple[str, Any]] = []
        self.output_layouts: dict[int, Layout] = {}
        for position, item in enumerate(node.args[0]):
            if isinstance(item, torch.fx.Node) and item.op == "placeholder":
                plan.append(("input", placeholders.index(item)))
                continue
            if item in self.layout_values:  # a mask or the key positions, saved for the backward
                plan.append(("layout", (self.layout_values[item], item.meta["val"].dtype)))
                continue
            value = self.values[item] if isinstance(item, torch.fx.Node) else item
            if isinstance(value, Value):
                if position in self.layouts.outputs:
                    layout = self.layouts.outputs[position]
                elif position in self.layouts.free_outputs:
                    layout = value.layout
                else:
                    layout = None
                value = self.in_layout(value, layout)
                if layout is not None:
                    self.output_layouts[position] = layout
                plan.append(("fusion", (len(self.values_returned), value.shape, value.dtype)))
                self.values_returned.append(value.ssa)
            else:
                plan.append(("constant", value))
        return plan

    def call(self, node: torch.fx.Node) -> Any:
        if node.target is operator.getitem:
            results, index = node.args
            return self.values[results][index]
        result = node.meta.get("val")
        if not isinstance(result, (torch.Tensor, tuple, list)):
            # Shape arithmetic of a graph traced with dynamic shapes: this compilation's
            # shapes are known, so its value is too.
            return concrete(result)
        complex_dtypes = {complex_dtype(n) for n in (node, *node.all_input_nodes)} - {None}
        if complex_dtypes and node.target not in PAIR_VIEWS:
            raise UnsupportedGraph(
                f"tensors of dtype {complex_dtypes.pop()} are not supported by this op: hostir computes with "
                "complex tensors on their real and imaginary parts, and has no such form of it"
            )
        rule = RULES.get(node.target)
        if rule is not None:
            result = rule(self, node)
            if result is not None:
                return result
        return self.opaque(node)

    # -- operands ------------------------------------------------------------------ #

    def arg(self, node_or_value: Any) -> Any:
        return self.values[node_or_value] if isinstance(node_or_value, torch.fx.Node) else node_or_value

    def flat(self, value: Value) -> Value:
        """`value` in the FX shape: a piece of another shape is reshaped (each device its own),
        once per value and shape. The piece of a widening cast is the cast of its operand's
        piece reshaped: the reshape of a value a kernel computes is a copy of it in memory,
        where the reshape of the operand is a view of it if it is in memory (a GEMM's product,
        an input) or a copy of fewer bytes, and the cast joins the kernel that reads it (a bf16
        product read in f32 in the FX shape, as rotary embeddings read the queries and keys)."""
        if value.is_flat:
            return value
        key = (value.ssa, value.shape, value.order)
        if key not in self.flattened:
            cast = value.ssa.owner
            dtype = torch_dtype(fusion.tensor_type(cast.input).element_type) if isinstance(cast, fusion.CastOp) else None
            if dtype is not None and value.order is None and dtype.itemsize < value.dtype.itemsize:
                source = Value(cast.input, value.shape, dtype, value.varying, value.local)
                self.flattened[key] = self.cast(self.flat(source), value.dtype)
            else:
                self.flattened[key] = self.with_piece(value, value.shape)
        return self.flattened[key]

    def in_layout(self, value: Value, layout: Layout | None) -> Value:
        """`value` held as a piece of `layout` (None: the FX layout): as it is where it is
        held so, else a copy (its FX tensor read in the layout's permuted shape, permuted back)."""
        if layout is None:
            return self.flat(value)
        if value.layout == layout:
            return value
        fx = self.with_piece(self.flat(value), layout.permuted)
        back = [layout.order.index(axis) for axis in range(len(layout.order))]
        piece = self.aten_view("aten.permute.default", fx.ssa, back, layout.local, value)
        return Value(piece, value.shape, value.dtype, value.varying, layout.local, layout.order)

    def rechunked(self, value: Value, chunks: tuple[int, ...]) -> Value:
        """`value` (flat) with its first axis cut into `chunks` (each device its piece)."""
        return self.with_piece(value, chunked_shape(value.shape, chunks))

    def with_piece(self, value: Value, local: tuple[int, ...]) -> Value:
        """`value` with each device's piece reshaped to `local` (a view at run time), its
        axes permuted first where the value has an `order` (a copy). A reshape that only
        puts extent-1 axes in is a `fusion.broadcast`, which a kernel computes with the ops
        around it, where an ATen reshape would cut their kernel in two (RMSNorm's backward
        reads its incoming gradient with the batch axis put back)."""
        inserted = inserted_axes(value.local_shape, local)
        if value.order is None and inserted is not None:
            piece = self.with_unit_axes(value, inserted, local)
            return Value(piece, value.shape, value.dtype, value.varying, local)
        piece = value.ssa
        if value.order is not None:
            permuted = tuple(value.local_shape[axis] for axis in value.order)
            piece = self.aten_view("aten.permute.default", piece, list(value.order), permuted, value)
        piece = self.aten_view("aten.reshape.default", piece, list(local), local, value)
        return Value(piece, value.shape, value.dtype, value.varying, local)

    def regrouped(self, value: Value, shape: tuple[int, ...], size: int, dim: int) -> Value:
        """`value` (flat) read in `shape`, axis `dim` cut into pieces of `size` and the
        pieces' axis moved first (a view): the piece of a product whose rows a
        reduce-scatter regroups (sequence parallelism with several sequences); the FX
        tensor is that piece permuted back (`order`)."""
        fine = cut(shape, dim, size)
        permutation = (dim, *(axis for axis in range(len(fine)) if axis != dim))
        local = tuple(fine[axis] for axis in permutation)
        viewed = self.with_piece(value, fine)
        piece = self.aten_view("aten.permute.default", viewed.ssa, list(permutation), local, value)
        order = tuple(permutation.index(axis) for axis in range(len(permutation)))
        return Value(piece, value.shape, value.dtype, value.varying, local, order)

    def aten_view(
        self, target: str, piece: SSAValue, argument: list[int] | None, local: tuple[int, ...], like: Value
    ) -> SSAValue:
        """The ATen view `target` of each device's `piece` (with `argument`, if any): a piece of
        shape `local` of `like`'s dtype and variance."""
        arguments = [piece] if argument is None else [piece, argument]
        return self.call_aten(target, arguments, {}, [piece], local, like.dtype, like.varying)

    def call_aten(
        self,
        target: str,
        args: list[Any],
        kwargs: dict[str, Any],
        operands: list[SSAValue],
        local: tuple[int, ...],
        dtype: torch.dtype,
        varying: bool,
    ) -> SSAValue:
        """A `fusion.aten` of `target` whose one result is a piece of shape `local`; `operands`
        are the values among `args` and `kwargs` that stand for tensors."""
        call = encode_call(args, kwargs, lambda v: operands.index(v) if any(v is o for o in operands) else None)
        op = self.emit(fusion.AtenOp(target, call, operands, [self.tensor_type(local, dtype, varying)]))
        return op.results[0]

    def aligned(self, value: Value, rank: int, dtype: torch.dtype | None = None) -> SSAValue:
        """`value` with extent-1 axes after its device axis, so that a varying value's device
        axis meets the device axis of a result of local rank `rank` under broadcasting; cast
        to `dtype` after, if given (a kernel's iteration space then holds the cast too: a
        varying weight cast before its broadcast does not broadcast with the activations)."""
        local_rank = len(value.local_shape)
        if value.varying and self.devices > 1 and local_rank < rank:
            value = self.with_leading_axes(value, rank - local_rank)
        return (value if dtype is None else self.cast(value, dtype)).ssa

    def with_leading_axes(self, value: Value, count: int) -> Value:
        """The piece of `value` with `count` extent-1 axes in front of its own (after the device
        axis of a varying value): a value of the piece's shape."""
        local = (1,) * count + value.local_shape
        return Value(self.with_unit_axes(value, list(range(count)), local), local, value.dtype, value.varying)

    def with_unit_axes(self, value: Value, axes: list[int], local: tuple[int, ...]) -> SSAValue:
        """The piece of `value` with extent-1 axes at `axes` of the result's piece `local`
        (after the device axis of a varying value), a `fusion.broadcast`, which moves no data."""
        offset = 1 if value.varying else 0
        result_type = self.tensor_type(local, value.dtype, value.varying)
        return self.emit(fusion.BroadcastOp(value.ssa, [offset + axis for axis in axes], result_type)).results[0]

    def cast(self, value: Value, dtype: torch.dtype) -> Value:
        if value.dtype == dtype:
            return value
        result_type = self.tensor_type(value.local_shape, dtype, value.varying)
        op = self.emit(fusion.CastOp(value.ssa, result_type))
        return Value(op.results[0], value.shape, dtype, value.varying, value.local, value.order)

    def scalar(self, number: int | float | bool, dtype: torch.dtype) -> Value:
        result_type = self.tensor_type((), dtype, False)
        attr: FloatAttr | IntegerAttr = scalar_attr(number, result_type.element_type)
        op = self.emit(fusion.ConstantOp(attr, result_type))
        return Value(op.results[0], (), dtype, False)

    # -- opaque ops ----------------------------------------------------------------- #

    def opaque(self, node: torch.fx.Node) -> Any:
        """A `fusion.aten` of the node's overload on the local pieces."""
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
            raise UnsupportedGraph(f"{node.format_node()}: {target} is not an ATen operator")
        if target in STORAGE_LAYOUT_OPS:
            raise UnsupportedGraph(
                f"{node.format_node()}: {target} reads its operand's memory layout, which in hostir's "
                "buffers differs from eager's"
            )
        operands: list[Value] = []

        def operand(value: Any) -> int | None:
            if not isinstance(value, Value):
                return None
            flat = self.flat(value)
            for i, known in enumerate(operands):
                if known.ssa is flat.ssa:
                    return i
            operands.append(flat)
            return len(operands) - 1

        def carried_dtype(index: int) -> torch.dtype | None:
            dtype = operands[index].dtype
            return dtype if dtype in CARRIERS else None

        def resolve(item: Any) -> Any:
            if isinstance(item, torch.fx.Node):
                return self.values[item]
            if isinstance(item, (list, tuple)):
                return [resolve(i) for i in item]
            return item

        args = [resolve(a) for a in node.args]
        kwargs = {k: resolve(v) for k, v in node.kwargs.items()}
        try:
            call = encode_call(args, kwargs, operand, carried_dtype)
        except NotEncodable as error:
            raise UnsupportedGraph(f"{node.format_node()}: {error}") from None
        results = node.meta.get("val")
        many = isinstance(results, (tuple, list))
        result_list = list(results) if many else [results]
        varying = self.varies(*operands)
        returns = [i for i, r in enumerate(result_list) if isinstance(r, torch.Tensor)]
        op = self.emit(
            fusion.AtenOp(
                f"{target.namespace}.{target._opname}.{target._overloadname}",
                call,
                [v.ssa for v in operands],
                [self.tensor_type(tuple(result_list[i].shape), result_list[i].dtype, varying) for i in returns],
                returns if returns != list(range(len(result_list))) else None,
            )
        )
        tensors = iter(op.results)
        values = [
            Value(next(tensors), tuple(r.shape), r.dtype, varying) if isinstance(r, torch.Tensor) else concrete(r)
            for r in result_list
        ]
        for value in values:
            if isinstance(value, Value):
                value.ssa.name_hint = name_of(node)
        return values if many else values[0]


def _resolve_group(name: str, node: torch.fx.Node) -> tuple[dist.ProcessGroup, tuple[int, ...]]:
    """The process group that a collective of the graph names, and its ranks."""
    try:
        group = torch.distributed.distributed_c10d._resolve_process_group(name)
        return group, tuple(dist.get_process_group_ranks(group))
    except Exception as error:  # noqa: BLE001 - torch raises several kinds here
        raise UnsupportedGraph(
            f"{node.format_node()}: the process group {name!r} is not one this process belongs to ({error})", node
        ) from None


PAIR_VIEWS = (aten.view_as_real.default, aten.view_as_complex.default)
"""The ops that read or make complex tensors in a graph that the importer maps: a complex tensor
is held as its real pairs (`complex_as_real_pairs`), so these are the same piece, no op."""

STORAGE_LAYOUT_OPS = {aten.as_strided.default, aten.as_strided_scatter.default, aten._reshape_alias.default}
"""Ops whose values depend on the strides and offset of their operand's storage."""


def concrete(value: Any) -> Any:
    """A non-tensor result (an int of flash attention, say) as the value it has in this graph."""
    if isinstance(value, torch.SymInt):
        return int(value)
    return value


def name_of(node: torch.fx.Node) -> str:
    return node.name if node.name.isidentifier() else "v"


# --------------------------------------------------------------------------- #
# Rules: the ops the fusion dialect models (registered by frontend/rules/)    #
# --------------------------------------------------------------------------- #

Rule = Callable[[Importer, torch.fx.Node], Any]
RULES: dict[Any, Rule] = {}
"""The rule of each ATen op or collective the fusion dialect models, registered with `rule`
by the modules of `hostir.frontend.rules`; a rule returns None where ATen's semantics
differ from the fusion op's, and the op becomes a `fusion.aten`."""

COLLECTIVES = {
    c10d.all_gather_into_tensor.default: 2,
    c10d.reduce_scatter_tensor.default: 3,
    c10d.all_reduce.default: 2,
}
"""The functional collectives the importer maps, with the position of their group name."""


def rule(*targets: Any) -> Callable[[Rule], Rule]:
    def register(function: Rule) -> Rule:
        for target in targets:
            RULES[target] = function
        return function

    return register


def result_of(node: torch.fx.Node) -> torch.Tensor:
    return node.meta["val"]


def cut(shape: tuple[int, ...], dim: int, size: int) -> tuple[int, ...]:
    """`shape` with axis `dim` cut into (pieces, `size`): what `split(x, size, dim)` reads."""
    return (*shape[:dim], shape[dim] // size, size, *shape[dim + 1 :])


def import_graph(
    gm: torch.fx.GraphModule,
    name: str = "graph",
    chunks_of: ChunksOf = one_chunk,
    layouts: GraphLayouts = GraphLayouts(),
    sequence_layout: Causal | None = None,
) -> ImportedGraph:
    """The fusion of `gm`, whose nodes carry concrete `meta['val']`s (FakeTensorProp), its
    inputs and outputs in the layouts `layouts` gives (the FX layout elsewhere)."""
    return Importer(gm, name, chunks_of, layouts, sequence_layout).run()
