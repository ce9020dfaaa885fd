"""The operands of an op as the user knows them, for messages that name one.

A pass's error names the operand the user wrote (`lhs` of the `fusion.matmul` at
model.py:12), not its position among an hir op's operands; `axis_mapping`, `sharding`
and the passes all phrase their messages with `describe_operand`.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.irdl import OptOperandDef, VarOperandDef

from hostir_dialect import fusion, hir
from hostir_dialect.text import operation_location


def describe_operand(op: Operation, index: int) -> str:
    """Operand `index` of `op` as the user knows it: its name in the op and where its value
    comes from, ``operand 1 `rhs` (input #0 of @f)``, ``operand 0 `lhs` (the fusion.matmul
    at model.py:12)`` or, in a host program, ``operand 0 `lhs` (the buffer allocated at
    model.py:12)``, which lowering allocates at the line of the op that fills it."""
    return f"operand {index} `{operand_names(op)[index]}` ({describe_value(op.operands[index])})"


def describe_typed_operand(op: Operation, index: int) -> str:
    """`describe_operand` and the operand's type: ``operand 0 `lhs` (input #0 of @f) of type
    !fusion.tensor<[8, 4], f32>``."""
    return f"{describe_operand(op, index)} of type {op.operands[index].type}"


def describe_value(value: SSAValue) -> str:
    """Where `value` comes from: ``input #0 of @f``, ``the fusion.matmul at model.py:12``."""
    if isinstance(value, BlockArgument):
        owner = value.block.parent_op()
        function = f" of @{owner.sym_name.data}" if isinstance(owner, func.FuncOp) else ""
        return f"input #{value.index}{function}"
    place = operation_location(value.owner)
    what = "the buffer allocated" if isinstance(value.owner, hir.AllocateOp) else f"the {value.owner.name}"
    return what + (f" at {place.file}:{place.line}" if place else "")


def operand_names(op: Operation) -> list[str]:
    """The name of each operand of `op`: its definition's, `name[i]` in a variadic group.

    The `ins` of an hir op that computes one fusion op on buffers (`hir.matmul`,
    `hir.pointwise "add"`, `hir.reduction "sum"`, ...) take that fusion op's names
    (`lhs`, `rhs`, `input`), which the user wrote; its `outs` stay `outs[i]`.
    """
    names: list[str] = []
    for name, definition in op.get_irdl_definition().operands:
        group = getattr(op, name)
        if isinstance(definition, OptOperandDef):
            names += [name] if group is not None else []
        elif isinstance(definition, VarOperandDef):
            names += [f"{name}[{i}]" for i in range(len(group))]
        else:
            names.append(name)
    computed = _computed_fusion_op(op)
    if computed is not None:
        definitions = computed.get_irdl_definition().operands
        if not any(type(d) is VarOperandDef for _, d in definitions):
            ins = len(op.ins)
            names[:ins] = [name for name, _ in definitions][:ins]
    return names


FUSION_OPS: dict[str, type[Operation]] = {op.name: op for op in fusion.Fusion.operations}


def _computed_fusion_op(op: Operation) -> type[Operation] | None:
    """The fusion op that an hir compute op computes on buffers, if it computes one."""
    if isinstance(op, hir.PointwiseOp | hir.ReductionOp):
        return FUSION_OPS.get(f"fusion.{op.kind.data}")
    if isinstance(op, hir.MatmulOp | hir.LinearOp):
        return FUSION_OPS.get(op.name.replace("hir.", "fusion.", 1))
    return None
