"""Whole (unsharded) tensors, the pieces that ranks hold of them, and the reference results.

A sharded program is checked the way nvFuser's tests check theirs: make random whole
inputs, give every rank its piece (`shard`), run, reassemble the outputs (`unshard`)
and compare them with the fusion evaluated on the whole inputs in one process
(`reference_outputs`) within the tolerance of the element type (`compare`).

A rank holds of a tensor of type T:
  * nothing (an empty placeholder, `torch.empty(0)`) if it is outside T's mesh;
  * slice `p` of T's `didx` axis, kept with extent 1, if it is at position `p` of the mesh;
  * the whole tensor otherwise (replicated over the mesh). `stream` axes are whole:
    a stream axis is walked in time, not split over devices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from xdsl.dialects import func

from hostir_dialect.builder import torch_dtype
from hostir_dialect.fusion import DYNAMIC, TensorType, shape_str
from hostir_dialect.text import HostirError
from hostir.runtime.interpreter.fusion_eval import evaluate

DEFAULT_EXTENT = 8
"""The extent `random_inputs` gives a dynamic axis that `sizes` does not name."""

Sizes = Mapping[tuple[int, int], int]
"""Extents of dynamic axes by (argument index, axis)."""


def placeholder(like: torch.Tensor | None = None) -> torch.Tensor:
    """What a rank outside a tensor's mesh holds of it."""
    return torch.empty(0) if like is None else like.new_empty(0)


def full_shape_problem(full: torch.Tensor, type: TensorType) -> str | None:
    """What is wrong with `full` as a whole tensor of `type` (rank, static extents, didx extent)."""
    declared = type.get_shape()
    if full.dim() != len(declared):
        return f"expected {len(declared)} axes {shape_str(declared)}, got shape {list(full.shape)}"
    didx = type.didx_axis
    for axis, (expected, actual) in enumerate(zip(declared, full.shape)):
        if axis == didx and actual != type.mesh.size:
            return (
                f"axis {axis} is didx over a mesh of {type.mesh.size} device(s), so its extent "
                f"must be {type.mesh.size}; got shape {list(full.shape)}"
            )
        if expected not in (DYNAMIC, actual):
            return f"expected shape {shape_str(declared)}, got {list(full.shape)}"
    return None


def _check_full(full: torch.Tensor, type: TensorType, what: str) -> None:
    problem = full_shape_problem(full, type)
    if problem:
        raise HostirError(f"{what} ({type.sharding_str()}): {problem}")


def shard(full: torch.Tensor, type: TensorType, rank: int) -> torch.Tensor:
    """The piece of the whole tensor `full` of `type` that device `rank` holds."""
    _check_full(full, type, "cannot shard a tensor")
    if rank not in type.mesh.ids:
        return placeholder(full)
    didx = type.didx_axis
    if didx is None:
        return full
    return full.narrow(didx, type.mesh.ids.index(rank), 1).contiguous()


def unshard(pieces: Sequence[torch.Tensor], type: TensorType) -> torch.Tensor:
    """The whole tensor of `type` from the pieces of its mesh's devices, in mesh order."""
    if len(pieces) != type.mesh.size:
        raise HostirError(
            f"cannot unshard {len(pieces)} piece(s) of a tensor on a mesh of "
            f"{type.mesh.size} device(s) ({type.sharding_str()})"
        )
    didx = type.didx_axis
    return pieces[0] if didx is None else torch.cat(list(pieces), dim=didx)


# --------------------------------------------------------------------------- #
# Random inputs                                                                #
# --------------------------------------------------------------------------- #


def full_shape(type: TensorType, index: int, sizes: Sizes, default_extent: int) -> tuple[int, ...]:
    """The whole shape of argument `index`: static extents as declared, the mesh size on the
    `didx` axis, `sizes[(index, axis)]` or `default_extent` on the other dynamic axes."""

    def extent_of(axis: int, declared: int) -> int:
        if axis == type.didx_axis:
            return type.mesh.size
        if declared == DYNAMIC:
            return sizes.get((index, axis), default_extent)
        return declared

    return tuple(extent_of(axis, declared) for axis, declared in enumerate(type.get_shape()))


def random_tensor(
    shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    """Random values that every op of the fusion dialect computes on without overflow.

    Floats are normal with standard deviation 1/sqrt(last extent), so that a matmul or
    linear contracting that axis gives values of order one at any K; integers lie in
    [-4, 4], small enough that a matmul of them stays exact in i8; i1 is a fair coin.
    """
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=generator).bool()
    if not dtype.is_floating_point:
        return torch.randint(-4, 5, tuple(shape), generator=generator, dtype=dtype)
    scale = 1 / math.sqrt(max(1, shape[-1])) if shape else 1.0
    return (torch.randn(tuple(shape), generator=generator) * scale).to(dtype)


