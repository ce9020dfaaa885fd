"""The `fusion` dialect: tensor programs whose tensors say how they are sharded.

A fusion is a `func.func` whose values are `!fusion.tensor`s. A tensor type carries
its logical shape, its element type, the device mesh it lives on and one parallel
type per axis:

    !fusion.tensor<[?, 8, 64], bf16, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, didx, _]>

`_` is `serial`; `didx` shards an axis over the mesh (its logical extent is the
mesh size and every device holds extent 1 of it, as nvFuser's DIDx); `stream`
asks the host program to walk the axis in a loop whose iterations run on
different CUDA streams. The mesh defaults to the single device `[0]` and the axes
to all `serial`; both are printed only when they differ from the default.

Ops have value semantics and torch semantics for shapes and broadcasting. The
shape rules live here (`infer_shape`) because both the verifiers and the Python
builder need them: the builder derives result types from them, the verifiers
check declared result types against them.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    I64,
    DenseArrayBase,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    UnitAttr,
    f64,
    i64,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import (
    Attribute,
    Dialect,
    Operation,
    ParametrizedAttribute,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
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
    var_result_def,
)
from xdsl.parser import AttrParser, Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from hostir_dialect.aten_syntax import call_operands, parse_optional_call, print_call

DYNAMIC = -1
"""The extent of an axis whose size is only known at run time (`?` in text)."""

INT64_MAX = 2**63 - 1
"""The largest extent: the runtime holds extents in int64 (torch's sizes)."""

MAX_DEVICE_ID = 2**31 - 1
"""The largest device id: a device is a torch.distributed rank, a C `int` there and in NCCL."""

Shape = tuple[int, ...]

SUPPORTED_ELEMENT_TYPES = (
    "f64",
    "f32",
    "f16",
    "bf16",
    "i64",
    "i32",
    "i8",
    "i1",
)


def element_type_name(element_type: Attribute) -> str:
    """The short name (`f32`, `bf16`, `i1`, ...) of a supported element type."""
    match element_type:
        case Float64Type():
            return "f64"
        case Float32Type():
            return "f32"
        case Float16Type():
            return "f16"
        case BFloat16Type():
            return "bf16"
        case IntegerType() if element_type.width.data in (1, 8, 32, 64):
            return f"i{element_type.width.data}"
        case _:
            raise VerifyException(
                f"element type {element_type} is not supported; expected one of "
                + ", ".join(SUPPORTED_ELEMENT_TYPES)
            )


# --------------------------------------------------------------------------- #
# Attributes and the tensor type                                               #
# --------------------------------------------------------------------------- #


class ParallelType(StrEnum):
    """How one axis of a tensor is laid out over devices and streams."""

    SERIAL = "serial"
    DIDX = "didx"
    STREAM = "stream"


@irdl_attr_definition
class ParallelTypeAttr(EnumAttribute[ParallelType], SpacedOpaqueSyntaxAttribute):
    """`#fusion<parallel_type didx>`; inside a tensor type just `_` (`serial` is read too), `didx` or `stream`."""

    name = "fusion.parallel_type"


SERIAL = ParallelTypeAttr(ParallelType.SERIAL)
DIDX = ParallelTypeAttr(ParallelType.DIDX)
STREAM = ParallelTypeAttr(ParallelType.STREAM)


def parse_device_list(parser: AttrParser) -> list[int]:
    return parser.parse_comma_separated_list(
        parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_negative=False)
    )


def parse_device_list_checked(parser: AttrParser) -> list[int]:
    """A device list, with a located error when it is not a valid mesh."""
    start = parser.pos
    devices = parse_device_list(parser)
    _located(parser, start, lambda: DeviceMeshAttr(devices))
    return devices


def _located(parser: AttrParser, start: int, build) -> None:
    """Runs `build`; a VerifyException becomes a parse error on the text since `start`.

    Attribute verifiers run when the parser builds the attribute, outside any span,
    so without this a bad type would be reported with no location.
    """
    try:
        build()
    except VerifyException as e:
        parser.raise_error(str(e), start, parser.pos)


def print_device_list(printer: Printer, devices: Sequence[int]) -> None:
    with printer.in_square_brackets():
        printer.print_list(devices, printer.print_int)


@irdl_attr_definition
class DeviceMeshAttr(ParametrizedAttribute):
    """An ordered set of devices (ranks): `#fusion.mesh<[0, 1, 2, 3]>`.

    Also used for the team of a communication, which is a set of devices too.
    """

    name = "fusion.mesh"

    devices: ArrayAttr[IntAttr]

    def __init__(self, devices: Sequence[int] | ArrayAttr[IntAttr]):
        if not isinstance(devices, ArrayAttr):
            devices = ArrayAttr(IntAttr(d) for d in devices)
        super().__init__(devices)

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(d.data for d in self.devices.data)

    @property
    def size(self) -> int:
        return len(self.devices.data)

    def verify(self) -> None:
        ids = self.ids
        if not ids:
            raise VerifyException("a device mesh needs at least one device")
        if any(d < 0 for d in ids):
            raise VerifyException(f"device ids must be non-negative, got {list(ids)}")
        if (too_large := next((d for d in ids if d > MAX_DEVICE_ID), None)) is not None:
            raise VerifyException(
                f"device id {too_large} is too large: a device id is a torch.distributed rank, "
                f"a signed 32-bit integer (at most {MAX_DEVICE_ID})"
            )
        if len(set(ids)) != len(ids):
            duplicates = sorted({d for d in ids if ids.count(d) > 1})
            raise VerifyException(
                f"device mesh {list(ids)} lists device(s) {duplicates} more than once"
            )

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            devices = parse_device_list_checked(parser)
        return (ArrayAttr(IntAttr(d) for d in devices),)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            print_device_list(printer, self.ids)


SINGLE_DEVICE = DeviceMeshAttr([0])


