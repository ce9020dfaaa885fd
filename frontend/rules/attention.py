"""The importer's rules for attention: ATen's scaled-dot-product kernels, and the graphs of
torch's own context parallelism, which hostir refuses.

torch's context parallel (`context_parallel`, or the `_ContextParallel` style) unrolls its
ring in the graph: one attention call per step, on the halves of this rank's queries and
on the blocks that this rank receives, chosen by the rank, which is a constant of the
trace. Every rank is handed another graph, where hostir runs one program on every rank
(the device axis, docs/design.md), so such a graph is refused with a pointer to the plain
DTensor plan, which gives every rank the same graph (docs/frontend.md, "Context
parallelism").
"""

from __future__ import annotations

import operator

import torch.fx

from hostir.frontend.importer import Importer, UnsupportedGraph, aten, c10d, rule

FORWARD_KERNELS = (
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_attention_math.default,
)
"""ATen's attention kernels, whose query is their first argument."""

BACKWARD_KERNELS = (
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
)
"""Their backwards, whose query is their second argument (after the output's gradient)."""

PLAIN_PLAN = (
    "write context parallelism as the plain DTensor plan instead: every rank's queries against "
    "the keys and values all-gathered along the sequence (DTensor's redistribute to Replicate, "
    "then to_local(grad_placements=[Partial()])), masked causally by the tokens' positions, "
    "all-gathered alike (docs/frontend.md, 'Context parallelism')"
)

_PIECES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.slice.Tensor,
           aten.split.Tensor, aten.transpose.int, aten.clone.default, operator.getitem)
"""Ops through which a tensor is still (a piece of) the same queries."""


def _query_source(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor that `node` is a piece or a view of."""
    while node.op == "call_function" and node.target in _PIECES:
        node = node.args[0]
    return node


def refuse_unrolled_ring(node: torch.fx.Node) -> None:
    """Raises where `node`, an attention kernel or its backward, reads a piece of queries that
    another attention call of its graph reads too: torch's context parallel, its ring unrolled."""
    query_index = 0 if node.target in FORWARD_KERNELS else 1
    source = _query_source(node.args[query_index])
    kernels = [
        other
        for other in node.graph.nodes
        if other.op == "call_function"
        and other.target in (*FORWARD_KERNELS, *BACKWARD_KERNELS)
        and (other.target in FORWARD_KERNELS) == (query_index == 0)
        and _query_source(other.args[query_index]) is source
    ]
    if len(kernels) > 1:
        raise UnsupportedGraph(
            f"{node.format_node()}: {len(kernels)} attention calls read pieces of the same queries "
            f"({source.name}): torch's own context parallel, whose ring is unrolled in the graph with "
            "this rank's blocks as constants, so that every rank is handed another graph, where hostir "
            f"runs one program on every rank; {PLAIN_PLAN}"
        )


@rule(*FORWARD_KERNELS, *BACKWARD_KERNELS)
def _attention(importer: Importer, node: torch.fx.Node) -> None:
    refuse_unrolled_ring(node)


@rule(c10d.all_to_all_single.default)
def _all_to_all(importer: Importer, node: torch.fx.Node) -> None:
    raise UnsupportedGraph(
        f"{node.format_node()}: hostir has no all-to-all; torch's context parallel rotates the keys "
        f"and values with it (its alltoall rotation), one graph per rank; {PLAIN_PLAN}"
    )
