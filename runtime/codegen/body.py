"""The body of a segment's kernel: one device function of the elements a thread loads, and the
accesses that feed it.

Which element of an input a thread reads follows from torch broadcasting (operands align
on their last axes; `fusion.broadcast` inserts axes), so every input is read through an
*axis map*: the axes of the iteration space its own axes walk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from xdsl.dialects import func
from xdsl.ir import BlockArgument, Operation, SSAValue

from hostir_dialect import fusion
from hostir_dialect.fusion import DYNAMIC
from hostir_dialect.builder import torch_dtype
from hostir_dialect.text import HostirError
from hostir.runtime.codegen.expressions import ALIASES, EXPRESSIONS, FLOATING, ElementType, element_type

BODY_NAME = "hostir_segment_body"
ROW_NAME = "hostir_segment_row"
REDUCTION_NAME = "hostir_segment_reduce"
COLUMN_SUM_NAME = "hostir_segment_column_sum"


def _torch_dtype(value: SSAValue) -> torch.dtype:
    return torch_dtype(fusion.tensor_type(value).element_type)


AxisMap = tuple[int, ...]
"""For each axis of a value, the axis of the iteration space it walks."""


class Access(NamedTuple):
    """One buffer read or written per element: `ins[operand]` or `outs[operand]` through `axes`."""

    operand: int
    axes: AxisMap
    rotated: bool = False
    """Read as a `fusion.rotate_half` of it: along the iteration space's last axis, of extent
    2h, element j reads element j + h, negated, where j < h, and element j - h after."""


def _operand_maps(op: Operation, result_map: AxisMap) -> list[AxisMap]:
    """The axis maps of `op`'s operands when its result is walked through `result_map`."""
    if isinstance(op, fusion.BroadcastOp):
        new_axes = fusion.normalize_axes(op.new_axes.get_values(), len(result_map), "broadcast")
        return [tuple(a for i, a in enumerate(result_map) if i not in new_axes)]
    # torch broadcasting: an operand's axes are the result's last ones.
    return [result_map[len(result_map) - fusion.tensor_type(v).rank :] for v in op.operands]


@dataclass(frozen=True)
class DeviceFunction:
    """One `__device__` function of a segment's kernel: what it reads and what it gives."""

    name: str
    loads: tuple[int, ...]
    """The loads (indices into `SegmentBody.loads`) it takes, parameter `a<k>` for load k."""
    reduced: tuple[int, ...]
    """The row reductions whose values it takes, parameter `s<i>` for reduction i."""
    rotated: tuple[int, ...]
    """Its rotated loads (`Access.rotated`), each with a parameter `f<k>`: whether the element
    is in the first half of the last axis, where the rotation negates it."""
    stores: tuple[int, ...]
    """The stores (indices into `SegmentBody.stores`) it writes, parameter `r<j>&`; a
    reduction's function writes none and returns the element to accumulate."""

    @property
    def returns(self) -> bool:
        """Whether it is a reduction's: it returns the element of the row, or of the column, to
        accumulate."""
        return self.name.startswith((REDUCTION_NAME, COLUMN_SUM_NAME))


@dataclass(frozen=True)
class RowReduction:
    """A reduction over the last axis of the iteration space, computed once per row."""

    kind: str
    """"sum" or "max"."""
    function: DeviceFunction
    """The element of the row that each thread accumulates."""
    element: ElementType
    """Of the reduced values: accumulated in its compute type, rounded to it once reduced."""
    columns: int
    """The extent of the reduced axis that the segment's types give (DYNAMIC where unknown)."""


@dataclass(frozen=True)
class ColumnSum:
    """A sum over every axis of the iteration space but the last (a weight's gradient in a
    norm's backward), returned by the segment: each thread sums its columns over the rows it
    walks, the kernel writes one row of partial sums per block (or warp), and the launch sums
    those rows into the output (`kernels.SegmentKernel`)."""

    function: DeviceFunction
    """The element of the column that each thread accumulates."""
    element: ElementType
    """Of the summed values, accumulated in their own type (f32 or f64)."""
    output: int
    """The segment's output it is."""


