"""The tensor-parallel decoder layer benchmark (benchmarks/tp_layer.py) as CI's smoke test.

One run of `--smoke --breakdown` (2 local CPU ranks, gloo, f32, a tiny layer) checks every
contender that runs here against eager DTensor, splits one profiled step of each, and writes
the table, the JSON, the PNG and the traces; the contenders that need CUDA say so in the
table, and the hostir contender fails if a graph of it ran as torch eager ops
(`check_ran_on_hostir`, tested on its own). The limit is tested on its own: it runs
exactly the GEMMs and attention of the layer, one rank's share of them.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from examples.tp_decoder_layer import DecoderLayer
from test_torch_backend import F32_TOLERANCE

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import tp_layer  # noqa: E402  (a script's folder, not a package)

COMMAND_TIMEOUT_S = 600
"""The smoke run compiles four graphs with hostir on each rank: tens of seconds on a loaded machine."""


def _smoke_run(output: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`tp_layer.py --smoke` with `options`, its report in `output`: the finished process
    (which must have succeeded) and the report's JSON."""
    command = [sys.executable, str(BENCHMARKS / "tp_layer.py"), "--smoke", *options, f"--output={output}"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed, json.loads((output / "tp_layer.json").read_text())


def test_smoke_run_checks_every_contender_and_writes_its_report(tmp_path):
    completed, document = _smoke_run(tmp_path, "--breakdown", "--warmup=1", "--reps=3")
    assert document["machine"]["ranks"] == 2 and document["machine"]["backend"] == "gloo"
    assert document["config"]["dtype"] == "float32" and document["config"]["reps"] == 3
    results = {(r["step"], r["contender"]): r for r in document["results"]}
    assert set(results) == {(step, c) for step in tp_layer.STEPS for c in tp_layer.CONTENDERS}
    for step in tp_layer.STEPS:
        limit = results[step, tp_layer.LIMIT]
        assert limit["status"] == "ok" and limit["ms"] > 0 and len(limit["rank_ms"]) == 2
        for contender in (tp_layer.EAGER, tp_layer.HOSTIR):
            result = results[step, contender]
            assert result["status"] == "ok" and result["ms"] == max(result["rank_ms"])
            assert result["ratio_to_limit"] == pytest.approx(result["ms"] / limit["ms"])
            # The same steps back to back, as a training loop runs them.
            assert result["loop_ms"] == max(result["loop_rank_ms"]) and len(result["loop_rank_ms"]) == 2
            assert result["loop_ratio_to_limit"] == pytest.approx(result["loop_ms"] / limit["loop_ms"])
            assert result["check_ok"] and max(result["errors"].values()) <= F32_TOLERANCE
            # --breakdown: each rank's profiled step, split; its trace kept for Perfetto.
            assert len(result["breakdown"]) == 2
            for rank, breakdown in enumerate(result["breakdown"]):
                assert breakdown["step_ms"] > 0 and breakdown["gemm_ms"] > 0 and breakdown["other_kernels"] > 0
                # The longest gaps between the ranks' ATen calls, longest first, each named.
                gaps = [ms for ms, before, after in breakdown["longest_gaps"] if before and after]
                assert len(gaps) == 3 and gaps == sorted(gaps, reverse=True) and gaps[-1] > 0
                key = next(k for k, c in tp_layer.KEYS.items() if c == contender)
                assert (tmp_path / f"trace-d64-b2-s16-{key}-{step}-rank{rank}.json").is_file()
        # Needing CUDA, or C++ builds too slow for a smoke test, is said, not hidden.
        assert results[step, tp_layer.ASYNC_TP]["status"].startswith("unavailable: async-TP needs CUDA")
        assert results[step, tp_layer.HOSTIR_CUDA]["status"].startswith("unavailable: the copy engines")
        assert results[step, tp_layer.HOSTIR_AUTO]["status"].startswith("unavailable: on CPU ranks auto")
        assert results[step, tp_layer.INDUCTOR]["status"] == tp_layer.CPU_INDUCTOR_SKIP
    # Every parameter's gradient is checked, and the input's.
    parameters = [name for name, _ in DecoderLayer().named_parameters()]
    assert set(results["train", tp_layer.HOSTIR]["errors"]) == {
        "output", "input gradient", *(f"{name} gradient" for name in parameters)
    }
    assert set(results["forward", tp_layer.HOSTIR]["errors"]) == {"output"}

    table = (tmp_path / "tp_layer.md").read_text()
    assert table in completed.stdout
    assert "| dim 64, 2 x 16 tokens |" in table and "WRONG" not in table
    assert tp_layer.CPU_INDUCTOR_SKIP in table and "unavailable: the copy engines are CUDA's" in table
    for title in tp_layer.STEPS.values():
        assert f"### {title}, each from an idle GPU (median ms, ratio to the limit)" in table
        assert f"### {title}, back to back, as a training loop runs them (median ms, ratio to the limit)" in table
        assert f"### Where the time goes: {title}, dim 64, 2 x 16 tokens (ms)" in table
    assert "| hostir (nccl), 1 |" in table
    assert "- hostir (nccl), rank 0, longest idle gaps: " in table
    assert (tmp_path / "tp_layer.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "whole, module_guards, rotary",
    [(False, True, False), (True, True, False), (True, False, False), (False, True, True)],
    ids=["one_by_one", "whole", "whole_unguarded", "one_by_one_rotary"],
)
def test_smoke_run_of_a_stack_of_layers_checks_each_layers_gradients(tmp_path, whole, module_guards, rotary):
    """`--layers 2`: a stack of two layers, each compiled on its own, which share hostir's
    graphs, or (`--whole`) compiled whole, one graph each way, and so without dynamo's
    guards on the modules (`--skip-module-guards`), or with rotary embeddings in complex
    numbers (`--rotary`); the gradients of both layers' parameters are checked against
    eager DTensor."""
    options = [
        "--layers=2",
        *(["--whole"] if whole else []),
        *([] if module_guards else ["--skip-module-guards"]),
        *(["--rotary"] if rotary else []),
        "--contenders=hostir",
        "--warmup=1",
        "--reps=2",
    ]
    _, document = _smoke_run(tmp_path, *options)
    hostir = {r["step"]: r for r in document["results"] if r["contender"] == tp_layer.HOSTIR}
    parameters = [f"{layer}.{name}" for layer in (0, 1) for name, _ in DecoderLayer().named_parameters()]
    assert set(hostir["train"]["errors"]) == {"output", "input gradient", *(f"{name} gradient" for name in parameters)}
    assert all(r["status"] == "ok" and r["check_ok"] for r in hostir.values())
    compiled = "whole" if whole else "one by one"
    guards = "" if module_guards else ", no module guards"
    label = f"dim 64, 2 x 16 tokens{', rotary' if rotary else ''}, 2 layers compiled {compiled}{guards}"
    assert f"| {label} |" in (tmp_path / "tp_layer.md").read_text()


class Scaled(torch.nn.Module):
    """A linear layer whose output is scaled by a plain attribute, which dynamo guards as the
    module's: a graph is compiled for one value of it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


@pytest.mark.parametrize("module_guards", [True, False], ids=["guarded", "skipped"])
def test_without_module_guards_a_changed_module_attribute_is_not_seen(module_guards):
    """What `--skip-module-guards` trades for host time: with the modules' guards, a changed
    attribute recompiles the graph; without them, the graph compiled before keeps running
    with the old value."""
    torch._dynamo.reset()
    module = Scaled()
    compiled = tp_layer.wrap(tp_layer.HOSTIR, module, None, module_guards=module_guards)
    x = torch.randn(2, 4)
    before = compiled(x)
    torch.testing.assert_close(before, module.linear(x) * 2.0)
    module.scale = 3.0
    expected = module.linear(x) * (3.0 if module_guards else 2.0)
    torch.testing.assert_close(compiled(x), expected)
    torch._dynamo.reset()
    assert tp_layer.LayerSize(64, 2, 16, 16, module_guards=module_guards).label.endswith(
        "tokens" if module_guards else "tokens, no module guards"
    )


def test_hostir_auto_runs_where_it_differs_from_the_other_hostir_contenders():
    """`hostir (auto)` is the copy engines throughout on 2 GPUs (`hostir (cuda)`), the process
    group on CPU ranks (`hostir (nccl)`), and on more GPUs the copy engines with NCCL's
    reductions, measured by no other contender."""
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert tp_layer.unavailable_reason(tp_layer.HOSTIR_AUTO, gpu, 2).startswith("skipped: on 2 GPUs")
    assert tp_layer.unavailable_reason(tp_layer.HOSTIR_AUTO, cpu, 4).startswith("unavailable: on CPU ranks")
    assert tp_layer.unavailable_reason(tp_layer.HOSTIR_AUTO, gpu, 4) is None
    assert tp_layer.unavailable_reason(tp_layer.HOSTIR_CUDA, gpu, 4) is None


def test_a_hostir_contender_whose_graph_ran_eagerly_fails():
    """What the smoke run relies on: a graph that the backend compiled to None (hostir's
    fallback to torch eager ops) fails the contender, and so does a contender that compiled
    no graph at all."""
    ran, fell_back = (SimpleNamespace(name=name, compiled={(): compiled}) for name, compiled in (("forward_1", object()), ("backward_2", None)))
    tp_layer.check_ran_on_hostir([ran])
    with pytest.raises(RuntimeError, match="hostir ran graph.s. backward_2 as torch eager ops"):
        tp_layer.check_ran_on_hostir([ran, fell_back])
    with pytest.raises(RuntimeError, match="hostir compiled no graph"):
        tp_layer.check_ran_on_hostir([])


class MatmulsAndAttention(TorchDispatchMode):
    """Counts the matmul and attention calls by their operands' shapes."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if name in ("mm", "bmm", "addmm") or "scaled_dot_product" in name:
            self.calls[name, tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))] += 1
        return func(*args, **(kwargs or {}))


