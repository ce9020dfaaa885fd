"""The copy-engine backend (`backend cuda`): each device pulls its peers' data out of their memory.

On GPUs the buffers that peers read are *symmetric* (`hir.allocate symmetric`, or an
input marked `hir.symmetric` that the caller made with `Program.symmetric_empty`): every
member of the buffer's mesh allocates it, and maps every other member's copy into its own
address space through CUDA IPC, once per buffer (runtime/distributed/symmetric_memory.py says why not
torch's symmetric memory).
A transfer is then `Tensor.copy_` from a peer's mapping into a local buffer, issued on
one dedicated copy stream per device; between contiguous tensors that is a
`cudaMemcpyAsync`, done by the copy engines without taking SMs from the compute
streams. Allgather pulls in ring order: at step `s` a member at team position `p`
reads from position `p + s`, so that at every step each member reads from a different
peer and every link is busy.

Reductions pull the same way and then reduce locally (copies cannot add): a
reduce_scatter member pulls, from every member's partial, the piece it owns; an
allreduce member of a pair pulls its peer's whole partial. The pieces land in a staging
buffer, one slot per team position (a pair's holds the peer's slot alone), and
`hir.wait` reduces the pieces into the output on the waiting stream: one memory-bound
torch op per transfer (reading the member's own piece in place in a team of two, with
an op that is commutative; after copying it into its slot in a larger one, the slots
in team order), the only SM work of the backend.
The copy stream thus never waits for SMs (a reduction queued there behind a busy GEMM
would hold up the next chunk's copies), and every member of an allreduce computes the
same numbers in the same order, so the replicas are bitwise equal, as NCCL's are.

An allreduce of more than two members would pull `D - 1` whole partials that way, `D / 2`
times a ring's bytes, so it runs in two phases instead (`AllreducePieces`): a
reduce-scatter of pieces into a symmetric scratch buffer that the engine owns, then an
allgather of the reduced pieces out of the members' scratch buffers. Its reduction runs
on the copy stream, between the phases (docs/copy-engine.md says what that costs).

Synchronisation, all of it on the copy stream (docs/copy-engine.md draws it):

* the copy stream first waits for the current stream, so that a member's own data is
  written before it says so and its output is free before it is written;
* *written*: a member reads a peer's buffer only after the peer signalled that its data
  is there (a barrier of the team for an allgather; a signal from the peer for a pair
  of send and recv);
* *read*: after its copies, a member tells its peers it is done reading theirs, and
  waits until they are done reading its own;
* the work of the transfer is an event recorded after that: `hir.wait` makes the
  current stream wait for it. Past it, the member's data has arrived and no peer reads
  its buffer any more, so whatever the program does next on the waiting stream (the
  next run included, which starts on the stream the run ended on) may overwrite it.
  All the copy stream's work ends in an event that a wait joins back to the current
  stream, as a CUDA graph capture requires.

Signals are stream memory operations (runtime/distributed/signals.py): a flag written into the
peer's signal pad and a wait on one's own, done by the GPU's front end and not by a
kernel, so that a GEMM holding every SM holds up neither the signals nor the copies
behind them. They wait on the GPU without a timeout; a watchdog thread
(runtime/distributed/watchdog.py) ends the process when a transfer has waited for its peers longer
than the communicator's timeout, so a dead peer fails the program instead of hanging it.

On the CPU (gloo) the same schedule runs over torch.distributed point-to-point
messages: the ring allgather (and a reduction's pulls) receives from `p + s` what that
peer sends to `p - s`, and a pair of send and recv is an isend and an irecv in the
communicator's batch; the two phases of an allreduce are two such batches, each waited
for as it is issued (CPU streams run in program order anyway).
Symmetric buffers are then plain tensors, made and reused exactly as on GPUs, and
every transfer checks that the buffer its peers read is one of them.
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.distributed as dist

from xdsl.ir import Operation

from hostir_dialect.builder import element_type, reduction_of_slices
from hostir_dialect.fusion import DYNAMIC, TensorType
from hostir_dialect.text import HostirError, operation_location
from hostir import config
from hostir.runtime.codegen.kernels import SegmentKernel
from hostir.runtime.distributed.signals import StreamSignals
from hostir.runtime.distributed.symmetric_memory import (
    PAD_ALIGNMENT,
    TeamRendezvous,
    allocate_shareable,
    open_shared,
)
from hostir.runtime.distributed.watchdog import Watchdog, end_process
from hostir.runtime.distributed.work import Offer, Pull, collective, writable

if TYPE_CHECKING:  # the communicator makes its engine: this module only reads its attributes
    from hostir.runtime.distributed.communicator import Communicator

WRITTEN_CHANNEL = 0
"""The signal channel on which a member says its data is in its symmetric buffer."""
READ_CHANNEL = 1
"""The signal channel on which a member says it is done reading a peer's buffer."""
CHANNELS = 2

