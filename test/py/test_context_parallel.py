"""Context parallelism through `torch.compile(backend="hostir")`: the plain DTensor plan of
examples/cp_decoder_layer.py on CPU ranks against the same layer run eagerly on the whole
sequence, and what hostir refuses (torch's own CP, TP x CP) with the reason.

Each world runs in one launch of its ranks, which checks every case there: the output, the
input's gradient and every parameter's gradient (the ranks' shares summed) against the
unsharded layer in f32, and three AdamW steps.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

from examples.cp_decoder_layer import DecoderLayer, context_parallel, layer_inputs, rank_inputs, shard_sequence, train
from examples.tp_decoder_layer import rank_device
from test_communicator import needs_ranks
from test_torch_backend import F32_TOLERANCE, _dumped, _max_error, run_on_hostir

BATCH, SEQUENCE = 2, 32


def _layer_case(options: dict) -> dict:
    """On this rank: the CP layer compiled with `options` against the whole layer, eager; the
    relative errors of the output, the input gradient and each parameter's gradient, and the
    programs the backend dumped."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    torch.manual_seed(0)
    whole_layer = DecoderLayer().to(device)
    layer = context_parallel(DecoderLayer().to(device), init_device_mesh(device.type, (world,)))
    layer.load_state_dict(whole_layer.state_dict())
    torch._dynamo.reset()
    head_dim = layer.attention.head_dim
    x = torch.randn(BATCH, SEQUENCE, 64, device=device)
    whole = [t.clone() for t in layer_inputs(x, head_dim)]
    whole[0].requires_grad_()
    local = list(rank_inputs(x, head_dim, rank, world))
    local[0].requires_grad_()
    with _dumped("fusion,host_ir") as dump:
        out = torch.compile(layer, backend="hostir", options=options)(*local)
        # The same loss on both sides: the squares' sum over the whole sequence.
        out.square().sum().backward()
    expected = whole_layer(*whole)
    expected.square().sum().backward()
    errors = {
        "output": _max_error(out.detach(), shard_sequence(expected.detach(), 1, rank, world)),
        "input gradient": _max_error(local[0].grad, shard_sequence(whole[0].grad, 1, rank, world)),
    }
    for (name, parameter), whole_parameter in zip(layer.named_parameters(), whole_layer.parameters()):
        grad = parameter.grad.clone()
        dist.all_reduce(grad)  # each rank's tokens' share
        errors[f"{name} gradient"] = _max_error(grad, whole_parameter.grad)
    return {"errors": errors, "dump": dump.getvalue()}


def _on_rank(cases: list[tuple[str, dict]]) -> dict:
    """Every case of a world, in one launch: each layer case and its three AdamW steps, the
    positions of another layout than the option's, and what the backend says of TP x CP (at 4
    ranks) and of torch's own CP (at 2), and the ring with a mask of float16's lowest (at 2)."""
    import torch.distributed as dist

    results = {name: _layer_case(options) for name, options in cases}
    for name, options in cases:
        torch._dynamo.reset()
        results[f"adamw, {name}"] = train(steps=3, batch=BATCH, sequence=SEQUENCE, options=options)
    results["wrong positions"] = _positions_of_another_layout()
    if dist.get_world_size() == 4:
        results["tp x cp"] = _tensor_and_context_parallel()
    else:
        results["torch cp"] = _torch_context_parallel_refusal()
        results["float16's lowest"] = _with_a_mask_of_float16s_lowest()
    return results


