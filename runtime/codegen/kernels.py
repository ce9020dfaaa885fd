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

from hostir_dialect.fusion import DYNAMIC
from hostir_dialect.text import HostirError
from hostir import logs
from hostir.runtime.codegen.body import ROW_NAME, SegmentBody
from hostir.runtime.codegen.layout import (
    LINEAR,
    STRIDED,
    VECTOR_BYTES,
    Launch,
    LaunchLayout,
    RowLayout,
    contiguous_strides,
    index_type,
    merge_axes,
    stride_kind,
    vector_width,
)
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
WARP_ROW_LIMIT = 1024
"""The longest row that one warp reduces; a longer one takes a block."""
ROWS_PER_BLOCK = 8
"""Warps (rows) per block of a kernel of one warp per row."""
ROW_VECTORS_PER_THREAD = 2
"""How many vectors of a row each thread of a block per row moves: a row of 4096 bf16
(512 vectors of 8) takes 256 threads, of 8192 512, up to 1024 (the most a block has)."""
ROW_REGISTER_BYTES = 128
"""The most bytes of a row a thread keeps in registers between a row's reductions and its
output pass (over every load the reductions read): 32 of the 64 registers that a thread of a
block of 1024 has."""


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


@functools.cache
def _threads_per_multiprocessor(device: int) -> int:
    return torch.cuda.get_device_properties(device).max_threads_per_multi_processor