def random_inputs(
    types: Sequence[TensorType],
    sizes: Sizes | None = None,
    seed: int = 0,
    default_extent: int = DEFAULT_EXTENT,
) -> list[torch.Tensor]:
    """Random whole inputs of `types` (on the CPU); the same `seed` gives the same tensors."""
    generator = torch.Generator().manual_seed(seed)
    sizes = sizes or {}
    for index, axis in sizes:
        if not 0 <= index < len(types):
            raise HostirError(
                f"a size is given for argument {index}, but the function has {len(types)} argument(s)"
            )
        type = types[index]
        if not 0 <= axis < type.rank:
            raise HostirError(f"a size is given for axis {axis} of argument {index}, which has {type.rank} axes")
        declared = type.get_shape()[axis]
        if axis == type.didx_axis:
            raise HostirError(
                f"a size is given for axis {axis} of argument {index} ({type}), its didx axis, whose "
                f"extent is the size of its mesh, {type.mesh.size}"
            )
        if declared != DYNAMIC:
            raise HostirError(
                f"a size is given for axis {axis} of argument {index} ({type}), which is not dynamic: "
                f"its extent is {declared}"
            )
    return [
        random_tensor(
            full_shape(type, index, sizes, default_extent),
            torch_dtype(type.element_type),
            generator,
        )
        for index, type in enumerate(types)
    ]


def check_full_inputs(
    types: Sequence[TensorType], inputs: Sequence[torch.Tensor], names: Sequence[str]
) -> None:
    """Raises `HostirError` unless `inputs` are whole tensors of `types` (`names` say where each is from)."""
    if len(inputs) != len(types):
        raise HostirError(f"the function takes {len(types)} input(s), got {len(inputs)}")
    for index, (value, type, name) in enumerate(zip(inputs, types, names)):
        what = f"input #{index} ({name})"
        if not isinstance(value, torch.Tensor):
            raise HostirError(f"{what}: expected a torch.Tensor, got {value.__class__.__name__}")
        _check_full(value, type, what)
        dtype = torch_dtype(type.element_type)
        if value.dtype != dtype:
            raise HostirError(f"{what}: expected dtype {dtype}, got {value.dtype}")


# --------------------------------------------------------------------------- #
# Reference results and their comparison                                       #
# --------------------------------------------------------------------------- #


def reference_outputs(
    fusion: func.FuncOp, full_inputs: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """The fusion's outputs on whole tensors, computed by plain torch in this process."""
    return evaluate(fusion, full_inputs)


TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-7,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 2e-2,
}
"""Relative tolerance by dtype; integer and boolean outputs must match exactly."""


@dataclass(frozen=True)
class Comparison:
    """How far an output is from its reference: max |actual - expected| / max |expected|.

    The error is relative to the reference's largest magnitude rather than to each
    element, as `torch.testing.assert_close` with `atol = rtol * max|expected|` would
    judge it: a matmul with a long K sums many rounded products, and an element that
    cancels to nearly zero carries an absolute error of the size of the terms, not of
    itself. NaN where the reference has NaN is a match; anywhere else an infinite error.
    """

    error: float
    tolerance: float
    problem: str | None = None
    """A reason the output cannot be compared (a shape or dtype mismatch), if any."""

    @property
    def ok(self) -> bool:
        return self.problem is None and self.error <= self.tolerance


def compare(actual: torch.Tensor, expected: torch.Tensor) -> Comparison:
    """Compares an output with its reference within the tolerance of the reference's dtype."""
    tolerance = TOLERANCES.get(expected.dtype, 0.0)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Comparison(
            math.inf,
            tolerance,
            f"expected {expected.dtype} of shape {list(expected.shape)}, "
            f"got {actual.dtype} of shape {list(actual.shape)}",
        )
    if expected.numel() == 0:
        return Comparison(0.0, tolerance)
    actual = actual.detach().cpu().double()
    expected = expected.detach().cpu().double()
    # Equal infinities and NaN against NaN match; any other NaN or infinity is a mismatch.
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    difference = (
        (actual - expected).abs().masked_fill(same, 0).nan_to_num(nan=math.inf, posinf=math.inf)
    )
    scale = expected.abs().masked_fill(~expected.isfinite(), 0).max().item()
    largest = difference.max().item()
    return Comparison(largest / scale if scale > 0 else largest, tolerance)
