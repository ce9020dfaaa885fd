"""One rank's view of torch.distributed, with every communication of the hir dialect.

The methods take the buffers of a host program as they are (any strides, the
layouts of `docs/design.md`) and return a `Work`. torch.distributed wants contiguous
buffers whose chunks lie along the outermost axis, in process-group rank order, so a
method moves the axis it communicates along to the front (`movedim`) into a
contiguous temporary where the buffer is not already laid out that way; when the
result lands in a temporary, `Work.wait` copies it into the output after the
communication completes, on the then current stream.

A rank outside a team does nothing; a team of one device communicates nothing, so
its collectives are local copies and need no process group (this is all a
`Communicator.single()` ever runs). Every other team maps to a process group, created
once per team with `dist.new_group` (a collective call: `create_groups` makes all of a
program's groups up front, in program order, on every rank).

gloo has every collective used here since torch 2.2 (`all_gather_into_tensor` and
`reduce_scatter_tensor` on CPU: pytorch#112144), max/min/product reductions included,
so the CPU path uses the same calls as NCCL.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from xdsl.dialects.shard import ReductionKind

from hostir_dialect.text import HostirError

DEFAULT_TIMEOUT_S = float(os.environ.get("HOSTIR_TIMEOUT_S", "120"))
"""How long a communication may wait for its peers before it fails (HOSTIR_TIMEOUT_S)."""

REDUCE_OPS: dict[ReductionKind, dist.ReduceOp.RedOpType] = {
    ReductionKind.SUM: dist.ReduceOp.SUM,
    ReductionKind.PRODUCT: dist.ReduceOp.PRODUCT,
    ReductionKind.MAX: dist.ReduceOp.MAX,
    ReductionKind.MIN: dist.ReduceOp.MIN,
}

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# torch 2.13 renamed the tensor forms of allgather and reduce-scatter; older releases
# (>= 2.5, which hostir supports) only have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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


def _writable(output: torch.Tensor) -> tuple[torch.Tensor, list[Callable[[], object]]]:
    """A contiguous tensor to receive `output`'s data, and what copies it back if it is a temporary."""
    if output.is_contiguous():
        return output, []
    target = torch.empty_like(output, memory_format=torch.contiguous_format)
    return target, [lambda: output.copy_(target)]


def _positions_by_group_rank(team: Sequence[int]) -> list[int] | None:
    """The team position of each process-group rank (groups sort their ranks); None if sorted."""
    ranked = sorted(team)
    return None if ranked == list(team) else [team.index(d) for d in ranked]


def _group_ranks_by_position(team: Sequence[int]) -> list[int] | None:
    """The process-group rank of each team position; None if the team is sorted."""
    ranked = sorted(team)
    return None if ranked == list(team) else [ranked.index(d) for d in team]


def _collective(method):
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


