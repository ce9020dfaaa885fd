"""Rewrites of an FX graph that make it importable, made before the import.

The importer translates ops one for one and reads tensors from placeholders only. Three things
of the graphs torch.compile hands over would not fit that: tensors held as attributes of the
graph (`constants_as_arguments` makes them arguments, which a replay then reads in place),
a masked write of one value, which counts its mask on the host where no CUDA graph
captures it (`masked_writes_as_where` makes it a `where`), and complex arithmetic, for which
the fusion dialect has no type (`complex_as_real_pairs` computes it on real pairs).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_arg

aten = torch.ops.aten


def constants_as_arguments(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """`gm`, each tensor it reads from an attribute of its own (a constant of the traced
    code, such as the fill value of DTensor's vocabulary-parallel embedding) read from
    an argument after the others instead, and those tensors in that order: the importer
    takes a graph's tensors from its arguments, and a replay reads these in place."""
    constants: list[torch.Tensor] = []
    last = next((node for node in reversed(gm.graph.nodes) if node.op == "placeholder"), None)
    for node in list(gm.graph.nodes):
        value = operator.attrgetter(node.target)(gm) if node.op == "get_attr" else None
        if not isinstance(value, torch.Tensor):
            continue
        with gm.graph.inserting_after(last) if last is not None else gm.graph.inserting_before():
            last = gm.graph.placeholder(f"constant_{len(constants)}")
        node.replace_all_uses_with(last)
        gm.graph.erase_node(node)
        constants.append(value)
    if constants:
        gm.recompile()
    return gm, constants


def masked_writes_as_where(gm: torch.fx.GraphModule) -> bool:
    """Rewrites each `x[mask] = v` of `gm` (`index_put` with one boolean index that covers
    x's leading axes, and a value of one element that keeps x's dtype) as
    `where(mask, v, x)`, and says whether there was one. The same values, but no count of
    the mask's true elements on the host, which a CUDA graph cannot capture: DTensor's
    vocabulary-parallel embedding writes so the tokens and rows of other ranks."""
    rewritten = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten.index_put.default:
            continue
        x, indices, value, *rest = node.args
        accumulate = node.kwargs.get("accumulate", rest[0] if rest else False)
        if accumulate or len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
            continue
        x_val, mask_val, value_val = (n.meta.get("val") for n in (x, indices[0], value))
        if not all(isinstance(v, torch.Tensor) for v in (x_val, mask_val, value_val)):
            continue
        if (
            mask_val.dtype != torch.bool
            or tuple(mask_val.shape) != tuple(x_val.shape[: mask_val.dim()])
            or value_val.dim() != 0
            or torch.result_type(value_val, x_val) != x_val.dtype
        ):
            continue
        with gm.graph.inserting_before(node):
            mask = indices[0]
            if mask_val.dim() < x_val.dim():
                shape = [*mask_val.shape, *[1] * (x_val.dim() - mask_val.dim())]
                mask = gm.graph.call_function(torch.ops.aten.view.default, (mask, shape))
            where = gm.graph.call_function(torch.ops.aten.where.self, (mask, value, x))
        node.replace_all_uses_with(where)
        gm.graph.erase_node(node)
        rewritten = True
    if rewritten:
        gm.recompile()
    return rewritten


_ON_THE_SHAPE = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default)
"""Views whose second argument is the result's shape: on pairs, that shape and the pairs' axis."""

_ON_AXES = {
    aten.slice.Tensor: (1,),
    aten.select.int: (1,),
    aten.squeeze.dim: (1,),
    aten.transpose.int: (1, 2),
}
"""Ops on the axes of their operand at these argument positions: on pairs, the same axes
counted from the front (a negative axis would count the pairs' axis)."""

_ELEMENTWISE = (aten.add.Tensor, aten.sub.Tensor, aten.neg.default, aten.clone.default, aten.detach.default, aten.alias.default)
"""Ops of complex operands alone whose real and imaginary parts are the same op of the parts."""

_UNCHANGED = (aten.resolve_conj.default, aten.resolve_neg.default)
"""Ops whose result is their operand's value: no lazy conjugation or negation is left on pairs."""

_CONJUGATES = (aten._conj.default, aten.conj_physical.default, aten._conj_physical.default)


class _NoPairForm(Exception):
    """An op on complex tensors that `complex_as_real_pairs` has no real-pair form of."""


def complex_dtype(value: Any) -> torch.dtype | None:
    """The complex dtype of the tensor that FX node `value` makes; None for any other value."""
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) and val.is_complex() else None


def _is_complex(value: Any) -> bool:
    return complex_dtype(value) is not None


def _rank(node: torch.fx.Node) -> int:
    return node.meta["val"].dim()


