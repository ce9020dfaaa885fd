"""The overlap benchmark (benchmarks/overlap.py) on CPU ranks: the same code paths as on GPUs,
with gloo and host timers, at tiny sizes.

One run at world 2 produces the table, the JSON and the PNG, with every hostir program and
every peer checked against plain torch; the measurements' agreement across ranks is
tested on its own: a contender that fails on one rank fails on all and the run goes on,
and outputs that are wrong or never written fail their check.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hostir.passes.analysis.cost_model import (
    MeasuredStages,
    OverlapKind,
    OverlapProblem,
    Rates,
    Stages,
    StageTimes,
    choose_pipeline,
)
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.launch import run_on_local_ranks
from test_communicator import needs_ranks

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import overlap  # noqa: E402  (a script's folder, not a package)
import overlap_peers  # noqa: E402
from overlap_report import Result  # noqa: E402

COMMAND_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("overlap")
    command = [
        sys.executable,
        str(BENCHMARKS / "overlap.py"),
        "--cpu",
        "--nproc=2",
        "--sizes=64,32,16;36,32,16",
        "--chunks=1,2,4",
        "--warmup=1",
        "--reps=3",
        "--check-peers",
        f"--out={out}",
        "--timeout=30",
        "--deadline=100",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == 0, completed.stderr
    return completed, out


def results_of(out: Path) -> list[dict]:
    return json.loads((out / "overlap.json").read_text())["results"]


def test_the_json_holds_the_machine_and_every_contender(cpu_run):
    _, out = cpu_run
    document = json.loads((out / "overlap.json").read_text())
    assert document["machine"]["ranks"] == 2 and document["machine"]["backend"] == "gloo"
    assert document["machine"]["torch"] == torch.__version__
    assert document["config"]["chunks"] == [1, 2, 4]
    labels = {(r["problem"], r["m"], r["label"]) for r in document["results"]}
    for problem, collective, sequence in [
        ("allgather_matmul", "allgather", "AG then GEMM"),
        ("matmul_reduce_scatter", "reduce_scatter", "GEMM then reduce_scatter"),
        ("matmul_allreduce", "allreduce", "GEMM then allreduce"),
    ]:
        for m in (64, 36):
            expected = {"GEMM alone", f"{collective} alone", "limit", sequence, "symm_mem fused"}
            expected |= {f"{name} S={s}" for name in ("NCCL per chunk", "hostir (nccl)") for s in (1, 2, 4)}
            assert expected <= {label for p, size, label in labels if (p, size) == (problem, m)}
    assert ("allgather_matmul", 64, "hostir p2p (nccl) S=2") in labels


def test_every_hostir_program_and_peer_ran_and_passed_its_check(cpu_run):
    _, out = cpu_run
    results = results_of(out)
    timed = [r for r in results if r["status"] == "ok" and r["label"] != "limit"]
    assert all(r["ms"] > 0 and len(r["times_ms"]) == 3 and r["host_ms"] > 0 for r in timed)
    checked = [r for r in timed if "alone" not in r["label"]]
    assert len(checked) >= 30
    assert all(r["check_error"] is not None and r["check_ok"] for r in checked)
    for r in results:
        if r["label"] == "limit" and r["status"] == "ok":
            alone = [
                a["ms"]
                for a in results
                if (a["problem"], a["m"]) == (r["problem"], r["m"]) and "alone" in a["label"]
            ]
            assert r["ms"] == max(alone)


def test_what_cannot_run_says_why(cpu_run):
    _, out = cpu_run
    by_label = {(r["problem"], r["m"], r["label"]): r for r in results_of(out)}
    assert by_label[("allgather_matmul", 64, "symm_mem fused")]["status"] == (
        "unavailable: torch's symmetric memory needs CUDA"
    )
    # 36 rows over 2 ranks: 18 per rank, which 4 chunks do not divide (the allreduce chunks all 36).
    assert by_label[("matmul_reduce_scatter", 36, "hostir (nccl) S=4")]["status"] == (
        "skipped: 4 chunks do not divide the 18 rows of a rank"
    )
    assert by_label[("matmul_allreduce", 36, "hostir (nccl) S=4")]["status"] == "ok"
    copy_engine = by_label[("allgather_matmul", 64, "hostir p2p (cuda) S=2")]
    assert copy_engine["status"] == "ok" and copy_engine["check_ok"]


@pytest.mark.parametrize(
    "problem,m,chunks,name",
    list(
        itertools.product(
            ("allgather_matmul", "matmul_reduce_scatter", "matmul_allreduce"),
            (64, 36),
            (1, 2, 4),
            overlap.COPY_ENGINE_PIPELINES,
        )
    ),
)
def test_the_copy_engine_pipelines_of_every_problem_ran_and_passed_their_check(cpu_run, problem, m, chunks, name):
    """`hostir (cuda) S=s` and `hostir (cuda, pool streams) S=s`: AG+GEMM, GEMM+RS and GEMM+AR
    lowered with hir-lowering{backend=cuda}, software-pipelined or not."""
    _, out = cpu_run
    by_label = {(r["problem"], r["m"], r["label"]): r for r in results_of(out)}
    result = by_label[(problem, m, f"{name} S={chunks}")]
    if (problem, m, chunks) in {("allgather_matmul", 36, 4), ("matmul_reduce_scatter", 36, 4)}:
        # 18 rows of a rank that 4 chunks do not divide, as for every contender.
        assert result["status"].startswith("skipped"), result["status"]
    else:
        assert result["status"] == "ok", result["status"]
        assert result["check_ok"] and result["check_error"] is not None


def test_the_ag_gemm_programs_with_x_in_symmetric_memory_ran_and_passed_their_check(cpu_run):
    """`hostir (cuda, symmetric X)` and `hostir p2p (cuda, symmetric X)`: X passed in symmetric
    memory (`hir.symmetric`), read in place by the copy engines."""
    _, out = cpu_run
    by_label = {(r["problem"], r["m"], r["label"]): r for r in results_of(out)}
    for label in ("hostir (cuda, symmetric X) S=2", "hostir p2p (cuda, symmetric X) S=2"):
        result = by_label[("allgather_matmul", 64, label)]
        assert result["status"] == "ok" and result["check_ok"], f"{label}: {result['status']}"


def test_gemm_rs_and_ar_with_their_reduction_in_a_pass_of_its_own_ran_and_passed_their_check(cpu_run):
    """`hostir (cuda, separate reduction)`: GEMM+RS lowered without reduce-scatter-in-matmul,
    GEMM+AR without allreduce-in-matmul."""
    _, out = cpu_run
    by_label = {(r["problem"], r["m"], r["label"]): r for r in results_of(out)}
    for problem, chunks in itertools.product(("matmul_reduce_scatter", "matmul_allreduce"), (1, 2, 4)):
        result = by_label[(problem, 64, f"hostir (cuda, separate reduction) S={chunks}")]
        assert result["status"] == "ok" and result["check_ok"], f"{problem}, S={chunks}: {result['status']}"


def test_the_table_and_the_plot(cpu_run):
    completed, out = cpu_run
    table = (out / "overlap.md").read_text()
    assert table in completed.stdout
    for title in ("AG+GEMM", "GEMM+RS", "GEMM+AR"):
        assert f"### {title}" in table
    assert "| M, K, N | GEMM alone | allgather alone | limit | AG then GEMM |" in table
    assert "| 64, 32, 16 |" in table and "| 36, 32, 16 |" in table
    image = pytest.importorskip("PIL.Image").open(out / "overlap.png")
    assert image.format == "PNG" and image.size[0] > 1000 and image.size[1] > 300


def test_on_four_cpu_ranks_every_contender_runs_and_every_check_passes(tmp_path):
    """The benchmark at 4 ranks, as on 4 GPUs: the point-to-point AG+GEMM in 4 chunks, the
    copy-engine GEMM+AR, whose allreduce of 4 members runs in two phases, and the
    copy-engine GEMM+RS, a ring of destinations (modelled in that form) or, with
    reduce-scatter-ring left out, the reduce-scatter of each chunk's whole product."""
    command = [
        sys.executable,
        str(BENCHMARKS / "overlap.py"),
        "--cpu",
        "--nproc=4",
        "--sizes=64,32,16",
        "--chunks=1,2",
        "--warmup=0",
        "--reps=2",
        "--check-peers",
        f"--out={tmp_path}",
        "--timeout=30",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == 0, completed.stderr
    results = results_of(tmp_path)
    checked = [r for r in results if r["status"] == "ok" and r["check_error"] is not None]
    assert len(checked) >= 30 and all(r["check_ok"] for r in checked)
    statuses = {(r["problem"], r["label"]): r["status"] for r in results}
    for label in ("hostir (cuda) S=1", "hostir (cuda) S=2", "hostir (cuda, pool streams) S=2"):
        assert statuses[("matmul_allreduce", label)] == "ok"
    assert statuses[("allgather_matmul", "hostir p2p (cuda) S=4")] == "ok"
    for label in ("hostir (cuda) S=1", "hostir (cuda) S=2", "hostir (cuda, separate reduction) S=2"):
        assert statuses[("matmul_reduce_scatter", label)] == "ok"
    assert re.search(r"matmul_reduce_scatter .* stages \(ring of destinations\) S=2", completed.stdout)
    predicted = {
        r["label"]: r["predicted_ms"] for r in results if r["problem"] == "matmul_reduce_scatter" and r["m"] == 64
    }
    assert predicted["hostir (cuda) S=2"] != predicted["hostir (cuda, separate reduction) S=2"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL)")
def test_on_two_gpus_every_contender_runs_and_every_check_passes(tmp_path):
    command = [
        sys.executable,
        str(BENCHMARKS / "overlap.py"),
        "--nproc=2",
        "--sizes=2048,512,256;1024,256,512",
        "--chunks=1,4",
        "--warmup=2",
        "--reps=5",
        "--check-peers",
        f"--out={tmp_path}",
        "--timeout=60",
        "--deadline=200",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    results = results_of(tmp_path)
    assert json.loads((tmp_path / "overlap.json").read_text())["machine"]["backend"] == "nccl"
    for r in results:
        if r["label"].startswith("symm_mem") and r["status"] != "ok":
            assert r["status"].startswith("unavailable: ")  # torch says why
        else:
            assert r["status"] == "ok", r
            assert r["ms"] > 0 and r["check_ok"] in (True, None)
    for contender in ("hostir (nccl)", "hostir (cuda)"):
        # Three problems at two sizes, each with 4 chunks.
        pipelined = [r for r in results if r["contender"] == contender and r["chunks"] == 4]
        assert len(pipelined) == 6 and all(r["check_ok"] for r in pipelined), contender


@pytest.mark.parametrize("model", ["rates", "measured"])
def test_without_chunks_the_cost_model_chooses_from_the_times_just_measured(model, tmp_path):
    command = [
        sys.executable,
        str(BENCHMARKS / "overlap.py"),
        "--cpu",
        "--nproc=2",
        "--sizes=64,32,16",
        "--problems=matmul_allreduce,matmul_reduce_scatter",
        "--min-chunk-rows=4",
        "--warmup=0",
        "--reps=2",
        f"--model={model}",
        f"--out={tmp_path}",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == 0, completed.stderr
    by_label = {(r["problem"], r["contender"]): r for r in results_of(tmp_path)}
    stages = json.loads((tmp_path / "overlap.json").read_text())["stages"]

    def model_for(kind: OverlapKind, alone: str, **form) -> tuple[OverlapProblem, StageTimes]:
        problem = OverlapProblem(kind, 64, 32, 16, 2, **form)
        if model == "measured":  # the stages the run measured for this form, as it printed them
            measured = {
                s["chunks"]: Stages(s["gemm_ms"] / 1e3, s["transfer_ms"] / 1e3, s["together_ms"] / 1e3)
                for s in stages
                if (s["kind"], s["reduction_in_matmul"]) == (kind, problem.reduction_in_matmul)
            }
            assert 1 in measured and len(measured) > 1, stages
            return problem, MeasuredStages(problem, measured)
        rates = Rates.from_times(
            problem,
            by_label[kind, f"{alone} alone"]["ms"] / 1e3,
            by_label[kind, "GEMM alone"]["ms"] / 1e3,
            transfer_latency_s=20e-6,
        )
        return problem, rates

    ar, rs = OverlapKind.MATMUL_ALLREDUCE, OverlapKind.MATMUL_REDUCE_SCATTER
    # Each program in the form its lowering gave it: copy-engine GEMM+RS and GEMM+AR on two
    # ranks with their reduction in the GEMM, unless the pipeline leaves that pass out.
    expected_forms = {
        (ar, "NCCL per chunk"): model_for(ar, "allreduce"),
        (ar, "hostir (nccl)"): model_for(ar, "allreduce"),
        (ar, "hostir (cuda, separate reduction)"): model_for(ar, "allreduce"),
        (ar, "hostir (cuda)"): model_for(ar, "allreduce", reduction_in_matmul=True),
        (rs, "hostir (nccl)"): model_for(rs, "reduce_scatter"),
        (rs, "hostir (cuda, separate reduction)"): model_for(rs, "reduce_scatter"),
        (rs, "hostir (cuda)"): model_for(rs, "reduce_scatter", reduction_in_matmul=True),
    }
    for contender, (problem, rates) in expected_forms.items():
        chosen = choose_pipeline(problem, rates, min_chunk_rows=4)
        result = by_label[contender]
        assert result["status"] == "ok", contender
        assert (result["chunks"], result["streams"]) == (chosen.chunks, chosen.streams), contender
        assert result["predicted_ms"] == pytest.approx(chosen.predicted_s * 1e3, rel=1e-6), contender
    assert "The cost model: predicted against measured" in (tmp_path / "overlap.md").read_text()
    assert by_label[ar, "hostir (nccl)"]["check_ok"] and by_label[ar, "NCCL per chunk"]["check_ok"] is None
    assert by_label[rs, "hostir (cuda)"]["check_ok"] and by_label[ar, "hostir (cuda)"]["check_ok"]


@pytest.mark.parametrize(
    "bad, message", [("--sizes=64,32", "expected sizes as 'M,K,N;M,K,N;...'"), ("--chunks=0", "positive")]
)
def test_bad_arguments_are_refused_before_any_rank_starts(bad, message, capsys, monkeypatch):
    def no_ranks(*_, **__):
        raise AssertionError("ranks started")

    monkeypatch.setattr(overlap, "run_on_local_ranks", no_ranks)
    with pytest.raises(SystemExit) as exited:
        overlap.main(["--cpu", bad])
    assert exited.value.code == 2 and message in capsys.readouterr().err


# --------------------------------------------------------------------------- #
# Agreement across ranks                                                       #
# --------------------------------------------------------------------------- #


def measured_contenders() -> list[Result]:
    communicator = Communicator.from_env()
    arguments = overlap.parser().parse_args(["--warmup=0", "--reps=2"])
    bench = overlap.Bench(communicator, overlap.HostClock(), arguments, None)
    y = torch.arange(16.0).view(4, 4)

    def failing_on_rank_1():
        if communicator.rank == 1:
            raise RuntimeError("rank 1 broke")
        return (lambda: y), (lambda whole: whole)

    def right():
        return (lambda: y.clone()), (lambda whole: whole)

    def wrong_on_rank_0():
        return (lambda: y + (communicator.rank == 0)), (lambda whole: whole)

    def never_written():
        out = torch.empty(4, 4)
        return (lambda: out), (lambda whole: whole)

    builds = [failing_on_rank_1, right, wrong_on_rank_0, never_written]
    return [bench.measure(Result("p", 4, 4, 4, build.__name__), build, y, check=True) for build in builds]


def gemms_alone() -> tuple[torch.Tensor, torch.Tensor, dict[OverlapKind, torch.Tensor]]:
    communicator = Communicator.from_env()
    x, w = overlap.whole_operands(8, 4, 6, communicator.device, seed=0)
    products = {}
    for kind in OverlapKind:
        with overlap.poisoned_allocations():
            run, expected = overlap_peers.Peers(kind, x, w, communicator.rank, communicator.world_size).alone("gemm")()
        assert expected is None
        products[kind] = run().cpu()
    return x.cpu(), w.cpu(), products


@needs_ranks(2)
def test_the_gemm_alone_multiplies_the_problems_data():
    """Not the uninitialised gathered buffer, which a GEMM multiplies faster than random
    data: the AG+GEMM limit would be too low."""
    for rank, (x, w, products) in enumerate(run_on_local_ranks(gemms_alone, 2, timeout_s=60)):
        share = slice(rank * 2, (rank + 1) * 2)
        expected = {
            OverlapKind.ALLGATHER_MATMUL: x.view(2, 4, 4).double() @ w.double(),
            OverlapKind.MATMUL_REDUCE_SCATTER: x[:, share].double() @ w[share].double(),
            OverlapKind.MATMUL_ALLREDUCE: x[:, share].double() @ w[share].double(),
        }
        for kind, product in products.items():
            tolerance = 2e-2 * expected[kind].abs().max().item()
            torch.testing.assert_close(product.double(), expected[kind], rtol=0, atol=tolerance, msg=kind.name)


@needs_ranks(2)
def test_ranks_agree_on_failures_and_checks_and_the_run_goes_on():
    for failed, right, wrong, unwritten in run_on_local_ranks(measured_contenders, 2, timeout_s=60):
        assert failed.status == "failed: RuntimeError: rank 1 broke (rank 1)" and failed.ms is None
        assert right.status == "ok" and right.check_ok and len(right.times_ms) == 2 and right.ms > 0
        assert wrong.status == "ok" and wrong.check_ok is False and wrong.check_error == pytest.approx(1 / 15)
        assert unwritten.check_ok is False and unwritten.check_error == float("inf")
