"""Building fusions from Python, as nvFuser's FusionDefinition and schedule do.

    fb = FusionBuilder("ag_linear")
    x = fb.input([None, 8, 64, 32], "bf16", mesh=range(8), axes=["_", "didx", "_", "_"])
    w = fb.input([16, 32], "bf16", mesh=range(8))
    y = fb.linear(x, w)
    fb.parallelize(y, 0, "stream")
    fb.output(y)
    module = fb.build()

The builder records a graph of `Tensor`s and creates the ops only in `build()`,
because the schedule helpers may change a tensor's mesh and parallel types after ops
have used it, as a schedule changes an nvFuser TensorView after its definition.
Result shapes come from the fusion dialect's shape rules; a result lives on the mesh
its first tensor operand has when the op is defined, with every axis serial, until
the schedule says otherwise.
Mistakes raise `HostirError` when the call that makes them is made.

Each op's location is the line of the user's code that defined it (the innermost
caller outside this module, with its column), and the function's is the line that
made the builder: an error found later, by a pass or at run time, is then reported as
`file.py:line:col: error: ...` with that line, as for a fusion written in text.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    AnyFloat,
    ArrayAttr,
    DictionaryAttr,
    FileLineColLoc,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    UnitAttr,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i8,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Region, SSAValue
from xdsl.utils.exceptions import VerifyException

from hostir_dialect.fusion import (
    DYNAMIC,
    AbsOp,
    AddOp,
    BroadcastOp,
    CastOp,
    ConstantOp,
    DeviceMeshAttr,
    DivOp,
    ErfOp,
    ExpandOp,
    ExpOp,
    FusionOp,
    LinearOp,
    LogOp,
    MatmulOp,
    MaximumOp,
    MaxOp,
    MinimumOp,
    MulOp,
    NegOp,
    ParallelType,
    ParallelTypeAttr,
    PowOp,
    ReluOp,
    RsqrtOp,
    SetOp,
    SigmoidOp,
    SINGLE_DEVICE,
    SqrtOp,
    SubOp,
    SumOp,
    TanhOp,
    TensorType,
    broadcast_in_shape,
    broadcast_shapes,
    check_matmul_bias,
    element_type_name,
    linear_shape,
    matmul_shape,
    normalize_axes,
    reduction_shape,
    tensor_type,
)
from hostir_dialect.hir import SYMMETRIC_INPUT
from hostir_dialect.text import HostirError, source_location, verify_module

ELEMENT_TYPES: dict[str, Attribute] = {
    "f64": f64,
    "f32": f32,
    "f16": f16,
    "bf16": bf16,
    "i64": i64,
    "i32": i32,
    "i8": i8,
    "i1": i1,
}
"""The element types a fusion tensor may have, by their names in the IR text."""

TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int8: "i8",
    torch.bool: "i1",
}
"""The torch dtype of each element type, and its name in the IR text."""

DTYPES_BY_NAME: dict[str, torch.dtype] = {name: dtype for dtype, name in TORCH_DTYPES.items()}

Scalar = int | float | bool
DType = str | torch.dtype | Attribute
MeshLike = DeviceMeshAttr | Iterable[int]
ParallelTypeLike = ParallelTypeAttr | ParallelType | str
Definition = tuple[type[FusionOp], tuple[object, ...]]
"""The op class that computes a tensor, and its constructor's arguments but the result type."""


_NOT_THE_CALLER = {__file__, contextlib.__file__}
"""The files of the frames between the user's call and `caller_location`."""


