"""Faults injected into `hir-run`'s local launch, as a job scheduler, a crash or a user sends them:
SIGTERM and SIGKILL to the launcher, SIGKILL and SIGSTOP to a rank, Ctrl-C at the terminal.

Each test starts `tools/hir-run.py` in a process group of its own, on 2 ranks that
allgather for as long as they are let, waits until a rank says (--progress) that it
runs, injects the fault, and asserts the exit status, how long the launcher took to
end after the fault, and that no process of the group is left (ranks, the
multiprocessing resource tracker). Whatever happens, the group is killed at the end.
/proc is read directly: the tests need no package to list processes.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from test_hir_run import SCRIPT, clean_environment

from examples.reference_fusions import ag_linear
from hostir_dialect.text import print_module
from hostir.runtime.launch import FAILURE_GRACE_S, STOP_GRACE_S, run_on_local_ranks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TIMEOUT_S = 2.0
"""The communication timeout of the runs (--timeout)."""
START_S = 120.0
"""How long the ranks may take to start running on a loaded machine."""
SLACK_S = 4.0
"""Time for the processes to notice and end, on top of each bound."""


def group_processes(group: int) -> dict[int, str]:
    """pid -> command line of every live (not zombie) process of the process group."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue  # ended while read
        state, _parent, process_group = stat.rsplit(")", 1)[1].split()[:3]
        if int(process_group) == group and state != "Z":
            found[int(entry.name)] = command
    return found


def _states(group: int) -> list[str]:
    """What each process of the group is doing: its command, state, kernel wait channel and
    signal masks (a SIGINT ignored or blocked there never reaches it)."""
    states = []
    for pid, command in group_processes(group).items():
        proc = Path("/proc") / str(pid)
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (proc / "wchan").read_text()
            masks = [line for line in (proc / "status").read_text().splitlines() if line.startswith(("SigBlk", "SigIgn"))]
        except OSError:
            continue  # ended while read
        states.append(f"{pid} [{state} {wchan} {masks}] {command[:120]}")
    return states


def ranks_of(launcher: int) -> list[int]:
    """The launcher's ranks: the children of its forkserver, the child of the launcher that
    forks them."""
    processes = group_processes(launcher)
    servers = {pid for pid, command in processes.items() if "forkserver" in command and _parent(pid) == launcher}
    return sorted(pid for pid in processes if _parent(pid) in servers)