@dataclass(frozen=True)
class SegmentBody:
    """A segment as device functions of its loaded elements, and the accesses that feed them.

    A pointwise segment is one function, BODY_NAME, of every load, writing every store. A
    segment that reduces rows has one function per reduction (the row's elements it
    accumulates, in program order: a later one may read an earlier one's value), one per
    column sum it returns (the column's elements it accumulates, after the row's reductions),
    BODY_NAME for the stores of one element per point of the space, and ROW_NAME for the
    stores of one element per row (their last axis has extent 1).
    """

    name: str
    rank: int
    """The rank of the iteration space: the largest rank of an output or a reduced value."""
    space: tuple[int, ...]
    """The local extents that the segment's types give the iteration space (DYNAMIC where unknown)."""
    input_dtypes: tuple[torch.dtype, ...]
    output_dtypes: tuple[torch.dtype, ...]
    loads: tuple[Access, ...]
    stores: tuple[Access, ...]
    load_types: tuple[ElementType, ...]
    store_types: tuple[ElementType, ...]
    reductions: tuple[RowReduction, ...]
    column_sums: tuple[ColumnSum, ...]
    functions: tuple[DeviceFunction, ...]
    """The element functions after the reductions' and the column sums': BODY_NAME if it
    stores (or the segment is pointwise), then ROW_NAME if it stores."""
    source: str
    """Every device function, reductions' first."""

    @property
    def rotates(self) -> bool:
        """Whether a load is rotated (`Access.rotated`): its kernel takes `half`, the half
        extent of the last axis, and keeps that axis apart from the others."""
        return any(load.rotated for load in self.loads)

    @property
    def row_stores(self) -> tuple[int, ...]:
        """The stores written once per row (by ROW_NAME)."""
        return next((f.stores for f in self.functions if f.name == ROW_NAME), ())

    @classmethod
    def of(cls, segment: func.FuncOp) -> SegmentBody:
        """Analyses `segment`; raises HostirError for an op or a dtype a kernel cannot compute."""
        ops, outputs = fusable_ops(segment)
        every_reduction = [op for op in ops if isinstance(op, fusion.ReductionOp)]
        rank = max(fusion.tensor_type(v).rank for v in (*outputs, *(op.input for op in every_reduction)))
        column_sums = [op for op in every_reduction if op.sums_columns and fusion.tensor_type(op.input).rank == rank]
        reductions = [op for op in every_reduction if op not in column_sums]
        output_maps = [tuple(range(rank - fusion.tensor_type(v).rank, rank)) for v in outputs]
        for op in reductions:
            _check_row_reduction(segment, op, rank)
        column_outputs = [_check_column_sum(segment, op, outputs, bool(reductions)) for op in column_sums]
        rotations = [op for op in ops if isinstance(op, fusion.RotateHalfOp)]
        for op in rotations:
            _check_rotation(segment, op, bool(reductions))
        whole = tuple(range(rank))
        space = _static_space(rank, needed_axis_maps(ops, [*outputs, *(op.input for op in every_reduction)],
                                                     [*output_maps, *(whole for _ in every_reduction)]))  # fmt: skip
        per_row = _per_row_stores(outputs, space) if reductions else set()
        element_stores = tuple(j for j in range(len(outputs)) if j not in per_row and j not in column_outputs)
        # (name, values computed, their maps, the stores they are) per device function.
        roots = [(f"{REDUCTION_NAME}{i}", [op.input], [whole], ()) for i, op in enumerate(reductions)]
        roots += [(f"{COLUMN_SUM_NAME}{i}", [op.input], [whole], ()) for i, op in enumerate(column_sums)]
        for name, stored in ((BODY_NAME, element_stores), (ROW_NAME, tuple(sorted(per_row)))):
            if stored or (name == BODY_NAME and not reductions):
                roots.append((name, [outputs[j] for j in stored], [output_maps[j] for j in stored], stored))
        maps_per_function = [needed_axis_maps(ops, values, maps) for _, values, maps, _ in roots]
        read_per_function = [_arguments_read(segment, maps, rotations, rank) for maps in maps_per_function]
        loads_list = list(dict.fromkeys(access for read in read_per_function for access in read))
        stores = tuple(Access(j, axes) for j, axes in enumerate(output_maps))
        functions, sources = [], []
        for (name, values, maps_of_values, stored), maps, read in zip(roots, maps_per_function, read_per_function):
            function_loads = tuple(sorted(loads_list.index(access) for access in read))
            reduced = tuple(i for i, op in enumerate(reductions) if op.results[0] in maps)
            rotated = tuple(k for k in function_loads if loads_list[k].rotated)
            function = DeviceFunction(name, function_loads, reduced, rotated, stored)
            lines = body_lines(segment, ops, maps, loads_list, function, reductions, values, maps_of_values)
            functions.append(function)
            sources.append(device_function(function, lines, loads_list, segment, outputs, values, reductions))
        load_types = tuple(element_type(segment.args[a.operand]) for a in loads_list)
        return cls(
            segment.sym_name.data,
            rank,
            tuple(space),
            tuple(_torch_dtype(a) for a in segment.args),
            tuple(_torch_dtype(v) for v in outputs),
            tuple(loads_list),
            stores,
            load_types,
            tuple(element_type(v) for v in outputs),
            tuple(
                RowReduction(
                    op.name.removeprefix("fusion."),
                    f,
                    element_type(op.input),
                    fusion.tensor_type(op.input).local_shape()[-1],
                )
                for op, f in zip(reductions, functions)
            ),
            tuple(
                ColumnSum(f, element_type(op.input), j)
                for op, f, j in zip(column_sums, functions[len(reductions) :], column_outputs)
            ),
            tuple(functions[len(reductions) + len(column_sums) :]),
            "\n\n".join(sources),
        )