SIZE = tp_layer.LayerSize(64, 2, 16, head_dim=16)


def _layer_steps() -> dict[str, collections.Counter]:
    """The unsharded layer's matmuls and attention, forward and training step."""
    layer = DecoderLayer(SIZE.dim, SIZE.heads, SIZE.hidden)
    x = torch.randn(SIZE.batch, SIZE.sequence, SIZE.dim, requires_grad=True)
    counted = {}
    with MatmulsAndAttention() as forward, torch.no_grad():
        layer(x)
    with MatmulsAndAttention() as train:
        layer(x).backward(torch.randn_like(x))
    counted["forward"], counted["train"] = forward.calls, train.calls
    return counted


def test_the_limit_of_one_rank_runs_the_layers_matmuls_and_attention():
    limit = tp_layer.Limit.of(SIZE, 1, torch.float32, torch.device("cpu"))
    with MatmulsAndAttention() as forward:
        limit.forward_step()
    with MatmulsAndAttention() as train:
        limit.train_step()
    expected = _layer_steps()
    assert forward.calls == expected["forward"]
    assert train.calls == expected["train"]
    assert sum(n for (name, _), n in train.calls.items() if name == "mm") == 7 * 3


def test_the_limit_of_a_stack_of_layers_runs_each_layers_work():
    one = tp_layer.Limit.of(SIZE, 1, torch.float32, torch.device("cpu"))
    three = tp_layer.Limit.of(replace(SIZE, layers=3), 1, torch.float32, torch.device("cpu"))
    for step in ("forward_step", "train_step"):
        with MatmulsAndAttention() as once:
            getattr(one, step)()
        with MatmulsAndAttention() as thrice:
            getattr(three, step)()
        assert thrice.calls == collections.Counter({call: 3 * n for call, n in once.calls.items()})


