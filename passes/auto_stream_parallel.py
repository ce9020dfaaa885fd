"""auto-stream-parallel: choose the stream axes of a fusion written without any.

A user of torch.compile writes no `stream` axis, and neither need a user of the
builder: this pass finds the all-gather whose pieces feed matmuls and makes the
gathered axis the stream axis of the gather and of the matmuls' results. stream-parallel
then lowers it to the point-to-point ring of pr4515: iteration `i` receives the piece
of the next device while the matmul of the piece that arrived before runs, so the
all-gather hides behind the GEMMs. The chunk count is the number of devices, which is
what a ring takes (torch's `fused_all_gather_matmul` does the same).

A candidate the pass leaves alone is logged on the `hostir.pipelining` logger with the
reason, at INFO level. `auto-stream-parallel{enabled=false}` turns the pass off; a
fusion that already has a stream axis anywhere is left as written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from hostir_dialect import fusion
from hostir_dialect.fusion import STREAM, TensorType, tensor_type
from passes.axis_mapping import operand_axis_maps

LOGGER = logging.getLogger("hostir.pipelining")


def _with_stream_axis(type: TensorType, axis: int) -> TensorType:
    axes = list(type.axes.data)
    axes[axis] = STREAM
    return type.with_(axes=axes)


def _declined(op: fusion.SetOp, reason: str) -> None:
    LOGGER.info("%s of %s is not pipelined: %s", op.name, tensor_type(op.input).sharding_str(), reason)


class PipelineAllgatherIntoMatmuls(RewritePattern):
    """`fusion.set` gathering a `didx` axis, read only as the left operand of matmuls that
    keep that axis -> the axis is `stream` in the set's result and in the matmuls'."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.SetOp, rewriter: PatternRewriter, /) -> None:
        source, gathered = tensor_type(op.input), tensor_type(op.result)
        axis = source.didx_axis
        if axis is None or gathered.didx_axis is not None or source.mesh != gathered.mesh:
            return
        if gathered.stream_axis is not None:
            return
        devices = source.mesh.ids
        if devices != tuple(range(devices[0], devices[0] + len(devices))):
            return _declined(op, "the ring visits the devices of a mesh of consecutive ids only")
        users = [use.operation for use in op.result.uses]
        if not users or any(
            not isinstance(user, fusion.MatmulOp) or user.lhs is not op.result or user.rhs is op.result
            for user in users
        ):
            return _declined(op, "the gathered tensor is read whole by an op that is not a matmul's left operand")
        targets = []
        for user in users:
            (_, lhs_map), _ = operand_axis_maps(user)
            result_axis = lhs_map[axis]
            result = tensor_type(user.result)
            if result_axis is None or result.stream_axis is not None:
                return _declined(op, f"{user.name} does not keep the gathered axis in its result")
            if result.get_shape()[result_axis] != source.get_shape()[axis]:
                return _declined(op, f"{user.name} broadcasts the gathered axis")
            targets.append((user, result_axis))
        rewriter.replace_value_with_new_type(op.result, _with_stream_axis(gathered, axis))
        for user, result_axis in targets:
            rewriter.replace_value_with_new_type(user.result, _with_stream_axis(tensor_type(user.result), result_axis))


def _has_stream_axis(module: ModuleOp) -> bool:
    return any(
        isinstance(result.type, TensorType) and result.type.stream_axis is not None
        for op in module.walk()
        for result in (*op.results, *(arg for region in op.regions for block in region.blocks for arg in block.args))
    )


@dataclass(frozen=True)
class AutoStreamParallel(ModulePass):
    """Chooses stream axes for the all-gathers that feed matmuls, in a fusion that has none.

    `enabled=false` leaves every fusion as it is.
    """

    name = "auto-stream-parallel"

    enabled: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not self.enabled or _has_stream_axis(op):
            return
        PatternRewriteWalker(PipelineAllgatherIntoMatmuls(), apply_recursively=False).rewrite_module(op)