@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """A tensor with a logical shape, an element type, a mesh and a parallel type per axis."""

    name = "fusion.tensor"

    shape: ArrayAttr[IntAttr]
    element_type: Attribute
    mesh: DeviceMeshAttr
    axes: ArrayAttr[ParallelTypeAttr]

    def __init__(
        self,
        shape: Sequence[int],
        element_type: Attribute,
        mesh: DeviceMeshAttr | Sequence[int] = SINGLE_DEVICE,
        axes: Sequence[ParallelTypeAttr | ParallelType | str] | None = None,
    ):
        if not isinstance(mesh, DeviceMeshAttr):
            mesh = DeviceMeshAttr(mesh)
        if axes is None:
            axes = [SERIAL] * len(shape)
        super().__init__(
            ArrayAttr(IntAttr(d) for d in shape),
            element_type,
            mesh,
            ArrayAttr(
                a if isinstance(a, ParallelTypeAttr) else ParallelTypeAttr(ParallelType(a))
                for a in axes
            ),
        )

    # -- queries ------------------------------------------------------------ #

    def get_shape(self) -> Shape:
        return tuple(d.data for d in self.shape.data)

    @property
    def rank(self) -> int:
        return len(self.shape.data)

    def parallel_types(self) -> tuple[ParallelType, ...]:
        return tuple(a.data for a in self.axes.data)

    def axes_of(self, parallel_type: ParallelType) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.parallel_types()) if p == parallel_type)

    @property
    def didx_axis(self) -> int | None:
        axes = self.axes_of(ParallelType.DIDX)
        return axes[0] if axes else None

    @property
    def stream_axis(self) -> int | None:
        axes = self.axes_of(ParallelType.STREAM)
        return axes[0] if axes else None

    @property
    def is_sharded(self) -> bool:
        return self.didx_axis is not None

    @property
    def piece_rank(self) -> int:
        """The rank of the local piece that an ATen call gets (`fusion.aten`, `hir.aten`): a
        varying tensor's device axis, its first, is not passed."""
        return self.rank - (self.didx_axis == 0)

    @property
    def piece_shape(self) -> Shape:
        """The shape of that piece: the type's shape but a varying tensor's device axis."""
        return self.get_shape()[self.rank - self.piece_rank :]

    def local_shape(self) -> Shape:
        """The shape one device holds: every `didx` axis has extent 1."""
        return tuple(
            1 if p == ParallelType.DIDX else d
            for d, p in zip(self.get_shape(), self.parallel_types())
        )

    def with_(
        self,
        *,
        shape: Sequence[int] | None = None,
        element_type: Attribute | None = None,
        mesh: DeviceMeshAttr | Sequence[int] | None = None,
        axes: Sequence[ParallelTypeAttr | ParallelType | str] | None = None,
    ) -> TensorType:
        """A copy of this type with some parameters replaced."""
        shape = self.get_shape() if shape is None else shape
        if axes is None:
            axes = self.axes.data if len(shape) == self.rank else None
        return TensorType(
            shape,
            self.element_type if element_type is None else element_type,
            self.mesh if mesh is None else mesh,
            axes,
        )

    def without_axis(self, axis: int) -> TensorType:
        """The type of one slice of this tensor along `axis`."""
        shape = list(self.get_shape())
        axes = list(self.axes.data)
        del shape[axis], axes[axis]
        return TensorType(shape, self.element_type, self.mesh, axes)

    def sharding_str(self) -> str:
        """`mesh = [..], axes = [..]`, the part of the type that says where data lives."""
        axes = ", ".join("_" if p == ParallelType.SERIAL else p.value for p in self.parallel_types())
        return f"mesh = {list(self.mesh.ids)}, axes = [{axes}]"

    # -- verification --------------------------------------------------------- #

    def verify(self) -> None:
        if len(self.axes.data) != len(self.shape.data):
            raise VerifyException(
                f"tensor of rank {len(self.shape.data)} has {len(self.axes.data)} parallel "
                "types; give one per axis"
            )
        for i, d in enumerate(self.get_shape()):
            if d < 0 and d != DYNAMIC:
                raise VerifyException(f"axis {i} has negative extent {d}")
            if d > INT64_MAX:
                raise VerifyException(
                    f"axis {i} has extent {d}, too large: an extent must fit in a signed "
                    f"64-bit integer (at most {INT64_MAX})"
                )
        element_type_name(self.element_type)
        didx = self.axes_of(ParallelType.DIDX)
        if len(didx) > 1:
            raise VerifyException(
                f"axes {list(didx)} are both didx; a one-dimensional mesh shards at most one axis"
            )
        streams = self.axes_of(ParallelType.STREAM)
        if len(streams) > 1:
            raise VerifyException(
                f"axes {list(streams)} are both stream; at most one axis may be stream-parallel"
            )
        if didx:
            extent = self.get_shape()[didx[0]]
            if extent not in (DYNAMIC, self.mesh.size):
                raise VerifyException(
                    f"didx axis {didx[0]} has extent {extent} but the mesh has "
                    f"{self.mesh.size} device(s); a didx axis spans the mesh"
                )

    # -- text ------------------------------------------------------------------ #

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        start = parser.pos
        with parser.in_angle_brackets():
            shape = parser.parse_comma_separated_list(
                parser.Delimiter.SQUARE, lambda: _parse_extent(parser)
            )
            parser.parse_punctuation(",", " between the shape and the element type")
            element_type = parser.parse_type()
            mesh = SINGLE_DEVICE
            axes = [SERIAL] * len(shape)
            if parser.parse_optional_punctuation(","):
                keyword = parser.parse_keyword_in(("mesh", "axes"), " in a fusion.tensor type")
                if keyword == "mesh":
                    parser.parse_punctuation("=")
                    mesh = DeviceMeshAttr(parse_device_list_checked(parser))
                    if parser.parse_optional_punctuation(","):
                        parser.parse_keyword("axes")
                        keyword = "axes"
                if keyword == "axes":
                    parser.parse_punctuation("=")
                    axes = parser.parse_comma_separated_list(
                        parser.Delimiter.SQUARE, lambda: _parse_parallel_type(parser)
                    )
        _located(parser, start, lambda: TensorType(shape, element_type, mesh, axes))
        return (
            ArrayAttr(IntAttr(d) for d in shape),
            element_type,
            mesh,
            ArrayAttr(axes),
        )

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            with printer.in_square_brackets():
                printer.print_list(
                    self.get_shape(),
                    lambda d: printer.print_string("?" if d == DYNAMIC else str(d)),
                )
            printer.print_string(", ")
            printer.print_attribute(self.element_type)
            if self.mesh != SINGLE_DEVICE:
                printer.print_string(", mesh = ")
                print_device_list(printer, self.mesh.ids)
            if any(p != ParallelType.SERIAL for p in self.parallel_types()):
                printer.print_string(", axes = ")
                with printer.in_square_brackets():
                    printer.print_list(
                        self.parallel_types(),
                        lambda p: printer.print_string(
                            "_" if p == ParallelType.SERIAL else p.value
                        ),
                    )


def _parse_extent(parser: AttrParser) -> int:
    if parser.parse_optional_punctuation("?"):
        return DYNAMIC
    return parser.parse_integer(allow_negative=False, context_msg=" or '?' as an extent")


def _parse_parallel_type(parser: AttrParser) -> ParallelTypeAttr:
    name = parser.parse_identifier(" as a parallel type (_, didx or stream)")
    if name == "_":
        return SERIAL
    if name not in set(ParallelType):
        parser.raise_error(
            f"unknown parallel type '{name}'; expected _ (or serial), didx or stream",
            parser.pos - len(name),
            parser.pos,
        )
    return ParallelTypeAttr(ParallelType(name))


def tensor_type(value: SSAValue) -> TensorType:
    assert isinstance(value.type, TensorType), value.type
    return value.type


# --------------------------------------------------------------------------- #
# Shape rules (torch semantics)                                                #
# --------------------------------------------------------------------------- #


def shape_str(shape: Shape) -> str:
    return "[" + ", ".join("?" if d == DYNAMIC else str(d) for d in shape) + "]"


def broadcast_shapes(*shapes: Shape) -> Shape:
    """torch broadcasting of static-or-dynamic shapes; raises on a sure mismatch."""
    rank = max(len(s) for s in shapes)
    result: list[int] = []
    for i in range(rank):
        extents = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        static = {e for e in extents if e not in (1, DYNAMIC)}
        if len(static) > 1:
            raise VerifyException(
                "shapes " + ", ".join(shape_str(s) for s in shapes) + " do not broadcast: "
                f"axis {i} of the result would need extents {sorted(static)}"
            )
        if static:
            result.append(static.pop())
        elif DYNAMIC in extents:
            result.append(DYNAMIC)
        else:
            result.append(1)
    return tuple(result)


def _same_extent(a: int, b: int) -> bool:
    return a == b or DYNAMIC in (a, b)


def shapes_compatible(a: Shape, b: Shape) -> bool:
    """Equal ranks and equal extents wherever both are static."""
    return len(a) == len(b) and all(_same_extent(x, y) for x, y in zip(a, b))


def matmul_shape(a: Shape, b: Shape) -> Shape:
    """torch.matmul's result shape."""
    if not a or not b:
        raise VerifyException("matmul operands must have rank at least 1")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if not _same_extent(a2[-1], b2[-2]):
        raise VerifyException(
            f"matmul contracts axis of extent {a2[-1]} of {shape_str(a)} with extent "
            f"{b2[-2]} of {shape_str(b)}; they must be equal"
        )
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    result = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        result = result[:-2] + result[-1:]
    if len(b) == 1:
        result = result[:-1]
    return result