def caller_location() -> FileLineColLoc | None:
    """Where the user's code calls the builder: the line and column of the innermost frame
    outside this module and `contextlib` (None if there is none)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _NOT_THE_CALLER:
        frame = frame.f_back
    if frame is None:
        return None
    column = 1
    if hasattr(frame.f_code, "co_positions"):  # Python 3.11: the call's own span
        _, _, start, _ = next(itertools.islice(frame.f_code.co_positions(), frame.f_lasti // 2, None))
        column = 1 if start is None else start + 1
    return FileLineColLoc(StringAttr(frame.f_code.co_filename), IntAttr(frame.f_lineno), IntAttr(column))


@contextmanager
def _reported_as(op_name: str = "") -> Iterator[None]:
    """Turns the dialect's VerifyExceptions into HostirErrors (about `op_name` if given),
    located at the user's call."""
    try:
        yield
    except VerifyException as e:
        location = caller_location()
        if location is None:
            raise HostirError(str(e), op_name=op_name) from None
        # A located error shows the user's line, not the op; the message names it.
        message = f"{op_name}: {e}" if op_name else str(e)
        raise HostirError(message, source_location(location), op_name) from None


def element_type(dtype: DType) -> Attribute:
    """The xDSL element type named by `dtype`: "bf16", torch.bfloat16 or the type itself."""
    if isinstance(dtype, torch.dtype):
        if dtype not in TORCH_DTYPES:
            raise HostirError(
                f"torch dtype {dtype} has no fusion element type; supported: "
                + ", ".join(map(str, TORCH_DTYPES))
            )
        return ELEMENT_TYPES[TORCH_DTYPES[dtype]]
    if isinstance(dtype, Attribute):
        with _reported_as():
            element_type_name(dtype)
        return dtype
    if dtype not in ELEMENT_TYPES:
        raise HostirError(
            f"unknown element type {dtype!r}; expected one of " + ", ".join(ELEMENT_TYPES)
        )
    return ELEMENT_TYPES[dtype]


def torch_dtype(element_type: Attribute) -> torch.dtype:
    """The torch dtype of a fusion element type (`bf16` -> torch.bfloat16)."""
    return DTYPES_BY_NAME[element_type_name(element_type)]


class SegmentBuilder:
    """A segment's body built op by op, each result of a type like a given one: for passes
    that write segments of their own (`attention-ring`'s merges, `reduction_of_slices`)."""

    def __init__(self, types: Sequence[TensorType], names: Sequence[str]):
        self.block = Block(arg_types=types)
        for argument, name in zip(self.block.args, names, strict=True):
            argument.name_hint = name

    def __call__(self, op_class, *operands: SSAValue, type: TensorType | None = None) -> SSAValue:
        result_type = type or tensor_type(operands[0])
        op = op_class(*operands, result_type)
        self.block.add_op(op)
        return op.results[0]

    def widened(self, value: SSAValue) -> SSAValue:
        """`value` in f32: cast where it has another element type."""
        type = tensor_type(value)
        return value if type.element_type == f32 else self(CastOp, value, type=type.with_(element_type=f32))

    def rounded(self, value: SSAValue, result_type: TensorType) -> SSAValue:
        """`value` (f32) cast into `result_type` where that is another element type: rounded once."""
        return value if result_type.element_type == f32 else self(CastOp, value, type=result_type)

    def constant(self, value: float, like: TensorType) -> SSAValue:
        constant = ConstantOp(FloatAttr(value, f32), TensorType([], f32, like.mesh))
        self.block.add_op(constant)
        return constant.result

    def function(self, name: str) -> func.FuncOp:
        """The private function `name` of the body, which ends with its `func.return`."""
        results = [value.type for value in self.block.last_op.operands]
        return func.FuncOp(name, ([a.type for a in self.block.args], results), Region(self.block), "private")


COMBINE_SLICES: dict[str, type[FusionOp]] = {"sum": AddOp, "max": MaximumOp}
"""The pointwise op that combines two slices, per kind of reduction (`reduction_of_slices`)."""


