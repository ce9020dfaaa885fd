"""The importer's rules for pointwise ATen ops, activations, casts and reductions: the fusion
ops that compute them, with ATen's dtype rules made explicit by casts.

An activation (SiLU, GELU and their backward) is written as the fusion ops that ATen's
kernel computes, so that it joins the pointwise run around it in one generated kernel,
where a `fusion.aten` would cut the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._prims_common import get_computation_dtype

from hostir_dialect import fusion
from hostir_dialect.aten_call import CARRIERS
from hostir.frontend.importer import Importer, Rule, Value, aten, dtype_supported, name_of, result_of, rule


def elementwise_result(importer: Importer, node: torch.fx.Node, op_class: type, operands: list[Any]) -> Value | None:
    """An elementwise fusion op in the result's dtype, ATen's promotion done by casts first."""
    result = result_of(node)
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
    out.ssa.name_hint = name_of(node)
    return out


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
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
        return elementwise_result(importer, node, op_class, [importer.arg(a) for a in node.args])

    return lower


def no_alpha(node: torch.fx.Node) -> bool:
    return node.kwargs.get("alpha", 1) == 1 and len(node.args) == 2


def _true_division(node: torch.fx.Node) -> bool:
    return node.kwargs.get("rounding_mode") is None


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
        result = result_of(node)
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
        out.ssa.name_hint = name_of(node)
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


@rule(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _to_dtype(importer: Importer, node: torch.fx.Node) -> Value | None:
    result = result_of(node)
    value = importer.arg(node.args[0])
    kwargs = set(node.kwargs) - {"dtype", "layout", "device"}
    if kwargs or result.device != node.args[0].meta["val"].device:
        return None
    if not dtype_supported(result.dtype) or value.dtype in CARRIERS:
        return None
    return importer.cast(value, result.dtype)


@rule(aten.sum.dim_IntList, aten.amax.default)
def _reduction(importer: Importer, node: torch.fx.Node) -> Value | None:
    if set(node.kwargs) - {"keepdim"} or len(node.args) < 2:
        return None
    value = importer.flat(importer.arg(node.args[0]))
    result = result_of(node)
    dims = node.args[1] or list(range(len(value.shape)))
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if result.dtype != value.dtype or not value.shape or value.dtype in CARRIERS:
        return None
    offset = 1 if importer.varies(value) else 0
    axes = [(d % len(value.shape)) + offset for d in dims]
    op_class = fusion.SumOp if node.target == aten.sum.dim_IntList else fusion.MaxOp
    result_type = importer.tensor_type(tuple(result.shape), result.dtype, importer.varies(value))
    op = importer.emit(op_class(value.ssa, axes, bool(keepdim), result_type))
    op.results[0].name_hint = name_of(node)
    return Value(op.results[0], tuple(result.shape), result.dtype, importer.varies(value))


for _targets, _op, _check in (
    ((aten.add.Tensor, aten.add.Scalar), fusion.AddOp, no_alpha),
    ((aten.sub.Tensor, aten.sub.Scalar), fusion.SubOp, no_alpha),
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


for _target, _compose, _tensors in (
    (aten.silu.default, _silu, 1),
    (aten.silu_backward.default, _silu_backward, 2),
    (aten.gelu.default, _gelu, 1),
    (aten.gelu_backward.default, _gelu_backward, 2),
):
    rule(_target)(_activation(_compose, _tensors))
