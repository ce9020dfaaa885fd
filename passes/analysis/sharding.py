"""Where an op's operands must live for the op to be local, and what moves them there.

An op is *resharding* when one of its operands and its result disagree on the mesh or
on which axis is `didx`, once the operand's axes are mapped through the op onto the
result's (nvFuser's `isResharding`). `insert-reshardings` puts a `fusion.set` in
front of such an operand, so that afterwards only sets and reductions over a `didx`
axis reshard; `fusion-to-hir` asks `plan_resharding` which communication each of
those becomes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.shard import ReductionKind
from xdsl.utils.exceptions import VerifyException

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import DIDX, SERIAL, FusionOp, TensorType, shape_str, tensor_type
from hostir_dialect.text import HostirError
from hostir.passes.analysis.axis_mapping import operand_axis_maps
from hostir.passes.analysis.operands import describe_operand

REDUCTION_KINDS: dict[type[fusion.ReductionOp], ReductionKind] = {
    fusion.SumOp: ReductionKind.SUM,
    fusion.MaxOp: ReductionKind.MAX,
}


def local_operand_type(op: FusionOp, index: int) -> TensorType:
    """The layout operand `index` needs for `op` to compute without communication.

    The result's mesh, and on each operand axis the parallel type of the result axis it
    maps to; serial where it maps to none (a reduced or contracted axis) or where it is
    broadcast (extent 1 stretched to another extent), since every device holds such
    an axis whole.

    On a mesh of one device a `didx` axis has extent 1 too, so an operand axis of extent
    1 that maps to it is broadcast unless it is the operand's own `didx` axis: the
    operand is then laid out as it would be on any larger mesh, and needs the same
    communication (a one-device allgather rather than moving its `didx` axis, which no
    communication does).
    """
    result = tensor_type(op.results[0])
    result_shape = result.get_shape()
    result_axes = result.axes.data
    operand, axis_map = operand_axis_maps(op)[index]
    operand_type = tensor_type(operand)
    axes = [
        (
            SERIAL
            if target is None
            or (extent == 1 and result_shape[target] != 1)
            or (extent == 1 and result_axes[target] == DIDX and own != DIDX)
            else result_axes[target]
        )
        for extent, own, target in zip(operand_type.get_shape(), operand_type.axes.data, axis_map)
    ]
    try:
        return operand_type.with_(mesh=result.mesh, axes=axes)
    except VerifyException as error:
        raise HostirError.at(
            op,
            f"{op.name}: {describe_operand(op, index)} of shape {shape_str(operand_type.get_shape())} cannot "
            f"be laid out as the result, {result.sharding_str()}: {error}",
        ) from None


def same_placement(a: TensorType, b: TensorType) -> bool:
    """Whether every device holds the same part of `a` as of `b`: same mesh, same `didx` axis."""
    return a.mesh == b.mesh and a.didx_axis == b.didx_axis


def resharded_operands(op: FusionOp) -> list[int]:
    """The operands of `op` that are not laid out as `local_operand_type` says."""
    return [
        index
        for index, operand in enumerate(op.operands)
        if not same_placement(tensor_type(operand), local_operand_type(op, index))
    ]


def reduces_didx_axis(op: FusionOp) -> bool:
    """A reduction over its input's `didx` axis: a communication (allreduce, reduce, reduce_scatter)."""
    return isinstance(op, fusion.ReductionOp) and tensor_type(op.input).didx_axis in op.reduced_axes


# --------------------------------------------------------------------------- #
# Plans: which communication a resharding set or reduction becomes             #
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Collective:
    """One communication from the op's input buffer into its output buffer."""

    op: type[hir.CommunicationOp]
    team: tuple[int, ...]
    root: int | None = None
    reduce_op: ReductionKind | None = None


@dataclass(frozen=True)
class LocalCopy:
    """Every device of the output's mesh holds what it needs of the input: a copy, no message."""


@dataclass(frozen=True)
class LocalSlice:
    """Every device of the output's mesh holds the whole input and keeps its slice of `axis`.

    The slice index is the device id minus `first_device` (the output's mesh is contiguous).
    """

    axis: int
    first_device: int


Plan = LocalCopy | LocalSlice | tuple[Collective, ...]


def plan_resharding(op: fusion.SetOp | fusion.ReductionOp) -> Plan:
    """What moves the input of a set, or of a reduction over its `didx` axis, to its output.

    Raises a `HostirError` naming the op and both shardings when no rule covers the change.
    """
    if isinstance(op, fusion.SetOp):
        return _plan_set(op)
    return _plan_reduction(op)


