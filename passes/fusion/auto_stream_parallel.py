"""auto-stream-parallel: choose the stream axes of a fusion written without any.

A user of torch.compile writes no `stream` axis, and neither need a user of the
builder. This pass finds the chains that hide communication behind GEMMs and attention:

* an all-gather whose pieces feed matmuls: the gathered axis becomes the stream axis of
  the gather and of the matmuls' results, which stream-parallel lowers to the
  point-to-point ring of pr4515 (iteration `i` receives the piece of the next device
  while the matmul of the piece that arrived before runs). The chunk count is the
  number of devices, which is what a ring takes (torch's `fused_all_gather_matmul`
  does the same);
* a reduce-scatter of a matmul's product whose rows for each destination are cut into
  chunks, or an allreduce of one whose rows are (the torch importer cuts them into the
  chunks the cost model chooses): the chunk axis becomes the stream axis of the matmul,
  of the pointwise ops between them and of the reduction, so that chunk `i`'s
  reduction runs while chunk `i + 1`'s GEMM does;
* keys and values all-gathered along the sequence for an attention (context
  parallelism): the gathered pieces, the blocks of the keys, become the stream axis of
  both gathers, which `attention-ring` turns into a ring that computes the attention of
  each block as it arrives; and in the backward, the blocks of the keys' and values'
  gradients that reduce-scatters send to their owners, which it turns into a ring that
  sends each block's shares as they are computed.

Each chain it pipelines, and each candidate it leaves alone with the reason, it says on
the `hostir.pipelining` logger, at INFO level (`HOSTIR_DUMP=pipelining`, `hostir.logs`).
`auto-stream-parallel{enabled=false}` turns the pass off; a fusion that already has a
stream axis anywhere is left as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue, Use
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.transforms.dead_code_elimination import dce

from hostir_dialect import fusion
from hostir_dialect.fusion import DYNAMIC, STREAM, TensorType, tensor_type
from hostir import logs
from hostir.passes.analysis.axis_mapping import has_axis_maps, operand_axis_maps


def _with_stream_axis(type: TensorType, axis: int) -> TensorType:
    axes = list(type.axes.data)
    axes[axis] = STREAM
    return type.with_(axes=axes)


def _drops_axis(use: Use, axis: int) -> bool:
    """Whether the op of `use` reads `axis` of the operand whole (reduces, contracts or
    reshapes it), which stream-parallel refuses for a stream axis."""
    user = use.operation
    if not isinstance(user, fusion.FusionOp) or not has_axis_maps(user):
        return False
    operand_maps = [axis_map for value, axis_map in operand_axis_maps(user) if value is use.operation.operands[use.index]]
    return any(axis_map[axis] is None for axis_map in operand_maps)


def _make_stream(
    rewriter: PatternRewriter, value: SSAValue, axis: int, pipelined: Sequence[Operation] | None = None
) -> fusion.SetOp | None:
    """Makes `axis` of `value` stream. The readers in `pipelined` (None: every reader that
    keeps the axis) read it slice by slice; the others read a copy of the whole, of the
    type `value` had, which `Pipelines.compact` moves after the loop."""
    whole_type = tensor_type(value)
    copied = [
        use
        for use in value.uses
        if (use.operation not in pipelined if pipelined is not None else _drops_axis(use, axis))
    ]
    value = rewriter.replace_value_with_new_type(value, _with_stream_axis(whole_type, axis))
    if copied:
        whole = fusion.SetOp(value, whole_type)
        rewriter.insert(whole, InsertPoint.after(value.owner))
        for use in copied:
            use.operation.operands[use.index] = whole.result
        return whole
    return None


def _named(op: Operation) -> str:
    """`fusion.set %all_gather_into_tensor`: the op, and the name of its result where it has one."""
    hint = op.results[0].name_hint if op.results else None
    return f"{op.name} %{hint}" if hint else op.name


def _candidate(op: fusion.SetOp | fusion.SumOp) -> str:
    return f"{_named(op)} of {tensor_type(op.input).sharding_str()}"


def _declined(op: fusion.SetOp | fusion.SumOp, reason: str) -> None:
    logs.say("pipelining", f"{_candidate(op)} is not pipelined: {reason}")


def _pipelined(op: fusion.SetOp | fusion.SumOp, how: str) -> None:
    logs.say("pipelining", f"{_candidate(op)} is pipelined: {how}")


@dataclass
class PipelineAllgatherIntoMatmuls(RewritePattern):
    """`fusion.set` gathering a `didx` axis, read as the left operand of matmuls that keep
    that axis -> the axis is `stream` in the set's result and in those matmuls' results.

    Other readers of the gathered tensor (the weight gradient's matmul, an output saved
    for the backward) read a copy of it made after the ring: an op that reads a stream
    axis whole would have to wait for the whole loop anyway, and stream-parallel
    refuses one that reduces it."""

    pipelines: Pipelines

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
        if any(isinstance(use.operation, fusion.AttentionOp) for use in op.result.uses):
            return  # keys or values: PipelineAllgatherIntoAttention's
        users = [
            use.operation
            for use in op.result.uses
            if isinstance(use.operation, fusion.MatmulOp) and use.index == 0 and use.operation.rhs is not op.result
        ]
        if not users:
            return _declined(op, "no matmul reads the gathered tensor as its left operand")
        targets = []
        for user in users:
            (_, lhs_map), *_ = operand_axis_maps(user)
            result_axis = lhs_map[axis]
            result = tensor_type(user.result)
            if result_axis is None or result.stream_axis is not None:
                return _declined(op, f"{user.name} does not keep the gathered axis in its result")
            if result.get_shape()[result_axis] != source.get_shape()[axis]:
                return _declined(op, f"{user.name} broadcasts the gathered axis")
            targets.append((user, result_axis))
        _pipelined(
            op, f"a ring of {len(devices)} chunks, each read by {', '.join(_named(user) for user in users)} as it arrives"
        )
        copies = [_make_stream(rewriter, op.result, axis, pipelined=users)]
        for user, result_axis in targets:
            copies.append(_make_stream(rewriter, user.result, result_axis))
        self.pipelines.add([op, *users], copies)


def _consecutive(mesh: fusion.DeviceMeshAttr) -> bool:
    return mesh.ids == tuple(range(mesh.ids[0], mesh.ids[0] + mesh.size))


def _declined_attention(op: fusion.ScaledDotProductOp, reason: str) -> None:
    logs.say("pipelining", f"{_named(op)} of {tensor_type(op.operands[0]).sharding_str()} is not a ring: {reason}")


@dataclass
class PipelineAllgatherIntoAttention(RewritePattern):
    """An attention whose keys and values in blocks are each a `fusion.set` gathering the `didx`
    axis of the same mesh into the blocks -> the blocks are `stream` in both sets' results.

    Other readers of the gathered keys (the forward's output that aot_autograd saves for the
    backward) read a copy of them made after the ring."""

    pipelines: Pipelines

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.AttentionOp, rewriter: PatternRewriter, /) -> None:
        if op.blocks is None:
            return _declined_attention(op, "its keys and values are not in blocks (gathered pieces)")
        if op.causal_mask == fusion.Causal.TOP_LEFT:
            return _declined_attention(op, "SDPA's top-left causal mask over gathered keys is no mask of positions")
        sets = [x.owner for x in (op.key, op.value)]
        if not all(isinstance(gather, fusion.SetOp) for gather in sets):
            return _declined_attention(op, "its keys and values are not all-gathered")
        for gather in sets:
            source, gathered = tensor_type(gather.input), tensor_type(gather.result)
            if gathered.stream_axis is not None:
                return
            if source.didx_axis != 0 or gathered.didx_axis is not None or source.mesh != gathered.mesh:
                return _declined_attention(op, "its keys or values are not gathered from the devices into their blocks")
        if not _consecutive(tensor_type(sets[0].input).mesh) or tensor_type(sets[1].input).mesh != tensor_type(sets[0].input).mesh:
            return _declined_attention(op, "the ring visits the devices of one mesh of consecutive ids only")
        copies = [_make_stream(rewriter, gather.result, 0, pipelined=[op]) for gather in sets]
        self.pipelines.add([*sets, op], copies)


@dataclass
class PipelineAttentionGradientsIntoReduceScatter(RewritePattern):
    """An attention backward whose keys' and values' gradients in blocks are each read by one
    reduce-scatter alone, which sends block `s` to device `s` -> the blocks are `stream` in both
    gradients."""

    pipelines: Pipelines

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.AttentionBackwardOp, rewriter: PatternRewriter, /) -> None:
        gradients = (op.grad_key, op.grad_value)
        if op.blocks is None:
            return _declined_attention(op, "its keys and values are not in blocks")
        if op.causal_mask == fusion.Causal.TOP_LEFT:
            return _declined_attention(op, "SDPA's top-left causal mask over gathered keys is no mask of positions")
        scatters = [_blocks_scattered(gradient) for gradient in gradients]
        if None in scatters:
            return _declined_attention(op, "its keys' and values' gradients are not reduce-scattered by blocks alone")
        if not _consecutive(tensor_type(op.grad_key).mesh):
            return _declined_attention(op, "the ring visits the devices of a mesh of consecutive ids only")
        for gradient in gradients:
            rewriter.replace_value_with_new_type(gradient, _with_stream_axis(tensor_type(gradient), 1))
        self.pipelines.add([op, *scatters], [])


def _blocks_scattered(gradient: SSAValue) -> fusion.SumOp | None:
    """The reduce-scatter that is the one reader of a keys' gradient `[D(didx), C, ...]` and
    gives device `s` the sum of block `s` (its result's didx axis is the blocks'), if any."""
    type = tensor_type(gradient)
    if not gradient.has_one_use() or type.didx_axis != 0 or type.stream_axis is not None:
        return None
    reader = gradient.get_user_of_unique_use()
    if not isinstance(reader, fusion.SumOp) or reader.reduced_axes != (0,) or reader.keeps_dims:
        return None
    result = tensor_type(reader.result)
    return reader if result.didx_axis == 0 and result.mesh == type.mesh else None


@dataclass
class Pipelines:
    """The ops of each pipeline the patterns made, and the copies of its wholes, to compact."""

    found: list[tuple[list[Operation], list[fusion.SetOp]]] = field(default_factory=list)

    def add(self, ops: list[Operation], copies: Sequence[fusion.SetOp | None]) -> None:
        self.found.append((ops, [copy for copy in copies if copy is not None]))

    def compact(self) -> None:
        """Puts each pipeline's ops next to each other, and its copies after them.

        stream-parallel merges the loops of consecutive ops only: an op between them (the
        weight's transpose, the copy of the gathered tensor) would end the loop. The ops a
        pipeline's ops read are moved before its first op, which fusion ops, having no
        side effects, allow; its copies' readers after its last op.
        """
        for ops, copies in self.found:
            first = ops[0]
            for op in ops[1:]:
                _hoist_operands(op, first, set(ops))
            last = first
            for op in ops[1:]:
                op.detach()
                last.parent_block().insert_op_after(op, last)
                last = op
            for copy in copies:
                copy.detach()
                last.parent_block().insert_op_after(copy, last)
                _sink_readers(copy)


def _hoist_operands(op: Operation, before: Operation, keep: set[Operation]) -> None:
    """Moves the ops computing `op`'s operands, and theirs, to before `before` where they are after it."""
    block = before.parent_block()
    for operand in op.operands:
        producer = operand.owner
        if (
            isinstance(producer, Operation)
            and producer not in keep
            and producer.parent_block() is block
            and before.is_before_in_block(producer)
        ):
            _hoist_operands(producer, before, keep)
            producer.detach()
            block.insert_op_before(producer, before)


def _sink_readers(op: Operation) -> None:
    """Moves the readers of `op`'s results that sit before it, and their readers, to after it."""
    block = op.parent_block()
    for result in op.results:
        for use in list(result.uses):
            reader = use.operation
            if reader.parent_block() is block and reader.is_before_in_block(op):
                reader.detach()
                block.insert_op_after(reader, op)
                _sink_readers(reader)


POINTWISE = (*fusion.UNARY_OPS, *fusion.BINARY_OPS, fusion.CastOp)


@dataclass
class PipelineMatmulIntoReduction(RewritePattern):
    """A reduce-scatter or an allreduce of a matmul's product -> the chunk axis of its
    pieces is `stream`.

    Both are a `fusion.sum` over the input's `didx` axis; a reduce-scatter's result is
    sharded and an allreduce's replicated. The *chunk axis* is the result's axis right
    after its `didx` axis (a reduce-scatter: the rows each device receives, cut into
    chunks), or its first axis (an allreduce): the importer cuts the rows so. When the
    input is computed from matmuls' products by pointwise ops (a bias; the sum of the
    GEMMs of a gradient), each value read by that computation alone, the chunk axis
    becomes `stream` in all of them: chunk `i`'s reduction runs while the GEMMs of chunk
    `i + 1` do. Where one of those values, or a matmul's left operand, is pipelined along
    another axis already (an all-gather's chunks, where the reduce-scatter's are the
    sequences of a batch), the reduction is not pipelined: one loop runs over one axis.
    """

    pipelines: Pipelines

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.SumOp, rewriter: PatternRewriter, /) -> None:
        source, result = tensor_type(op.input), tensor_type(op.result)
        if source.didx_axis is None or op.reduced_axes != (source.didx_axis,):
            return
        if isinstance(op.input.owner, fusion.AttentionBackwardOp):
            return  # the gradients of keys and values: PipelineAttentionGradientsIntoReduceScatter's
        axis = 0 if result.didx_axis is None else result.didx_axis + 1
        if result.stream_axis is not None or axis >= result.rank or result.get_shape()[axis] in (1, DYNAMIC):
            return
        ((_, input_map),) = operand_axis_maps(op)
        # The values that compute the reduced tensor, back to matmuls, each with its chunk
        # axis: pointwise ops (a bias, the sum of several GEMMs) whose operands of the
        # chunks' extent are all computed so too.
        chain: list[tuple[SSAValue, int]] = []
        matmuls = 0
        pending = [(op.input, input_map.index(axis))]
        while pending:
            value, value_axis = pending.pop()
            if _streams_another_axis(value, value_axis):
                return _declined(op, f"{_owner_name(value)}'s result is pipelined along another axis")
            chain.append((value, value_axis))
            producer = value.owner
            if not value.has_one_use():
                return _declined(op, f"{_owner_name(value)}'s result is read by other ops too")
            if isinstance(producer, fusion.MatmulOp):
                (lhs, lhs_map), *_ = operand_axis_maps(producer)
                lhs_axis = lhs_map.index(value_axis) if value_axis in lhs_map else None
                if lhs_axis is None or lhs_axis >= tensor_type(lhs).rank - 2:
                    # Its M axis would be the rows of each destination, not chunks of them,
                    # and a batched matmul of slices of M is no slice of the product.
                    return _declined(op, "the chunk axis is not a batch axis of the matmul's left operand")
                if _streams_another_axis(lhs, lhs_axis):
                    # An all-gather's chunks (a sequence-parallel pair of projections with
                    # several sequences: the gathered chunks, then each sequence's rows).
                    return _declined(op, f"the left operand of {_owner_name(value)} is pipelined along another axis")
                matmuls += 1
                continue
            if not isinstance(producer, POINTWISE):
                return _declined(op, f"{_owner_name(value)} computes the reduced tensor, not a matmul")
            extent = tensor_type(value).get_shape()[value_axis]
            pending += [
                (operand, axis_map.index(value_axis))
                for operand, axis_map in operand_axis_maps(producer)
                if value_axis in axis_map and tensor_type(operand).get_shape()[axis_map.index(value_axis)] == extent
            ]
        if not matmuls:
            return _declined(op, "no matmul computes the reduced tensor")
        producers = [value.owner for value, _ in chain if isinstance(value.owner, Operation)]
        _pipelined(
            op,
            f"{result.get_shape()[axis]} chunks: chunk i's reduction runs while chunk i + 1's "
            + ", ".join(_named(producer) for producer in producers)
            + " computes it",
        )
        copies = [_make_stream(rewriter, value, value_axis) for value, value_axis in chain]
        # The reduction's readers read the whole, after the loop: one that keeps the axis
        # may share a fused kernel with one that reduces it, which stream-parallel refuses.
        returns = [use.operation for use in op.result.uses if isinstance(use.operation, func.ReturnOp)]
        copies.append(_make_stream(rewriter, op.result, axis, pipelined=returns))
        block = op.parent_block()
        ops = sorted((value.owner for value, _ in chain), key=block.get_operation_index)
        self.pipelines.add([*ops, op], copies)


