"""The one-GPU kernel benchmarks (benchmarks/pointwise_segment.py, rmsnorm_segment.py,
piece_reductions.py) at small sizes: on a GPU each checks its ways against each other
before timing them and prints a row per way; without one, each says that it needs a GPU
and exits with status 1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

COMMAND_TIMEOUT_S = 300
"""torch.compile of a segment (the first two scripts' inductor way) takes tens of seconds."""

SMALL = {
    "pointwise_segment.py": ["--elements", str(1 << 20), "--repeats", "20"],
    "rmsnorm_segment.py": ["--rows", "256", "--columns", "512", "1024", "--repeats", "20"],
    "piece_reductions.py": ["--members", "2,3,4", "--rows", "64,128", "--cols", "512", "--repeats", "5"],
}

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the benchmarks time GPU kernels")


def run(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(BENCHMARKS / script), *SMALL[script]]
    return subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, env=env)


@pytest.mark.parametrize("script", sorted(SMALL))
def test_without_a_gpu_a_kernel_benchmark_says_it_needs_one(script):
    completed = run(script, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "needs a CUDA GPU" in completed.stderr and "Traceback" not in completed.stderr, completed.stderr


@needs_gpu
def test_pointwise_segment_times_its_four_ways():
    completed = run("pointwise_segment.py")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = re.findall(r"^(.+?) +([\d.]+) +(\d+) +(\d+)%$", completed.stdout, re.M)
    methods = [method.strip() for method, *_ in rows]
    assert methods == ["device-to-device copy", "fused kernel (hostir)", "torch eager", "torch.compile"], completed.stdout
    assert all(float(ms) > 0 for _, ms, _, _ in rows), completed.stdout


@needs_gpu
def test_rmsnorm_segment_times_each_pass_three_ways_per_row_length():
    completed = run("rmsnorm_segment.py")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = re.findall(r"^ +(\d+)  (forward|backward) +(.+?) +([\d.]+) +(\d+)$", completed.stdout, re.M)
    assert {(int(columns), step) for columns, step, *_ in rows} == {
        (columns, step) for columns in (512, 1024) for step in ("forward", "backward")
    }, completed.stdout
    assert len(rows) == 2 * 2 * 3 and all(float(ms) > 0 for *_, ms, _ in rows), completed.stdout


@needs_gpu
def test_piece_reductions_give_the_same_bits_every_way():
    completed = run("piece_reductions.py")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = re.findall(r"^ +(\d+) +(\d+) x (\d+) .* (True|False)$", completed.stdout, re.M)
    assert {(int(m), int(r)) for m, r, _, _ in rows} == {(m, r) for m in (2, 3, 4) for r in (64, 128)}, completed.stdout
    assert all(same == "True" for *_, same in rows), completed.stdout
    pairwise = [line for line in completed.stdout.splitlines() if re.match(r"^ +2 ", line)]
    assert all(line.count(" us") == 3 for line in pairwise), completed.stdout
