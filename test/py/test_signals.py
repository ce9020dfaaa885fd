"""The copy engines' signals (`runtime.distributed.signals`), on stand-in pads.

On GPUs the flags are words of the members' signal pads, written and waited for by stream
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

CHANNELS = 2


def word(pad: torch.Tensor, channel: int, sender: int, members: int = 3) -> int:
    """The address of the flag that `sender` sets on `channel` in `pad`."""
    return pad.data_ptr() + 4 * (channel * members + sender)


@pytest.fixture
def recorded(monkeypatch):
    """(the signals of member 1 of 3, the members' pads, the stream operations in order)."""
    pads = [torch.zeros(CHANNELS * 3, dtype=torch.int32) for _ in range(3)]
    signals, operations = StreamSignals(pads, 1), []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    for kind in ("write", "wait"):
        monkeypatch.setattr(
            signals_module,
            f"{kind}_value32",
            lambda stream, address, value, kind=kind: operations.append((kind, stream, address, value)),
        )
    return signals, pads, operations


def test_a_signal_sets_the_senders_word_of_the_channel_in_the_receivers_pad(recorded):
    signals, pads, operations = recorded
    signals.signal(2, channel=1)
    assert operations == [("write", "stream", word(pads[2], 1, 1), 1)]


def test_a_wait_waits_for_the_peers_word_in_the_own_pad_then_clears_it(recorded):
    signals, pads, operations = recorded
    signals.wait(0, channel=1)
    assert operations == [("wait", "stream", word(pads[1], 1, 0), 1), ("write", "stream", word(pads[1], 1, 0), 0)]


def test_a_barrier_signals_every_other_member_before_waiting_for_any(recorded):
    signals, pads, operations = recorded
    signals.barrier(0)
    assert operations == [
        ("write", "stream", word(pads[0], 0, 1), 1),
        ("write", "stream", word(pads[2], 0, 1), 1),
        ("wait", "stream", word(pads[1], 0, 0), 1),
        ("write", "stream", word(pads[1], 0, 0), 0),
        ("wait", "stream", word(pads[1], 0, 2), 1),
        ("write", "stream", word(pads[1], 0, 2), 0),
    ]


@pytest.mark.parametrize("operation, name", [("wait_value32", "cuStreamWaitValue32_v2"), ("write_value32", "cuStreamWriteValue32_v2")])
def test_a_driver_error_of_a_stream_memory_operation_is_raised(monkeypatch, operation, name):
    class Stream:
        cuda_stream = 0

    monkeypatch.setattr(signals_module, "_driver_call", lambda called: lambda *arguments: 700)
    with pytest.raises(HostirError, match=rf"^error: {name} failed with CUDA driver error 700$"):
        getattr(signals_module, operation)(Stream(), 0, 1)
