"""The `hir` dialect: host programs that allocate, slice, compute, communicate and pipeline.

A host program is a `func.func` whose tensor values are *buffers*: `!fusion.tensor`
values with reference semantics. The type keeps the logical shape and the sharding,
so the runtime knows the local shape of every buffer and the team of every
collective; what one device holds is `TensorType.local_shape()`. Compute is
destination-passing (`ins(...) outs(...)`, as linalg), so an op writes into a
buffer, or into a view of one made by `hir.alias_select`. Control flow is
`scf.for`/`scf.if` and index arithmetic is `arith`.

The ops take nvFuser's Host IR names (kir::Allocate, HirAliasSelect, Communication,
P2PCommunication, Wait, LaunchKernel, PostOnStream, ...), lower-cased.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    FloatAttr,
    Float32Type,
    IndexType,
    IntAttr,
    IntegerAttr,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    i64,
)
from xdsl.dialects.shard import ReductionKind, ReductionKindAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import (
    Attribute,
    BlockArgument,
    Dialect,
    Operation,
    OpResult,
    ParametrizedAttribute,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.dialects import arith, func
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern
from xdsl.traits import HasCanonicalizationPatternsTrait, Pure, SymbolTable, SymbolUserOpInterface
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from hostir_dialect import fusion
from hostir_dialect.aten_syntax import decode_call
from hostir_dialect.fusion import (
    DYNAMIC,
    BinaryOp,
    CastOp,
    DeviceMeshAttr,
    TensorType,
    UnaryOp,
    check_call_operands,
    check_returns,
    normalize_axes,
    parse_aten_call,
    parse_device_list_checked,
    print_aten_call,
    print_device_list,
    reduction_shape,
    shape_str,
    shapes_compatible,
    tensor_type,
)

# --------------------------------------------------------------------------- #
# Types and attributes                                                         #
# --------------------------------------------------------------------------- #


@irdl_attr_definition
class StreamType(ParametrizedAttribute, TypeAttribute):
    """A CUDA stream (a no-op ordering token on CPU)."""

    name = "hir.stream"


@irdl_attr_definition
class WorkType(ParametrizedAttribute, TypeAttribute):
    """The handle of an asynchronous communication, for `hir.wait`."""

    name = "hir.work"


class CommunicatorBackend(StrEnum):
    """Who moves the bytes: NCCL kernels, or the GPU copy engines (cudaMemcpyAsync)."""

    NCCL = "nccl"
    CUDA = "cuda"


@irdl_attr_definition
class CommunicatorBackendAttr(EnumAttribute[CommunicatorBackend], SpacedOpaqueSyntaxAttribute):
    name = "hir.backend"


NCCL = CommunicatorBackendAttr(CommunicatorBackend.NCCL)


# --------------------------------------------------------------------------- #
# Buffers and views                                                            #
# --------------------------------------------------------------------------- #


def _buffer(value: SSAValue, what: str) -> TensorType:
    if not isinstance(value.type, TensorType):
        raise VerifyException(f"{what} must be a !fusion.tensor buffer, got {value.type}")
    return value.type


@irdl_op_definition
class AllocateOp(IRDLOperation):
    """A new buffer; one index operand per dynamic extent of the type, in order.

    `%b = hir.allocate(%m, %n) : !fusion.tensor<[?, 8, ?], f32>`

    A `symmetric` buffer is one that the other devices of its mesh read directly, with
    the copy engines (`backend cuda`): every device of the mesh allocates it, in the
    same order, from memory the others can map. Establishing that is collective and
    slow, so the runtime makes each symmetric buffer once per shape and reuses it in
    every run; an allocation that a run executes more than once (in a loop or an `if`)
    would hand out the same memory twice, hence symmetric ones sit in the function body.

    `%b = hir.allocate(%m) symmetric : !fusion.tensor<[?, 8], bf16, mesh = [0, 1], axes = [_, didx]>`

    In memory a buffer's stream axis, if any, is its outermost axis, then the others in
    order: each slice of a pipelined loop is one block, which a collective takes as it is (a
    symmetric buffer has its axes in order, as its peers map it). An `order` lists the axes
    from the outermost in memory to the innermost instead (`buffer-layouts` gives one to a
    buffer that a later permute reads as one block).

    `%b = hir.allocate() order [1, 0, 2] : !fusion.tensor<[2, 4, 8], f32, axes = [stream, _, _]>`
    """

    name = "hir.allocate"

    dynamic_sizes = var_operand_def(IndexType)
    symmetric = opt_prop_def(UnitAttr)
    order = opt_prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = (
        "`(` $dynamic_sizes `)` (`symmetric` $symmetric^)? (`order` $order^)? attr-dict `:` type($result)"
    )

    def __init__(
        self, result_type: TensorType, dynamic_sizes: Sequence[SSAValue] = (), symmetric: bool = False
    ):
        super().__init__(
            operands=[dynamic_sizes],
            properties={"symmetric": UnitAttr()} if symmetric else {},
            result_types=[result_type],
        )

    def memory_order(self) -> tuple[int, ...]:
        """The buffer's axes from the outermost in memory to the innermost."""
        if self.order is not None:
            return tuple(self.order.get_values())
        rank, stream = tensor_type(self.result).rank, tensor_type(self.result).stream_axis
        if stream is None or self.symmetric is not None:
            return tuple(range(rank))
        return (stream, *(axis for axis in range(rank) if axis != stream))

    def size_of(self, axis: int) -> SSAValue | None:
        """The size operand of `axis` of the buffer: the logical extent of a dynamic axis
        (`?`), which the operands give in order; None for a static axis."""
        shape = tensor_type(self.result).get_shape()
        if shape[axis] != DYNAMIC:
            return None
        return self.dynamic_sizes[shape[:axis].count(DYNAMIC)]

    def is_adopted(self) -> bool:
        """Whether an op adopts the buffer: an out of an op that makes its own tensors, named
        in its `adopted`, becomes that tensor, so the buffer's own memory is never used
        (`forward-buffers` marks only an op that uses the buffer first)."""
        return any(
            isinstance(user := use.operation, AdoptingOp)
            and any(user.outs[index] is self.result for index in adopted_outs(user))
            for use in self.result.uses
        )

    def verify_(self) -> None:
        shape = tensor_type(self.result).get_shape()
        dynamic = shape.count(DYNAMIC)
        if dynamic != len(self.dynamic_sizes):
            raise VerifyException(
                f"type {shape_str(shape)} has {dynamic} dynamic extent(s) but "
                f"{len(self.dynamic_sizes)} size operand(s) were given"
            )
        if self.symmetric is not None and not isinstance(self.parent_op(), func.FuncOp):
            raise VerifyException(
                "a symmetric buffer is allocated once per program and reused by every run, so "
                f"its allocation must sit in the function body, not in '{self.parent_op().name}'"
            )
        if self.order is not None:
            order = list(self.order.get_values())
            if sorted(order) != list(range(len(shape))):
                raise VerifyException(
                    f"order {order} must list each of the buffer's {len(shape)} axes once, from the outermost in memory"
                )
            if self.symmetric is not None:
                raise VerifyException(
                    "a symmetric buffer has no order: its peers read it as one block, axes in order"
                )


SYMMETRIC_INPUT = "hir.symmetric"
"""The argument attribute of a program input that the caller passes in symmetric memory of
its mesh (`Program.symmetric_empty`): peers read it where it is, so the copy-engine
lowerings do not copy it into a symmetric buffer first.

`func.func @f(%x: !fusion.tensor<[2, ?, 8], bf16, mesh = [0, 1], axes = [didx, _, _]> {hir.symmetric})`
"""


