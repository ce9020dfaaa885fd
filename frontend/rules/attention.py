"""The importer's rules for attention: ATen's scaled-dot-product kernels, and the graphs of
torch's own context parallelism, which hostir refuses.

Every kernel of SDPA's family is one `fusion.attention` (its backward one
`fusion.attention_backward`), whichever of them the graph calls: the CPU's flash kernel,
flash, memory-efficient and cuDNN attention on GPUs, and the math fallback where its
attention weights go unused. The runtime calls the kernel SDPA would pick for the
tensors of the run (runtime/interpreter/attention.py), so a graph traced on one machine
runs on another. The kernels' log-sum-exps differ in layout (efficient attention pads
its rows to a multiple of 32, cuDNN's has a trailing axis of 1): the fusion's is
`[*batch, rows]` in f32, and a graph's tensor of another layout is a view or a padding
of it. The random state a kernel returns for dropout, which these graphs do not use (a
call with dropout stays ATen's), is zeros. Keys and values all-gathered along the
sequence keep the gathered pieces as their blocks (`blocks`), where the ring of
`auto-stream-parallel` finds them.

torch's context parallel (`context_parallel`, or the `_ContextParallel` style) unrolls its
ring in the graph: one attention call per step, on the halves of this rank's queries and
on the blocks that this rank receives, chosen by the rank, which is a constant of the
trace. Every rank is handed another graph, where hostir runs one program on every rank
(the device axis, docs/design.md), so such a graph is refused with a pointer to the plain
DTensor plan, which gives every rank the same graph (docs/frontend.md, "Context
parallelism").
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from hostir_dialect import fusion
from hostir_dialect.fusion import Causal
from hostir.frontend.importer import (
    Importer,
    LayoutValue,
    UnsupportedGraph,
    Value,
    aten,
    c10d,
    concrete,
    name_of,
    result_of,
    rule,
)
from hostir.frontend.rules.reshapes import RESHAPES, split_pieces

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
           aten.split.Tensor, aten.transpose.int, aten.clone.default, operator.getitem, c10d.wait_tensor.default)
"""Ops through which a tensor is still (a piece of) the same data."""

_ROTATIONS = (c10d.all_gather_into_tensor.default, c10d.all_to_all_single.default)
"""The collectives whose results torch's context parallel slices its keys and values out of."""


def _source(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor that `node` is a piece or a view of."""
    while node.op == "call_function" and node.target in _PIECES:
        node = node.args[0]
    return node


def refuse_unrolled_ring(node: torch.fx.Node) -> None:
    """Raises where `node`, an attention kernel or its backward, is one of several attention
    calls on the same queries whose keys come out of an all-gather or an all-to-all: torch's
    context parallel, its ring unrolled (the plain plan calls attention once per queries)."""
    forward = node.target in FORWARD_KERNELS
    query, key = (0, 1) if forward else (1, 2)
    kernels = [
        other
        for other in node.graph.nodes
        if other.op == "call_function"
        and other.target in (FORWARD_KERNELS if forward else BACKWARD_KERNELS)
        and _source(other.args[query]) is _source(node.args[query])
    ]
    if len(kernels) > 1 and any(_source(other.args[key]).target in _ROTATIONS for other in kernels):
        raise UnsupportedGraph(
            f"{node.format_node()}: {len(kernels)} attention calls read the same queries "
            f"({_source(node.args[query]).name}), against keys cut out of a collective's result: "
            "torch's own context parallel, whose ring is unrolled in the graph with this rank's "
            "blocks as constants, so that every rank is handed another graph, where hostir runs "
            f"one program on every rank; {PLAIN_PLAN}"
        )


@dataclass(frozen=True)
class Kernel:
    """Where an ATen attention kernel keeps what the fusion op needs: the name of its mask
    argument (None: it takes none), of the output's gradient (a backward's), and the layout of
    its log-sum-exp: "plain" `[B, H, L]`, "padded" `[B, H, L rounded up to 32]`, "trailing"
    `[B, H, L, 1]`, or None for the math kernel's attention weights."""

    mask: str | None
    lse: str | None
    grad: str | None = None