REDUCTIONS: dict[dist.ReduceOp.RedOpType, Callable[..., torch.Tensor]] = {
    dist.ReduceOp.SUM: lambda staging, out: torch.sum(staging, 0, dtype=out.dtype, out=out),
    dist.ReduceOp.PRODUCT: lambda staging, out: torch.prod(staging, 0, dtype=out.dtype, out=out),
    dist.ReduceOp.MAX: lambda staging, out: torch.amax(staging, 0, out=out),
    dist.ReduceOp.MIN: lambda staging, out: torch.amin(staging, 0, out=out),
}
"""Each reduction as one torch op over the staging buffer's first axis into `out` (float
types accumulate in float32 and round once; `dtype` keeps integer sums in their type)."""

PAIRWISE: dict[dist.ReduceOp.RedOpType, Callable[..., torch.Tensor]] = {
    dist.ReduceOp.SUM: torch.add,
    dist.ReduceOp.PRODUCT: torch.mul,
    dist.ReduceOp.MAX: torch.maximum,
    dist.ReduceOp.MIN: torch.minimum,
}
"""Each reduction of two operands as one elementwise torch op: it computes in float32 and
rounds once, as `REDUCTIONS` does, and is commutative, so both members get the same bits."""


def ring(position: int, size: int) -> list[int]:
    """The team positions that the member at `position` reads, one per step: `p + s` at step `s`.

    At every step the members read from different peers, so every link carries one
    transfer and none is shared; step 0 is the member's own data.
    """
    return [(position + step) % size for step in range(size)]


def ring_messages(position: int, size: int) -> list[tuple[int, int]]:
    """`ring` as messages, one (reading, sending) pair per step after the first: at step `s`
    the member receives from `p + s` what that member holds for it, and sends `p - s`
    (whose step `s` reads from `p`) what it holds for that member."""
    return [(reading, (position - step) % size) for step, reading in enumerate(ring(position, size)) if step]


def reads_own_piece_in_place(size: int) -> bool:
    """Whether a member of a team of `size` reduces its own piece where it lies (a pair: one
    commutative op of both pieces) rather than from a staging slot of its own."""
    return size == 2


KERNEL_REDUCTIONS: dict[dist.ReduceOp.RedOpType, str] = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max"}
"""The reductions a generated kernel of the pieces computes (`reduction_of_slices`)."""


@functools.cache
def pieces_kernel(count: int, op: dist.ReduceOp.RedOpType, dtype: torch.dtype, rank: int) -> SegmentKernel | None:
    """The kernel that reduces `count` pieces of `dtype` and rank `rank` in team order, as
    `REDUCTIONS` does; None where ATen's reduction stays (integers, products, minima)."""
    if op not in KERNEL_REDUCTIONS or not dtype.is_floating_point:
        return None
    piece = TensorType([DYNAMIC] * rank, element_type(dtype))
    return SegmentKernel(reduction_of_slices("pieces", KERNEL_REDUCTIONS[op], [piece] * count, piece))