def is_symmetric_input(value: SSAValue) -> bool:
    """Whether `value` is an argument of a `func.func` marked `hir.symmetric`."""
    if not isinstance(value, BlockArgument):
        return False
    function = value.block.parent_op()
    return (
        isinstance(function, func.FuncOp)
        and value.block is function.body.blocks.first
        and function.arg_attrs is not None
        and SYMMETRIC_INPUT in function.arg_attrs.data[value.index].data
    )


def view_root(value: SSAValue) -> SSAValue:
    """The buffer that `value` is a view of: `value` itself unless `hir.alias_select` made it."""
    return root_axis(value, 0)[0]


def root_axis(value: SSAValue, axis: int) -> tuple[SSAValue, int]:
    """The buffer that `value` is a view of (`view_root`), and the axis of that buffer that
    `axis` of `value` is: each `hir.alias_select` on the way dropped one axis."""
    while isinstance(value, OpResult) and isinstance(value.op, AliasSelectOp):
        dropped = value.op.axis.data
        value, axis = value.op.input, axis + (axis >= dropped)
    return value, axis


def allocation_of(buffer: SSAValue) -> AllocateOp | None:
    """The `hir.allocate` that makes `buffer`; None for a view, an argument or another op's result."""
    return buffer.op if isinstance(buffer, OpResult) and isinstance(buffer.op, AllocateOp) else None


def allocated_size(buffer: SSAValue, axis: int) -> SSAValue | None:
    """The size operand that the allocation of `buffer` (or of the buffer it is a view of)
    gives `axis`, where that is an allocation's dynamic axis: what `hir.dim` of it reads."""
    root, axis = root_axis(buffer, axis)
    allocation = allocation_of(root)
    return None if allocation is None else allocation.size_of(axis)


def in_symmetric_allocation(buffer: SSAValue) -> bool:
    """Whether `buffer` is (a view of) a buffer of `hir.allocate symmetric`, which the runtime
    makes once and gives back to every run."""
    allocation = allocation_of(view_root(buffer))
    return allocation is not None and allocation.symmetric is not None


def is_symmetric(buffer: SSAValue) -> bool:
    """Whether `buffer` is (a view of) memory that the devices of its mesh have mapped: a
    symmetric allocation or a symmetric input."""
    return in_symmetric_allocation(buffer) or is_symmetric_input(view_root(buffer))


@irdl_op_definition
class DeallocateOp(IRDLOperation):
    """Frees a buffer after its last use."""

    name = "hir.deallocate"

    buffer = operand_def(TensorType)

    assembly_format = "$buffer attr-dict `:` type($buffer)"

    def __init__(self, buffer: SSAValue):
        super().__init__(operands=[buffer])


class DimOpHasCanonicalizationPatterns(HasCanonicalizationPatternsTrait):
    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (FoldStatedDim(),)


@irdl_op_definition
class DimOp(IRDLOperation):
    """The logical extent of one axis of a buffer (a `didx` axis spans the mesh).

    `%n = hir.dim %b, 0 : !fusion.tensor<[?, 4], f32>`

    Canonicalization folds the extents the program states: a static or `didx` axis's into a
    constant, an allocated buffer's dynamic axis into its allocation's size operand.
    """

    name = "hir.dim"
    traits = traits_def(Pure(), DimOpHasCanonicalizationPatterns())

    buffer = operand_def(TensorType)
    axis = prop_def(IntAttr)
    result = result_def(IndexType)

    def __init__(self, buffer: SSAValue, axis: int):
        super().__init__(
            operands=[buffer], properties={"axis": IntAttr(axis)}, result_types=[IndexType()]
        )

    def verify_(self) -> None:
        rank = _buffer(self.buffer, "operand").rank
        if not 0 <= self.axis.data < rank:
            raise VerifyException(f"axis {self.axis.data} is out of range for a buffer of rank {rank}")

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.buffer)
        printer.print_string(f", {self.axis.data}")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.buffer.type)

    @classmethod
    def parse(cls, parser: Parser) -> DimOp:
        buffer = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        axis = parser.parse_integer(allow_negative=False)
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        op = cls(parser.resolve_operand(buffer, parser.parse_type()), axis)
        op.attributes |= attributes
        return op


def stated_extent(buffer: SSAValue, axis: int) -> tuple[list[Operation], SSAValue] | None:
    """The extent of `axis` of `buffer` where the program states it, with the ops that make it:
    a new constant where the type gives it (`type_extent`), else its allocation's size operand
    (`allocated_size`); None where only running the program tells it."""
    extent = type_extent(buffer, axis)
    if extent is not None:
        constant = arith.ConstantOp(IntegerAttr(extent, IndexType()))
        return [constant], constant.result
    size = allocated_size(buffer, axis)
    return None if size is None else ([], size)


