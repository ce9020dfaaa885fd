"""runtime.reference: sharding whole tensors by type, random inputs, the unsharded reference, comparison."""

from __future__ import annotations

import math

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import bf16, f16, f32, f64, i1, i8, i32, i64

from hostir_dialect.builder import FusionBuilder, parallel_type, torch_dtype
from hostir_dialect.fusion import DYNAMIC, TensorType
from hostir_dialect.text import HostirError
from hostir.runtime.reference import (
    TOLERANCES,
    check_full_inputs,
    compare,
    random_inputs,
    reference_outputs,
    shard,
    unshard,
)

# --------------------------------------------------------------------------- #
# shard / unshard                                                              #
# --------------------------------------------------------------------------- #

MESHES = [[0], [0, 1], [2, 0, 3], [1, 2, 3, 0]]
"""Meshes of one device, in order, out of order and with gaps: ranks 0..4 are inside some, outside others."""

SHARDINGS = [
    (mesh, axes)
    for mesh in MESHES
    for axes in (
        ["_", "_", "_"],
        ["didx", "_", "_"],
        ["_", "didx", "_"],
        ["_", "_", "didx"],
        ["stream", "didx", "_"],
        ["_", "stream", "_"],
    )
]


def typed(shape, element_type, mesh=(0,), axes=None) -> TensorType:
    """A tensor type whose axes are written as in the IR text (`_`, `didx`, `stream`)."""
    return TensorType(shape, element_type, mesh, axes and [parallel_type(a) for a in axes])


def tensor_type(mesh, axes, shape=(3, 5, 2)) -> TensorType:
    """A [3, 5, 2]-like type whose didx axis spans the mesh."""
    extents = [len(mesh) if a == "didx" else d for d, a in zip(shape, axes)]
    return typed(extents, f32, mesh, axes)


@pytest.mark.parametrize("mesh, axes", SHARDINGS, ids=lambda v: ",".join(map(str, v)))
def test_shard_unshard_round_trip(mesh, axes):
    type = tensor_type(mesh, axes)
    full = torch.randn(type.get_shape())
    pieces = {rank: shard(full, type, rank) for rank in range(5)}
    for rank, piece in pieces.items():
        if rank not in mesh:
            assert piece.numel() == 0
        elif type.didx_axis is None:
            assert torch.equal(piece, full)
        else:
            expected = full.select(type.didx_axis, mesh.index(rank)).unsqueeze(type.didx_axis)
            assert torch.equal(piece, expected)
            assert list(piece.shape) == list(type.local_shape())
    assert torch.equal(unshard([pieces[d] for d in mesh], type), full)


def test_shard_of_a_didx_axis_is_independent_of_the_whole_tensor():
    type = tensor_type([0, 1], ["_", "didx", "_"])
    full = torch.randn(type.get_shape())
    piece = shard(full, type, 1)
    piece.fill_(math.nan)
    assert not full.isnan().any()


def test_shard_refuses_a_didx_extent_other_than_the_mesh_size():
    type = tensor_type([0, 1, 2], ["didx", "_", "_"])
    with pytest.raises(HostirError, match="axis 0 is didx over a mesh of 3 device.*must be 3"):
        shard(torch.zeros(2, 5, 2), type, 0)


def test_shard_refuses_a_wrong_static_extent_and_rank():
    type = tensor_type([0], ["_", "_", "_"])
    with pytest.raises(HostirError, match=r"expected shape \[3, 5, 2\], got \[3, 4, 2\]"):
        shard(torch.zeros(3, 4, 2), type, 0)
    with pytest.raises(HostirError, match=r"expected 3 axes"):
        shard(torch.zeros(3, 5), type, 0)


def test_unshard_needs_one_piece_per_device():
    type = tensor_type([0, 1], ["didx", "_", "_"])
    with pytest.raises(HostirError, match="1 piece.*mesh of 2 device"):
        unshard([torch.zeros(1, 5, 2)], type)


# --------------------------------------------------------------------------- #
# random_inputs                                                                #
# --------------------------------------------------------------------------- #

ELEMENT_TYPES = [f64, f32, f16, bf16, i64, i32, i8, i1]