def reduction(
    staging: torch.Tensor, own: int, piece: torch.Tensor, output: torch.Tensor, op, in_place: bool | None = None
) -> Callable[[], object]:
    """What `hir.wait` runs once the peers' pieces have landed in `staging`: every member's
    piece reduced into `output` on the then current stream, to the same bits on every
    member. The member's own `piece` is read in place where there are two (one commutative
    op of both, `PAIRWISE`: three fifths
    of the traffic of copying it into its slot and reducing the slots, and a third of the
    time, docs/copy-engine.md); where there are more (or `in_place` is False), a generated
    kernel reads the peers' slots and the own piece where it lies and reduces them in team
    order (ATen's reduction over the slots' axis reaches about 60% of the bandwidth); on
    the CPU, or for a reduction no kernel computes, the own piece is copied into slot `own`
    and ATen reduces the slots in team order. `in_place` chooses for a team of two
    (benchmarks/piece_reductions.py times each way)."""
    if in_place is None:
        in_place = reads_own_piece_in_place(len(staging))
    if in_place:
        peer = staging[1 - own].view(output.shape)
        return lambda: PAIRWISE[op](piece.reshape(output.shape), peer, out=output)
    # The kernel reads pieces of the output's shape: the own piece viewed so where it can be.
    own_piece = piece.view(output.shape) if piece.is_contiguous() else piece
    kernel = pieces_kernel(len(staging), op, output.dtype, output.dim()) if own_piece.shape == output.shape else None
    pieces = [own_piece if k == own else staging[k].view(output.shape) for k in range(len(staging))]

    def reduce() -> None:
        if kernel is None or not kernel.launch(pieces, [output]):
            reduction_in_slots(staging, own, piece, output, op)

    return reduce


def reduction_in_slots(staging: torch.Tensor, own: int, piece: torch.Tensor, output: torch.Tensor, op) -> None:
    """`reduction`'s way where no kernel reduces the pieces: the own piece copied into slot
    `own`, then ATen's reduction over the slots, in team order."""
    staging[own].copy_(piece)
    REDUCTIONS[op](staging.view(len(staging), *output.shape), output)


@dataclass(eq=False)
class SymmetricBuffer:
    """A buffer that the other members of its mesh read; on GPUs, mapped by all of them."""

    tensor: torch.Tensor
    group_ranks: dict[int, int]
    """Device -> its position among the devices of the buffer's mesh, sorted."""
    signals: StreamSignals | None = None
    """The flags in the members' signal pads (GPU, mesh of more than one device, at least one element)."""
    peers: dict[int, torch.Tensor] = field(default_factory=dict)
    """Device -> its copy of the buffer as a flat tensor this device can read (GPU)."""

    def peer_view(self, view: torch.Tensor, device: int) -> torch.Tensor:
        """The part of `device`'s copy that `view` is of this device's."""
        return self.peers[device].as_strided(view.size(), view.stride(), view.storage_offset())


@dataclass(eq=False)
class AllreducePieces:
    """An allreduce of a team of more than two as a reduce-scatter, then an allgather.

    The input and the output are cut alike into one piece per team position (flat where
    both are contiguous, else along their first axis; `torch.tensor_split`, so the pieces
    differ by one element or row at most). The member at position `k` pulls piece `k` of
    every member's input, reduces them into its `scratch`, and copies the result into
    its output's piece `k`; then every member pulls piece `k` out of member `k`'s scratch.
    The scratch holds the largest piece and belongs to the engine, not to the program:
    it lives only within one transfer, so one per team, dtype and size serves them all.
    """

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    scratch: SymmetricBuffer
    position: int
    """This member's team position: the piece it reduces."""

    def reduced(self, k: int) -> torch.Tensor:
        """Where the member at position `k` keeps piece `k` reduced: the start of its scratch."""
        return self.scratch.tensor[: len(self.outputs[k])]