def check_matmul_bias(bias: Shape, product: Shape) -> None:
    """A matmul's bias broadcasts to its product without changing the product's shape."""
    try:
        fits = len(bias) <= len(product) and shapes_compatible(broadcast_shapes(product, bias), product)
    except VerifyException:
        fits = False
    if not fits:
        raise VerifyException(f"matmul bias {shape_str(bias)} does not broadcast to the product {shape_str(product)}")


def linear_shape(x: Shape, w: Shape, bias: Shape | None) -> Shape:
    """torch.nn.functional.linear's result shape: x @ w^T + bias."""
    if not x:
        raise VerifyException("linear input must have rank at least 1")
    if len(w) not in (1, 2):
        raise VerifyException(f"linear weight must have rank 1 or 2, got {shape_str(w)}")
    if not _same_extent(x[-1], w[-1]):
        raise VerifyException(
            f"linear contracts the last axis of the input {shape_str(x)} with the last "
            f"axis of the weight {shape_str(w)}; their extents must be equal"
        )
    result = x[:-1] + (w[:1] if len(w) == 2 else ())
    if bias is not None:
        if len(bias) > 1:
            raise VerifyException(f"linear bias must have rank 0 or 1, got {shape_str(bias)}")
        try:
            broadcast_shapes(result, bias)
        except VerifyException:
            raise VerifyException(
                f"linear bias {shape_str(bias)} does not broadcast to the result {shape_str(result)}"
            ) from None
    return result


def normalize_axes(axes: Sequence[int], rank: int, what: str) -> tuple[int, ...]:
    normalized = []
    for axis in axes:
        if not -rank <= axis < rank:
            raise VerifyException(
                f"{what} axis {axis} is out of range for a tensor of rank {rank}"
            )
        normalized.append(axis % rank)
    if len(set(normalized)) != len(normalized):
        raise VerifyException(f"{what} axes {list(axes)} name an axis twice")
    return tuple(normalized)


def reduction_shape(shape: Shape, axes: Sequence[int], keepdim: bool) -> Shape:
    axes = normalize_axes(axes, len(shape), "reduction")
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def broadcast_in_shape(shape: Shape, new_axes: Sequence[int]) -> Shape:
    """The shape after inserting an extent-1 axis at each of `new_axes` of the result."""
    rank = len(shape) + len(new_axes)
    positions = normalize_axes(new_axes, rank, "broadcast")
    it = iter(shape)
    return tuple(1 if i in positions else next(it) for i in range(rank))


# --------------------------------------------------------------------------- #
# Operations                                                                   #
# --------------------------------------------------------------------------- #


class FusionOp(IRDLOperation, ABC):
    """Base of fusion ops: they compute one tensor; `infer_shape` gives its shape."""

    traits = traits_def(Pure())

    def infer_shape(self) -> Shape:
        raise NotImplementedError

    def expected_element_type(self) -> Attribute:
        return tensor_type(self.operands[0]).element_type

    def verify_(self) -> None:
        for i, operand in enumerate(self.operands):
            if not isinstance(operand.type, TensorType):
                raise VerifyException(f"operand {i} must be a !fusion.tensor, got {operand.type}")
        result = tensor_type(self.results[0])
        if self.operands and result.element_type != self.expected_element_type():
            raise VerifyException(
                f"result element type {result.element_type} differs from the expected "
                f"{self.expected_element_type()}"
            )
        inferred = self.infer_shape()
        declared = result.get_shape()
        if not shapes_compatible(inferred, declared):
            raise VerifyException(
                f"result shape {shape_str(declared)} does not match the shape "
                f"{shape_str(inferred)} that the operands give"
            )


class OneOperandOp(FusionOp, ABC):
    """An op of one tensor operand and one tensor result, `%x : T -> T2` in text; the result's
    type is the operand's unless given."""

    input = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, result_type: TensorType | None = None):
        super().__init__(operands=[input], result_types=[result_type or tensor_type(input)])


@irdl_op_definition
class SetOp(OneOperandOp):
    """A copy. The op through which a tensor changes its mesh or its sharding."""

    name = "fusion.set"

    def infer_shape(self) -> Shape:
        """The input's shape, whose extent on the axis the result splits over its mesh, if
        known, must be the mesh's size: a `?` there would hide an extent no rank can hold."""
        shape = tensor_type(self.input).get_shape()
        result = tensor_type(self.result)
        axis = result.didx_axis
        if axis is not None and axis < len(shape) and shape[axis] >= 0 and shape[axis] != result.mesh.size:
            raise VerifyException(
                f"axis {axis} of extent {shape[axis]} cannot become a didx axis over the "
                f"{result.mesh.size} device(s) of the result's mesh; a didx axis spans the mesh"
            )
        return shape


class UnaryOp(OneOperandOp, ABC):
    """A pointwise op of one operand."""

    def infer_shape(self) -> Shape:
        return tensor_type(self.input).get_shape()


@irdl_op_definition
class NegOp(UnaryOp):
    name = "fusion.neg"


@irdl_op_definition
class AbsOp(UnaryOp):
    name = "fusion.abs"


@irdl_op_definition
class ExpOp(UnaryOp):
    name = "fusion.exp"


@irdl_op_definition
class LogOp(UnaryOp):
    name = "fusion.log"


@irdl_op_definition
class SqrtOp(UnaryOp):
    name = "fusion.sqrt"


@irdl_op_definition
class RsqrtOp(UnaryOp):
    """`1 / sqrt(x)` (torch.rsqrt), one rounding: RMSNorm's scale."""

    name = "fusion.rsqrt"


@irdl_op_definition
class ReluOp(UnaryOp):
    name = "fusion.relu"


@irdl_op_definition
class TanhOp(UnaryOp):
    name = "fusion.tanh"


@irdl_op_definition
class SigmoidOp(UnaryOp):
    name = "fusion.sigmoid"


@irdl_op_definition
class ErfOp(UnaryOp):
    """The error function: the exact GELU is `0.5 x (1 + erf(x / sqrt 2))`."""

    name = "fusion.erf"


@irdl_op_definition
class RotateHalfOp(OneOperandOp):
    """The halves of the last axis swapped, the new first half negated: for a last axis of
    extent 2h, `cat([-x[..., h:], x[..., :h]], -1)`, the rotation of rotary position
    embeddings (Llama's `rotate_half`). Its transpose, which a backward applies, is its
    negation. Pointwise but along the last axis, where element j reads element j + h or
    j - h: a kernel reads its operand at the other half, so that axis stays whole on every
    device and stream (`_`)."""

    name = "fusion.rotate_half"

    def infer_shape(self) -> Shape:
        shape = tensor_type(self.input).get_shape()
        if not shape:
            raise VerifyException("a 0-dim tensor has no last axis to rotate")
        if shape[-1] >= 0 and shape[-1] % 2:
            raise VerifyException(f"the last axis has extent {shape[-1]}; its two halves swap, so it must be even")
        return shape

    def verify_(self) -> None:
        super().verify_()
        for what, value in (("operand", self.input), ("result", self.result)):
            if tensor_type(value).parallel_types()[-1] != ParallelType.SERIAL:
                raise VerifyException(
                    f"the {what}'s last axis is {tensor_type(value).parallel_types()[-1]}; the halves "
                    "of the axis a rotation swaps must be on one device and stream (`_`)"
                )


class BinaryOp(FusionOp, ABC):
    """A pointwise op of two operands with torch broadcasting."""


    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = (
        "$lhs `,` $rhs attr-dict `:` `(` type($lhs) `,` type($rhs) `)` `->` type($result)"
    )

    def __init__(self, lhs: SSAValue, rhs: SSAValue, result_type: TensorType):
        super().__init__(operands=[lhs, rhs], result_types=[result_type])

    def infer_shape(self) -> Shape:
        return broadcast_shapes(tensor_type(self.lhs).get_shape(), tensor_type(self.rhs).get_shape())

    def verify_(self) -> None:
        lhs, rhs = tensor_type(self.lhs), tensor_type(self.rhs)
        if lhs.element_type != rhs.element_type:
            raise VerifyException(
                f"operands have element types {lhs.element_type} and {rhs.element_type}; "
                "insert a fusion.cast to make them equal"
            )
        super().verify_()


