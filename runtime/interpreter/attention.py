"""Attention on tensors: the handlers of `hir.attention` and `hir.attention_backward`, and the
meaning of the fusion ops for whole tensors (`fusion_eval`), on ATen's kernels.

The kernel is the one SDPA would pick for the same tensors (`torch._fused_sdp_choice`): on
the CPU `_scaled_dot_product_flash_attention_for_cpu`, on GPUs flash, memory-efficient or
cuDNN attention, each with its backward; where none applies, the math of the formulas
(the *math fallback*, SDPA's own). So a program compiled on CPU ranks is the one that runs
on GPUs, and a graph's attention computes what eager's did. What differs between the
kernels is normalised here: the log-sum-exp is `[*batch, queries]` in f32 (efficient
attention pads its rows to a multiple of 32, cuDNN's has a trailing axis of 1), a boolean
mask becomes the additive one the kernels take, and a row that sees no key has output 0
and log-sum-exp -inf (the CPU kernel says 0), the identity of the merge of a ring.

The kernels take `[batch, heads, rows, width]`; any batch axes (broadcast as torch's, the
device axis of a varying piece among them) are folded into one. Keys in blocks are read
as one sequence. A causal layout (`fusion.Causal`) becomes the boolean mask of the
positions of the queries and keys; for one block of keys (`block`, the ring's step), only
the rows that meet are computed (`meeting_rows`): under head-tail half a block, and for a
contiguous layout nothing for a later device's block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from xdsl.ir import SSAValue

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import Causal, tensor_type
from hostir.runtime.interpreter.core import Environment, Preparation, RunContext, Step, fill_outs, handles, mesh_of

aten = torch.ops.aten

MATH, FLASH, EFFICIENT, CUDNN = 0, 1, 2, 3
"""`torch._fused_sdp_choice`'s answers (`torch.nn.attention.SDPBackend`'s values)."""


@dataclass(frozen=True)
class Mask:
    """What an attention masks: a mask tensor (boolean, true where a query sees a key, or
    additive), SDPA's top-left causal mask, or none; and the scale of its scores."""

    tensor: torch.Tensor | None = None
    top_left: bool = False
    scale: float | None = None


# --------------------------------------------------------------------------- #
# The kernels, on [batch, heads, rows, width]                                  #
# --------------------------------------------------------------------------- #


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive one the kernels take (SDPA converts it alike)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), -math.inf)


def _choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask) -> int:
    return torch._fused_sdp_choice(q, k, v, mask.tensor, 0.0, mask.top_left, scale=mask.scale)


def _math_scores(q: torch.Tensor, k: torch.Tensor, mask: Mask) -> torch.Tensor:
    """The scaled, masked scores in f32 or wider, -inf where a query does not see a key."""
    wide = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5 if mask.scale is None else mask.scale
    scores = (q.to(wide) @ k.to(wide).transpose(-2, -1)) * scale
    if mask.tensor is not None:
        scores = scores + mask.tensor.to(wide)
    if mask.top_left:
        seen = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(seen.logical_not(), -math.inf)
    return scores


def _math_forward(q, k, v, mask: Mask) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _math_scores(q, k, mask)
    lse = scores.logsumexp(dim=-1)
    probabilities = torch.exp(scores - lse.masked_fill(lse.isneginf(), 0.0)[..., None])
    return (probabilities @ v.to(scores.dtype)).to(q.dtype), lse.float()


def _math_backward(dout, q, k, v, out, lse, mask: Mask) -> tuple[torch.Tensor, ...]:
    scores = _math_scores(q, k, mask)
    wide = scores.dtype
    probabilities = torch.exp(scores - lse.to(wide)[..., None])
    dout, v = dout.to(wide), v.to(wide)
    delta = (dout * out.to(wide)).sum(dim=-1, keepdim=True)
    grad_scores = probabilities * (dout @ v.transpose(-2, -1) - delta)
    scale = q.shape[-1] ** -0.5 if mask.scale is None else mask.scale
    return (
        ((grad_scores @ k.to(wide)) * scale).to(q.dtype),
        ((grad_scores.transpose(-2, -1) @ q.to(wide)) * scale).to(k.dtype),
        (probabilities.transpose(-2, -1) @ dout).to(v.dtype),
    )