def _per_row_stores(outputs: Sequence[SSAValue], space: Sequence[int]) -> set[int]:
    """The outputs of a segment that reduces rows that hold one value per row: of the space's
    rank, their last axis of extent 1 where the rows are longer."""
    return {
        j
        for j, v in enumerate(outputs)
        if fusion.tensor_type(v).rank == len(space) and space[-1] != 1 and fusion.tensor_type(v).local_shape()[-1] == 1
    }


def _arguments_read(
    segment: func.FuncOp, maps: AxisMaps, rotations: Sequence[fusion.RotateHalfOp], rank: int
) -> list[Access]:
    """The loads of a device function: each argument of `segment` under each map it is needed
    under, then the argument of each rotation under each map the rotation is needed under,
    rotated."""
    loads = [Access(i, axes) for i, arg in enumerate(segment.args) for axes in maps.get(arg, ())]
    for op in rotations:
        for axes in maps.get(op.result, ()):
            if axes[-1] != rank - 1:
                raise HostirError.at(
                    op,
                    f"'{op.name}' in segment @{segment.sym_name.data} rotates another axis than the last "
                    "of the kernel's iteration space, along which a kernel reads the other half",
                )
            loads.append(Access(segment.args.index(op.input), axes, True))
    return list(dict.fromkeys(loads))


def _check_rotation(segment: func.FuncOp, op: fusion.RotateHalfOp, reduces_rows: bool) -> None:
    """Raises unless a kernel reads `op`'s operand rotated: an argument of the segment (a value
    the kernel computed has no other half to read), in a kernel that does not reduce rows."""
    if not isinstance(op.input, BlockArgument) or op.input.owner is not segment.body.block or reduces_rows:
        raise HostirError.at(
            op,
            f"'{op.name}' cannot be part of the fused kernel of segment @{segment.sym_name.data}: a "
            "kernel reads the rotation of an input of the segment, in a kernel that reduces no rows",
        )


