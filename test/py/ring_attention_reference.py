"""Ring attention in plain torch: the specification a context-parallel lowering must match.

The sequence is cut into chunks and sharded over `world` ranks; every rank keeps its
queries, and the keys and values of every rank visit every other. The order is that of
hostir's point-to-point allgather (its ring order): at step i rank p receives the block of
rank (p + i) mod world from that rank and sends its own block to rank (p - i) mod world, so
that at every step each rank sends to one peer and receives from another, all distinct,
and no block waits for another step to be relayed. At each step a rank computes the
attention of (some of) its queries against (some of) the block that arrived, and merges
that partial result into its running one through the log-sum-exp (online softmax). The
backward runs the same exchange of keys and values; every rank keeps its dQ, and sends its
share of the gradients of the keys and values of the block it holds straight back to the
block's owner, which sums the shares as they arrive (at step i rank p receives the share
of rank (p - i) mod world): the mirror of the forward's exchange.

Two layouts of the sequence (`LAYOUTS`):

* "contiguous": rank r holds chunk r of `world`. Under a causal mask rank r attends to
  r + 1 blocks and idles for the rest of the ring: the last rank does all the work.
* "head-tail" (torch's `_HeadTailLoadBalancer`): the sequence is cut into 2 * world
  chunks and rank r holds chunks r and 2 * world - 1 - r, in that order. Under a causal
  mask every step is the same amount of work on every rank: the first step is the local
  causal attention, and each later step is half a block, either all the local queries
  against the first chunk of the arriving block (it comes from an earlier rank) or the
  second local chunk of queries against the whole block (it comes from a later rank).

Three masks (`MASKS`): "none"; "causal", where the layout is known, so that `ring_block`
says which rows meet at each step (`Block`) and the blocks a causal mask makes empty are
never computed; and "positions", the causal mask of the tokens' positions, which travel
with the keys, applied to every block with nothing skipped (what a lowering can do when
it does not know the layout: twice the work of "causal"). Shapes follow SDPA's:
`[batch, heads, sequence, head_dim]`, the sequence at dim -2, the log-sum-exp
`[batch, heads, sequence]` in natural log. The
arithmetic is written out (matmul, exp, sums), not taken from an attention kernel, so
that the tests compare it with torch's kernels as an independent reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("contiguous", "head-tail")
MASKS = ("none", "causal", "positions")


def chunks_of_rank(rank: int, world: int, layout: str) -> list[int]:
    """The chunks of the sequence that `rank` holds, in its local order."""
    if layout == "contiguous":
        return [rank]
    if layout == "head-tail":
        return [rank, 2 * world - 1 - rank]
    raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")


def chunk_count(world: int, layout: str) -> int:
    return world * len(chunks_of_rank(0, world, layout))


def shard(whole: torch.Tensor, dim: int, world: int, layout: str) -> list[torch.Tensor]:
    """Each rank's piece of `whole`, cut along `dim` in `layout`."""
    count = chunk_count(world, layout)
    if whole.shape[dim] % count:
        raise ValueError(f"a sequence of {whole.shape[dim]} does not cut into {count} equal chunks ({layout}, {world} ranks)")
    chunks = whole.chunk(count, dim=dim)
    return [torch.cat([chunks[c] for c in chunks_of_rank(r, world, layout)], dim=dim) for r in range(world)]


def unshard(pieces: list[torch.Tensor], dim: int, layout: str) -> torch.Tensor:
    """The whole tensor from each rank's piece: the inverse of `shard`."""
    world = len(pieces)
    per_rank = len(chunks_of_rank(0, world, layout))
    chunks: dict[int, torch.Tensor] = {}
    for rank, piece in enumerate(pieces):
        for chunk, part in zip(chunks_of_rank(rank, world, layout), piece.chunk(per_rank, dim=dim)):
            chunks[chunk] = part
    return torch.cat([chunks[c] for c in range(len(chunks))], dim=dim)


