"""FusionBuilder: every op, the schedule helpers, errors, and the reference fusions.

Static result shapes are checked against what torch itself computes on tensors of
those shapes; every built module must print and parse back to the same text.
"""

import inspect

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    bf16,
    f16,
    f32,
    i1,
    i32,
    i64,
)

from examples import reference_fusions
from hostir_dialect.builder import ELEMENT_TYPES, TORCH_DTYPES, FusionBuilder
from hostir_dialect.fusion import (
    BINARY_OPS,
    DYNAMIC,
    UNARY_OPS,
    AddOp,
    BroadcastOp,
    CastOp,
    ConstantOp,
    DivOp,
    LinearOp,
    MatmulOp,
    MaxOp,
    MulOp,
    NegOp,
    PowOp,
    SetOp,
    SubOp,
    SumOp,
    TanhOp,
    TensorType,
    element_type_name,
)
from hostir_dialect.text import HostirError
from hostir.runtime.program import Program


def tensor(shape, dtype=f32, mesh=(0,), axes=None) -> TensorType:
    """The expected type: `None` is a dynamic extent, `_` a serial axis."""
    return TensorType(
        [DYNAMIC if d is None else d for d in shape],
        dtype,
        list(mesh),
        None if axes is None else ["serial" if a == "_" else a for a in axes.split()],
    )


@pytest.fixture
def build(assert_round_trips):
    """Builds a FusionBuilder, checks the text round-trips, returns the function."""

    def build(fb: FusionBuilder) -> func.FuncOp:
        module = fb.build()
        assert isinstance(module, ModuleOp)
        assert_round_trips(module)
        (function,) = module.ops
        assert isinstance(function, func.FuncOp)
        assert function.sym_name.data == fb.name
        return function

    return build


def body_ops(function: func.FuncOp) -> list:
    """The ops of the function, without its return."""
    return list(function.body.block.ops)[:-1]


def result_types(function: func.FuncOp) -> list[TensorType]:
    return list(function.function_type.outputs.data)


# --------------------------------------------------------------------------- #
# Inputs and element types                                                     #
# --------------------------------------------------------------------------- #


def test_input_type(build):
    fb = FusionBuilder("inputs")
    x = fb.input([None, 8, 3], "bf16", mesh=range(8), axes=["stream", "didx", "_"])
    y = fb.input([5], "f32")
    fb.output(x)
    fb.output(y)
    function = build(fb)
    assert list(function.function_type.inputs.data) == [
        tensor([None, 8, 3], bf16, range(8), "stream didx _"),
        tensor([5]),
    ]
    assert result_types(function) == list(function.function_type.inputs.data)
    assert x.shape == (DYNAMIC, 8, 3)


@pytest.mark.parametrize("name", ELEMENT_TYPES)
def test_element_types_by_name(name, build):
    fb = FusionBuilder("dtype")
    fb.output(fb.input([2], name))
    (input_type,) = build(fb).function_type.inputs.data
    assert element_type_name(input_type.element_type) == name


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_element_types_by_torch_dtype(dtype, build):
    fb = FusionBuilder("dtype")
    x = fb.input([2], dtype)
    fb.output(x)
    (input_type,) = build(fb).function_type.inputs.data
    # The name of the element type matches the torch dtype's own size and kind.
    probe = torch.empty(0, dtype=dtype)
    expected_bits = 1 if dtype == torch.bool else probe.element_size() * 8
    name = element_type_name(input_type.element_type)
    assert int(name.lstrip("bfi")) == expected_bits
    assert name.startswith("i") != probe.is_floating_point()
    assert (name == "bf16") == (dtype == torch.bfloat16)


def test_element_type_as_an_xdsl_type():
    fb = FusionBuilder("dtype")
    assert fb.input([2], f16).type.element_type == f16


# --------------------------------------------------------------------------- #
# Ops                                                                          #
# --------------------------------------------------------------------------- #

SHARDED_ON_2_3 = dict(mesh=[2, 3], axes=["_", "didx"])