class PreparedLaunch(NamedTuple):
    """What launches on buffers of one signature share: all but the pointers."""

    kernel: object | None
    """The `cupy.RawKernel`; None when there are no elements to compute."""
    device: int
    blocks: int
    threads: int
    sizes: tuple
    """The kernel arguments after the pointers: elements, extents, strides."""
    partials: int = 0
    """The rows of partial sums the kernel writes per column sum (one per block, or warp)."""


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
            for c in self.body.column_sums:  # the sum of no rows
                outs[c.output].zero_()
            return True
        # A column sum's kernel writes rows of partial sums, which the launch then sums.
        partials = {}
        for c in self.body.column_sums:
            out = outs[c.output]
            partials[c.output] = torch.empty((prepared.partials, out.shape[-1]), dtype=out.dtype, device=out.device)
        pointers = [cupy.uint64(ins[a.operand].data_ptr()) for a in self.body.loads]
        pointers += [cupy.uint64(partials.get(a.operand, outs[a.operand]).data_ptr()) for a in self.body.stores]
        stream = cupy.cuda.Stream.from_external(torch.cuda.current_stream(prepared.device))
        with cupy.cuda.Device(prepared.device):
            prepared.kernel(
                (prepared.blocks,),
                (prepared.threads,),
                (*pointers, *prepared.sizes),
                stream=stream,
            )
        for output, rows in partials.items():
            torch.sum(rows, 0, out=outs[output].view(rows.shape[1]))
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
        rows_per_block = 1
        if isinstance(layout, RowLayout):
            rows_per_block = ROWS_PER_BLOCK if layout.warp_per_row else 1
            blocks = -(-launch.elements // rows_per_block)
            if self.body.column_sums:
                # Each block's rows of partial sums are summed after it: as many blocks as
                # the GPU holds at once, each walking its share of the rows.
                most = _multiprocessors(device) * max(1, _threads_per_multiprocessor(device) // launch.threads)
        else:
            blocks = -(-launch.elements // (layout.vector * launch.threads))
        blocks = max(1, min(blocks, most))
        number = cupy.int32 if layout.index == "int" else cupy.int64
        sizes = tuple(map(number, kernel_sizes(launch, self.body.rotates)))
        partials = blocks * rows_per_block if self.body.column_sums else 0
        return PreparedLaunch(kernel, device, blocks, launch.threads, sizes, partials)

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
        summed_columns = {c.output for c in self.body.column_sums}
        for store in self.body.stores:
            shape = list(outs[store.operand].shape)
            expected = [extents[axis] for axis in store.axes]
            if store.operand in per_row:
                expected[-1] = 1
            if store.operand in summed_columns:
                expected[:-1] = [1] * (len(expected) - 1)
            if shape != expected:
                raise self._error(f"output #{store.operand} has shape {shape} but the segment computes {expected}")
        strides = [[0] * self.body.rank for _ in buffers]
        for buffer, axes, buffer_strides in zip(buffers, maps, strides):
            for size, axis, stride in zip(buffer.shape, axes, buffer.stride()):
                if size != 1:
                    buffer_strides[axis] = stride
        sizes = [b.element_size() for b in buffers]
        addresses = [b.data_ptr() for b in buffers]
        if self.body.reductions:
            return self._row_plan(extents, strides, sizes, addresses)
        rotates = self.body.rotates
        if rotates:
            # A rotated load reads the other half of the last axis: that axis stays apart.
            # Each rotated buffer's extent along it is the space's, even: one of extent 1 would
            # be broadcast along it, as the rotation of one element (its negation) is not.
            for load, buffer in zip(self.body.loads, buffers):
                if load.rotated and buffer.shape[-1] % 2:
                    raise self._error(
                        f"input #{load.operand} is rotated along a last axis of extent {buffer.shape[-1]}, "
                        "which no rotation halves"
                    )
            outer_extents, outer_strides = merge_axes(extents[:-1], [s[:-1] for s in strides])
            merged_extents = [*outer_extents, extents[-1]]
            merged_strides = [[*outer, s[-1]] for outer, s in zip(outer_strides, strides)]
        else:
            merged_extents, merged_strides = merge_axes(extents, strides)
        contiguous = contiguous_strides(merged_extents)
        rotated = [a.rotated for a in (*self.body.loads, *self.body.stores)]
        patterns = tuple(
            LINEAR if s == contiguous and not r else tuple(map(stride_kind, s)) for s, r in zip(merged_strides, rotated)
        )
        # A kernel of one axis finishes the vectors' remainder with scalar accesses; of more,
        # a vector would run over the end of a line of the innermost axis. A vector of a
        # rotated load lies in one half: its width divides the half.
        vector = vector_width(
            [*merged_extents[:-1], merged_extents[-1] // 2] if rotates else merged_extents,
            merged_strides,
            sizes,
            addresses,
            tail=len(merged_extents) == 1 and not rotates,
        )
        elements = math.prod(extents)
        index = index_type([elements], merged_extents, merged_strides)
        layout = LaunchLayout(len(merged_extents), patterns, vector, index)
        return Launch(layout, elements, merged_extents, merged_strides, THREADS_PER_BLOCK)

    def _row_plan(
        self, extents: list[int], strides: list[list[int]], sizes: list[int], addresses: list[int]
    ) -> Launch:
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
        merged_extents = [*row_extents, columns]
        merged_strides = [[*r, c] for r, c in zip(row_strides, column_strides)]
        rows = math.prod(row_extents)
        # A column sum's partial sums are written once per block, element by element: they
        # take no part in the vectors of the row.
        summed = {len(self.body.loads) + c.output for c in self.body.column_sums}
        walked = [k for k in range(len(strides)) if k not in summed]
        vector = vector_width(
            merged_extents,
            [merged_strides[k] for k in walked],
            [sizes[k] for k in walked],
            [addresses[k] for k in walked],
            tail=False,
        )
        warp_per_row = columns <= WARP_ROW_LIMIT
        vectors = -(-columns // vector)
        if warp_per_row:
            threads, row_threads = 32 * ROWS_PER_BLOCK, 32
        else:
            warps = min(32, max(2, -(-vectors // (32 * ROW_VECTORS_PER_THREAD))))
            threads = row_threads = 32 * warps
        cached = -(-vectors // row_threads)
        kept = {k for r in self.body.reductions for k in r.function.loads if column_strides[k]}
        steps = cached if self.body.column_sums else 0
        if cached * vector * sum(sizes[k] for k in kept) > ROW_REGISTER_BYTES:
            cached = 0
        layout = RowLayout(
            len(row_extents),
            tuple(tuple(map(stride_kind, s)) for s in merged_strides),
            vector,
            index_type([rows, columns], merged_extents, merged_strides),
            warp_per_row,
            cached,
            steps,
        )
        return Launch(layout, rows, merged_extents, merged_strides, threads)

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


def kernel_sizes(launch: Launch, rotates: bool = False) -> list[int]:
    """The kernel arguments after the pointers, in the order of the source's parameters: the
    counts (elements, or rows and the row's length), the merged extents but the outermost where
    an access is indexed by axis, the half extent of the last axis where a load is rotated
    (`rotates`), then each access's strides that are arguments."""
    layout = launch.layout
    counts = [launch.elements]
    if isinstance(layout, RowLayout):
        counts.append(launch.extents[-1])
    indexed = [(p, s) for p, s in zip(layout.patterns, launch.strides) if p is not LINEAR]
    extents = launch.extents[1 : layout.rank] if indexed else []
    strides = [step for pattern, steps in indexed for kind, step in zip(pattern, steps) if kind == STRIDED]
    halves = [launch.extents[-1] // 2] if rotates else []
    return [*counts, *extents, *halves, *strides]


def generated_source(
    segment: func.FuncOp, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]
) -> str:
    """The CUDA C that launching `segment` on these buffers compiles; needs no CuPy and no GPU."""
    return SegmentKernel(segment).source(ins, outs)