def reduction_of_slices(
    name: str, kind: str, slice_types: Sequence[TensorType], out_type: TensorType, names: Sequence[str] = ()
) -> func.FuncOp:
    """The segment `name` that reduces values of `slice_types` (the slices of a reduced
    axis, the pieces a team's members sent, or partial sums) into one of `out_type`,
    combining them in order with `fusion.add` (a "sum") or `fusion.maximum` (a "max"): a
    sum that involves bf16 or f16 values is made in f32 and rounded once, as `torch.sum`
    computes it. `reduction-in-kernel` launches it on a reduced axis's slices, the copy
    engines' reductions on the pieces a team's members sent, `attention-ring` on its
    running sums and the shares added into them. `names` names the segment's arguments
    (`slice` each by default)."""
    build = SegmentBuilder(slice_types, names or ["slice"] * len(slice_types))
    accumulated = kind == "sum" and any(t.element_type in (bf16, f16) for t in (*slice_types, out_type))
    values = [build.widened(arg) if accumulated else arg for arg in build.block.args]
    total = values[0]
    for i, value in enumerate(values[1:], start=2):
        last = i == len(values) and not accumulated
        total = build(COMBINE_SLICES[kind], total, value, type=out_type if last else None)
    build.block.add_op(func.ReturnOp(build.rounded(total, out_type) if accumulated else total))
    return build.function(name)


def device_mesh(mesh: MeshLike) -> DeviceMeshAttr:
    if isinstance(mesh, DeviceMeshAttr):
        return mesh
    with _reported_as():
        return DeviceMeshAttr(list(mesh))


def parallel_type(name: ParallelTypeLike) -> ParallelTypeAttr:
    """`"_"` or `"serial"`, `"didx"`, `"stream"` (or the enum, or the attribute)."""
    if isinstance(name, ParallelTypeAttr):
        return name
    if name == "_":
        return ParallelTypeAttr(ParallelType.SERIAL)
    if name not in tuple(ParallelType):
        raise HostirError(f"unknown parallel type {name!r}; expected _ (serial), didx or stream")
    return ParallelTypeAttr(ParallelType(name))


def scalar_attr(value: Scalar, type: Attribute) -> FloatAttr | IntegerAttr:
    """`value` as a constant of element type `type`; a fraction cannot become an integer."""
    if isinstance(type, AnyFloat):
        return FloatAttr(float(value), type)
    if value != int(value):
        raise HostirError(
            f"constant {value} is not an integer, so it cannot have element type {type}",
            op_name=ConstantOp.name,
        )
    with _reported_as(ConstantOp.name):
        return IntegerAttr(int(value), type)


def constant_value(op: ConstantOp) -> bool | int | float:
    """The value of a constant: its attribute stored in its element type (0.1 as bf16 is 0.10009765625)."""
    dtype = torch_dtype(tensor_type(op.result).element_type)
    return torch.tensor(op.value.value.data, dtype=dtype).item()


class Tensor:
    """A value of the fusion being built.

    `type` is what the value's type will be when the module is built; the schedule
    helpers of its builder replace it. `definition` says how an op computes it
    (tensors stand where the op takes operands); an input has none.
    """

    def __init__(
        self, builder: FusionBuilder, type: TensorType, definition: Definition | None = None
    ):
        self.builder = builder
        self.type = type
        self.definition = definition
        self.location = caller_location()
        """The line of the user's code that made the tensor, which the op that computes it gets."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape, `DYNAMIC` for an extent known only at run time."""
        return self.type.get_shape()

    def __repr__(self) -> str:
        return f"Tensor({self.type})"

    def __neg__(self) -> Tensor:
        return self.builder.neg(self)

    def __add__(self, other: Tensor | Scalar) -> Tensor:
        return self.builder.add(self, other)

    def __radd__(self, other: Scalar) -> Tensor:
        return self.builder.add(other, self)

    def __sub__(self, other: Tensor | Scalar) -> Tensor:
        return self.builder.sub(self, other)

    def __rsub__(self, other: Scalar) -> Tensor:
        return self.builder.sub(other, self)

    def __mul__(self, other: Tensor | Scalar) -> Tensor:
        return self.builder.mul(self, other)

    def __rmul__(self, other: Scalar) -> Tensor:
        return self.builder.mul(other, self)

    def __truediv__(self, other: Tensor | Scalar) -> Tensor:
        return self.builder.div(self, other)

    def __rtruediv__(self, other: Scalar) -> Tensor:
        return self.builder.div(other, self)

    def __pow__(self, other: Tensor | Scalar) -> Tensor:
        return self.builder.pow(self, other)

    def __rpow__(self, other: Scalar) -> Tensor:
        return self.builder.pow(other, self)

    def __matmul__(self, other: Tensor) -> Tensor:
        return self.builder.matmul(self, other)