@pytest.mark.parametrize("op", [SetOp, *UNARY_OPS], ids=lambda op: op.name)
def test_unary_ops(op, build):
    fb = FusionBuilder("unary")
    x = fb.input([None, 2], "f16", **SHARDED_ON_2_3)
    fb.output(getattr(fb, op.name.removeprefix("fusion."))(x))
    (computed,) = body_ops(build(fb))
    assert isinstance(computed, op)
    # Same shape and element type, the operand's mesh, and every axis serial.
    assert computed.results[0].type == tensor([None, 2], f16, [2, 3])


@pytest.mark.parametrize("op", BINARY_OPS, ids=lambda op: op.name)
@pytest.mark.parametrize(
    "lhs, rhs", [([3, 1, 4], [5, 1]), ([4], [2, 3, 4]), ([], [2, 2]), ([6, 2], [6, 2])]
)
def test_binary_ops_broadcast_as_torch_does(op, lhs, rhs, build):
    fb = FusionBuilder("binary")
    x = fb.input(lhs, "f32", mesh=[4, 5])
    y = fb.input(rhs, "f32")
    fb.output(getattr(fb, op.name.removeprefix("fusion."))(x, y))
    (computed,) = body_ops(build(fb))
    assert isinstance(computed, op)
    expected = torch.broadcast_shapes(torch.Size(lhs), torch.Size(rhs))
    assert computed.results[0].type == tensor(expected, f32, [4, 5])


def test_binary_op_with_dynamic_extents(build):
    fb = FusionBuilder("dynamic")
    x = fb.input([None, 1, None], "f32")
    y = fb.input([7, 1], "f32")
    fb.output(fb.maximum(x, y))
    (computed,) = body_ops(build(fb))
    assert computed.results[0].type == tensor([None, 7, None])


def test_constant(build):
    fb = FusionBuilder("constants")
    fb.output(fb.constant(2.5, "bf16", mesh=range(4)))
    fb.output(fb.constant(-3, torch.int64))
    fb.output(fb.constant(True, "i1"))
    fb.output(fb.constant(4.0, "i32"))
    ops = body_ops(build(fb))
    assert all(isinstance(op, ConstantOp) for op in ops)
    assert [op.value for op in ops] == [
        FloatAttr(2.5, bf16),
        IntegerAttr(-3, i64),
        IntegerAttr(1, i1),
        IntegerAttr(4, i32),
    ]
    assert [op.results[0].type for op in ops] == [
        tensor([], bf16, range(4)),
        tensor([], i64),
        tensor([], i1),
        tensor([], i32),
    ]


def test_cast(build):
    fb = FusionBuilder("cast")
    x = fb.input([None, 3], "f32", mesh=[1, 0])
    fb.output(fb.cast(x, torch.bfloat16))
    fb.output(fb.cast(x, "i8"))
    to_bf16, to_i8 = body_ops(build(fb))
    assert isinstance(to_bf16, CastOp)
    assert to_bf16.results[0].type == tensor([None, 3], bf16, [1, 0])
    assert to_i8.results[0].type == tensor([None, 3], IntegerType(8), [1, 0])


