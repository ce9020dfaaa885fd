"""A Llama-style decoder layer, tensor-parallel with torch's own API, compiled with hostir.

    torchrun --nproc-per-node 2 examples/tp_decoder_layer.py      # or: python examples/tp_decoder_layer.py

RMSNorm, then attention (QKV colwise, the output projection rowwise, causal SDPA; with
`rotary_positions`, torchtitan's rotary embeddings in complex numbers on the queries and
keys), then RMSNorm and a SwiGLU MLP (colwise, rowwise), with sequence parallelism on the
norms: between the blocks every rank holds a slice of the sequence. The same plan as
torchtitan's Llama; `parallelize_module` applies it, `torch.compile(backend="hostir")`
runs it. Run as a script, it trains the layer for a few steps on 2 local CPU ranks
(or on torchrun's ranks) and prints the loss next to that of the same layer run
eagerly with DTensor; on GPUs, with NCCL.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def rotary_frequencies(positions: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """torchtitan's `precompute_freqs_cis`: the turn of each pair of channels at each position,
    unit complex numbers, [positions, head_dim / 2]."""
    rates = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(positions).float(), rates)
    return torch.polar(torch.ones_like(angles), angles)


def rotary(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """torchtitan's `apply_rotary_emb` of one tensor [batch, sequence, heads, head_dim]: its
    pairs of channels as complex numbers, turned by `freqs_cis` [sequence, head_dim / 2], in
    f32, back in x's dtype."""
    turned = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(turned * freqs_cis.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, rotary_positions: int = 0):
        """`rotary_positions`: the positions of the rotary embeddings' table, as torchtitan's
        Llama makes it (`rotary_frequencies`, a complex buffer); 0: no rotary embeddings."""
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        table = rotary_frequencies(rotary_positions, self.head_dim) if rotary_positions else None
        self.register_buffer("freqs_cis", table, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, sequence, _ = x.shape
        # -1: the heads of this rank, whatever the plan made of the projections.
        q, k, v = (w(x).view(batch, sequence, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        if self.freqs_cis is not None:
            q, k = (rotary(t, self.freqs_cis[:sequence]) for t in (q, k))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, sequence, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 224, rotary_positions: int = 0):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.attention = Attention(dim, heads, rotary_positions)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def parallelize(layer: DecoderLayer, mesh: DeviceMesh) -> DecoderLayer:
    """torchtitan's plan for a Llama layer: TP over `mesh` with sequence parallelism."""
    to_replicated = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return parallelize_module(
        layer,
        mesh,
        {
            "attention_norm": SequenceParallel(),
            "attention": to_replicated,
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": to_replicated,
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        },
    )


def rank_device() -> torch.device:
    """This rank's GPU under NCCL, else the CPU."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def train(steps: int = 5, batch: int = 2, sequence: int = 16) -> list[tuple[float, float]]:
    """Trains the layer with AdamW on this rank, compiled with hostir and eagerly; returns both losses per step."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    device = rank_device()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)
    reference = DecoderLayer()
    layers = []
    for _ in range(2):
        layer = DecoderLayer().to(device)
        layer.load_state_dict(reference.state_dict())
        layers.append(parallelize(layer, mesh))
    compiled = torch.compile(layers[0], backend="hostir")
    runs = [(compiled, layers[0]), (layers[1], layers[1])]
    optimizers = [torch.optim.AdamW(layer.parameters(), lr=1e-3) for _, layer in runs]
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        x = torch.randn(batch, sequence, 64)
        local = x.chunk(world, dim=1)[dist.get_rank()].to(device)
        step_losses = []
        for (model, _), optimizer in zip(runs, optimizers):
            optimizer.zero_grad()
            loss = model(local).square().mean()
            loss.backward()
            optimizer.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            step_losses.append(total.item() / world)
        losses.append(tuple(step_losses))
    return losses


def run_training(train: Callable[[], list[tuple[float, float]]], eager: str = "eagerly") -> None:
    """Runs `train` on torchrun's ranks (NCCL on GPUs, else gloo), or without torchrun on 2
    local CPU ranks, and prints its losses per step: hostir's, then those of the layer run
    `eager`."""
    import os

    import torch.distributed as dist

    from hostir.runtime.graphs import release_captured_graphs
    from hostir.runtime.launch import run_on_local_ranks

    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if torchrun:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        results = train()
    else:
        results = run_on_local_ranks(train, 2)[0]
    if not torchrun or dist.get_rank() == 0:
        for step, (hostir_loss, eager_loss) in enumerate(results):
            print(f"step {step}: loss {hostir_loss:.6f} with hostir, {eager_loss:.6f} {eager}")
    if torchrun:
        release_captured_graphs()  # NCCL cannot destroy a communicator that a live graph uses
        dist.destroy_process_group()


if __name__ == "__main__":
    run_training(train)