def _static_space(rank: int, maps: AxisMaps) -> tuple[int, ...]:
    """The extents of the iteration space that the types of the values give, through the
    maps they are needed under: 1 where every value is 1 there, DYNAMIC where one is unknown."""
    space = [1] * rank
    for value, value_maps in maps.items():
        for axes in value_maps:
            for extent, axis in zip(fusion.tensor_type(value).local_shape(), axes):
                if extent != 1 and space[axis] in (1, DYNAMIC):
                    space[axis] = extent
    return tuple(space)


def _check_column_sum(
    segment: func.FuncOp, op: fusion.ReductionOp, outputs: Sequence[SSAValue], reduces_rows: bool
) -> int:
    """The output that column sum `op` is; raises unless a kernel computes it: in a kernel that
    reduces rows (which walks the space row by row), of values of f32 or f64, returned by
    the segment and read by none of its ops (it is whole only once every row was walked)."""
    result = op.results[0]
    if (
        not reduces_rows
        or not op.sums_columns_in_a_kernel
        or any(not isinstance(use.operation, func.ReturnOp) for use in result.uses)
        or result not in outputs
    ):
        raise HostirError.at(
            op,
            f"'{op.name}' cannot be part of the fused kernel of segment @{segment.sym_name.data}: "
            "a kernel sums columns only in a kernel that reduces rows, of f32 or f64 values, "
            "as an output that no op of the segment reads",
        )
    return list(outputs).index(result)


def _check_row_reduction(segment: func.FuncOp, op: fusion.ReductionOp, rank: int) -> None:
    """Raises unless a kernel computes `op` once per row: over its last axis, kept, at the
    rank of the iteration space, on floating-point values (what fusion-to-hir admits)."""
    input_type = fusion.tensor_type(op.input)
    if (
        op.reduced_axes != (input_type.rank - 1,)
        or not op.keeps_dims
        or input_type.rank != rank
        or element_type(op.input).category != FLOATING
    ):
        raise HostirError.at(
            op,
            f"'{op.name}' cannot be part of the fused kernel of segment @{segment.sym_name.data}: "
            "a kernel reduces only the last axis of its iteration space, kept (keepdim), of "
            "floating-point values",
        )


def fusable_ops(segment: func.FuncOp) -> tuple[list[Operation], Sequence[SSAValue]]:
    """The ops of `segment` before its `func.return`, and the values it returns; raises
    HostirError where a kernel cannot compute the segment: an op that has no expression,
    a value that is not a tensor, no output."""
    name = segment.sym_name.data
    ops = list(segment.body.block.ops)
    returned = ops.pop() if ops and isinstance(ops[-1], func.ReturnOp) else None
    if returned is None:
        raise HostirError.at(segment, f"segment @{name} does not end with func.return")
    for op in ops:
        if type(op) not in EXPRESSIONS and not isinstance(op, (*ALIASES, *fusion.REDUCTION_OPS, fusion.RotateHalfOp)):
            raise HostirError.at(
                op,
                f"'{op.name}' cannot be part of the fused kernel of segment @{name}",
            )
    for value in (*segment.args, *returned.arguments):
        if not isinstance(value.type, fusion.TensorType):
            raise HostirError.at(
                segment,
                f"segment @{name} has a value of type {value.type}, not a !fusion.tensor",
            )
    if not returned.arguments:
        raise HostirError.at(
            segment, f"segment @{name} returns nothing; a kernel needs an output"
        )
    return ops, returned.arguments


AxisMaps = dict[SSAValue, dict[AxisMap, None]]
"""The axis maps that each value is needed under, in the order they were found."""


def needed_axis_maps(
    ops: Sequence[Operation], roots: Sequence[SSAValue], root_maps: Sequence[AxisMap]
) -> AxisMaps:
    """Backwards from the roots' maps: the maps each value of `ops` is needed under. A
    value that two readers broadcast differently is needed under two maps (and loaded, or
    computed, once per map). A reduction's value is one per row, which its own function
    computes, and a rotation's is loaded (`Access.rotated`): the walk stops there."""
    maps: AxisMaps = {}
    for value, axes in zip(roots, root_maps):
        maps.setdefault(value, {})[axes] = None
    for op in reversed(ops):
        if isinstance(op, fusion.ReductionOp | fusion.RotateHalfOp):
            continue
        for axes in maps.get(op.results[0], ()):
            for operand, operand_axes in zip(op.operands, _operand_maps(op, axes)):
                maps.setdefault(operand, {})[operand_axes] = None
    return maps