@pytest.mark.parametrize("element_type", ELEMENT_TYPES, ids=str)
def test_random_inputs_per_dtype(element_type):
    types = [
        typed([DYNAMIC, 4, DYNAMIC], element_type, [0, 1, 2, 3], ["_", "didx", "_"]),
        typed([DYNAMIC, 64], element_type),
    ]
    first, second = random_inputs(types, {(0, 0): 5}, seed=3, default_extent=7)
    dtype = torch_dtype(element_type)
    assert first.shape == (5, 4, 7) and second.shape == (7, 64)
    assert first.dtype == second.dtype == dtype
    values = torch.cat([first.flatten(), second.flatten()])
    if dtype == torch.bool:
        assert values.any() and not values.all()
    elif dtype.is_floating_point:
        assert values.isfinite().all()
        # Scaled by 1/sqrt(last extent): a row of the [7, 64] tensor has norm about 1.
        row_norms = second.double().norm(dim=1)
        assert ((row_norms > 0.5) & (row_norms < 1.5)).all()
    else:
        assert values.abs().max() <= 4 and values.unique().numel() > 3


def test_random_inputs_dynamic_didx_axis_gets_the_mesh_size():
    (tensor,) = random_inputs(
        [typed([DYNAMIC, DYNAMIC], f32, [4, 5, 6], ["didx", "_"])], {}, seed=0
    )
    assert tensor.shape == (3, 8)


def test_random_inputs_depend_on_the_seed_only():
    types = [TensorType([DYNAMIC, DYNAMIC], bf16)]
    a, b, c = (random_inputs(types, {}, seed=s)[0] for s in (1, 1, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_random_inputs_refuse_sizes_of_missing_axes():
    types = [TensorType([DYNAMIC, DYNAMIC], f32)]
    with pytest.raises(HostirError, match="argument 1, but the function has 1 argument"):
        random_inputs(types, {(1, 0): 3}, seed=0)
    with pytest.raises(HostirError, match="axis 2 of argument 0, which has 2 axes"):
        random_inputs(types, {(0, 2): 3}, seed=0)


def test_check_full_inputs_names_the_input():
    types = [typed([DYNAMIC, 2], f32, [0, 1], ["_", "didx"])]
    check_full_inputs(types, [torch.zeros(3, 2)], ["x.pt"])
    with pytest.raises(
        HostirError, match=r"input #0 \(x.pt\).*expected dtype torch.float32, got torch.float16"
    ):
        check_full_inputs(types, [torch.zeros(3, 2, dtype=torch.float16)], ["x.pt"])
    with pytest.raises(HostirError, match=r"input #0 \(x.pt\).*axis 1 is didx"):
        check_full_inputs(types, [torch.zeros(3, 3)], ["x.pt"])
    with pytest.raises(HostirError, match="takes 1 input"):
        check_full_inputs(types, [], [])


# --------------------------------------------------------------------------- #
# reference_outputs: every fusion op against torch written here                #
# --------------------------------------------------------------------------- #


def fusion_of(build, *shapes, dtype="f32") -> func.FuncOp:
    """The fusion whose inputs have `shapes` and whose outputs `build(fb, *inputs)` returns."""
    fb = FusionBuilder("f")
    inputs = [fb.input(shape, dtype) for shape in shapes]
    for output in build(fb, *inputs):
        fb.output(output)
    (function,) = fb.build().ops
    return function


UNARY = {
    "neg": lambda x: -x,
    "abs": lambda x: x.abs(),
    "exp": lambda x: x.exp(),
    "log": lambda x: x.abs().log(),
    "sqrt": lambda x: x.abs().sqrt(),
    "relu": lambda x: x.clamp(min=0),
    "tanh": lambda x: x.tanh(),
    "sigmoid": lambda x: 1 / (1 + (-x).exp()),
    "erf": lambda x: x.erf(),
}
BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "maximum": lambda x, y: torch.where(x > y, x, y),
    "minimum": lambda x, y: torch.where(x < y, x, y),
    "pow": lambda x, y: x.abs() ** y,
}


@pytest.mark.parametrize("name", UNARY)
def test_reference_of_unary_ops(name):
    # log and sqrt read |x|, so the fusion takes the abs first as the torch lambda does.
    takes_abs = name in ("log", "sqrt")
    function = fusion_of(lambda fb, x: [getattr(fb, name)(fb.abs(x) if takes_abs else x)], [4, 7])
    x = torch.randn(4, 7)
    (out,) = reference_outputs(function, [x])
    torch.testing.assert_close(out, UNARY[name](x))


@pytest.mark.parametrize("name", BINARY)
def test_reference_of_binary_ops_with_broadcasting(name):
    takes_abs = name == "pow"
    function = fusion_of(
        lambda fb, x, y: [getattr(fb, name)(fb.abs(x) if takes_abs else x, y)], [4, 1], [3]
    )
    x, y = torch.randn(4, 1), torch.randn(3)
    (out,) = reference_outputs(function, [x, y])
    assert out.shape == (4, 3)
    torch.testing.assert_close(out, BINARY[name](x, y))


def test_reference_of_reductions_broadcast_set_cast_and_constant():
    def build(fb, x):
        return [
            fb.sum(x, [0, 2]),
            fb.max(x, [1], keepdim=True),
            fb.broadcast(x, [0, 3]),
            fb.set(x),
            fb.cast(x, "i32"),
            fb.mul(x, 2.5),
        ]

    x = torch.randn(3, 4, 5) * 10
    sum_, max_, broadcast, copy, cast, scaled = reference_outputs(fusion_of(build, [3, 4, 5]), [x])
    torch.testing.assert_close(sum_, x.double().sum(dim=(0, 2)).float())
    assert torch.equal(max_, x.max(dim=1, keepdim=True).values)
    assert torch.equal(broadcast, x[None, :, :, None, :])
    assert torch.equal(copy, x)
    assert torch.equal(cast, x.trunc().to(torch.int32))
    assert torch.equal(scaled, x * 2.5)


def test_reference_of_matmul_and_linear():
    def build(fb, a, b, w, bias):
        return [fb.matmul(a, b), fb.linear(a, w, bias), fb.linear(a, w)]

    a, b, w, bias = torch.randn(2, 5, 6), torch.randn(6, 3), torch.randn(4, 6), torch.randn(4)
    mm, lin, lin_no_bias = reference_outputs(
        fusion_of(build, [2, 5, 6], [6, 3], [4, 6], [4]), [a, b, w, bias]
    )
    by_hand = torch.einsum("bmk,kn->bmn", a.double(), b.double()).float()
    torch.testing.assert_close(mm, by_hand)
    torch.testing.assert_close(
        lin, torch.einsum("bmk,nk->bmn", a.double(), w.double()).float() + bias
    )
    torch.testing.assert_close(
        lin_no_bias, torch.einsum("bmk,nk->bmn", a.double(), w.double()).float()
    )


def test_reference_of_a_sharded_fusion_is_the_unsharded_computation():
    fb = FusionBuilder("allreduce")
    x = fb.input([None, 4, None], "f32", mesh=range(4), axes=["_", "didx", "_"])
    out = fb.sum(x, [1])
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    (function,) = fb.build().ops
    full = torch.randn(3, 4, 5)
    (result,) = reference_outputs(function, [full])
    torch.testing.assert_close(result, full[:, 0] + full[:, 1] + full[:, 2] + full[:, 3])


def test_reference_of_bf16_pointwise_chain_rounds_once():
    function = fusion_of(lambda fb, x, y: [fb.exp(fb.add(x, y))], [64], [64], dtype="bf16")
    x, y = torch.randn(64).bfloat16(), torch.randn(64).bfloat16()
    (out,) = reference_outputs(function, [x, y])
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() + y.float()).exp().bfloat16())


