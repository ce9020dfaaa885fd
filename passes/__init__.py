"""hostir's passes, by name, as hir-opt and the Python API find them.

Each factory imports its pass lazily, as xDSL's own registry does, so that naming a
pass does not import every other one.
"""

from collections.abc import Callable

from xdsl.passes import ModulePass


def _insert_reshardings() -> type[ModulePass]:
    from passes.insert_reshardings import InsertReshardings

    return InsertReshardings


def _fusion_to_hir() -> type[ModulePass]:
    from passes.fusion_to_hir import FusionToHir

    return FusionToHir


def _stream_parallel() -> type[ModulePass]:
    from passes.stream_parallel import StreamParallelLowering

    return StreamParallelLowering


def _reduce_scatter_in_matmul() -> type[ModulePass]:
    from passes.reduce_scatter_in_matmul import ReduceScatterInMatmul

    return ReduceScatterInMatmul


def _allreduce_in_matmul() -> type[ModulePass]:
    from passes.allreduce_in_matmul import AllreduceInMatmul

    return AllreduceInMatmul


def _copy_engine_pipelining() -> type[ModulePass]:
    from passes.copy_engine_pipelining import CopyEnginePipelining

    return CopyEnginePipelining


def _per_stream_buffers() -> type[ModulePass]:
    from passes.per_stream_buffers import PerStreamBuffers

    return PerStreamBuffers


def _insert_deallocations() -> type[ModulePass]:
    from passes.insert_deallocations import InsertDeallocations

    return InsertDeallocations


def _hir_lowering() -> type[ModulePass]:
    from passes.pipeline import HirLowering

    return HirLowering


HOSTIR_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "insert-reshardings": _insert_reshardings,
    "fusion-to-hir": _fusion_to_hir,
    "stream-parallel": _stream_parallel,
    "reduce-scatter-in-matmul": _reduce_scatter_in_matmul,
    "allreduce-in-matmul": _allreduce_in_matmul,
    "copy-engine-pipelining": _copy_engine_pipelining,
    "per-stream-buffers": _per_stream_buffers,
    "insert-deallocations": _insert_deallocations,
    "hir-lowering": _hir_lowering,
}

DEFAULT_PIPELINE = "hir-lowering"
"""The pipeline `hir-run` and `Program.compile` use unless told otherwise."""
