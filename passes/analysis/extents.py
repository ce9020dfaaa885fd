"""What an extent is known to equal before the program runs.

A loop's extent, a size operand, an `hir.dim`: each is an index value that is a constant, the
extent of an axis of a buffer, or the size a buffer was allocated with. `known_extent`
follows them to a number where the program fixes one, and otherwise to what stands for the
same extent wherever it is read (the axis of an argument), so that two loops compare equal
where they walk the same extent.
"""

from __future__ import annotations

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr
from xdsl.ir import SSAValue

from hostir_dialect import hir
from hostir_dialect.fusion import DYNAMIC, tensor_type


def known_extent(value: SSAValue) -> object:
    """What a loop extent is known to equal: a number, or the axis of an argument it was read from."""
    owner = value.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return owner.value.value.data
    if isinstance(owner, hir.DimOp):
        buffer, axis = owner.buffer, owner.axis.data
        shape = tensor_type(buffer).get_shape()
        if shape[axis] != DYNAMIC:
            return shape[axis]
        if isinstance(buffer.owner, hir.AllocateOp):
            return known_extent(buffer.owner.dynamic_sizes[shape[:axis].count(DYNAMIC)])
        return (buffer, axis)
    return value