class CopyEngine(ABC):
    """One device's copy-engine transfers and symmetric buffers, for one communicator."""

    def __init__(self, communicator: Communicator):
        self.communicator = communicator
        self.rank = communicator.rank
        self._buffers: dict[int, SymmetricBuffer] = {}
        """The symmetric buffers, by the address of their memory."""
        self._scratches: dict[tuple, SymmetricBuffer] = {}
        """The allreduces' scratch buffers, by team, dtype and shape (`AllreducePieces`)."""

    def allocate(self, shape: Sequence[int], dtype: torch.dtype, mesh: Sequence[int], what: str) -> SymmetricBuffer:
        """A new symmetric buffer of the allocation `what` (its op, for errors); every device of
        `mesh` must allocate the same, in the same order (runtime/distributed/symmetric_memory.py), and a
        HostirError on every member says where they do not."""
        group_ranks = {device: rank for rank, device in enumerate(sorted(mesh))}
        what = f"{what}: {list(shape)} x {str(dtype).removeprefix('torch.')}"
        buffer = self._allocate(tuple(shape), dtype, group_ranks, what)
        self._buffers[buffer.tensor.untyped_storage().data_ptr()] = buffer
        return buffer

    def _exchange(self, group_ranks: dict[int, int], what: str, payload: object) -> dict[int, object]:
        """Every member's `payload` for the allocation `what`, once all of the mesh agree on it."""
        if len(group_ranks) == 1:
            return {self.rank: payload}
        communicator = self.communicator
        rendezvous = TeamRendezvous.of(communicator.store, self.rank, communicator.timeout_s)
        return rendezvous.exchange(tuple(sorted(group_ranks)), what, payload)

    def symmetric_of(self, view: torch.Tensor, readers: Sequence[int]) -> SymmetricBuffer:
        """The symmetric buffer that `view` is part of, which the devices `readers` must have mapped."""
        buffer = self._buffers.get(view.untyped_storage().data_ptr())
        if buffer is None:
            raise HostirError(
                "the copy engines read a buffer that is not symmetric: a buffer that peers read "
                "with backend cuda must come from 'hir.allocate symmetric' (the passes that emit "
                "backend cuda allocate it so) or, for an input marked 'hir.symmetric', from "
                "Program.symmetric_empty"
            )
        strangers = sorted(set(readers) - buffer.group_ranks.keys())
        if strangers:
            raise HostirError(
                f"device(s) {strangers} would read a symmetric buffer of the mesh "
                f"{sorted(buffer.group_ranks)}, which only the devices of that mesh have mapped"
            )
        return buffer

    def _team_input(self, input: torch.Tensor, team: Sequence[int], collective: str) -> SymmetricBuffer:
        """The symmetric buffer of a collective's input, whose mesh must be the team (all of it
        takes part in the barriers)."""
        source = self.symmetric_of(input, team)
        if len(source.group_ranks) != len(team):
            raise HostirError(
                f"{collective} with backend cuda in the team {list(team)} reads a symmetric buffer "
                f"of the mesh {sorted(source.group_ranks)}: the team must be the buffer's mesh"
            )
        return source

    def reduce_scatter(self, input, output, team, op, axis: int) -> tuple[list, list]:
        """`Communicator.reduce_scatter` by the copy engines: each member pulls the piece of every
        member's `input` that it owns (its position along `axis`) and reduces them into `output`."""
        pieces = [input.narrow(axis, k, 1) for k in range(len(team))]
        return self._pull_and_reduce(input, pieces, output, team, op, "a reduce_scatter")

    def allreduce(self, input, output, team, op) -> tuple[list, list]:
        """`Communicator.allreduce` by the copy engines. A pair pulls the peer's whole `input`
        and reduces it with its own into `output`: one partial over the link each way, what
        a ring moves, behind two barriers and with no scratch. A larger team reduces in two
        phases (`AllreducePieces`): `2 (D - 1) / D` partials over the links per member, as a
        ring, where pulling every whole partial would move `D - 1`."""
        if len(team) == 2:
            return self._pull_and_reduce(input, [input, input], output, team, op, "an allreduce")
        if output.numel() == 0:
            return [], []
        source = self._team_input(input, team, "an allreduce")
        return self._reduce_in_pieces(source, self._allreduce_pieces(input, output, team), team, op)

    def _allreduce_pieces(self, input, output, team) -> AllreducePieces:
        """`input` (`output`'s elements, with extent-1 axes of its own) and `output` in pieces,
        with the scratch of their team, dtype and largest piece (made on first use: every
        member reaches the same allreduces in the same order)."""
        input = input.view(output.shape)
        if input.is_contiguous() and output.is_contiguous():
            input, output = input.view(-1), output.view(-1)
        inputs, outputs = torch.tensor_split(input, len(team)), torch.tensor_split(output, len(team))
        key = (team, output.dtype, outputs[0].shape)
        scratch = self._scratches.get(key)
        if scratch is None:
            what = f"the scratch of an allreduce in the team {list(team)}"
            scratch = self._scratches[key] = self.allocate(outputs[0].shape, output.dtype, team, what)
        return AllreducePieces(inputs, outputs, scratch, team.index(self.rank))

    def _staging(self, piece: torch.Tensor, size: int) -> torch.Tensor:
        """A buffer of one slot per team position, each with `piece`'s shape, where the peers'
        pieces land. Where the member reads its own piece in place (a pair, `reduction`),
        all positions view one slot's memory, written by the peer's piece alone."""
        slots = 1 if reads_own_piece_in_place(size) else size
        staging = torch.empty((slots, *piece.shape), dtype=piece.dtype, device=self.communicator.device)
        return staging.expand(size, *piece.shape)

    @abstractmethod
    def _pull_and_reduce(
        self, input, pieces: Sequence[torch.Tensor], output, team, op, collective: str
    ) -> tuple[list, list]:
        """Each member reads `pieces[p]` of every member's `input`, `p` its own position, into
        a staging slot per member, and reduces the slots into `output`: (works, finishes)."""

    @abstractmethod
    def _reduce_in_pieces(self, source: SymmetricBuffer, pieces: AllreducePieces, team, op) -> tuple[list, list]:
        """The two phases of an allreduce of more than two members out of `source`, the
        symmetric buffer of the input: (works, finishes)."""

    @abstractmethod
    def _allocate(
        self, shape: tuple[int, ...], dtype: torch.dtype, group_ranks: dict[int, int], what: str
    ) -> SymmetricBuffer:
        """The buffer, made with the members' agreement (`_exchange`)."""

    @abstractmethod
    def allgather(self, input, output, team, axis: int) -> tuple[list, list]:
        """`Communicator.allgather` by the copy engines: (works, finishes) of a `Work`."""

    @abstractmethod
    def exchange(self, offers: Sequence[Offer], pulls: Sequence[Pull]) -> tuple[list, list]:
        """Issues a batch's sends and recvs: (works, finishes) of its `Work`."""


