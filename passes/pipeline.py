"""`hir-lowering`: the default pipeline, from a fusion to a host program ready to run.

insert-reshardings, fusion-to-hir, stream-parallel, attention-ring, reduce-scatter-in-matmul,
reduce-scatter-ring, allreduce-in-matmul, allreduce-in-place, sum-in-matmul, copy-engine-pipelining,
per-stream-buffers, reduction-in-kernel, insert-deallocations, forward-buffers, buffer-layouts, then xDSL's
`canonicalize` and `cse` to fold the index arithmetic and share what the loops compute
twice. Those two only touch ops whose effects are known: arith, scf, and the hir ops
marked `Pure` (`hir.dim`, `hir.device_index`, `hir.number_of_streams`, `hir.stream`);
every other hir op has effects they leave alone.

It is a `Pipeline`: hir-opt, `Program.compile` and hir-run run, print, time and verify
each of its passes by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.passes import ModulePass
from xdsl.transforms.canonicalize import CanonicalizePass
from xdsl.transforms.common_subexpression_elimination import (
    CommonSubexpressionElimination,
)

from hostir.passes.driver import Pipeline
from hostir.passes.fusion.cat_to_rotate_half import CatToRotateHalf
from hostir.passes.fusion.flatten_rows import FlattenRows
from hostir.passes.fusion.insert_reshardings import InsertReshardings
from hostir.passes.hir.allreduce_in_matmul import AllreduceInMatmul
from hostir.passes.hir.allreduce_in_place import AllreduceInPlace
from hostir.passes.hir.buffer_layouts import BufferLayouts
from hostir.passes.hir.copy_engine_pipelining import CopyEnginePipelining
from hostir.passes.hir.forward_buffers import ForwardBuffers
from hostir.passes.hir.insert_deallocations import InsertDeallocations
from hostir.passes.hir.per_stream_buffers import PerStreamBuffers
from hostir.passes.hir.reduce_scatter_in_matmul import ReduceScatterInMatmul
from hostir.passes.hir.reduce_scatter_ring import ReduceScatterRing
from hostir.passes.hir.reduction_in_kernel import ReductionInKernel
from hostir.passes.hir.sum_in_matmul import SumInMatmul
from hostir.passes.lowering.attention_ring import AttentionRing
from hostir.passes.lowering.fusion_to_hir import FusionToHir
from hostir.passes.lowering.stream_parallel import StreamParallelLowering


@dataclass(frozen=True)
class HirLowering(Pipeline):
    """Lowers a fusion to a host program.

    `backend` and `nccl_reductions` go to `fusion-to-hir` (who moves the bytes of the
    collectives), the other options to `stream-parallel` (`p2p_order=device` reproduces pr4515's
    point-to-point allgather; the default is the ring order).
    `per_stream_buffers=false` leaves out `per-stream-buffers`, so that the
    intermediate buffers of stream loops keep one slice per iteration, as in the
    reference programs (and `copy-engine-pipelining` gives the buffers of its loops one
    slice per iteration too). `copy_engine_pipelining=false` leaves out
    `copy-engine-pipelining`, so that the loops of copy-engine transfers stay spread
    over the pool streams as `stream-parallel` made them. `reduce_scatter_in_matmul=false`
    leaves out `reduce-scatter-in-matmul`, so that a pairwise copy-engine reduce-scatter
    of a matmul's product sums its pieces in a pass of its own, `reduce_scatter_ring=false`
    leaves out `reduce-scatter-ring`, so that a copy-engine reduce-scatter of a matmul's
    product over more than two devices pulls its pieces once the whole product is computed,
    and `allreduce_in_matmul=false` leaves out `allreduce-in-matmul`, so that a pairwise
    copy-engine allreduce of a matmul's product does too. `allreduce_in_place=false` leaves
    out `allreduce-in-place`, so that an NCCL allreduce of a matmul's product copies it
    into its output before summing it there. `sum_in_matmul=false` leaves out
    `sum-in-matmul`, so that a kernel adds two GEMMs' products. `reduction_in_kernel=false`
    leaves out `reduction-in-kernel`, so that ATen sums a short axis that is not the last
    (a ring's pieces). `forward_buffers=false` leaves
    out `forward-buffers`, so that every copy of the program moves its bytes and every
    ATen result is copied into its out, as the reference programs print.
    `buffer_layouts=false` leaves out `buffer-layouts`, so that every buffer has its stream
    axis outermost in memory and a permute that reads one as a block copies.
    `cat_to_rotate_half=false` leaves out `cat-to-rotate-half`, so that the rotation of a
    rotary embedding stays the ATen calls (`split`, `neg`, `cat`) the graph wrote.
    `flatten_rows=false` leaves out `flatten-rows`, so that pointwise work on `[batch,
    sequence, width]` values and on their rows `[tokens, width]` stays in the two forms.
    """

    name = "hir-lowering"

    backend: str = "nccl"
    nccl_reductions: bool = False
    p2p_backend: str = "nccl"
    separate_sync_loop: bool = True
    p2p_order: str = "ring"
    per_stream_buffers: bool = True
    copy_engine_pipelining: bool = True
    reduce_scatter_in_matmul: bool = True
    reduce_scatter_ring: bool = True
    allreduce_in_matmul: bool = True
    allreduce_in_place: bool = True
    sum_in_matmul: bool = True
    reduction_in_kernel: bool = True
    forward_buffers: bool = True
    buffer_layouts: bool = True
    cat_to_rotate_half: bool = True
    flatten_rows: bool = True

    def __post_init__(self) -> None:
        self.passes()  # the passes refuse what they cannot use when they are built

    def passes(self) -> tuple[ModulePass, ...]:
        return (
            *([CatToRotateHalf()] if self.cat_to_rotate_half else []),
            *([FlattenRows()] if self.flatten_rows else []),
            InsertReshardings(),
            FusionToHir(self.backend, self.nccl_reductions),
            StreamParallelLowering(self.p2p_backend, self.separate_sync_loop, self.p2p_order),
            AttentionRing(),
            *([ReduceScatterInMatmul()] if self.reduce_scatter_in_matmul else []),
            *([ReduceScatterRing()] if self.reduce_scatter_ring else []),
            *([AllreduceInMatmul()] if self.allreduce_in_matmul else []),
            *([AllreduceInPlace()] if self.allreduce_in_place else []),
            *([SumInMatmul()] if self.sum_in_matmul else []),
            *([CopyEnginePipelining(self.per_stream_buffers)] if self.copy_engine_pipelining else []),
            *([PerStreamBuffers()] if self.per_stream_buffers else []),
            *([ReductionInKernel()] if self.reduction_in_kernel else []),
            InsertDeallocations(),
            *([ForwardBuffers()] if self.forward_buffers else []),
            *([BufferLayouts()] if self.buffer_layouts else []),
            CanonicalizePass(),
            CommonSubexpressionElimination(),
        )
