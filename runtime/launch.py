"""Running a function on N local ranks, as torchrun would, and collecting what each returns.

    results = run_on_local_ranks(check_allgather, 4, seed)   # [rank 0's result, ...]

Each rank is a fresh process (`torch.multiprocessing.start_processes`) with the
launcher's environment and settings (`hostir.config`: what the launcher patched reaches
its ranks), torchrun's variables, `OMP_NUM_THREADS=1` unless the caller set
it (as torchrun does: N ranks of one thread each share the cores better than N ranks of
all of them), and a joined process group (`Communicator.from_env()`), so a function that
works here works unchanged under torchrun. The rendezvous store listens on the
loopback interface only.

The ranks start from multiprocessing's forkserver, which imports torch and hostir once
(`PRELOAD`, and torch.compile's hostir backend where the launcher has imported it) and forks
a rank per request: a spawned rank would import them again, seconds of CPU per rank. The
server is started from the launcher the first time it launches,
and serves every later launch of the process. It imports torch without initialising
CUDA, so its ranks may use the GPU. A forked rank starts with the server's environment,
as it was when the server started, and imports the launcher's main module with it; it
takes on the launcher's environment of the launch before it imports the module of `fn`.

A rank that raises or exits makes the call raise `RankFailed` with every failing rank's
message. The others see their peer go away and fail their communication within the
process-group timeout (HOSTIR_TIMEOUT_S) instead of hanging; a rank still running
`FAILURE_GRACE_S` after the first failure (stopped, or stuck where no timeout
reaches) is killed. Nothing else limits how long the ranks may compute, unless the
caller gives `timeout_s`.

A rank's stdout and stderr are the launcher's, unless `output` (a `RankOutput`) sends them,
as torchrun's `--log-dir` and `--tee` do, into a log file per rank and stream, or to the
console with each line prefixed by its rank, or both.

No rank outlives its launcher. Each rank asks the kernel for SIGKILL when its parent, the
forkserver, dies (a parent-death signal), and the forkserver ends when the launcher does,
whatever kills the launcher: it reads a pipe that only the launcher holds open once the
ranks have closed their copy. SIGTERM to the launcher (what a job scheduler sends) and
Ctrl-C stop the ranks first: SIGTERM to each, SIGKILL to those still there
`STOP_GRACE_S` later. The ranks start with SIGINT blocked, so a
Ctrl-C at the terminal reaches the launcher alone, which stops them. The
multiprocessing resource tracker ends with the last process that holds its pipe.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import queue
import signal
import socket
import threading
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from multiprocessing import forkserver

from hostir_dialect.text import HostirError
from hostir import config
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.graphs import release_captured_graphs

T = TypeVar("T")

FAILURE_GRACE_S = 5.0
"""How long the other ranks may run after one failed: they fail on their own as soon as they
next talk to the failed rank, and a rank that has not by then is stopped or stuck."""
PRELOAD = ["torch", "torch.distributed", f"{__package__}.program", __name__]
"""What the forkserver imports before it forks any rank: torch, and hostir's compiler and runtime
(through `program`). Not the main module, which may use CUDA as it is imported (multiprocessing's
default): each rank imports it, as a spawned rank does."""
PRELOAD_WHERE_IMPORTED = ["hostir.frontend.backend"]
"""What the forkserver imports too where the launcher has imported it when the server starts:
torch.compile's hostir backend, which brings torch's compiler (1.7 s of CPU). A launcher that
imported it most likely starts ranks that compile with it; one that did not spares the
server the import, which every rank of a program run without torch.compile would carry."""
STOP_GRACE_S = 3.0
"""How long a rank sent SIGTERM may take to end before it gets SIGKILL."""
POLL_S = 0.1
"""How often the launcher looks at its ranks."""
STACK_DUMP_S = 1.0
"""How long a rank about to be killed for outstaying a failure or the timeout has to print
where it is: its Python threads' stacks, on its standard error (`faulthandler`, on SIGUSR1)."""