def _masked_by_float16s_lowest(q, k, v, positions, mesh):
    """The example's attention with its mask as a float one that hides keys by -65504, as SDPA
    hands cuDNN attention its mask on GPUs."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    k, v, key_positions = (
        DTensor.from_local(t, mesh, [Shard(dim)], run_check=False)
        .redistribute(mesh, [Replicate()])
        .to_local(grad_placements=[Partial()])
        for t, dim in ((k, 2), (v, 2), (positions, 0))
    )
    mask = torch.where(positions[:, None] >= key_positions[None, :], 0.0, -65504.0)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _with_a_mask_of_float16s_lowest() -> dict:
    """The head-tail ring case with that mask: the mask the forward saves, made by the backend
    with the graph's value, passes the backward's check of its values."""
    import examples.cp_decoder_layer as example

    attention, example.gathered_keys_attention = example.gathered_keys_attention, _masked_by_float16s_lowest
    try:
        return _layer_case({"sequence_layout": "head_tail"})
    finally:
        example.gathered_keys_attention = attention


CASES = [("plain plan", {}), ("head-tail ring", {"sequence_layout": "head_tail"})]


@functools.cache
def results_of_world(world: int) -> list[dict]:
    return run_on_hostir(_on_rank, world, CASES, timeout_s=600)


WORLDS = [pytest.param(2, marks=needs_ranks(2)), pytest.param(4, marks=needs_ranks(4))]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", [name for name, _ in CASES])
def test_the_layer_matches_the_unsharded_layer(world, case):
    """Output, input gradient and every parameter's gradient against the layer on the whole
    sequence, f32, on every rank."""
    for rank, result in enumerate(results_of_world(world)):
        errors = result[case]["errors"]
        assert len(errors) == 2 + len(list(DecoderLayer().parameters()))
        bad = {what: error for what, error in errors.items() if error > F32_TOLERANCE}
        assert not bad, f"rank {rank}: {bad}"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", [name for name, _ in CASES])
def test_adamw_steps_track_the_unsharded_layer(world, case):
    """Three AdamW steps: the losses with hostir on the CP ranks track the whole layer's, eager."""
    losses = results_of_world(world)[0][f"adamw, {case}"]
    for step, (hostir_loss, eager_loss) in enumerate(losses):
        assert hostir_loss == pytest.approx(eager_loss, rel=F32_TOLERANCE), f"step {step}"
    assert losses[-1][0] != losses[0][0], "the weights changed"