@irdl_op_definition
class AddOp(BinaryOp):
    name = "fusion.add"

    def gemms_added(self) -> list[Operation]:
        """The GEMMs (`fusion.matmul`, `fusion.linear`) whose products this add reads: a sum
        that `sum-in-matmul` makes in a GEMM's epilogue, which kernels leave to it."""
        return [v.owner for v in self.operands if isinstance(v.owner, MatmulOp | LinearOp)]


@irdl_op_definition
class SubOp(BinaryOp):
    name = "fusion.sub"


@irdl_op_definition
class MulOp(BinaryOp):
    name = "fusion.mul"


@irdl_op_definition
class DivOp(BinaryOp):
    name = "fusion.div"


@irdl_op_definition
class MaximumOp(BinaryOp):
    """Pointwise maximum (torch.maximum); the reduction is `fusion.max`."""

    name = "fusion.maximum"


@irdl_op_definition
class MinimumOp(BinaryOp):
    """Pointwise minimum (torch.minimum)."""

    name = "fusion.minimum"


@irdl_op_definition
class PowOp(BinaryOp):
    name = "fusion.pow"


@irdl_op_definition
class ConstantOp(FusionOp):
    """A scalar (rank-0 tensor), for pointwise ops with a constant operand."""

    name = "fusion.constant"

    value = prop_def(FloatAttr | IntegerAttr)
    result = result_def(TensorType)

    assembly_format = "$value attr-dict `:` type($result)"

    def __init__(self, value: FloatAttr | IntegerAttr, result_type: TensorType):
        super().__init__(properties={"value": value}, result_types=[result_type])

    def expected_element_type(self) -> Attribute:
        return self.value.type

    def infer_shape(self) -> Shape:
        return ()

    def verify_(self) -> None:
        result = tensor_type(self.result)
        if result.element_type != self.value.type:
            raise VerifyException(
                f"constant of type {self.value.type} cannot produce a tensor of "
                f"{result.element_type}"
            )
        super().verify_()


@irdl_op_definition
class CastOp(OneOperandOp):
    """Converts the element type; the shape is unchanged."""

    name = "fusion.cast"

    def expected_element_type(self) -> Attribute:
        return tensor_type(self.result).element_type

    def infer_shape(self) -> Shape:
        return tensor_type(self.input).get_shape()


class ReductionOp(FusionOp, ABC):
    """A reduction over `axes`, keeping them as extent-1 axes when `keepdim` is set.

    Text: `fusion.sum %x [1, 2] keepdim : T -> T2`.
    """


    input = operand_def(TensorType)
    axes = prop_def(DenseArrayBase[I64])
    keepdim = opt_prop_def(UnitAttr)
    result = result_def(TensorType)

    def __init__(
        self,
        input: SSAValue,
        axes: Sequence[int],
        keepdim: bool,
        result_type: TensorType,
    ):
        properties: dict[str, Attribute] = {"axes": DenseArrayBase.from_list(i64, axes)}
        if keepdim:
            properties["keepdim"] = UnitAttr()
        super().__init__(operands=[input], properties=properties, result_types=[result_type])

    @property
    def reduced_axes(self) -> tuple[int, ...]:
        rank = tensor_type(self.input).rank
        return normalize_axes(self.axes.get_values(), rank, "reduction")

    @property
    def keeps_dims(self) -> bool:
        return self.keepdim is not None

    @property
    def sums_columns(self) -> bool:
        """Whether it sums every axis but the last: every axis of a local extent other than 1,
        and one at least (a weight's gradient, summed over the tokens), kept or not."""
        shape = tensor_type(self.input).local_shape()
        reduced = set(self.reduced_axes)
        rank = len(shape)
        return (
            isinstance(self, SumOp)
            and rank > 1
            and rank - 1 not in reduced
            and all(d in reduced for d in range(rank - 1) if shape[d] != 1)
            and any(shape[d] != 1 for d in reduced)
        )

    @property
    def sums_columns_in_a_kernel(self) -> bool:
        """Whether a segment's kernel that reduces rows may compute this column sum as it walks
        them: of f32 or f64 values. The kernel accumulates each column in the values' type
        over a whole block's rows, which 16-bit floats would round away."""
        return self.sums_columns and isinstance(tensor_type(self.input).element_type, Float32Type | Float64Type)

    def infer_shape(self) -> Shape:
        return reduction_shape(
            tensor_type(self.input).get_shape(),
            self.axes.get_values(),
            self.keeps_dims,
        )

    def verify_(self) -> None:
        if not self.axes.get_values():
            raise VerifyException("a reduction needs at least one axis")
        super().verify_()

    def print(self, printer: Printer) -> None:
        _print_axes_op(printer, self, self.axes, "keepdim" if self.keeps_dims else "")

    @classmethod
    def parse(cls, parser: Parser) -> ReductionOp:
        operand, axes, keepdim, attributes, input_type, result_type = _parse_axes_op(
            parser, "keepdim"
        )
        op = cls(parser.resolve_operand(operand, input_type), axes, keepdim, result_type)
        op.attributes |= attributes
        return op


def _print_axes_op(
    printer: Printer, op: IRDLOperation, axes: DenseArrayBase, flag: str
) -> None:
    """`%x [0, 2] flag {attrs} : T -> T2`, the syntax of ops with a list of axes."""
    printer.print_string(" ")
    printer.print_operand(op.operands[0])
    printer.print_string(" ")
    with printer.in_square_brackets():
        printer.print_list(axes.get_values(), printer.print_int)
    if flag:
        printer.print_string(f" {flag}")
    printer.print_op_attributes(op.attributes)
    printer.print_string(" : ")
    printer.print_attribute(op.operands[0].type)
    printer.print_string(" -> ")
    printer.print_attribute(op.results[0].type)


def _parse_axis(parser: Parser) -> int:
    """An axis of an axis list, with a located error when it cannot be an i64 property."""
    start = parser.pos
    axis = parser.parse_integer()
    if not -INT64_MAX - 1 <= axis <= INT64_MAX:
        parser.raise_error(
            f"axis {axis} is out of range: an axis must fit in a signed 64-bit integer", start, parser.pos
        )
    return axis


def _parse_axes_op(parser: Parser, flag: str | None):
    operand = parser.parse_unresolved_operand()
    axes = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, lambda: _parse_axis(parser))
    has_flag = flag is not None and parser.parse_optional_keyword(flag) is not None
    attributes = parser.parse_optional_attr_dict()
    parser.parse_punctuation(":")
    input_type = parser.parse_type()
    parser.parse_punctuation("->")
    result_type = parser.parse_type()
    return operand, axes, has_flag, attributes, input_type, result_type


@irdl_op_definition
class SumOp(ReductionOp):
    name = "fusion.sum"


@irdl_op_definition
class MaxOp(ReductionOp):
    """Maximum over axes (torch.amax); the pointwise maximum is `fusion.maximum`."""

    name = "fusion.max"


@irdl_op_definition
class BroadcastOp(FusionOp):
    """Inserts an extent-1 axis at each position `new_axes` of the result (nvFuser's broadcast).

    Text: `fusion.broadcast %x [0, 2] : T -> T2`.
    """

    name = "fusion.broadcast"

    input = operand_def(TensorType)
    new_axes = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)


    def __init__(self, input: SSAValue, new_axes: Sequence[int], result_type: TensorType):
        super().__init__(
            operands=[input],
            properties={"new_axes": DenseArrayBase.from_list(i64, new_axes)},
            result_types=[result_type],
        )

    def infer_shape(self) -> Shape:
        return broadcast_in_shape(
            tensor_type(self.input).get_shape(), self.new_axes.get_values()
        )

    def verify_(self) -> None:
        if not self.new_axes.get_values():
            raise VerifyException("a broadcast needs at least one new axis")
        super().verify_()

    def print(self, printer: Printer) -> None:
        _print_axes_op(printer, self, self.new_axes, "")

    @classmethod
    def parse(cls, parser: Parser) -> BroadcastOp:
        operand, axes, _, attributes, input_type, result_type = _parse_axes_op(parser, None)
        op = cls(parser.resolve_operand(operand, input_type), axes, result_type)
        op.attributes |= attributes
        return op