@dataclass(frozen=True)
class Block:
    """The attention one rank computes at one step: its local query rows `queries` against
    the rows `keys` of the block that arrived, masked by `mask`: "none", "top-left" (SDPA's
    `is_causal`) or "positions" (query position >= key position)."""

    queries: slice
    keys: slice
    mask: str


def ring_block(rank: int, source: int, world: int, layout: str, mask: str, length: int) -> Block | None:
    """What `rank` computes when the block of `source` arrives (each rank holds `length` rows),
    or None where a causal mask leaves nothing to compute."""
    whole, first, second = slice(0, length), slice(0, length // 2), slice(length // 2, length)
    if mask in ("none", "positions"):
        return Block(whole, whole, mask)
    if mask != "causal":
        raise ValueError(f"unknown mask {mask!r}; expected one of {MASKS}")
    if source == rank:
        # The local block: its chunks are in increasing order of position, so the causal mask
        # of the positions is SDPA's top-left mask on the local rows.
        return Block(whole, whole, "top-left")
    if layout == "contiguous":
        return Block(whole, whole, "none") if source < rank else None
    # head-tail: the arriving chunks are `source` and 2 * world - 1 - `source`. From an earlier
    # rank, its first chunk precedes both local chunks and its second follows both; from a later
    # rank, both its chunks precede the second local chunk and follow the first.
    if source < rank:
        return Block(whole, first, "none")
    return Block(second, whole, "none")


def masked_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: str,
    scale: float,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The block's scaled scores, -inf where `mask` hides a key from a query."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask == "top-left":
        visible = causal_mask(q.shape[-2], k.shape[-2], q.device)
    elif mask == "positions":
        visible = query_positions[:, None] >= key_positions[None, :]
    else:
        return scores
    return scores.masked_fill(visible.logical_not(), float("-inf"))


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: str,
    scale: float,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of one block and its log-sum-exp (natural log), as a flash kernel
    returns them. A query row that the mask hides from every key of the block gets the
    attention over no key: output 0, log-sum-exp -inf (the identity of `merge`)."""
    scores = masked_scores(q, k, mask, scale, query_positions, key_positions)
    lse = scores.logsumexp(dim=-1)
    finite = lse.masked_fill(lse.isneginf(), 0.0)  # exp(-inf - 0) = 0 for such a row's keys
    return torch.exp(scores - finite[..., None]) @ v, lse


def causal_mask(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """SDPA's `is_causal` mask: query row i sees key rows 0..i (top-left aligned)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril()


def merge(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention over the union of two disjoint sets of keys, from the attention over each.

    With weights w = exp(lse - merged) and w' = exp(block_lse - merged), where merged =
    log(exp(lse) + exp(block_lse)), w + w' = 1 and the merged output is w * out + w' * block_out.
    torch's `_SDPAMerger` writes the same as out - sigmoid(block_lse - lse) * (out - block_out).
    """
    merged = torch.logaddexp(lse, block_lse)
    return (
        torch.exp(lse - merged)[..., None] * out + torch.exp(block_lse - merged)[..., None] * block_out,
        merged,
    )


@dataclass(frozen=True)
class Step:
    """One attention a rank computed in the ring: at `step`, on the block of `source`."""

    step: int
    rank: int
    source: int
    block: Block


def _ring(world: int, layout: str, mask: str, length: int):
    """The ring's schedule: for each step, each rank that computes, the source of the block it
    has received at that step, and what it computes."""
    for step in range(world):
        for rank in range(world):
            source = (rank + step) % world
            block = ring_block(rank, source, world, layout, mask, length)
            if block is not None:
                yield Step(step, rank, source, block)


def ring_attention_forward(
    queries: list[torch.Tensor],
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    layout: str,
    mask: str = "causal",
    scale: float | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Step]]:
    """Every rank's attention output and log-sum-exp for its local queries, computed in the ring,
    and the trace of the attentions computed. The first step is the local block, which writes
    the running result; every later one merges into it."""
    world = len(queries)
    length = queries[0].shape[-2]
    scale = queries[0].shape[-1] ** -0.5 if scale is None else scale
    positions = [positions_of(rank, world, layout, length) for rank in range(world)]
    outs: list[torch.Tensor] = [torch.empty(0)] * world
    lses: list[torch.Tensor] = [torch.empty(0)] * world
    trace = list(_ring(world, layout, mask, length))
    for step in trace:
        rank, source, block = step.rank, step.source, step.block
        # What arrived from `source`: its keys, values and (for the positional mask) positions.
        k, v, key_positions = keys[source], values[source], positions[source]
        block_out, block_lse = block_attention(
            queries[rank][..., block.queries, :],
            k[..., block.keys, :],
            v[..., block.keys, :],
            block.mask,
            scale,
            positions[rank][block.queries],
            key_positions[block.keys],
        )
        if step.step == 0:
            outs[rank], lses[rank] = block_out, block_lse
            continue
        out, lse = merge(outs[rank][..., block.queries, :], lses[rank][..., block.queries], block_out, block_lse)
        outs[rank], lses[rank] = outs[rank].clone(), lses[rank].clone()
        outs[rank][..., block.queries, :] = out
        lses[rank][..., block.queries] = lse
    return outs, lses, trace


def positions_of(rank: int, world: int, layout: str, length: int) -> torch.Tensor:
    """The positions in the whole sequence of the `length` rows that `rank` holds."""
    return shard(torch.arange(world * length), 0, world, layout)[rank]


def block_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    mask: str,
    scale: float,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of dQ, dK and dV, from the final log-sum-exp of the queries and
    delta = rowsum(dO * O) with the final output (what a flash kernel's backward computes
    when it is given the merged output and log-sum-exp: the probabilities are recomputed)."""
    scores = masked_scores(q, k, mask, scale, query_positions, key_positions)
    probabilities = torch.exp(scores - lse[..., None])
    grad_v = probabilities.transpose(-2, -1) @ grad_out
    grad_scores = probabilities * (grad_out @ v.transpose(-2, -1) - delta[..., None])
    return (grad_scores @ k) * scale, (grad_scores.transpose(-2, -1) @ q) * scale, grad_v


def ring_attention_backward(
    grad_outs: list[torch.Tensor],
    queries: list[torch.Tensor],
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    outs: list[torch.Tensor],
    lses: list[torch.Tensor],
    layout: str,
    mask: str = "causal",
    scale: float | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[Step]]:
    """Every rank's dQ, dK and dV, computed in the ring, and the trace of the attentions computed.

    The keys and values arrive as in the forward. At each step a rank adds its block's share
    of dQ to its own, and sends its shares of dK and dV to the block's owner, which adds them
    to its sums: one share from one peer per step, since the sources of a step are a
    permutation of the ranks."""
    world = len(queries)
    length = queries[0].shape[-2]
    scale = queries[0].shape[-1] ** -0.5 if scale is None else scale
    positions = [positions_of(rank, world, layout, length) for rank in range(world)]
    deltas = [(grad_out * out).sum(dim=-1) for grad_out, out in zip(grad_outs, outs)]
    grad_queries = [torch.zeros_like(q) for q in queries]
    grad_keys = [torch.zeros_like(k) for k in keys]
    grad_values = [torch.zeros_like(v) for v in values]
    trace = list(_ring(world, layout, mask, length))
    for computed in trace:
        rank, source, block = computed.rank, computed.source, computed.block
        rows, columns = block.queries, block.keys
        share_q, share_k, share_v = block_attention_backward(
            grad_outs[rank][..., rows, :],
            queries[rank][..., rows, :],
            keys[source][..., columns, :],
            values[source][..., columns, :],
            lses[rank][..., rows],
            deltas[rank][..., rows],
            block.mask,
            scale,
            positions[rank][rows],
            positions[source][columns],
        )
        grad_queries[rank] = grad_queries[rank].clone()
        grad_queries[rank][..., rows, :] += share_q
        # The shares go back to `source`, which adds them to its sums as they arrive.
        grad_keys[source], grad_values[source] = grad_keys[source].clone(), grad_values[source].clone()
        grad_keys[source][..., columns, :] += share_k
        grad_values[source][..., columns, :] += share_v
    return grad_queries, grad_keys, grad_values, trace