class StreamWait:
    """Copies issued on the copy stream: waiting makes the current stream wait for them."""

    __slots__ = ("event", "device")

    def __init__(self, event: torch.cuda.Event, device: torch.device):
        self.event = event
        self.device = device

    def wait(self) -> None:
        torch.cuda.current_stream(self.device).wait_event(self.event)


class SymmetricMemoryEngine(CopyEngine):
    """GPUs: peers' buffers mapped by CUDA IPC (runtime/distributed/symmetric_memory.py),
    copies and signals on a dedicated stream, none of it a kernel (runtime/distributed/signals.py)."""

    def __init__(self, communicator: Communicator):
        super().__init__(communicator)
        self.device = communicator.device
        self.stream = torch.cuda.Stream(self.device)
        self.peer_streams: list[torch.cuda.Stream] = []
        """Streams for the pulls of one step from several peers at once (`_copy_from_peers`)."""
        self.watchdog = Watchdog(communicator.timeout_s, functools.partial(end_process, self.rank))

    def _allocate(self, shape, dtype, group_ranks, what) -> SymmetricBuffer:
        if len(group_ranks) == 1 or 0 in shape:
            # Nothing for a peer to read: no mapping needed, only the members' agreement.
            self._exchange(group_ranks, what, None)
            return SymmetricBuffer(torch.empty(shape, dtype=dtype, device=self.device), group_ranks)
        data = math.prod(shape) * dtype.itemsize
        pad_start = -(-data // PAD_ALIGNMENT) * PAD_ALIGNMENT
        pad_words = CHANNELS * len(group_ranks)
        size = pad_start + 4 * pad_words
        own, handle = allocate_shareable(size, self.device)
        handles = self._exchange(group_ranks, what, handle)
        memory = {
            device: own if device == self.rank else open_shared(handles[device], size, self.device)
            for device in group_ranks
        }
        # Mapping may wait for the GPU, which a member's transfer waiting for this member's
        # next signal could keep busy where members share a GPU: no member goes on before all
        # have mapped.
        self._exchange(group_ranks, f"{what}, mapped", None)
        peers = {device: m[:data].view(dtype) for device, m in memory.items()}
        pads = [memory[device][pad_start:].view(torch.uint32)[:pad_words] for device in sorted(group_ranks)]
        signals = StreamSignals(pads, group_ranks[self.rank])
        return SymmetricBuffer(peers[self.rank].view(shape), group_ranks, signals, peers)

    def _begin(self) -> torch.cuda.Event | None:
        """Starts a transfer: the copy stream waits for the current stream's work so far. The
        event the watchdog starts the transfer's clock with (none while a graph is captured:
        `GraphReplayer` watches the replays)."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        if torch.cuda.is_current_stream_capturing():
            return None
        started = torch.cuda.Event()
        started.record(self.stream)
        return started

    def _end(self, started: torch.cuda.Event | None, what: str) -> StreamWait:
        """The work of the transfer begun at `started`: what the copy stream has been given so far."""
        done = torch.cuda.Event()
        done.record(self.stream)
        if started is not None:
            self.watchdog.watch(started, done, f"{what} (backend cuda)")
        return StreamWait(done, self.device)

    def _pull(self, started, source: SymmetricBuffer, view, targets, team, what: str) -> StreamWait:
        """Each peer's part `view` of `source` into `targets[k]`, `k` its team position, in
        ring order between the team's barriers, on the copy stream: the work of the transfer
        begun at `started`. The member's own part is left to the wait (docs/copy-engine.md,
        *Own data*)."""
        with torch.cuda.stream(self.stream):
            self._copy_from_peers(source, [view] * len(team), targets, team)
            source.signals.barrier(READ_CHANNEL)
        return self._end(started, f"{what} in the team {list(team)}")

    def _copy_from_peers(self, source: SymmetricBuffer, views, targets, team) -> None:
        """Once the team's barrier says that every member's data is written, the part
        `views[k]` of `source` of each peer into `targets[k]`, `k` its team position, in ring
        order. A single peer's copy runs on the current stream; with several, each copy runs
        on a stream of its own that forks from the current stream and joins it again: on one
        stream the copies would run one after the other, each over the link of one peer,
        where on their own streams the copy engines pull from every peer at once."""
        _, *peers = ring(team.index(self.rank), len(team))
        source.signals.barrier(WRITTEN_CHANNEL)
        if len(peers) == 1:
            (k,) = peers
            targets[k].copy_(source.peer_view(views[k], team[k]))
            return
        current = torch.cuda.current_stream(self.device)
        while len(self.peer_streams) < len(peers):
            self.peer_streams.append(torch.cuda.Stream(self.device))
        for stream, k in zip(self.peer_streams, peers):
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                targets[k].copy_(source.peer_view(views[k], team[k]))
        for stream in self.peer_streams[: len(peers)]:
            current.wait_stream(stream)

    @collective
    def allgather(self, input, output, team, axis: int) -> tuple[list, list]:
        if input.numel() == 0:
            return [], []
        source = self._team_input(input, team, "an allgather")
        slots = [output.narrow(axis, k, 1) for k in range(len(team))]
        work = self._pull(self._begin(), source, input, slots, team, "an allgather")
        output.record_stream(self.stream)
        own = team.index(self.rank)
        return [work], [lambda: slots[own].copy_(input)]

    def _pull_and_reduce(self, input, pieces, output, team, op, collective) -> tuple[list, list]:
        """The pulls on the copy stream between the barriers, as the allgather's; the reduction
        is left to `hir.wait` on the waiting stream, so that the copy stream goes on with the
        next transfer instead of waiting for SMs."""
        if output.numel() == 0:
            return [], []
        source = self._team_input(input, team, collective)
        own = team.index(self.rank)
        piece = pieces[own]
        # The copy stream joins the caller's first: under graph capture, a buffer made on a
        # stream that is not yet capturing is not the graph's, and invalidates the capture.
        started = self._begin()
        with torch.cuda.stream(self.stream):
            staging = self._staging(piece, len(team))
        work = self._pull(started, source, piece, staging, team, collective)
        reduce = reduction(staging, own, piece, output, op)

        def finish() -> None:
            """The reduction; after it the staging buffer (made on the copy stream) is kept from
            the copy stream's next allocations until the waiting stream has read it."""
            reduce()
            staging.record_stream(torch.cuda.current_stream(self.device))

        return [work], [finish]

    def _reduce_in_pieces(self, source, pieces, team, op) -> tuple[list, list]:
        """Both phases on the copy stream, the reduction between them too: the second phase
        needs every member's reduced piece, so the copy stream could not go on without it.
        Here the reduction runs once SMs are free, at the latest when the waiting stream
        stops at the wait, where on that stream it would run only then (docs/copy-engine.md).
        The engine's scratch is free again for the next allreduce once the final barrier
        says that the peers are done reading it."""
        own, size = pieces.position, len(team)
        started = self._begin()
        with torch.cuda.stream(self.stream):
            staging = self._staging(pieces.inputs[own], size)
            self._copy_from_peers(source, [pieces.inputs[own]] * size, staging, team)
            reduction(staging, own, pieces.inputs[own], pieces.reduced(own), op, in_place=False)()
            pieces.outputs[own].copy_(pieces.reduced(own))
            # The scratch's barrier also says that every peer is done reading the input.
            reduced = [pieces.reduced(k) for k in range(size)]
            self._copy_from_peers(pieces.scratch, reduced, pieces.outputs, team)
            pieces.scratch.signals.barrier(READ_CHANNEL)
        pieces.outputs[own].record_stream(self.stream)  # the output's storage, all pieces
        return [self._end(started, f"an allreduce in the team {list(team)}")], []

    def exchange(self, offers: Sequence[Offer], pulls: Sequence[Pull]) -> tuple[list, list]:
        offered = [(self.symmetric_of(offer.buffer, [offer.peer]), offer.peer) for offer in offers]
        started = self._begin()
        with torch.cuda.stream(self.stream):
            for buffer, peer in offered:
                buffer.signals.signal(buffer.group_ranks[peer], WRITTEN_CHANNEL)
            for pull in pulls:
                source = self.symmetric_of(pull.source, [pull.peer])
                peer = source.group_ranks[pull.peer]
                source.signals.wait(peer, WRITTEN_CHANNEL)
                pull.buffer.copy_(source.peer_view(pull.source, pull.peer).reshape(pull.buffer.shape))
                source.signals.signal(peer, READ_CHANNEL)
            for buffer, peer in offered:
                buffer.signals.wait(buffer.group_ranks[peer], READ_CHANNEL)
        for pull in pulls:
            pull.buffer.record_stream(self.stream)
        peers = sorted({offer.peer for offer in offers} | {pull.peer for pull in pulls})
        return [self._end(started, f"a batch of sends and recvs with device(s) {peers}")], []