class RankFailed(Exception):
    """One or more ranks raised, died or ran past the timeout; `failures` maps rank -> message.
    Said once per message: ranks that failed alike are named together (`ranks 0, 1: ...`)."""

    def __init__(self, failures: dict[int, str]):
        self.failures = dict(sorted(failures.items()))
        ranks_by_message: dict[str, list[int]] = {}
        for rank, message in self.failures.items():
            ranks_by_message.setdefault(message, []).append(rank)
        super().__init__(
            "\n".join(
                f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {message}"
                for message, ranks in ranks_by_message.items()
            )
        )


class Terminated(BaseException):
    """SIGTERM reached the launcher while its ranks ran (raised in its main thread)."""


def plain_message(error: BaseException) -> str:
    """`error` in one paragraph, 'Type: message', without the C++ frames torch appends."""
    message = str(error).split("\nException raised from ", 1)[0].strip()
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class _LauncherEnvironment:
    """The launcher's environment variables, which a rank takes on as this is unpickled: among
    the rank's arguments it comes before `fn` and `args`, whose modules the rank imports as they
    are unpickled (a module may read a variable as it is imported). The settings the launcher
    changed (`hostir.config.patch`) are among them; OMP_NUM_THREADS is 1 unless the launcher
    set it."""

    def __init__(self) -> None:
        self.variables = {"OMP_NUM_THREADS": "1", **config.environment()}

    def __reduce__(self):
        return (_take_on_environment, (self.variables,))


