"""The importer's rules for pointwise ATen ops, casts and reductions: the fusion ops that
compute them, with ATen's dtype rules made explicit by casts.

Activations (GELU, SiLU and their backward) reach the importer as the pointwise ops of
torch's own decompositions (`KERNEL_DECOMPOSITIONS`, RMSNorm's too), so that each joins the pointwise
run around it in one generated kernel, where a `fusion.aten` would cut the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._decomp import get_decompositions
from torch._prims_common import get_computation_dtype

from hostir_dialect import fusion
from hostir_dialect.aten_call import CARRIERS
from hostir.frontend.importer import Importer, Rule, Value, aten, dtype_supported, name_of, result_of, rule


def elementwise_result(importer: Importer, node: torch.fx.Node, op_class: type, operands: list[Any]) -> Value | None:
    """An elementwise fusion op in the result's dtype, ATen's promotion done by casts first;
    computed in f32 and cast back where a number would round in the result's dtype
    (`computed_with`)."""
    result = result_of(node)
    if not result.dtype.is_floating_point:
        return None
    dtype = computed_with([o for o in operands if _is_number(o)], result.dtype)
    values: list[Value] = [importer.scalar(o, dtype) if _is_number(o) else o for o in operands]
    if not all(isinstance(v, Value) for v in values) or any(v.dtype in CARRIERS for v in values):
        return None
    shape = tuple(result.shape)
    model = _shared_piece(values, shape)
    if model is None:
        values = [importer.flat(v) for v in values]
    layout = () if model is None else (model.local, model.order)
    out = importer.cast(Pointwise(importer, shape, dtype, *layout)(op_class, *values), result.dtype)
    out.ssa.name_hint = name_of(node)
    return out


def _is_number(operand: Any) -> bool:
    return isinstance(operand, (int, float)) and not isinstance(operand, bool)


def computed_with(numbers: list[int | float], dtype: torch.dtype) -> torch.dtype:
    """The dtype in which an elementwise op of tensors of `dtype` and of `numbers` computes:
    ATen's CUDA kernels and inductor take a number beside a bf16 or f16 tensor in f32 (its
    opmath type), unrounded (the gradient of `erf` multiplies by 2/sqrt(pi), 1.1284, which
    bf16 holds as 1.125), so such an op computes in f32 where a number would round in
    `dtype`, and in `dtype` otherwise."""
    opmath = get_computation_dtype(dtype)
    if opmath != dtype and any(torch.tensor(number, dtype=dtype).item() != number for number in numbers):
        return opmath
    return dtype


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


@dataclass
class Pointwise:
    """Emits pointwise fusion ops whose results are FX tensors of `shape` and `dtype` held
    in one piece layout (`local`, `order`, as a `Value`'s)."""

    importer: Importer
    shape: tuple[int, ...]
    dtype: torch.dtype
    local: tuple[int, ...] | None = None
    order: tuple[int, ...] | None = None

    def __call__(self, op_class: type, *values: Value) -> Value:
        """`op_class` of `values`, each cast to the dtype first (ATen's promotion made explicit)."""
        local = self.shape if self.local is None else self.local
        varying = self.importer.varies(*values)
        ssa = [self.importer.aligned(v, len(local), self.dtype) for v in values]
        op = self.importer.emit(op_class(*ssa, self.importer.tensor_type(local, self.dtype, varying)))
        return Value(op.results[0], self.shape, self.dtype, varying, self.local, self.order)


KERNEL_DECOMPOSITIONS = get_decompositions(
    [
        aten.gelu,
        aten.gelu_backward,
        aten.silu,
        aten.silu_backward,
        aten._fused_rms_norm,
        aten._fused_rms_norm_backward,
    ]
)
"""torch's own decompositions of GELU, SiLU, their backward ops, and of the RMSNorm that
`F.rms_norm` calls on GPUs (`_fused_rms_norm`, its backward) (`torch._decomp`, which inductor
uses too), which the backend hands aot_autograd: the importer then sees the pointwise ATen
ops, the row reductions and the opmath casts they are made of, in torch's order and with
torch's constants, release after release, and each joins the run around it in one generated
kernel (a norm's reductions over the rows included). The table holds these ops alone: a
wider one (inductor's) would decompose what the importer calls as one ATen op (attention)
into ops of other numerics, and change which ops reach the importer for every model."""


@rule(aten.rsub.Scalar, aten.rsub.Tensor)
def _reversed_sub(importer: Importer, node: torch.fx.Node) -> Value | None:
    """`rsub(x, y)`: `y - x` (GELU's and SiLU's backward write `1 - t` so)."""
    if not no_alpha(node):
        return None
    x, y = (importer.arg(a) for a in node.args)
    return elementwise_result(importer, node, fusion.SubOp, [y, x])


@rule(aten.reciprocal.default)
def _reciprocal(importer: Importer, node: torch.fx.Node) -> Value | None:
    """`reciprocal(x)`: `1 / x`, one rounding as ATen's (torch 2.11's decomposition of SiLU's
    backward writes its sigmoid so)."""
    return elementwise_result(importer, node, fusion.DivOp, [importer.arg(1.0), importer.arg(node.args[0])])


@rule(aten._to_copy.default, torch.ops.prims.convert_element_type.default)
def _to_dtype(importer: Importer, node: torch.fx.Node) -> Value | None:
    result = result_of(node)
    value = importer.arg(node.args[0])
    kwargs = set(node.kwargs) - {"dtype", "layout", "device"}
    # A dense result, as every fusion value is (torch 2.11's decomposition of RMSNorm's
    # backward asks for it when it casts to f32).
    if node.kwargs.get("memory_format") == torch.contiguous_format:
        kwargs.discard("memory_format")
    if kwargs or result.device != node.args[0].meta["val"].device:
        return None
    if not dtype_supported(result.dtype) or value.dtype in CARRIERS:
        return None
    return importer.cast(value, result.dtype)


def _reduced(importer: Importer, node: torch.fx.Node, op_class: type, dtype: torch.dtype) -> Value | None:
    """The reduction by `op_class` of the FX node's operand over the node's dims, computed in
    `dtype` (the operand cast to it first); None where the node is not such a reduction."""
    if set(node.kwargs) - {"keepdim"} or len(node.args) < 2:
        return None
    value = importer.arg(node.args[0])
    if not isinstance(value, Value) or not value.shape or value.dtype in CARRIERS:
        return None
    value = importer.cast(importer.flat(value), dtype)
    shape = tuple(result_of(node).shape)
    dims = node.args[1] or list(range(len(value.shape)))
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    offset = 1 if importer.varies(value) else 0
    axes = [(d % len(value.shape)) + offset for d in dims]
    result_type = importer.tensor_type(shape, dtype, importer.varies(value))
    op = importer.emit(op_class(value.ssa, axes, bool(keepdim), result_type))
    return Value(op.results[0], shape, dtype, importer.varies(value))


@rule(aten.sum.dim_IntList, aten.amax.default)
def _reduction(importer: Importer, node: torch.fx.Node) -> Value | None:
    dtype = result_of(node).dtype
    if dtype != node.args[0].meta["val"].dtype:
        return None
    op_class = fusion.SumOp if node.target == aten.sum.dim_IntList else fusion.MaxOp
    reduced = _reduced(importer, node, op_class, dtype)
    if reduced is not None:
        reduced.ssa.name_hint = name_of(node)
    return reduced


@rule(aten.mean.dim)
def _mean(importer: Importer, node: torch.fx.Node) -> Value | None:
    """`mean(x, dims)`: the sum over `dims` divided by their extent, as torch's decomposition
    computes it (and inductor): bf16 and f16 summed and divided in f32 (opmath), rounded once;
    ATen's CPU kernel also sums, then divides. So a norm's mean joins the kernel of the
    pointwise ops around it as a row reduction."""
    result = result_of(node)
    if not result.dtype.is_floating_point or result.dtype != node.args[0].meta["val"].dtype:
        return None
    opmath = get_computation_dtype(result.dtype)
    summed = _reduced(importer, node, fusion.SumOp, opmath)
    if summed is None:
        return None
    count = math.prod(node.args[0].meta["val"].shape) // max(math.prod(result.shape), 1)
    mean = Pointwise(importer, summed.shape, opmath)(fusion.DivOp, summed, importer.scalar(float(count), opmath))
    mean = importer.cast(mean, result.dtype)
    mean.ssa.name_hint = name_of(node)
    return mean


@rule(aten.expand.default)
def _expand(importer: Importer, node: torch.fx.Node) -> Value | None:
    """`expand(x, size)`: `fusion.expand`, after a broadcast of the leading axes it adds, a view
    that moves no data and that a kernel reads through its broadcast axes (the backward of a
    mean or a sum expands its gradient so): it stays in the pointwise run around it."""
    value = importer.arg(node.args[0])
    shape = tuple(result_of(node).shape)
    if set(node.kwargs) - {"implicit"} or not isinstance(value, Value) or value.dtype in CARRIERS:
        return None
    value = importer.flat(value)
    added = len(shape) - len(value.shape)
    if added < 0 or any(e not in (1, s) for e, s in zip(value.shape, shape[added:])):
        return None
    varying = importer.varies(value)
    if added:
        value = importer.with_leading_axes(value, added)
    op = importer.emit(fusion.ExpandOp(value.ssa, importer.tensor_type(shape, value.dtype, varying)))
    op.results[0].name_hint = name_of(node)
    return Value(op.results[0], shape, value.dtype, varying)


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
    ((aten.rsqrt.default,), fusion.RsqrtOp, lambda node: True),
    ((aten.relu.default,), fusion.ReluOp, lambda node: True),
    ((aten.tanh.default,), fusion.TanhOp, lambda node: True),
    ((aten.sigmoid.default,), fusion.SigmoidOp, lambda node: True),
    ((aten.erf.default,), fusion.ErfOp, lambda node: True),
):
    rule(*_targets)(_elementwise_rule(_op, _check))

