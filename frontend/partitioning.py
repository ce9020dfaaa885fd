"""How aot_autograd splits a joint graph for hostir: with torch's min-cut partitioner, as for
inductor, and the attention masks recomputed in the backward rather than saved.

The min-cut partitioner recomputes in the backward the cheap pointwise values that the
forward would otherwise write out for it (SwiGLU's `silu(gate)`), so the forward's kernels
write less and less memory is held between the two. An attention's mask (the `attn_mask`
or `attn_bias` of SDPA and of the kernels it dispatches to) is the value it saves anyway:
the attention's backward reads it, so by its measure recomputing it saves nothing. But
the mask is a tensor of queries x keys made from a few small ones (the positions of a
context-parallel layer's tokens: 4 GiB per rank at 65536 tokens on 2 ranks, in bf16),
and hostir's attention ring never reads it (`sequence_layout` says what it holds): saved,
the forward returns it and the backward's replay copies it in at every step; recomputed,
it is dead code in both programs. Where an attention does read it, the backward computes
it again from its small inputs, one pointwise pass, instead of holding it from the
forward to the backward.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import fx
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.utils.checkpoint import CheckpointPolicy

MASK_ARGUMENTS = frozenset({"attn_mask", "attn_bias"})
"""The names of an attention's mask in the schemas of SDPA and its kernels."""

MASK_MAKING_OPS = frozenset(
    {
        torch.ops.aten.scalar_tensor.default,
        torch.ops.aten.full.default,
        torch.ops.aten._to_copy.default,
    }
)
"""The ops besides pointwise ops and views that make a mask from its small inputs (SDPA's
decomposition turns a boolean mask into a float one with `where` of two scalar tensors)."""


def partition(joint: fx.GraphModule, joint_inputs: Any, **options: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
    """aot_autograd's `partition_fn`: the forward and backward graphs of `joint`."""
    recompute_attention_masks(joint.graph)
    return min_cut_rematerialization_partition(joint, joint_inputs, **options)


def recompute_attention_masks(graph: fx.Graph) -> None:
    """Marks every op that computes an attention's mask from the graph's inputs or from a
    collective's result (pointwise ops, views, scalar tensors: `_cheap`) to be recomputed
    in the backward (`CheckpointPolicy.MUST_RECOMPUTE`, which the min-cut partitioner
    honours as it does activation checkpointing's), but those that activation
    checkpointing gave a policy; the inputs of those it stops at are saved instead."""
    pending = [mask for node in graph.nodes for mask in _masks(node)]
    while pending:
        node = pending.pop()
        # A node with a policy already (activation checkpointing's, or one marked here) keeps it.
        if not _cheap(node) or "recompute" in node.meta:
            continue
        node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        pending.extend(node.all_input_nodes)


def _masks(node: fx.Node) -> Iterator[fx.Node]:
    """The masks that `node`, a call of SDPA or of one of its kernels (forward or backward), takes."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return
    for index, argument in enumerate(node.target._schema.arguments):
        if argument.name in MASK_ARGUMENTS:
            value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
            if isinstance(value, fx.Node):
                yield value


def _cheap(node: fx.Node) -> bool:
    """An ATen op that recomputing costs one pass over its result at most: a deterministic
    pointwise op, a view, or one that makes a tensor of a scalar."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return torch.Tag.pointwise in target.tags or target.is_view or target in MASK_MAKING_OPS