def _take_on_environment(variables: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(variables)
    threads = variables["OMP_NUM_THREADS"]
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # the forkserver's torch read the variable as it was then


@dataclass(frozen=True)
class RankOutput:
    """Where each rank's stdout and stderr go (file descriptors 1 and 2, so that what torch,
    NCCL and CUDA print goes with what Python prints), as torchrun's `--log-dir` and `--tee`
    say: with `log_dir`, into `log_dir/rank<k>/stdout.log` and `stderr.log`; with `tee`, to
    the launcher's console too (only there, without `log_dir`), each line prefixed
    `[rank k]: ` and written at once, so that the ranks' lines never run into each other.
    Neither: the launcher's own stdout and stderr, as they are."""

    log_dir: Path | None = None
    tee: bool = False

    def prepare(self, nproc: int) -> None:
        """Makes the folders of the ranks' logs, before any rank starts."""
        if self.log_dir is None:
            return
        try:
            for rank in range(nproc):
                (self.log_dir / f"rank{rank}").mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise HostirError(f"cannot make the log folder '{self.log_dir}': {error.strerror or error}") from None

    @contextmanager
    def redirected(self, rank: int) -> Iterator[None]:
        if self.log_dir is None and not self.tee:
            yield
            return
        streams = [
            _Redirected(
                descriptor,
                None if self.log_dir is None else self.log_dir / f"rank{rank}" / f"{name}.log",
                f"[rank {rank}]: ".encode() if self.tee else None,
            )
            for descriptor, name in ((1, "stdout"), (2, "stderr"))
        ]
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for stream in streams:
                stream.close()


class _Redirected:
    """File descriptor `descriptor` into the file `log`, and with a `prefix` to where it went
    before too, each line prefixed, through a pipe that a thread copies."""

    def __init__(self, descriptor: int, log: Path | None, prefix: bytes | None):
        self.descriptor = descriptor
        self.before = os.dup(descriptor)
        self.log = None if log is None else open(log, "ab", buffering=0)
        self.copier: threading.Thread | None = None
        if prefix is None:
            assert self.log is not None
            os.dup2(self.log.fileno(), descriptor)
            return
        read, write = os.pipe()
        os.dup2(write, descriptor)
        os.close(write)
        self.copier = threading.Thread(target=self._copy, args=(read, prefix), daemon=True)
        self.copier.start()

    def _copy(self, read: int, prefix: bytes) -> None:
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:
                if self.log is not None:
                    self.log.write(line)
                os.write(self.before, prefix + line)

    def close(self) -> None:
        os.dup2(self.before, self.descriptor)  # the pipe's last writer closes: the copier reads its end
        if self.copier is not None:
            self.copier.join(timeout=STOP_GRACE_S)
        os.close(self.before)
        if self.log is not None:
            self.log.close()


def _start_forkserver() -> None:
    """Starts the forkserver, once, with no working directory first on its path. It runs as
    `python -c`, which puts the working directory first, and from a checkout's root the
    checkout's hostir/ folder, which holds none of the rooms, would then be imported for
    its preload instead of hostir as installed (`pip install --target`), and the ranks
    forked from it would find no `hostir.runtime`."""
    saved = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = saved


def _die_with_launcher() -> None:
    """Arms the parent-death signal: SIGKILL when the forkserver dies, which it does once the
    launcher has died and every rank has closed the server's "alive" pipe, which each rank
    inherits (the server ends at the end of file)."""
    mp._prctl_pr_set_pdeathsig(signal.SIGKILL)  # torch's prctl(2) wrapper; nothing off Linux
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    if not mp.parent_process().is_alive():  # the launcher died before the lines above
        os._exit(1)


def _rank_main(
    rank: int,
    _environment: None,
    nproc: int,
    port: int,
    results: mp.Queue,
    fn: Callable,
    args: tuple,
    join_group: bool,
    output: RankOutput,
) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # also if another started the server
    _die_with_launcher()
    with output.redirected(rank):
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # after the redirection: its file
        _run_rank(rank, nproc, port, results, fn, args, join_group)


def _run_rank(
    rank: int, nproc: int, port: int, results: mp.Queue, fn: Callable, args: tuple, join_group: bool
) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        # Every rank joins the launcher's store as a client, as under torchrun's agent.
        TORCHELASTIC_USE_AGENT_STORE=str(True),
    )
    try:
        if join_group:
            _join()
        payload = (True, pickle.dumps(fn(*args)))
    except HostirError as error:
        payload = (False, str(error))
    except BaseException:
        payload = (False, traceback.format_exc().strip())
    results.put((rank, *payload))
    if payload[0] and dist.is_initialized():
        # Keep this rank's connections open until every rank is done with them: a peer
        # may still be reading what this rank sent. A failing peer ends the barrier
        # early, and reports its own failure.
        try:
            dist.barrier()
        except RuntimeError:
            pass
    if dist.is_initialized():
        release_captured_graphs()
        dist.destroy_process_group()


def _join() -> None:
    try:
        Communicator.from_env()
    except HostirError:
        raise
    except Exception as error:
        raise HostirError(f"cannot join the process group: {plain_message(error)}") from None


