"""hostir's passes and dialects, by name, as hir-opt, xDSL's tools and the Python API find them.

Each factory imports its pass or dialect lazily, as xDSL's own registry does, so that
naming a pass does not import every other one. `HOSTIR_UNIVERSE` is what xDSL's plugin
entry point (`xdsl.universe` in pyproject.toml) names, so that `xdsl-opt` and `xdsl-run`
know hostir's dialects and passes once hostir is installed; hir-opt and `Program.compile`
know every pass of every universe installed (`available_passes`), xDSL's own among them.
"""

import functools
from collections.abc import Callable

from xdsl.ir import Dialect
from xdsl.passes import ModulePass
from xdsl.universe import Universe


def _insert_reshardings() -> type[ModulePass]:
    from hostir.passes.fusion.insert_reshardings import InsertReshardings

    return InsertReshardings


def _cat_to_rotate_half() -> type[ModulePass]:
    from hostir.passes.fusion.cat_to_rotate_half import CatToRotateHalf

    return CatToRotateHalf


def _flatten_rows() -> type[ModulePass]:
    from hostir.passes.fusion.flatten_rows import FlattenRows

    return FlattenRows


def _fusion_to_hir() -> type[ModulePass]:
    from hostir.passes.lowering.fusion_to_hir import FusionToHir

    return FusionToHir


def _stream_parallel() -> type[ModulePass]:
    from hostir.passes.lowering.stream_parallel import StreamParallelLowering

    return StreamParallelLowering


def _attention_ring() -> type[ModulePass]:
    from hostir.passes.lowering.attention_ring import AttentionRing

    return AttentionRing


def _reduce_scatter_in_matmul() -> type[ModulePass]:
    from hostir.passes.hir.reduce_scatter_in_matmul import ReduceScatterInMatmul

    return ReduceScatterInMatmul


def _reduce_scatter_ring() -> type[ModulePass]:
    from hostir.passes.hir.reduce_scatter_ring import ReduceScatterRing

    return ReduceScatterRing


def _allreduce_in_matmul() -> type[ModulePass]:
    from hostir.passes.hir.allreduce_in_matmul import AllreduceInMatmul

    return AllreduceInMatmul


def _allreduce_in_place() -> type[ModulePass]:
    from hostir.passes.hir.allreduce_in_place import AllreduceInPlace

    return AllreduceInPlace


def _sum_in_matmul() -> type[ModulePass]:
    from hostir.passes.hir.sum_in_matmul import SumInMatmul

    return SumInMatmul


def _reduction_in_kernel() -> type[ModulePass]:
    from hostir.passes.hir.reduction_in_kernel import ReductionInKernel

    return ReductionInKernel


def _copy_engine_pipelining() -> type[ModulePass]:
    from hostir.passes.hir.copy_engine_pipelining import CopyEnginePipelining

    return CopyEnginePipelining


def _per_stream_buffers() -> type[ModulePass]:
    from hostir.passes.hir.per_stream_buffers import PerStreamBuffers

    return PerStreamBuffers


def _insert_deallocations() -> type[ModulePass]:
    from hostir.passes.hir.insert_deallocations import InsertDeallocations

    return InsertDeallocations


def _forward_buffers() -> type[ModulePass]:
    from hostir.passes.hir.forward_buffers import ForwardBuffers

    return ForwardBuffers


def _buffer_layouts() -> type[ModulePass]:
    from hostir.passes.hir.buffer_layouts import BufferLayouts

    return BufferLayouts


def _auto_stream_parallel() -> type[ModulePass]:
    from hostir.passes.fusion.auto_stream_parallel import AutoStreamParallel

    return AutoStreamParallel


def _hir_lowering() -> type[ModulePass]:
    from hostir.passes.pipeline import HirLowering

    return HirLowering


HOSTIR_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "auto-stream-parallel": _auto_stream_parallel,
    "insert-reshardings": _insert_reshardings,
    "cat-to-rotate-half": _cat_to_rotate_half,
    "flatten-rows": _flatten_rows,
    "fusion-to-hir": _fusion_to_hir,
    "stream-parallel": _stream_parallel,
    "attention-ring": _attention_ring,
    "reduce-scatter-in-matmul": _reduce_scatter_in_matmul,
    "reduce-scatter-ring": _reduce_scatter_ring,
    "allreduce-in-matmul": _allreduce_in_matmul,
    "allreduce-in-place": _allreduce_in_place,
    "sum-in-matmul": _sum_in_matmul,
    "reduction-in-kernel": _reduction_in_kernel,
    "copy-engine-pipelining": _copy_engine_pipelining,
    "per-stream-buffers": _per_stream_buffers,
    "insert-deallocations": _insert_deallocations,
    "forward-buffers": _forward_buffers,
    "buffer-layouts": _buffer_layouts,
    "hir-lowering": _hir_lowering,
}



def _fusion_dialect() -> Dialect:
    from hostir_dialect.fusion import Fusion

    return Fusion


def _hir_dialect() -> Dialect:
    from hostir_dialect.hir import Hir

    return Hir


HOSTIR_DIALECTS: dict[str, Callable[[], Dialect]] = {"fusion": _fusion_dialect, "hir": _hir_dialect}
"""hostir's own dialects; the others a hostir program uses (builtin, func, arith, scf, shard) are xDSL's."""

HOSTIR_UNIVERSE = Universe(all_dialects=HOSTIR_DIALECTS, all_passes=HOSTIR_PASSES)
"""hostir's dialects and passes, as xDSL's plugin entry point `xdsl.universe` names them."""


@functools.cache
def _multiverse() -> Universe:
    return Universe.get_multiverse()


def available_dialects() -> dict[str, Callable[[], Dialect]]:
    """Every dialect of every xDSL universe installed, and hostir's (also when it is run
    from a checkout that is not installed)."""
    return {**_multiverse().all_dialects, **HOSTIR_DIALECTS}


def available_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Every pass of every xDSL universe installed, and hostir's (also when it is run from a
    checkout that is not installed)."""
    return {**_multiverse().all_passes, **HOSTIR_PASSES}


DEFAULT_PIPELINE = "hir-lowering"
"""The pipeline `hir-run` and `Program.compile` use unless told otherwise."""