def body_lines(
    segment: func.FuncOp,
    ops: Sequence[Operation],
    maps: AxisMaps,
    loads: Sequence[Access],
    function: DeviceFunction,
    reductions: Sequence[fusion.ReductionOp],
    roots: Sequence[SSAValue],
    root_maps: Sequence[AxisMap],
) -> list[str]:
    """Forwards: the statements of `function`, one variable per (value, axis map): load `k`
    from parameter `a<k>`, reduction `i` from `s<i>`, each op's expression; then each root
    stored into its `r<j>`, or, for a reduction's function, returned as stored."""
    variables: dict[tuple[SSAValue, AxisMap], str] = {}
    lines: list[str] = []

    def define(value: SSAValue, axes: AxisMap, expression: str) -> None:
        variables[value, axes] = f"v{len(lines)}"
        lines.append(
            f"  const {element_type(value).compute} {variables[value, axes]} = {expression};"
        )

    rotated: dict[tuple[SSAValue, AxisMap], str] = {}
    for k in function.loads:
        arg = segment.args[loads[k].operand]
        loaded = element_type(arg).load.format(f"a{k}")
        if loads[k].rotated:
            rotated[arg, loads[k].axes] = f"v{len(lines)}"
            lines.append(f"  const {element_type(arg).compute} v{len(lines)} = f{k} ? -{loaded} : {loaded};")
        else:
            define(arg, loads[k].axes, loaded)
    for op in ops:
        for axes in maps.get(op.results[0], ()):
            if isinstance(op, fusion.RotateHalfOp):
                variables[op.result, axes] = rotated[op.input, axes]
                continue
            if isinstance(op, fusion.ReductionOp):
                if axes != tuple(range(len(axes))):
                    raise HostirError.at(
                        op,
                        f"'{op.name}' in segment @{segment.sym_name.data} is read along another "
                        "axis than its rows; a kernel has one value of it per row",
                    )
                variables[op.results[0], axes] = f"s{reductions.index(op)}"
                continue
            operands = [variables[v, a] for v, a in zip(op.operands, _operand_maps(op, axes))]
            if isinstance(op, ALIASES):
                variables[op.results[0], axes] = operands[0]
            else:
                define(op.results[0], axes, EXPRESSIONS[type(op)](op, operands))
    if function.returns:
        (value,), (axes,) = roots, root_maps
        return [*lines, f"  return {element_type(value).rounding.format(variables[value, axes])};"]
    for j, value, axes in zip(function.stores, roots, root_maps):
        lines.append(f"  r{j} = {element_type(value).store.format(variables[value, axes])};")
    return lines


def device_function(
    function: DeviceFunction,
    lines: Sequence[str],
    loads: Sequence[Access],
    segment: func.FuncOp,
    outputs: Sequence[SSAValue],
    roots: Sequence[SSAValue],
    reductions: Sequence[fusion.ReductionOp],
) -> str:
    """The `__device__` function of `lines`: `function.name(loaded elements..., row values...,
    stored elements&...)`, or returning the reduced element when it stores nothing."""
    parameters = [f"const {element_type(segment.args[loads[k].operand]).storage} a{k}" for k in function.loads]
    parameters += [f"const bool f{k}" for k in function.rotated]
    parameters += [f"const {element_type(reductions[i].results[0]).compute} s{i}" for i in function.reduced]
    parameters += [f"{element_type(outputs[j]).storage}& r{j}" for j in function.stores]
    returned = element_type(roots[0]).compute if function.returns else "void"
    return "\n".join(
        [
            f"__device__ __forceinline__ {returned} {function.name}({', '.join(parameters)}) {{",
            *lines,
            "}",
        ]
    )