def _loopback_store() -> dist.TCPStore:
    """The ranks' rendezvous store, listening on 127.0.0.1 only, on a port the system picks
    while it binds (so no other process can take it in between)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    return dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=listener.detach()
    )


def run_on_local_ranks(
    fn: Callable[..., T],
    nproc: int,
    *args,
    timeout_s: float | None = None,
    join_group: bool = True,
    output: RankOutput = RankOutput(),
) -> list[T]:
    """Calls `fn(*args)` on `nproc` local ranks; returns the per-rank results in rank order.

    `fn` and `args` must be picklable (`fn` defined at module level); so must the results.
    `timeout_s`, if given, limits the whole call: ranks still running then are killed.
    With `join_group=False` the ranks get torchrun's variables but join no process group:
    `fn` talks to its peers by other means (multiprocessing queues in `args`, say), and
    several ranks may share one GPU. `output` says where the ranks' stdout and stderr go.
    """
    output.prepare(nproc)
    context = mp.get_context("forkserver")
    preload = PRELOAD + [name for name in PRELOAD_WHERE_IMPORTED if name in sys.modules]
    context.set_forkserver_preload(preload)  # for the server, once: the first launch starts it
    results = context.Queue()
    store = _loopback_store()
    processes: list = []
    try:
        with _sigterm_raises():
            # The forkserver, started here at the first launch, and so the ranks, inherit it.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                _start_forkserver()
                processes = mp.start_processes(
                    _rank_main,
                    args=(_LauncherEnvironment(), nproc, store.port, results, fn, args, join_group, output),
                    nprocs=nproc,
                    join=False,
                    daemon=True,
                    start_method="forkserver",
                ).processes
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            outcomes = _watch(processes, results, timeout_s)
    except (KeyboardInterrupt, Terminated) as stop:
        _stop(processes)
        if isinstance(stop, Terminated):
            signal.raise_signal(signal.SIGTERM)  # the launcher ends as the signal says
        raise
    finally:
        for process in processes:
            if process.exitcode is None:
                process.kill()
            process.join()
    failures = {rank: str(payload) for rank, (ok, payload) in outcomes.items() if not ok}
    if failures:
        raise RankFailed(failures)
    return [pickle.loads(outcomes[rank][1]) for rank in range(nproc)]


def _watch(processes: Sequence, results: mp.Queue, timeout_s: float | None) -> dict[int, tuple[bool, object]]:
    """Every rank's outcome, (True, its pickled result) or (False, why it failed), once every
    rank has ended; kills the ranks that outstay a failure by FAILURE_GRACE_S, or `timeout_s`."""
    outcomes: dict[int, tuple[bool, object]] = {}
    start = time.monotonic()
    first_failure: tuple[int, float] | None = None
    while True:
        _receive(results, outcomes, POLL_S)
        now = time.monotonic()
        for rank, process in enumerate(processes):
            if rank not in outcomes and process.exitcode is not None:
                _receive(results, outcomes, 0.0)  # what it sent is in the pipe before it ended
                if rank not in outcomes:
                    outcomes[rank] = (False, _ended(process.exitcode))
        if first_failure is None:
            failed = [rank for rank, (ok, _) in outcomes.items() if not ok]
            first_failure = (min(failed), now) if failed else None
        running = [rank for rank, process in enumerate(processes) if process.exitcode is None]
        if not running:
            return outcomes
        if first_failure is not None and now - first_failure[1] > FAILURE_GRACE_S:
            why = f"still running {FAILURE_GRACE_S:g} s after rank {first_failure[0]} failed; killed"
        elif timeout_s is not None and now - start > timeout_s:
            why = f"still running after {timeout_s:g} s; killed"
        else:
            continue
        # A stuck rank's stack says where it waits (for which peer, in which collective).
        for rank in running:
            with contextlib.suppress(ProcessLookupError):  # it may have ended since
                os.kill(processes[rank].pid, signal.SIGUSR1)
        time.sleep(STACK_DUMP_S)
        why += " (its Python stack is on its standard error)"
        for rank in running:
            processes[rank].kill()
            processes[rank].join()
            outcomes.setdefault(rank, (False, why))
        return outcomes


def _receive(results: mp.Queue, outcomes: dict[int, tuple[bool, object]], wait_s: float) -> None:
    """Adds what the ranks have sent to `outcomes`, waiting up to `wait_s` for the first of it."""
    try:
        rank, ok, payload = results.get(timeout=wait_s)
        outcomes[rank] = (ok, payload)
        while True:
            rank, ok, payload = results.get_nowait()
            outcomes[rank] = (ok, payload)
    except queue.Empty:
        pass


def _ended(exitcode: int) -> str:
    if exitcode < 0:
        return f"ended by {signal.Signals(-exitcode).name} before returning a result"
    return f"exited with code {exitcode} before returning a result"


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Within: SIGTERM raises `Terminated` in the main thread, as SIGINT raises KeyboardInterrupt
    (from another thread, where no handler can be set, the parent-death signal alone holds)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(processes: Sequence) -> None:
    """SIGTERM to every rank still running; SIGKILL to those still there STOP_GRACE_S later."""
    running = [process for process in processes if process.exitcode is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in running:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()
