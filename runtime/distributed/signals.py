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

Both are driver calls (`cuStreamWriteValue32_v2`, `cuStreamWaitValue32_v2`), made
through ctypes. Neither has a timeout: runtime/distributed/watchdog.py ends the process
when a transfer waits longer than the communicator's timeout. Each symmetric buffer's
pads lie after its data, in the same allocation, which the members map as they map the
data (runtime/distributed/symmetric_memory.py).

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
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
"""cuStreamWriteValue32's flag: the write follows the stream's earlier work and its memory writes."""


@functools.cache
def _driver_call(name: str):
    """The driver's `name(stream, address, value, flags)`, a stream memory operation."""
    call = getattr(ctypes.CDLL("libcuda.so.1"), name)
    call.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint)
    call.restype = ctypes.c_int
    return call


def _stream_memory_operation(name: str, stream: torch.cuda.Stream, address: int, value: int, flags: int) -> None:
    status = _driver_call(name)(stream.cuda_stream, address, value, flags)
    if status != 0:
        raise HostirError(f"{name} failed with CUDA driver error {status}")


def wait_value32(stream: torch.cuda.Stream, address: int, value: int) -> None:
    """Makes `stream` wait, on the GPU, until the 32-bit word at `address` equals `value`."""
    _stream_memory_operation("cuStreamWaitValue32_v2", stream, address, value, CU_STREAM_WAIT_VALUE_EQ)


def write_value32(stream: torch.cuda.Stream, address: int, value: int) -> None:
    """Writes `value` into the 32-bit word at `address` once `stream`'s earlier work is done."""
    _stream_memory_operation("cuStreamWriteValue32_v2", stream, address, value, CU_STREAM_WRITE_VALUE_DEFAULT)


class StreamSignals:
    """One device's flags in the signal pads of one symmetric buffer's members.

    The flag that `sender` sets for `receiver` on `channel` is word
    `channel * size + sender` of the receiver's pad; every member's pad is mapped here.
    """

    def __init__(self, pads: list[torch.Tensor], position: int):
        """`pads[k]`: the pad of the member at position `k` (flat uint32 words, a word per
        member and channel); `position`: this member's."""
        self.rank = position
        self.size = len(pads)
        self._tensors = pads
        self._pads = [pad.data_ptr() for pad in pads]
        self._device = pads[position].device

    def _word(self, member: int, channel: int, sender: int) -> int:
        return self._pads[member] + 4 * (channel * self.size + sender)

    def signal(self, peer: int, channel: int) -> None:
        """Sets this device's flag in `peer`'s pad, on the current stream."""
        write_value32(torch.cuda.current_stream(self._device), self._word(peer, channel, self.rank), 1)

    def wait(self, peer: int, channel: int) -> None:
        """Makes the current stream wait until `peer` has set its flag here, then clears it."""
        stream = torch.cuda.current_stream(self._device)
        word = self._word(self.rank, channel, peer)
        wait_value32(stream, word, 1)
        write_value32(stream, word, 0)

    def barrier(self, channel: int) -> None:
        """Signals every other member, then waits for each of their signals."""
        others = [peer for peer in range(self.size) if peer != self.rank]
        for peer in others:
            self.signal(peer, channel)
        for peer in others:
            self.wait(peer, channel)