class FoldStatedDim(RewritePattern):
    """`hir.dim` of an axis whose extent the program states -> that extent (`stated_extent`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: DimOp, rewriter: PatternRewriter, /) -> None:
        stated = stated_extent(op.buffer, op.axis.data)
        if stated is not None:
            ops, extent = stated
            rewriter.replace(op, ops, [extent])


@irdl_op_definition
class AliasSelectOp(IRDLOperation):
    """A view of slice `index` of a buffer along `axis` (the axis is dropped); never a copy.

    `%v = hir.alias_select %b[0 = %i] : !fusion.tensor<[?, 4], f32> -> !fusion.tensor<[4], f32>`
    """

    name = "hir.alias_select"

    input = operand_def(TensorType)
    index = operand_def(IndexType)
    axis = prop_def(IntAttr)
    result = result_def(TensorType)

    def __init__(self, input: SSAValue, axis: int, index: SSAValue):
        super().__init__(
            operands=[input, index],
            properties={"axis": IntAttr(axis)},
            result_types=[tensor_type(input).without_axis(axis)],
        )

    def verify_(self) -> None:
        source = _buffer(self.input, "input")
        if not 0 <= self.axis.data < source.rank:
            raise VerifyException(
                f"axis {self.axis.data} is out of range for a buffer of rank {source.rank}"
            )
        expected = source.without_axis(self.axis.data)
        if self.result.type != expected:
            raise VerifyException(
                f"selecting along axis {self.axis.data} of {source} gives {expected}, "
                f"not {self.result.type}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(f"[{self.axis.data} = ")
        printer.print_operand(self.index)
        printer.print_string("]")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.input.type)
        printer.print_string(" -> ")
        printer.print_attribute(self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> AliasSelectOp:
        input = parser.parse_unresolved_operand()
        parser.parse_punctuation("[")
        axis = parser.parse_integer(allow_negative=False)
        parser.parse_punctuation("=")
        index = parser.parse_operand(IndexType())
        parser.parse_punctuation("]")
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        input_type = parser.parse_type()
        parser.parse_punctuation("->")
        result_type = parser.parse_type()
        op = cls.create(
            operands=[parser.resolve_operand(input, input_type), index],
            properties={"axis": IntAttr(axis)},
            result_types=[result_type],
            attributes=attributes,
        )
        return op


# --------------------------------------------------------------------------- #
# Runtime scalars and streams                                                  #
# --------------------------------------------------------------------------- #


@irdl_op_definition
class DeviceIndexOp(IRDLOperation):
    """The rank of the device running the program (nvFuser's NamedScalar rank)."""

    name = "hir.device_index"
    traits = traits_def(Pure())

    result = result_def(IndexType)

    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__(result_types=[IndexType()])


@irdl_op_definition
class NumberOfStreamsOp(IRDLOperation):
    """The size of the runtime's stream pool (nvFuser's numberOfStreams)."""

    name = "hir.number_of_streams"
    traits = traits_def(Pure())

    result = result_def(IndexType)

    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__(result_types=[IndexType()])


@irdl_op_definition
class GetCurrentStreamOp(IRDLOperation):
    name = "hir.get_current_stream"

    result = result_def(StreamType)

    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__(result_types=[StreamType()])


@irdl_op_definition
class StreamOp(IRDLOperation):
    """Stream number `index` of the pool; the index must be below `hir.number_of_streams`."""

    name = "hir.stream"
    traits = traits_def(Pure())

    index = operand_def(IndexType)
    result = result_def(StreamType)

    assembly_format = "$index attr-dict"

    def __init__(self, index: SSAValue):
        super().__init__(operands=[index], result_types=[StreamType()])


@irdl_op_definition
class SetCurrentStreamOp(IRDLOperation):
    """Makes `stream` the one that later ops are issued on."""

    name = "hir.set_current_stream"

    stream = operand_def(StreamType)

    assembly_format = "$stream attr-dict"

    def __init__(self, stream: SSAValue):
        super().__init__(operands=[stream])


@irdl_op_definition
class SynchronizeStreamOp(IRDLOperation):
    """The current stream waits until the work issued so far on `stream` is done."""

    name = "hir.synchronize_stream"

    stream = operand_def(StreamType)

    assembly_format = "$stream attr-dict"

    def __init__(self, stream: SSAValue):
        super().__init__(operands=[stream])


# --------------------------------------------------------------------------- #
# Communication                                                                #
# --------------------------------------------------------------------------- #


class CommunicationOp(IRDLOperation, ABC):
    """A collective among `team` from `input` into `output`; returns a work handle.

    `%w = hir.allreduce %in into %out team [0, 1] op sum backend nccl : T, T2`

    Subclasses say whether they need a `root` and a reduction `op`, and whether the
    copy engines can move their bytes (`backend cuda`). A device outside the team does
    nothing.
    """

    HAS_ROOT: ClassVar[bool] = False
    HAS_REDUCE_OP: ClassVar[bool] = False
    HAS_COPY_ENGINE_FORM: ClassVar[bool] = False
    """Whether `backend cuda` can move it: every member pulls what it needs out of its
    peers' copies of the (symmetric) input, and a reduction then reduces the pulled
    pieces locally. The rooted collectives have none: their data flows to or from one
    device, which may sit outside the mesh of the buffer the others would read."""
    SPLIT: ClassVar[str | None] = None
    """The operand, "input" or "output", of which an axis holds one slice per member of
    the team in the other operand's mesh (`split_axis`); None where whole buffers move."""

    input = operand_def(TensorType)
    output = operand_def(TensorType)
    team = prop_def(DeviceMeshAttr)
    root = opt_prop_def(IntAttr)
    reduce_op = opt_prop_def(ReductionKindAttr)
    backend = prop_def(CommunicatorBackendAttr)
    work = result_def(WorkType)

    def __init__(
        self,
        input: SSAValue,
        output: SSAValue,
        team: DeviceMeshAttr | Sequence[int],
        *,
        root: int | None = None,
        reduce_op: ReductionKind | None = None,
        backend: CommunicatorBackend = CommunicatorBackend.NCCL,
    ):
        properties: dict[str, Attribute] = {
            "team": team if isinstance(team, DeviceMeshAttr) else DeviceMeshAttr(team),
            "backend": CommunicatorBackendAttr(backend),
        }
        if root is not None:
            properties["root"] = IntAttr(root)
        if reduce_op is not None:
            properties["reduce_op"] = ReductionKindAttr(reduce_op)
        super().__init__(
            operands=[input, output], properties=properties, result_types=[WorkType()]
        )

    @property
    def team_ids(self) -> tuple[int, ...]:
        return self.team.ids

    def verify_(self) -> None:
        _buffer(self.input, "input")
        _buffer(self.output, "output")
        if self.HAS_ROOT:
            if self.root is None:
                raise VerifyException(f"{self.name} needs a root device")
            if self.root.data not in self.team_ids:
                raise VerifyException(
                    f"root {self.root.data} is not in the team {list(self.team_ids)}"
                )
        elif self.root is not None:
            raise VerifyException(f"{self.name} takes no root")
        if self.HAS_REDUCE_OP:
            if self.reduce_op is None:
                raise VerifyException(f"{self.name} needs a reduction op")
            if self.reduce_op.data not in SUPPORTED_REDUCTIONS:
                raise VerifyException(
                    f"reduction op {self.reduce_op.data.value} is not supported; expected one of "
                    + ", ".join(r.value for r in SUPPORTED_REDUCTIONS)
                )
        elif self.reduce_op is not None:
            raise VerifyException(f"{self.name} takes no reduction op")
        if self.backend.data == CommunicatorBackend.CUDA and not self.HAS_COPY_ENGINE_FORM:
            raise VerifyException(
                f"{self.name} has no copy-engine form, so it cannot take backend cuda; "
                f"the copy engines move the bytes of {', '.join(COPY_ENGINE_OPS)} and of send/recv"
            )
        split = self.split_axis()
        if split is not None and split.axis >= tensor_type(split.buffer).rank:
            raise VerifyException(
                f"{self.name} {split.verb} axis {split.axis} of its {split.role}, but the "
                f"{split.role} has rank {tensor_type(split.buffer).rank}"
            )
        problem = self.extent_problem(type_extent)
        if problem is not None:
            raise VerifyException(problem)

    def extent_problem(self, extent_of: Callable[[SSAValue, int], int | None]) -> str | None:
        """Why the extents of the buffers do not fit the collective, where `extent_of(buffer,
        axis)` tells them (None: unknown): the verifier asks the types, `Program.check_extents`
        the inputs' extents too. The axis of one slice per member (`split_axis`) must have
        that many; every member must send as many elements (per slice) as it receives, or
        the receiver's buffer is left partly unwritten, or the transfer fails on one side."""
        split = self.split_axis()
        if split is None and self.SPLIT is not None:
            return None  # no didx axis to split or fill along: the runtime refuses the op
        if split is not None:
            extent = extent_of(split.buffer, split.axis)
            if extent is not None and extent != split.members:
                return split.mismatch(self, extent)
        sent, received = (
            _piece_size(buffer, split.axis if split is not None and split.role == role else None, extent_of)
            for buffer, role in ((self.input, "input"), (self.output, "output"))
        )
        if sent is None or received is None or sent == received:
            return None
        per_slice = "" if split is None else " per slice"
        return (
            f"{self.name} moves {sent} element(s){per_slice} of its input into {received} of its "
            "output; they must be as many"
        )

    def split_axis(self) -> SplitAxis | None:
        """The axis of the `SPLIT` operand that holds one slice per member: the other
        operand's didx axis (None where that has none, which the runtime refuses)."""
        if self.SPLIT is None:
            return None
        sharded = tensor_type(self.output if self.SPLIT == "input" else self.input)
        if sharded.didx_axis is None:
            return None
        members = sum(1 for device in self.team_ids if device in sharded.mesh.ids)
        return SplitAxis(getattr(self, self.SPLIT), self.SPLIT, sharded.didx_axis, members)

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.input)
        printer.print_string(" into ")
        printer.print_operand(self.output)
        printer.print_string(" team ")
        print_device_list(printer, self.team_ids)
        if self.root is not None:
            printer.print_string(f" root {self.root.data}")
        if self.reduce_op is not None:
            printer.print_string(f" op {self.reduce_op.data.value}")
        printer.print_string(f" backend {self.backend.data.value}")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.input.type)
        printer.print_string(", ")
        printer.print_attribute(self.output.type)

    @classmethod
    def parse(cls, parser: Parser) -> CommunicationOp:
        input = parser.parse_unresolved_operand()
        parser.parse_keyword("into")
        output = parser.parse_unresolved_operand()
        parser.parse_keyword("team")
        properties: dict[str, Attribute] = {"team": DeviceMeshAttr(parse_device_list_checked(parser))}
        if parser.parse_optional_keyword("root"):
            properties["root"] = IntAttr(parser.parse_integer(allow_negative=False))
        if parser.parse_optional_keyword("op"):
            properties["reduce_op"] = ReductionKindAttr(parser.parse_str_enum(ReductionKind))
        parser.parse_keyword("backend")
        properties["backend"] = CommunicatorBackendAttr(parser.parse_str_enum(CommunicatorBackend))
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        input_type = parser.parse_type()
        parser.parse_punctuation(",")
        output_type = parser.parse_type()
        return cls.create(
            operands=[
                parser.resolve_operand(input, input_type),
                parser.resolve_operand(output, output_type),
            ],
            properties=properties,
            attributes=attributes,
            result_types=[WorkType()],
        )