class PointToPointEngine(CopyEngine):
    """The CPU (gloo): the copy engines' schedule over torch.distributed messages."""

    def _allocate(self, shape, dtype, group_ranks, what) -> SymmetricBuffer:
        self._exchange(group_ranks, what, None)
        return SymmetricBuffer(torch.empty(shape, dtype=dtype, device=self.communicator.device), group_ranks)

    def _ring(self, team, target: Callable[[int], torch.Tensor], sent: Callable[[int], torch.Tensor]) -> tuple:
        """The ring's messages: at each step, receive `target(k)` from the member at team
        position `k = p + s` and send `sent(j)` to the member at `j = p - s`; with what copies
        a received target that is a strided view back into it."""
        operations, finishes = [], []
        for reading, sending in ring_messages(team.index(self.rank), len(team)):
            received, finish = writable(target(reading))
            operations.append(dist.P2POp(dist.irecv, received, team[reading]))
            operations.append(dist.P2POp(dist.isend, sent(sending), team[sending]))
            finishes += finish
        return operations, finishes

    @collective
    def allgather(self, input, output, team, axis: int) -> tuple[list, list]:
        self._team_input(input, team, "an allgather")
        output.narrow(axis, team.index(self.rank), 1).copy_(input)
        shard = input.contiguous()
        operations, finishes = self._ring(team, lambda k: output.narrow(axis, k, 1), lambda _: shard)
        return dist.batch_isend_irecv(operations), finishes

    def _pull_and_reduce(self, input, pieces, output, team, op, collective) -> tuple[list, list]:
        """The ring of the GPU's pulls as messages: at step `s` receive from `p + s` the piece
        it holds for this member, and send `p - s` the piece it owns; the reduction at the wait."""
        if output.numel() == 0:
            return [], []
        self._team_input(input, team, collective)
        position = team.index(self.rank)
        staging = self._staging(pieces[position], len(team))
        operations, _ = self._ring(team, staging.__getitem__, lambda k: pieces[k].contiguous())
        reduce = reduction(staging, position, pieces[position], output, op)
        return dist.batch_isend_irecv(operations), [reduce]

    def _reduce_in_pieces(self, source, pieces, team, op) -> tuple[list, list]:
        """The two phases as two batches of the ring's messages, each waited for as it is
        issued: the scratch that the second phase sends from is the next allreduce's."""
        own = pieces.position
        staging = self._staging(pieces.inputs[own], len(team))
        operations, _ = self._ring(team, staging.__getitem__, lambda k: pieces.inputs[k].contiguous())
        for work in dist.batch_isend_irecv(operations):
            work.wait()
        reduction(staging, own, pieces.inputs[own], pieces.reduced(own), op, in_place=False)()
        pieces.outputs[own].copy_(pieces.reduced(own))
        operations, finishes = self._ring(team, pieces.outputs.__getitem__, lambda _: pieces.reduced(own))
        for work in dist.batch_isend_irecv(operations):
            work.wait()
        for finish in finishes:
            finish()
        return [], []

    def exchange(self, offers: Sequence[Offer], pulls: Sequence[Pull]) -> tuple[list, list]:
        operations, finishes = [], []
        for pull in pulls:
            self.symmetric_of(pull.source, [pull.peer])
            target, finish = writable(pull.buffer)
            operations.append(dist.P2POp(dist.irecv, target, pull.peer))
            finishes += finish
        for offer in offers:
            self.symmetric_of(offer.buffer, [offer.peer])
            operations.append(dist.P2POp(dist.isend, offer.buffer.contiguous(), offer.peer))
        return dist.batch_isend_irecv(operations), finishes


