"""The peers of the overlap benchmark: each problem's two steps written in plain torch.

A `Steps` holds one rank's buffers for a problem cut into S chunks, and the two steps
of chunk i (the GEMM and the collective) as calls on them. From it come, for S = 1,
the GEMM alone, the collective alone and the two steps in sequence, and for S > 1
the NCCL-per-chunk pipeline written by hand, laid out as hostir lays out its host
program (reference/pr4401): every stream first waits for the caller's stream, in a
loop of its own, then chunk i runs on stream i mod streams and the caller's stream
waits for it. torch's symmetric-memory fused ops are the last peer, where torch has
them.

Every buffer is made with `torch.empty`, so that the benchmark's poisoned
allocations fill them with NaN before the run it checks. Layouts per rank r of D, for
whole X [M, K], W [K, N], Y = X @ W and chunks of m rows:

  allgather_matmul       X rows [r M/D, (r+1) M/D)      -> Y, gathered chunk i as [D, m, N]
  matmul_reduce_scatter  X columns [r K/D, (r+1) K/D)   -> the rows of Y chunk i gives rank r
  matmul_allreduce       X columns [r K/D, (r+1) K/D)   -> Y
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hostir.passes.analysis.cost_model import OverlapKind
from hostir.runtime.distributed.communicator import _all_gather_single, _reduce_scatter_single
from hostir.runtime.distributed.streams import stream_pool


class Unavailable(Exception):
    """A contender that this machine or this torch cannot run; the message says why."""


@dataclass
class Steps:
    """One rank's buffers of a problem in `chunks` chunks, and the two steps of each chunk."""

    kind: OverlapKind
    chunks: int
    gemm: Callable[[int], None]
    communicate: Callable[[int], None]
    output: torch.Tensor
    expected: Callable[[torch.Tensor], torch.Tensor]
    """This rank's `output` computed from the whole Y [M, N]."""

    def chunk(self, i: int) -> None:
        """Chunk i's steps in their order: the allgather before its GEMM, the GEMM before its reduction."""
        if self.kind == OverlapKind.ALLGATHER_MATMUL:
            self.communicate(i)
            self.gemm(i)
        else:
            self.gemm(i)
            self.communicate(i)


def local_operands(
    kind: OverlapKind, x: torch.Tensor, w: torch.Tensor, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s X and W of the whole X and W: X's rows for the allgather, K's share otherwise."""
    if kind == OverlapKind.ALLGATHER_MATMUL:
        return x.view(world, -1, x.shape[1])[rank], w
    k = x.shape[1] // world
    return x[:, rank * k : (rank + 1) * k].contiguous(), w[rank * k : (rank + 1) * k]


def steps(kind: OverlapKind, x: torch.Tensor, w: torch.Tensor, rank: int, world: int, chunks: int) -> Steps:
    """The steps of `kind` on whole X and W, this rank's share, cut into `chunks` chunks."""
    x_local, w_local = local_operands(kind, x, w, rank, world)
    m, n = x.shape[0], w.shape[1]
    options = dict(dtype=x.dtype, device=x.device)
    if kind == OverlapKind.ALLGATHER_MATMUL:
        rows = m // (world * chunks)
        pieces = x_local.view(chunks, rows, x.shape[1])
        gathered = torch.empty(chunks, world, rows, x.shape[1], **options)
        output = torch.empty(chunks, world, rows, n, **options)
        return Steps(
            kind,
            chunks,
            gemm=lambda i: torch.matmul(gathered[i], w_local, out=output[i]),
            communicate=lambda i: _all_gather_single(gathered[i].view(-1), pieces[i].view(-1)),
            output=output,
            # Gathered chunk i holds rows i*m .. of every rank's block of M/D rows.
            expected=lambda y: y.view(world, chunks, rows, n).transpose(0, 1),
        )
    if kind == OverlapKind.MATMUL_REDUCE_SCATTER:
        rows = m // (world * chunks)
        pieces = x_local.view(chunks, world * rows, x_local.shape[1])
        partial = torch.empty(chunks, world * rows, n, **options)
        output = torch.empty(chunks, rows, n, **options)
        return Steps(
            kind,
            chunks,
            gemm=lambda i: torch.matmul(pieces[i], w_local, out=partial[i]),
            communicate=lambda i: _reduce_scatter_single(output[i].view(-1), partial[i].view(-1)),
            output=output,
            expected=lambda y: y.view(chunks, world, rows, n)[:, rank],
        )
    rows = m // chunks
    pieces = x_local.view(chunks, rows, x_local.shape[1])
    output = torch.empty(chunks, rows, n, **options)
    return Steps(
        kind,
        chunks,
        gemm=lambda i: torch.matmul(pieces[i], w_local, out=output[i]),
        communicate=lambda i: dist.all_reduce(output[i]),
        output=output,
        expected=lambda y: y.view(chunks, rows, n),
    )


Build = Callable[[], tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], torch.Tensor] | None]]
"""Makes a contender's buffers; returns its run, which returns this rank's output, and that
output's expected value computed from the whole Y (None: the output is not the problem's)."""