@pytest.mark.parametrize("world", [2, 4])
def test_the_limit_at_d_ranks_is_one_rank_share_of_the_work(world):
    """D ranks' limits together multiply as much as the whole layer; attention over heads/D heads."""
    layer = DecoderLayer(SIZE.dim, SIZE.heads, SIZE.hidden)
    x = torch.randn(SIZE.batch, SIZE.sequence, SIZE.dim, requires_grad=True)
    limit = tp_layer.Limit.of(SIZE, world, torch.float32, torch.device("cpu"))
    for run_layer, run_limit in [
        (lambda: layer(x.detach()), limit.forward_step),
        (lambda: layer(x).backward(torch.randn_like(x)), limit.train_step),
    ]:
        with FlopCounterMode(display=False) as whole:
            run_layer()
        with FlopCounterMode(display=False) as share, MatmulsAndAttention() as calls:
            run_limit()
        assert whole.get_total_flops() > 0
        assert share.get_total_flops() * world == whole.get_total_flops()
        attention = [shapes for (name, shapes) in calls.calls if "scaled_dot_product" in name]
        heads = (SIZE.batch, SIZE.heads // world, SIZE.sequence, SIZE.head_dim)
        assert attention and all(shapes[:3] == (heads,) * 3 for shapes in attention)


def _result(
    contender: str, step: str, ms: float | None, error: float = 0.0, status: str = "ok", loop_ms: float | None = None
) -> tp_layer.Result:
    errors = {"output": error} if ms is not None and contender != tp_layer.LIMIT else {}
    result = tp_layer.Result(SIZE, step, contender, status, ms, [ms] if ms else [], errors, 1e-4)
    result.loop_ms, result.loop_rank_ms = loop_ms, [loop_ms] if loop_ms else []
    return result


def test_the_table_marks_wrong_results_and_notes_why_a_contender_did_not_run():
    results = [
        result
        for step in tp_layer.STEPS
        for result in (
            _result(tp_layer.EAGER, step, 4.0),
            _result(tp_layer.HOSTIR, step, 3.0, error=0.5),
            _result(tp_layer.HOSTIR_CUDA, step, None, status="failed: RuntimeError: out of copy engines"),
            _result(tp_layer.LIMIT, step, 2.0),
        )
    ]
    info = {"ranks": 2, "backend": "gloo", "torch": torch.__version__}
    text = tp_layer.tables(results, info, {"dtype": "float32", "reps": 20, "warmup": 3}, "python tp_layer.py")
    assert "| dim 64, 2 x 16 tokens | 4.000 (2.00x) | 3.000 (1.50x) WRONG | failed [1] | 2.000 |" in text
    assert "| dim 64, 2 x 16 tokens | train | 0.0e+00 ok | 5.0e-01 WRONG | failed [1] |" in text
    assert "[1] failed: RuntimeError: out of copy engines" in text
    assert "back to back, as a training loop" not in text  # none measured
    assert tp_layer.exit_status(results) == 1
    good = [r for r in results if r.contender in (tp_layer.EAGER, tp_layer.LIMIT)]
    assert tp_layer.exit_status(good) == 0


def test_the_steps_back_to_back_have_a_table_of_their_own():
    results = [
        result
        for step in tp_layer.STEPS
        for result in (
            _result(tp_layer.EAGER, step, 4.0, loop_ms=3.0),
            _result(tp_layer.HOSTIR, step, 3.0, loop_ms=2.5),
            _result(tp_layer.LIMIT, step, 2.0, loop_ms=2.0),
        )
    ]
    info = {"ranks": 2, "backend": "gloo", "torch": torch.__version__}
    text = tp_layer.tables(results, info, {"dtype": "float32", "reps": 20, "warmup": 3}, "python tp_layer.py")
    idle, loop = (
        text.split(f"### Forward, {how}")[1].split("###")[0] for how in ("each from an idle GPU", "back to back")
    )
    assert "| dim 64, 2 x 16 tokens | 4.000 (2.00x) | 3.000 (1.50x) | 2.000 |" in idle
    assert "| dim 64, 2 x 16 tokens | 3.000 (1.50x) | 2.500 (1.25x) | 2.000 |" in loop


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "64,2"], "size '64,2': write DIM,BATCH,SEQUENCE"),
        (["--contenders", "eager,async_tp"], "unknown contender(s) ['async_tp']"),
        (["--sizes", "64,2,15", "--head-dim", "16", "--nproc", "2"], "size 64,2,15 (head dim 16): sequence 15 is not a multiple of the 2 ranks"),
        (["--sizes", "64,2,16", "--head-dim", "32", "--nproc", "4"], "heads 2 is not a multiple of the 4 ranks"),
        (["--sizes", "60,2,16", "--head-dim", "16", "--nproc", "2"], "dim is not a multiple of the head dim"),
    ],
)
def test_bad_arguments_exit_with_a_message_before_any_rank_starts(argv, message, capsys):
    # Not --smoke, which hides the GPUs from the process that runs it.
    with pytest.raises(SystemExit) as exited:
        tp_layer.main(argv)
    assert exited.value.code != 0
    assert message in capsys.readouterr().err + str(exited.value.code)


def test_a_stack_is_compiled_layer_by_layer_or_whole():
    """`wrap` compiles each layer of a stack on its own, as torchtitan does, or (`--whole`)
    the stack itself, as `torch.compile(model)` does."""
    stack = torch.nn.Sequential(DecoderLayer(), DecoderLayer())
    assert tp_layer.wrap(tp_layer.HOSTIR, stack, None) is stack
    assert all(layer._compiled_call_impl is not None for layer in stack)
    whole = tp_layer.wrap(tp_layer.HOSTIR, torch.nn.Sequential(DecoderLayer(), DecoderLayer()), None, whole=True)
    assert isinstance(whole, torch._dynamo.eval_frame.OptimizedModule)
