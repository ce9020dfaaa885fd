"""Fixtures shared by the pytest suites, and how the suite spreads over pytest-xdist's workers."""

import os
from collections.abc import Callable

import pytest
import torch
from hypothesis import Phase, settings
from xdsl.ir import Operation

from hostir_dialect.text import parse_module, print_module

# Hypothesis (test_fuzz.py, test_compiled_functions.py, ...): CI's short search, a long one
# for a night, `pytest test/py/test_fuzz.py --hypothesis-profile=long`, and one between
# them that fits a few minutes on a GPU machine (`--hypothesis-profile=search`). No
# example database and no explain phase (which reruns a failure a hundred times): a
# failure prints the shrunk example that reproduces it. CI's examples are derandomized,
# the same on every run: a failure there is the change's, not the draw's; the other
# profiles draw new ones.
_PHASES = [Phase.explicit, Phase.generate, Phase.target, Phase.shrink]
settings.register_profile("ci", max_examples=30, deadline=None, database=None, phases=_PHASES, derandomize=True)
settings.register_profile("long", max_examples=3000, deadline=None, database=None, phases=_PHASES)
settings.register_profile("search", max_examples=300, deadline=None, database=None, phases=_PHASES)
settings.load_profile("ci")

# The suite runs in `-n auto` worker processes that share the cores, and many tests spawn
# ranks: one thread per process, as torchrun gives each of its ranks, rather than one per
# core in every process. Set before any test module imports torch; the ranks inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")


SHARED_PER_PROCESS = {
    "test_e2e.py": "every case of a world runs in one launch of its ranks (results_of_world)",
    "test_copy_engine.py": "every case of a world runs in one launch of its ranks (results_of_world)",
    "test_context_parallel.py": "every case of a world runs in one launch of its ranks (results_of_world)",
    "test_attention_ring.py": "every case of a world runs in one launch of its ranks (results_of_world)",
    "test_benchmarks.py": "one run of the overlap benchmark on CPU ranks serves several tests (cpu_run)",
    "test_trace.py": "one traced hir-run serves several tests (traced_ag_linear)",
}
"""Modules whose tests share work done once per process, and what it is. Under pytest-xdist
(`--dist loadgroup`) each of them runs on one worker, which does that work once."""


def pytest_configure(config: pytest.Config) -> None:
    """In a process that runs tests (not xdist's controller, which runs none)."""
    if config.getoption("numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        return
    _rotate_gpus(os.environ.get("PYTEST_XDIST_WORKER"))


def _rotate_gpus(worker: str | None) -> None:
    """On a GPU machine (HOSTIR_TEST_GPUS, set by test/gpu/run_gpu_suite.sh): worker gwN sees
    the GPUs rotated by N, so that its rank 0, and its own CUDA work, land on GPU N mod the
    count. Every rank 0 on one GPU ran it out of memory first, which bounded the workers a
    machine could run by one GPU's memory where all of them have some. Set before CUDA is
    initialised (the forkserver and the ranks inherit it); an explicit CUDA_VISIBLE_DEVICES wins."""
    count = int(os.environ.get("HOSTIR_TEST_GPUS", "0"))
    if count < 2 or worker is None or "CUDA_VISIBLE_DEVICES" in os.environ:
        return
    first = int(worker.removeprefix("gw")) % count
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str((first + i) % count) for i in range(count))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `--dist loadgroup`: xdist's load scheduling, each module of SHARED_PER_PROCESS one
    unit of work, sent to one worker whole, every other test a unit of its own.

    xdist's own loadgroup scheduler reads `xdist_group` marks from suffixes it writes into
    the node ids, which pytest 9.2 no longer lets it change (pytest-dev/pytest-xdist#1386):
    every test became a unit of its own, and each worker did the shared work again."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedModulesScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if os.path.basename(module) in SHARED_PER_PROCESS else nodeid

    return SharedModulesScheduling(config, log)


def _check_round_trip(module: Operation | str) -> str:
    """Checks that print is a fixed point of parse-then-print; returns the custom text.

    Custom: print(parse(print(m))) == print(m). Generic: the same with the generic
    printer. And the generic text parses back to the custom text.
    """
    if isinstance(module, str):
        module = parse_module(module)
    custom = print_module(module)
    generic = print_module(module, generic=True)
    assert print_module(parse_module(custom)) == custom
    assert print_module(parse_module(generic), generic=True) == generic
    assert print_module(parse_module(generic)) == custom
    return custom


@pytest.fixture
def assert_round_trips() -> Callable[[Operation | str], str]:
    """`assert_round_trips(module_or_text)`: see `_check_round_trip`."""
    return _check_round_trip


@pytest.fixture(params=["cpu", "cuda"], ids=["cpu_emulated", "cuda"])
def replay_device(request, monkeypatch):
    """The device a `GraphReplayer` replays on: a GPU (skipped without one), or the CPU with
    CUDA graphs emulated (`emulated_graphs.py`), which CI runs. Captured graphs are freed
    after the test."""
    from hostir.runtime.graphs import release_captured_graphs

    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a GPU: CUDA graphs")
        device = torch.device("cuda", 0)
    else:
        from emulated_graphs import emulate_cuda_graphs

        emulate_cuda_graphs(monkeypatch)
        device = torch.device("cpu")
    yield device
    release_captured_graphs()
