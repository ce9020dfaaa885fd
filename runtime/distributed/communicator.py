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
`Communicator.single()` ever runs). A root outside the mesh that holds the shards
(the team is that mesh, then the root: docs/design.md) holds no shard: it receives
all of a gather, sends all of a scatter, and adds the identity of the reduction to a
reduce.

`backend cuda` hands allgather, allreduce, reduce_scatter and batched send/recv to
the communicator's copy engine (`copy_engine.py`). Every other team maps to a
process group, created once per team with `dist.new_group` (a collective call:
`create_groups` makes all of a program's groups up front, in program order, on every
rank). A communicator of part of the world (`of_group`: the process group of a graph
whose ranks alone run the program) takes that group for its ranks, and has the members
of a smaller team alone make its group.

gloo has every collective used here since torch 2.2 (`all_gather_into_tensor` and
`reduce_scatter_tensor` on CPU: pytorch#112144), max/min/product reductions included,
so the CPU path uses the same calls as NCCL.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from xdsl.dialects.shard import ReductionKind

from hostir_dialect.hir import CommunicatorBackend
from hostir_dialect.text import HostirError
from hostir import config
from hostir.config import DEFAULT_TIMEOUT_S
from hostir.runtime.distributed.copy_engine import CopyEngine, copy_engine_for
from hostir.runtime.distributed.work import DONE, Offer, Pull, Work, collective, writable

JOIN_TIMEOUT_S = DEFAULT_TIMEOUT_S
"""How long joining the process group may wait for the other ranks, at least: every rank must
have started, which on a loaded machine takes longer than a short communication timeout. A
rank that never comes is the launcher's to report (hir-run's, or torchrun's agent)."""

REDUCE_OPS: dict[ReductionKind, dist.ReduceOp.RedOpType] = {
    ReductionKind.SUM: dist.ReduceOp.SUM,
    ReductionKind.PRODUCT: dist.ReduceOp.PRODUCT,
    ReductionKind.MAX: dist.ReduceOp.MAX,
    ReductionKind.MIN: dist.ReduceOp.MIN,
}

TORCHRUN_SETTINGS = ("rank", "world_size", "master_addr", "master_port")
"""The settings of torchrun's variables that joining a process group needs."""

# torch 2.13 renamed the tensor forms of allgather and reduce-scatter; older releases
# (>= 2.5, which hostir supports) only have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _check_one_gpu_per_local_rank(local_ranks: int) -> None:
    """NCCL ranks take one GPU each: every rank of a machine that has too few says so
    before joining the group, where the ranks that have one would wait for the others."""
    gpus = torch.cuda.device_count()
    if local_ranks > gpus:
        raise HostirError(
            f"{local_ranks} ranks on this machine need {local_ranks} GPUs (one per NCCL rank); "
            f"it has {gpus}: start at most {gpus} per machine, or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=) to run the ranks on the CPU with gloo"
        )


def _positions_by_group_rank(team: Sequence[int]) -> list[int] | None:
    """The team position of each process-group rank (groups sort their ranks); None if sorted."""
    ranked = sorted(team)
    return None if ranked == list(team) else [team.index(d) for d in ranked]


def _group_ranks_by_position(team: Sequence[int]) -> list[int] | None:
    """The process-group rank of each team position; None if the team is sorted."""
    ranked = sorted(team)
    return None if ranked == list(team) else [ranked.index(d) for d in team]


class Communicator:
    """One rank's view of torch.distributed: NCCL when CUDA is available, gloo otherwise."""

    _from_env: Communicator | None = None

    def __init__(
        self,
        rank: int,
        world_size: int,
        device: torch.device,
        backend: str,
        timeout_s: float,
        joined: bool = True,
        ranks: Sequence[int] | None = None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.ranks = tuple(range(world_size)) if ranks is None else tuple(ranks)
        """The ranks that run programs together with this one: the world, or part of it (`of_group`)."""
        self.device = device
        self.backend = backend
        self.timeout_s = timeout_s
        self.joined = joined
        """Whether this rank is in a process group (not so a `single()` world)."""
        self._groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        self._coalesced: Batch | None = None

    @property
    def where(self) -> str:
        """Where this rank runs, for a report: 'gloo on cpu', or 'cpu, no process group' for a
        world of one that needs none."""
        if not self.joined:
            return f"{self.device}, no process group"
        return f"{self.backend} on {self.device}"

    @classmethod
    def from_env(cls, timeout_s: float | None = None) -> Communicator:
        """Joins (or reuses) the process group that torchrun's environment variables describe.

        The device is cuda:LOCAL_RANK when CUDA is available, else the CPU. `timeout_s`
        bounds each communication, and defaults to `hostir.config.timeout_s` (HOSTIR_TIMEOUT_S,
        else DEFAULT_TIMEOUT_S); joining waits for the other ranks for JOIN_TIMEOUT_S if that is
        longer. torchrun's variables are read through `hostir.config`, which refuses one that
        holds no whole number.
        """
        if cls._from_env is not None and dist.is_initialized():
            return cls._from_env
        timeout_s = config.timeout_s if timeout_s is None else timeout_s
        local_rank, local_world_size = config.local_rank or 0, config.local_world_size
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if not dist.is_initialized():
            missing = [config.SETTINGS[name].variable for name in TORCHRUN_SETTINGS if getattr(config, name) is None]
            if missing:
                raise HostirError(
                    "Communicator.from_env needs torchrun's environment variables "
                    + ", ".join(config.SETTINGS[name].variable for name in TORCHRUN_SETTINGS)
                    + "; missing: "
                    + ", ".join(missing)
                )
            if cuda:
                _check_one_gpu_per_local_rank(local_world_size or local_rank + 1)
                torch.cuda.set_device(device)
            join_timeout = timedelta(seconds=max(timeout_s, JOIN_TIMEOUT_S))
            dist.init_process_group("nccl" if cuda else "gloo", timeout=join_timeout)
            # init_process_group takes one timeout for the join and for the collectives;
            # torch's setter for a group's timeout gives the collectives theirs.
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s))
        cls._from_env = cls(dist.get_rank(), dist.get_world_size(), device, dist.get_backend(), timeout_s)
        return cls._from_env

    @classmethod
    def of_group(cls, group: dist.ProcessGroup, device: torch.device, timeout_s: float) -> Communicator:
        """This rank, for programs that the ranks of `group` alone run (a graph whose
        collectives name the tensor-parallel group of a 2-D mesh): their collectives go
        through `group`, and a smaller team's group is made by its members alone."""
        ranks = tuple(dist.get_process_group_ranks(group))
        communicator = cls(dist.get_rank(), dist.get_world_size(), device, dist.get_backend(group), timeout_s, ranks=ranks)
        communicator._groups[tuple(sorted(ranks))] = group
        return communicator

    @property
    def spans_world(self) -> bool:
        return self.ranks == tuple(range(self.world_size))

    @classmethod
    def default(cls) -> Communicator:
        """The process group torchrun describes when torch.distributed is initialised, else a world of one."""
        return cls.from_env() if dist.is_initialized() else cls.single()

    @classmethod
    def single(cls, device: torch.device | None = None) -> Communicator:
        """A world of one device, with no process group: the current CUDA device, else the CPU."""
        if device is None:
            cuda = torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        return cls(0, 1, device, "nccl" if device.type == "cuda" else "gloo", config.timeout_s, joined=False)

    # -- process groups --------------------------------------------------------- #

    def group(self, team: Sequence[int]) -> dist.ProcessGroup | None:
        """The process group of `team` (None: the default group of the whole world)."""
        key = tuple(sorted(team))
        if key not in self._groups:
            self._groups[key] = (
                None
                if key == tuple(range(self.world_size))
                else dist.new_group(
                    list(key),
                    timeout=timedelta(seconds=self.timeout_s),
                    use_local_synchronization=not self.spans_world,
                )
            )
        return self._groups[key]

    def create_groups(self, teams: Iterable[Sequence[int]]) -> None:
        """Creates the groups of `teams` in order; every rank must call this with the same teams."""
        for team in teams:
            if len(team) > 1:
                self.group(team)

    # -- collectives ---------------------------------------------------------------- #
    # `input`/`output` are None on a rank that holds no such buffer (outside its mesh).

    @collective
    def allgather(self, input, output, team, axis: int, backend=CommunicatorBackend.NCCL) -> Work:
        """Every member's `input` (extent 1 along `axis`) lands at its team position along `axis`."""
        if backend == CommunicatorBackend.CUDA:
            return Work(*self.copy_engine.allgather(input, output, team, axis))
        buffer, finishes = self._stacked(output, input.shape, team, axis)
        work = _all_gather_single(
            buffer.view(-1), input.contiguous().view(-1), group=self.group(team), async_op=True
        )
        return Work([work], finishes)

    @collective
    def gather(self, input, output, team, root: int, axis: int) -> Work:
        """`allgather` whose result only the root receives; a root outside the input's mesh sends nothing."""
        chunks, finishes = None, []
        if self.rank == root:
            shard = output.narrow(axis, 0, 1)
            buffer, finishes = self._stacked(output, shard.shape, team, axis)
            chunks = list(buffer.unbind(0))
            if input is None:
                input = torch.empty_like(shard)
        work = dist.gather(input.contiguous(), chunks, dst=root, group=self.group(team), async_op=True)
        return Work([work], finishes)

    @collective
    def scatter(self, input, output, team, root: int, axis: int) -> Work:
        """Member i receives slice i (extent 1) along `axis` of the root's `input`.

        A root outside the output's mesh is the last member and has no slice: it sends
        itself an unused chunk, received into an unused buffer.
        """
        chunks = None
        if self.rank == root:
            shards = input.shape[axis]
            spare = torch.empty_like(input.narrow(axis, 0, 1), memory_format=torch.contiguous_format)
            chunks = [
                input.narrow(axis, p, 1).contiguous() if p < shards else spare
                for p in _positions_by_group_rank(team) or range(len(team))
            ]
        if output is None:
            target, finishes = torch.empty_like(chunks[0]), []
        else:
            target, finishes = writable(output)
        work = dist.scatter(target, chunks, src=root, group=self.group(team), async_op=True)
        return Work([work], finishes)

    @collective
    def allreduce(
        self, input, output, team, op: dist.ReduceOp.RedOpType, backend=CommunicatorBackend.NCCL
    ) -> Work:
        """Every member's `output` is the reduction of all `input`s (same elements, any extent-1 axes)."""
        if backend == CommunicatorBackend.CUDA:
            return Work(*self.copy_engine.allreduce(input, output, team, op))
        target, finishes = writable(output)
        # NCCL sums in place. An input that is already the output's memory (the GEMM wrote
        # it there: allreduce-in-place) moves no byte: copy_ onto its own elements returns.
        target.copy_(input.reshape(target.shape))
        work = dist.all_reduce(target, op, group=self.group(team), async_op=True)
        return Work([work], finishes)

    @collective
    def reduce(self, input, output, team, root: int, op: dist.ReduceOp.RedOpType) -> Work:
        """`allreduce` whose result only the root receives; a root outside the input's mesh adds the identity."""
        if self.rank == root:
            target, finishes = writable(output)
            if input is None:
                target.fill_(_identity(op, target.dtype))
            else:
                target.copy_(input.reshape(target.shape))
        else:
            # The reduction may use a non-root's buffer as scratch: never the input.
            target, finishes = input.clone(memory_format=torch.contiguous_format), []
        work = dist.reduce(target, root, op, group=self.group(team), async_op=True)
        return Work([work], finishes)

    @collective
    def reduce_scatter(
        self, input, output, team, op: dist.ReduceOp.RedOpType, axis: int, backend=CommunicatorBackend.NCCL
    ) -> Work:
        """Member i's `output` is slice i along `axis` of the reduction of all `input`s."""
        if backend == CommunicatorBackend.CUDA:
            return Work(*self.copy_engine.reduce_scatter(input, output, team, op, axis))
        stacked = input.movedim(axis, 0)
        order = _positions_by_group_rank(team)
        if order is not None:
            stacked = stacked[order]
        target, finishes = writable(output)
        work = _reduce_scatter_single(
            target.view(-1),
            stacked.contiguous().view(-1),
            op,
            group=self.group(team),
            async_op=True,
        )
        return Work([work], finishes)

    @collective
    def broadcast(self, input, output, team, root: int) -> Work:
        """The root's `input` lands in every member's `output`."""
        if output is None:
            # The root broadcasts from its input without holding an output; a broadcast
            # only reads the root's buffer.
            target, finishes = input.contiguous(), []
        else:
            target, finishes = writable(output)
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

    def send(self, buffer: torch.Tensor, peer: int, backend=CommunicatorBackend.NCCL) -> Work:
        """Sends `buffer` to `peer`; with the copy engines, lets `peer` read it (in a batch only)."""
        if backend == CommunicatorBackend.CUDA:
            batch = self._copy_engine_batch()
            batch.offers.append(Offer(buffer, peer))
            return batch.work
        return self._p2p(dist.isend, buffer.contiguous(), peer, [])

    def recv(
        self,
        buffer: torch.Tensor,
        peer: int,
        backend=CommunicatorBackend.NCCL,
        source: torch.Tensor | None = None,
    ) -> Work:
        """Receives into `buffer` from `peer`; with the copy engines, copies `peer`'s copy of
        `source`, the symmetric buffer this rank sends `peer` in the same batch (in a batch only)."""
        if backend == CommunicatorBackend.CUDA:
            batch = self._copy_engine_batch()
            batch.pulls.append(Pull(buffer, peer, source))
            return batch.work
        target, finishes = writable(buffer)
        return self._p2p(dist.irecv, target, peer, finishes)

    def start_coalescing(self) -> None:
        """Sends and receives until `end_coalescing` are issued together, as one batch."""
        self._coalesced = Batch()

    def end_coalescing(self) -> Work:
        """Issues the batch; its work (also what each send and recv of it returned) covers it."""
        if self._coalesced is None:
            raise RuntimeError("end_coalescing without a start_coalescing")
        batch, self._coalesced = self._coalesced, None
        work = batch.work
        if batch.operations:
            work.works = dist.batch_isend_irecv(batch.operations)
        if batch.offers or batch.pulls:
            works, finishes = self.copy_engine.exchange(batch.offers, batch.pulls)
            work.works += works
            work.finishes += finishes
        return work

    def _p2p(self, function, tensor: torch.Tensor, peer: int, finishes) -> Work:
        if self._coalesced is None:
            return Work([function(tensor, peer)], finishes)
        batch = self._coalesced
        batch.operations.append(dist.P2POp(function, tensor, peer))
        batch.work.finishes.extend(finishes)
        return batch.work

    def _copy_engine_batch(self) -> Batch:
        """The open batch, which a copy-engine send or recv must be in: a recv reads what the
        peer sends in its batch of the pair, and the batch's work covers both."""
        if self._coalesced is None:
            raise HostirError(
                "a send or recv with backend cuda pairs with the recv or send of the same peer in "
                "its batch: issue it between start_coalescing and end_coalescing"
            )
        return self._coalesced

    @property
    def store(self) -> dist.Store:
        """The key-value store of the world's process group, which every rank of it reaches
        (the copy engines exchange their buffers' handles through it)."""
        return dist.distributed_c10d._get_default_store()

    @functools.cached_property
    def copy_engine(self) -> CopyEngine:
        """This rank's copy engine, made on first use."""
        return copy_engine_for(self)

    # -- layouts ---------------------------------------------------------------------- #

    def _stacked(self, output, shard_shape, team, axis: int):
        """A contiguous (team size, *shard_shape) buffer in group order, whose data ends up in `output`.

        `output` is the stack, in team order, merged into `axis`; it has fewer positions
        than the team when the root of a gather is not one of the shards' devices, and
        those are dropped. When the stack is `output`'s own layout (axis 0, contiguous,
        sorted team, one position per member) the buffer is `output` itself.
        """
        shape = (len(team), *shard_shape)
        shards = output.shape[axis]
        order = _group_ranks_by_position(team)
        if axis == 0 and order is None and shards == len(team) and output.is_contiguous():
            return output.view(shape), []
        buffer = torch.empty(shape, dtype=output.dtype, device=output.device)

        def finish():
            stacked = buffer if order is None else buffer[order]
            output.copy_(stacked[:shards].movedim(0, axis).flatten(axis, axis + 1))

        return buffer, [finish]


@dataclass(eq=False)
class Batch:
    """The sends and recvs between `start_coalescing` and `end_coalescing`, and the work covering them."""

    operations: list[dist.P2POp] = field(default_factory=list)
    offers: list[Offer] = field(default_factory=list)
    pulls: list[Pull] = field(default_factory=list)
    work: Work = field(default_factory=Work)


def _identity(op: dist.ReduceOp.RedOpType, dtype: torch.dtype) -> float | int:
    """The value that reduction `op` leaves unchanged, in `dtype`."""
    if op == dist.ReduceOp.SUM:
        return 0
    if op == dist.ReduceOp.PRODUCT:
        return 1
    if dtype.is_floating_point:
        return -math.inf if op == dist.ReduceOp.MAX else math.inf
    info = torch.iinfo(dtype)
    return info.min if op == dist.ReduceOp.MAX else info.max