def why_not_copy_engines(communicator: Communicator) -> str | None:
    """Why the copy engines cannot move the bytes of `communicator`'s world, or None where
    they can: GPUs, every rank on this host (torchrun's LOCAL_WORLD_SIZE is the world, as
    `hir-run` sets it too), and peer access between every two of the host's first
    LOCAL_WORLD_SIZE GPUs, which the mappings of symmetric memory need. Every rank answers
    alike from what its host shows it, with no communication, so that all choose the same."""
    if communicator.device.type != "cuda":
        return f"the copy engines are CUDA's, and this rank runs {communicator.where}"
    world = communicator.world_size
    if not communicator.joined or world == 1:
        return "a world of one device moves no bytes between devices"
    if not communicator.spans_world:
        return f"the program's ranks {list(communicator.ranks)} are part of the world; the copy engines serve a whole world"
    local = config.local_world_size
    if local != world:
        return f"the {world} ranks are not all on this host (LOCAL_WORLD_SIZE is {local or 'not set'})"
    if torch.cuda.device_count() < world:
        return f"this host shows {torch.cuda.device_count()} GPU(s) to each of its {world} ranks"
    for a, b in itertools.permutations(range(world), 2):
        if not torch.cuda.can_device_access_peer(a, b):
            return f"GPU {a} has no peer access to GPU {b}"
    return None


