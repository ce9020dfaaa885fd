"""The layout of a launch: how the buffers of one launch are walked, which is what a kernel's
source depends on besides its body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

Strides = tuple[int, ...]

BROADCAST, UNIT, STRIDED = "broadcast", "unit", "strided"
"""How an access walks an axis: not at all (stride 0), with stride 1, or with a stride the
kernel takes as an argument."""

Pattern = tuple[str, ...]
"""An access's BROADCAST, UNIT or STRIDED per axis of the merged iteration space."""

LINEAR = None
"""The pattern of an access whose buffer element i is iteration element i."""

VECTOR_BYTES = 16
"""The widest load or store a thread issues (ld.global.v4.u32)."""

INDEX_LIMIT = 2**30
"""Indices are 32-bit where every count and offset of a launch is below this: a loop that
steps past its last index by a grid's threads (at most 2^24 on any GPU hostir launches on:
128 blocks of 256 threads on each of 512 SMs) still fits an `int`."""


def stride_kind(stride: int) -> str:
    return {0: BROADCAST, 1: UNIT}.get(stride, STRIDED)


@dataclass(frozen=True)
class LaunchLayout:
    """What the kernel's source depends on besides the body: the launch's *broadcast pattern*,
    its vector width and its index type."""

    rank: int
    """The rank of the iteration space after merging axes."""
    patterns: tuple[Pattern | None, ...]
    """Per load then store: LINEAR, or its Pattern."""
    vector: int
    """Elements each thread moves per access of the accesses that walk the innermost axis
    (with unit stride); 1 for scalar accesses."""
    index: str
    """The C type of indices and offsets: `int` or `long long`."""


@dataclass(frozen=True)
class RowLayout(LaunchLayout):
    """The layout of a launch of a segment that reduces rows: the kernel walks the space row
    by row, the rows (every axis but the last, merged) one block or one warp each. `rank` is
    the rank of the merged rows (0: one row), and each pattern has one more axis, the row's."""

    warp_per_row: bool
    """One warp per row (short rows) rather than one block."""
    cached: int
    """How many vectors of a row each thread keeps in registers, per load of the reductions,
    between the reductions and the output pass; 0 where it reads the row again instead."""
    steps: int = 0
    """How many vectors of a row each thread walks, in a kernel that sums columns: it walks
    them by count, its columns fixed, and keeps a sum per column it walks; 0 in others,
    which walk by count only the vectors they keep (`cached`)."""


def merge_axes(
    extents: Sequence[int], strides: Sequence[Strides]
) -> tuple[list[int], list[list[int]]]:
    """Drops extent-1 axes and merges neighbours that every access walks as one axis.

    Axis d merges into its outer neighbour when, for every access, the outer stride is
    the inner stride times the inner extent (as torch's TensorIterator coalesces).
    """
    kept = [d for d, e in enumerate(extents) if e != 1]
    merged_extents: list[int] = []
    merged_strides: list[list[int]] = [[] for _ in strides]
    for d in kept:
        if merged_extents and all(
            s[-1] == t[d] * extents[d] for s, t in zip(merged_strides, strides)
        ):
            merged_extents[-1] *= extents[d]
            for s, t in zip(merged_strides, strides):
                s[-1] = t[d]
            continue
        merged_extents.append(extents[d])
        for s, t in zip(merged_strides, strides):
            s.append(t[d])
    return merged_extents, merged_strides


def contiguous_strides(extents: Sequence[int]) -> list[int]:
    strides = [1] * len(extents)
    for d in range(len(extents) - 2, -1, -1):
        strides[d] = strides[d + 1] * extents[d + 1]
    return strides


def vector_width(
    extents: Sequence[int],
    strides: Sequence[Sequence[int]],
    sizes: Sequence[int],
    addresses: Sequence[int],
    tail: bool,
) -> int:
    """Elements per vector access of a launch on the merged space `extents`: the widest power
    of two of at most VECTOR_BYTES of the largest element that walks the innermost axis, such
    that every access walks that axis with stride 1 or 0, and each one of stride 1 starts
    every line of the axis (its address, each of its other strides) on a whole vector; the
    innermost extent a multiple of it unless the kernel has a scalar `tail` loop. 1 where no
    width fits. Accesses are given by their merged strides, element sizes and addresses."""
    if not extents or any(s[-1] not in (0, 1) for s in strides):
        return 1
    walking = [k for k, s in enumerate(strides) if s[-1] == 1]
    if not walking:
        return 1
    width = VECTOR_BYTES // max(sizes[k] for k in walking)

    def fits(width: int) -> bool:
        return (tail or extents[-1] % width == 0) and all(
            addresses[k] % (width * sizes[k]) == 0 and all(s % width == 0 for s in strides[k][:-1])
            for k in walking
        )

    while width > 1 and not fits(width):
        width //= 2
    return width


def index_type(counts: Sequence[int], extents: Sequence[int], strides: Sequence[Sequence[int]]) -> str:
    """`int` where the launch's `counts` and the largest offset of each access fit below
    INDEX_LIMIT, `long long` otherwise."""
    offsets = [sum((e - 1) * s for e, s in zip(extents, access)) for access in strides]
    return "int" if max([*counts, *offsets, 0]) < INDEX_LIMIT else "long long"


class Launch(NamedTuple):
    """One launch's layout and the runtime values the kernel takes besides pointers."""

    layout: LaunchLayout
    elements: int
    """Elements of the iteration space; rows, for a RowLayout."""
    extents: list[int]
    """Of the merged iteration space; a RowLayout's merged rows, then the row's length."""
    strides: list[list[int]]
    """Per load then store, on the merged iteration space (a row's stride last)."""
    threads: int
    """Threads per block."""