@irdl_op_definition
class ExpandOp(OneOperandOp):
    """`x` read with each of its extent-1 axes stretched to the result's extent (torch.expand),
    at the same rank: a view that moves no data.

    An expanded axis has a static extent in the result: the operand's 1 says nothing of it.
    Text: `fusion.expand %x : T -> T2`.
    """

    name = "fusion.expand"

    def infer_shape(self) -> Shape:
        shape, result = tensor_type(self.input).get_shape(), tensor_type(self.result).get_shape()
        if len(shape) != len(result):
            raise VerifyException(
                f"an expand keeps the rank: operand of rank {len(shape)}, result of rank {len(result)}"
            )
        didx = tensor_type(self.result).didx_axis
        for axis, (extent, expanded) in enumerate(zip(shape, result)):
            if extent == 1 and expanded == DYNAMIC:
                raise VerifyException(f"expanded axis {axis} needs a static extent in the result")
            if extent == 1 and expanded != 1 and axis == didx:
                raise VerifyException(f"expanded axis {axis} cannot be the didx axis: each device holds extent 1 of it")
        return tuple(expanded if extent == 1 else extent for extent, expanded in zip(shape, result))


@irdl_op_definition
class MatmulOp(FusionOp):
    """torch.matmul: batched, with broadcasting batch axes; with a `bias`, ATen's addmm
    (baddbmm): `bias + lhs @ rhs`, the bias (broadcast to the product) added to the
    product in the GEMM's accumulator (f32 for bf16 and f16) and the sum rounded once.

    `fusion.matmul %a, %b, %bias : (T, T2, T3) -> T4`
    """

    name = "fusion.matmul"

    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = (
        "$lhs `,` $rhs (`,` $bias^)? attr-dict `:` "
        "`(` type($lhs) `,` type($rhs) (`,` type($bias)^)? `)` `->` type($result)"
    )

    def __init__(self, lhs: SSAValue, rhs: SSAValue, bias: SSAValue | None, result_type: TensorType):
        super().__init__(operands=[lhs, rhs, [bias] if bias is not None else []], result_types=[result_type])

    def infer_shape(self) -> Shape:
        product = matmul_shape(tensor_type(self.lhs).get_shape(), tensor_type(self.rhs).get_shape())
        if self.bias is not None:
            check_matmul_bias(tensor_type(self.bias).get_shape(), product)
        return product

    def verify_(self) -> None:
        _check_same_element_types(self)
        super().verify_()


@irdl_op_definition
class LinearOp(FusionOp):
    """torch.nn.functional.linear: `input @ weight^T + bias`, the bias optional."""

    name = "fusion.linear"

    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $weight (`,` $bias^)? attr-dict `:` "
        "`(` type($input) `,` type($weight) (`,` type($bias)^)? `)` `->` type($result)"
    )

    def __init__(
        self,
        input: SSAValue,
        weight: SSAValue,
        bias: SSAValue | None,
        result_type: TensorType,
    ):
        super().__init__(
            operands=[input, weight, [bias] if bias is not None else []],
            result_types=[result_type],
        )

    def infer_shape(self) -> Shape:
        return linear_shape(
            tensor_type(self.input).get_shape(),
            tensor_type(self.weight).get_shape(),
            tensor_type(self.bias).get_shape() if self.bias is not None else None,
        )

    def verify_(self) -> None:
        _check_same_element_types(self)
        super().verify_()


def check_returns(target: str, returns: DenseArrayBase | None, count: int, what: str) -> None:
    """The `returns` of an ATen op name one distinct position of ATen's tuple per `what`."""
    if returns is None:
        return
    positions = returns.get_values()
    if len(positions) != count:
        raise VerifyException(
            f"{target}: 'returns' names {len(positions)} of ATen's results, but the op has {count} "
            f"{what}{'' if count == 1 else 's'}"
        )
    if any(p < 0 for p in positions) or len(set(positions)) != len(positions):
        raise VerifyException(f"{target}: the positions in 'returns' must be distinct and not negative")


@irdl_op_definition
class AtenOp(FusionOp):
    """An ATen op that hostir does not model, run by torch on each device's local pieces.

    `%r = fusion.aten "aten.gelu.default"(%x, approximate = "tanh") : (T) -> T2`

    `target` names the overload (`torch.ops.aten.gelu.default`); `call` is the Python
    literal `[args, kwargs]` of its arguments, where `{'operand': i}` stands for operand
    `i`'s local piece (docs/frontend.md lists the other encodings), which the text writes
    as the call reads (`hostir_dialect.aten_syntax`; the literal itself, `(%x) call
    "[[{'operand': 0}], {...}]"`, is read too). It is what keeps every graph that
    torch.compile hands hostir compilable: the op computes exactly what ATen computes,
    and only blocks pipelining across itself.

    The results are what ATen returns: the one tensor, or each item of the tuple. When
    ATen's tuple holds more (flash attention's sequence lengths, or a tensor that one
    kernel leaves undefined), `returns [0, 1, 6, 7]` names the items that are
    the results, by position; one that a run finds undefined leaves its result unwritten.

    The sharding rule that makes a call on local pieces correct: every operand and
    result lives on one mesh and is either replicated (no `didx` axis: the whole tensor
    is passed) or varying (its `didx` axis is axis 0, the device's own axis, dropped
    before the call and restored after it). A result may be replicated only when every
    operand is, since otherwise its value may differ between devices. No axis is
    `stream`.
    """

    name = "fusion.aten"

    inputs = var_operand_def(TensorType)
    outputs = var_result_def(TensorType)
    target = prop_def(StringAttr)
    call = prop_def(StringAttr)
    returns = opt_prop_def(DenseArrayBase[I64])

    def __init__(
        self,
        target: str,
        call: str,
        inputs: Sequence[SSAValue],
        result_types: Sequence[TensorType],
        returns: Sequence[int] | None = None,
    ):
        properties: dict[str, Attribute] = {"target": StringAttr(target), "call": StringAttr(call)}
        if returns is not None:
            properties["returns"] = DenseArrayBase.from_list(i64, returns)
        super().__init__(operands=[inputs], result_types=[result_types], properties=properties)

    @classmethod
    def parse(cls, parser: Parser) -> AtenOp:
        target, call, operands, returns = parse_aten_call(parser)
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        position = parser.pos
        function_type = parser.parse_function_type()
        inputs = parser.resolve_operands(operands, function_type.inputs.data, position)
        op = cls(target, call, inputs, function_type.outputs.data, returns)
        op.attributes.update(attributes)
        return op

    def print(self, printer: Printer) -> None:
        print_aten_call(printer, self)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_function_type([v.type for v in self.inputs], [v.type for v in self.outputs])

    def verify_(self) -> None:
        values = [*self.inputs, *self.outputs]
        if not self.outputs:
            raise VerifyException(f"fusion.aten {self.target.data} must have at least one result")
        check_call_operands(self.target.data, self.call.data, len(self.inputs))
        check_returns(self.target.data, self.returns, len(self.outputs), "result")
        meshes = {tensor_type(value).mesh for value in values}
        if len(meshes) > 1:
            raise VerifyException(
                f"fusion.aten {self.target.data} computes on one mesh; its operands and results "
                "are on " + ", ".join(str(list(mesh.ids)) for mesh in meshes)
            )
        for value in values:
            type = tensor_type(value)
            what = "an operand" if value in self.inputs else "a result"
            if type.stream_axis is not None:
                raise VerifyException(
                    f"fusion.aten {self.target.data}: {what} has a stream axis, but an ATen op "
                    "runs on whole local pieces"
                )
            if type.didx_axis not in (None, 0):
                raise VerifyException(
                    f"fusion.aten {self.target.data}: {what} is sharded on axis {type.didx_axis}; "
                    "an ATen op takes replicated tensors, or varying ones whose didx axis is 0"
                )
        if any(tensor_type(v).didx_axis is not None for v in self.inputs) and any(
            tensor_type(v).didx_axis is None for v in self.outputs
        ):
            raise VerifyException(
                f"fusion.aten {self.target.data}: a result is replicated but an operand varies "
                "between devices, so the result may differ between devices too"
            )