def _positions_of_another_layout() -> list[str]:
    """The layer compiled for a head-tail sequence, called where the last rank's positions are
    its rows of a contiguous sequence, then where they are right, then wrong again: what each
    rank's calls raise ("ran" for a call that did not)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    layer = context_parallel(DecoderLayer().to(device), init_device_mesh(device.type, (world,)))
    torch._dynamo.reset()
    x, cos, sin, right = rank_inputs(torch.randn(BATCH, SEQUENCE, 64, device=device), layer.attention.head_dim, rank, world)
    wrong = torch.arange(SEQUENCE, device=device).chunk(world)[rank] if rank == world - 1 else right
    compiled = torch.compile(layer, backend="hostir", options={"sequence_layout": "head_tail"})
    outcomes = []
    for positions in (wrong, right, wrong):
        try:
            compiled(x, cos, sin, positions)
            outcomes.append("ran")
        except Exception as error:  # noqa: BLE001 - the message is what is tested
            outcomes.append(str(error))
    return outcomes


def _tensor_and_context_parallel() -> str:
    """The layer tensor parallel (torchtitan's plan, sequence parallel on the norms) on the inner
    axis of a 2 x 2 mesh and context parallel on the outer one, compiled without the fallback:
    what the backend says of its forward graph."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    device = rank_device()
    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("cp", "tp"))
    layer = context_parallel(DecoderLayer().to(device), mesh["cp"])
    attention_inputs = PrepareModuleInput(
        input_layouts=(Shard(1), None, None, None), desired_input_layouts=(Replicate(), None, None, None)
    )
    mlp_input = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": attention_inputs,
        **{f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")},
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": mlp_input,
        **{f"feed_forward.{w}": ColwiseParallel() for w in ("w1", "w3")},
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(layer, mesh["tp"], plan)
    torch._dynamo.reset()
    cp_rank, tp_rank = mesh.get_coordinate()
    x, cos, sin, positions = rank_inputs(torch.randn(BATCH, SEQUENCE, 64, device=device), layer.attention.head_dim, cp_rank, 2)
    x = x.chunk(2, dim=1)[tp_rank]  # sequence parallel over the TP axis too
    try:
        torch.compile(layer, backend="hostir", options={"fallback": False})(x, cos, sin, positions)
    except Exception as error:  # noqa: BLE001 - the message is what is tested
        return str(error)
    return "compiled"


@needs_ranks(4)
def test_tensor_and_context_parallel_in_one_graph_is_refused_naming_both_groups():
    """TP x CP needs a fusion type sharded over two mesh axes, which hostir has not: the
    backend names the two process groups of the forward graph, TP's and CP's."""
    for rank, result in enumerate(results_of_world(4)):
        message = result["tp x cp"]
        assert "several process groups" in message, f"rank {rank}: {message}"
        groups = re.findall(r"group '\w+' of ranks (\[[\d, ]+\])", message)
        cp_ranks, tp_ranks = ([r for r in range(4) if r % 2 == rank % 2], [r for r in range(4) if r // 2 == rank // 2])
        assert sorted(groups) == sorted([str(cp_ranks), str(tp_ranks)]), f"rank {rank}: {message}"


def _torch_context_parallel_graph(group: str) -> torch.fx.GraphModule:
    """Two steps of torch's context-parallel ring as its graph holds them on rank 0 of 2 (cuDNN
    attention, head-tail, all-gather rotation), traced on fake GPU tensors: the local causal
    attention, then the second half of the queries against the block of rank 1, cut out of
    the all-gathered keys and values."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    shape, size = [2, 4, 16, 16], 2 * 4 * 16 * 16

    def step(q, k, v):
        local = aten._scaled_dot_product_cudnn_attention.default(q, k, v, None, True, 0.0, True)
        flat = aten.cat.default([aten.view.default(k, [-1]), aten.view.default(v, [-1])])
        gathered = c10d.wait_tensor.default(c10d.all_gather_into_tensor.default(flat, 2, group))
        block = aten.split.Tensor(gathered, 2 * size)[1]
        block_k = aten.view.default(aten.slice.Tensor(block, 0, 0, size), shape)
        block_v = aten.view.default(aten.slice.Tensor(block, 0, size, 2 * size), shape)
        second_half = aten.split.Tensor(q, 8, 2)[1]
        arrived = aten._scaled_dot_product_cudnn_attention.default(second_half, block_k, block_v, None, True, 0.0, False)
        return local[0], arrived[0]

    graph = torch.fx.symbolic_trace(step)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        inputs = [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
        FakeTensorProp(graph, mode).propagate_dont_convert_inputs(*inputs)
    return graph


def _torch_context_parallel_refusal() -> str:
    """What the importer says of torch's CP graph, on a rank of a world of 2."""
    import torch.distributed as dist

    from hostir.frontend.importer import UnsupportedGraph, import_graph

    try:
        import_graph(_torch_context_parallel_graph(dist.group.WORLD.group_name))
    except UnsupportedGraph as refusal:
        return str(refusal)
    return "imported"


@needs_ranks(2)
def test_torch_context_parallel_is_refused_pointing_to_the_plain_plan():
    """A graph of torch's own CP (on GPUs; on CPU ranks it fails in torch itself, eagerly and
    compiled) holds its ring unrolled for this rank: hostir refuses it and names the plain plan."""
    for rank, message in enumerate(result["torch cp"] for result in results_of_world(2)):
        assert "2 attention calls read the same queries (q), against keys cut out of a collective" in message, rank
        assert "torch's own context parallel" in message and "plain DTensor plan" in message, rank


def _host_programs(dump: str) -> dict[str, str]:
    """The dumped host programs by the kind of their graph (forward, backward)."""
    programs = dump.split("// hostir: the host program of graph ")[1:]
    return {program.split("_")[0]: program.split("// hostir:")[0] for program in programs}


@pytest.mark.parametrize("world", WORLDS)
def test_with_a_sequence_layout_attention_is_a_ring_both_ways(world):
    """With `sequence_layout`, the forward computes the attention of each block of keys and
    values in the ring that brings them, and the backward sends each block's gradients to its
    owner in a ring of its own (HOSTIR_DUMP shows them); without, the mask is a tensor of the
    program and the keys travel whole, before one attention."""
    programs = _host_programs(results_of_world(world)[0]["head-tail ring"]["dump"])
    assert set(programs) == {"forward", "backward"}
    forward_rings = [body for body in programs["forward"].split("scf.for ")[1:] if "hir.recv" in body]
    assert any("hir.attention causal head_tail block %" in body for body in forward_rings), programs["forward"]
    # The backward: the other ranks' blocks (a loop, unrolled at 2 ranks; its first step writes
    # the sums), each one's shares sent to its owner, then the own block's gradients.
    backward, block = programs["backward"], "hir.attention_backward causal head_tail block %"
    sent, own = backward.find("hir.send %keys_share"), backward.rfind(block)
    assert -1 < sent < own and backward.count(block) == (2 if world == 2 else 3), backward
    assert ("scf.for " in backward[:sent]) == (world > 2), backward
    assert "hir.reduce_scatter" not in backward
    plain = results_of_world(world)[0]["plain plan"]["dump"]
    assert "= fusion.attention " in plain and " mask %" in plain and "block %" not in plain
    # The backward recomputes the mask from the positions rather than the forward saving it
    # (frontend/partitioning.py), and no ring reads it: neither program of the ring has it.
    mask = f"[{world}, {SEQUENCE // world}, {SEQUENCE}]"
    assert mask in _host_programs(plain)["forward"] and mask in _host_programs(plain)["backward"]
    assert mask not in programs["forward"] and mask not in programs["backward"]
    # Nor does the ring's forward gather the positions that it saves for the backward: the
    # layout fixes them too, and the backend hands the backward the tensor it made.
    gathered = f"<[{SEQUENCE}], i64"
    assert gathered in _host_programs(plain)["forward"] and gathered not in programs["forward"]


@pytest.mark.parametrize("world", WORLDS)
def test_the_rotary_rotation_is_read_by_the_kernel_of_its_multiply_add(world):
    """The rotation of the queries and keys (`cat([-x[..., h:], x[..., :h]], -1)`) and its
    transpose in the backward are `fusion.rotate_half` in the kernels of the multiply-adds
    around them (cat-to-rotate-half): no `cat` is left, nor a kernel of a negation alone."""
    programs = _host_programs(results_of_world(world)[0]["head-tail ring"]["dump"])
    for kind, program in programs.items():
        assert "aten.cat" not in program, f"{kind}: {program}"
        segments = program.split("func.func private @")[1:]
        rotating = [segment for segment in segments if "= fusion.rotate_half %" in segment]
        assert len(rotating) in (1, 2) and sum(s.count("fusion.rotate_half %") for s in rotating) == 2, kind
        assert all("fusion.mul " in segment and "fusion.add " in segment for segment in rotating), kind


@pytest.mark.parametrize("world", WORLDS)
def test_positions_of_another_layout_fail_on_every_rank_before_any_communication(world):
    """The last rank's positions are not those of the option's layout: it says which input and
    why, every other rank that the inputs are wrong on another rank, and no rank hangs; at the
    first call, which compiles, as at a later one, after a call on the right positions ran (the
    check of a value is made at every call)."""
    outcomes = [result["wrong positions"] for result in results_of_world(world)]
    for call in (0, 2):
        messages = [rank_outcomes[call] for rank_outcomes in outcomes]
        assert "its values are not this rank's positions in a sequence laid out head_tail" in messages[-1], messages[-1]
        assert re.search(r"\d+ of \d+ elements differ; at \[[\d, ]+\]: \d+, expected \d+", messages[-1]), messages[-1]
        assert f"on rank {world - 1}" in messages[-1]
        for rank, message in enumerate(messages[:-1]):
            assert "wrong on another rank" in message and f"rank {world - 1}" in message, f"rank {rank}: {message}"
    assert [rank_outcomes[1] for rank_outcomes in outcomes] == ["ran"] * world


@needs_ranks(2)
def test_a_mask_that_hides_keys_by_float16s_lowest_is_the_layouts_both_ways():
    """The head-tail ring with the mask written as 0 and -65504 (SDPA's for cuDNN attention on
    GPUs) instead of -inf: the attention and its backward are causal in the layout, the
    backward accepts the mask the forward saved (the backend made it with -65504, the graph's
    value), and the gradients match the whole layer's."""
    for rank, result in enumerate(results_of_world(2)):
        case = result["float16's lowest"]
        bad = {what: error for what, error in case["errors"].items() if error > F32_TOLERANCE}
        assert not bad, f"rank {rank}: {bad}"
    programs = _host_programs(results_of_world(2)[0]["float16's lowest"]["dump"])
    assert "hir.attention causal head_tail block %" in programs["forward"], programs["forward"]
    assert "hir.attention_backward causal head_tail block %" in programs["backward"], programs["backward"]