class SplitAxis(NamedTuple):
    """An axis of a collective's buffer that holds one slice per member of its team in the
    mesh of its other buffer: the input's axis a scatter splits, the output's axis a gather
    fills. Its extent must be that number: a longer axis loses slices or leaves them
    unwritten in silence, a shorter one has no room for some."""

    buffer: SSAValue
    role: str
    """Which operand `buffer` is, "input" or "output"."""
    axis: int
    members: int

    @property
    def verb(self) -> str:
        return "splits" if self.role == "input" else "fills"

    def mismatch(self, op: CommunicationOp, extent: int) -> str:
        """Why `extent` on the axis is wrong, in plain words."""
        other, over = ("output", "over") if self.role == "input" else ("input", "from")
        return (
            f"{op.name} {self.verb} axis {self.axis} of its {self.role}, of extent {extent}, {over} "
            f"the {self.members} member(s) of its team in its {other}'s mesh, one slice each; "
            f"the extent must be {self.members}"
        )


def type_extent(buffer: SSAValue, axis: int) -> int | None:
    """The extent of `axis` of `buffer` that its type gives (a didx axis spans its mesh)."""
    type = tensor_type(buffer)
    if type.didx_axis == axis:
        return type.mesh.size
    extent = type.get_shape()[axis]
    return None if extent == DYNAMIC else extent


def _piece_size(
    buffer: SSAValue, split_axis: int | None, extent_of: Callable[[SSAValue, int], int | None]
) -> int | None:
    """The elements one member holds of `buffer`, or of one slice of it along `split_axis`
    (None where `extent_of` does not know them all)."""
    type, size = tensor_type(buffer), 1
    for axis in range(type.rank):
        if axis in (type.didx_axis, split_axis):
            continue
        extent = extent_of(buffer, axis)
        if extent is None:
            return None
        size *= extent
    return size


SUPPORTED_REDUCTIONS = (
    ReductionKind.SUM,
    ReductionKind.PRODUCT,
    ReductionKind.MAX,
    ReductionKind.MIN,
)


@irdl_op_definition
class AllgatherOp(CommunicationOp):
    name = "hir.allgather"
    HAS_COPY_ENGINE_FORM: ClassVar[bool] = True
    SPLIT: ClassVar[str | None] = "output"


@irdl_op_definition
class AllreduceOp(CommunicationOp):
    name = "hir.allreduce"
    HAS_REDUCE_OP: ClassVar[bool] = True
    HAS_COPY_ENGINE_FORM: ClassVar[bool] = True


@irdl_op_definition
class ReduceScatterOp(CommunicationOp):
    name = "hir.reduce_scatter"
    HAS_REDUCE_OP: ClassVar[bool] = True
    HAS_COPY_ENGINE_FORM: ClassVar[bool] = True
    SPLIT: ClassVar[str | None] = "input"

    def scattered_axis(self) -> int | None:
        """The input's axis whose slice `k` member `k` of the team gets: the output's didx
        axis, counted in the input's axes (None where the input or the output has none)."""
        source, target = tensor_type(self.input), tensor_type(self.output)
        reduced, scattered = source.didx_axis, target.didx_axis
        if reduced is None or scattered is None:
            return None
        if target.rank < source.rank and scattered >= reduced:
            scattered += 1
        return scattered

    def split_axis(self) -> SplitAxis | None:
        """The input's `scattered_axis`, one slice per member of the team in the output's mesh."""
        split, scattered = super().split_axis(), self.scattered_axis()
        return None if split is None or scattered is None else split._replace(axis=scattered)


@irdl_op_definition
class BroadcastOp(CommunicationOp):
    name = "hir.broadcast"
    HAS_ROOT: ClassVar[bool] = True


@irdl_op_definition
class ReduceOp(CommunicationOp):
    name = "hir.reduce"
    HAS_ROOT: ClassVar[bool] = True
    HAS_REDUCE_OP: ClassVar[bool] = True


@irdl_op_definition
class GatherOp(CommunicationOp):
    name = "hir.gather"
    HAS_ROOT: ClassVar[bool] = True
    SPLIT: ClassVar[str | None] = "output"


@irdl_op_definition
class ScatterOp(CommunicationOp):
    name = "hir.scatter"
    HAS_ROOT: ClassVar[bool] = True
    SPLIT: ClassVar[str | None] = "input"


@irdl_op_definition
class SendRecvOp(CommunicationOp):
    """The root sends its `input` to the other member of a team of two, into its `output`."""

    name = "hir.send_recv"
    HAS_ROOT: ClassVar[bool] = True

    def verify_(self) -> None:
        super().verify_()
        if len(self.team_ids) != 2:
            raise VerifyException(
                f"send_recv needs a team of a sender and a receiver, got {list(self.team_ids)}"
            )


COLLECTIVE_OPS: tuple[type[CommunicationOp], ...] = (
    AllgatherOp,
    AllreduceOp,
    ReduceScatterOp,
    BroadcastOp,
    ReduceOp,
    GatherOp,
    ScatterOp,
    SendRecvOp,
)

COPY_ENGINE_OPS: tuple[str, ...] = tuple(op.name for op in COLLECTIVE_OPS if op.HAS_COPY_ENGINE_FORM)
"""The collectives that `backend cuda` can move with the copy engines."""