def _streams_another_axis(value: SSAValue, axis: int) -> bool:
    """Whether `value` has a stream axis already (another pipeline's), other than `axis`: one
    loop cannot run over two axes of one value."""
    stream = tensor_type(value).stream_axis
    return stream is not None and stream != axis


def _owner_name(value: SSAValue) -> str:
    return value.owner.name if isinstance(value.owner, Operation) else "an argument"


def _has_stream_axis(module: ModuleOp) -> bool:
    return any(
        isinstance(result.type, TensorType) and result.type.stream_axis is not None
        for op in module.walk()
        for result in (*op.results, *(arg for region in op.regions for block in region.blocks for arg in block.args))
    )


@dataclass(frozen=True)
class AutoStreamParallel(ModulePass):
    """Chooses stream axes for the all-gathers that feed matmuls, the reduce-scatters and
    allreduces of matmuls' chunks, and the keys and values of attention all-gathered along
    the sequence (and their gradients reduce-scattered back), in a fusion that has none.

    `enabled=false` leaves every fusion as it is.
    """

    name = "auto-stream-parallel"

    enabled: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not self.enabled or _has_stream_axis(op):
            return
        # Ops nothing reads (what an importer wrote and then did without) would count as
        # readers that keep a tensor from being pipelined.
        dce(op)
        pipelines = Pipelines()
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    PipelineAllgatherIntoMatmuls(pipelines),
                    PipelineMatmulIntoReduction(pipelines),
                    PipelineAllgatherIntoAttention(pipelines),
                    PipelineAttentionGradientsIntoReduceScatter(pipelines),
                ]
            ),
            apply_recursively=False,
        ).rewrite_module(op)
        pipelines.compact()
        # A returned value may have gained a stream axis: the signature says so too.
        for function in op.ops:
            if isinstance(function, func.FuncOp) and not function.is_declaration:
                function.update_function_type()