def parse_aten_call(parser: Parser) -> tuple[str, str, list[UnresolvedOperand], list[int] | None]:
    """`"target"(call) (returns [...])?` of `fusion.aten` and `hir.aten`: the target, the `call`
    literal, the operands it names and the `returns` items; or the literal form,
    `"target"(%operands) call "literal"` (`"target" call "literal"` in `hir.aten`)."""
    target = parser.parse_str_literal(" (the ATen overload, as in \"aten.gelu.default\")")
    start = parser.pos
    named = parse_optional_call(parser)
    if parser.parse_optional_keyword("call") is not None:
        # The literal form: the operands alone in the list, if any, then the literal.
        operands = [] if named is None else named[1]
        if named is not None and named[0] != repr([[{"operand": i} for i in range(len(operands))], {}]):
            parser.raise_error("before `call \"...\"`, the list holds the operands alone", start, parser.pos)
        call = parser.parse_str_literal(" (the call's Python literal)")
    elif named is None:
        parser.raise_error(f"expected the call of {target}, as in \"aten.gelu.default\"(%x, approximate = \"tanh\")")
    else:
        call, operands = named
    returns = None
    if parser.parse_optional_keyword("returns") is not None:
        returns = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parser.parse_integer)
    return target, call, operands, returns


def print_aten_call(printer: Printer, op: AtenOp | IRDLOperation) -> None:
    """Prints `"target"(call) (returns [...])?` of `fusion.aten` or `hir.aten`; a call that
    does not verify (printed with verification off) in the literal form, which reads back."""
    operands = op.inputs if isinstance(op, AtenOp) else op.ins
    printer.print_string(" ")
    printer.print_string_literal(op.target.data)
    try:
        check_call_operands(op.target.data, op.call.data, len(operands))
    except VerifyException:
        if isinstance(op, AtenOp):
            printer.print_string("(")
            printer.print_list(operands, printer.print_operand)
            printer.print_string(")")
        printer.print_string(" call ")
        printer.print_string_literal(op.call.data)
    else:
        print_call(printer, op.call.data, operands)
    if op.returns is not None:
        printer.print_string(f" returns [{', '.join(map(str, op.returns.get_values()))}]")


def check_call_operands(target: str, call: str, operands: int) -> None:
    """The call names every operand, operand `i` being the `i`-th it names: what its text
    writes (`hostir_dialect.aten_syntax`) names the operands so."""
    try:
        named = call_operands(call)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError) as error:
        raise VerifyException(f"{target}: the call is no Python literal [args, kwargs]: {error}") from None
    if named != list(range(operands)):
        raise VerifyException(
            f"{target}: the call names operands {named} in that order; it must name each of its "
            f"{operands} operand(s), operand i as the i-th"
        )


def _check_same_element_types(op: IRDLOperation) -> None:
    types = [tensor_type(o).element_type for o in op.operands]
    if any(t != types[0] for t in types):
        raise VerifyException(
            "operands have element types " + ", ".join(str(t) for t in types)
            + "; they must be equal"
        )



# --------------------------------------------------------------------------- #
# Attention                                                                    #
# --------------------------------------------------------------------------- #


class Causal(StrEnum):
    """Which keys a query of an attention sees, by the positions of both in the sequence."""

    TOP_LEFT = "top_left"
    """SDPA's `is_causal`: query row `i` sees key rows `0 .. i` of the keys given."""
    CONTIGUOUS = "contiguous"
    """The sequence is laid out over the mesh of the queries in order: the device at position
    `p` of a mesh of `D` holds rows `p L .. (p + 1) L - 1` of `D L`. A query sees the keys at
    positions up to its own; the keys are the rows of every device, in mesh order."""
    HEAD_TAIL = "head_tail"
    """torch's load-balanced layout (`_HeadTailLoadBalancer`): the sequence is cut into `2 D`
    chunks and the device at position `p` holds chunks `p` and `2 D - 1 - p`, in that order,
    so that every device has the same share of a causal attention's work. Otherwise as
    `contiguous`."""

    @property
    def is_layout(self) -> bool:
        """Whether the mask depends on where the queries and keys lie in a sharded sequence."""
        return self != Causal.TOP_LEFT


@irdl_attr_definition
class CausalAttr(EnumAttribute[Causal], SpacedOpaqueSyntaxAttribute):
    """`#fusion<causal head_tail>`; in an attention op's text just `causal head_tail`."""

    name = "fusion.causal"


def sequence_rows(position: int, devices: int, rows: int, layout: Causal) -> tuple[range, ...]:
    """The positions in the whole sequence of the `rows` rows that the device at `position` of a
    mesh of `devices` holds in `layout`, as runs of consecutive positions, in its local order."""
    if layout == Causal.CONTIGUOUS:
        return (range(position * rows, (position + 1) * rows),)
    if layout == Causal.HEAD_TAIL:
        chunk = rows // 2
        return tuple(range(c * chunk, (c + 1) * chunk) for c in (position, 2 * devices - 1 - position))
    raise ValueError(f"{layout.value} is not a layout of a sharded sequence")


def key_block_axis(type: TensorType) -> int:
    """The axis that counts the blocks of blocked keys: the first, or the second after a
    leading didx axis (a varying tensor's device axis)."""
    return 1 if type.didx_axis == 0 else 0


@dataclass(frozen=True)
class Keys:
    """The keys (or values) of an attention as rows: their batch axes, how many rows, and the
    extent of each row; blocked keys count the rows of every block."""

    batch: Shape
    rows: int
    width: int


def attention_keys(type: TensorType, blocks: bool) -> Keys:
    """The keys of `type`: `[*batch, rows, width]`, or with `blocks`, `[C, *batch, rows of a
    block, width]` (the block axis after a leading didx axis), whose rows are the blocks'."""
    shape = list(type.get_shape())
    minimum = 3 if blocks else 2
    if len(shape) < minimum:
        raise VerifyException(
            f"attention keys and values of shape {shape_str(tuple(shape))} need at least {minimum} axes "
            + ("(blocks, rows and their width)" if blocks else "(rows and their width)")
        )
    if not blocks:
        return Keys(tuple(shape[:-2]), shape[-2], shape[-1])
    count = shape.pop(key_block_axis(type))
    rows = DYNAMIC if DYNAMIC in (count, shape[-2]) else count * shape[-2]
    return Keys(tuple(shape[:-2]), rows, shape[-1])


def attention_properties(causal: Causal | None, blocks: bool, scale: float | None) -> dict[str, Attribute]:
    """The properties of an attention op (of either dialect): its causal mask, whether its keys
    come in blocks, and its scale."""
    properties: dict[str, Attribute] = {}
    if causal is not None:
        properties["causal"] = CausalAttr(causal)
    if blocks:
        properties["blocks"] = UnitAttr()
    if scale is not None:
        properties["scale"] = FloatAttr(scale, f64)
    return properties