def _unary(op_class: type[FusionOp]):
    def define(self: FusionBuilder, x: Tensor) -> Tensor:
        self._check_owned(x)
        return self._define(op_class, (x,), x.shape)

    define.__doc__ = f"`{op_class.name}` of `x`, of the same shape and element type."
    return define


def _binary(op_class: type[FusionOp]):
    def define(self: FusionBuilder, lhs: Tensor | Scalar, rhs: Tensor | Scalar) -> Tensor:
        lhs, rhs = self._tensor_operands(op_class, lhs, rhs)
        self._check_operands(op_class, lhs, rhs)
        with _reported_as(op_class.name):
            shape = broadcast_shapes(lhs.shape, rhs.shape)
        return self._define(op_class, (lhs, rhs), shape)

    define.__doc__ = (
        f"`{op_class.name}` with torch broadcasting; a Python scalar becomes a "
        "`fusion.constant` of the other operand's element type and mesh."
    )
    return define


def _reduction(op_class: type[FusionOp]):
    def define(
        self: FusionBuilder, x: Tensor, axes: int | Sequence[int], keepdim: bool = False
    ) -> Tensor:
        self._check_owned(x)
        with _reported_as(op_class.name):
            axes = normalize_axes(
                [axes] if isinstance(axes, int) else axes, x.type.rank, "reduction"
            )
            shape = reduction_shape(x.shape, axes, keepdim)
        return self._define(op_class, (x, axes, keepdim), shape)

    define.__doc__ = f"`{op_class.name}` of `x` over `axes`, kept as extent-1 axes if `keepdim`."
    return define


