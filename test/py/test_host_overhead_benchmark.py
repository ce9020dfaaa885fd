"""The host-time benchmark (benchmarks/host_overhead.py) as CI's smoke test: on 1 and 2 ranks (CPU
ranks in f32, or GPUs in bf16 where the machine has them, as the benchmark chooses),
every step's time from the call to the program's first op is stamped and split, torch's share
before hostir's, and torch's share is measured again with hostir's graphs returning at once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import host_overhead  # noqa: E402  (a script's folder, not a package)
from test_communicator import needs_ranks  # noqa: E402

COMMAND_TIMEOUT_S = 600
"""Two launches that each compile the layer's three graphs: tens of seconds on a loaded machine."""


def run_tables(*options: str) -> tuple[list[int], list[str], str]:
    """The benchmark's smoke run with `options`: the worlds it reports, their tables, its output."""
    command = [sys.executable, str(BENCHMARKS / "host_overhead.py"), "--warmup=2", "--reps=3", *options]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    tables = re.split(r"^(\d+) rank\(s\), ", completed.stdout, flags=re.M)[1:]
    return [int(world) for world in tables[0::2]], tables[1::2], completed.stdout


def check_table(table: str, model: str = "") -> None:
    """Every step's row of `table`, whose model is `model` (a stack's words after the tokens),
    holds shares that are spans between stamps the step passed, in order."""
    where = "cuda, bfloat16" if torch.cuda.is_available() else "cpu, float32"
    assert table.startswith(f"{where}, dim 64, 2 x 16 tokens{model} (us"), table
    rows = {
        match[1]: tuple(map(float, match.groups()[1:]))
        for match in re.finditer(r"^(forward|train forward|train backward)" + r" +([\d.]+)" * 8 + "$", table, re.M)
    }
    assert set(rows) == set(host_overhead.STEPS), table
    for step, row in rows.items():
        torch_us, hostir_us, total_us, torch_alone_us, step_alone_us, *warm = row
        for shares in ((torch_us, hostir_us, total_us), warm):
            assert shares[0] > 0 and shares[1] > 0, f"{step}: {table}"
            assert shares[2] >= max(shares[:2]), f"{step}: {table}"
        assert torch_alone_us > 0 and step_alone_us >= torch_alone_us, f"{step}: {table}"


@needs_ranks(2)
def test_smoke_run_splits_every_step_on_1_and_2_ranks():
    worlds, tables, output = run_tables()
    assert worlds == [1, 2], output
    for table in tables:
        check_table(table)


@pytest.mark.parametrize("per_layer", [False, True], ids=["whole", "per_layer"])
def test_a_stack_of_layers_compiled_whole_or_one_by_one_is_split_alike(per_layer):
    """Two layers in an `nn.Sequential`, compiled whole or layer by layer: the first graph call
    of each step is stamped and split as a layer's."""
    worlds, tables, output = run_tables("--nproc=1", "--layers=2", *(["--per-layer"] if per_layer else []))
    assert worlds == [1], output
    check_table(tables[0], f", 2 layers compiled {'one by one' if per_layer else 'whole'}")


def test_a_layer_compiled_without_module_guards_is_split_alike():
    """`--skip-module-guards`: the layer compiled with dynamo's guard filter that skips the
    modules' guards, its steps stamped and split as before, and the table says so."""
    worlds, tables, output = run_tables("--nproc=1", "--skip-module-guards")
    assert worlds == [1], output
    check_table(tables[0], ", no module guards")


def test_a_step_that_runs_no_hostir_program_is_an_error():
    stamps = host_overhead.Stamps(call=1, hostir=[5])
    with pytest.raises(RuntimeError, match="ran no op"):
        stamps.shares()
    assert host_overhead.Stamps(call=1_000, hostir=[3_000, 9_000], first=[7_000, 10_000]).shares() == (2.0, 4.0)