def complex_as_real_pairs(gm: torch.fx.GraphModule) -> bool:
    """Rewrites the complex arithmetic of `gm` on real tensors, and says whether there was any.

    Each complex tensor becomes the real tensor that `torch.view_as_real` views it as, its
    last axis the real and imaginary parts (*pairs*): a complex input is read through
    `view_as_real`, a complex output returned through `view_as_complex` (views, no copy), and
    each op in between is the op of the pairs: a view on the same axes, a sum on the pairs,
    a product as the pairs times the real parts plus the pairs turned times the imaginary
    parts, a conjugate with the imaginary parts negated. `view_as_complex` of a real tensor
    is then that tensor, and `view_as_real` of a complex one its pairs: rotary embeddings
    written in complex numbers (Llama's, torchtitan's) become real ops that the importer
    maps, where the fusion dialect has no complex type. A graph with a complex op that has
    no pair form here (or a complex number among an op's arguments) is left as it was, and
    the importer names that op.
    """
    if not any(_is_complex(node) for node in gm.graph.nodes):
        return False
    graph = torch.fx.Graph()
    real: dict[torch.fx.Node, torch.fx.Node] = {}
    """The new graph's node of each real node of `gm`."""
    pairs: dict[torch.fx.Node, torch.fx.Node] = {}
    """The new graph's pairs of each complex node of `gm`."""

    def call(target: Any, *args: Any) -> torch.fx.Node:
        return graph.call_function(target, args)

    def pair(value: Any) -> torch.fx.Node:
        if not _is_complex(value):
            raise _NoPairForm
        if value not in pairs:  # a complex input: its pairs made where it is first read
            pairs[value] = call(aten.view_as_real.default, real[value])
        return pairs[value]

    parts: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}

    def part(value: torch.fx.Node, index: int) -> torch.fx.Node:
        """The real (0) or imaginary (1) parts of complex `value`, the pairs' axis kept."""
        if (value, index) not in parts:
            parts[value, index] = call(aten.slice.Tensor, pair(value), _rank(value), index, index + 1)
        return parts[value, index]

    def product(x: torch.fx.Node, y: torch.fx.Node) -> torch.fx.Node:
        """x * y as x's pairs times y's real parts plus x's pairs turned, (re, im) to (-im, re),
        times y's imaginary parts: (xr yr - xi yi, xi yr + xr yi). The turn is the `cat` of the
        negated second half and the first half of the pairs' axis, which `cat-to-rotate-half`
        makes a `fusion.rotate_half` in the kernel of the products and their sum, where a
        `cat` of the two parts' results would be a copy of its own."""
        # y's parts first: the ops between the turn and the products would cut their kernel.
        yr, yi = part(y, 0), part(y, 1)
        turned = call(aten.cat.default, [call(aten.neg.default, part(x, 1)), part(x, 0)], _rank(x))
        return call(aten.add.Tensor, call(aten.mul.Tensor, pair(x), yr), call(aten.mul.Tensor, turned, yi))

    def scaled(target: Any, x: torch.fx.Node, factor: Any) -> torch.fx.Node:
        """Complex `x` times or over a real `factor` (a tensor or a number), on the pairs."""
        if isinstance(factor, torch.fx.Node):
            if _is_complex(factor):
                raise _NoPairForm
            factor = call(aten.unsqueeze.default, real[factor], _rank(factor))
        return call(target, pair(x), factor)

    def pair_form(node: torch.fx.Node) -> None:
        target, args = node.target, node.args
        if any(isinstance(a, complex) for a in (*args, *node.kwargs.values())):
            raise _NoPairForm  # a complex scale (`alpha`, a factor) would turn the pairs
        if target is aten.view_as_complex.default:
            pairs[node] = real[args[0]]
        elif target is aten.view_as_real.default:
            real[node] = pair(args[0])
        elif not _is_complex(node):
            raise _NoPairForm  # a complex tensor's real part, a comparison: not here
        elif target in _ON_THE_SHAPE:
            pairs[node] = graph.call_function(target, (pair(args[0]), [*args[1], 2], *args[2:]), dict(node.kwargs))
        elif target in _ON_AXES:
            rank = _rank(args[0])
            moved = [a % rank if i in _ON_AXES[target] else a for i, a in enumerate(args[1:], 1)]
            pairs[node] = graph.call_function(target, (pair(args[0]), *moved), dict(node.kwargs))
        elif target is aten.unsqueeze.default:
            pairs[node] = call(target, pair(args[0]), args[1] % (_rank(args[0]) + 1))
        elif target is aten.permute.default:
            rank = _rank(args[0])
            pairs[node] = call(target, pair(args[0]), [a % rank for a in args[1]] + [rank])
        elif target in _UNCHANGED:
            pairs[node] = pair(args[0])
        elif target in _ELEMENTWISE:
            if not all(_is_complex(a) for a in args):
                raise _NoPairForm  # a complex plus a real adds to the real parts alone
            pairs[node] = graph.call_function(target, tuple(map(pair, args)), dict(node.kwargs))
        elif target in _CONJUGATES:
            last = _rank(args[0])
            pairs[node] = call(aten.cat.default, [part(args[0], 0), call(aten.neg.default, part(args[0], 1))], last)
        elif target in (aten.mul.Tensor, aten.mul.Scalar) and all(map(_is_complex, args)):
            pairs[node] = product(*args)
        elif target in (aten.mul.Tensor, aten.mul.Scalar):
            x, factor = args if _is_complex(args[0]) else reversed(args)
            pairs[node] = scaled(aten.mul.Tensor, x, factor)
        elif target in (aten.div.Tensor, aten.div.Scalar) and _is_complex(args[0]):
            pairs[node] = scaled(aten.div.Tensor, args[0], args[1])
        elif target is aten._to_copy.default and _is_complex(args[0]):
            kwargs = dict(node.kwargs)
            kwargs["dtype"] = node.meta["val"].dtype.to_real()
            pairs[node] = graph.call_function(target, (pair(args[0]),), kwargs)
        else:
            raise _NoPairForm

    try:
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                real[node] = graph.node_copy(node)
            elif node.op == "output":
                outputs = map_arg(
                    node.args[0],
                    lambda n: call(aten.view_as_complex.default, pair(n)) if _is_complex(n) else real[n],
                )
                graph.output(outputs)
            elif _is_complex(node) or any(map(_is_complex, node.all_input_nodes)):
                pair_form(node)
            else:
                real[node] = graph.node_copy(node, lambda n: real[n])
    except _NoPairForm:
        return False
    gm.graph = graph
    gm.recompile()
    return True
