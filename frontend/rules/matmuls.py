"""The importer's rules for matmuls: `mm`, `bmm`, `matmul` and `addmm` as `fusion.matmul`, in the
chunks of the pipeline that reads the product.
"""

from __future__ import annotations

import math

import torch.fx

from hostir_dialect import fusion
from hostir_dialect.aten_call import CARRIERS
from hostir.frontend.importer import Importer, Layout, Value, aten, name_of, result_of, rule
from hostir.frontend.rules.collectives import pipeline_chunks, regrouped_reader
from hostir.frontend.rules.pointwise import squeezed


def _matmul_result(
    importer: Importer, node: torch.fx.Node, lhs: Value, rhs: Value, bias: Value | None = None
) -> Value | None:
    """`lhs @ rhs` (`bias + lhs @ rhs` with a bias) as a fusion.matmul, keeping the axes of
    `lhs`'s piece; None where ATen's rules differ.

    A product that a reduce-scatter or an all-reduce reads is computed in the chunks of
    its pipeline (`pipeline_chunks`), its rows cut: so the bias must be the same for
    every row (a row or a scalar, as `nn.Linear`'s is); ATen runs an addmm with another.
    """
    result = result_of(node)
    if lhs.dtype != rhs.dtype or result.dtype != lhs.dtype or len(rhs.shape) < 2 or len(lhs.shape) < 2:
        return None
    if lhs.dtype in CARRIERS or (bias is not None and (bias.dtype != lhs.dtype or math.prod(bias.shape[:-1]) != 1)):
        return None
    if bias is None and (pieces := _row_pieces(importer, lhs, rhs)) is not None:
        return _contracted_rows(importer, node, *pieces)
    rhs = importer.flat(rhs)
    if len(lhs.shape) != 2 or not lhs.keeps_last_axis:
        lhs = importer.flat(lhs)
    varying = importer.varies(lhs, rhs)
    chunks = pipeline_chunks(importer, node, lhs, rhs) if varying and len(lhs.shape) == 2 else ()
    gathered = isinstance(lhs.ssa.owner, fusion.SetOp) and squeezed(lhs.local_shape) != squeezed(lhs.shape)
    regrouping = regrouped_reader(node) if varying and len(lhs.shape) == 2 and not gathered else None
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
    op.results[0].name_hint = name_of(node)
    order = lhs.order if len(lhs.shape) == 2 else None
    return Value(op.results[0], tuple(result.shape), result.dtype, varying, local, order)


def _row_pieces(importer: Importer, lhs: Value, rhs: Value) -> tuple[Value, Value] | None:
    """For `lhs @ rhs` of 2-D FX tensors where `lhs` is the transpose of a tensor of the same
    rows as `rhs` (`t(a) @ b`, a weight's gradient) and either of them is held in a layout of
    its rows of its own (`order`): the pieces of `a` and `b`, their rows alike and their
    columns last, the one held in the FX layout first turned into the other's layout (a
    copy of it alone, where the FX layout would copy both). None where there is no such pair."""
    if len(lhs.shape) != 2 or len(rhs.shape) != 2:
        return None
    if lhs.order is not None and lhs.order[0] == len(lhs.local_shape) - 1:
        a = Value(lhs.ssa, lhs.shape[::-1], lhs.dtype, lhs.varying, lhs.local_shape, (*lhs.order[1:], lhs.order[0]))
    elif lhs.is_flat and isinstance(lhs.ssa.owner, fusion.AtenOp) and lhs.ssa.owner.target.data == "aten.t.default":
        (operand,) = lhs.ssa.owner.operands
        a = Value(operand, lhs.shape[::-1], lhs.dtype, lhs.varying)
    else:
        return None
    b = rhs
    held = [v for v in (a, b) if v.order is not None and v.keeps_last_axis]
    if not held:
        return None
    rows = held[0]
    layout = lambda v: Layout((*rows.local_shape[:-1], v.shape[-1]), rows.order)  # noqa: E731
    pieces = [v if v.layout == layout(v) else importer.in_layout(v, layout(v)) if v.is_flat else None for v in (a, b)]
    return None if None in pieces else (pieces[0], pieces[1])


def _contracted_rows(importer: Importer, node: torch.fx.Node, a: Value, b: Value) -> Value:
    """`t(a) @ b` over rows that `a` and `b` hold alike (`_row_pieces`): the sum over the
    rows is the same in any order, so the pieces are multiplied as they lie, each read as
    a matrix of its rows (a view); the weight gradient of sequence-parallel activations of
    several sequences, which the FX layout would interleave."""
    rows = math.prod(a.local_shape[:-1])
    (_, columns), (_, width) = a.shape, b.shape
    left = importer.aten_view("aten.reshape.default", a.ssa, [rows, columns], (rows, columns), a)
    transposed = importer.aten_view("aten.t.default", left, None, (columns, rows), a)
    right = importer.aten_view("aten.reshape.default", b.ssa, [rows, width], (rows, width), b)
    result = result_of(node)
    varying = importer.varies(a, b)
    op = importer.emit(fusion.MatmulOp(transposed, right, None, importer.tensor_type(result.shape, result.dtype, varying)))
    op.results[0].name_hint = name_of(node)
    return Value(op.results[0], tuple(result.shape), result.dtype, varying)


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