def copy_engine_for(communicator: Communicator) -> CopyEngine:
    """The copy engine of a communicator's device: symmetric memory on GPUs, messages on the CPU."""
    if communicator.device.type == "cuda":
        return SymmetricMemoryEngine(communicator)
    return PointToPointEngine(communicator)


class SymmetricAllocation:
    """The buffers of one `hir.allocate symmetric`: made once per communicator and shape, reused.

    Making a symmetric buffer is collective (every device of the mesh maps the others')
    and slow, so each run of the program gets the same buffer back; it lives as long as
    the op. Every preparation of the program shares it (`of`): a traced copy that made
    its own would map the peers' memory again, a collective that also waits for the GPU.
    """

    _of_op: ClassVar[weakref.WeakKeyDictionary[object, SymmetricAllocation]] = weakref.WeakKeyDictionary()

    def __init__(self, mesh: Sequence[int], dtype: torch.dtype, what: str):
        self.mesh = tuple(mesh)
        self.dtype = dtype
        self.what = what
        """The op, as errors about the allocation name it."""
        self.buffers: dict[tuple[Communicator, tuple[int, ...]], SymmetricBuffer] = {}

    @classmethod
    def of(cls, op: Operation, mesh: Sequence[int], dtype: torch.dtype) -> SymmetricAllocation:
        """The allocations of the op `op` (an `hir.allocate symmetric`), made on first use."""
        allocation = cls._of_op.get(op)
        if allocation is None:
            location = operation_location(op)
            what = f"'{op.name}' symmetric" + (f" at {location}" if location else "")
            allocation = cls._of_op[op] = cls(mesh, dtype, what)
        return allocation

    def __call__(self, communicator: Communicator, shape: Sequence[int]) -> torch.Tensor:
        key = (communicator, tuple(shape))
        buffer = self.buffers.get(key)
        if buffer is None:
            buffer = self.buffers[key] = communicator.copy_engine.allocate(shape, self.dtype, self.mesh, self.what)
        return buffer.tensor
