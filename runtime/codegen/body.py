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
from xdsl.ir import Operation, SSAValue

from hostir_dialect import fusion
from hostir_dialect.builder import torch_dtype
from hostir_dialect.text import HostirError
from hostir.runtime.codegen.expressions import ALIASES, EXPRESSIONS, ElementType, element_type

BODY_NAME = "hostir_segment_body"


def _torch_dtype(value: SSAValue) -> torch.dtype:
    return torch_dtype(fusion.tensor_type(value).element_type)


AxisMap = tuple[int, ...]
"""For each axis of a value, the axis of the iteration space it walks."""


class Access(NamedTuple):
    """One buffer read or written per element: `ins[operand]` or `outs[operand]` through `axes`."""

    operand: int
    axes: AxisMap


def _operand_maps(op: Operation, result_map: AxisMap) -> list[AxisMap]:
    """The axis maps of `op`'s operands when its result is walked through `result_map`."""
    if isinstance(op, fusion.BroadcastOp):
        new_axes = fusion.normalize_axes(op.new_axes.get_values(), len(result_map), "broadcast")
        return [tuple(a for i, a in enumerate(result_map) if i not in new_axes)]
    # torch broadcasting: an operand's axes are the result's last ones.
    return [result_map[len(result_map) - fusion.tensor_type(v).rank :] for v in op.operands]


@dataclass(frozen=True)
class SegmentBody:
    """A segment as one device function of its loaded elements, and the accesses that feed it."""

    name: str
    rank: int
    """The rank of the iteration space: the largest rank of an output."""
    input_dtypes: tuple[torch.dtype, ...]
    output_dtypes: tuple[torch.dtype, ...]
    loads: tuple[Access, ...]
    stores: tuple[Access, ...]
    load_types: tuple[ElementType, ...]
    store_types: tuple[ElementType, ...]
    source: str
    """The `__device__` function, BODY_NAME(loaded elements..., stored elements&...)."""

    @classmethod
    def of(cls, segment: func.FuncOp) -> SegmentBody:
        """Analyses `segment`; raises HostirError for an op or a dtype a kernel cannot compute."""
        ops, outputs = fusable_ops(segment)
        rank = max(fusion.tensor_type(v).rank for v in outputs)
        output_maps = [tuple(range(rank - fusion.tensor_type(v).rank, rank)) for v in outputs]
        maps = needed_axis_maps(ops, outputs, output_maps)
        loads = [Access(i, axes) for i, arg in enumerate(segment.args) for axes in maps.get(arg, ())]
        stores = [Access(j, axes) for j, axes in enumerate(output_maps)]
        lines = body_lines(segment, ops, maps, loads, outputs, output_maps)
        load_types = tuple(element_type(segment.args[a.operand]) for a in loads)
        store_types = tuple(element_type(v) for v in outputs)
        return cls(
            segment.sym_name.data,
            rank,
            tuple(_torch_dtype(a) for a in segment.args),
            tuple(_torch_dtype(v) for v in outputs),
            tuple(loads),
            tuple(stores),
            load_types,
            store_types,
            device_function(lines, load_types, store_types),
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
        if type(op) not in EXPRESSIONS and not isinstance(op, ALIASES):
            raise HostirError.at(
                op,
                f"'{op.name}' cannot be part of the fused pointwise kernel of segment @{name}",
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
    ops: Sequence[Operation], outputs: Sequence[SSAValue], output_maps: Sequence[AxisMap]
) -> AxisMaps:
    """Backwards from the outputs' maps: the maps each value of `ops` is needed under. A
    value that two readers broadcast differently is needed under two maps (and loaded, or
    computed, once per map)."""
    maps: AxisMaps = {}
    for value, axes in zip(outputs, output_maps):
        maps.setdefault(value, {})[axes] = None
    for op in reversed(ops):
        for axes in maps.get(op.results[0], ()):
            for operand, operand_axes in zip(op.operands, _operand_maps(op, axes)):
                maps.setdefault(operand, {})[operand_axes] = None
    return maps


def body_lines(
    segment: func.FuncOp,
    ops: Sequence[Operation],
    maps: AxisMaps,
    loads: Sequence[Access],
    outputs: Sequence[SSAValue],
    output_maps: Sequence[AxisMap],
) -> list[str]:
    """Forwards: the statements of the body, one variable per (value, axis map): load `k`
    from parameter `a<k>`, each op's expression, output `j` stored into `r<j>`."""
    variables: dict[tuple[SSAValue, AxisMap], str] = {}
    lines: list[str] = []

    def define(value: SSAValue, axes: AxisMap, expression: str) -> None:
        variables[value, axes] = f"v{len(lines)}"
        lines.append(
            f"  const {element_type(value).compute} {variables[value, axes]} = {expression};"
        )

    for k, load in enumerate(loads):
        arg = segment.args[load.operand]
        define(arg, load.axes, element_type(arg).load.format(f"a{k}"))
    for op in ops:
        for axes in maps.get(op.results[0], ()):
            operands = [variables[v, a] for v, a in zip(op.operands, _operand_maps(op, axes))]
            if isinstance(op, ALIASES):
                variables[op.results[0], axes] = operands[0]
            else:
                define(op.results[0], axes, EXPRESSIONS[type(op)](op, operands))
    for j, (value, axes) in enumerate(zip(outputs, output_maps)):
        lines.append(f"  r{j} = {element_type(value).store.format(variables[value, axes])};")
    return lines


def device_function(
    lines: Sequence[str], load_types: Sequence[ElementType], store_types: Sequence[ElementType]
) -> str:
    """The `__device__` function BODY_NAME(loaded elements..., stored elements&...) of `lines`."""
    parameters = [f"const {t.storage} a{k}" for k, t in enumerate(load_types)]
    parameters += [f"{t.storage}& r{j}" for j, t in enumerate(store_types)]
    return "\n".join(
        [
            f"__device__ __forceinline__ void {BODY_NAME}({', '.join(parameters)}) {{",
            *lines,
            "}",
        ]
    )
