"""What an extent is known to equal before the program runs.

A loop's extent, a size operand, an `hir.dim`: each is an index value that is a constant, the
extent of an axis of a buffer, or the size a buffer was allocated with. `known_extent`
follows them to a number where the program fixes one, and otherwise to what stands for the
same extent wherever it is read (the axis of an argument), so that two loops compare equal
where they walk the same extent.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr
from xdsl.ir import BlockArgument, SSAValue

from hostir_dialect import hir

InputExtent = Callable[[BlockArgument, int], int | None]
"""`input_extent(argument, axis)`: the extent of an axis of an argument where the caller
knows it (the shapes of a program's inputs), else None."""


def _unknown(argument: BlockArgument, axis: int) -> None:
    return None


def known_extent(value: SSAValue, input_extent: InputExtent = _unknown) -> object:
    """What the index `value` (a loop's bound, a size operand, an `hir.dim`) is known to
    equal: a number where the program fixes it, else what stands for the same extent
    wherever it is read (`buffer_extent`), else `value` itself."""
    owner = value.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return owner.value.value.data
    if isinstance(owner, hir.DimOp):
        return buffer_extent(owner.buffer, owner.axis.data, input_extent)
    return value


def buffer_extent(buffer: SSAValue, axis: int, input_extent: InputExtent = _unknown) -> object:
    """What the extent of `axis` of `buffer` is known to equal: its type's (a `didx` axis
    spans its mesh); through views, that of the root buffer's axis; an allocation's, the
    size it was made with; an argument's, what `input_extent` says. Where only running
    the program tells it, `(root buffer, its axis)`."""
    extent = hir.type_extent(buffer, axis)
    if extent is not None:
        return extent
    root, root_axis = hir.root_axis(buffer, axis)
    if root is not buffer:
        return buffer_extent(root, root_axis, input_extent)
    if (size := hir.allocated_size(root, axis)) is not None:
        return known_extent(size, input_extent)
    if isinstance(root, BlockArgument) and (extent := input_extent(root, axis)) is not None:
        return extent
    return (root, axis)