def _parent(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def assert_nothing_left(group: int) -> None:
    deadline = time.monotonic() + SLACK_S
    while (left := group_processes(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"left behind: {left}"


@pytest.fixture(scope="module")
def fusion(tmp_path_factory) -> Path:
    """ag_linear on 2 devices: an allgather, then a linear layer."""
    path = tmp_path_factory.mktemp("faults") / "ag_linear.mlir"
    path.write_text(print_module(ag_linear(2)))
    return path


@contextmanager
def running_hir_run(fusion: Path) -> Iterator[subprocess.Popen]:
    """hir-run on 2 ranks in a process group of its own, once a rank says it runs; kills the
    group on the way out."""
    # As a terminal starts a job: SIGINT not ignored, whatever a library run in this
    # process earlier left (an ignored signal stays ignored across exec).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(fusion), "--nproc-per-node", "2", "--progress",
             "--timeout", f"{TIMEOUT_S:g}", "--repeat", "1000000000"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_environment(),
            start_new_session=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        _wait_for_a_run(process)
        yield process
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        for pid in group_processes(process.pid):
            os.kill(pid, signal.SIGKILL)


def _wait_for_a_run(process: subprocess.Popen) -> None:
    """Reads hir-run's stderr until a rank says it runs, for START_S at most."""
    deadline, said = time.monotonic() + START_S, b""
    while b": run " not in said:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the ranks did not start running: {said.decode()}"
        if select.select([process.stderr], [], [], remaining)[0]:
            chunk = os.read(process.stderr.fileno(), 4096)
            if not chunk:
                pytest.fail(f"hir-run ended before its ranks ran, with status {process.wait()}: {said.decode()}")
            said += chunk


def ended_within(process: subprocess.Popen, seconds: float) -> tuple[int, float, str]:
    """(exit status, seconds from now to the end, the rest of stderr); fails past `seconds`."""
    start = time.monotonic()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hir-run still runs {seconds:g} s after the fault; its processes: {_states(process.pid)}")
    return process.returncode, time.monotonic() - start, process.stderr.read()


def test_sigterm_to_the_launcher_stops_every_rank(fusion):
    """What a job scheduler sends: the launcher forwards it and ends by it."""
    with running_hir_run(fusion) as process:
        os.kill(process.pid, signal.SIGTERM)
        status, took, stderr = ended_within(process, STOP_GRACE_S + SLACK_S)
        assert status == -signal.SIGTERM, stderr
        assert "Traceback" not in stderr, stderr
        assert_nothing_left(process.pid)


def test_sigkill_to_the_launcher_leaves_no_orphan(fusion):
    """The launcher cannot act: its forkserver ends, as the launcher's end closes the pipe it
    reads; the ranks, its children, end by their parent-death signal; then the resource
    tracker, whose pipe the ranks held."""
    with running_hir_run(fusion) as process:
        ranks = ranks_of(process.pid)
        assert len(ranks) == 2, group_processes(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        status, _, _ = ended_within(process, SLACK_S)
        assert status == -signal.SIGKILL
        assert_nothing_left(process.pid)


def test_ctrl_c_stops_every_rank_and_says_so(fusion):
    """A terminal sends SIGINT to the whole foreground group, ranks included."""
    with running_hir_run(fusion) as process:
        os.killpg(process.pid, signal.SIGINT)
        status, _, stderr = ended_within(process, STOP_GRACE_S + SLACK_S)
        assert status == 128 + signal.SIGINT, stderr
        assert stderr.strip().endswith("interrupted; every rank stopped"), stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        assert_nothing_left(process.pid)


def test_a_killed_rank_fails_the_run_at_once(fusion):
    with running_hir_run(fusion) as process:
        os.kill(ranks_of(process.pid)[1], signal.SIGKILL)
        status, _, stderr = ended_within(process, FAILURE_GRACE_S + SLACK_S)
        assert status == 1, stderr
        assert "rank 1: ended by SIGKILL before returning a result" in stderr, stderr
        assert "Traceback" not in stderr, stderr
        assert_nothing_left(process.pid)


def test_a_stopped_rank_fails_the_run_within_the_timeout(fusion):
    """Rank 0 waits for the stopped rank 1 until the timeout and fails; the launcher then
    kills rank 1, which no timeout reaches."""
    with running_hir_run(fusion) as process:
        os.kill(ranks_of(process.pid)[1], signal.SIGSTOP)
        status, took, stderr = ended_within(process, TIMEOUT_S + FAILURE_GRACE_S + SLACK_S)
        assert status == 1, stderr
        assert took >= TIMEOUT_S, f"ended {took:.1f} s after the fault, before the {TIMEOUT_S:g} s timeout"
        assert f"rank 1: still running {FAILURE_GRACE_S:g} s after rank 0 failed; killed" in stderr, stderr
        assert "Traceback" not in stderr, stderr
        assert_nothing_left(process.pid)


def rank_environment() -> tuple[int, str, list[str]]:
    """This rank's torch threads, its OMP_NUM_THREADS, and the local addresses (hex, as
    /proc/net/tcp writes them) on which the launcher's sockets listen at the rendezvous
    store's port. Only the launcher's: another process of the machine (an NCCL bootstrap of
    a test running beside this one) may listen on the same port number at another address."""
    import multiprocessing

    import torch

    port = f"{int(os.environ['MASTER_PORT']):04X}"
    sockets = set()
    for fd in Path(f"/proc/{multiprocessing.parent_process().pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed since it was listed
            sockets.add(os.readlink(fd))
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            address, local_port = local.rsplit(":", 1)
            if local_port == port and state == "0A" and f"socket:[{inode}]" in sockets:  # TCP_LISTEN
                listening.append(address)
    return torch.get_num_threads(), os.environ["OMP_NUM_THREADS"], listening


def test_local_ranks_get_one_thread_and_a_store_on_loopback_only(monkeypatch):
    """The store listens whether the ranks join a group or not (here not, so that the test
    needs no GPU per rank)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for threads, variable, listening in run_on_local_ranks(rank_environment, 2, join_group=False):
        assert (threads, variable) == (1, "1")
        assert listening == ["0100007F"], "the store listens on 127.0.0.1 alone"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert [result[:2] for result in run_on_local_ranks(rank_environment, 2, join_group=False)] == [(2, "2")] * 2


IMPORTED_WITH = os.environ.get("HOSTIR_TEST_LAUNCH")
"""A variable as this module saw it when imported: in a rank, at the launch of its function."""


def variable_at_import() -> str | None:
    return IMPORTED_WITH


def test_ranks_import_the_function_in_the_launchers_environment(monkeypatch):
    """The forkserver's ranks start with the environment the server had when it started (before
    this test set the variable); they take on the launcher's before they import this module."""
    run_on_local_ranks(variable_at_import, 1, join_group=False)  # the forkserver runs before
    monkeypatch.setenv("HOSTIR_TEST_LAUNCH", "set by the launcher")
    assert run_on_local_ranks(variable_at_import, 2, join_group=False) == ["set by the launcher"] * 2


def test_ranks_have_the_backend_the_launcher_imported_before_their_function_is():
    """This process imported torch.compile's hostir backend before its first launch (pytest's
    warning filters name its warning): its ranks find it imported as they start, before they
    import the module of `fn` (a builtin here, whose unpickling imports nothing)."""
    import hostir.frontend.backend  # noqa: F401  (imported already)

    imported = "'hostir.frontend.backend' in __import__('sys').modules"
    assert run_on_local_ranks(eval, 2, imported, join_group=False) == [True, True]


def wait_in_rank_1() -> int:
    """Rank 0 returns at once; rank 1 waits in a function whose name its stack shows."""
    if os.environ["RANK"] == "1":
        _waiting_for_a_peer_that_never_comes()
    return 0


def _waiting_for_a_peer_that_never_comes() -> None:
    time.sleep(3600)


def test_a_rank_killed_for_its_timeout_prints_where_it_was_first(tmp_path):
    """The rank the launcher kills at the timeout first writes its Python stack to its stderr,
    which says where it waited; the failure says where to look."""
    from hostir.runtime.launch import RankFailed, RankOutput

    # Rank 0 may still be starting at 2 s on a loaded machine, and is then killed too.
    killed = r"(rank 1|ranks 0, 1): still running after 2 s; killed \(its Python stack is on its standard error\)"
    with pytest.raises(RankFailed, match=killed):
        run_on_local_ranks(wait_in_rank_1, 2, timeout_s=2.0, join_group=False, output=RankOutput(tmp_path))
    stack = (tmp_path / "rank1" / "stderr.log").read_text()
    assert "_waiting_for_a_peer_that_never_comes" in stack and "wait_in_rank_1" in stack, stack


def test_what_the_forkserver_imports_leaves_cuda_uninitialised(tmp_path):
    """A rank forked from a server that initialised CUDA cannot use CUDA ("Cannot re-initialize
    CUDA in forked subprocess"): what the server imports before it forks, the backend included,
    must not initialise it. Fails only where CUDA exists (the GPU suite), as the fault does; an
    import of inductor's pattern matcher with the backend once did this."""
    from hostir.runtime.launch import PRELOAD, PRELOAD_WHERE_IMPORTED

    imports = "; ".join(f"import {name}" for name in PRELOAD + PRELOAD_WHERE_IMPORTED)
    probe = f"{imports}; import torch; print(torch.cuda.is_initialized())"
    # Run elsewhere than the checkout, whose hostir/ folder would hide hostir as installed.
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=START_S, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
