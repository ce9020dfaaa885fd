"""Signals between the devices of a symmetric buffer, as stream memory operations.

The copy-engine backend (runtime/distributed/copy_engine.py) tells a peer that its data is written,
or that it is done reading the peer's, by setting a flag in the peer's signal pad; the
peer's copy stream waits until the flag is set and clears it. torch's signals
(`barrier`, `put_signal`, `wait_signal` of a symmetric-memory handle) are one-block
kernels that spin on the flag, and a kernel needs an SM: beside a GEMM that holds
every SM (cuBLAS's persistent kernels do), it may have to wait for the GEMM to end,
and every copy queued behind it with it. A stream memory operation
(`cuStreamWriteValue32`, `cuStreamWaitValue32`) is done by the GPU's front end, not by
an SM: on 2 H200, four chunks of signal, 32 MiB pull, signal took as long beside four
GEMMs as without them (docs/benchmarks.md).

torch exposes the write (`_SymmetricMemory.stream_write_value32`, which needs a flat
uint32 tensor); the wait it does not, so `wait_value32` calls the driver's
`cuStreamWaitValue32_v2` through ctypes. Neither has a timeout: runtime/distributed/watchdog.py
ends the process when a transfer waits longer than the communicator's timeout.

A flag is set only after the last use of it has been cleared, so one flag per
(channel, sender) suffices and every run leaves the pads as it found them (all
zero), which CUDA-graph replay needs. Each transfer signals *written*, waits for
the written signals of the peers it reads, copies, signals *read*, and waits for the
read signals of the peers that read it, all in order on one stream per device.
Member A sets B's *written* flag again only after it has waited for B's *read*
signal of the transfer before, which B sends after it cleared the *written* flag;
A sets B's *read* flag again only after B's next *written* signal, which B sends
after it cleared the *read* flag.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from hostir_dialect.text import HostirError

CU_STREAM_WAIT_VALUE_EQ = 0x1
"""cuStreamWaitValue32's flag: wait until the word equals the value."""


@functools.cache
def _cu_stream_wait_value32():
    driver = ctypes.CDLL("libcuda.so.1")
    wait = driver.cuStreamWaitValue32_v2
    wait.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
    wait.restype = ctypes.c_int
    return wait


def wait_value32(stream: torch.cuda.Stream, address: int, value: int) -> None:
    """Makes `stream` wait, on the GPU, until the 32-bit word at `address` equals `value`."""
    status = _cu_stream_wait_value32()(stream.cuda_stream, address, value, CU_STREAM_WAIT_VALUE_EQ)
    if status != 0:
        raise HostirError(f"cuStreamWaitValue32 failed with CUDA driver error {status}")


class StreamSignals:
    """One device's flags in the signal pads of one symmetric buffer's members.

    The flag that `sender` sets for `receiver` on `channel` is word
    `channel * size + sender` of the receiver's pad (torch maps every member's pad).
    """

    def __init__(self, handle, channels: int):
        from torch.distributed import _symmetric_memory as symm_mem

        size = handle.world_size
        words = channels * size
        if 4 * words > handle.signal_pad_size:
            raise HostirError(
                f"{channels} signal channels of {size} devices need {4 * words} bytes of signal "
                f"pad, and torch's symmetric memory has {handle.signal_pad_size}"
            )
        self.rank = handle.rank
        self.size = size
        self._write = symm_mem._SymmetricMemory.stream_write_value32
        self._pads = [handle.get_signal_pad(rank, (words,), torch.uint32) for rank in range(size)]

    def signal(self, peer: int, channel: int) -> None:
        """Sets this device's flag in `peer`'s pad, on the current stream."""
        self._write(self._pads[peer], channel * self.size + self.rank, 1)

    def wait(self, peer: int, channel: int) -> None:
        """Makes the current stream wait until `peer` has set its flag here, then clears it."""
        own, word = self._pads[self.rank], channel * self.size + peer
        wait_value32(torch.cuda.current_stream(own.device), own.data_ptr() + 4 * word, 1)
        self._write(own, word, 0)

    def barrier(self, channel: int) -> None:
        """Signals every other member, then waits for each of their signals."""
        others = [peer for peer in range(self.size) if peer != self.rank]
        for peer in others:
            self.signal(peer, channel)
        for peer in others:
            self.wait(peer, channel)