class P2POp(IRDLOperation, ABC):
    """A point-to-point transfer of a whole buffer with the device `peer`."""

    KEYWORD: ClassVar[str]

    buffer = operand_def(TensorType)
    peer = operand_def(IndexType)
    backend = prop_def(CommunicatorBackendAttr)
    work = result_def(WorkType)

    def __init__(
        self,
        buffer: SSAValue,
        peer: SSAValue,
        backend: CommunicatorBackend = CommunicatorBackend.NCCL,
    ):
        super().__init__(
            operands=[buffer, peer],
            properties={"backend": CommunicatorBackendAttr(backend)},
            result_types=[WorkType()],
        )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.buffer)
        printer.print_string(f" {self.KEYWORD} ")
        printer.print_operand(self.peer)
        printer.print_string(f" backend {self.backend.data.value}")
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_attribute(self.buffer.type)

    def batch(self) -> tuple[StartCoalescingOp, EndCoalescingOp] | None:
        """The `hir.start_coalescing` and `hir.end_coalescing` around this transfer in its
        block, whose batch it is issued in; None where it is not in one."""
        start, end = self.prev_op, self.next_op
        while start is not None and not isinstance(start, StartCoalescingOp):
            if isinstance(start, EndCoalescingOp):
                return None
            start = start.prev_op
        while end is not None and not isinstance(end, EndCoalescingOp):
            if isinstance(end, StartCoalescingOp):
                return None
            end = end.next_op
        if start is None or end is None:
            return None
        return start, end

    @classmethod
    def parse(cls, parser: Parser) -> P2POp:
        buffer = parser.parse_unresolved_operand()
        parser.parse_keyword(cls.KEYWORD)
        peer = parser.parse_operand(IndexType())
        parser.parse_keyword("backend")
        backend = parser.parse_str_enum(CommunicatorBackend)
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        op = cls(parser.resolve_operand(buffer, parser.parse_type()), peer, backend)
        op.attributes |= attributes
        return op


@irdl_op_definition
class SendOp(P2POp):
    """`%w = hir.send %b to %peer backend nccl : T`"""

    name = "hir.send"
    KEYWORD: ClassVar[str] = "to"


@irdl_op_definition
class RecvOp(P2POp):
    """`%w = hir.recv %b from %peer backend nccl : T`"""

    name = "hir.recv"
    KEYWORD: ClassVar[str] = "from"


def uses_copy_engines(op: Operation) -> bool:
    """Whether `op` is a collective or a send/recv whose bytes the copy engines move (`backend cuda`)."""
    return isinstance(op, CommunicationOp | P2POp) and op.backend.data == CommunicatorBackend.CUDA


@irdl_op_definition
class StartCoalescingOp(IRDLOperation):
    """Sends and receives until `hir.end_coalescing` are issued together as one batch."""

    name = "hir.start_coalescing"

    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__()


@irdl_op_definition
class EndCoalescingOp(IRDLOperation):
    """Issues the batch opened by `hir.start_coalescing`; its work covers the batch."""

    name = "hir.end_coalescing"

    work = result_def(WorkType)

    assembly_format = "attr-dict"

    def __init__(self):
        super().__init__(result_types=[WorkType()])


@irdl_op_definition
class WaitOp(IRDLOperation):
    """The current stream waits for a communication to complete."""

    name = "hir.wait"

    work = operand_def(WorkType)

    assembly_format = "$work attr-dict"

    def __init__(self, work: SSAValue):
        super().__init__(operands=[work])


# --------------------------------------------------------------------------- #
# Compute (destination-passing)                                                #
# --------------------------------------------------------------------------- #


class ComputeOp(IRDLOperation, ABC):
    """Reads `ins`, writes `outs`: `hir.matmul ins(%a, %b : T, T) outs(%c : T)`."""

    NUM_INS: ClassVar[tuple[int, ...]] = ()
    NUM_OUTS: ClassVar[tuple[int, ...]] = (1,)

    ins = var_operand_def(TensorType)
    outs = var_operand_def(TensorType)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "`ins` `(` $ins `:` type($ins) `)` `outs` `(` $outs `:` type($outs) `)` attr-dict"
    )

    def __init__(
        self,
        ins: Sequence[SSAValue],
        outs: Sequence[SSAValue],
        properties: dict[str, Attribute] | None = None,
    ):
        super().__init__(operands=[ins, outs], properties=properties or {})

    def verify_(self) -> None:
        for what, values, allowed in (
            ("inputs", self.ins, self.NUM_INS),
            ("outputs", self.outs, self.NUM_OUTS),
        ):
            if allowed and len(values) not in allowed:
                raise VerifyException(
                    f"{self.name} takes " + " or ".join(map(str, allowed))
                    + f" {what}, got {len(values)}"
                )


@irdl_op_definition
class MatmulOp(ComputeOp):
    """`outs[0] = ins[0] @ ins[1]`, plus a bias `ins[2]` where there is one (`fusion.matmul`'s,
    summed in the GEMM and rounded once); with `accumulate`, `outs[0] += ins[0] @ ins[1]`,
    the sum done by the GEMM's epilogue (cuBLAS's beta = 1), which reads `outs[0]` as it
    writes it.

    `hir.matmul accumulate ins(%a, %b : T, T) outs(%c : T)`
    """

    name = "hir.matmul"
    NUM_INS: ClassVar[tuple[int, ...]] = (2, 3)

    accumulate = opt_prop_def(UnitAttr)

    assembly_format = "(`accumulate` $accumulate^)? " + ComputeOp.assembly_format

    def __init__(self, ins: Sequence[SSAValue], outs: Sequence[SSAValue], accumulate: bool = False):
        super().__init__(ins, outs, {"accumulate": UnitAttr()} if accumulate else {})

    def verify_(self) -> None:
        super().verify_()
        if self.accumulate is not None and len(self.ins) == 3:
            raise VerifyException(
                "hir.matmul accumulate takes 2 inputs, no bias: the out it adds the product to stands for one"
            )


@irdl_op_definition
class LinearOp(ComputeOp):
    """`out = in @ weight^T (+ bias)`."""

    name = "hir.linear"
    NUM_INS: ClassVar[tuple[int, ...]] = (2, 3)


def whole_buffer_problem(op: Operation, buffer: SSAValue) -> str | None:
    """Why `buffer` is not a whole buffer of `op`'s block that only this device uses (one of
    `hir.allocate` in that block, not symmetric), which the runtime may replace by another
    tensor; None where it is one."""
    allocation = allocation_of(buffer)
    if allocation is None:
        return "not a buffer of hir.allocate"
    if allocation.symmetric is not None:
        return "symmetric, its memory mapped by its peers"
    if allocation.parent_block() is not op.parent_block():
        return "allocated in another block"
    return None


@irdl_op_definition
class CopyOp(ComputeOp):
    """Copies `ins[0]` into `outs[0]` (nvFuser's Set on buffers).

    With `forwards_source`, no byte moves: the out becomes the source buffer itself.
    `forward-buffers` marks the copies whose source dies at the copy, and whose out the
    copy fills first (a pipelined loop's result copied for the readers after the loop).

    `hir.copy ins(%a : T) outs(%b : T) forwards_source`
    """

    name = "hir.copy"
    NUM_INS: ClassVar[tuple[int, ...]] = (1,)

    forwards_source = opt_prop_def(UnitAttr)

    assembly_format = (
        "`ins` `(` $ins `:` type($ins) `)` `outs` `(` $outs `:` type($outs) `)` "
        "(`forwards_source` $forwards_source^)? attr-dict"
    )

    def verify_(self) -> None:
        super().verify_()
        src, dst = tensor_type(self.ins[0]), tensor_type(self.outs[0])
        if src.local_shape() != dst.local_shape() and DYNAMIC not in (
            *src.local_shape(),
            *dst.local_shape(),
        ):
            raise VerifyException(
                f"copy from a buffer of local shape {shape_str(src.local_shape())} into one of "
                f"{shape_str(dst.local_shape())}"
            )
        if self.forwards_source is None:
            return
        for role, buffer in (("source", self.ins[0]), ("out", self.outs[0])):
            problem = whole_buffer_problem(self, buffer)
            if problem is not None:
                raise VerifyException(
                    f"forwards_source makes the out the source buffer itself, so the {role} must be a "
                    f"buffer of hir.allocate in the copy's block, not symmetric; it is {problem}"
                )
        if (src.local_shape(), src.element_type) != (dst.local_shape(), dst.element_type):
            raise VerifyException(
                "forwards_source makes the out the source buffer itself, so both must have one "
                f"local shape and element type; the source has {shape_str(src.local_shape())} "
                f"{src.element_type}, the out {shape_str(dst.local_shape())} {dst.element_type}"
            )