def _forward_kernel(q, k, v, mask: Mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Out and log-sum-exp `[B, H, Lq]` f32 of 4-axis q, k, v, from the kernel SDPA would pick."""
    choice = _choice(q, k, v, mask)
    if q.device.type == "cpu" and choice == FLASH:
        return aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, mask.top_left, attn_mask=mask.tensor, scale=mask.scale
        )
    if choice == FLASH:
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, mask.top_left, False, scale=mask.scale)[:2]
        return out, lse
    if choice == EFFICIENT:
        out, lse = aten._scaled_dot_product_efficient_attention(
            q, k, v, mask.tensor, True, 0.0, mask.top_left, scale=mask.scale
        )[:2]
        return out, lse[..., : q.shape[-2]]
    if choice == CUDNN:
        out, lse = aten._scaled_dot_product_cudnn_attention(
            q, k, v, mask.tensor, True, 0.0, mask.top_left, False, scale=mask.scale
        )[:2]
        return out, lse.reshape(q.shape[:-1])
    return _math_forward(q, k, v, mask)


def _backward_kernel(dout, q, k, v, out, lse, mask: Mask) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv of 4-axis tensors, from the backward of the kernel `_forward_kernel` picks.
    The random state that dropout would need is zeros: attention here has no dropout."""
    choice = _choice(q, k, v, mask)
    rows, keys = q.shape[-2], k.shape[-2]
    if q.device.type == "cpu" and choice == FLASH:
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, mask.top_left, attn_mask=mask.tensor, scale=mask.scale
        )
    if choice == FLASH:
        state = (torch.zeros(shape, dtype=torch.uint64, device=q.device) for shape in ((2,), ()))
        return aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, None, None, rows, keys, 0.0, mask.top_left, *state, scale=mask.scale
        )
    seed, offset = (torch.zeros((), dtype=torch.int64, device=q.device) for _ in range(2))
    if choice == EFFICIENT:
        padded = torch.nn.functional.pad(lse, (0, -rows % 32))
        return aten._scaled_dot_product_efficient_attention_backward(
            dout, q, k, v, mask.tensor, out, padded, seed, offset, 0.0, [True, True, True, False], mask.top_left,
            scale=mask.scale,
        )[:3]
    if choice == CUDNN:
        return aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse[..., None], seed, offset, mask.tensor, None, None, rows, keys, 0.0,
            mask.top_left, scale=mask.scale,
        )
    return _math_backward(dout, q, k, v, out, lse, mask)


# --------------------------------------------------------------------------- #
# Any batch axes                                                               #
# --------------------------------------------------------------------------- #


def _batch(*tensors: torch.Tensor | None, trailing: int = 2) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*(t.shape[:-trailing] for t in tensors if t is not None)))


