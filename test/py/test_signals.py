"""The copy engines' signals (`runtime.distributed.signals`), with a stand-in symmetric-memory handle.

On GPUs the flags are words of torch's signal pads, written and waited for by stream
memory operations; test_copy_engine.py runs them on 2 GPUs. Here the pads are CPU tensors
and the two stream operations are recorded, so the protocol shows exactly: which word of
which member's pad each signal sets, that a wait clears the word it waited for, and the
order of a barrier.
"""

from __future__ import annotations

import pytest
import torch

from hostir_dialect.text import HostirError
from hostir.runtime.distributed import signals as signals_module
from hostir.runtime.distributed.signals import StreamSignals


class Handle:
    """Stands in for torch's symmetric-memory handle: a signal pad per member."""

    def __init__(self, rank: int, world_size: int, signal_pad_size: int = 1024):
        self.rank, self.world_size, self.signal_pad_size = rank, world_size, signal_pad_size
        self.pads = [torch.zeros(signal_pad_size // 4, dtype=torch.int32) for _ in range(world_size)]

    def get_signal_pad(self, rank: int, shape, dtype) -> torch.Tensor:
        return self.pads[rank][: shape[0]]


@pytest.fixture
def recorded(monkeypatch):
    """(signals of rank 1 of 3 with 2 channels, the handle, the stream operations in order)."""
    handle, operations = Handle(rank=1, world_size=3), []
    signals = StreamSignals(handle, channels=2)
    record_write = lambda pad, word, value: operations.append(("write", pad, word, value))  # noqa: E731
    monkeypatch.setattr(signals, "_write", record_write)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    monkeypatch.setattr(
        signals_module,
        "wait_value32",
        lambda stream, address, value: operations.append(("wait", stream, address, value)),
    )
    return signals, handle, operations


def test_a_signal_sets_the_senders_word_of_the_channel_in_the_receivers_pad(recorded):
    signals, handle, operations = recorded
    signals.signal(2, channel=1)
    ((kind, pad, word, value),) = operations
    assert (kind, word, value) == ("write", 1 * 3 + 1, 1) and pad.data_ptr() == handle.pads[2].data_ptr()


def test_a_wait_waits_for_the_peers_word_in_the_own_pad_then_clears_it(recorded):
    signals, handle, operations = recorded
    signals.wait(0, channel=1)
    own = handle.pads[1]
    word = 1 * 3 + 0
    assert operations == [
        ("wait", "stream", own.data_ptr() + 4 * word, 1),
        ("write", operations[1][1], word, 0),
    ]
    assert operations[1][1].data_ptr() == own.data_ptr()


def test_a_barrier_signals_every_other_member_before_waiting_for_any(recorded):
    signals, handle, operations = recorded
    signals.barrier(0)
    # (kind, the word written or the address waited on, the value)
    steps = [(kind, rest[-2], rest[-1]) for kind, *rest in operations]
    own = handle.pads[1].data_ptr()
    assert steps == [
        ("write", 0 * 3 + 1, 1),
        ("write", 0 * 3 + 1, 1),
        ("wait", own + 4 * 0, 1),
        ("write", 0, 0),
        ("wait", own + 4 * 2, 1),
        ("write", 2, 0),
    ]
    assert [pad.data_ptr() for kind, pad, *_ in operations if kind == "write"][:2] == [
        handle.pads[0].data_ptr(),
        handle.pads[2].data_ptr(),
    ]


def test_too_small_a_signal_pad_is_refused():
    message = r"3 signal channels of 8 devices need 96 bytes of signal pad, and torch's symmetric memory has 64"
    with pytest.raises(HostirError, match=message):
        StreamSignals(Handle(rank=0, world_size=8, signal_pad_size=64), channels=3)


def test_a_driver_error_of_the_wait_is_raised(monkeypatch):
    class Stream:
        cuda_stream = 0

    monkeypatch.setattr(signals_module, "_cu_stream_wait_value32", lambda: lambda *arguments: 700)
    with pytest.raises(HostirError, match=r"^error: cuStreamWaitValue32 failed with CUDA driver error 700$"):
        signals_module.wait_value32(Stream(), 0, 1)