POINTWISE_KINDS: tuple[str, ...] = (
    *(op.name.removeprefix("fusion.") for op in UnaryOp.__subclasses__()),
    *(op.name.removeprefix("fusion.") for op in BinaryOp.__subclasses__()),
    CastOp.name.removeprefix("fusion."),
)


@irdl_op_definition
class PointwiseOp(ComputeOp):
    """One pointwise fusion op, by name, computed eagerly into `outs[0]`.

    `hir.pointwise "add" ins(%a, %b : T, T) outs(%c : T)`
    """

    name = "hir.pointwise"
    NUM_INS: ClassVar[tuple[int, ...]] = (1, 2)

    kind = prop_def(StringAttr)

    assembly_format = (
        "$kind `ins` `(` $ins `:` type($ins) `)` `outs` `(` $outs `:` type($outs) `)` attr-dict"
    )

    def __init__(self, kind: str, ins: Sequence[SSAValue], outs: Sequence[SSAValue]):
        super().__init__(ins, outs, {"kind": StringAttr(kind)})

    def verify_(self) -> None:
        super().verify_()
        if self.kind.data not in POINTWISE_KINDS:
            raise VerifyException(
                f"unknown pointwise kind '{self.kind.data}'; expected one of "
                + ", ".join(POINTWISE_KINDS)
            )


@irdl_op_definition
class ReductionOp(ComputeOp):
    """`hir.reduction sum [1] keepdim ins(%a : T) outs(%b : T2)`: `fusion.sum`/`fusion.max` on buffers."""

    name = "hir.reduction"
    NUM_INS: ClassVar[tuple[int, ...]] = (1,)

    kind = prop_def(StringAttr)
    axes = prop_def(DenseArrayBase[I64])
    keepdim = opt_prop_def(UnitAttr)

    assembly_format = (
        "$kind $axes (`keepdim` $keepdim^)? `ins` `(` $ins `:` type($ins) `)` "
        "`outs` `(` $outs `:` type($outs) `)` attr-dict"
    )

    def __init__(
        self,
        kind: str,
        axes: Sequence[int],
        keepdim: bool,
        ins: Sequence[SSAValue],
        outs: Sequence[SSAValue],
    ):
        properties: dict[str, Attribute] = {
            "kind": StringAttr(kind),
            "axes": DenseArrayBase.from_list(i64, axes),
        }
        if keepdim:
            properties["keepdim"] = UnitAttr()
        super().__init__(ins, outs, properties)

    def verify_(self) -> None:
        super().verify_()
        if not self.axes.get_values():
            raise VerifyException("a reduction needs at least one axis")
        if self.kind.data not in ("sum", "max"):
            raise VerifyException(f"unknown reduction '{self.kind.data}'; expected sum or max")
        source = tensor_type(self.ins[0])
        axes = normalize_axes(self.axes.get_values(), source.rank, "reduction")
        expected = reduction_shape(source.get_shape(), axes, self.keepdim is not None)
        declared = tensor_type(self.outs[0]).get_shape()
        if not shapes_compatible(expected, declared):
            raise VerifyException(
                f"reducing {shape_str(source.get_shape())} over {list(axes)} gives "
                f"{shape_str(expected)}, but the output is {shape_str(declared)}"
            )


class AttentionComputeOp(ComputeOp, ABC):
    """`fusion.attention` or its backward on buffers, with the same properties (the causal
    mask, blocked keys, the scale; a mask operand is the last of `ins`), and an optional
    `block` index: the keys and values are then the rows of one device, the one at position
    `block` of the queries' mesh, which a causal layout places in the sequence (the ring of
    context parallelism computes one such block per step). The outs are written in their own
    element type: the queries', or f32 where a ring keeps its running sums. Without `block`,
    the outs that `adopted` names become the kernel's results (`verify_adopted`), which keep
    the kernel's layout: the heads inside the rows, so that the output transposed to rows
    of all heads (the next projection's input) is a view.

    `hir.attention causal head_tail block %s ins(%q, %k, %v : Tq, Tk, Tv) outs(%out, %lse : To, Tl)`
    `hir.attention causal top_left ins(%q, %k, %v : Tq, Tk, Tv) outs(%out, %lse : To, Tl) adopted [0, 1]`
    """

    OPERANDS: ClassVar[int]
    """The ins before an optional mask."""

    assembly_format = None  # printed and parsed below: the properties take keywords

    causal = opt_prop_def(fusion.CausalAttr)
    blocks = opt_prop_def(UnitAttr)
    scale = opt_prop_def(FloatAttr)
    adopted = opt_prop_def(DenseArrayBase[I64])
    """The outs that become the kernel's results (`verify_adopted`); only without `block`."""
    block = opt_operand_def(IndexType)

    def __init__(
        self,
        ins: Sequence[SSAValue],
        outs: Sequence[SSAValue],
        properties: dict[str, Attribute],
        block: SSAValue | None = None,
    ):
        IRDLOperation.__init__(self, operands=[[] if block is None else [block], ins, outs], properties=properties)

    def verify_(self) -> None:
        super().verify_()
        if self.adopted is not None and self.block is not None:
            raise VerifyException(
                "adopted outs become the kernel's results, but with block the op writes its rows "
                "into the outs it is given"
            )
        verify_adopted(self)

    @property
    def causal_mask(self) -> fusion.Causal | None:
        return None if self.causal is None else self.causal.data

    @property
    def mask(self) -> SSAValue | None:
        return self.ins[self.OPERANDS] if len(self.ins) > self.OPERANDS else None

    @abstractmethod
    def kernel_element_type(self, index: int) -> Attribute:
        """The element type of the kernel's result for out #`index` (an adopted out's)."""

    def attention_batch(
        self, query: SSAValue, key: SSAValue, value: SSAValue
    ) -> tuple[fusion.Keys, fusion.Keys, tuple[int, ...]]:
        """The keys, the values and the batch axes, the mask and the block checked."""
        q = tensor_type(query)
        blocks = self.blocks is not None
        keys, values, batch = fusion.check_attention_operands(q, tensor_type(key), tensor_type(value), blocks)
        mask = None if self.mask is None else tensor_type(self.mask)
        fusion.check_attention_mask(q, keys, batch, mask, self.causal_mask, blocks)
        if mask is not None:
            batch = fusion.broadcast_shapes(batch, mask.get_shape()[:-2])
        if self.block is None:
            fusion.check_whole_keys(q, keys, self.causal_mask)
            return keys, values, batch
        if self.causal_mask is None or not self.causal_mask.is_layout or blocks:
            raise VerifyException(
                "block names the device whose rows the keys are, which places them in a sequence "
                "sharded over the queries' mesh: it needs causal contiguous or head_tail, and keys not in blocks"
            )
        rows = q.get_shape()[-2]
        if DYNAMIC not in (rows, keys.rows) and keys.rows != rows:
            raise VerifyException(f"the keys of a block are the {rows} rows of one device, but there are {keys.rows}")
        return keys, values, batch

    def verify_outs(self, expected: Sequence[tuple[int, tuple[int, ...], tuple[Attribute, ...], str]]) -> None:
        for index, shape, element_types, what in expected:
            declared = tensor_type(self.outs[index])
            if declared.element_type not in element_types:
                raise VerifyException(
                    f"the {what} is {declared.element_type}; expected "
                    + " or ".join(str(t) for t in dict.fromkeys(element_types))
                )
            if not shapes_compatible(declared.get_shape(), shape):
                raise VerifyException(
                    f"the {what} has shape {shape_str(declared.get_shape())}, but the ins give {shape_str(shape)}"
                )

    def print(self, printer: Printer) -> None:
        fusion.print_attention_properties(printer, self)
        if self.block is not None:
            printer.print_string(" block ")
            printer.print_operand(self.block)
        for keyword, values in (("ins", self.ins), ("outs", self.outs)):
            printer.print_string(f" {keyword}(")
            printer.print_list(values, printer.print_operand)
            printer.print_string(" : ")
            printer.print_list([v.type for v in values], printer.print_attribute)
            printer.print_string(")")
        print_adopted(printer, self.adopted)
        printer.print_op_attributes(self.attributes)

    @classmethod
    def parse(cls, parser: Parser) -> AttentionComputeOp:
        properties = fusion.parse_attention_properties(parser)
        block = parser.parse_operand(IndexType()) if parser.parse_optional_keyword("block") else None
        groups = []
        for keyword in ("ins", "outs"):
            parser.parse_keyword(keyword)
            parser.parse_punctuation("(")
            names = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_unresolved_operand)
            parser.parse_punctuation(":")
            types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
            parser.parse_punctuation(")")
            if len(names) != len(types):
                parser.raise_error(f"{len(names)} {keyword} but {len(types)} types")
            groups.append([parser.resolve_operand(n, t) for n, t in zip(names, types)])
        if (adopted := parse_adopted(parser)) is not None:
            properties = properties | {"adopted": adopted}
        op = cls(*groups, properties, block)
        op.attributes |= parser.parse_optional_attr_dict()
        return op


