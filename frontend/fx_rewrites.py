"""Rewrites of an FX graph that make it importable, made before the import.

The importer translates ops one for one and reads tensors from placeholders only. Two things
of the graphs torch.compile hands over would not fit that: tensors held as attributes of the
graph (`constants_as_arguments` makes them arguments, which a replay then reads in place),
and a masked write of one value, which counts its mask on the host where no CUDA graph
captures it (`masked_writes_as_where` makes it a `where`: the one rewrite that changes ops).
"""

from __future__ import annotations

import operator

import torch
import torch.fx


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
