"""The ring of context parallelism (`attention-ring`) on CPU ranks: an attention whose keys and
values are all-gathered along the sequence, their blocks streamed, and the backward whose
gradients of keys and values go back to their owners by blocks, each lowered to a ring and
run at 2 and 4 ranks, with the NCCL lowering (gloo here) and the copy engines', against
one attention over the whole sequence (SDPA, autograd) in f32, on inputs in f32 and in bf16.
On GPUs (NCCL ranks) each ring is also replayed from a CUDA graph.

Every case of a world runs in one launch of its ranks (`results_of_world`).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from hostir_dialect.fusion import Causal
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.graphs import GraphReplayer, GraphReplayFallback
from hostir.runtime.interpreter.attention import whole_sequence
from hostir.runtime.launch import run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import reference_outputs, shard, unshard
from test_communicator import needs_ranks

B, H, L, E = 2, 3, 8, 16
PIPELINES = {
    "nccl": "hir-lowering",
    "copy engines": "hir-lowering{backend=cuda p2p_backend=cuda}",
    "device order": "hir-lowering{p2p_order=device}",
}


def tensor(shape, devices: int, axes=None, dtype: str = "f32") -> str:
    text = f"!fusion.tensor<[{', '.join(map(str, shape))}], {dtype}, mesh = [{', '.join(map(str, range(devices)))}]"
    return text + (f", axes = [{', '.join(axes)}]>" if axes else ">")


def forward_fusion(devices: int, causal: str, dtype: str = "f32") -> str:
    """This device's queries against keys and values all-gathered, their blocks streamed."""
    varying = tensor((devices, B, H, L, E), devices, ["didx", "_", "_", "_", "_"], dtype)
    streamed = tensor((devices, B, H, L, E), devices, ["stream", "_", "_", "_", "_"], dtype)
    lse = tensor((devices, B, H, L), devices, ["didx", "_", "_", "_"])
    return f"""
func.func @ring(%q: {varying}, %k: {varying}, %v: {varying}) -> ({varying}, {lse}) {{
  %k_all = fusion.set %k : {varying} -> {streamed}
  %v_all = fusion.set %v : {varying} -> {streamed}
  %out, %lse = fusion.attention %q, %k_all, %v_all {causal} blocks : ({varying}, {streamed}, {streamed}) -> ({varying}, {lse})
  func.return %out, %lse : {varying}, {lse}
}}
"""


def backward_fusion(devices: int, causal: str, scattered: bool = True, dtype: str = "f32") -> str:
    """The gradients from the whole keys and values (every device's copy, in blocks), those of the
    keys and values reduce-scattered to the blocks' owners, their blocks streamed (or, not
    `scattered`, returned as each device's shares)."""
    axes = ["didx", "_", "_", "_", "_"]
    varying = tensor((devices, B, H, L, E), devices, axes, dtype)
    blocks = tensor((devices, devices, B, H, L, E), devices, [*axes, "_"], dtype)
    shares = tensor((devices, devices, B, H, L, E), devices, ["didx", "stream", "_", "_", "_", "_"], dtype)
    lse = tensor((devices, B, H, L), devices, ["didx", "_", "_", "_"])
    operands = f"({varying}, {varying}, {blocks}, {blocks}, {varying}, {lse})"
    if scattered:
        owned = f"""  %dk_owned = fusion.sum %dk [0] : {shares} -> {varying}
  %dv_owned = fusion.sum %dv [0] : {shares} -> {varying}
  func.return %dq, %dk_owned, %dv_owned : {varying}, {varying}, {varying}"""
        results = f"{varying}, {varying}, {varying}"
    else:
        owned = f"  func.return %dq, %dk, %dv : {varying}, {shares}, {shares}"
        results = f"{varying}, {shares}, {shares}"
    return f"""
func.func @ring_backward(%dout: {varying}, %q: {varying}, %k: {blocks}, %v: {blocks}, %out: {varying}, %lse: {lse}) -> ({results}) {{
  %dq, %dk, %dv = fusion.attention_backward %dout, %q, %k, %v, %out, %lse {causal} blocks : {operands} -> ({varying}, {shares}, {shares})
{owned}
}}
"""