class Communicator:
    """One rank's view of torch.distributed: NCCL when CUDA is available, gloo otherwise."""

    _from_env: Communicator | None = None

    def __init__(self, rank: int, world_size: int, device: torch.device, backend: str, timeout_s: float):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.backend = backend
        self.timeout_s = timeout_s
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        self._coalesced: tuple[list[dist.P2POp], Work] | None = None

    @classmethod
    def from_env(cls, timeout_s: float = DEFAULT_TIMEOUT_S) -> Communicator:
        """Joins (or reuses) the process group that torchrun's environment variables describe.

        The device is cuda:LOCAL_RANK when CUDA is available, else the CPU.
        """
        if cls._from_env is not None and dist.is_initialized():
            return cls._from_env
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if not dist.is_initialized():
            missing = [v for v in TORCHRUN_VARIABLES if v not in os.environ]
            if missing:
                raise HostirError(
                    "Communicator.from_env needs torchrun's environment variables "
                    + ", ".join(TORCHRUN_VARIABLES) + "; missing: " + ", ".join(missing)
                )
            if cuda:
                torch.cuda.set_device(device)
            dist.init_process_group(
                "nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s)
            )
        cls._from_env = cls(
            dist.get_rank(), dist.get_world_size(), device, dist.get_backend(), timeout_s
        )
        return cls._from_env

    @classmethod
    def single(cls, device: torch.device | None = None) -> Communicator:
        """A world of one device, with no process group: the current CUDA device, else the CPU."""
        if device is None:
            cuda = torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        return cls(0, 1, device, "nccl" if device.type == "cuda" else "gloo", DEFAULT_TIMEOUT_S)

    # -- process groups --------------------------------------------------------- #

    def group(self, team: Sequence[int]) -> dist.ProcessGroup | None:
        """The process group of `team` (None: the default group of the whole world)."""
        key = tuple(sorted(team))
        if key not in self._groups:
            self._groups[key] = (
                None
                if key == tuple(range(self.world_size))
                else dist.new_group(list(key), timeout=timedelta(seconds=self.timeout_s))
            )
        return self._groups[key]

    def create_groups(self, teams: Iterable[Sequence[int]]) -> None:
        """Creates the groups of `teams` in order; every rank must call this with the same teams."""
        for team in teams:
            if len(team) > 1:
                self.group(team)

    # -- collectives ---------------------------------------------------------------- #
    # `input`/`output` are None on a rank that holds no such buffer (outside its mesh).

    @_collective
    def allgather(self, input, output, team, axis: int) -> Work:
        """Every member's `input` (extent 1 along `axis`) lands at its team position along `axis`."""
        buffer, finishes = self._stacked(output, input, team, axis)
        work = _all_gather_single(
            buffer.view(-1), input.contiguous().view(-1), group=self.group(team), async_op=True
        )
        return Work([work], finishes)

    @_collective
    def gather(self, input, output, team, root: int, axis: int) -> Work:
        """`allgather` whose result only the root receives."""
        chunks, finishes = None, []
        if self.rank == root:
            buffer, finishes = self._stacked(output, input, team, axis)
            chunks = list(buffer.unbind(0))
        work = dist.gather(
            input.contiguous(), chunks, dst=root, group=self.group(team), async_op=True
        )
        return Work([work], finishes)

    @_collective
    def scatter(self, input, output, team, root: int, axis: int) -> Work:
        """Member i receives slice i (extent 1) along `axis` of the root's `input`."""
        chunks = None
        if self.rank == root:
            positions = _positions_by_group_rank(team) or range(len(team))
            chunks = [input.narrow(axis, p, 1).contiguous() for p in positions]
        target, finishes = _writable(output)
        work = dist.scatter(target, chunks, src=root, group=self.group(team), async_op=True)
        return Work([work], finishes)

    @_collective
    def allreduce(self, input, output, team, op: dist.ReduceOp.RedOpType) -> Work:
        """Every member's `output` is the reduction of all `input`s (same elements, any extent-1 axes)."""
        target, finishes = _writable(output)
        target.copy_(input.reshape(target.shape))
        work = dist.all_reduce(target, op, group=self.group(team), async_op=True)
        return Work([work], finishes)

    @_collective
    def reduce(self, input, output, team, root: int, op: dist.ReduceOp.RedOpType) -> Work:
        """`allreduce` whose result only the root receives."""
        if self.rank == root:
            target, finishes = _writable(output)
            target.copy_(input.reshape(target.shape))
        else:
            # The reduction may use a non-root's buffer as scratch: never the input.
            target, finishes = input.clone(memory_format=torch.contiguous_format), []
        work = dist.reduce(target, root, op, group=self.group(team), async_op=True)
        return Work([work], finishes)

    @_collective
    def reduce_scatter(self, input, output, team, op: dist.ReduceOp.RedOpType, axis: int) -> Work:
        """Member i's `output` is slice i along `axis` of the reduction of all `input`s."""
        stacked = input.movedim(axis, 0)
        order = _positions_by_group_rank(team)
        if order is not None:
            stacked = stacked[order]
        target, finishes = _writable(output)
        work = _reduce_scatter_single(
            target.view(-1),
            stacked.contiguous().view(-1),
            op,
            group=self.group(team),
            async_op=True,
        )
        return Work([work], finishes)

    @_collective
    def broadcast(self, input, output, team, root: int) -> Work:
        """The root's `input` lands in every member's `output`."""
        if output is None:
            # The root broadcasts from its input without holding an output; a broadcast
            # only reads the root's buffer.
            target, finishes = input.contiguous(), []
        else:
            target, finishes = _writable(output)
            if self.rank == root:
                target.copy_(input.reshape(target.shape))
        work = dist.broadcast(target, root, group=self.group(team), async_op=True)
        return Work([work], finishes)

    def send_recv(self, input, output, team: Sequence[int], root: int) -> Work:
        """The root (the sender of a team of two) sends `input` into the other's `output`."""
        (receiver,) = (d for d in team if d != root)
        if self.rank == root:
            return self.send(input, receiver)
        if self.rank == receiver:
            return self.recv(output, root)
        return DONE

    # -- point to point ------------------------------------------------------------- #

    def send(self, buffer: torch.Tensor, peer: int) -> Work:
        return self._p2p(dist.isend, buffer.contiguous(), peer, [])

    def recv(self, buffer: torch.Tensor, peer: int) -> Work:
        target, finishes = _writable(buffer)
        return self._p2p(dist.irecv, target, peer, finishes)

    def start_coalescing(self) -> None:
        """Sends and receives until `end_coalescing` are issued together, as one batch."""
        self._coalesced = ([], Work())

    def end_coalescing(self) -> Work:
        """Issues the batch; its work (also what each send and recv of it returned) covers it."""
        if self._coalesced is None:
            raise RuntimeError("end_coalescing without a start_coalescing")
        operations, work = self._coalesced
        self._coalesced = None
        if operations:
            work.works = dist.batch_isend_irecv(operations)
        return work

    def _p2p(self, function, tensor: torch.Tensor, peer: int, finishes) -> Work:
        if self._coalesced is None:
            return Work([function(tensor, peer)], finishes)
        operations, work = self._coalesced
        operations.append(dist.P2POp(function, tensor, peer))
        work.finishes.extend(finishes)
        return work

    # -- layouts ---------------------------------------------------------------------- #

    def _stacked(self, output, input, team, axis: int):
        """A contiguous (team size, *input.shape) buffer in group order, whose data ends up in `output`.

        `output` is the stack merged into `axis`; when that is its own layout (axis 0,
        contiguous, sorted team) the buffer is `output` itself.
        """
        shape = (len(team), *input.shape)
        order = _group_ranks_by_position(team)
        if axis == 0 and order is None and output.is_contiguous():
            return output.view(shape), []
        buffer = torch.empty(shape, dtype=input.dtype, device=input.device)

        def finish():
            stacked = buffer if order is None else buffer[order]
            output.copy_(stacked.movedim(0, axis).flatten(axis, axis + 1))

        return buffer, [finish]