def print_attention_properties(printer: Printer, op: IRDLOperation) -> None:
    """` causal <kind> blocks scale <float>`, each where the op has it."""
    if op.causal is not None:
        printer.print_string(f" causal {op.causal.data.value}")
    if op.blocks is not None:
        printer.print_string(" blocks")
    if op.scale is not None:
        printer.print_string(" scale ")
        printer.print_float(op.scale.value.data, f64)


def parse_attention_properties(parser: Parser) -> dict[str, Attribute]:
    """`causal <kind>`, `blocks`, `scale <float>`, each optional, in that order."""
    causal = parser.parse_str_enum(Causal) if parser.parse_optional_keyword("causal") else None
    blocks = parser.parse_optional_keyword("blocks") is not None
    scale = parser.parse_float() if parser.parse_optional_keyword("scale") else None
    return attention_properties(causal, blocks, scale)


def check_attention_mask(
    q: TensorType, keys: Keys, batch: Shape, mask: TensorType | None, causal: Causal | None, blocks: bool
) -> None:
    """The mask operand against the queries and keys, and a causal layout against the queries' mesh."""
    rows = q.get_shape()[-2]
    if mask is not None:
        if causal is not None:
            raise VerifyException("an attention takes a mask operand or a causal mask, not both")
        if blocks:
            raise VerifyException("a mask operand covers the keys as one sequence, so the keys cannot be in blocks")
        if mask.element_type not in (IntegerType(1), q.element_type):
            raise VerifyException(
                f"the mask is {mask.element_type}; it must be i1 (true: the key is seen) or "
                f"{q.element_type}, the queries' type (added to the scores)"
            )
        shape = mask.get_shape()
        if len(shape) < 2 or not shapes_compatible(shape[-2:], (rows, keys.rows)):
            raise VerifyException(
                f"the mask {shape_str(shape)} must end in the queries' and the keys' rows "
                f"{shape_str((rows, keys.rows))}"
            )
        broadcast_shapes(batch, shape[:-2])
    if causal is None or not causal.is_layout:
        return
    if q.didx_axis != 0:
        raise VerifyException(
            f"causal {causal.value} masks by the positions of the queries' rows in a sequence "
            "sharded over their mesh, so the queries must vary over it (didx axis 0)"
        )
    if causal == Causal.HEAD_TAIL and rows != DYNAMIC and rows % 2:
        raise VerifyException(f"causal head_tail: each device's {rows} rows must be two chunks of one length")


def check_whole_keys(q: TensorType, keys: Keys, causal: Causal | None) -> None:
    """With a causal layout, keys that are the whole sequence: every device's rows."""
    rows, devices = q.get_shape()[-2], q.mesh.size
    if causal is not None and causal.is_layout and DYNAMIC not in (rows, keys.rows) and keys.rows != devices * rows:
        raise VerifyException(
            f"causal {causal.value}: the keys must be the rows of every device of the queries' "
            f"mesh, {devices} x {rows}, but there are {keys.rows}"
        )


FLOAT_TYPES = (Float16Type, BFloat16Type, Float32Type, Float64Type)


def check_attention_operands(q: TensorType, k: TensorType, v: TensorType, blocks: bool) -> tuple[Keys, Keys, Shape]:
    """Queries, keys and values of one floating element type, their rows and widths agreeing;
    the keys, the values, and the broadcast batch axes."""
    types = [q, k, v]
    element_type = types[0].element_type
    if not isinstance(element_type, FLOAT_TYPES) or any(t.element_type != element_type for t in types):
        raise VerifyException(
            "queries, keys and values must have one floating element type; they are "
            + ", ".join(str(t.element_type) for t in types)
        )
    q_shape = types[0].get_shape()
    if len(q_shape) < 2:
        raise VerifyException(f"the queries {shape_str(q_shape)} need at least 2 axes (rows and their width)")
    keys, values = attention_keys(types[1], blocks), attention_keys(types[2], blocks)
    if not _same_extent(q_shape[-1], keys.width):
        raise VerifyException(f"queries of width {q_shape[-1]} against keys of width {keys.width}; they must be equal")
    if not _same_extent(keys.rows, values.rows):
        raise VerifyException(f"{keys.rows} keys against {values.rows} values; they must be as many")
    if blocks and not shapes_compatible(types[1].get_shape()[:-1], types[2].get_shape()[:-1]):
        raise VerifyException("blocked keys and values must be cut into the same blocks")
    return keys, values, broadcast_shapes(q_shape[:-2], keys.batch, values.batch)


class ScaledDotProductOp(FusionOp, ABC):
    """What `fusion.attention` and its backward share: the keys' layout, the mask and the scale,
    their text, and their checks.

    `mask %m` is a boolean (true: the query sees the key) or additive mask of the queries' dtype,
    broadcast to `[*batch, queries, keys]`; `causal top_left | contiguous | head_tail` masks by
    position (`Causal`); neither: every query sees every key. `blocks`: the keys and values
    are cut into blocks along their first axis (after a leading didx axis): the keys are the
    blocks' rows, in order. `scale` multiplies the scores (default `1 / sqrt(head_dim)`)."""

    OPERANDS: ClassVar[int]
    """The operands before the mask."""

    mask = opt_operand_def(TensorType)
    causal = opt_prop_def(CausalAttr)
    blocks = opt_prop_def(UnitAttr)
    scale = opt_prop_def(FloatAttr)

    @property
    def causal_mask(self) -> Causal | None:
        return None if self.causal is None else self.causal.data

    def attention_batch(self, query: SSAValue, key: SSAValue, value: SSAValue) -> tuple[Keys, Keys, Shape]:
        """The keys, the values and the batch axes of the attention, its mask checked."""
        q = tensor_type(query)
        keys, values, batch = check_attention_operands(q, tensor_type(key), tensor_type(value), self.blocks is not None)
        mask = None if self.mask is None else tensor_type(self.mask)
        check_attention_mask(q, keys, batch, mask, self.causal_mask, self.blocks is not None)
        check_whole_keys(q, keys, self.causal_mask)
        if mask is not None:
            batch = broadcast_shapes(batch, mask.get_shape()[:-2])
        return keys, values, batch

    def expected_element_type(self) -> Attribute:
        return tensor_type(self.operands[0]).element_type

    @staticmethod
    def verify_results(expected: Sequence[tuple[SSAValue, Shape, Attribute, str]]) -> None:
        for result, shape, element_type, what in expected:
            declared = tensor_type(result)
            if declared.element_type != element_type:
                raise VerifyException(f"the {what} is {declared.element_type}, expected {element_type}")
            if not shapes_compatible(declared.get_shape(), shape):
                raise VerifyException(
                    f"the {what} has shape {shape_str(declared.get_shape())}, but the operands give {shape_str(shape)}"
                )

    def print(self, printer: Printer) -> None:
        """`%a, %b, ... [mask %m] causal ... : (types) -> (types)`."""
        printer.print_string(" ")
        printer.print_list(self.operands[: self.OPERANDS], printer.print_operand)
        if self.mask is not None:
            printer.print_string(" mask ")
            printer.print_operand(self.mask)
        print_attention_properties(printer, self)
        printer.print_op_attributes(self.attributes)
        printer.print_string(" : ")
        printer.print_function_type(self.operand_types, self.result_types)

    @classmethod
    def parse(cls, parser: Parser) -> ScaledDotProductOp:
        operands = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_unresolved_operand)
        if len(operands) != cls.OPERANDS:
            parser.raise_error(f"{cls.name} takes {cls.OPERANDS} operands before its mask, got {len(operands)}")
        if parser.parse_optional_keyword("mask"):
            operands.append(parser.parse_unresolved_operand())
        properties = parse_attention_properties(parser)
        attributes = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        function_type = parser.parse_function_type()
        if len(function_type.inputs.data) != len(operands):
            parser.raise_error(
                f"{cls.name} has {len(operands)} operands but {len(function_type.inputs.data)} operand types"
            )
        return cls.create(
            operands=[parser.resolve_operand(o, t) for o, t in zip(operands, function_type.inputs.data)],
            properties=properties,
            attributes=attributes,
            result_types=list(function_type.outputs.data),
        )