MASKS = {"head-tail": "causal head_tail", "contiguous": "causal contiguous", "none": ""}


def sequence(pieces: torch.Tensor, layout: Causal | None) -> torch.Tensor:
    """Each device's rows `[D, ..., rows, width]` as the whole sequence, in order."""
    whole = torch.cat(list(pieces), dim=-2)
    if layout is None:
        return whole
    return whole[..., whole_sequence(pieces.shape[0], pieces.shape[-2], layout, pieces.device).argsort(), :]


def pieces(whole: torch.Tensor, devices: int, layout: Causal | None) -> torch.Tensor:
    """The inverse of `sequence`."""
    if layout is not None:
        whole = whole[..., whole_sequence(devices, whole.shape[-2] // devices, layout, whole.device), :]
    return torch.stack(whole.chunk(devices, dim=-2))


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    pipeline: str
    inputs: list[torch.Tensor]
    expected: list[torch.Tensor]
    dtype: str


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
TOLERANCES = {"f32": {}, "bf16": {"atol": 2e-2, "rtol": 2e-2}}
"""assert_close's defaults in f32; in bf16, about the rounding of a few bf16 sums."""


def cases(devices: int) -> list[Case]:
    """Every ring of a world: forward and backward, each mask, each lowering, random inputs in
    f32, and under head-tail in bf16 too (shares sent in bf16, sums kept in f32), against
    autograd in f32 on the same (rounded) values."""
    found = []
    for (mask, causal), (lowering, pipeline), dtype in (
        (m, p, d) for m in MASKS.items() for p in PIPELINES.items() for d in DTYPES if d == "f32" or m[0] == "head-tail"
    ):
        layout = Causal(causal.split()[1]) if causal else None
        generator = torch.Generator().manual_seed(len(found))
        q, k, v, dout = (torch.randn(devices, B, H, L, E, generator=generator).to(DTYPES[dtype]) for _ in range(4))
        whole = [sequence(t, layout).float() for t in (q, k, v, dout)]
        leaves = [t.clone().requires_grad_() for t in whole[:3]]
        out = F.scaled_dot_product_attention(*leaves, is_causal=layout is not None)
        out.backward(whole[3])
        _, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*whole[:3], is_causal=layout is not None)
        out, lse = pieces(out.detach(), devices, layout), pieces(lse[..., None], devices, layout)[..., 0]
        suffix = "" if dtype == "f32" else f", {dtype}"
        forward = forward_fusion(devices, causal, dtype)
        found.append(Case(f"forward, {mask}, {lowering}{suffix}", forward, pipeline, [q, k, v], [out, lse], dtype))
        every = [t.unsqueeze(0).expand(devices, *t.shape).contiguous() for t in (k, v)]  # each device holds them all
        grads = [pieces(leaf.grad, devices, layout) for leaf in leaves]
        inputs = [dout, q, *every, out.to(DTYPES[dtype]), lse]
        backward = backward_fusion(devices, causal, dtype=dtype)
        found.append(Case(f"backward, {mask}, {lowering}{suffix}", backward, pipeline, inputs, grads, dtype))
    return found


def _run_cases(devices: int) -> dict[str, tuple[list[torch.Tensor], str, list[torch.Tensor] | None]]:
    """On a rank: every case's outputs (this rank's pieces), its host program, and on GPUs its
    outputs replayed from a CUDA graph (the last of a few runs; a run outside the graph raises)."""
    communicator = Communicator.from_env()
    results = {}
    for case in cases(devices):
        program = Program.compile(case.text, pipeline=case.pipeline)
        local = [
            shard(t, type, communicator.rank).to(communicator.device) for t, type in zip(case.inputs, program.input_types)
        ]
        outputs = [output.cpu() for output in program.run(local, communicator)]  # compared with the CPU's SDPA
        replayed = None
        if communicator.device.type == "cuda":
            with warnings.catch_warnings():
                warnings.simplefilter("error", GraphReplayFallback)
                replayer = GraphReplayer(program, communicator)
                for _ in range(replayer.warmup_runs + 2):
                    replayed = [output.cpu() for output in replayer.run(local)]
        results[case.name] = (outputs, str(program.module), replayed)
    return results


@functools.cache
def results_of_world(devices: int) -> list[dict]:
    return run_on_local_ranks(_run_cases, devices, devices, timeout_s=600)


WORLDS = [pytest.param(2, marks=needs_ranks(2)), pytest.param(4, marks=needs_ranks(4))]


@pytest.mark.parametrize("devices", WORLDS)
@pytest.mark.parametrize("name", [case.name for case in cases(2)])
def test_the_ring_is_one_attention_over_the_whole_sequence(devices, name):
    """Outputs and log-sum-exps, or the three gradients, of the ring against SDPA and autograd on
    the whole sequence, and the fusion's unsharded reference alike."""
    (case,) = [c for c in cases(devices) if c.name == name]
    per_rank = results_of_world(devices)
    program = Program.compile(case.text, pipeline=case.pipeline)
    outputs = [unshard([rank[name][0][i] for rank in per_rank], type) for i, type in enumerate(program.output_types)]
    tolerance = TOLERANCES[case.dtype]
    for output, reference, expected in zip(outputs, reference_outputs(program.fusion, case.inputs), case.expected, strict=True):
        torch.testing.assert_close(output.float(), expected, **tolerance)
        torch.testing.assert_close(reference.float(), expected, **tolerance)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA GPUs")
@pytest.mark.parametrize("devices", WORLDS)
@pytest.mark.parametrize("name", [case.name for case in cases(2)])
def test_on_gpus_each_ring_replays_in_a_cuda_graph(devices, name):
    """Captured in a CUDA graph, its pool streams and copy-engine signals included, each ring
    replays with no run outside the graph and gives what it gives eagerly."""
    (case,) = [c for c in cases(devices) if c.name == name]
    for rank in results_of_world(devices):
        eager, _, replayed = rank[name]
        for output, again in zip(eager, replayed, strict=True):
            torch.testing.assert_close(again, output, **TOLERANCES[case.dtype])


@pytest.mark.parametrize("devices", WORLDS)
def test_each_ring_is_a_loop_of_blocks(devices):
    """The forward: one loop that receives the keys' and values' blocks and computes each one's
    attention (a block of a causal layout names its device), merged by two fused segments (the
    last block's output merge writes the output in its type, nothing cast after the loop). The
    backward: a step per other device's block (a loop; at 2 devices its one step is the loop
    unrolled) that computes the block's shares and sends them to its owner on a pool stream,
    then the own block's gradients, computed while the last shares travel: the caller's stream
    waits for those only after it."""
    for name, (_, program, _) in results_of_world(devices)[0].items():
        if name.startswith("forward"):
            loops = program.split("scf.for ")[1:]
            ring = [body for body in loops if "hir.recv" in body and "hir.attention" in body]
            assert len(ring) == 1, f"{name}: {program}"
            assert ("block %" in ring[0]) == ("none" not in name), name
            # In bf16 the last block's merge writes the output (at 2 devices the only merge): no cast after.
            merges = 3 if "bf16" in name and devices > 2 else 2
            assert ring[0].count("hir.launch_kernel") == merges and "merge_output" in program and "merge_lse" in program, name
            assert 'hir.pointwise "cast"' not in program, name
            assert "hir.allgather" not in program, name
        else:
            host = program[program.index("func.func @ring_backward") :]
            steps = host.split("scf.for ")[1:]
            assert len(steps) == (devices > 2), f"{name}: {program}"
            own = host.rindex("hir.attention_backward")
            last_send, last_wait = host.rindex("hir.send %keys_share"), host.rindex("hir.synchronize_stream %transfer_stream")
            assert last_send < own < last_wait, f"{name}: {host}"
            assert "hir.send %values_share" in host and "hir.reduce_scatter" not in host, name
            assert ("block %" in host) == ("none" not in name), name
        symmetric_shares = "hir.allocate() symmetric" in program.split("scf.for")[0]
        assert symmetric_shares == ("copy engines" in name), name


def _blocks_fusion(devices: int, mesh: str, causal: str, gathered: bool) -> str:
    varying = f"!fusion.tensor<[{devices}, {B}, {H}, {L}, {E}], f32, mesh = {mesh}, axes = [didx, _, _, _, _]>"
    blocks = f"!fusion.tensor<[{devices}, {B}, {H}, {L}, {E}], f32, mesh = {mesh}>"
    lse = f"!fusion.tensor<[{devices}, {B}, {H}, {L}], f32, mesh = {mesh}, axes = [didx, _, _, _]>"
    keys = (
        f"%kb = fusion.set %k : {varying} -> {blocks}\n  %vb = fusion.set %v : {varying} -> {blocks}"
        if gathered
        else f"%kb = fusion.exp %kk : {blocks} -> {blocks}\n  %vb = fusion.exp %kk : {blocks} -> {blocks}"
    )
    return f"""
func.func @f(%q: {varying}, %k: {varying}, %v: {varying}, %kk: {blocks}) -> ({varying}, {lse}) {{
  {keys}
  %out, %lse = fusion.attention %q, %kb, %vb {causal} blocks : ({varying}, {blocks}, {blocks}) -> ({varying}, {lse})
  func.return %out, %lse : {varying}, {lse}
}}
"""


def _whole_keys_fusion() -> str:
    """Each device's queries against keys and values given as one sequence (no blocks)."""
    varying = f"!fusion.tensor<[2, {B}, {H}, {L}, {E}], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>"
    keys = f"!fusion.tensor<[{B}, {H}, {2 * L}, {E}], f32, mesh = [0, 1]>"
    lse = f"!fusion.tensor<[2, {B}, {H}, {L}], f32, mesh = [0, 1], axes = [didx, _, _, _]>"
    return f"""
func.func @f(%q: {varying}, %k: {keys}) -> ({varying}, {lse}) {{
  %out, %lse = fusion.attention %q, %k, %k causal head_tail : ({varying}, {keys}, {keys}) -> ({varying}, {lse})
  func.return %out, %lse : {varying}, {lse}
}}
"""


@pytest.mark.parametrize(
    "text, reason",
    [
        (_blocks_fusion(2, "[0, 1]", "causal top_left", True), "SDPA's top-left causal mask over gathered keys is no mask of positions"),
        (_blocks_fusion(2, "[0, 1]", "causal head_tail", False), "its keys and values are not all-gathered"),
        (_blocks_fusion(2, "[0, 2]", "causal head_tail", True), "the ring visits the devices of one mesh of consecutive ids only"),
        (_whole_keys_fusion(), "its keys and values are not in blocks"),
        (backward_fusion(2, "causal head_tail", scattered=False), "its keys' and values' gradients are not reduce-scattered by blocks alone"),
    ],
    ids=["top-left mask", "keys not gathered", "sparse mesh", "keys as one sequence", "gradients not scattered"],
)
def test_auto_stream_parallel_says_why_an_attention_is_no_ring(text, reason, caplog):
    """An attention that no ring can compute keeps its fusion without a stream axis, and the pass
    says why on the `hostir.pipelining` logger."""
    from hostir.passes.fusion.auto_stream_parallel import AutoStreamParallel
    from hostir_dialect import hostir_context
    from hostir_dialect.text import parse_module, print_module

    text = text.replace("stream", "_")
    try:
        module = parse_module(text)
    except Exception:  # a case written with what the verifier refuses is no case
        pytest.fail(f"the case does not parse:\n{text}")
    with caplog.at_level("INFO", logger="hostir.pipelining"):
        AutoStreamParallel().apply(hostir_context(), module)
    assert "stream" not in print_module(module)
    messages = [record.getMessage() for record in caplog.records if "is not a ring" in record.getMessage()]
    if reason is not None:
        assert any(reason in message for message in messages), messages
    else:
        assert messages, caplog.text