@irdl_op_definition
class AttentionOp(AttentionComputeOp):
    """`fusion.attention` on buffers: `ins(%q, %k, %v[, %mask]) outs(%out, %lse)`."""

    name = "hir.attention"
    NUM_INS: ClassVar[tuple[int, ...]] = (3, 4)
    NUM_OUTS: ClassVar[tuple[int, ...]] = (2,)
    OPERANDS: ClassVar[int] = 3

    def kernel_element_type(self, index: int) -> Attribute:
        """The element type of the kernel's result for out #`index`: the queries' for the
        output, f32 for the log-sum-exp."""
        return tensor_type(self.ins[0]).element_type if index == 0 else Float32Type()

    def verify_(self) -> None:
        super().verify_()
        q, k, v = self.ins[:3]
        _, values, batch = self.attention_batch(q, k, v)
        rows, element_type = tensor_type(q).get_shape()[-2], tensor_type(q).element_type
        self.verify_outs(
            [
                (0, (*batch, rows, values.width), (element_type, Float32Type()), "output"),
                (1, (*batch, rows), (Float32Type(),), "log-sum-exp"),
            ]
        )


@irdl_op_definition
class AttentionBackwardOp(AttentionComputeOp):
    """`fusion.attention_backward` on buffers: `ins(%dout, %q, %k, %v, %out, %lse[, %mask])
    outs(%dq, %dk, %dv)`; with `block`, the gradients of the keys and values are those of
    that block's rows, the queries' gradient their share of it."""

    name = "hir.attention_backward"
    NUM_INS: ClassVar[tuple[int, ...]] = (6, 7)
    NUM_OUTS: ClassVar[tuple[int, ...]] = (3,)
    OPERANDS: ClassVar[int] = 6

    def kernel_element_type(self, index: int) -> Attribute:
        """The element type of the kernel's result for out #`index`: that of the query, key or
        value it is the gradient of."""
        return tensor_type(self.ins[1 + index]).element_type

    def verify_(self) -> None:
        super().verify_()
        grad_output, q, k, v = self.ins[:4]
        self.attention_batch(q, k, v)
        element_type = tensor_type(q).element_type
        grad = tensor_type(grad_output)
        self.verify_outs(
            [
                (
                    index,
                    fusion.gradient_shape(tensor_type(operand), grad),
                    (element_type, Float32Type()),
                    f"{what}' gradient",
                )
                for index, operand, what in ((0, q, "queries"), (1, k, "keys"), (2, v, "values"))
            ]
        )


@irdl_op_definition
class AtenOp(ComputeOp):
    """`fusion.aten` on buffers: the ATen op `target` on the local pieces of `ins`, its
    results written into `outs` (a varying buffer's device axis dropped, as in the fusion).

    `hir.aten "aten.gelu.default"(%a) ins(%a : T) outs(%b : T)`

    The call is written as `fusion.aten`'s (`hostir_dialect.aten_syntax`; the literal
    form, `"aten.gelu.default" call "[[{'operand': 0}], {}]"`, is read too), and `ins` are
    the buffers it names, in the order it names them. `returns`, as in `fusion.aten`,
    names the items of ATen's tuple that fill `outs`.
    """

    name = "hir.aten"
    NUM_OUTS: ClassVar[tuple[int, ...]] = ()

    target = prop_def(StringAttr)
    call = prop_def(StringAttr)
    returns = opt_prop_def(DenseArrayBase[I64])
    adopted = opt_prop_def(DenseArrayBase[I64])
    """The outs that become the tensors the op makes (`verify_adopted`)."""

    assembly_format = None  # ComputeOp's: this op's text is its `parse` and `print`

    def __init__(
        self,
        target: StringAttr,
        call: StringAttr,
        ins: Sequence[SSAValue],
        outs: Sequence[SSAValue],
        returns: DenseArrayBase | None = None,
        adopted: DenseArrayBase | None = None,
    ):
        properties: dict[str, Attribute] = {"target": target, "call": call}
        if returns is not None:
            properties["returns"] = returns
        if adopted is not None:
            properties["adopted"] = adopted
        super().__init__(ins, outs, properties)

    def permuted_axes(self) -> tuple[int, ...] | None:
        """The axes of a permute (`aten.permute.default`, or `aten.transpose.int` of two axes), of
        its operand's local piece, in the order of its result's; None for any other op."""
        args, _ = decode_call(self.call.data)
        if self.target.data == "aten.permute.default":
            rank = len(args[1])
            return tuple(axis % rank for axis in args[1])
        if self.target.data != "aten.transpose.int" or len(args) != 3:
            return None
        rank = tensor_type(self.ins[0]).piece_rank
        axes = list(range(rank))
        first, second = args[1] % rank, args[2] % rank
        axes[first], axes[second] = axes[second], axes[first]
        return tuple(axes)

    @classmethod
    def parse(cls, parser: Parser) -> AtenOp:
        target, call, named, returns = parse_aten_call(parser)
        ins_start = parser.pos
        ins = _parse_buffers(parser, "ins", allow_none=True)
        if named and [u.span.text for u, _ in ins] != [u.span.text for u in named]:
            parser.raise_error(
                f"ins are the buffers the call names, in the order it names them: "
                f"{', '.join(u.span.text for u in named)}",
                ins_start,
                parser.pos,
            )
        outs = _parse_buffers(parser, "outs", allow_none=False)
        adopted = parse_adopted(parser)
        attributes = parser.parse_optional_attr_dict()
        op = cls(
            StringAttr(target),
            StringAttr(call),
            [parser.resolve_operand(u, t) for u, t in ins],
            [parser.resolve_operand(u, t) for u, t in outs],
            None if returns is None else DenseArrayBase.from_list(i64, returns),
            adopted,
        )
        op.attributes.update(attributes)
        return op

    def print(self, printer: Printer) -> None:
        print_aten_call(printer, self)
        for keyword, buffers in (("ins", self.ins), ("outs", self.outs)):
            printer.print_string(f" {keyword}(")
            if buffers:
                printer.print_list(buffers, printer.print_operand)
                printer.print_string(" : ")
                printer.print_list([b.type for b in buffers], printer.print_attribute)
            printer.print_string(")")
        print_adopted(printer, self.adopted)
        printer.print_op_attributes(self.attributes)

    def verify_(self) -> None:
        super().verify_()
        check_call_operands(self.target.data, self.call.data, len(self.ins))
        check_returns(self.target.data, self.returns, len(self.outs), "out")
        verify_adopted(self)


