"""Slicing a segment for `stream-parallel`: a launch inside a stream loop runs a copy of its
segment whose values lack the stream axis (`@<segment>_slice`).

Every value of the segment loses the axis that corresponds to the stream axis of its first
result (the axis classes of `axis_mapping.AxisClasses`); the axes that reductions and
broadcasts name are renumbered, and a broadcast that only inserted that axis becomes a set.
"""

from __future__ import annotations

import itertools

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, StringAttr, SymbolRefAttr, i64
from xdsl.ir import SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import SymbolTable

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import tensor_type
from hostir_dialect.text import HostirError
from hostir.passes.analysis.axis_mapping import AxisClasses, func_results, without_axis
from hostir.passes.analysis.operands import describe_typed_operand, describe_value


def _sliced_axes(function: func.FuncOp, axis: int, call: hir.SegmentCallOp) -> dict[SSAValue, int]:
    """The axis of each value of `function` that corresponds to `axis` of its first result."""
    classes = AxisClasses.of_function(function)
    root = classes.find(func_results(function)[0], axis)
    block = function.body.block
    sliced: dict[SSAValue, int] = {}
    for value in [*block.args, *(result for op in block.ops for result in op.results)]:
        axes = classes.axes_in_class(value, root)
        if len(axes) > 1:
            raise HostirError.at(
                call,
                f"segment @{function.sym_name.data} relates axes {axes} of its value from "
                f"{describe_value(value)} to the stream axis {axis} of its output; they cannot "
                "all be sliced",
            )
        if axes:
            sliced[value] = axes[0]
    return sliced


def _renumber_axis_properties(
    function: func.FuncOp, sliced: dict[SSAValue, int], call: hir.SegmentCallOp
) -> list[fusion.BroadcastOp]:
    """Renumbers the axes that reductions and broadcasts name; returns the broadcasts left with none."""
    emptied: list[fusion.BroadcastOp] = []
    for op in function.body.block.ops:
        if isinstance(op, fusion.ReductionOp) and op.input in sliced:
            if sliced[op.input] in op.reduced_axes:
                raise HostirError.at(
                    call,
                    f"segment @{function.sym_name.data} reduces axis {sliced[op.input]} of "
                    f"{describe_typed_operand(op, 0)} in {op.name}, "
                    "which is its stream axis",
                )
            op.axes = DenseArrayBase.from_list(i64, without_axis(op.reduced_axes, sliced[op.input]))
        elif isinstance(op, fusion.BroadcastOp) and op.result in sliced:
            rank = tensor_type(op.result).rank
            new_axes = fusion.normalize_axes(op.new_axes.get_values(), rank, "broadcast")
            op.new_axes = DenseArrayBase.from_list(i64, without_axis(new_axes, sliced[op.result]))
            if not op.new_axes.get_values():
                emptied.append(op)
    return emptied


def _slice_function(function: func.FuncOp, axis: int, call: hir.SegmentCallOp) -> None:
    """Removes from every value of `function` the axis that corresponds to `axis` of its first result.

    A broadcast that only inserted that axis becomes a set.
    """
    sliced = _sliced_axes(function, axis, call)
    emptied_broadcasts = _renumber_axis_properties(function, sliced, call)
    for value, removed in sliced.items():
        Rewriter.replace_value_with_new_type(value, tensor_type(value).without_axis(removed))
    for op in emptied_broadcasts:
        Rewriter.replace_op(op, fusion.SetOp(op.input, tensor_type(op.result)))
    function.update_function_type()


def _insert_segment(rewriter: PatternRewriter, sliced: func.FuncOp, original: func.FuncOp) -> str:
    """Inserts `sliced` after `original` as `@<original>_slice`; reuses an equal one if there is one."""
    base = f"{original.sym_name.data}_slice"
    for name in itertools.chain([base], (f"{base}_{n}" for n in itertools.count(1))):
        sliced.sym_name = StringAttr(name)
        existing = SymbolTable.lookup_symbol(original, name)
        if existing is None:
            rewriter.insert(sliced, InsertPoint.after(original))
            return name
        if existing.is_structurally_equivalent(sliced):
            return name


def _erase_if_unused(rewriter: PatternRewriter, segment: func.FuncOp) -> None:
    """Erases a private segment that no launch calls any more."""
    module = segment.parent_op()
    assert module is not None
    name = segment.sym_name.data
    used = any(isinstance(op, hir.SegmentCallOp) and op.callee.string_value() == name for op in module.walk())
    if not used and segment.sym_visibility == StringAttr("private"):
        rewriter.erase(segment)


def slice_segment_call(rewriter: PatternRewriter, call: hir.SegmentCallOp, axis: int) -> None:
    """Makes `call` run a copy of its segment on slices: `@<segment>_slice`."""
    original = call.callee_function()
    sliced = original.clone()
    _slice_function(sliced, axis, call)
    call.callee = SymbolRefAttr(_insert_segment(rewriter, sliced, original))
    _erase_if_unused(rewriter, original)