class UnsupportedResharding(HostirError):
    """No communication implements a change of sharding; `reason` says why, in words."""

    reason: str = ""


def _cannot_lower(op: FusionOp, reason: str) -> UnsupportedResharding:
    source, target = tensor_type(op.operands[0]), tensor_type(op.results[0])
    error = UnsupportedResharding.at(
        op,
        f"{op.name}: cannot lower the change from {source.sharding_str()} to "
        f"{target.sharding_str()}: {reason}",
    )
    error.reason = reason
    return error


def _team(mesh: fusion.DeviceMeshAttr, root: int) -> tuple[int, ...]:
    """The mesh's devices in mesh order, then the root if it is not one of them."""
    return mesh.ids if root in mesh.ids else (*mesh.ids, root)


def _plan_set(op: fusion.SetOp) -> Plan:
    source, target = tensor_type(op.input), tensor_type(op.result)
    source_didx, target_didx = source.didx_axis, target.didx_axis
    if source_didx is not None and target_didx is not None and source_didx != target_didx:
        raise _cannot_lower(op, "no communication moves a didx axis to another axis")
    if same_placement(source, target):
        return LocalCopy()
    if source_didx is None and set(target.mesh.ids) <= set(source.mesh.ids):
        if target_didx is None:
            return LocalCopy()
        return LocalSlice(target_didx, _first_device_of_contiguous(op, target.mesh))
    if source.mesh == target.mesh:
        return (Collective(hir.AllgatherOp, source.mesh.ids),)
    if source.mesh.size == 1 and source_didx is None:
        (root,) = source.mesh.ids
        if target_didx is not None:
            return (Collective(hir.ScatterOp, _team(target.mesh, root), root),)
        if target.mesh.size > 1:
            return (Collective(hir.BroadcastOp, _team(target.mesh, root), root),)
    if target.mesh.size == 1 and target_didx is None and source_didx is not None:
        (root,) = target.mesh.ids
        return (Collective(hir.GatherOp, _team(source.mesh, root), root),)
    if source_didx != target_didx:
        raise _cannot_lower(op, "no communication changes both the mesh and the didx axis")
    if source.mesh.size != target.mesh.size:
        raise _cannot_lower(
            op,
            "a change of mesh that keeps the layout pairs the devices one to one, "
            "so the meshes must have equal sizes",
        )
    return tuple(_send_recv_pairs(op, source.mesh.ids, target.mesh.ids))


def _send_recv_pairs(
    op: fusion.SetOp, senders: Sequence[int], receivers: Sequence[int]
) -> list[Collective]:
    """One send_recv from each device of one mesh to the device at its position in the other."""
    for sender, receiver in zip(senders, receivers):
        if sender == receiver:
            raise _cannot_lower(
                op,
                f"device {sender} is at the same position of both meshes, so send_recv "
                "would send to itself",
            )
    return [
        Collective(hir.SendRecvOp, (sender, receiver), sender)
        for sender, receiver in zip(senders, receivers)
    ]


def _plan_reduction(op: fusion.ReductionOp) -> Plan:
    source, target = tensor_type(op.input), tensor_type(op.result)
    others = [axis for axis in op.reduced_axes if axis != source.didx_axis]
    if others:
        raise _cannot_lower(
            op,
            f"the reduction over the didx axis also reduces axes {others}; "
            "insert-reshardings splits it in two",
        )
    reduce_op = REDUCTION_KINDS[type(op)]
    if source.mesh == target.mesh:
        collective = hir.AllreduceOp if target.didx_axis is None else hir.ReduceScatterOp
        return (Collective(collective, source.mesh.ids, reduce_op=reduce_op),)
    if target.mesh.size == 1 and target.didx_axis is None:
        (root,) = target.mesh.ids
        return (Collective(hir.ReduceOp, _team(source.mesh, root), root, reduce_op),)
    raise _cannot_lower(
        op, "a reduction over the didx axis ends on the input's mesh or on a single device"
    )


def _first_device_of_contiguous(op: FusionOp, mesh: fusion.DeviceMeshAttr) -> int:
    """The first device of `mesh`; a device's index in it is its id minus that."""
    first = mesh.ids[0]
    if mesh.ids != tuple(range(first, first + mesh.size)):
        raise _cannot_lower(
            op,
            f"a device finds its slice by its index in the mesh, which is its id minus "
            f"{first} only in a mesh of consecutive devices",
        )
    return first
