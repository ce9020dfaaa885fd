"""Symmetric memory: buffers that every member of a team allocates alike and the others map.

    handles = TeamRendezvous.of(communicator).exchange(team, what, own_handle)  # every member
    memory, handle = allocate_shareable(nbytes, device)                         # GPU
    peer = open_shared(handles[peer_rank], nbytes, device)                      # GPU

The copy engines (runtime/distributed/copy_engine.py) read their peers' buffers where they lie. On
GPUs each member allocates the buffer with `cudaMalloc` (through CuPy), and the members
exchange the buffers' CUDA IPC handles and open each other's: the peers' buffers are
then tensors of this device that `Tensor.copy_` reads with the copy engines.

Why not torch's symmetric memory: its rendezvous numbers the exchanges with one counter
per process, whatever the group. A team that leaves out some ranks (a mesh of devices 1
to 3 in a world of 4) advances that counter on its members alone, and the next
rendezvous of the whole world then waits forever: rank 0 at its exchange 24, the others
at 28. Here each team numbers its own exchanges (`TeamRendezvous`): the members of a
team make the same symmetric allocations in the same order because they run the same
program, whatever other teams do, so the keys agree by construction. Where they do not
(ranks running different programs), every member compares what each member allocates
before anything is mapped, and all fail at once with an error that names the
allocation and the ranks; a member that never comes fails the others after the
communicator's timeout, naming it.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hostir_dialect.text import HostirError

PAD_ALIGNMENT = 256
"""Bytes: where a buffer's signal pad starts after its data (runtime/distributed/signals.py)."""


class TeamRendezvous:
    """The exchanges of one store: each team's `n`-th exchange under its own keys."""

    _of_store: dict[int, TeamRendezvous] = {}

    def __init__(self, store: dist.Store, rank: int, timeout_s: float):
        self.store = store
        self.rank = rank
        self.timeout_s = timeout_s
        self.exchanges: defaultdict[tuple[int, ...], int] = defaultdict(int)
        """Per team, how many exchanges it has made: the number of the next."""

    @classmethod
    def of(cls, store: dist.Store, rank: int, timeout_s: float) -> TeamRendezvous:
        """The rendezvous of `store`, one per process: every communicator of a process group
        counts a team's exchanges alike, since they share the group's keys."""
        rendezvous = cls._of_store.get(id(store))
        if rendezvous is None or rendezvous.store is not store:
            rendezvous = cls._of_store[id(store)] = cls(store, rank, timeout_s)
        return rendezvous

    def exchange(self, team: tuple[int, ...], what: str, payload: Any) -> dict[int, Any]:
        """Every member's `payload`, by rank, once every member of `team` (ranks, sorted) has
        given its own for the same symmetric allocation `what`; a HostirError on every
        member where they name different allocations, or where one does not come."""
        number = self.exchanges[team]
        self.exchanges[team] += 1
        prefix = f"hostir/symmetric/{','.join(map(str, team))}/{number}"
        keys = {rank: f"{prefix}/{rank}" for rank in team}
        self.store.set(keys[self.rank], pickle.dumps((what, payload)))
        try:
            self.store.wait(list(keys.values()), timedelta(seconds=self.timeout_s))
        except Exception:  # noqa: BLE001 - the store raises its own kinds on a timeout
            missing = [rank for rank, key in keys.items() if not self.store.check([key])]
            raise HostirError(
                f"symmetric allocation #{number} of the team {list(team)} ({what}): rank(s) {missing} "
                f"did not reach it within {self.timeout_s:g} s"
            ) from None
        messages = {rank: pickle.loads(self.store.get(key)) for rank, key in keys.items()}
        allocations: defaultdict[str, list[int]] = defaultdict(list)
        for rank, (allocated, _) in messages.items():
            allocations[allocated].append(rank)
        if len(allocations) > 1:
            raise HostirError(
                f"the members of the team {list(team)} disagree on their symmetric allocation #{number}: "
                + "; ".join(f"rank(s) {ranks} allocate {allocated}" for allocated, ranks in allocations.items())
                + ". The members of a team must make the same symmetric allocations in the same order, "
                "as ranks that run the same program do"
            )
        return {rank: payload for rank, (_, payload) in messages.items()}


# --------------------------------------------------------------------------- #
# GPU memory shared through CUDA IPC (CuPy)                                    #
# --------------------------------------------------------------------------- #


def _cupy():
    import cupy

    return cupy


class _PeerMapping:
    """A peer's memory mapped into this process; closed when the last tensor over it goes."""

    def __init__(self, pointer: int, device: int):
        self.pointer = pointer
        self.device = device

    def __del__(self) -> None:
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            cupy.cuda.runtime.ipcCloseMemHandle(self.pointer)


def _bytes_at(pointer: int, nbytes: int, device: torch.device, owner: object) -> torch.Tensor:
    """The `nbytes` at `pointer` as a uint8 tensor of `device`, keeping `owner` alive with it."""
    cupy = _cupy()
    memory = cupy.cuda.UnownedMemory(pointer, nbytes, owner, device_id=device.index)
    array = cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
    return torch.from_dlpack(array)


def allocate_shareable(nbytes: int, device: torch.device) -> tuple[torch.Tensor, bytes]:
    """`nbytes` of zeros of `device`'s own allocation (a uint8 tensor) and its IPC handle."""
    cupy = _cupy()
    with cupy.cuda.Device(device.index):
        memory = cupy.cuda.Memory(nbytes)
        cupy.cuda.runtime.memset(memory.ptr, 0, nbytes)
        cupy.cuda.runtime.deviceSynchronize()  # zero before any peer may signal into it
        handle = cupy.cuda.runtime.ipcGetMemHandle(memory.ptr)
    return _bytes_at(memory.ptr, nbytes, device, memory), handle


def open_shared(handle: bytes, nbytes: int, device: torch.device) -> torch.Tensor:
    """A peer's allocation of `nbytes` (its IPC handle) as a uint8 tensor of `device`: its
    copies to and from this device's buffers run on the copy engines."""
    cupy = _cupy()
    with cupy.cuda.Device(device.index):
        pointer = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    return _bytes_at(pointer, nbytes, device, _PeerMapping(pointer, device.index))
