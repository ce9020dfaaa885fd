"""The ring attention of ring_attention_reference.py against one attention over the whole sequence.

In f32, on random inputs, for each mask (none; causal with the layout known, skipping the
blocks it empties; causal by the tokens' positions, on every block): each rank's output
and log-sum-exp against torch's SDPA and its CPU flash kernel on the unsharded tensors;
dQ, dK and dV against autograd through SDPA; the attentions the ring computes against the
mask (every visible pair of positions once, no hidden pair, so no block that a causal mask
empties); the head-tail layout against torch's load balancer, and its work step by step
and rank by rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
import pytest

from ring_attention_reference import (
    LAYOUTS,
    MASKS,
    block_attention,
    causal_mask,
    masked_scores,
    merge,
    positions_of,
    ring_attention_backward,
    ring_attention_forward,
    shard,
    unshard,
)

BATCH, HEADS = 2, 3

rings = st.fixed_dictionaries(
    {
        "world": st.integers(1, 4),
        "layout": st.sampled_from(LAYOUTS),
        "mask": st.sampled_from(MASKS),
        "rows_per_chunk": st.integers(1, 5),
        "head_dim": st.sampled_from([1, 8, 16]),
        "seed": st.integers(0, 2**31 - 1),
    }
)
"""A ring: its ranks, the layout of the sequence, the mask, the sizes, and the seed of the inputs."""


def whole_inputs(ring: dict) -> tuple[torch.Tensor, ...]:
    """Random q, k, v and dO over the whole sequence: every rank of the ring holds the same
    number of rows in both layouts (two chunks of a head-tail rank are one contiguous chunk)."""
    generator = torch.Generator().manual_seed(ring["seed"])
    sequence = 2 * ring["world"] * ring["rows_per_chunk"]
    shape = (BATCH, HEADS, sequence, ring["head_dim"])
    return tuple(torch.randn(shape, generator=generator) for _ in range(4))


@given(rings)
def test_forward_is_one_attention_over_the_whole_sequence(ring):
    q, k, v, _ = whole_inputs(ring)
    world, layout, causal = ring["world"], ring["layout"], ring["mask"] != "none"
    outs, lses, _ = ring_attention_forward(
        *(shard(t, 2, world, layout) for t in (q, k, v)), layout=layout, mask=ring["mask"]
    )
    expected_out, expected_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)
    torch.testing.assert_close(unshard(outs, 2, layout), F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    torch.testing.assert_close(unshard(outs, 2, layout), expected_out)
    torch.testing.assert_close(unshard(lses, 2, layout), expected_lse)


@given(rings)
def test_backward_gives_autograds_gradients_to_their_owners(ring):
    q, k, v, grad_out = whole_inputs(ring)
    world, layout, mask = ring["world"], ring["layout"], ring["mask"]
    pieces = [shard(t, 2, world, layout) for t in (q, k, v)]
    outs, lses, _ = ring_attention_forward(*pieces, layout=layout, mask=mask)
    grad_q, grad_k, grad_v, _ = ring_attention_backward(
        shard(grad_out, 2, world, layout), *pieces, outs, lses, layout=layout, mask=mask
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=mask != "none").backward(grad_out)
    for mine, leaf in zip((grad_q, grad_k, grad_v), leaves):
        torch.testing.assert_close(unshard(mine, 2, layout), leaf.grad)


def pairs_computed(trace, ring: dict) -> torch.Tensor:
    """How many times the ring computed each (query position, key position) pair that the
    mask of the computing block shows."""
    world, length = ring["world"], 2 * ring["rows_per_chunk"]
    sequence = world * length
    counts = torch.zeros(sequence, sequence, dtype=torch.int64)
    for step in trace:
        rows = positions_of(step.rank, world, ring["layout"], length)[step.block.queries]
        columns = positions_of(step.source, world, ring["layout"], length)[step.block.keys]
        probe = torch.zeros(1, len(rows), 1)  # the scores' mask alone: q and k of head_dim 1, 0
        seen = masked_scores(probe, torch.zeros(1, len(columns), 1), step.block.mask, 1.0, rows, columns)[0] == 0
        counts[rows[:, None], columns[None, :]] += seen.to(torch.int64)
    return counts


@given(rings)
def test_the_ring_computes_each_visible_pair_once_and_no_hidden_one(ring):
    """Every pair the mask shows is computed exactly once, and none it hides. With the layout
    known ("causal"), a block that the mask empties is skipped and one that it cuts is
    computed with the mask; by positions, every block is computed, masked."""
    q, k, v, grad_out = whole_inputs(ring)
    world, layout, mask = ring["world"], ring["layout"], ring["mask"]
    pieces = [shard(t, 2, world, layout) for t in (q, k, v)]
    outs, lses, forward_trace = ring_attention_forward(*pieces, layout=layout, mask=mask)
    *_, backward_trace = ring_attention_backward(
        shard(grad_out, 2, world, layout), *pieces, outs, lses, layout=layout, mask=mask
    )
    sequence = q.shape[2]
    visible = causal_mask(sequence, sequence, torch.device("cpu")) if mask != "none" else torch.ones(sequence, sequence)
    assert torch.equal(pairs_computed(forward_trace, ring), visible.to(torch.int64))
    assert backward_trace == forward_trace
    if mask != "causal":
        assert len(forward_trace) == world * world


@pytest.mark.parametrize("world", [2, 3, 4])
def test_head_tail_gives_every_rank_the_same_work_at_every_step(world):
    ring = {"world": world, "layout": "head-tail", "mask": "causal", "rows_per_chunk": 4, "head_dim": 8, "seed": 0}
    q, k, v, _ = whole_inputs(ring)
    *_, trace = ring_attention_forward(*(shard(t, 2, world, "head-tail") for t in (q, k, v)), layout="head-tail")
    work = {}  # (step, rank) -> pairs computed
    for step in trace:
        work[step.step, step.rank] = int(pairs_computed([step], ring).sum())
    assert len(work) == world * world, "every rank computes at every step"
    for s in range(world):
        assert len({work[s, rank] for rank in range(world)}) == 1, f"unequal work at step {s}: {work}"
    c = ring["rows_per_chunk"]
    assert work[0, 0] == 2 * c * c + c  # the local causal block: two triangles and one full square
    assert all(work[s, 0] == 2 * c * c for s in range(1, world))  # half of each arriving block


def test_contiguous_layout_leaves_the_first_rank_idle():
    """What head-tail fixes: in order, rank r computes r + 1 blocks of the ring's `world`."""
    ring = {"world": 4, "layout": "contiguous", "mask": "causal", "rows_per_chunk": 2, "head_dim": 8, "seed": 0}
    q, k, v, _ = whole_inputs(ring)
    *_, trace = ring_attention_forward(*(shard(t, 2, 4, "contiguous") for t in (q, k, v)), layout="contiguous")
    assert [sum(step.rank == rank for step in trace) for rank in range(4)] == [1, 2, 3, 4]


