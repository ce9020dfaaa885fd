"""CUDA-graph replay emulated on the CPU, so that CI tests what `GraphReplayer` chooses.

A capture runs the program once and keeps its outputs as the static outputs; a replay runs
it again on what the graph would read (its static inputs, and the inputs it reads in place,
at the addresses of the capture) and writes the results into the static outputs, as a
replayed graph writes its buffers. A replay that overwrote an output that a caller still
holds so changes what the caller holds, as on a GPU. Not emulated: the memory pool (each
run allocates anew), streams and time.
"""

from __future__ import annotations

import ctypes
import math
import warnings

import pytest
import torch

from hostir.runtime import graphs
from hostir.runtime.graphs import DeviceCaptures, GraphReplayer
from hostir.runtime.interpreter import RunContext


class EmulatedGraph:
    """Stands for a captured CUDA graph on CPU tensors (see the module's docstring). Like a
    graph it keeps where it reads its inputs, not the tensors, which would count as a
    caller's hold on another capture's outputs."""

    def __init__(self, replayer: GraphReplayer, inputs, extents, outputs):
        self.replayer, self.extents, self.outputs = replayer, extents, outputs
        self.inputs = [(x.data_ptr(), x.shape, x.stride(), x.dtype) for x in inputs]

    def replay(self) -> None:
        replayer = self.replayer
        context = RunContext.of(replayer.communicator, replayer.num_streams, self.extents)
        inputs = [_at_address(*where) for where in self.inputs]
        for static, value in zip(self.outputs, replayer.program.interpreter.run(inputs, context)):
            if static.data_ptr() != value.data_ptr():
                static.copy_(value)


def _at_address(address: int, shape, stride, dtype: torch.dtype) -> torch.Tensor:
    """The CPU tensor of `shape`, `stride` and `dtype` at `address`, as a graph reads it."""
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    elements = 1 + sum((size - 1) * step for size, step in zip(shape, stride))
    itemsize = torch.empty((), dtype=dtype).element_size()
    memory = (ctypes.c_char * (elements * itemsize)).from_address(address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frombuffer on memory it does not own
        return torch.frombuffer(memory, dtype=dtype, count=elements).as_strided(shape, stride)


def _record(self: GraphReplayer, captures, static_inputs, extents):
    context = RunContext.of(self.communicator, self.num_streams, extents)
    outputs = self.program.interpreter.run(static_inputs, context)
    return EmulatedGraph(self, static_inputs, extents, outputs), outputs, None


def emulate_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes `GraphReplayer` capture and replay on the CPU, emulated (see the module's docstring)."""
    monkeypatch.setattr(GraphReplayer, "replays_on", staticmethod(lambda device: True))
    monkeypatch.setattr(
        graphs, "device_captures", lambda device: graphs._DEVICE_CAPTURES.setdefault(device, DeviceCaptures(None, None))
    )
    monkeypatch.setattr(GraphReplayer, "_warm_up", lambda self, side, inputs: self.program.check(inputs, self.communicator))
    monkeypatch.setattr(GraphReplayer, "_record", _record)