def _folded(tensor: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """`tensor [*b, rows, width]` expanded to `batch` and folded to the kernels' `[B, H, rows,
    width]`: the last batch axis is the heads', those before it fold into the kernels' batch.

    The kernels make their results with the heads inside the rows and the batch outside them
    (`[B, rows, H, width]` in memory), so an output transposed to `[B, rows, H * width]` (a
    model's next projection) is a view, not a copy, and they read queries laid out that way
    (a projection's output transposed) as they are. The heads stay an axis of their own: folded
    into the kernels' batch they would come outside the rows, and the batch folded into the
    heads would put the rows of several sequences side by side (`[rows, B, H, width]`), which
    a projection reads back only through a copy.
    """
    return tensor.expand(*batch, *tensor.shape[-2:]).reshape(-1, _heads(batch), *tensor.shape[-2:])


def _heads(batch: tuple[int, ...]) -> int:
    """The kernels' heads of an attention of `batch`: its last axis (`_folded`)."""
    return batch[-1] if batch else 1


def _folded_mask(mask: Mask, batch: tuple[int, ...], dtype: torch.dtype) -> Mask:
    """The mask additive, of 2 axes where it has no batch, else folded as the operands are."""
    tensor = _additive(mask.tensor, dtype)
    if tensor is not None:
        if math.prod(tensor.shape[:-2]) == 1:
            tensor = tensor.reshape(tensor.shape[-2:])
        else:
            tensor = _folded(tensor, batch)
    return Mask(tensor, mask.top_left, mask.scale)


def _unseen_rows(mask: Mask, batch: tuple[int, ...], rows: int) -> torch.Tensor | None:
    """Where a query row sees no key, `[*batch, rows]` (None where every row sees one)."""
    if mask.tensor is None:
        return None
    unseen = mask.tensor.logical_not() if mask.tensor.dtype == torch.bool else mask.tensor.isneginf()
    return unseen.all(dim=-1).expand(*batch, rows)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA of `q [*b, Lq, E]`, `k [*b, Lk, E]`, `v [*b, Lk, Ev]` (batch axes broadcast) and
    its log-sum-exp `[*b, Lq]` f32: -inf, and output 0, for a row that sees no key."""
    batch = _batch(q, k, v, mask.tensor)
    out, lse = _forward_kernel(*(_folded(t, batch) for t in (q, k, v)), _folded_mask(mask, batch, q.dtype))
    out, lse = out.reshape(*batch, *out.shape[-2:]), lse.reshape(*batch, q.shape[-2])
    unseen = _unseen_rows(mask, batch, q.shape[-2])
    return out, lse if unseen is None else lse.masked_fill(unseen, -math.inf)


def attention_backward(dout, q, k, v, out, lse, mask: Mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of `attention` for q, k and v, each of the batch of the attention (the
    caller sums a share over the axes an operand was broadcast along)."""
    batch = _batch(q, k, v, mask.tensor)
    folded = [_folded(t, batch) for t in (dout, q, k, v, out)]
    # The kernels' log-sum-exp of a row that sees no key (whose gradients are 0 either way).
    lse = lse.masked_fill(lse.isneginf(), 0.0).expand(*batch, q.shape[-2]).reshape(-1, _heads(batch), q.shape[-2])
    grads = _backward_kernel(*folded, lse, _folded_mask(mask, batch, q.dtype))
    return tuple(g.reshape(*batch, *g.shape[-2:]) for g in grads)


# --------------------------------------------------------------------------- #
# Blocks and causal layouts                                                    #
# --------------------------------------------------------------------------- #


def keys_as_one_sequence(keys: torch.Tensor, type: fusion.TensorType) -> torch.Tensor:
    """Keys (or values) in blocks `[C, *b, rows, width]` (after a leading device axis) as
    `[*b, C rows, width]`."""
    return keys.movedim(fusion.key_block_axis(type), -3).flatten(-3, -2)


def keys_in_blocks(grad: torch.Tensor, type: fusion.TensorType) -> torch.Tensor:
    """A gradient `[*b, C rows, width]` of keys in blocks, laid out as `type`'s blocks."""
    axis = fusion.key_block_axis(type)
    blocks = type.get_shape()[axis]
    return grad.unflatten(-2, (blocks, grad.shape[-2] // blocks)).movedim(-3, axis)


def positions(position: int, devices: int, rows: int, layout: Causal, device: torch.device) -> torch.Tensor:
    """The positions in the sequence of the rows of the device at `position` (`fusion.sequence_rows`)."""
    runs = fusion.sequence_rows(position, devices, rows, layout)
    return torch.cat([torch.arange(run.start, run.stop, device=device) for run in runs])


def layout_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """The boolean causal mask `[..., queries, keys]` of the positions (true: the key is seen)."""
    return query_positions[..., :, None] >= key_positions


def whole_sequence(devices: int, rows: int, layout: Causal, device: torch.device) -> torch.Tensor:
    """The positions of every device's rows, in mesh order: the keys of the whole sequence."""
    return torch.cat([positions(p, devices, rows, layout, device) for p in range(devices)])


@dataclass(frozen=True)
class Meeting:
    """The rows of one block that a causal layout lets meet: which query rows, which key rows,
    and whether the top-left mask applies between them (else they all see each other)."""

    queries: slice
    keys: slice
    top_left: bool


def meeting_rows(position: int, source: int, layout: Causal, rows: int) -> Meeting | None:
    """What the queries of the device at `position` compute against the keys of the device at
    `source`, each `rows` rows, or None where the causal mask hides every key from every query.

    The own block: its rows are in increasing order of position, so the causal mask of the
    positions is the top-left one. Contiguous: an earlier device's block is wholly seen, a
    later one's not at all. Head-tail: an earlier device's first chunk precedes both local
    chunks and its second follows both; a later device's chunks both lie between the local
    ones: all queries against the first half of the keys, or the second half of the queries
    against all of them."""
    whole, first, second = slice(0, rows), slice(0, rows // 2), slice(rows // 2, rows)
    if source == position:
        return Meeting(whole, whole, True)
    if layout == Causal.CONTIGUOUS:
        return Meeting(whole, whole, False) if source < position else None
    if source < position:
        return Meeting(whole, first, False)
    return Meeting(second, whole, False)


# --------------------------------------------------------------------------- #
# The ops                                                                      #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Properties:
    """An attention op's mask and scale, and how it reads its keys, from its properties."""

    causal: Causal | None
    scale: float | None
    blocks: bool

    @classmethod
    def of(cls, op: fusion.ScaledDotProductOp | hir.AttentionComputeOp) -> Properties:
        return cls(op.causal_mask, None if op.scale is None else op.scale.value.data, op.blocks is not None)

    def mask(self, q: torch.Tensor, mask: torch.Tensor | None, devices: int, holders: Sequence[int], keys: int) -> Mask:
        """The mask of the attention of `q` against the keys of the whole sequence, `keys` rows.

        Under a causal layout, axis 0 of `q` holds the rows of the devices at `holders` of the
        queries' mesh of `devices` (one device's piece: its own position; whole tensors: all)."""
        if self.causal is None or not self.causal.is_layout:
            return Mask(mask, self.causal == Causal.TOP_LEFT, self.scale)
        rows = q.shape[-2]
        query_positions = torch.stack([positions(p, devices, rows, self.causal, q.device) for p in holders])
        query_positions = query_positions.view(len(holders), *(1,) * (q.dim() - 3), rows)
        key_positions = whole_sequence(devices, keys // devices, self.causal, q.device)
        return Mask(layout_mask(query_positions, key_positions), False, self.scale)


AS_GIVEN = Properties(None, None, False)
"""The properties of an operand that is no key: the queries' gradient is read as it is."""


def _sequence(keys: torch.Tensor, type: fusion.TensorType, properties: Properties) -> torch.Tensor:
    return keys_as_one_sequence(keys, type) if properties.blocks else keys


def _like(grad: torch.Tensor, type: fusion.TensorType, shape: Sequence[int], properties: Properties) -> torch.Tensor:
    """A gradient of the attention's batch as its operand holds it: in blocks where the operand
    is, summed over the axes the operand was broadcast along."""
    if properties.blocks:
        grad = keys_in_blocks(grad, type)
    return grad.sum_to_size(tuple(shape))


def evaluate_attention(op: fusion.AttentionOp, q, k, v, *mask) -> list[torch.Tensor]:
    """`fusion.attention` on whole tensors (a varying operand's device axis is its axis 0)."""
    properties = Properties.of(op)
    k, v = (_sequence(t, tensor_type(x), properties) for t, x in ((k, op.key), (v, op.value)))
    devices = tensor_type(op.query).mesh.size
    mask_ = properties.mask(q, mask[0] if mask else None, devices, range(devices), k.shape[-2])
    return list(attention(q, k, v, mask_))


def evaluate_attention_backward(op: fusion.AttentionBackwardOp, dout, q, k, v, out, lse, *mask) -> list[torch.Tensor]:
    """`fusion.attention_backward` on whole tensors."""
    properties = Properties.of(op)
    keys = [_sequence(t, tensor_type(x), properties) for t, x in ((k, op.key), (v, op.value))]
    devices = tensor_type(op.query).mesh.size
    mask_ = properties.mask(q, mask[0] if mask else None, devices, range(devices), keys[0].shape[-2])
    grads = attention_backward(dout, q, *keys, out, lse, mask_)
    return [
        _like(grad, tensor_type(result), tensor_type(result).get_shape(), properties if i else AS_GIVEN)
        for i, (grad, result) in enumerate(zip(grads, op.results))
    ]


Compute = Callable[[list[torch.Tensor], list[torch.Tensor], int, int | None], Sequence[torch.Tensor] | None]
"""`compute(ins, outs, position, block)`: an attention op on this device's buffers, its position in
the queries' mesh, and the block index (None without one); the kernel's results, for the outs
to adopt or get copied in, or None where it wrote the outs itself (a block's rows)."""


def _attention_step(op: hir.AttentionComputeOp, prep: Preparation, queries: SSAValue, compute: Compute) -> Step:
    """The step of an attention op: `compute` on the ranks of the mesh of its first out, whose
    results the outs that `adopted` names become (keeping the kernel's layout), and the
    others get copied in."""
    for out in op.outs:
        prep.check_writable(op, out)
    ins, outs = prep.slots_of(op.ins), prep.slots_of(op.outs)
    adopted = frozenset(hir.adopted_outs(op))
    block = None if op.block is None else prep.slot(op.block)
    mesh = mesh_of(op.outs[0])
    query_mesh = tensor_type(queries).mesh.ids

    def step(env: Environment, context: RunContext) -> None:
        if context.rank not in mesh:
            return
        position = query_mesh.index(context.rank) if context.rank in query_mesh else 0
        targets = [env[s] for s in outs]
        results = compute([env[s] for s in ins], targets, position, None if block is None else env[block])
        if results is not None:
            fill_outs(env, outs, results, adopted)

    return step


def _fill_outside(t: torch.Tensor, selected: slice, value: float, axis: int) -> None:
    """Fills `t` with `value` outside rows `selected` of `axis`, which a kernel writes: each
    element is written once (a fill of the whole tensor first would write the rows twice)."""
    rows = t.shape[axis]
    start, stop, _ = selected.indices(rows)
    for piece in (slice(0, start), slice(max(start, stop), rows)):
        if piece.stop > piece.start:
            t.narrow(axis % t.dim(), piece.start, piece.stop - piece.start).fill_(value)


def block_attention(q, k, v, out, lse, causal: Causal, scale: float | None, position: int, source: int) -> None:
    """The attention of the queries of the device at `position` against the block of keys of
    the device at `source` under a causal layout, into `out` and `lse`: the rows that meet
    (`meeting_rows`), and output 0 and log-sum-exp -inf for a row that meets no key."""
    meeting = meeting_rows(position, source, causal, q.shape[-2])
    rows = slice(0, 0) if meeting is None else meeting.queries
    _fill_outside(out, rows, 0.0, -2)
    _fill_outside(lse, rows, -math.inf, -1)
    if meeting is None:
        return
    keys = meeting.keys
    mask = Mask(None, meeting.top_left, scale)
    result, result_lse = attention(q[..., rows, :], k[..., keys, :], v[..., keys, :], mask)
    out[..., rows, :] = result
    lse[..., rows] = result_lse


def block_attention_backward(
    dout, q, k, v, out, lse, grads: Sequence[torch.Tensor], causal: Causal, scale: float | None, position: int,
    source: int,
) -> None:
    """The gradients of `block_attention` into `grads` (dq, dk, dv): the queries' share of the
    block, and the block's keys' and values' (zeros where no row meets)."""
    meeting = meeting_rows(position, source, causal, q.shape[-2])
    none = slice(0, 0)
    rows, keys = (none, none) if meeting is None else (meeting.queries, meeting.keys)
    for grad, selected in zip(grads, (rows, keys, keys)):
        _fill_outside(grad, selected, 0.0, -2)
    if meeting is None:
        return
    shares = attention_backward(
        dout[..., rows, :], q[..., rows, :], k[..., keys, :], v[..., keys, :], out[..., rows, :], lse[..., rows],
        Mask(None, meeting.top_left, scale),
    )
    for grad, share, selected in zip(grads, shares, (rows, keys, keys)):
        window = grad[..., selected, :]
        window.copy_(share.sum_to_size(window.shape))


@handles(hir.AttentionOp)
def _attention(op: hir.AttentionOp, prep: Preparation) -> Step:
    properties = Properties.of(op)
    key_type, value_type = (tensor_type(x) for x in op.ins[1:3])
    devices = tensor_type(op.ins[0]).mesh.size

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor], position: int, block: int | None) -> None:
        q, k, v = ins[0], _sequence(ins[1], key_type, properties), _sequence(ins[2], value_type, properties)
        if block is not None:
            block_attention(q, k, v, *outs, properties.causal, properties.scale, position, block)
            return None
        mask = properties.mask(q, ins[3] if len(ins) > 3 else None, devices, [position], k.shape[-2])
        return attention(q, k, v, mask)

    return _attention_step(op, prep, op.ins[0], compute)


@handles(hir.AttentionBackwardOp)
def _attention_backward(op: hir.AttentionBackwardOp, prep: Preparation) -> Step:
    properties = Properties.of(op)
    key_type, value_type = (tensor_type(x) for x in op.ins[2:4])
    grad_types = [tensor_type(x) for x in op.outs]
    devices = tensor_type(op.ins[1]).mesh.size

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor], position: int, block: int | None) -> None:
        dout, q, k, v, out, lse = ins[:6]
        k, v = _sequence(k, key_type, properties), _sequence(v, value_type, properties)
        if block is not None:
            causal, scale = properties.causal, properties.scale
            block_attention_backward(dout, q, k, v, out, lse, outs, causal, scale, position, block)
            return None
        mask = properties.mask(q, ins[6] if len(ins) > 6 else None, devices, [position], k.shape[-2])
        grads = attention_backward(dout, q, k, v, out, lse, mask)
        return [
            _like(grad, type, target.shape, properties if i else AS_GIVEN)
            for i, (target, grad, type) in enumerate(zip(outs, grads, grad_types))
        ]

    return _attention_step(op, prep, op.ins[1], compute)