@dataclass(frozen=True)
class Peers:
    """The peers of problem `kind` on whole X and W, as rank `rank` of `world` runs them."""

    kind: OverlapKind
    x: torch.Tensor
    w: torch.Tensor
    rank: int
    world: int

    def steps(self, chunks: int) -> Steps:
        return steps(self.kind, self.x, self.w, self.rank, self.world, chunks)

    def alone(self, step: str) -> Build:
        """Only the `gemm` or only the `communicate` step, whole, on the data it has in the problem.

        Both steps run once when the buffers are made, so the step timed reads what the
        other wrote: the allgather's GEMM multiplies the gathered X, not an uninitialised
        buffer, whose constant or repeated bits a GEMM multiplies measurably faster than
        random ones (the limit would then be too low). The run returns what the step
        returns (the GEMM its product); there is nothing to check it against.
        """

        def build():
            whole = self.steps(1)
            whole.chunk(0)
            run = getattr(whole, step)
            return (lambda: run(0)), None

        return build

    def in_sequence(self) -> Build:
        """The two steps one after the other on the caller's stream."""

        def build():
            whole = self.steps(1)

            def run() -> torch.Tensor:
                whole.chunk(0)
                return whole.output

            return run, whole.expected

        return build

    def per_chunk(self, chunks: int, streams: int) -> Build:
        """Chunk i on stream i mod `streams`, with hostir's synchronisation layout."""

        def build():
            pieces = self.steps(chunks)
            pool = stream_pool(self.x.device, streams)

            def run() -> torch.Tensor:
                with pool.restoring():
                    caller = pool.current()
                    for i in range(chunks):
                        pool.set_current(pool.get(i % pool.size))
                        pool.synchronize(caller)
                    for i in range(chunks):
                        stream = pool.get(i % pool.size)
                        pool.set_current(stream)
                        pieces.chunk(i)
                        pool.set_current(caller)
                        pool.synchronize(stream)
                return pieces.output

            return run, pieces.expected

        return build

    def symmetric_memory_fused(self) -> Build:
        """torch's fused op of `kind` (`torch.ops.symm_mem`); `Unavailable` on the CPU, for the
        allreduce (torch has none) and in a torch without the ops."""
        return self._fused

    def _fused(self):
        if self.x.device.type != "cuda":
            raise Unavailable("torch's symmetric memory needs CUDA")
        names = {
            OverlapKind.ALLGATHER_MATMUL: "fused_all_gather_matmul",
            OverlapKind.MATMUL_REDUCE_SCATTER: "fused_matmul_reduce_scatter",
        }
        if self.kind not in names:
            raise Unavailable(f"torch has no fused symmetric-memory op for {self.kind}")
        try:
            from torch.distributed import _symmetric_memory

            operator = getattr(torch.ops.symm_mem, names[self.kind])
        except (ImportError, AttributeError, RuntimeError) as error:
            raise Unavailable(f"this torch has no torch.ops.symm_mem.{names[self.kind]} ({error})") from None
        group_name = dist.group.WORLD.group_name
        with warnings.catch_warnings():
            # Needed before torch 2.9; deprecated (and a no-op) since.
            warnings.simplefilter("ignore", FutureWarning)
            _symmetric_memory.enable_symm_mem_for_group(group_name)
        x_local, w_local = local_operands(self.kind, self.x, self.w, self.rank, self.world)
        if self.kind == OverlapKind.ALLGATHER_MATMUL:
            return (lambda: operator(x_local, [w_local], 0, group_name)[1][0]), (lambda y: y)
        rows = self.x.shape[0] // self.world
        run = lambda: operator(x_local, w_local, "sum", 0, group_name)  # noqa: E731
        return run, (lambda y: y[self.rank * rows : (self.rank + 1) * rows])
