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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch._prims_common import get_computation_dtype
from xdsl.dialects import func
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, ModuleOp
from xdsl.ir import Block, Operation, Region, SSAValue

from hostir_dialect import fusion
from hostir_dialect.builder import TORCH_DTYPES, element_type, scalar_attr
from hostir_dialect.fusion import DIDX, SERIAL, DeviceMeshAttr, TensorType
from hostir_dialect.text import HostirError
from hostir.runtime.aten_calls import CARRIERS, NotEncodable, encode_call
from hostir.runtime.cost_model import OverlapKind, OverlapProblem

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


class UnsupportedGraph(HostirError):
    """A construct of the graph that hostir cannot run; the message names it."""


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


@dataclass
class ImportedGraph:
    """A graph's fusion, and how the graph's inputs and outputs map to the fusion's."""

    module: ModuleOp
    inputs: list[int]
    """For each fusion input, the index of the graph input it is."""
    input_varying: list[bool]
    outputs: list[tuple[str, Any]]
    """For each graph output: ("fusion", (index, FX shape, dtype)), ("input", index) or ("constant", value)."""
    mesh: tuple[int, ...]
    group: dist.ProcessGroup | None = None
    """The process group the graph's collectives name, whose ranks are the mesh; None without collectives."""


def chunked_shape(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with its first axis cut into `chunks` and the rows of each."""
    return (*chunks, shape[0] // math.prod(chunks), *shape[1:])


def _dtype_supported(dtype: torch.dtype) -> bool:
    return dtype in TORCH_DTYPES


ChunksOf = Callable[[OverlapProblem], int]
"""`chunks_of(problem)`: how many chunks to cut a GEMM+reduce-scatter or GEMM+allreduce
into, the problem in the cost model's terms (global extents)."""


def one_chunk(problem: OverlapProblem) -> int:
    return 1


class Importer:
    """Imports one graph; see the module docstring."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, chunks_of: ChunksOf):
        self.gm = gm
        self.name = name
        self.chunks_of = chunks_of
        self.collective_chunks: dict[torch.fx.Node, int] = {}
        """The chunk count of each reduce-scatter or all-reduce that reads chunked GEMMs."""
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
        if len(groups) > 1:
            raise UnsupportedGraph(
                "the graph communicates over several process groups ("
                + ", ".join(repr(g) for g in groups)
                + "); hostir maps one group, the mesh of the graph, so a 2-D device mesh "
                "(tensor and data parallel in one graph) is not supported"
            )
        (name,) = groups
        try:
            group = torch.distributed.distributed_c10d._resolve_process_group(name)
            ranks = tuple(dist.get_process_group_ranks(group))
        except Exception as error:  # noqa: BLE001 - torch raises several kinds here
            raise UnsupportedGraph(
                f"{groups[name].format_node()}: the process group {name!r} is not one this "
                f"process belongs to ({error})"
            ) from None
        return group, ranks

    # -- types ------------------------------------------------------------------ #

    def tensor_type(self, local_shape: Sequence[int], dtype: torch.dtype, varying: bool) -> TensorType:
        dtype = CARRIERS.get(dtype, dtype)
        if not _dtype_supported(dtype):
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
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for index, node in enumerate(placeholders):
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                varying = self.devices > 1
                argument = self.block.insert_arg(
                    self.tensor_type(tuple(value.shape), value.dtype, varying), len(self.block.args)
                )
                argument.name_hint = _name(node)
                self.values[node] = Value(argument, tuple(value.shape), value.dtype, varying)
                inputs.append(index)
                input_varying.append(varying)
            else:
                # A symbolic size of a graph traced with dynamic shapes: this compilation's value.
                self.values[node] = _concrete(value)
        outputs: list[tuple[str, Any]] = []
        for node in self.gm.graph.nodes:
            if node.op == "call_function":
                self.values[node] = self.call(node)
            elif node.op == "output":
                outputs = self.output(node, placeholders)
            elif node.op != "placeholder":
                raise UnsupportedGraph(f"{node.format_node()}: FX nodes of kind {node.op!r} are not supported")
        self.emit(func.ReturnOp(*self.values_returned))
        function = func.FuncOp(
            self.name,
            ([a.type for a in self.block.args], [v.type for v in self.values_returned]),
            Region(self.block),
        )
        return ImportedGraph(ModuleOp([function]), inputs, input_varying, outputs, self.mesh, self.group)

    def output(self, node: torch.fx.Node, placeholders: list[torch.fx.Node]) -> list[tuple[str, Any]]:
        plan: list[tuple[str, Any]] = []
        for item in node.args[0]:
            if isinstance(item, torch.fx.Node) and item.op == "placeholder":
                plan.append(("input", placeholders.index(item)))
                continue
            value = self.values[item] if isinstance(item, torch.fx.Node) else item
            if isinstance(value, Value):
                if value.order is not None:
                    value = self.flat(value)
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
            return _concrete(result)
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
        once per value and shape."""
        if value.is_flat:
            return value
        key = (value.ssa, value.shape, value.order)
        if key not in self.flattened:
            self.flattened[key] = self.with_piece(value, value.shape)
        return self.flattened[key]

    def rechunked(self, value: Value, chunks: tuple[int, ...]) -> Value:
        """`value` (flat) with its first axis cut into `chunks` (each device its piece)."""
        return self.with_piece(value, chunked_shape(value.shape, chunks))

    def with_piece(self, value: Value, local: tuple[int, ...]) -> Value:
        """`value` with each device's piece reshaped to `local` (a view at run time), its
        axes permuted first where the value has an `order` (a copy)."""
        piece = value.ssa
        if value.order is not None:
            permuted = tuple(value.local_shape[axis] for axis in value.order)
            piece = self._aten_view("aten.permute.default", piece, list(value.order), permuted, value)
        piece = self._aten_view("aten.reshape.default", piece, list(local), local, value)
        return Value(piece, value.shape, value.dtype, value.varying, local)

    def regrouped(self, value: Value, shape: tuple[int, ...], size: int, dim: int) -> Value:
        """`value` (flat) read in `shape`, axis `dim` cut into pieces of `size` and the
        pieces' axis moved first (a view): the piece of a product whose rows a
        reduce-scatter regroups (sequence parallelism with several sequences); the FX
        tensor is that piece permuted back (`order`)."""
        fine = _cut(shape, dim, size)
        permutation = (dim, *(axis for axis in range(len(fine)) if axis != dim))
        local = tuple(fine[axis] for axis in permutation)
        viewed = self.with_piece(value, fine)
        piece = self._aten_view("aten.permute.default", viewed.ssa, list(permutation), local, value)
        order = tuple(permutation.index(axis) for axis in range(len(permutation)))
        return Value(piece, value.shape, value.dtype, value.varying, local, order)

    def _aten_view(self, target: str, piece: SSAValue, argument: list[int], local: tuple[int, ...], like: Value) -> SSAValue:
        call = encode_call([piece, argument], {}, lambda v: 0 if v is piece else None)
        op = self.emit(fusion.AtenOp(target, call, [piece], [self.tensor_type(local, like.dtype, like.varying)]))
        return op.results[0]

    def pipeline_chunks(self, node: torch.fx.Node, lhs: Value, rhs: Value) -> tuple[int, ...]:
        """The chunks of the rows of a matmul whose one reader is a reduce-scatter over the
        mesh (the destination devices, then the pipeline's chunks of each) or an
        all-reduce (the pipeline's chunks), as `chunks_of` chooses them."""
        collective = _collective_reader(node)
        if collective is None:
            return ()
        rows, devices = node.meta["val"].shape[0], self.devices
        kind = (
            OverlapKind.MATMUL_REDUCE_SCATTER
            if collective.target is c10d.reduce_scatter_tensor.default
            else OverlapKind.MATMUL_ALLREDUCE
        )
        if collective not in self.collective_chunks:
            # The GEMMs whose sum a collective reads are cut alike; the first one met
            # stands for them in the cost model.
            problem = OverlapProblem(kind, rows, lhs.shape[-1] * devices, rhs.shape[-1], devices, lhs.dtype.itemsize)
            self.collective_chunks[collective] = self.chunks_of(problem)
        chunks = self.collective_chunks[collective]
        if kind is OverlapKind.MATMUL_ALLREDUCE:
            return (chunks,) if chunks > 1 and rows % chunks == 0 else ()
        if rows % devices:
            return ()
        if chunks <= 1 or (rows // devices) % chunks:
            return (devices,)
        return (devices, chunks)

    def aligned(self, value: Value, rank: int) -> SSAValue:
        """`value` with extent-1 axes after its device axis, so that a varying value's device
        axis meets the device axis of a result of local rank `rank` under broadcasting."""
        local_rank = len(value.local_shape)
        if not (value.varying and self.devices > 1) or local_rank >= rank:
            return value.ssa
        new_axes = list(range(1, 1 + rank - local_rank))
        result_type = self.tensor_type((1,) * len(new_axes) + value.local_shape, value.dtype, True)
        return self.emit(fusion.BroadcastOp(value.ssa, new_axes, result_type)).results[0]

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
            Value(next(tensors), tuple(r.shape), r.dtype, varying) if isinstance(r, torch.Tensor) else _concrete(r)
            for r in result_list
        ]
        for value in values:
            if isinstance(value, Value):
                value.ssa.name_hint = _name(node)
        return values if many else values[0]


STORAGE_LAYOUT_OPS = {aten.as_strided.default, aten.as_strided_scatter.default, aten._reshape_alias.default}
"""Ops whose values depend on the strides and offset of their operand's storage."""


def _concrete(value: Any) -> Any:
    """A non-tensor result (an int of flash attention, say) as the value it has in this graph."""
    if isinstance(value, torch.SymInt):
        return int(value)
    return value


def _name(node: torch.fx.Node) -> str:
    return node.name if node.name.isidentifier() else "v"


# --------------------------------------------------------------------------- #
# Rules: ATen ops and collectives the fusion dialect models                    #
# --------------------------------------------------------------------------- #

Rule = Callable[[Importer, torch.fx.Node], Any]
RULES: dict[Any, Rule] = {}

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


def _result(node: torch.fx.Node) -> torch.Tensor:
    return node.meta["val"]


RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
"""Ops whose result is their operand's elements in row-major order, in another shape."""


@rule(*RESHAPES)
def _reshape(importer: Importer, node: torch.fx.Node) -> Value:
    """The same piece read in another shape: no op. (`view` could not always be applied to
    hostir's buffers, laid out anew where eager's tensors keep their strides.)"""
    return importer.arg(node.args[0]).reshaped(tuple(_result(node).shape))


@rule(aten.slice.Tensor)
def _whole_slice(importer: Importer, node: torch.fx.Node) -> Value | None:
    """A slice of a whole axis (of the same shape as its operand: from the start to the end,
    step 1): the same tensor, no op. A graph traced with symbolic sizes writes one after the
    reshape of a gathered tensor, which would otherwise become an ATen op and cut the
    all-gather from its GEMMs. Any other slice is ATen's."""
    source = importer.arg(node.args[0])
    if not isinstance(source, Value) or tuple(_result(node).shape) != source.shape:
        return None
    return source


def _cut(shape: tuple[int, ...], dim: int, size: int) -> tuple[int, ...]:
    """`shape` with axis `dim` cut into (pieces, `size`): what `split(x, size, dim)` reads."""
    return (*shape[:dim], shape[dim] // size, size, *shape[dim + 1 :])


def _split_pieces(node: torch.fx.Node) -> tuple[torch.fx.Node, int, int] | None:
    """`(x, size, dim)` where `node` is `cat` of every piece of `split(x, size, dim)`, in order."""
    pieces = node.args[0]
    if not pieces or not all(isinstance(p, torch.fx.Node) and p.target is operator.getitem for p in pieces):
        return None
    split = pieces[0].args[0]
    if split.target is not aten.split.Tensor or [p.args for p in pieces] != [(split, i) for i in range(len(pieces))]:
        return None
    source, size = split.args[0], split.args[1]
    if isinstance(size, torch.fx.Node):  # shape arithmetic of a dynamic graph
        size = _concrete(size.meta.get("val"))
    if not isinstance(size, int) or size <= 0:
        return None
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    shape = source.meta["val"].shape
    dim %= len(shape)
    if len(pieces) != len(split.meta["val"]) or shape[dim] % size:
        return None
    return source, size, dim


def _concatenated_split(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor that `cat(split(x, size, dim), 0)` of `node` only reshapes, if it is one:
    every piece of the split in order, and no axis before `dim` longer than 1."""
    split = _split_pieces(node)
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if split is None or dim != 0 or math.prod(split[0].meta["val"].shape[: split[2]]) != 1:
        return None
    return split[0]


@rule(aten.cat.default)
def _cat(importer: Importer, node: torch.fx.Node) -> Value | None:
    """The concatenation of a split, as sequence parallelism writes them: the same piece.

    With a batch of one sequence it is a reshape. With several, the all-gather's pieces
    (the ranks' sequence pieces, stacked along the batch) become the batch's sequences
    (split along the batch, concatenated along the sequence), and the other way before a
    reduce-scatter: each is a permutation of the piece's axes, which the value's `order`
    records, so that the pieces stay an axis of their own for the pipelines.
    """
    source = _concatenated_split(node)
    if source is not None:
        return importer.arg(source).reshaped(tuple(_result(node).shape))
    split = _split_pieces(node)
    value = importer.arg(split[0]) if split is not None else None
    if not isinstance(value, Value):
        return None
    _, size, split_dim = split
    cat_dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(value.shape)
    # The FX tensor with the split axis cut into (pieces, size): a permutation of that
    # moves the pieces' axis before the concatenated one.
    fine = _cut(value.shape, split_dim, size)
    if value.order is None:
        base = tuple(range(len(fine)))
        if value.local_shape != fine:
            value = importer.with_piece(value, fine)
    elif tuple(value.local_shape[axis] for axis in value.order) == fine:
        base = value.order
    else:
        value, base = importer.with_piece(value, fine), tuple(range(len(fine)))
    target = cat_dim + (cat_dim >= split_dim)
    axes = [axis for axis in range(len(fine)) if axis != split_dim]
    axes.insert(axes.index(target), split_dim)
    order = tuple(base[axis] for axis in axes)
    local = value.local_shape
    moved = [axis for axis in order if local[axis] != 1]
    return Value(
        value.ssa,
        tuple(_result(node).shape),
        value.dtype,
        value.varying,
        local,
        None if moved == sorted(moved) else order,
    )


def _regrouped_reader(node: torch.fx.Node) -> tuple[tuple[int, ...], int, int] | None:
    """`(shape, size, dim)` where the one reader of the product `node`, through reshapes to
    `shape` (the rows in its leading axes) and sums of tensors of its shape (a gradient's
    GEMMs), is `cat(split(., size, dim), 0)` of several sequences, which a reduce-scatter
    reads: the rows regrouped by destination."""
    current = node
    while len(current.users) == 1:
        (reader,) = current.users
        if reader.target in RESHAPES or (reader.target is aten.add.Tensor and _no_alpha(reader) and _same_shapes(reader)):
            current = reader
            continue
        if reader.target is not aten.split.Tensor:
            return None
        cats = {user for piece in reader.users for user in piece.users}
        if len(cats) != 1:
            return None
        (cat,) = cats
        split = _split_pieces(cat)
        cat_dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
        collective = _collective_reader(cat)
        if split is None or split[0] is not current or cat_dim != 0 or _concatenated_split(cat) is not None:
            return None
        if collective is None or collective.target is not c10d.reduce_scatter_tensor.default:
            return None
        shape = tuple(current.meta["val"].shape)
        if math.prod(shape[:-1]) != node.meta["val"].shape[0] or split[2] == len(shape) - 1:
            return None
        return shape, split[1], split[2]
    return None


def _same_shapes(node: torch.fx.Node) -> bool:
    """Whether every argument of `node` is a tensor of its result's shape."""
    shape = _result(node).shape
    return all(isinstance(a, torch.fx.Node) and a.meta["val"].shape == shape for a in node.args)


def _collective_reader(node: torch.fx.Node) -> torch.fx.Node | None:
    """The reduce-scatter or sum all-reduce that is the one reader of `node` through
    reshapes and sums of tensors of its shape (a gradient's GEMMs), if any."""
    while len(node.users) == 1:
        (reader,) = node.users
        if reader.target is c10d.reduce_scatter_tensor.default or (
            reader.target is c10d.all_reduce.default and reader.args[1] == "sum"
        ):
            return reader
        if reader.target in RESHAPES or (reader.target is aten.add.Tensor and _no_alpha(reader) and _same_shapes(reader)):
            node = reader
        elif reader.target is aten.split.Tensor and all(p.target is operator.getitem for p in reader.users):
            cats = {user for piece in reader.users for user in piece.users}
            if len(cats) != 1 or _concatenated_split(next(iter(cats))) is not reader.args[0]:
                return None
            node = next(iter(cats))
        else:
            return None
    return None


@rule(c10d.wait_tensor.default)
def _wait(importer: Importer, node: torch.fx.Node) -> Value:
    return importer.arg(node.args[0])


@rule(c10d.all_gather_into_tensor.default)
def _all_gather(importer: Importer, node: torch.fx.Node) -> Value:
    value = importer.arg(node.args[0])
    if not importer.varies(value):
        return value
    if value.order is not None:
        value = importer.flat(value)
    local = (importer.devices, *value.local_shape)
    op = importer.emit(fusion.SetOp(value.ssa, importer.tensor_type(local, value.dtype, False)))
    op.results[0].name_hint = _name(node)
    return Value(op.results[0], tuple(_result(node).shape), value.dtype, False, local)


REDUCE_OPS = {"sum": fusion.SumOp, "max": fusion.MaxOp}


def _reduce_over_devices(importer: Importer, node: torch.fx.Node, value: Value, scatter: bool) -> Value | None:
    reduce_op = node.args[1]
    if reduce_op not in REDUCE_OPS:
        raise UnsupportedGraph(
            f"{node.format_node()}: the reduction {reduce_op!r} is not supported "
            f"(hostir reduces with {', '.join(REDUCE_OPS)})"
        )
    if not importer.varies(value):
        return value
    if value.dtype in CARRIERS:
        raise UnsupportedGraph(f"{node.format_node()}: a reduction of {value.dtype} tensors is not supported")
    devices = importer.devices
    if scatter and (value.order is not None or value.local_shape[:1] != (devices,)):
        value = importer.rechunked(importer.flat(value), (devices,))
    # Each device receives the rows of its position: the piece's axes after the first.
    local = value.local_shape[1:] if scatter else value.local_shape
    result_type = importer.tensor_type(local, value.dtype, scatter)
    op = importer.emit(REDUCE_OPS[reduce_op](value.ssa, [0], False, result_type))
    op.results[0].name_hint = _name(node)
    return Value(op.results[0], tuple(_result(node).shape), value.dtype, scatter, local, value.order)


@rule(c10d.reduce_scatter_tensor.default)
def _reduce_scatter(importer: Importer, node: torch.fx.Node) -> Value | None:
    return _reduce_over_devices(importer, node, importer.arg(node.args[0]), scatter=True)


@rule(c10d.all_reduce.default)
def _all_reduce(importer: Importer, node: torch.fx.Node) -> Value | None:
    return _reduce_over_devices(importer, node, importer.arg(node.args[0]), scatter=False)


def _matmul_result(
    importer: Importer, node: torch.fx.Node, lhs: Value, rhs: Value, bias: Value | None = None
) -> Value | None:
    """`lhs @ rhs` (`bias + lhs @ rhs` with a bias) as a fusion.matmul, keeping the axes of
    `lhs`'s piece; None where ATen's rules differ.

    A product that a reduce-scatter or an all-reduce reads is computed in the chunks of
    its pipeline (`pipeline_chunks`), its rows cut: so the bias must be the same for
    every row (a row or a scalar, as `nn.Linear`'s is); ATen runs an addmm with another.
    """
    result = _result(node)
    if lhs.dtype != rhs.dtype or result.dtype != lhs.dtype or len(rhs.shape) < 2 or len(lhs.shape) < 2:
        return None
    if lhs.dtype in CARRIERS or (bias is not None and (bias.dtype != lhs.dtype or math.prod(bias.shape[:-1]) != 1)):
        return None
    rhs = importer.flat(rhs)
    if len(lhs.shape) != 2 or not lhs.keeps_last_axis:
        lhs = importer.flat(lhs)
    varying = importer.varies(lhs, rhs)
    chunks = importer.pipeline_chunks(node, lhs, rhs) if varying and len(lhs.shape) == 2 else ()
    gathered = isinstance(lhs.ssa.owner, fusion.SetOp) and _squeezed(lhs.local_shape) != _squeezed(lhs.shape)
    regrouping = _regrouped_reader(node) if varying and len(lhs.shape) == 2 and not gathered else None
    if regrouping is not None and lhs.order is None:
        shape, size, dim = regrouping
        lhs = importer.regrouped(importer.flat(lhs), (*shape[:-1], lhs.shape[-1]), size, dim)
    if chunks and not gathered and lhs.order is None:
        # The pieces of an all-gather read right here keep their axis, or its ring would
        # not reach this matmul; any other piece takes the chunks (a view of it).
        lhs = importer.rechunked(importer.flat(lhs), chunks)
    local = (*lhs.local_shape[:-1], result.shape[-1]) if len(lhs.shape) == 2 else tuple(result.shape)
    varying = varying or (bias is not None and importer.varies(bias))
    lhs_ssa, rhs_ssa = (importer.aligned(v, len(local)) for v in (lhs, rhs))
    bias_ssa = None if bias is None else importer.aligned(importer.flat(bias), len(local))
    op = importer.emit(fusion.MatmulOp(lhs_ssa, rhs_ssa, bias_ssa, importer.tensor_type(local, result.dtype, varying)))
    op.results[0].name_hint = _name(node)
    order = lhs.order if len(lhs.shape) == 2 else None
    return Value(op.results[0], tuple(result.shape), result.dtype, varying, local, order)


@rule(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(importer: Importer, node: torch.fx.Node) -> Value | None:
    return _matmul_result(importer, node, importer.arg(node.args[0]), importer.arg(node.args[1]))


@rule(aten.addmm.default)
def _addmm(importer: Importer, node: torch.fx.Node) -> Value | None:
    """`addmm(bias, a, b)`: one fusion.matmul with its bias, which ATen adds to the product
    before it rounds it; a matmul followed by an add would round twice."""
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None
    bias, lhs, rhs = (importer.arg(a) for a in node.args[:3])
    return _matmul_result(importer, node, lhs, rhs, bias)


def _pointwise(importer: Importer, node: torch.fx.Node, op_class: type, operands: list[Any]) -> Value | None:
    """An elementwise fusion op in the result's dtype, ATen's promotion done by casts first."""
    result = _result(node)
    if not result.dtype.is_floating_point:
        return None
    values: list[Value] = [
        importer.scalar(o, result.dtype) if isinstance(o, (int, float)) and not isinstance(o, bool) else o
        for o in operands
    ]
    if not all(isinstance(v, Value) for v in values) or any(v.dtype in CARRIERS for v in values):
        return None
    shape = tuple(result.shape)
    model = _shared_piece(values, shape)
    if model is None:
        values = [importer.flat(v) for v in values]
    values = [importer.cast(v, result.dtype) for v in values]
    layout = () if model is None else (model.local, model.order)
    out = Pointwise(importer, shape, result.dtype, *layout)(op_class, *values)
    out.ssa.name_hint = _name(node)
    return out


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(extent for extent in shape if extent != 1)


def _shared_piece(values: list[Value], shape: tuple[int, ...]) -> Value | None:
    """The full-shape operand whose piece layout an elementwise op of result `shape` may
    compute in: where all full-shape operands share one (shape and order), and every other
    operand broadcasts along trailing axes that the layout leaves as they are (only the
    last one where the pieces' axes are permuted)."""
    full = [v for v in values if v.shape == shape]
    if not full or any((v.local_shape, v.order) != (full[0].local_shape, full[0].order) for v in full):
        return None
    model = full[0]
    local = model.local_shape
    for value in values:
        if value.shape == shape:
            continue
        rank = len(value.shape)
        if not value.is_flat or rank > len(local) or (rank and local[-rank:] != shape[-rank:]):
            return None
        if model.order is not None and rank and (rank > 1 or not model.keeps_last_axis):
            return None
    return model


def _elementwise_rule(op_class: type, check: Callable[[torch.fx.Node], bool] = lambda node: True) -> Rule:
    def lower(importer: Importer, node: torch.fx.Node) -> Value | None:
        if not check(node):
            return None
        return _pointwise(importer, node, op_class, [importer.arg(a) for a in node.args])

    return lower


def _no_alpha(node: torch.fx.Node) -> bool:
    return node.kwargs.get("alpha", 1) == 1 and len(node.args) == 2


def _true_division(node: torch.fx.Node) -> bool:
    return node.kwargs.get("rounding_mode") is None


for _targets, _op, _check in (
    ((aten.add.Tensor, aten.add.Scalar), fusion.AddOp, _no_alpha),
    ((aten.sub.Tensor, aten.sub.Scalar), fusion.SubOp, _no_alpha),
    ((aten.mul.Tensor, aten.mul.Scalar), fusion.MulOp, lambda node: True),
    ((aten.div.Tensor, aten.div.Scalar), fusion.DivOp, _true_division),
    ((aten.maximum.default,), fusion.MaximumOp, lambda node: True),
    ((aten.minimum.default,), fusion.MinimumOp, lambda node: True),
    ((aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor), fusion.PowOp, lambda node: True),
    ((aten.neg.default,), fusion.NegOp, lambda node: True),
    ((aten.abs.default,), fusion.AbsOp, lambda node: True),
    ((aten.exp.default,), fusion.ExpOp, lambda node: True),
    ((aten.log.default,), fusion.LogOp, lambda node: True),
    ((aten.sqrt.default,), fusion.SqrtOp, lambda node: True),
    ((aten.relu.default,), fusion.ReluOp, lambda node: True),
    ((aten.tanh.default,), fusion.TanhOp, lambda node: True),
    ((aten.sigmoid.default,), fusion.SigmoidOp, lambda node: True),
    ((aten.erf.default,), fusion.ErfOp, lambda node: True),
):
    rule(*_targets)(_elementwise_rule(_op, _check))


SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
GELU_TANH_KAPPA = 0.044715


@dataclass
class Pointwise:
    """Emits pointwise fusion ops whose results are FX tensors of `shape` and `dtype` held
    in one piece layout (`local`, `order`, as a `Value`'s): an ATen pointwise op, or an
    activation written as the fusion ops that ATen's kernel computes (so that it joins
    the pointwise run around it in one generated kernel, where a `fusion.aten` would cut
    the run)."""

    importer: Importer
    shape: tuple[int, ...]
    dtype: torch.dtype
    local: tuple[int, ...] | None = None
    order: tuple[int, ...] | None = None

    @classmethod
    def like(cls, importer: Importer, value: Value) -> Pointwise:
        return cls(importer, value.shape, value.dtype, value.local, value.order)

    def __call__(self, op_class: type, *operands: Value | float) -> Value:
        values = [o if isinstance(o, Value) else self.importer.scalar(o, self.dtype) for o in operands]
        local = self.shape if self.local is None else self.local
        varying = self.importer.varies(*values)
        ssa = [self.importer.aligned(v, len(local)) for v in values]
        op = self.importer.emit(op_class(*ssa, self.importer.tensor_type(local, self.dtype, varying)))
        return Value(op.results[0], self.shape, self.dtype, varying, self.local, self.order)


def _activation(compose: Callable[..., Value | None], tensors: int = 1) -> Rule:
    """A rule for an ATen activation (or its backward) of `tensors` tensor operands of the
    result's shape: they are cast to the opmath dtype, `compose(f, *values, *other args)`
    builds the result with `f` (a `Pointwise`), and the result is cast back."""

    def lower(importer: Importer, node: torch.fx.Node) -> Value | None:
        result = _result(node)
        values = [importer.arg(a) for a in node.args[:tensors]]
        if not result.dtype.is_floating_point or set(node.kwargs) - {"approximate"}:
            return None
        if not all(isinstance(v, Value) and v.shape == tuple(result.shape) for v in values):
            return None
        if _shared_piece(values, tuple(result.shape)) is None:
            values = [importer.flat(v) for v in values]
        wide = get_computation_dtype(result.dtype)  # ATen's opmath: f32 for bf16 and f16
        values = [importer.cast(v, wide) for v in values]
        composed = compose(Pointwise.like(importer, values[0]), *values, *node.args[tensors:], **node.kwargs)
        if composed is None:
            return None
        out = importer.cast(composed, result.dtype)
        out.ssa.name_hint = _name(node)
        return out

    return lower


def _silu(f: Pointwise, x: Value) -> Value:
    return f(fusion.MulOp, x, f(fusion.SigmoidOp, x))


def _silu_backward(f: Pointwise, grad: Value, x: Value) -> Value:
    s = f(fusion.SigmoidOp, x)
    slope = f(fusion.AddOp, f(fusion.MulOp, x, f(fusion.SubOp, 1.0, s)), 1.0)
    return f(fusion.MulOp, grad, f(fusion.MulOp, s, slope))


def _gelu_parts(f: Pointwise, x: Value, approximate: str, slope: bool) -> tuple[Value, Value | None] | None:
    """GELU's Gaussian CDF at `x`, exact (`erf`) or tanh's approximation, and with `slope`
    its derivative; None for another approximation."""
    if approximate == "none":
        cdf = f(fusion.MulOp, f(fusion.AddOp, f(fusion.ErfOp, f(fusion.MulOp, x, math.sqrt(0.5))), 1.0), 0.5)
        if not slope:
            return cdf, None
        exponent = f(fusion.MulOp, f(fusion.MulOp, x, x), -0.5)
        return cdf, f(fusion.MulOp, f(fusion.ExpOp, exponent), 1 / math.sqrt(2 * math.pi))
    if approximate == "tanh":
        x_squared = f(fusion.MulOp, x, x)
        cubic = f(fusion.AddOp, f(fusion.MulOp, f(fusion.MulOp, x_squared, x), GELU_TANH_KAPPA), x)
        t = f(fusion.TanhOp, f(fusion.MulOp, cubic, SQRT_2_OVER_PI))
        cdf = f(fusion.MulOp, f(fusion.AddOp, t, 1.0), 0.5)
        if not slope:
            return cdf, None
        cubic_slope = f(fusion.MulOp, f(fusion.AddOp, f(fusion.MulOp, x_squared, 3 * GELU_TANH_KAPPA), 1.0), SQRT_2_OVER_PI)
        return cdf, f(fusion.MulOp, f(fusion.MulOp, f(fusion.SubOp, 1.0, f(fusion.MulOp, t, t)), cubic_slope), 0.5)
    return None


def _gelu(f: Pointwise, x: Value, approximate: str = "none") -> Value | None:
    parts = _gelu_parts(f, x, approximate, slope=False)
    return None if parts is None else f(fusion.MulOp, x, parts[0])


def _gelu_backward(f: Pointwise, grad: Value, x: Value, approximate: str = "none") -> Value | None:
    parts = _gelu_parts(f, x, approximate, slope=True)
    if parts is None:
        return None
    cdf, density = parts
    return f(fusion.MulOp, grad, f(fusion.AddOp, cdf, f(fusion.MulOp, x, density)))


for _target, _compose, _tensors in (
    (aten.silu.default, _silu, 1),
    (aten.silu_backward.default, _silu_backward, 2),
    (aten.gelu.default, _gelu, 1),
    (aten.gelu_backward.default, _gelu_backward, 2),
):
    rule(_target)(_activation(_compose, _tensors))


@rule(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _to_dtype(importer: Importer, node: torch.fx.Node) -> Value | None:
    result = _result(node)
    value = importer.arg(node.args[0])
    kwargs = set(node.kwargs) - {"dtype", "layout", "device"}
    if kwargs or result.device != node.args[0].meta["val"].device:
        return None
    if not _dtype_supported(result.dtype) or value.dtype in CARRIERS:
        return None
    return importer.cast(value, result.dtype)


@rule(aten.sum.dim_IntList, aten.amax.default)
def _reduction(importer: Importer, node: torch.fx.Node) -> Value | None:
    if set(node.kwargs) - {"keepdim"} or len(node.args) < 2:
        return None
    value = importer.flat(importer.arg(node.args[0]))
    result = _result(node)
    dims = node.args[1] or list(range(len(value.shape)))
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if result.dtype != value.dtype or not value.shape or value.dtype in CARRIERS:
        return None
    offset = 1 if importer.varies(value) else 0
    axes = [(d % len(value.shape)) + offset for d in dims]
    op_class = fusion.SumOp if node.target == aten.sum.dim_IntList else fusion.MaxOp
    result_type = importer.tensor_type(tuple(result.shape), result.dtype, importer.varies(value))
    op = importer.emit(op_class(value.ssa, axes, bool(keepdim), result_type))
    op.results[0].name_hint = _name(node)
    return Value(op.results[0], tuple(result.shape), result.dtype, importer.varies(value))


def import_graph(gm: torch.fx.GraphModule, name: str = "graph", chunks_of: ChunksOf = one_chunk) -> ImportedGraph:
    """The fusion of `gm`, whose nodes carry concrete `meta['val']`s (FakeTensorProp)."""
    return Importer(gm, name, chunks_of).run()