def _parse_buffers(parser: Parser, keyword: str, allow_none: bool) -> list[tuple[UnresolvedOperand, Attribute]]:
    """`keyword(%a, %b : T, U)`: the buffers and their types (`keyword()` where `allow_none`)."""
    parser.parse_keyword(keyword)
    parser.parse_punctuation("(")
    if allow_none and parser.parse_optional_punctuation(")") is not None:
        return []
    position = parser.pos
    buffers = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_unresolved_operand)
    parser.parse_punctuation(":")
    types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
    parser.parse_punctuation(")")
    if len(types) != len(buffers):
        parser.raise_error(f"{len(buffers)} buffer(s) but {len(types)} type(s)", position, parser.pos)
    return list(zip(buffers, types))


def parse_adopted(parser: Parser) -> DenseArrayBase | None:
    """An op's optional ` adopted [i, ...]` after its outs."""
    if parser.parse_optional_keyword("adopted") is None:
        return None
    indices = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)
    return DenseArrayBase.from_list(i64, indices)


def print_adopted(printer: Printer, adopted: DenseArrayBase | None) -> None:
    if adopted is not None:
        printer.print_string(f" adopted [{', '.join(map(str, adopted.get_values()))}]")


def adopted_outs(op: AdoptingOp) -> tuple[int, ...]:
    """The indices of the outs that `op`'s `adopted` names (none without it)."""
    return () if op.adopted is None else tuple(op.adopted.get_values())


def verify_adopted(op: AdoptingOp) -> None:
    """The outs an op's `adopted` names (`hir.aten ... outs(%a, %b : T, U) adopted [1]`) become
    the tensors the op makes (ATen's results, which keep their strides and stay views where
    they are views, or the views a data-movement segment makes), instead of getting them
    copied in: each must be an out, named once, in increasing order, and a whole buffer that
    only this device uses, which the op fills first (`forward-buffers` marks those)."""
    if op.adopted is None:
        return
    indices = list(adopted_outs(op))
    if not indices or indices != sorted(set(indices)):
        raise VerifyException(
            f"adopted names the outs that become the tensors {op.name} makes, each once and in "
            f"increasing order; got {indices}"
        )
    for index in indices:
        if not 0 <= index < len(op.outs):
            raise VerifyException(f"adopted names out #{index}, but {op.name} has {len(op.outs)} out(s)")
        problem = whole_buffer_problem(op, op.outs[index])
        if problem is not None:
            raise VerifyException(
                f"out #{index} is adopted, so it must be a buffer of hir.allocate in the op's block, "
                f"not symmetric, that the op's result replaces; it is {problem}"
            )


class SegmentCallee(SymbolUserOpInterface):
    """The callee of a segment call is a `func.func` taking `ins` and returning `outs`' types."""

    def verify(self, op: Operation) -> None:
        assert isinstance(op, SegmentCallOp)
        name = f"'@{op.callee.string_value()}'"
        callee = op.callee_function()
        inputs = list(callee.function_type.inputs.data)
        ins = [v.type for v in op.ins]
        if inputs != ins:
            raise VerifyException(
                f"{name} takes inputs ({', '.join(map(str, inputs))}) but the ins are "
                f"({', '.join(map(str, ins))})"
            )
        outputs = callee.function_type.outputs.data
        if len(outputs) != len(op.outs):
            raise VerifyException(
                f"{name} returns {len(outputs)} result(s) but {len(op.outs)} outs are given"
            )


class SegmentCallOp(ComputeOp, ABC):
    """Runs the fused segment `@callee` (a `func.func` of fusion ops) on buffers.

    `hir.launch_kernel @seg ins(%a, %b : T, T) outs(%c : T)`
    """

    NUM_OUTS: ClassVar[tuple[int, ...]] = ()

    callee = prop_def(SymbolRefAttr)

    traits = traits_def(SegmentCallee())

    assembly_format = (
        "$callee `ins` `(` ($ins^ `:` type($ins))? `)` `outs` `(` $outs `:` type($outs) `)` attr-dict"
    )

    def __init__(
        self,
        callee: str | SymbolRefAttr,
        ins: Sequence[SSAValue],
        outs: Sequence[SSAValue],
    ):
        if isinstance(callee, str):
            callee = SymbolRefAttr(callee)
        super().__init__(ins, outs, {"callee": callee})

    def callee_function(self) -> func.FuncOp:
        """The segment this op runs: the `func.func` of its module named `@callee`."""
        callee = SymbolTable.lookup_symbol(self, self.callee)
        if not isinstance(callee, func.FuncOp):
            raise VerifyException(f"'@{self.callee.string_value()}' is not a function in this module")
        return callee


def segment_name(host: func.FuncOp, stem: str = "segment") -> str:
    """The symbol of a new segment of `host`: `<host>_<stem>_<k>` with the first `k` that names
    no symbol of its module yet."""
    k = 0
    while SymbolTable.lookup_symbol(host, f"{host.sym_name.data}_{stem}_{k}"):
        k += 1
    return f"{host.sym_name.data}_{stem}_{k}"


@irdl_op_definition
class LaunchKernelOp(SegmentCallOp):
    """Launches the segment compiled into one kernel (nvFuser's LaunchKernel)."""

    name = "hir.launch_kernel"


@irdl_op_definition
class PostOnStreamOp(SegmentCallOp):
    """Runs the segment op by op on the current stream (nvFuser's PostOnStream of a HostUnit).

    Its segment only moves data, so its results are views of its inputs; the outs that
    `adopted` names become those views (`verify_adopted`), the others get them copied in.
    """

    name = "hir.post_on_stream"

    adopted = opt_prop_def(DenseArrayBase[I64])

    assembly_format = (
        "$callee `ins` `(` ($ins^ `:` type($ins))? `)` `outs` `(` $outs `:` type($outs) `)` "
        "(`adopted` $adopted^)? attr-dict"
    )

    def verify_(self) -> None:
        super().verify_()
        verify_adopted(self)


AdoptingOp = AtenOp | PostOnStreamOp | AttentionComputeOp
"""The ops whose outs may become the tensors they make (`adopted`)."""


Hir = Dialect(
    "hir",
    [
        AllocateOp,
        DeallocateOp,
        DimOp,
        AliasSelectOp,
        DeviceIndexOp,
        NumberOfStreamsOp,
        GetCurrentStreamOp,
        StreamOp,
        SetCurrentStreamOp,
        SynchronizeStreamOp,
        *COLLECTIVE_OPS,
        SendOp,
        RecvOp,
        StartCoalescingOp,
        EndCoalescingOp,
        WaitOp,
        MatmulOp,
        LinearOp,
        CopyOp,
        AtenOp,
        PointwiseOp,
        ReductionOp,
        AttentionOp,
        AttentionBackwardOp,
        LaunchKernelOp,
        PostOnStreamOp,
    ],
    [StreamType, WorkType, CommunicatorBackendAttr],
)