class FusionBuilder:
    """Records a fusion (inputs, ops, outputs, schedule) and builds it as a module."""

    def __init__(self, name: str):
        self.name = name
        self.location = caller_location()
        """The line of the user's code that made the builder, which the function gets."""
        self.inputs: list[Tensor] = []
        self.symmetric_inputs: set[Tensor] = set()
        self.outputs: list[Tensor] = []
        self.computed: list[Tensor] = []
        """The tensors that ops compute, in the order they were defined."""

    # -- inputs, outputs, building ------------------------------------------- #

    def input(
        self,
        shape: Sequence[int | None],
        dtype: DType,
        mesh: MeshLike = SINGLE_DEVICE,
        axes: Sequence[ParallelTypeLike] | None = None,
        symmetric: bool = False,
    ) -> Tensor:
        """A fusion input; `None` in `shape` is a dynamic extent, `axes` default to serial.

        `symmetric`: the caller passes it in symmetric memory of its mesh
        (`Program.symmetric_empty`), which the copy engines read in place (`hir.symmetric`)."""
        extents = [DYNAMIC if d is None else d for d in shape]
        if axes is not None and len(axes) != len(extents):
            raise HostirError(
                f"an input of rank {len(extents)} needs {len(extents)} parallel types, "
                f"got {len(axes)}"
            )
        with _reported_as():
            type = TensorType(
                extents,
                element_type(dtype),
                device_mesh(mesh),
                None if axes is None else [parallel_type(a) for a in axes],
            )
        tensor = Tensor(self, type)
        self.inputs.append(tensor)
        if symmetric:
            self.symmetric_inputs.add(tensor)
        return tensor

    def output(self, tensor: Tensor) -> None:
        """Marks `tensor` as a result of the fusion (results are in the order marked)."""
        self._check_owned(tensor)
        if tensor in self.outputs:
            raise HostirError(f"{tensor} is already an output of fusion '{self.name}'")
        self.outputs.append(tensor)

    def build(self) -> ModuleOp:
        """A verified module holding the fusion as one `func.func`."""
        if not self.outputs:
            raise HostirError(f"fusion '{self.name}' has no outputs; mark them with output()")
        body = Block(arg_types=[t.type for t in self.inputs])
        values: dict[Tensor, SSAValue] = dict(zip(self.inputs, body.args))
        for tensor in self.computed:
            op_class, args = tensor.definition
            op = op_class(*(values[a] if isinstance(a, Tensor) else a for a in args), tensor.type)
            if tensor.location is not None:
                op.location = tensor.location
            body.add_op(op)
            values[tensor] = op.results[0]
        body.add_op(func.ReturnOp(*(values[t] for t in self.outputs)))
        function = func.FuncOp(
            self.name,
            ([t.type for t in self.inputs], [t.type for t in self.outputs]),
            Region(body),
            arg_attrs=ArrayAttr(
                [
                    DictionaryAttr({SYMMETRIC_INPUT: UnitAttr()} if t in self.symmetric_inputs else {})
                    for t in self.inputs
                ]
            )
            if self.symmetric_inputs
            else None,
        )
        if self.location is not None:
            function.location = self.location
        module = ModuleOp([function])
        verify_module(module)
        return module

    # -- schedule ---------------------------------------------------------------- #

    def parallelize(self, tensor: Tensor, axis: int, type: ParallelTypeLike) -> None:
        """Makes `axis` of `tensor` serial (`"_"`), `"didx"` or `"stream"`."""
        self._check_owned(tensor)
        rank = tensor.type.rank
        if not -rank <= axis < rank:
            raise HostirError(f"axis {axis} is out of range for {tensor} of rank {rank}")
        axes = list(tensor.type.axes.data)
        axes[axis] = parallel_type(type)
        self._retype(tensor, axes=axes)

    def set_mesh(self, tensor: Tensor, mesh: MeshLike) -> None:
        """Places `tensor` on the devices of `mesh`."""
        self._check_owned(tensor)
        self._retype(tensor, mesh=device_mesh(mesh))

    def _retype(self, tensor: Tensor, **changes) -> None:
        try:
            tensor.type = tensor.type.with_(**changes)
        except VerifyException as e:
            raise HostirError(f"cannot reschedule {tensor}: {e}") from None

    # -- ops --------------------------------------------------------------------- #

    set = _unary(SetOp)
    neg = _unary(NegOp)
    abs = _unary(AbsOp)
    exp = _unary(ExpOp)
    log = _unary(LogOp)
    sqrt = _unary(SqrtOp)
    rsqrt = _unary(RsqrtOp)
    relu = _unary(ReluOp)
    tanh = _unary(TanhOp)
    sigmoid = _unary(SigmoidOp)
    erf = _unary(ErfOp)

    add = _binary(AddOp)
    sub = _binary(SubOp)
    mul = _binary(MulOp)
    div = _binary(DivOp)
    maximum = _binary(MaximumOp)
    minimum = _binary(MinimumOp)
    pow = _binary(PowOp)

    sum = _reduction(SumOp)
    max = _reduction(MaxOp)

    def constant(self, value: Scalar, dtype: DType, mesh: MeshLike = SINGLE_DEVICE) -> Tensor:
        """A scalar (rank-0 tensor) of `dtype` on `mesh`."""
        type = TensorType([], element_type(dtype), device_mesh(mesh))
        tensor = Tensor(self, type, (ConstantOp, (scalar_attr(value, type.element_type),)))
        self.computed.append(tensor)
        return tensor

    def cast(self, x: Tensor, dtype: DType) -> Tensor:
        """`x` converted to `dtype`."""
        self._check_owned(x)
        return self._define(CastOp, (x,), x.shape, element_type(dtype))

    def broadcast(self, x: Tensor, new_axes: int | Sequence[int]) -> Tensor:
        """`x` with an extent-1 axis inserted at each position `new_axes` of the result."""
        self._check_owned(x)
        new_axes = [new_axes] if isinstance(new_axes, int) else new_axes
        with _reported_as(BroadcastOp.name):
            new_axes = normalize_axes(new_axes, x.type.rank + len(new_axes), "broadcast")
            shape = broadcast_in_shape(x.shape, new_axes)
        return self._define(BroadcastOp, (x, new_axes), shape)

    def expand(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """`x` with its extent-1 axes stretched to the extents of `shape` (torch.expand, same rank)."""
        self._check_owned(x)
        return self._define(ExpandOp, (x,), shape)

    def matmul(self, lhs: Tensor, rhs: Tensor, bias: Tensor | None = None) -> Tensor:
        """torch.matmul of `lhs` and `rhs`; with a `bias`, `bias + lhs @ rhs` summed in the
        GEMM and rounded once (torch.addmm)."""
        operands = (lhs, rhs) if bias is None else (lhs, rhs, bias)
        self._check_operands(MatmulOp, *operands)
        with _reported_as(MatmulOp.name):
            shape = matmul_shape(lhs.shape, rhs.shape)
            if bias is not None:
                check_matmul_bias(bias.shape, shape)
        return self._define(MatmulOp, (lhs, rhs, bias), shape)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """torch.nn.functional.linear: `x @ weight^T + bias`."""
        operands = (x, weight) if bias is None else (x, weight, bias)
        self._check_operands(LinearOp, *operands)
        with _reported_as(LinearOp.name):
            shape = linear_shape(x.shape, weight.shape, None if bias is None else bias.shape)
        return self._define(LinearOp, (x, weight, bias), shape)

    # -- helpers ----------------------------------------------------------------- #

    def _define(
        self,
        op_class: type[FusionOp],
        args: tuple[object, ...],
        shape: Sequence[int],
        result_element_type: Attribute | None = None,
    ) -> Tensor:
        """A tensor computed by `op_class(*args, result_type)`, on its first operand's mesh.

        The caller has checked that the operands belong to this builder.
        """
        first = next(a for a in args if isinstance(a, Tensor))
        type = TensorType(shape, result_element_type or first.type.element_type, first.type.mesh)
        tensor = Tensor(self, type, (op_class, args))
        self.computed.append(tensor)
        return tensor

    def _tensor_operands(
        self, op_class: type[FusionOp], *operands: Tensor | Scalar
    ) -> list[Tensor]:
        """The operands, with scalars made constants like the first tensor operand."""
        tensors = [o for o in operands if isinstance(o, Tensor)]
        for operand in operands:
            if not isinstance(operand, (Tensor, int, float)):
                raise HostirError(
                    f"operands must be Tensors or Python numbers, got {operand!r}",
                    op_name=op_class.name,
                )
        if not tensors:
            raise HostirError(
                f"at least one operand must be a Tensor, got {operands}", op_name=op_class.name
            )
        for tensor in tensors:
            self._check_owned(tensor)
        like = tensors[0]
        return [
            o if isinstance(o, Tensor) else self.constant(o, like.type.element_type, like.type.mesh)
            for o in operands
        ]

    def _check_operands(self, op_class: type[FusionOp], *operands: Tensor) -> None:
        """The operands belong to this builder and have one element type."""
        for operand in operands:
            self._check_owned(operand)
        types = [o.type.element_type for o in operands]
        if any(t != types[0] for t in types):
            raise HostirError(
                "operands have element types "
                + ", ".join(map(str, types))
                + "; cast() them to one type",
                op_name=op_class.name,
            )

    def _check_owned(self, tensor: object) -> None:
        if not isinstance(tensor, Tensor):
            raise HostirError(f"expected a Tensor of fusion '{self.name}', got {tensor!r}")
        if tensor.builder is not self:
            raise HostirError(
                f"{tensor} belongs to fusion '{tensor.builder.name}', not to '{self.name}'"
            )
