"""What every communicating method of this package shares: the `Work` of a communication in
flight, the rule that only a team's members communicate (`collective`), contiguous targets
for the transfers (`writable`), and the sends and receives of a copy-engine batch (`Offer`,
`Pull`).

The communicator (`communicator.py`) and the copy engines (`copy_engine.py`) both build on
these; the communicator hands the copy engines their transfers, so this module is below both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch


class Work:
    """A communication in flight: the torch works, and the copies that complete it.

    `wait` makes the current CUDA stream wait for the communication (on CPU it
    blocks), then copies results out of temporaries on that stream. Waiting again
    does nothing (a torch work must not be waited twice: gloo's send and recv would
    wait for a second transfer).
    """

    __slots__ = ("works", "finishes")

    def __init__(self, works: Sequence = (), finishes: Sequence[Callable[[], object]] = ()):
        self.works = list(works)
        self.finishes = list(finishes)

    def wait(self) -> None:
        works, self.works = self.works, []
        for work in works:
            work.wait()
        finishes, self.finishes = self.finishes, []
        for finish in finishes:
            finish()


DONE = Work()
"""The work of a communication this rank takes no part in."""


def writable(output: torch.Tensor) -> tuple[torch.Tensor, list[Callable[[], object]]]:
    """A contiguous tensor to receive `output`'s data, and what copies it back if it is a temporary."""
    if output.is_contiguous():
        return output, []
    target = torch.empty_like(output, memory_format=torch.contiguous_format)
    return target, [lambda: output.copy_(target)]


def collective(method):
    """Runs `method` only on team members; a team of one is a local copy."""

    @functools.wraps(method)
    def communicate(self, input, output, team, *args):
        if self.rank not in team:
            return DONE
        if len(team) == 1:
            if output is not None:
                output.copy_(input.reshape(output.shape))
            return DONE
        return method(self, input, output, tuple(team), *args)

    return communicate


class Offer(NamedTuple):
    """A copy-engine send: `buffer` (symmetric) is `peer`'s to read."""

    buffer: torch.Tensor
    peer: int


class Pull(NamedTuple):
    """A copy-engine recv: `peer`'s copy of `source` (the buffer this rank sends `peer` in the
    same batch) into `buffer`."""

    buffer: torch.Tensor
    peer: int
    source: torch.Tensor
