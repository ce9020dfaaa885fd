"""Ops joined by the values they read: the groups that a pass decides about as wholes (a
cluster that `flatten-rows` computes on rows, the independent parts of a kernel's run in
`fusion-to-hir`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from xdsl.ir import Operation, SSAValue


def _owner(value: SSAValue) -> Operation | None:
    return value.owner if isinstance(value.owner, Operation) else None


def read_components(
    ops: Iterable[Operation], producer: Callable[[SSAValue], Operation | None] = _owner
) -> list[list[Operation]]:
    """`ops` grouped by the chains of reads among them: an op is in the group of the op of
    `ops` that `producer` says computes one of its operands (by default the operand's
    owner). The groups come in the order of their first op, each in the order of `ops`."""
    ops = list(ops)
    parent = {op: op for op in ops}

    def root(op: Operation) -> Operation:
        while parent[op] is not op:
            parent[op] = parent[parent[op]]
            op = parent[op]
        return op

    for op in ops:
        for operand in op.operands:
            source = producer(operand)
            if source in parent:
                parent[root(source)] = root(op)
    groups: dict[Operation, list[Operation]] = {}
    for op in ops:
        groups.setdefault(root(op), []).append(op)
    return list(groups.values())
