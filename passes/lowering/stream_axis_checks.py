"""What no pipeline of `stream-parallel` covers, refused before anything is rewritten.

A table of small checks (`STREAM_AXIS_CHECKS`), each of which names the op and the types
where an op's stream axes cannot be pipelined: two operands with different stream axes,
a stream axis that the op reduces, a reduced axis kept with extent 1 as the stream axis,
a matmul whose M or N is the stream axis of a batched product, a point-to-point
allgather over a mesh of non-consecutive devices, a `didx` axis that becomes a stream
axis through anything but an allgather or a copy, and a stream axis of an attention
other than the blocks of its keys (docs/design.md says why each). The blocks of an
attention's keys, which it reduces, may be stream: `attention-ring` lowers them to a
ring that merges what each block gives.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Operation, SSAValue

from hostir_dialect import hir
from hostir_dialect.fusion import ParallelType, key_block_axis, tensor_type
from hostir_dialect.text import HostirError
from hostir.passes.analysis.axis_mapping import (
    AxisMap,
    matmul_slice_problem,
    operand_axis,
    operand_axis_maps,
    output_of,
)
from hostir.passes.analysis.operands import describe_typed_operand


REDUCING_OPS = (hir.ReductionOp, hir.AllreduceOp, hir.ReduceOp, hir.ReduceScatterOp)
"""Ops whose input has axes that their output lacks or keeps with extent 1."""


def p2p_gathered_axis(op: Operation) -> int | None:
    """The output stream axis of an allgather or copy whose input is `didx` on that axis.

    Such an op gathers the shards one device per iteration: the point-to-point allgather.
    """
    if not isinstance(op, hir.AllgatherOp | hir.CopyOp):
        return None
    source, output = tensor_type(op.operands[0]), tensor_type(output_of(op))
    axis = output.stream_axis
    if axis is None or source.rank != output.rank:
        return None
    return axis if source.parallel_types()[axis] == ParallelType.DIDX else None


AxisMaps = list[tuple[SSAValue, AxisMap]]

ATTENTION_OPS = (hir.AttentionOp, hir.AttentionBackwardOp)


def streamed_key_blocks(op: Operation, buffer: SSAValue) -> bool:
    """Whether `buffer` is keys or values in blocks of an attention op (or their gradients, the
    outs of a backward), with its stream axis on the blocks: the ring of `attention-ring`."""
    if not isinstance(op, ATTENTION_OPS) or op.blocks is None:
        return False
    keys = [*op.ins[op.OPERANDS - 4 : op.OPERANDS - 2]] if isinstance(op, hir.AttentionBackwardOp) else [*op.ins[1:3]]
    if isinstance(op, hir.AttentionBackwardOp):
        keys += op.outs[1:]
    type = tensor_type(buffer)
    return buffer in keys and type.stream_axis == key_block_axis(type)


def _reduced_stream_axis(op: Operation, maps: AxisMaps) -> str | None:
    for index, (operand, axis_map) in enumerate(maps):
        stream = tensor_type(operand).stream_axis
        if stream is not None and axis_map[stream] is None and not streamed_key_blocks(op, operand):
            verb = "contracts" if isinstance(op, hir.MatmulOp | hir.LinearOp) else "reduces"
            return (
                f"{op.name} {verb} axis {stream} of {describe_typed_operand(op, index)}, "
                "which is that operand's stream axis; a reduced axis "
                "cannot be stream-parallel"
            )
    return None


def _disagreeing_stream_axes(op: Operation, maps: AxisMaps) -> str | None:
    targets: dict[int, str] = {}
    for index, (operand, axis_map) in enumerate(maps):
        stream = tensor_type(operand).stream_axis
        if stream is not None:
            described = describe_typed_operand(op, index)
            targets.setdefault(axis_map[stream], described)
    if len(targets) < 2:
        return None
    return (
        f"the stream axes of the operands of {op.name} map to different axes "
        f"{sorted(targets)} of its output {tensor_type(output_of(op))}: "
        + "; ".join(f"axis {axis} from {what}" for axis, what in sorted(targets.items()))
    )


def _reduced_output_axis(op: Operation, maps: AxisMaps) -> str | None:
    output = tensor_type(output_of(op))
    stream = output.stream_axis
    if stream is None or not isinstance(op, REDUCING_OPS) or operand_axis(maps[0][1], stream) is not None:
        return None
    return (
        f"the stream axis {stream} of the output {output} of {op.name} is an axis it "
        "reduces, kept with extent 1; no slice of the input computes a slice of it"
    )


def _unsliceable_matmul_axis(op: Operation, maps: AxisMaps) -> str | None:
    output = tensor_type(output_of(op))
    if output.stream_axis is None or not isinstance(op, hir.MatmulOp):
        return None
    lhs, rhs = (tensor_type(value).rank for value in op.ins[:2])
    problem = matmul_slice_problem(lhs, rhs, output.stream_axis)
    if problem is None:
        return None
    return (
        f"the stream axis {output.stream_axis} of the output {output} of hir.matmul is "
        f"{problem}: a matmul of the slices would not be a slice of the product"
    )


def _sparse_p2p_mesh(op: Operation, maps: AxisMaps) -> str | None:
    if p2p_gathered_axis(op) is None:
        return None
    mesh = tensor_type(op.operands[0]).mesh.ids
    if mesh == tuple(range(mesh[0], mesh[0] + len(mesh))):
        return None
    return (
        f"the point-to-point allgather of {op.name} from {describe_typed_operand(op, 0)} "
        "needs a mesh of consecutive devices"
    )


def _didx_to_stream(op: Operation, maps: AxisMaps) -> str | None:
    output = tensor_type(output_of(op))
    if output.stream_axis is None or p2p_gathered_axis(op) is not None:
        return None
    for index, (operand, axis_map) in enumerate(maps):
        source_axis = operand_axis(axis_map, output.stream_axis)
        if source_axis is not None and source_axis == tensor_type(operand).didx_axis:
            return (
                f"the stream axis {output.stream_axis} of the output {output} of {op.name} is "
                f"the didx axis {source_axis} of {describe_typed_operand(op, index)}; "
                "only an allgather or a copy can turn a didx axis "
                "into a stream axis (the point-to-point allgather)"
            )
    return None


def _attention_stream_axis(op: Operation, maps: AxisMaps) -> str | None:
    if not isinstance(op, ATTENTION_OPS):
        return None
    for index, (operand, _) in enumerate(maps):
        if tensor_type(operand).stream_axis is not None and not streamed_key_blocks(op, operand):
            return (
                f"{op.name}: {describe_typed_operand(op, index)} has a stream axis; an attention "
                "streams only the blocks of its keys and values (attention-ring makes a ring of them)"
            )
    return None


STREAM_AXIS_CHECKS: tuple[Callable[[Operation, AxisMaps], str | None], ...] = (
    _attention_stream_axis,
    _reduced_stream_axis,
    _disagreeing_stream_axes,
    _reduced_output_axis,
    _unsliceable_matmul_axis,
    _sparse_p2p_mesh,
    _didx_to_stream,
)
"""Each returns what no pipeline covers about an op's stream axes, or None."""


def check_stream_axes(op: hir.ComputeOp | hir.CommunicationOp) -> None:
    """Raises a HostirError where no pipeline covers the stream axes of `op`'s buffers."""
    maps = operand_axis_maps(op)
    for check in STREAM_AXIS_CHECKS:
        if (problem := check(op, maps)) is not None:
            raise HostirError.at(op, problem)