def test_head_tail_is_the_order_of_torchs_load_balancer():
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

    for world, sequence in [(1, 8), (2, 16), (3, 12), (4, 32)]:
        ours = torch.cat(shard(torch.arange(sequence), 0, world, "head-tail"))
        torchs = _HeadTailLoadBalancer(sequence, world, "cpu")._generate_indices()[0]
        assert torch.equal(ours, torchs.to(ours.dtype))
        assert torch.equal(unshard(shard(torch.arange(sequence), 0, world, "head-tail"), 0, "head-tail"), torch.arange(sequence))


def test_shard_refuses_a_sequence_that_does_not_cut_evenly():
    with pytest.raises(ValueError, match="does not cut into 4 equal chunks"):
        shard(torch.zeros(1, 1, 10, 4), 2, 2, "head-tail")


@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 30.0]))
def test_merge_of_two_key_sets_is_the_attention_over_their_union(seed, magnitude):
    """In any order, for any split of the keys (not only a ring's), and with scores large
    enough that exp() of them overflows f32: the merge works on log-sum-exps only."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(BATCH, HEADS, 6, 8, generator=generator) * magnitude for _ in range(3))
    split = torch.randperm(6, generator=generator)
    first, second = split[:2], split[2:]
    scale = 8**-0.5
    whole_out, whole_lse = block_attention(q, k, v, "none", scale)
    if magnitude > 1:
        assert ((q @ k.transpose(-2, -1)) * scale).exp().isinf().any(), "scores this large overflow exp() in f32"
    parts = [block_attention(q, k[..., keys, :], v[..., keys, :], "none", scale) for keys in (first, second)]
    # The weights exp(lse - merged) carry the rounding of log-sum-exps as large as the scores:
    # a relative error of a few of their ulps, which is 1e-4 where scores reach 1000.
    rtol = max(1.3e-6, 4 * whole_lse.abs().max().item() * torch.finfo(torch.float32).eps)
    for a, b in (parts, parts[::-1]):
        out, lse = merge(*a, *b)
        torch.testing.assert_close(out, whole_out, rtol=rtol, atol=rtol * v.abs().max().item())
        torch.testing.assert_close(lse, whole_lse)


def test_a_row_that_sees_no_key_of_a_block_merges_as_nothing():
    """By positions, a block can hide every key from some query rows (an early query against
    a later chunk): the block gives them output 0 and log-sum-exp -inf, which the merge leaves
    out, where exp(-inf - -inf) would have made them NaN."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=generator) for _ in range(3))
    query_positions, key_positions = torch.tensor([0, 1, 6, 7]), torch.tensor([4, 5, 2, 3])
    block_out, block_lse = block_attention(q, k, v, "positions", 8**-0.5, query_positions, key_positions)
    assert torch.equal(block_out[..., :2, :], torch.zeros(1, 2, 2, 8))
    assert block_lse[..., :2].isneginf().all() and block_lse[..., 2:].isfinite().all()
    own_out, own_lse = block_attention(q, q, v, "top-left", 8**-0.5)
    out, lse = merge(own_out, own_lse, block_out, block_lse)
    torch.testing.assert_close(out[..., :2, :], own_out[..., :2, :], rtol=0, atol=0)
    assert out.isfinite().all()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_at_every_step_each_rank_receives_from_one_peer_and_sends_to_another(world):
    """The sources of a step are a permutation of the ranks with no rank its own source after
    the first step: every link carries one block per step, and in the backward every owner
    receives one share per step."""
    ring = {"world": world, "layout": "head-tail", "mask": "none", "rows_per_chunk": 1, "head_dim": 1, "seed": 0}
    q, k, v, _ = whole_inputs(ring)
    *_, trace = ring_attention_forward(*(shard(t, 2, world, "head-tail") for t in (q, k, v)), "head-tail", "none")
    for step in range(world):
        sources = {t.rank: t.source for t in trace if t.step == step}
        assert sorted(sources) == sorted(sources.values()) == list(range(world))
        assert all((source == rank) == (step == 0) for rank, source in sources.items())