@pytest.mark.parametrize("op", [SumOp, MaxOp], ids=lambda op: op.name)
@pytest.mark.parametrize("axes", [[1], [0, 2], [-1], 2, [2, 0, 1]], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_reduce_as_torch_does(op, axes, keepdim, build):
    fb = FusionBuilder("reduction")
    x = fb.input([2, 3, 4], "f32", mesh=range(3))
    fb.output(getattr(fb, op.name.removeprefix("fusion."))(x, axes, keepdim=keepdim))
    (computed,) = body_ops(build(fb))
    assert isinstance(computed, op)
    expected = torch.empty(2, 3, 4).sum(axes, keepdim=keepdim).shape
    assert computed.results[0].type == tensor(expected, f32, range(3))
    dims = [axes] if isinstance(axes, int) else axes
    assert computed.axes.get_values() == tuple(d % 3 for d in dims)
    assert computed.keeps_dims == keepdim


def test_reduction_keeps_dynamic_extents(build):
    fb = FusionBuilder("reduction")
    fb.output(fb.sum(fb.input([None, 5, None], "f32"), [1]))
    (computed,) = body_ops(build(fb))
    assert computed.results[0].type == tensor([None, None])


@pytest.mark.parametrize("new_axes", [[0], [1, 3], [0, 1, 2, 4], -1, [-1, 0]], ids=str)
def test_broadcast_inserts_unit_axes(new_axes, build):
    fb = FusionBuilder("broadcast")
    fb.output(fb.broadcast(fb.input([None, 3], "f32", mesh=[0, 1]), new_axes))
    (computed,) = body_ops(build(fb))
    assert isinstance(computed, BroadcastOp)
    positions = [new_axes] if isinstance(new_axes, int) else new_axes
    expected = torch.empty(7, 3)  # the dynamic extent, made concrete
    rank = 2 + len(positions)
    for position in sorted(p % rank for p in positions):
        expected = expected.unsqueeze(position)
    assert computed.new_axes.get_values() == tuple(p % rank for p in positions)
    assert computed.results[0].type == tensor(
        [None if d == 7 else d for d in expected.shape], f32, [0, 1]
    )


@pytest.mark.parametrize(
    "lhs, rhs",
    [
        ([3, 4], [4, 5]),
        ([2, 3, 4], [4, 5]),
        ([4], [4, 5]),
        ([3, 4], [4]),
        ([7, 1, 3, 4], [2, 4, 6]),
        ([4], [4]),
    ],
    ids=str,
)
def test_matmul_shapes_as_torch(lhs, rhs, build):
    fb = FusionBuilder("matmul")
    a = fb.input(lhs, "bf16", mesh=range(2))
    b = fb.input(rhs, "bf16", mesh=range(2))
    fb.output(a @ b)
    (computed,) = body_ops(build(fb))
    assert isinstance(computed, MatmulOp)
    expected = torch.matmul(torch.empty(lhs), torch.empty(rhs)).shape
    assert computed.results[0].type == tensor(expected, bf16, range(2))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("x_shape", [[5, 3], [2, 5, 3], [3]], ids=str)
def test_linear_shapes_as_torch(x_shape, with_bias, build):
    fb = FusionBuilder("linear")
    x = fb.input(x_shape, "f32", mesh=range(4))
    weight = fb.input([6, 3], "f32", mesh=range(4))
    bias = fb.input([6], "f32", mesh=range(4)) if with_bias else None
    fb.output(fb.linear(x, weight, bias))
    (computed,) = body_ops(build(fb))
    assert isinstance(computed, LinearOp)
    assert (computed.bias is not None) == with_bias
    expected = torch.nn.functional.linear(
        torch.empty(x_shape), torch.empty(6, 3), torch.empty(6) if with_bias else None
    ).shape
    assert computed.results[0].type == tensor(expected, f32, range(4))


@pytest.mark.parametrize("bias", [[5], [1, 5], [3, 1, 5], []], ids=str)
def test_matmul_with_a_bias_has_the_shape_of_the_product(bias, build):
    fb = FusionBuilder("addmm")
    a = fb.input([3, 4, 2], "bf16", mesh=range(2))
    b = fb.input([2, 5], "bf16", mesh=range(2))
    fb.output(fb.matmul(a, b, fb.input(bias, "bf16", mesh=range(2))))
    (computed,) = body_ops(build(fb))
    assert isinstance(computed, MatmulOp) and computed.bias is not None
    assert computed.results[0].type == tensor([3, 4, 5], bf16, range(2))


def test_matmul_and_linear_keep_dynamic_extents(build):
    fb = FusionBuilder("dynamic")
    x = fb.input([None, 8, None, None], "f32", mesh=range(8), axes=["_", "didx", "_", "_"])
    w = fb.input([None, None], "f32", mesh=range(8))
    fb.output(fb.matmul(x, w))
    fb.output(fb.linear(x, w))
    matmul, linear = body_ops(build(fb))
    assert matmul.results[0].type == tensor([None, 8, None, None], f32, range(8))
    assert linear.results[0].type == tensor([None, 8, None, None], f32, range(8))


@pytest.mark.parametrize(
    "expression, op, scalar_first",
    [
        (lambda x: x + 2, AddOp, False),
        (lambda x: 2 + x, AddOp, True),
        (lambda x: x - 2, SubOp, False),
        (lambda x: 2 - x, SubOp, True),
        (lambda x: x * 2, MulOp, False),
        (lambda x: 2 * x, MulOp, True),
        (lambda x: x / 2, DivOp, False),
        (lambda x: 2 / x, DivOp, True),
        (lambda x: x**2, PowOp, False),
        (lambda x: 2**x, PowOp, True),
    ],
)
def test_operators_make_scalars_constants_like_the_tensor(expression, op, scalar_first, build):
    fb = FusionBuilder("operators")
    x = fb.input([None, 4], "bf16", mesh=range(4), axes=["_", "didx"])
    fb.output(expression(x))
    constant, computed = body_ops(build(fb))
    assert isinstance(constant, ConstantOp) and isinstance(computed, op)
    assert constant.value == FloatAttr(2.0, bf16)
    assert constant.results[0].type == tensor([], bf16, range(4))
    operands = [v.type for v in computed.operands]
    x_type = tensor([None, 4], bf16, range(4), "_ didx")
    assert operands == (
        [constant.results[0].type, x_type] if scalar_first else [x_type, constant.results[0].type]
    )
    assert computed.results[0].type == tensor([None, 4], bf16, range(4))


def test_tensor_operators(build):
    fb = FusionBuilder("operators")
    x = fb.input([3, 4], "f32")
    y = fb.input([4], "f32")
    fb.output(-x + y * x)
    neg, mul, add = body_ops(build(fb))
    assert [type(op) for op in (neg, mul, add)] == [NegOp, MulOp, AddOp]
    assert add.lhs is neg.results[0] and add.rhs is mul.results[0]


# --------------------------------------------------------------------------- #
# Schedule helpers                                                             #
# --------------------------------------------------------------------------- #


def test_schedule_applies_to_inputs_intermediates_and_outputs_after_use(build):
    fb = FusionBuilder("schedule")
    x = fb.input([None, 4, 6], "f32", mesh=range(4))
    y = fb.neg(x)
    z = fb.sum(y, [2])
    fb.output(z)
    fb.parallelize(x, 1, "didx")
    fb.parallelize(y, -3, "stream")
    fb.parallelize(y, 1, "didx")
    fb.parallelize(z, 0, "stream")
    fb.parallelize(z, 0, "_")
    fb.parallelize(z, 1, "stream")
    function = build(fb)
    neg, total = body_ops(function)
    assert function.body.block.args[0].type == tensor([None, 4, 6], f32, range(4), "_ didx _")
    assert neg.operands[0].type == function.body.block.args[0].type
    assert neg.results[0].type == tensor([None, 4, 6], f32, range(4), "stream didx _")
    assert total.results[0].type == tensor([None, 4], f32, range(4), "_ stream")
    assert result_types(function) == [total.results[0].type]


def test_set_mesh_then_shard_on_it(build):
    fb = FusionBuilder("mesh")
    x = fb.input([6, None], "f32")
    y = fb.set(x)
    fb.output(y)
    fb.set_mesh(y, range(2, 8))
    fb.parallelize(y, 0, "didx")
    (computed,) = body_ops(build(fb))
    assert computed.operands[0].type == tensor([6, None])
    assert computed.results[0].type == tensor([6, None], f32, range(2, 8), "didx _")


def test_a_result_takes_its_first_operands_mesh_as_scheduled_when_defined(build):
    """The mesh is inherited when the op is defined; the schedule may change it later."""
    fb = FusionBuilder("mesh")
    x = fb.input([2], "f32", mesh=[1])
    fb.set_mesh(x, [3])
    y = fb.relu(x)
    fb.set_mesh(x, [5])
    fb.output(y)
    (computed,) = body_ops(build(fb))
    assert computed.operands[0].type == tensor([2], f32, [5])
    assert computed.results[0].type == tensor([2], f32, [3])


# --------------------------------------------------------------------------- #
# Errors                                                                       #
# --------------------------------------------------------------------------- #


def _two_inputs(fb: FusionBuilder):
    return fb.input([None, 4], "f32", mesh=range(4), axes=["_", "didx"]), fb.input([3, 5], "f32")


@pytest.mark.parametrize(
    "mistake, message",
    [
        (lambda fb, x, y: fb.input([2], "f8"), "unknown element type 'f8'"),
        (
            lambda fb, x, y: fb.input([2], torch.complex64),
            "torch dtype torch.complex64 has no fusion element type",
        ),
        (lambda fb, x, y: fb.input([2], IntegerType(16)), "element type i16 is not supported"),
        (
            lambda fb, x, y: fb.input([2, 3], "f32", axes=["_"]),
            "rank 2 needs 2 parallel types, got 1",
        ),
        (lambda fb, x, y: fb.input([2], "f32", axes=["didy"]), "unknown parallel type 'didy'"),
        (
            lambda fb, x, y: fb.input([3], "f32", mesh=range(4), axes=["didx"]),
            "didx axis 0 has extent 3 but the mesh has 4",
        ),
        (
            lambda fb, x, y: fb.input([2], "f32", mesh=[0, 0]),
            r"lists device\(s\) \[0\] more than once",
        ),
        (lambda fb, x, y: fb.input([2], "f32", mesh=[]), "at least one device"),
        (lambda fb, x, y: fb.input([-2], "f32"), "negative extent -2"),
        (
            lambda fb, x, y: fb.add(x, y),
            r"fusion.add: shapes \[\?, 4\], \[3, 5\] do not broadcast",
        ),
        (
            lambda fb, x, y: fb.matmul(x, y),
            r"fusion.matmul: matmul contracts axis of extent 4",
        ),
        (
            lambda fb, x, y: fb.matmul(x, fb.input([4, 2], "f32"), x),
            r"fusion.matmul: matmul bias \[\?, 4\] does not broadcast to the product \[\?, 2\]",
        ),
        (lambda fb, x, y: fb.linear(y, x), r"fusion.linear: linear contracts the last axis"),
        (lambda fb, x, y: fb.linear(x, x, x), r"linear bias must have rank 0 or 1"),
        (
            lambda fb, x, y: fb.mul(x, fb.cast(x, "bf16")),
            "operands have element types f32, bf16; cast",
        ),
        (
            lambda fb, x, y: fb.linear(x, x, fb.cast(x, "f16")),
            "operands have element types f32, f32, f16",
        ),
        (
            lambda fb, x, y: fb.sum(x, [2]),
            "reduction axis 2 is out of range for a tensor of rank 2",
        ),
        (lambda fb, x, y: fb.max(x, [0, -2]), r"reduction axes \[0, -2\] name an axis twice"),
        (
            lambda fb, x, y: fb.broadcast(x, [3]),
            "broadcast axis 3 is out of range for a tensor of rank 3",
        ),
        (lambda fb, x, y: fb.cast(x, "complex"), "unknown element type 'complex'"),
        (lambda fb, x, y: fb.constant(1.5, "i32"), "constant 1.5 is not an integer"),
        (lambda fb, x, y: fb.constant(2, "i1"), "'fusion.constant' op"),
        (lambda fb, x, y: fb.cast(x, "i64") * 0.5, "constant 0.5 is not an integer"),
        (lambda fb, x, y: fb.add(1, 2), "at least one operand must be a Tensor"),
        (lambda fb, x, y: fb.add(x, "2"), "operands must be Tensors or Python numbers, got '2'"),
        (lambda fb, x, y: fb.neg(torch.ones(2)), "expected a Tensor of fusion 'bad'"),
        (lambda fb, x, y: fb.parallelize(x, 2, "stream"), "axis 2 is out of range"),
        (lambda fb, x, y: fb.parallelize(x, -3, "stream"), "axis -3 is out of range"),
        (
            lambda fb, x, y: fb.parallelize(x, 0, "didx"),
            r"cannot reschedule .*axes \[0, 1\] are both didx",
        ),
        (
            lambda fb, x, y: fb.parallelize(y, 1, "didx"),
            "cannot reschedule .*didx axis 1 has extent 5 but the mesh has 1",
        ),
        (lambda fb, x, y: fb.parallelize(x, 0, "gridx"), "unknown parallel type 'gridx'"),
        (
            lambda fb, x, y: fb.set_mesh(x, range(2)),
            "cannot reschedule .*didx axis 1 has extent 4 but the mesh has 2",
        ),
        (lambda fb, x, y: fb.set_mesh(x, [1, -1]), "non-negative"),
        (lambda fb, x, y: (fb.output(x), fb.output(x)), "is already an output of fusion 'bad'"),
        (lambda fb, x, y: fb.build(), "fusion 'bad' has no outputs"),
    ],
)
def test_mistakes_raise_hostir_errors_with_plain_messages(mistake, message):
    fb = FusionBuilder("bad")
    x, y = _two_inputs(fb)
    with pytest.raises(HostirError, match=message):
        mistake(fb, x, y)


@pytest.mark.parametrize(
    "use",
    [
        lambda fb, t: fb.neg(t),
        lambda fb, t: fb.add(t, 1.0),
        lambda fb, t: fb.matmul(t, t),
        lambda fb, t: fb.sum(t, 0),
        lambda fb, t: fb.broadcast(t, 0),
        lambda fb, t: fb.cast(t, "f16"),
        lambda fb, t: fb.parallelize(t, 0, "stream"),
        lambda fb, t: fb.set_mesh(t, [1]),
        lambda fb, t: fb.output(t),
    ],
)
def test_a_tensor_of_another_fusion_is_refused(use):
    other = FusionBuilder("other")
    foreign = other.input([2, 2], "f32")
    fb = FusionBuilder("mine")
    with pytest.raises(HostirError, match=r"belongs to fusion 'other', not to 'mine'"):
        use(fb, foreign)


# --------------------------------------------------------------------------- #
# Locations: the Python line that built an op                                  #
# --------------------------------------------------------------------------- #


def _line() -> int:
    """The line of the caller."""
    return inspect.currentframe().f_back.f_lineno


def test_each_op_has_the_python_line_that_defined_it():
    here = _line()
    fb = FusionBuilder("located")
    x = fb.input([4], "f32")
    y = fb.neg(x)
    z = y * 2.0
    fb.output(z)
    function = fb.build().ops.first
    neg, constant, mul, _ = function.body.block.ops
    places = [(op.location.filename.data, op.location.line.data, op.location.column.data) for op in (function, neg, constant, mul)]
    assert places == [(__file__, here + 1, 10), (__file__, here + 3, 9), (__file__, here + 4, 9), (__file__, here + 4, 9)]


def test_an_error_after_building_shows_the_python_line_and_names_the_operand():
    fb = FusionBuilder("moved")
    a = fb.input([2, 4], "f32", mesh=[0, 1], axes=["didx", "_"])
    w = fb.input([4, 4], "f32", mesh=[0, 1])
    here = _line()
    y = fb.matmul(a, w)
    z = fb.neg(y)
    fb.set_mesh(z, [2, 3])
    fb.parallelize(z, 0, "didx")
    fb.output(z)
    with pytest.raises(HostirError) as raised:
        Program.compile(fb.build())
    lines = str(raised.value).splitlines()
    assert lines[0].startswith(
        f"{__file__}:{here + 2}:9: error: fusion.neg: operand 0 `input` (the fusion.matmul at "
        f"{__file__}:{here + 1}) must be resharded from mesh = [0, 1], axes = [_, _] to "
        "mesh = [2, 3], axes = [didx, _]"
    )
    assert lines[1:] == ["    z = fb.neg(y)", "        ^"]


def test_a_mistake_while_building_is_located_at_the_call():
    fb = FusionBuilder("bad")
    here = _line()
    with pytest.raises(HostirError, match="didx axis 0 has extent 5 but the mesh has 4") as raised:
        fb.input([5], "f32", mesh=range(4), axes=["didx"])
    location = raised.value.location
    assert (location.file, location.line, location.text.strip()) == (
        __file__,
        here + 2,
        'fb.input([5], "f32", mesh=range(4), axes=["didx"])',
    )


# --------------------------------------------------------------------------- #
# The reference fusions                                                        #
# --------------------------------------------------------------------------- #


def expected_reference_types(name: str, d: int):
    """Input types and (op, result type) per op of each reference fusion, on a mesh of `d`."""
    mesh = range(d)

    def on_mesh(shape, axes=None, dtype=f32):
        return tensor(shape, dtype, mesh, axes)

    return {
        "ag_linear": (
            [
                on_mesh([None, d, None, None], "_ didx _ _", bf16),
                on_mesh([None, None], dtype=bf16),
                on_mesh([None], dtype=bf16),
            ],
            [(LinearOp, on_mesh([None, d, None, None], "stream _ _ _", bf16))],
        ),
        "allgather": ([on_mesh([None, d], "_ didx")], [(SetOp, on_mesh([None, d], "stream _"))]),
        "allreduce": (
            [on_mesh([None, d, None], "_ didx _")],
            [(SumOp, on_mesh([None, None], "stream _"))],
        ),
        "reduce_scatter": (
            [on_mesh([None, d, d, None], "_ didx _ _")],
            [(SumOp, on_mesh([None, d, None], "stream didx _"))],
        ),
        "ag_matmul": (
            [on_mesh([None, d, None, None], "_ didx _ _"), on_mesh([None, None])],
            [(MatmulOp, on_mesh([None, d, None, None], "stream _ _ _"))],
        ),
        "matmul_ar": (
            [on_mesh([None, d, None, None], "_ didx _ _"), on_mesh([d, None, None], "didx _ _")],
            [
                (MatmulOp, on_mesh([None, d, None, None], "stream didx _ _")),
                (SumOp, on_mesh([None, None, None], "stream _ _")),
            ],
        ),
        "matmul_rs_through_bcast": (
            [
                on_mesh([None, d, d, None, None], "_ didx _ _ _"),
                on_mesh([d, None, None], "didx _ _"),
            ],
            [
                (BroadcastOp, on_mesh([1, d, 1, None, None], "_ didx _ _ _")),
                (MatmulOp, on_mesh([None, d, d, None, None], "stream didx _ _ _")),
                (SumOp, on_mesh([None, d, None, None], "stream didx _ _")),
            ],
        ),
        "tp_mlp": (
            [
                on_mesh([None, d, None, None], "_ didx _ _"),
                on_mesh([d, None, None], "didx _ _"),
                on_mesh([d, None], "didx _"),
                on_mesh([d, None, None], "didx _ _"),
            ],
            _tp_mlp_ops(on_mesh, d),
        ),
        "allgather_p2p": (
            [on_mesh([d, None], "didx _")],
            [(SetOp, on_mesh([d, None], "stream _"))],
        ),
        "ag_matmul_p2p": (
            [on_mesh([d, None, None], "didx _ _"), on_mesh([None, None])],
            [(MatmulOp, on_mesh([d, None, None], "stream _ _"))],
        ),
    }[name]


def _tp_mlp_ops(on_mesh, d: int) -> list:
    """The ops of tp_mlp: the allgather, the first GEMM and its bias, the tanh-GELU's
    pointwise ops (with their constants), the second GEMM, the reduce-scatter."""
    streamed = on_mesh([None, d, d, None, None], "stream didx _ _ _")
    weight = on_mesh([1, d, 1, None, None], "_ didx _ _ _")
    scalar = on_mesh([])
    gelu = [
        (MulOp, streamed),  # h * h
        (MulOp, streamed),  # h^3
        (ConstantOp, scalar),
        (MulOp, streamed),  # 0.044715 h^3
        (AddOp, streamed),
        (ConstantOp, scalar),
        (MulOp, streamed),  # sqrt(2 / pi) (...)
        (ConstantOp, scalar),
        (MulOp, streamed),  # h / 2
        (TanhOp, streamed),
        (ConstantOp, scalar),
        (AddOp, streamed),  # 1 + tanh
        (MulOp, streamed),
    ]
    return [
        (SetOp, on_mesh([None, d, None, None], "stream _ _ _")),
        (BroadcastOp, on_mesh([None, 1, d, None, None], "stream _ _ _ _")),
        (BroadcastOp, weight),
        (MatmulOp, streamed),
        (BroadcastOp, on_mesh([1, d, 1, 1, None], "_ didx _ _ _")),
        (AddOp, streamed),
        *gelu,
        (BroadcastOp, weight),
        (MatmulOp, streamed),
        (SumOp, on_mesh([None, d, None, None], "stream didx _ _")),
    ]


MULTI_DEVICE = ["ag_linear", "allgather", "allreduce", "reduce_scatter", "ag_matmul", "matmul_ar",
                "matmul_rs_through_bcast", "tp_mlp", "allgather_p2p", "ag_matmul_p2p"]  # fmt: skip

STREAM_0 = tensor([None, None], axes="stream _")

SINGLE_DEVICE = {
    "single_set": ("single_set", {}, [tensor([None, None])], [(SetOp, STREAM_0)]),
    "single_set_non_outermost": (
        "single_set",
        {"stream_axis": 1},
        [tensor([None, None])],
        [(SetOp, tensor([None, None], axes="_ stream"))],
    ),
    "two_sets": ("two_sets", {}, [tensor([None, None])], [(SetOp, STREAM_0), (SetOp, STREAM_0)]),
    "three_sets": (
        "three_sets",
        {},
        [tensor([None, None])],
        [(SetOp, STREAM_0), (SetOp, tensor([None, None])), (SetOp, STREAM_0)],
    ),
    "reduction": ("reduction", {}, [tensor([None, None, None])], [(SumOp, STREAM_0)]),
    "single_binary": ("single_binary", {}, [tensor([None, None])] * 2, [(AddOp, STREAM_0)]),
    "matmul": ("matmul", {}, [tensor([None, None])] * 2, [(MatmulOp, STREAM_0)]),
    "matmul_n": (
        "matmul",
        {"stream_axis": 1},
        [tensor([None, None])] * 2,
        [(MatmulOp, tensor([None, None], axes="_ stream"))],
    ),
    "linear": (
        "linear",
        {},
        [tensor([None, None, None]), tensor([None, None]), tensor([None])],
        [(LinearOp, tensor([None, None, None], axes="stream _ _"))],
    ),
}


def check_reference(module: ModuleOp, inputs, computed, assert_round_trips):
    assert_round_trips(module)
    (function,) = module.ops
    assert list(function.function_type.inputs.data) == inputs
    ops = body_ops(function)
    assert [(type(op), op.results[0].type) for op in ops] == computed
    assert result_types(function) == [computed[-1][1]]


@pytest.mark.parametrize("num_devices", [2, 8])
@pytest.mark.parametrize("name", MULTI_DEVICE)
def test_multi_device_reference_fusions(name, num_devices, assert_round_trips):
    module = reference_fusions.REFERENCE_FUSIONS[name](num_devices=num_devices)
    check_reference(module, *expected_reference_types(name, num_devices), assert_round_trips)


@pytest.mark.parametrize("case", SINGLE_DEVICE)
def test_single_device_reference_fusions(case, assert_round_trips):
    name, kwargs, inputs, computed = SINGLE_DEVICE[case]
    module = reference_fusions.REFERENCE_FUSIONS[name](**kwargs)
    check_reference(module, inputs, computed, assert_round_trips)


def test_every_reference_fusion_is_checked():
    checked = {*MULTI_DEVICE, *(name for name, *_ in SINGLE_DEVICE.values())}
    assert checked == set(reference_fusions.REFERENCE_FUSIONS)


def test_reference_fusions_take_an_element_type(assert_round_trips):
    module = reference_fusions.allgather(num_devices=4, dtype=torch.float16)
    (function,) = module.ops
    assert function.function_type.inputs.data[0] == tensor([None, 4], f16, range(4), "_ didx")
