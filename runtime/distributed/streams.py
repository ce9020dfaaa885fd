"""The stream pool that `hir.stream`, `hir.set_current_stream` and `hir.synchronize_stream` use.

On a GPU the pool holds `size` CUDA streams of the rank's device; the current stream
is torch's (`torch.cuda.set_stream`), so every torch op and NCCL call the interpreter
issues lands on it, and synchronising makes the current stream wait for an event
recorded on another (`Stream.wait_stream`). On the CPU torch runs every op in program
order, which is a valid schedule of any stream program: the pool's streams are labels
and its operations do nothing.

Pools are cached per device and size, so a program run every training step reuses
the same streams.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from hostir_dialect.text import HostirError


class StreamPool:
    """`size` streams, addressed by index, and the current stream of the running program."""

    def __init__(self, streams: list):
        self.streams = streams
        self.size = len(streams)

    def get(self, index: int):
        if not 0 <= index < self.size:
            raise IndexError(f"stream index {index} is out of range for a pool of {self.size} streams")
        return self.streams[index]

    def current(self):
        raise NotImplementedError

    def set_current(self, stream) -> None:
        raise NotImplementedError

    def synchronize(self, stream) -> None:
        """The current stream waits for the work issued so far on `stream`."""
        raise NotImplementedError

    @contextmanager
    def restoring(self) -> Iterator[None]:
        """Restores the caller's current stream when the block ends, however it ends."""
        caller = self.current()
        try:
            yield
        finally:
            self.set_current(caller)


class CudaStreamPool(StreamPool):
    def __init__(self, device: torch.device, size: int):
        super().__init__([torch.cuda.Stream(device) for _ in range(size)])
        self.device = device

    def current(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def set_current(self, stream: torch.cuda.Stream) -> None:
        torch.cuda.set_stream(stream)

    def synchronize(self, stream: torch.cuda.Stream) -> None:
        torch.cuda.current_stream(self.device).wait_stream(stream)


class SequentialStreamPool(StreamPool):
    """The CPU: ops run in program order, so streams are labels and stream ops do nothing."""

    CALLER = "caller"

    def __init__(self, size: int):
        super().__init__(list(range(size)))

    def current(self) -> object:
        return self.CALLER

    def set_current(self, stream: object) -> None:
        pass

    def synchronize(self, stream: object) -> None:
        pass


@functools.cache
def stream_pool(device: torch.device, size: int) -> StreamPool:
    """The pool of `size` streams of `device`, created on first use."""
    if size < 1:
        raise HostirError(f"the number of streams must be at least 1, got {size}")
    if device.type == "cuda":
        return CudaStreamPool(device, size)
    return SequentialStreamPool(size)


@functools.cache
def _sleep_cycles_per_ms(device: torch.device) -> float:
    """How many cycles of `torch.cuda._sleep` take a millisecond on `device` (measured once)."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / start.elapsed_time(end)


def hold_current_stream(device: torch.device, ms: float) -> None:
    """Keeps the current stream of `device` idle for about `ms` before the work issued next.

    Work issued during the hold waits behind it, so a host slower at issuing than the
    GPU at running no longer shapes what the GPU does: timings and timelines then show
    the schedule of the streams, not the host's pace.
    """
    with torch.cuda.device(device):
        torch.cuda._sleep(int(ms * _sleep_cycles_per_ms(device)))


def start_together(device: torch.device, hold_ms: float) -> None:
    """Holds the current stream of `device` for `hold_ms`, then lets the ranks' current streams
    meet in a one-element all-reduce: the holds of the ranks differ, and after this their
    devices start what is issued next together."""
    hold_current_stream(device, hold_ms)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(torch.zeros(1, device=device))