# --------------------------------------------------------------------------- #
# compare                                                                      #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
def test_compare_accepts_errors_below_and_refuses_errors_above_the_tolerance(dtype):
    expected = torch.randn(100, dtype=torch.float64).to(dtype)
    scale = expected.double().abs().max().item()
    tolerance = TOLERANCES[dtype]
    for factor, ok in ((0.5, True), (2.0, False)):
        actual = expected.double().clone()
        actual[17] += factor * tolerance * scale
        comparison = compare(actual.to(dtype), expected)
        assert comparison.ok == ok, (factor, comparison)


def test_compare_relative_to_the_largest_reference_magnitude():
    expected = torch.tensor([1000.0, 1e-3])
    actual = torch.tensor([1000.0, 2e-3])  # 100% off on a tiny element, 1e-6 of the largest
    comparison = compare(actual, expected)
    assert comparison.ok and comparison.error == pytest.approx(1e-6)


def test_compare_nan_matches_only_nan():
    expected = torch.tensor([1.0, math.nan, math.inf])
    assert compare(expected.clone(), expected).ok
    assert not compare(torch.tensor([math.nan, math.nan, math.inf]), expected).ok
    assert not compare(torch.tensor([1.0, 0.0, math.inf]), expected).ok
    assert not compare(torch.tensor([1.0, math.nan, -math.inf]), expected).ok


def test_compare_integers_and_booleans_exactly():
    expected = torch.arange(10, dtype=torch.int32)
    assert compare(expected.clone(), expected).ok
    off_by_one = expected.clone()
    off_by_one[3] += 1
    assert not compare(off_by_one, expected).ok
    flags = torch.tensor([True, False])
    assert compare(flags.clone(), flags).ok and not compare(~flags, flags).ok


def test_compare_reports_shape_and_dtype_mismatches():
    comparison = compare(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not comparison.ok and "shape [3, 2]" in comparison.problem
    assert not compare(torch.zeros(2), torch.zeros(2, dtype=torch.float64)).ok
