"""The importer's rules for reshapes, whole slices, clones and the concatenation of a split: FX
views of the same piece, which write no op.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx

from hostir.frontend.importer import PAIR_VIEWS, Importer, Value, aten, concrete, cut, result_of, rule


RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
"""Ops whose result is their operand's elements in row-major order, in another shape."""


@rule(*RESHAPES)
def _reshape(importer: Importer, node: torch.fx.Node) -> Value:
    """The same piece read in another shape: no op. (`view` could not always be applied to
    hostir's buffers, laid out anew where eager's tensors keep their strides.)"""
    return importer.arg(node.args[0]).reshaped(tuple(result_of(node).shape))


@rule(*PAIR_VIEWS)
def _pair_view(importer: Importer, node: torch.fx.Node) -> Value:
    """A complex tensor read as its real pairs (`view_as_real`), or real pairs read as a complex
    tensor (`view_as_complex`): the same piece, which holds the pairs either way, no op."""
    source = importer.flat(importer.arg(node.args[0]))
    result = result_of(node)
    return Value(source.ssa, tuple(result.shape), result.dtype, source.varying)


@rule(aten.t.default)
def _transpose(importer: Importer, node: torch.fx.Node) -> Value | None:
    """The transpose of a 2-D FX tensor held in a layout of its own whose last axis is the
    piece's last: the same piece, that axis first in the order, no op (the weight
    gradient's `t` of gathered activations, which `mm` then contracts over their rows in
    the pieces' order). Any other is ATen's `t`, a view."""
    value = importer.arg(node.args[0])
    if not isinstance(value, Value) or value.order is None or len(value.shape) != 2 or not value.keeps_last_axis:
        return None
    order = (value.order[-1], *value.order[:-1])
    return Value(value.ssa, tuple(result_of(node).shape), value.dtype, value.varying, value.local_shape, order)


@rule(aten.slice.Tensor)
def _whole_slice(importer: Importer, node: torch.fx.Node) -> Value | None:
    """A slice of a whole axis (of the same shape as its operand: from the start to the end,
    step 1): the same tensor, no op. A graph traced with symbolic sizes writes one after the
    reshape of a gathered tensor, which would otherwise become an ATen op and cut the
    all-gather from its GEMMs. Any other slice is ATen's."""
    source = importer.arg(node.args[0])
    if not isinstance(source, Value) or tuple(result_of(node).shape) != source.shape:
        return None
    return source


@rule(aten.detach.default)
def _detach(importer: Importer, node: torch.fx.Node) -> Value | None:
    """A detach, which aot_autograd writes where the forward saves what autograd must not
    trace (RMSNorm's scale): the same tensor, no op, as ATen's detach is a view of it; as an
    op it would cut the pointwise run that reads it."""
    source = importer.arg(node.args[0])
    return source if isinstance(source, Value) else None


@rule(aten.clone.default)
def _clone(importer: Importer, node: torch.fx.Node) -> Value | None:
    """A clone, which eager makes to lay a tensor out anew (contiguous before a view): the same
    piece, since hostir lays its buffers out anew anyway, so that the pieces of a gathered or
    regrouped tensor keep their axes through it. A clone the graph returns is ATen's: an output
    must not share its memory with what it cloned."""
    if set(node.kwargs) - {"memory_format"} or any(user.op == "output" for user in node.users):
        return None
    source = importer.arg(node.args[0])
    return source if isinstance(source, Value) else None


def split_pieces(node: torch.fx.Node) -> tuple[torch.fx.Node, int, int] | None:
    """`(x, size, dim)` where `node` is `cat` of every piece of `split(x, size, dim)`, in order."""
    pieces = node.args[0]
    if not pieces or not all(isinstance(p, torch.fx.Node) and p.target is operator.getitem for p in pieces):
        return None
    split = pieces[0].args[0]
    if split.target is not aten.split.Tensor or [p.args for p in pieces] != [(split, i) for i in range(len(pieces))]:
        return None
    source, size = split.args[0], split.args[1]
    if isinstance(size, torch.fx.Node):  # shape arithmetic of a dynamic graph
        size = concrete(size.meta.get("val"))
    if not isinstance(size, int) or size <= 0:
        return None
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    shape = source.meta["val"].shape
    dim %= len(shape)
    if len(pieces) != len(split.meta["val"]) or shape[dim] % size:
        return None
    return source, size, dim


def concatenated_split(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor that `cat(split(x, size, dim), 0)` of `node` only reshapes, if it is one:
    every piece of the split in order, and no axis before `dim` longer than 1."""
    split = split_pieces(node)
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
    source = concatenated_split(node)
    if source is not None:
        return importer.arg(source).reshaped(tuple(result_of(node).shape))
    split = split_pieces(node)
    value = importer.arg(split[0]) if split is not None else None
    if not isinstance(value, Value):
        return None
    _, size, split_dim = split
    cat_dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(value.shape)
    # The FX tensor with the split axis cut into (pieces, size): a permutation of that
    # moves the pieces' axis before the concatenated one.
    fine = cut(value.shape, split_dim, size)
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
        tuple(result_of(node).shape),
        value.dtype,
        value.varying,
        local,
        None if moved == sorted(moved) else order,
    )
