"""The context-parallel benchmark (benchmarks/cp_attention.py) as CI's smoke test.

One run of `--smoke` (2 local CPU ranks, gloo, f32, a tiny layer) checks the hostir
contender against the layer run eagerly on the whole sequence and writes the table, the
JSON and the PNG; torch's CP and the copy engines say why they do not run on CPU ranks. The
limit is tested on its own: its ranks together run the layer's GEMMs, and each rank's
attention computes exactly the query-key pairs that the head-tail causal mask leaves it.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from examples.cp_decoder_layer import DecoderLayer, layer_inputs
from hostir.runtime.interpreter.attention import layout_mask, positions, whole_sequence
from hostir_dialect.fusion import Causal
from test_torch_backend import F32_TOLERANCE

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import cp_attention  # noqa: E402  (a script's folder, not a package)
import tp_layer  # noqa: E402

COMMAND_TIMEOUT_S = 600
"""The smoke run compiles the layer's forward and backward with hostir on each rank."""


def test_smoke_run_checks_hostir_against_the_whole_layer_and_writes_its_report(tmp_path):
    command = [sys.executable, str(BENCHMARKS / "cp_attention.py"), "--smoke", "--breakdown", "--warmup=1", "--reps=3"]
    completed = subprocess.run(
        [*command, f"--output={tmp_path}"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr

    document = json.loads((tmp_path / "cp_attention.json").read_text())
    assert document["machine"]["ranks"] == 2 and document["machine"]["backend"] == "gloo"
    assert document["config"]["dtype"] == "float32" and document["config"]["reps"] == 3
    results = {(r["step"], r["contender"]): r for r in document["results"]}
    assert set(results) == {(step, c) for step in tp_layer.STEPS for c in cp_attention.CONTENDERS}
    for step in tp_layer.STEPS:
        limit = results[step, cp_attention.LIMIT]
        assert limit["status"] == "ok" and limit["ms"] > 0 and len(limit["rank_ms"]) == 2
        hostir = results[step, cp_attention.HOSTIR]
        assert hostir["status"] == "ok" and hostir["ms"] == max(hostir["rank_ms"])
        assert hostir["ratio_to_limit"] == pytest.approx(hostir["ms"] / limit["ms"])
        assert hostir["check_ok"] and max(hostir["errors"].values()) <= F32_TOLERANCE
        # --breakdown: each rank's profiled step, split; its trace kept for Perfetto.
        assert len(hostir["breakdown"]) == 2
        for rank, breakdown in enumerate(hostir["breakdown"]):
            assert breakdown["step_ms"] > 0 and breakdown["gemm_ms"] > 0 and breakdown["attention_ms"] > 0
            assert (tmp_path / f"trace-d64-b2-s32-hostir-{step}-rank{rank}.json").is_file()
        # What cannot run on CPU ranks says why, in the table too.
        for contender in (cp_attention.TORCH_ALLGATHER, cp_attention.TORCH_ALLTOALL):
            assert results[step, contender]["status"].startswith("unavailable: torch's context parallel")
        assert results[step, cp_attention.HOSTIR_CUDA]["status"] == "unavailable: the copy engines are CUDA's"
    parameters = [name for name, _ in DecoderLayer().named_parameters()]
    assert set(results["train", cp_attention.HOSTIR]["errors"]) == {
        "output", "input gradient", *(f"{name} gradient" for name in parameters)
    }
    assert set(results["forward", cp_attention.HOSTIR]["errors"]) == {"output"}

    table = (tmp_path / "cp_attention.md").read_text()
    assert table in completed.stdout
    assert "| dim 64, 2 x 32 tokens |" in table and "WRONG" not in table
    assert f"### Checks against {cp_attention.REFERENCE}" in table and "the ranks' shares summed" in table
    for title in tp_layer.STEPS.values():
        assert f"### Where the time goes: {title}, dim 64, 2 x 32 tokens (ms)" in table
    assert (tmp_path / "cp_attention.png").read_bytes().startswith(b"\x89PNG")


class Attention(TorchDispatchMode):
    """The query-key pairs each forward attention call computes (SDPA's causal mask counted as
    the pairs it leaves), and the matmuls' count."""

    def __init__(self):
        super().__init__()
        self.pairs: list[int] = []
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        self.calls[name] += 1
        if "scaled_dot_product" in name and "backward" not in name:
            q, k = args[0], args[1]
            causal = args[4] if len(args) > 4 else (kwargs or {}).get("is_causal", False)
            rows, keys = q.shape[-2], k.shape[-2]
            assert not causal or rows == keys
            self.pairs.append(q.shape[:-2].numel() * (rows * (rows + 1) // 2 if causal else rows * keys))
        return func(*args, **(kwargs or {}))


SIZE = cp_attention.SequenceSize(64, 2, 32, head_dim=16)


def _mm_flops(counter: FlopCounterMode) -> int:
    counts = counter.get_flop_counts()["Global"]
    return sum(flops for op, flops in counts.items() if op.__name__ in ("mm", "addmm", "bmm"))


@pytest.mark.parametrize("world", [2, 4])
def test_the_limit_of_d_ranks_is_the_layers_gemms_and_the_attention_the_causal_mask_leaves(world):
    layer = DecoderLayer(SIZE.dim, SIZE.heads, SIZE.hidden)
    x = torch.randn(SIZE.batch, SIZE.sequence, SIZE.dim, requires_grad=True)
    inputs = layer_inputs(x, SIZE.head_dim)
    with FlopCounterMode(display=False) as whole_forward, torch.no_grad():
        layer(*inputs)
    with FlopCounterMode(display=False) as whole_train:
        layer(*inputs).backward(torch.randn_like(x))
    rows = SIZE.sequence // world
    keys = whole_sequence(world, rows, Causal.HEAD_TAIL, torch.device("cpu"))
    forward_flops = train_flops = 0
    for position in range(world):
        limit = cp_attention.Limit.of(SIZE, world, torch.float32, torch.device("cpu"), position)
        with FlopCounterMode(display=False) as forward, Attention() as attention:
            limit.forward_step()
        with FlopCounterMode(display=False) as train, Attention() as trained:
            limit.train_step()
        forward_flops, train_flops = forward_flops + _mm_flops(forward), train_flops + _mm_flops(train)
        # The rank's attention: one call per block of keys, the pairs its causal mask leaves.
        queries = positions(position, world, rows, Causal.HEAD_TAIL, torch.device("cpu"))
        seen = int(layout_mask(queries, keys).sum()) * SIZE.batch * SIZE.heads
        assert len(attention.pairs) == world and sum(attention.pairs) == seen
        assert trained.pairs == attention.pairs
        assert sum(n for name, n in trained.calls.items() if "scaled_dot_product" in name and "backward" in name) == world
    # The GEMMs (and the whole layer's attention matmuls, none on the CPU's flash kernel).
    assert forward_flops == _mm_flops(whole_forward) > 0
    assert train_flops == _mm_flops(whole_train)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "64,2"], "size '64,2': write DIM,BATCH,SEQUENCE"),
        (["--contenders", "hostir,ring"], "unknown contender(s) ['ring']"),
        (["--sizes", "64,2,30", "--head-dim", "16", "--nproc", "2"], "the sequence does not cut into 4 chunks"),
        (["--sizes", "60,2,32", "--head-dim", "16", "--nproc", "2"], "dim is not a multiple of the head dim"),
    ],
)
def test_bad_arguments_exit_with_a_message_before_any_rank_starts(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        cp_attention.main(argv)
    assert exited.value.code != 0
    assert message in capsys.readouterr().err + str(exited.value.code)
