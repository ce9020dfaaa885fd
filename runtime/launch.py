"""Running a function on N local ranks, as torchrun would, and collecting what each returns.

    results = run_on_local_ranks(check_allgather, 4, seed)   # [rank 0's result, ...]

Each rank is a fresh process (torch.multiprocessing, spawn) with torchrun's
environment variables and a joined process group (`Communicator.from_env()`), so a
function that works here works unchanged under torchrun. A rank that raises, exits,
or outlives `timeout_s` makes the call raise `RankFailed` with every failing rank's
message; the surviving ranks see their peer go away and fail their communication
within the process-group timeout (HOSTIR_TIMEOUT_S) instead of hanging.
"""

from __future__ import annotations

import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist
import torch.multiprocessing as mp

from hostir_dialect.text import HostirError
from runtime.communicator import DEFAULT_TIMEOUT_S, Communicator

T = TypeVar("T")

LAUNCH_TIMEOUT_S = DEFAULT_TIMEOUT_S + 60.0
"""How long `run_on_local_ranks` waits by default: a communication timeout plus start-up."""


class RankFailed(Exception):
    """One or more ranks raised, died or ran past the timeout; `failures` maps rank -> message."""

    def __init__(self, failures: dict[int, str]):
        self.failures = dict(sorted(failures.items()))
        super().__init__(
            "\n".join(f"rank {rank}: {message}" for rank, message in self.failures.items())
        )


def _rank_main(
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
            Communicator.from_env()
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
        dist.destroy_process_group()


def run_on_local_ranks(
    fn: Callable[..., T], nproc: int, *args, timeout_s: float = LAUNCH_TIMEOUT_S, join_group: bool = True
) -> list[T]:
    """Calls `fn(*args)` on `nproc` local ranks; returns the per-rank results in rank order.

    `fn` and `args` must be picklable (`fn` defined at module level); so must the results.
    With `join_group=False` the ranks get torchrun's variables but join no process group:
    `fn` talks to its peers by other means (queues of the spawn context in `args`, say), and
    several ranks may share one GPU.
    """
    context = mp.get_context("spawn")
    results = context.Queue()
    # The launcher hosts the ranks' rendezvous store on a port the system picks while it
    # listens, so no other process can take the port between choosing and binding it.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port
    processes = [
        context.Process(target=_rank_main, args=(rank, nproc, port, results, fn, args, join_group), daemon=True)
        for rank in range(nproc)
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, tuple[bool, object]] = {}
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(outcomes) < nproc and time.monotonic() < deadline:
            try:
                rank, ok, payload = results.get(timeout=0.1)
                outcomes[rank] = (ok, payload)
            except queue.Empty:
                if all(not p.is_alive() for p in processes) and results.empty():
                    break
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for rank, process in enumerate(processes):
            if process.is_alive():
                process.kill()
                process.join()
                killed.add(rank)
    failures = {
        rank: _failure(outcomes.get(rank), process.exitcode, rank in killed, timeout_s)
        for rank, process in enumerate(processes)
        if not outcomes.get(rank, (False,))[0]
    }
    if failures:
        raise RankFailed(failures)
    return [pickle.loads(outcomes[rank][1]) for rank in range(nproc)]


def _failure(
    outcome: tuple[bool, object] | None, exitcode: int | None, killed: bool, timeout_s: float
) -> str:
    if outcome is not None:
        return str(outcome[1])
    if killed:
        return f"still running after {timeout_s:g} s; killed"
    return f"exited with code {exitcode} before returning a result"
