"""A Llama-style decoder layer with a context-parallel axis, as a plain DTensor plan, compiled with hostir.

    torchrun --nproc-per-node 2 examples/cp_decoder_layer.py      # or: python examples/cp_decoder_layer.py

RMSNorm, attention (rotary embeddings, causal), RMSNorm and a SwiGLU MLP, with the
sequence sharded over the ranks of the context-parallel (CP) axis in torch's head-tail
order (`_HeadTailLoadBalancer`): cut into `2 D` chunks, rank `r` holds chunks `r` and
`2 D - 1 - r`, so that every rank has the same share of a causal attention's work. Every
rank keeps its queries; the keys, the values and the positions of the tokens are
all-gathered along the sequence (DTensor's `redistribute` to `Replicate`), and the mask is
causal on the positions, since a rank's queries are not the first rows of the sequence.
The weights are whole on every rank: each rank's gradient is its tokens' share, summed
over the CP axis before the optimizer steps, as data parallelism sums them.

Run as a script, it trains the layer for a few steps on 2 local CPU ranks (or on
torchrun's ranks) with AdamW, compiled with hostir with the sequence's layout given
(`RING`: each rank's attention is a ring), and prints each loss next to that of the same
layer run eagerly on the whole sequence; on GPUs, with NCCL.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

sys.path.append(str(Path(__file__).resolve().parents[1]))  # examples/ is no installed package; hostir as installed comes first
from examples import tp_decoder_layer  # noqa: E402
from examples.tp_decoder_layer import rank_device, run_training  # noqa: E402


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding, real-valued; x: [batch, sequence, heads, head_dim], cos and sin: [sequence, head_dim]."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def rotary_tables(sequence: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin tables of the rotary embedding for the positions 0 .. sequence - 1."""
    frequencies = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(sequence).float(), frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def gathered_keys_attention(q, k, v, positions, mesh: DeviceMesh) -> torch.Tensor:
    """Sequence-sharded attention, the plain DTensor plan: this rank's queries against the keys
    and values all-gathered along the sequence, masked causally by the tokens' positions.

    q, k, v: this rank's `[batch, heads, rows, head_dim]`; positions: its rows' positions.
    The gathered keys' gradient differs on every rank (each rank's queries read them), so it
    is `Partial`, and DTensor's backward reduce-scatters it; `full_tensor()` would declare it
    replicated, and the backward would keep one rank's share.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    k, v, key_positions = (
        DTensor.from_local(t, mesh, [Shard(dim)], run_check=False)
        .redistribute(mesh, [Replicate()])
        .to_local(grad_placements=[Partial()])
        for t, dim in ((k, 2), (v, 2), (positions, 0))
    )
    mask = positions[:, None] >= key_positions[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Attention(tp_decoder_layer.Attention):
    """The TP example's attention with rotary embeddings; `mesh`, once `context_parallel` sets
    it, is the CP axis its sequence is sharded over (None: the whole sequence, SDPA's causal mask)."""

    def __init__(self, dim: int, heads: int):
        super().__init__(dim, heads)
        self.mesh: DeviceMesh | None = None

    def forward(self, x, cos, sin, positions):
        batch, sequence, _ = x.shape
        q, k, v = (w(x).view(batch, sequence, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.mesh is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = gathered_keys_attention(q, k, v, positions, self.mesh)
        return self.wo(out.transpose(1, 2).reshape(batch, sequence, -1))


class DecoderLayer(tp_decoder_layer.DecoderLayer):
    """The TP example's layer, with this attention: its forward takes the rows' rotary tables and positions."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128):
        super().__init__(dim, heads, hidden)
        self.attention = Attention(dim, heads)

    def forward(self, x, cos, sin, positions):
        """x: `[batch, rows, dim]`; cos, sin: the rotary tables of the rows; positions: theirs in the sequence."""
        h = x + self.attention(self.attention_norm(x), cos, sin, positions)
        return h + self.feed_forward(self.ffn_norm(h))


def context_parallel(layer: DecoderLayer, mesh: DeviceMesh) -> DecoderLayer:
    """The layer with its sequence sharded over `mesh`, the CP axis (`gathered_keys_attention`)."""
    layer.attention.mesh = mesh
    return layer


def head_tail_indices(sequence: int, world: int) -> torch.Tensor:
    """The positions of the sequence in head-tail order: rank `r`'s rows are chunks `r` and
    `2 world - 1 - r` of `2 world`, and rank `r` holds slice `r` of `world` of this order."""
    chunks = torch.arange(sequence).view(2 * world, sequence // (2 * world))
    return torch.cat([torch.cat((chunks[r], chunks[2 * world - 1 - r])) for r in range(world)])


def shard_sequence(tensor: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s rows of the whole `tensor` along its sequence axis `dim`, in head-tail order."""
    indices = head_tail_indices(tensor.shape[dim], world).to(tensor.device)
    return tensor.index_select(dim, indices).chunk(world, dim=dim)[rank].contiguous()


def layer_inputs(x: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, ...]:
    """The layer's inputs for the whole sequence `x` `[batch, sequence, dim]`: x, the rotary
    tables of its positions, and the positions."""
    sequence = x.shape[1]
    cos, sin = rotary_tables(sequence, head_dim)
    return x, cos.to(x.device), sin.to(x.device), torch.arange(sequence, device=x.device)


def rank_inputs(x: torch.Tensor, head_dim: int, rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """This rank's rows of the layer's inputs for the whole sequence `x`, in head-tail order."""
    whole, *tables = layer_inputs(x, head_dim)
    return shard_sequence(whole, 1, rank, world), *(shard_sequence(t, 0, rank, world) for t in tables)


def train(steps: int = 5, batch: int = 2, sequence: int = 32, options: dict | None = None) -> list[tuple[float, float]]:
    """Trains the layer with AdamW on this rank's rows, compiled with hostir (`options`), and the
    same layer eagerly on the whole sequence; returns both losses per step.

    The loss is the mean square of the output over the whole sequence: each rank adds its rows'
    squares, divided by the whole count, so that the ranks' gradients sum to the whole one."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)
    whole_layer = DecoderLayer().to(device)
    layer = context_parallel(DecoderLayer().to(device), mesh)
    layer.load_state_dict(whole_layer.state_dict())
    compiled = torch.compile(layer, backend="hostir", options=options)
    optimizers = [torch.optim.AdamW(module.parameters(), lr=1e-3) for module in (layer, whole_layer)]
    head_dim = layer.attention.head_dim
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        x = torch.randn(batch, sequence, 64, device=device)
        for optimizer in optimizers:
            optimizer.zero_grad()
        local = rank_inputs(x, head_dim, rank, world)
        loss = compiled(*local).square().sum() / x.numel()
        loss.backward()
        for parameter in layer.parameters():
            dist.all_reduce(parameter.grad)  # each rank's tokens' share of the gradient
        total = loss.detach().clone()
        dist.all_reduce(total)
        whole_loss = whole_layer(*layer_inputs(x, head_dim)).square().mean()
        whole_loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        losses.append((total.item(), whole_loss.item()))
    return losses


RING = {"sequence_layout": "head_tail"}
"""The backend's option that makes each rank's attention a ring (docs/frontend.md)."""


if __name__ == "__main__":
    run_training(functools.partial(train, options=RING), eager="eagerly on the whole sequence")