@irdl_op_definition
class AttentionOp(ScaledDotProductOp):
    """Scaled-dot-product attention and its log-sum-exp (SDPA, what a flash kernel returns):
    `softmax(q k^T * scale + mask) v`, and per query row the natural log of the sum of the
    exponentials of its scores, in f32, which merges attentions over disjoint keys (the
    ring of context parallelism). A row that sees no key has output 0 and log-sum-exp -inf.

    `%out, %lse = fusion.attention %q, %k, %v causal head_tail blocks : (Tq, Tk, Tv) -> (To, Tl)`

    q `[*batch, Lq, E]`, k `[*batch, Lk, E]`, v `[*batch, Lk, Ev]` (batch axes broadcast as
    torch's); out `[*batch, Lq, Ev]` of the queries' type, lse `[*batch, Lq]` f32.
    """

    name = "fusion.attention"
    OPERANDS: ClassVar[int] = 3

    query = operand_def(TensorType)
    key = operand_def(TensorType)
    value = operand_def(TensorType)
    out = result_def(TensorType)
    lse = result_def(TensorType)

    def __init__(
        self,
        query: SSAValue,
        key: SSAValue,
        value: SSAValue,
        result_types: Sequence[TensorType],
        mask: SSAValue | None = None,
        causal: Causal | None = None,
        blocks: bool = False,
        scale: float | None = None,
    ):
        super().__init__(
            operands=[query, key, value, [] if mask is None else [mask]],
            properties=attention_properties(causal, blocks, scale),
            result_types=list(result_types),
        )

    def shapes(self) -> tuple[Shape, Shape]:
        """The output's and the log-sum-exp's shapes that the operands give."""
        _, values, batch = self.attention_batch(self.query, self.key, self.value)
        rows = tensor_type(self.query).get_shape()[-2]
        return (*batch, rows, values.width), (*batch, rows)

    def infer_shape(self) -> Shape:
        return self.shapes()[0]

    def extent_source(self, result: int, axis: int) -> tuple[SSAValue, int]:
        """An axis of the output with the extent of `axis` of result `result` (the
        log-sum-exp's axes are the output's first ones)."""
        return self.out, axis

    def verify_(self) -> None:
        out, lse = self.shapes()
        element_type = self.expected_element_type()
        self.verify_results(
            [(self.out, out, element_type, "output"), (self.lse, lse, Float32Type(), "log-sum-exp")]
        )


def gradient_shape(operand: TensorType, grad_output: TensorType) -> Shape:
    """The shape of the gradient of an attention's `operand`: its own, with the device axis of
    the output's gradient first where it has none (each device's queries give it a share)."""
    if grad_output.didx_axis == 0 and operand.didx_axis is None:
        return (grad_output.get_shape()[0], *operand.get_shape())
    return operand.get_shape()


@irdl_op_definition
class AttentionBackwardOp(ScaledDotProductOp):
    """The gradients of `fusion.attention`'s output with respect to the queries, keys and
    values, given the output and its log-sum-exp (what a flash kernel's backward computes:
    the probabilities are recomputed from them, so the gradients of any subset of the keys
    come from the output and log-sum-exp over all of them).

    `%dq, %dk, %dv = fusion.attention_backward %dout, %q, %k, %v, %out, %lse causal head_tail : (...) -> (...)`

    Each gradient has its operand's shape, with the device axis of the output's gradient
    first where the operand has none: each device's queries give it a share.
    """

    name = "fusion.attention_backward"
    OPERANDS: ClassVar[int] = 6

    grad_output = operand_def(TensorType)
    query = operand_def(TensorType)
    key = operand_def(TensorType)
    value = operand_def(TensorType)
    output = operand_def(TensorType)
    lse = operand_def(TensorType)
    grad_query = result_def(TensorType)
    grad_key = result_def(TensorType)
    grad_value = result_def(TensorType)

    def __init__(
        self,
        operands: Sequence[SSAValue],
        result_types: Sequence[TensorType],
        mask: SSAValue | None = None,
        causal: Causal | None = None,
        blocks: bool = False,
        scale: float | None = None,
    ):
        super().__init__(
            operands=[*operands, [] if mask is None else [mask]],
            properties=attention_properties(causal, blocks, scale),
            result_types=list(result_types),
        )

    def infer_shape(self) -> Shape:
        return gradient_shape(tensor_type(self.query), tensor_type(self.grad_output))

    def extent_source(self, result: int, axis: int) -> tuple[SSAValue, int]:
        """The operand axis with the extent of `axis` of gradient `result` (1: the keys', 2: the
        values'); the device axis the operand lacks is the output gradient's."""
        operand = (self.query, self.key, self.value)[result]
        if len(gradient_shape(tensor_type(operand), tensor_type(self.grad_output))) > tensor_type(operand).rank:
            return (self.grad_output, 0) if axis == 0 else (operand, axis - 1)
        return operand, axis

    def verify_(self) -> None:
        _, values, batch = self.attention_batch(self.query, self.key, self.value)
        q = tensor_type(self.query).get_shape()
        if not shapes_compatible(batch, q[:-2]):
            raise VerifyException(
                f"the queries' batch axes {shape_str(q[:-2])} must be the batch {shape_str(batch)} of the "
                "attention, which their gradient has"
            )
        out = (*batch, q[-2], values.width)
        element_type = self.expected_element_type()
        for value, shape, type_, what in (
            (self.grad_output, out, element_type, "output's gradient"),
            (self.output, out, element_type, "output"),
            (self.lse, out[:-1], Float32Type(), "log-sum-exp"),
        ):
            declared = tensor_type(value)
            if declared.element_type != type_ or not shapes_compatible(declared.get_shape(), shape):
                raise VerifyException(
                    f"the {what} is {shape_str(declared.get_shape())} {declared.element_type}; expected "
                    f"{shape_str(shape)} {type_}"
                )
        grad = tensor_type(self.grad_output)
        self.verify_results(
            [
                (result, gradient_shape(tensor_type(operand), grad), element_type, f"{what}' gradient")
                for result, operand, what in (
                    (self.grad_query, self.query, "queries"),
                    (self.grad_key, self.key, "keys"),
                    (self.grad_value, self.value, "values"),
                )
            ]
        )


ATTENTION_OPS = (AttentionOp, AttentionBackwardOp)


UNARY_OPS: tuple[type[UnaryOp], ...] = (
    NegOp,
    AbsOp,
    ExpOp,
    LogOp,
    SqrtOp,
    RsqrtOp,
    ReluOp,
    TanhOp,
    SigmoidOp,
    ErfOp,
)
BINARY_OPS: tuple[type[BinaryOp], ...] = (
    AddOp,
    SubOp,
    MulOp,
    DivOp,
    MaximumOp,
    MinimumOp,
    PowOp,
)
REDUCTION_OPS: tuple[type[ReductionOp], ...] = (SumOp, MaxOp)
POINTWISE_OPS = (*UNARY_OPS, *BINARY_OPS, CastOp, ConstantOp, BroadcastOp, ExpandOp, RotateHalfOp)
"""Ops that a fused pointwise segment may hold (broadcast only inserts extent-1 axes, expand
only stretches them, a rotation reads its operand's last axis at the other half)."""

Fusion = Dialect(
    "fusion",
    [
        SetOp,
        *UNARY_OPS,
        RotateHalfOp,
        *BINARY_OPS,
        ConstantOp,
        CastOp,
        *REDUCTION_OPS,
        BroadcastOp,
        ExpandOp,
        MatmulOp,
        LinearOp,
        AtenOp,
        AttentionOp,
        AttentionBackwardOp,
    ],
    [ParallelTypeAttr, DeviceMeshAttr, TensorType, CausalAttr],
)

