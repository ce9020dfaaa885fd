"""Fused CUDA kernels for pointwise segments, compiled by CuPy and launched on buffers.

`hir.launch_kernel @seg` runs a `func.func` of pointwise fusion ops on buffers. On a
GPU, `SegmentKernel(seg).launch(ins, outs)` runs it as one kernel that reads every
input once and writes every output once; it returns False where it cannot (CPU
tensors, no CuPy), and the caller then evaluates the segment eagerly with
`fusion_eval`, whose results the kernel reproduces (docs/kernels.md). Each launch is
planned once per buffer signature (`SegmentKernel.plan`: the iteration space and its
layout) and its kernel compiled once per source (`KernelCache`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from xdsl.dialects import func

from hostir_dialect.text import HostirError
from hostir import logs
from hostir.runtime.codegen.body import ROW_NAME, SegmentBody
from hostir_dialect.fusion import DYNAMIC
from hostir.runtime.codegen.layout import LINEAR, Launch, LaunchLayout, RowLayout, contiguous_strides, merge_axes
from hostir.runtime.codegen.source import KERNEL_NAME, kernel_source

try:
    import cupy
except ImportError:  # CuPy is the optional `gpu` extra; without it segments run eagerly.
    cupy = None

THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 128
"""The most blocks per SM a launch asks for (16 waves of 8 resident blocks); grid-stride
loops do the rest. On an H100 this moved 10% more bytes per second than one wave, and
10% more than one vector per thread (docs/kernels.md)."""
VECTOR_BYTES = 16
"""The widest load a thread issues (ld.global.v4.u32)."""
WARP_ROW_LIMIT = 1024
"""The longest row that one warp reduces; a longer one takes a block."""
ROWS_PER_BLOCK = 8
"""Warps (rows) per block of a kernel of one warp per row."""
ELEMENTS_PER_THREAD = 8
"""About how many elements of a row each thread of a block per row computes: a row of 4096
takes 512 threads, of 8192 1024 (the most a block has)."""



class KernelCache:
    """Compiled kernels by source, shared by every segment of the process."""

    def __init__(self) -> None:
        self.kernels: dict[str, object] = {}
        self.compilations = 0
        """Kernels compiled by this process (cache misses); tests check it stays put."""

    def kernel(self, source: str, segment: str):
        """The `cupy.RawKernel` of `source`, compiled on first request."""
        kernel = self.kernels.get(source)
        if kernel is None:
            # Every rank compiles the same kernels: the first says so.
            if logs.wanted("cuda_kernel") and (not dist.is_initialized() or dist.get_rank() == 0):
                logs.say("cuda_kernel", f"// hostir: the CUDA kernel of segment @{segment}\n{source}")
            kernel = cupy.RawKernel(source, KERNEL_NAME)
            kernel.compile()
            self.compilations += 1
            self.kernels[source] = kernel
        return kernel


CACHE = KernelCache()


class KernelFallbackWarning(UserWarning):
    """A fused segment ran as torch eager ops on the GPU because no kernel can compute it."""


def launchable(buffers: Sequence[torch.Tensor]) -> bool:
    """Whether a kernel can run on these buffers: CuPy imports and they are all CUDA tensors."""
    return cupy is not None and all(t.is_cuda for t in buffers)


@functools.cache
def _multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class PreparedLaunch(NamedTuple):
    """What launches on buffers of one signature share: all but the pointers."""

    kernel: object | None
    """The `cupy.RawKernel`; None when there are no elements to compute."""
    device: int
    blocks: int
    threads: int
    sizes: tuple
    """The kernel arguments after the pointers: elements, extents, strides."""


def _signature(tensor: torch.Tensor) -> tuple:
    """What a launch's preparation reads from a buffer: everything but its address's high bits."""
    return (
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        tensor.device,
        tensor.data_ptr() % VECTOR_BYTES,
    )


class SegmentKernel:
    """A pointwise segment run as one CUDA kernel per buffer layout.

    Built once per `hir.launch_kernel` while a program is prepared: analysing the
    segment there means an op a kernel cannot compute is reported before anything
    runs, on CPU and GPU alike. Launches are prepared once per buffer signature
    (shapes, strides, dtypes, device, alignment), so a step of a training loop pays
    for the pointers and the launch only.
    """

    def __init__(self, segment: func.FuncOp):
        self.body = SegmentBody.of(segment)
        self.kernels: dict[LaunchLayout, object] = {}
        self.launches: dict[tuple, PreparedLaunch] = {}

    def launch(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> bool:
        """Runs the segment on the current torch stream, writing `outs`; False if it cannot.

        It cannot without CuPy or on tensors that are not all CUDA tensors: the caller
        then evaluates the segment eagerly. Raises HostirError when the buffers do not
        fit the segment.
        """
        if not launchable((*ins, *outs)):
            return False
        signature = (tuple(map(_signature, ins)), tuple(map(_signature, outs)))
        prepared = self.launches.get(signature)
        if prepared is None:
            prepared = self.launches[signature] = self._prepare(ins, outs)
        if prepared.kernel is None:
            return True
        pointers = [cupy.uint64(ins[a.operand].data_ptr()) for a in self.body.loads]
        pointers += [cupy.uint64(outs[a.operand].data_ptr()) for a in self.body.stores]
        stream = cupy.cuda.Stream.from_external(torch.cuda.current_stream(prepared.device))
        with cupy.cuda.Device(prepared.device):
            prepared.kernel(
                (prepared.blocks,),
                (prepared.threads,),
                (*pointers, *prepared.sizes),
                stream=stream,
            )
        return True

    def _prepare(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> PreparedLaunch:
        launch = self.plan(ins, outs)
        device = outs[0].device.index
        if launch.elements == 0:
            return PreparedLaunch(None, device, 0, 0, ())
        layout = launch.layout
        kernel = self.kernels.get(layout)
        if kernel is None:
            with cupy.cuda.Device(device):
                kernel = CACHE.kernel(kernel_source(self.body, layout), self.body.name)
            self.kernels[layout] = kernel
        most = _multiprocessors(device) * BLOCKS_PER_SM
        if isinstance(layout, RowLayout):
            return PreparedLaunch(kernel, device, *_row_grid(launch, most), _row_sizes(launch))
        work = launch.elements // layout.vector
        blocks = min(-(-work // THREADS_PER_BLOCK), most)
        # In the order kernel_source declares the parameters after the pointers.
        sizes = [cupy.int64(launch.elements)]
        strided = [s for p, s in zip(layout.patterns, launch.strides) if p is not LINEAR]
        if strided:
            sizes += [cupy.int64(e) for e in launch.extents[1:]]
            sizes += [cupy.int64(step) for strides in strided for step in strides if step != 0]
        return PreparedLaunch(kernel, device, max(1, blocks), THREADS_PER_BLOCK, tuple(sizes))

    def source(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> str:
        """The CUDA C a launch on these buffers runs.

        Only their shapes, strides, dtypes and addresses count, so CPU tensors do.
        """
        return kernel_source(self.body, self.plan(ins, outs).layout)

    def plan(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> Launch:
        """The iteration space of a launch on these buffers, its layout and its runtime values."""
        self._check_buffers(ins, outs)
        buffers = [ins[a.operand] for a in self.body.loads]
        buffers += [outs[a.operand] for a in self.body.stores]
        maps = [a.axes for a in (*self.body.loads, *self.body.stores)]
        # An extent the types fix may be no buffer's: a row expanded, then reduced.
        extents = [extent if extent > 1 else 1 for extent in self.body.space]
        for buffer, axes in zip(buffers, maps):
            for size, axis in zip(buffer.shape, axes):
                if size == 1:
                    continue
                if extents[axis] not in (1, size):
                    raise self._error(
                        f"buffers of extents {extents[axis]} and {size} meet on one axis; "
                        "they do not broadcast"
                    )
                extents[axis] = size
        per_row = set(self.body.row_stores)
        for store in self.body.stores:
            shape = list(outs[store.operand].shape)
            expected = [extents[axis] for axis in store.axes]
            if store.operand in per_row:
                expected[-1] = 1
            if shape != expected:
                raise self._error(f"output #{store.operand} has shape {shape} but the segment computes {expected}")
        strides = [[0] * self.body.rank for _ in buffers]
        for buffer, axes, buffer_strides in zip(buffers, maps, strides):
            for size, axis, stride in zip(buffer.shape, axes, buffer.stride()):
                if size != 1:
                    buffer_strides[axis] = stride
        if self.body.reductions:
            return self._row_plan(extents, strides)
        merged_extents, merged_strides = merge_axes(extents, strides)
        contiguous = contiguous_strides(merged_extents)
        patterns = tuple(
            LINEAR if s == contiguous else tuple(stride != 0 for stride in s)
            for s in merged_strides
        )
        vector = 1
        if all(p is LINEAR for p in patterns):
            vector = VECTOR_BYTES // max(b.element_size() for b in buffers)
            while vector > 1 and any(b.data_ptr() % (vector * b.element_size()) for b in buffers):
                vector //= 2
        layout = LaunchLayout(len(merged_extents), patterns, vector)
        return Launch(layout, math.prod(extents), merged_extents, merged_strides)

    def _row_plan(self, extents: list[int], strides: list[list[int]]) -> Launch:
        """The launch of a segment that reduces rows: the rows (every axis but the last)
        merged, each access's stride along the row apart."""
        columns = extents[-1]
        column_strides = [s[-1] for s in strides]
        for function in self.body.functions:
            for k in function.loads if function.name == ROW_NAME else ():
                if column_strides[k]:
                    raise self._error(
                        f"input #{self.body.loads[k].operand} varies along the rows that the segment "
                        "reduces, where it computes one value per row"
                    )
        for i, reduction in enumerate(self.body.reductions):
            if reduction.columns == DYNAMIC and columns != 1 and not any(column_strides[k] for k in reduction.function.loads):
                raise self._error(
                    f"reduction #{i} reduces rows of extent 1 in a space whose rows have extent {columns}"
                )
        row_extents, row_strides = merge_axes(extents[:-1], [s[:-1] for s in strides])
        layout = RowLayout(
            len(row_extents),
            tuple(tuple(stride != 0 for stride in s) for s in row_strides),
            tuple({0: "", 1: "unit"}.get(stride, "strided") for stride in column_strides),
            columns <= WARP_ROW_LIMIT,
        )
        rows = math.prod(row_extents)
        return Launch(layout, rows, [*row_extents, columns], [[*r, c] for r, c in zip(row_strides, column_strides)])

    def _check_buffers(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        for what, buffers, dtypes in (
            ("input", ins, self.body.input_dtypes),
            ("output", outs, self.body.output_dtypes),
        ):
            if len(buffers) != len(dtypes):
                raise self._error(f"takes {len(dtypes)} {what}(s), got {len(buffers)}")
            for i, (buffer, dtype) in enumerate(zip(buffers, dtypes)):
                if buffer.dtype != dtype:
                    raise self._error(
                        f"{what} #{i} has dtype {buffer.dtype}, the segment declares {dtype}"
                    )
        devices = {t.device for t in (*ins, *outs)}
        if len(devices) > 1:
            raise self._error(f"buffers on several devices: {', '.join(sorted(map(str, devices)))}")
        for access, buffers, what in (
            (self.body.loads, ins, "input"),
            (self.body.stores, outs, "output"),
        ):
            for a in access:
                if buffers[a.operand].dim() != len(a.axes):
                    raise self._error(
                        f"{what} #{a.operand} has rank {buffers[a.operand].dim()}, the segment "
                        f"declares rank {len(a.axes)}"
                    )

    def _error(self, message: str) -> HostirError:
        return HostirError(f"kernel of segment @{self.body.name}: {message}")


def _row_grid(launch: Launch, most: int) -> tuple[int, int]:
    """Blocks and threads of a launch of a RowLayout: 8 rows a block of 8 warps, or a row a
    block of about ELEMENTS_PER_THREAD elements a thread (whole warps, at most 1024)."""
    rows, columns = launch.elements, launch.extents[-1]
    if launch.layout.warp_per_row:
        return min(-(-rows // ROWS_PER_BLOCK), most), 32 * ROWS_PER_BLOCK
    warps = min(32, max(2, -(-columns // (32 * ELEMENTS_PER_THREAD))))
    return min(rows, most), 32 * warps


def _row_sizes(launch: Launch) -> tuple:
    """The kernel arguments of a launch of a RowLayout after the pointers, in the order of
    the source's parameters: rows, the row's length, the rows' extents, then the strides."""
    layout = launch.layout
    sizes = [launch.elements, launch.extents[-1], *launch.extents[1 : layout.rank]]
    sizes += [step for strides in launch.strides for step in strides[:-1] if step != 0]
    sizes += [strides[-1] for strides, column in zip(launch.strides, layout.columns) if column == "strided"]
    return tuple(cupy.int64(size) for size in sizes)


def generated_source(
    segment: func.FuncOp, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]
) -> str:
    """The CUDA C that launching `segment` on these buffers compiles; needs no CuPy and no GPU."""
    return SegmentKernel(segment).source(ins, outs)
