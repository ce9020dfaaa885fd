"""The layout of a launch: how the buffers of one launch are walked, which is what a kernel's
source depends on besides its body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

Strides = tuple[int, ...]

LINEAR = None
"""The pattern of an access whose buffer element i is iteration element i."""


class LaunchLayout(NamedTuple):
    """What the kernel's source depends on besides the body: the launch's *broadcast pattern*."""

    rank: int
    """The rank of the iteration space after merging axes."""
    patterns: tuple[tuple[bool, ...] | None, ...]
    """Per load then store: LINEAR, or which axes have a nonzero stride."""
    vector: int
    """Elements per vector access; 1 for none (only when every access is linear)."""


class RowLayout(NamedTuple):
    """The layout of a launch of a segment that reduces rows: the kernel walks the space row
    by row, the rows (every axis but the last, merged) one block or one warp each."""

    rank: int
    """The rank of the rows after merging axes (0: one row)."""
    patterns: tuple[tuple[bool, ...], ...]
    """Per load then store: which merged row axes have a nonzero stride."""
    columns: tuple[str, ...]
    """Per load then store, how it walks a row: "unit" (stride 1), "strided", or "" (not at all)."""
    warp_per_row: bool
    """One warp per row (short rows) rather than one block."""


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


class Launch(NamedTuple):
    """One launch's layout and the runtime values the kernel takes besides pointers."""

    layout: LaunchLayout | RowLayout
    elements: int
    """Elements of the iteration space; rows, for a RowLayout."""
    extents: list[int]
    """Of the merged iteration space; a RowLayout's merged rows, then the row's length."""
    strides: list[list[int]]
    """Per load then store, on the merged iteration space (a row's stride last)."""