KERNELS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: Kernel("attn_mask", "plain"),
    aten._scaled_dot_product_flash_attention.default: Kernel(None, "plain"),
    aten._scaled_dot_product_efficient_attention.default: Kernel("attn_bias", "padded"),
    aten._scaled_dot_product_cudnn_attention.default: Kernel("attn_bias", "trailing"),
    aten._scaled_dot_product_attention_math.default: Kernel("attn_mask", None),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: Kernel("attn_mask", "plain", "grad_out"),
    aten._scaled_dot_product_flash_attention_backward.default: Kernel(None, "plain", "grad_out"),
    aten._scaled_dot_product_efficient_attention_backward.default: Kernel("attn_bias", "padded", "grad_out_"),
    aten._scaled_dot_product_cudnn_attention_backward.default: Kernel("attn_bias", "trailing", "grad_out"),
}


def bound_arguments(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by the names of its overload's schema, defaults filled in."""
    schema = node.target._schema
    arguments = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    arguments.update({a.name: value for a, value in zip(schema.arguments, node.args)})
    arguments.update(node.kwargs)
    return arguments


def _unused(node: torch.fx.Node, index: int) -> bool:
    """Whether item `index` of the node's tuple goes unread."""
    return not any(
        user.target is operator.getitem and user.args[1] == index and user.users for user in node.users
    )


_ROWS_AND_COLUMNS = (aten.unsqueeze.default, *RESHAPES)
"""What makes a vector of positions a column (`positions[:, None]`) or a row of a mask."""


def _positions(node: Any) -> torch.fx.Node | None:
    """The graph input that `node` reads as a vector of positions, a column or a row of it."""
    while isinstance(node, torch.fx.Node) and node.target in _ROWS_AND_COLUMNS:
        node = node.args[0]
    if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return None
    value = node.meta.get("val")
    return node if isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_floating_point() else None


def _gathered(node: Any) -> Any:
    """What `node` all-gathers, through views and the wait (None where it is no all-gather)."""
    while isinstance(node, torch.fx.Node) and node.target in (*_ROWS_AND_COLUMNS, c10d.wait_tensor.default):
        node = node.args[0]
    if isinstance(node, torch.fx.Node) and node.target is c10d.all_gather_into_tensor.default:
        return node.args[0]
    return None


HIDDEN_AT_MOST = -65504.0
"""The largest value a float mask may give a key it hides: float16's lowest, which torch's SDPA
writes where cuDNN attention gets the mask on GPUs (the other kernels get -inf). Softmax gives
such a key a weight of 0, as it gives one of -inf, wherever the scores are of sane size."""


def _number(node: Any) -> float | None:
    """The number `node` is, or holds as a tensor of it (`aten.scalar_tensor`); else None."""
    if isinstance(node, torch.fx.Node) and node.target is aten.scalar_tensor.default:
        node = node.args[0]
    return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def hides_keys(value: float | None) -> bool:
    """Whether a float mask's `value` hides a key from attention (`HIDDEN_AT_MOST`)."""
    return value is not None and value <= HIDDEN_AT_MOST


def layout_mask_inputs(importer: Importer, node: torch.fx.Node) -> bool:
    """Whether the attention mask `node`, read under the backend's `sequence_layout`, is the
    causal mask of the layout's positions (`positions[:, None] >= key_positions[None, :]`,
    boolean or as 0 and a value that hides a key, `hides_keys`: -inf, or float16's lowest where
    SDPA makes the mask for cuDNN; the keys' positions all-gathered from the queries' or a graph
    input; or a graph input itself, a mask the forward saved for the backward). Records the
    graph inputs it is made of, whose values every run checks, and, computed in the graph,
    the mask and the gathered key positions (graph outputs, saved for the backward, that the
    program then does not compute: the layout fixes them, and the backend hands the backward
    the tensor it made, which its check need not read back).
    The mask may be broadcast to leading axes (`aten.expand`, as SDPA hands its bias to
    efficient attention on GPUs)."""
    layout, mask = importer.sequence_layout, node
    if node.target is aten.expand.default:
        node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node.meta["val"].shape[-2:] != mask.meta["val"].shape[-2:]:
            return False
    unexpanded = node
    if node.op == "placeholder":
        shape = node.meta["val"].shape
        if len(shape) < 2 or shape[-1] != importer.devices * shape[-2]:
            return False
        value = LayoutValue("mask", shape[-2], layout, tuple(shape[:-2]))
        importer.layout_inputs.append((importer.placeholders.index(node), value))
        return True
    hidden = -math.inf
    if node.target is aten.where.self:
        condition, seen, hidden = node.args[0], _number(node.args[1]), _number(node.args[2])
        if seen != 0.0 or not hides_keys(hidden):
            return False
        node = condition
    if node.target is not aten.ge.Tensor:
        return False
    queries, keys = _positions(node.args[0]), _positions(node.args[1])
    if queries is None or (keys is None and _positions(_gathered(node.args[1])) is not queries):
        return False
    rows = queries.meta["val"].shape[0]
    found = [(queries, "queries")] + ([(keys, "keys")] if keys is not None else [])
    importer.layout_inputs += [
        (importer.placeholders.index(placeholder), LayoutValue(kind, rows, layout)) for placeholder, kind in found
    ]
    for computed in {mask, unexpanded}:  # either may be the one the forward saves
        importer.layout_values[computed] = LayoutValue("mask", rows, layout, tuple(computed.meta["val"].shape[:-2]), hidden)
    if keys is None:
        for gathered in _position_vectors(node.args[1]):
            importer.layout_values[gathered] = LayoutValue("keys", rows, layout)
    return True


def _position_vectors(node: Any) -> list[torch.fx.Node]:
    """The nodes from a row of gathered positions down to their all-gather (through views and
    the wait) that hold them as a vector: the wait's result, which the forward saves."""
    vectors = []
    while isinstance(node, torch.fx.Node) and node.target in (*_ROWS_AND_COLUMNS, c10d.wait_tensor.default):
        if node.meta["val"].dim() == 1:
            vectors.append(node)
        node = node.args[0]
    return vectors


def _supported(node: torch.fx.Node, arguments: dict[str, Any]) -> bool:
    """Attention the fusion op computes: no dropout (the random state is never read), no debug
    mask, as many heads of keys as of queries (grouped-query attention, SDPA's `enable_gqa`,
    which the CPU's flash kernel takes from the shapes alone, stays ATen's); the math kernel's
    weights and the efficient backward's bias gradient unread."""
    if arguments.get("dropout_p", 0.0) != 0.0 or arguments.get("return_debug_mask", False):
        return False
    if arguments.get("dropout_mask") is not None or arguments.get("enable_gqa", False):
        return False
    query, key = (arguments.get(name) for name in ("query", "key"))
    if result_of(query).shape[:-2] != result_of(key).shape[:-2]:
        return False
    if node.target is aten._scaled_dot_product_attention_math.default:
        return _unused(node, 1)
    if node.target is aten._scaled_dot_product_efficient_attention_backward.default:
        return _unused(node, 3)
    return True


def _blocked(value: Value) -> bool:
    """Whether the FX tensor of `value` `[*batch, C rows, width]` is its piece `[C, *batch, rows,
    width]` read as blocks of keys: the pieces of an all-gather, the chunk axis moved before the
    rows (its `order`, or no move where the batch axes have extent 1)."""
    local, shape = value.local_shape, value.shape
    batch = len(shape) - 2
    if len(local) != len(shape) + 1 or local[1:-2] != shape[:-2] or local[-1] != shape[-1]:
        return False
    if local[0] * local[-2] != shape[-2]:
        return False
    moved = (*range(1, batch + 1), 0, batch + 1, batch + 2)
    order = value.order or tuple(range(len(local)))
    return [a for a in order if local[a] != 1] == [a for a in moved if local[a] != 1]


def _keys(importer: Importer, key: Value, value: Value, scattered: bool, may_block: bool) -> tuple[Value, Value, bool]:
    """The keys and values as the fusion op reads them: where it `may_block` (no mask tensor
    covers them as one sequence), in blocks where both are the gathered pieces of an all-gather,
    or where their gradients go to the blocks' owners (`scattered`: a backward's, whose keys are
    then read as blocks, a view); else in the FX layout."""
    if not may_block:
        return importer.flat(key), importer.flat(value), False
    if _blocked(key) and _blocked(value) and key.local_shape[0] == value.local_shape[0]:
        return key, value, True
    if scattered:
        rows = key.shape[-2] // importer.devices
        return (*(importer.regrouped(importer.flat(x), x.shape, rows, len(x.shape) - 2) for x in (key, value)), True)
    return importer.flat(key), importer.flat(value), False


def scattered_in_blocks(node: torch.fx.Node, index: int, devices: int) -> bool:
    """Whether gradient `index` of a backward kernel `node` (`[batch, heads, rows, width]`) goes,
    through views and clones, into `cat(split(., rows / devices, 2), 0)` that a reduce-scatter
    reads: each device's block of keys to that device, as a plain plan's backward sends them."""
    readers = [user for user in node.users if user.target is operator.getitem and user.args[1] == index]
    if len(readers) != 1 or devices < 2:
        return False
    current = readers[0]
    while len(current.users) == 1 and next(iter(current.users)).target in (*RESHAPES, aten.clone.default):
        current = next(iter(current.users))
    splits = list(current.users)
    if len(splits) != 1 or splits[0].target is not aten.split.Tensor:
        return False
    cats = {user for piece in splits[0].users for user in piece.users}
    if len(cats) != 1:
        return False
    (cat,) = cats
    pieces = split_pieces(cat)
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if pieces is None or pieces[0] is not current or pieces[2] != 2 or dim != 0:
        return False
    if pieces[1] * devices != current.meta["val"].shape[2]:
        return False
    return [user.target for user in cat.users] == [c10d.reduce_scatter_tensor.default]


@dataclass(frozen=True)
class Operands:
    """An attention's operands as the fusion op takes them, and its properties."""

    values: list[Value]
    mask: Value | None
    causal: Causal | None
    blocks: bool
    scale: float | None

    def aligned(self, importer: Importer) -> tuple[list[fusion.SSAValue], fusion.SSAValue | None]:
        """The operands' SSA values, and the mask's with extent-1 axes after a varying one's
        device axis, so that it meets the queries' batch of two axes (batch, heads)."""
        return [v.ssa for v in self.values], None if self.mask is None else importer.aligned(self.mask, 4)

    def varying(self, importer: Importer) -> bool:
        return importer.varies(*self.values, *([] if self.mask is None else [self.mask]))


def _operands(
    importer: Importer, arguments: dict[str, Any], kernel: Kernel, names: list[str], scattered: bool = False
) -> Operands | None:
    """The operands named `names` in the FX layout (the keys and values in blocks where they are
    gathered pieces or, `scattered`, where a backward's gradients go to the blocks' owners; a
    backward's log-sum-exp as the fusion's), the mask and the properties; None where the fusion
    op does not compute the call (a dtype it does not take)."""
    values = [importer.arg(arguments[name]) for name in names]
    if not all(isinstance(v, Value) for v in values):
        return None
    if any(len(v.shape) != 4 for v, name in zip(values, names) if name != "logsumexp"):
        return None
    query, key_index = names.index("query"), names.index("key")
    dtype = values[query].dtype
    node = arguments[kernel.mask] if kernel.mask is not None else None
    is_causal = bool(arguments.get("is_causal", False))
    causal, mask = (Causal.TOP_LEFT if is_causal else None), None
    if node is not None and importer.sequence_layout is not None and layout_mask_inputs(importer, node):
        causal = importer.sequence_layout  # the inputs that make it so are checked at every run
    elif node is not None:
        mask = importer.arg(node)
        if is_causal or not isinstance(mask, Value) or mask.dtype not in (torch.bool, dtype):
            return None
        mask = importer.flat(mask)
    key, value, blocks = _keys(importer, values[key_index], values[key_index + 1], scattered, mask is None)
    operands = [importer.flat(v) if name not in ("key", "value", "logsumexp") else v for v, name in zip(values, names)]
    operands[key_index : key_index + 2] = [key, value]
    if "logsumexp" in names:
        operands[-1] = _lse_operand(importer, values[-1], kernel, values[query].shape[-2])
    if not dtype.is_floating_point or any(v.dtype != dtype for v in (key, value)):
        return None
    return Operands(operands, mask, causal, blocks, arguments.get("scale"))


def _lse_value(
    importer: Importer, lse: fusion.SSAValue, local: tuple[int, ...], kernel: Kernel, fake: torch.Tensor, varying: bool
) -> Value:
    """The fusion's log-sum-exp `[*batch, rows]` as the FX tensor of the kernel's layout."""
    if kernel.lse == "padded":
        padding = [lse, [0, fake.shape[-1] - local[-1]], 0.0]
        padded = importer.call_aten(
            "aten.constant_pad_nd.default", padding, {}, [lse], tuple(fake.shape), torch.float32, varying
        )
        return Value(padded, tuple(fake.shape), torch.float32, varying)
    return Value(lse, tuple(fake.shape), torch.float32, varying, local)


def _lse_operand(importer: Importer, value: Value, kernel: Kernel, rows: int) -> Value:
    """A kernel's log-sum-exp read as the fusion's `[*batch, rows]`."""
    local = (*value.shape[:2], rows)
    if kernel.lse == "padded":
        flat = importer.flat(value)
        narrowed = importer.call_aten(
            "aten.slice.Tensor", [flat.ssa, -1, 0, rows], {}, [flat.ssa], local, torch.float32, value.varying
        )
        return Value(narrowed, local, torch.float32, value.varying)
    return importer.flat(value.reshaped(local)) if kernel.lse == "trailing" else importer.flat(value)


def _zeros(importer: Importer, fake: torch.Tensor) -> Value:
    """A kernel's random state, which nothing reads without dropout: zeros of its shape and dtype."""
    kwargs = {"dtype": fake.dtype, "device": fake.device}
    ssa = importer.call_aten("aten.zeros.default", [list(fake.shape)], kwargs, [], tuple(fake.shape), fake.dtype, False)
    return Value(ssa, tuple(fake.shape), fake.dtype, False)


def _results(importer: Importer, node: torch.fx.Node, modelled: list[Value | None]) -> list[Any]:
    """The node's tuple: the modelled results, then zeros for the random state and the ints
    (sequence lengths) as their values in this graph."""
    fakes = result_of(node)
    results: list[Any] = list(modelled)
    for fake in list(fakes)[len(modelled):]:
        results.append(_zeros(importer, fake) if isinstance(fake, torch.Tensor) else concrete(fake))
    return results


@rule(*(target for target, kernel in KERNELS.items() if kernel.grad is None))
def _attention(importer: Importer, node: torch.fx.Node) -> list[Any] | None:
    refuse_unrolled_ring(node)
    kernel, arguments = KERNELS[node.target], bound_arguments(node)
    if not _supported(node, arguments):
        return None
    operands = _operands(importer, arguments, kernel, ["query", "key", "value"])
    if operands is None:
        return None
    out_fake = result_of(node)[0]
    varying = operands.varying(importer)
    lse_local = tuple(out_fake.shape[:-1])
    result_types = [
        importer.tensor_type(tuple(out_fake.shape), out_fake.dtype, varying),
        importer.tensor_type(lse_local, torch.float32, varying),
    ]
    (q, k, v), mask = operands.aligned(importer)
    op = importer.emit(
        fusion.AttentionOp(q, k, v, result_types, mask, operands.causal, operands.blocks, operands.scale)
    )
    op.out.name_hint, op.lse.name_hint = name_of(node), f"{name_of(node)}_lse"
    out = Value(op.out, tuple(out_fake.shape), out_fake.dtype, varying)
    if kernel.lse is None:  # the math kernel's attention weights, which nothing reads
        return [out, None]
    return _results(importer, node, [out, _lse_value(importer, op.lse, lse_local, kernel, result_of(node)[1], varying)])


@rule(*(target for target, kernel in KERNELS.items() if kernel.grad is not None))
def _attention_backward(importer: Importer, node: torch.fx.Node) -> list[Any] | None:
    refuse_unrolled_ring(node)
    kernel, arguments = KERNELS[node.target], bound_arguments(node)
    if not _supported(node, arguments):
        return None
    scattered = all(scattered_in_blocks(node, index, importer.devices) for index in (1, 2))
    names = [kernel.grad, "query", "key", "value", "out", "logsumexp"]
    operands = _operands(importer, arguments, kernel, names, scattered)
    if operands is None:
        return None
    ssa, mask = operands.aligned(importer)
    varying = operands.varying(importer)
    dtype = operands.values[1].dtype
    # Each gradient is its operand's piece, varying where the output's gradient is.
    grad_types = [importer.tensor_type(fusion.tensor_type(x).piece_shape, dtype, varying) for x in ssa[1:4]]
    op = importer.emit(
        fusion.AttentionBackwardOp(ssa, grad_types, mask, operands.causal, operands.blocks, operands.scale)
    )
    grads = []
    for result, fake, type, operand in zip(op.results, result_of(node)[:3], grad_types, operands.values[1:4]):
        result.name_hint = name_of(node)
        # A gradient in blocks is read as its keys are.
        grads.append(Value(result, tuple(fake.shape), fake.dtype, varying, type.piece_shape, operand.order))
    if node.target is aten._scaled_dot_product_efficient_attention_backward.default:
        return [*grads, None]  # the bias's gradient, which nothing reads
    return _results(importer, node, grads)


@rule(c10d.all_to_all_single.default)
def _all_to_all(importer: Importer, node: torch.fx.Node) -> None:
    raise UnsupportedGraph(
        f"{node.format_node()}: hostir has no all-to-all; torch's context parallel rotates the keys "
        f"and values with it (its alltoall rotation), one graph per rank; {PLAIN_PLAN}"
    )
