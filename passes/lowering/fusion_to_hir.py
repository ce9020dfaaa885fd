"""fusion-to-hir: fusions become host programs (nvFuser's host IR lowering).

Each public `func.func` holding fusion ops is rewritten in place into a host program
with the same name and signature, as `docs/design.md` ("Host programs") describes:

* a maximal run of pointwise ops over one iteration space (their results' shapes
  broadcast together) becomes a `func.func private @<host>_segment_<k>` of
  fusion ops and one `hir.launch_kernel` of it (`hir.post_on_stream` for a run of
  broadcasts, which only moves data: nvFuser's HostUnit); a segment that reduces rows
  also sums the columns of a value that only such a sum reads after it (a norm's weight
  gradient), returning the sum in its place;
* a set or a reduction that reshards becomes the communication that
  `sharding.plan_resharding` names, each followed by `hir.wait`;
* matmul, linear, attention (and its backward), ATen calls, local reductions and local
  sets become `hir.matmul`, `hir.linear`, `hir.attention` (`hir.attention_backward`),
  `hir.aten`, `hir.reduction` and `hir.copy`;
* each result is a buffer allocated right before the op that fills it, sized from
  `hir.dim`s of the arguments (at the top of the program) through the ops' shape rules.

The pass first drops unused ops and outlines the segments (the program keeps value
semantics, calling them with `func.call`), then replaces each op by buffers and hir
ops, one pattern per kind of op. Private functions are segments and never lowered; a
function without fusion ops is left as it is, so running the pass twice is running
it once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import NamedTuple

from xdsl.context import Context
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import AnyFloat, IndexType, ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, OpResult, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.traits import SymbolTable
from xdsl.transforms.dead_code_elimination import dce
from xdsl.utils.exceptions import VerifyException

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import (
    DYNAMIC,
    POINTWISE_OPS,
    FusionOp,
    TensorType,
    broadcast_shapes,
    shapes_compatible,
    tensor_type,
)
from hostir_dialect.text import HostirError
from hostir.passes.analysis.axis_mapping import operand_axis_maps
from hostir.passes.analysis.components import read_components
from hostir.passes.analysis.operands import describe_operand
from hostir.passes.analysis.sharding import (
    Collective,
    LocalCopy,
    LocalSlice,
    local_operand_type,
    plan_resharding,
    reduces_didx_axis,
    resharded_operands,
)
from hostir.passes.lowering.peer_readable import peer_readable
from hostir.passes.options import check_choice

Extent = int | SSAValue
"""A static extent, or the index value that holds a dynamic one."""


def host_function(op: Operation) -> func.FuncOp | None:
    """The public function that `op` belongs to, which becomes a host program; None in a segment."""
    function = op.parent_op()
    if not isinstance(function, func.FuncOp):
        return None
    if function.sym_visibility is not None and function.sym_visibility.data == "private":
        return None
    return function


def is_pointwise(op: Operation | None) -> bool:
    return isinstance(op, POINTWISE_OPS)


def require_local(op: FusionOp) -> None:
    """Raises for an op that needs an operand moved: insert-reshardings puts the set that moves it."""
    resharded = resharded_operands(op)
    if resharded:
        index = resharded[0]
        raise HostirError.at(
            op,
            f"{op.name}: {describe_operand(op, index)} is at {tensor_type(op.operands[index]).sharding_str()} "
            f"but the op computes at {local_operand_type(op, index).sharding_str()}; run "
            "insert-reshardings first, which moves it with a fusion.set",
        )


# --------------------------------------------------------------------------- #
# Extents                                                                      #
# --------------------------------------------------------------------------- #


class Extents:
    """The logical extents of the values of a host program being built, asked axis by axis.

    An argument's dynamic extent is an `hir.dim` at the top of the program, a buffer's
    is the size it was allocated with, and a fusion op's result (in the program or in
    a segment it calls) has the extents of the operand axes that map to its axis, with
    torch's broadcasting: a static extent other than 1 wins, and several dynamic ones
    give their `arith.maxui` (they are equal unless one is 1 at run time). A type's
    static extent always wins. New ops go where the rewriter inserts.
    """

    def __init__(self, function: func.FuncOp, rewriter: PatternRewriter):
        self.function = function
        self.rewriter = rewriter
        self.known: dict[tuple[SSAValue, int], Extent] = {}
        self.arguments: dict[SSAValue, SSAValue] = {}
        """The value that each argument of a called segment stands for."""

    def of(self, value: SSAValue, axis: int) -> Extent:
        extent = tensor_type(value).get_shape()[axis]
        if extent != DYNAMIC:
            return extent
        if (value, axis) not in self.known:
            self.known[value, axis] = self._infer(value, axis)
        return self.known[value, axis]

    def sizes(self, value: SSAValue) -> list[SSAValue]:
        """The size operands of an `hir.allocate` of `value`'s type: one per `?` extent."""
        shape = tensor_type(value).get_shape()
        return [self._index(self.of(value, axis)) for axis in range(len(shape)) if shape[axis] == DYNAMIC]

    def _infer(self, value: SSAValue, axis: int) -> Extent:
        """The dynamic extent of `axis` of `value`."""
        if value in self.arguments:
            return self.of(self.arguments[value], axis)
        match value:
            case BlockArgument():
                return self._dim(value, axis)
            case OpResult(op=hir.AllocateOp() as allocation):
                return allocation.size_of(axis)
            case OpResult(op=func.CallOp() as call):
                return self._through_call(call, value.index, axis)
            case OpResult(op=fusion.ScaledDotProductOp() as op) if value.index:
                # The maps relate the operands to the first result; the others say whose axis theirs are.
                return self.of(*op.extent_source(value.index, axis))
            case OpResult(op=FusionOp() as op):
                return self._broadcast(
                    [
                        self.of(operand, source)
                        for operand, axis_map in operand_axis_maps(op)
                        for source, target in enumerate(axis_map)
                        if target == axis
                    ]
                )
            case _:
                raise HostirError.at(
                    value.owner,
                    f"{value.owner.name}: fusion-to-hir lowers fusion ops only, and cannot "
                    "size a buffer computed by another op",
                )

    def _through_call(self, call: func.CallOp, index: int, axis: int) -> Extent:
        callee = SymbolTable.lookup_symbol(call, call.callee)
        assert isinstance(callee, func.FuncOp)
        self.arguments.update(zip(callee.args, call.arguments))
        return_op = callee.get_return_op()
        assert return_op is not None
        return self.of(return_op.arguments[index], axis)

    def _broadcast(self, extents: Sequence[Extent]) -> Extent:
        static = [extent for extent in extents if isinstance(extent, int) and extent != 1]
        if static:
            return static[0]
        dynamic = list(dict.fromkeys(e for e in extents if isinstance(e, SSAValue)))
        if not dynamic:
            return 1
        return reduce(lambda a, b: self.rewriter.insert(arith.MaxUIOp(a, b)).result, dynamic)

    def _dim(self, argument: BlockArgument, axis: int) -> SSAValue:
        """`hir.dim` of an argument, made once, among the dims at the top of the program."""
        block = self.function.body.block
        last_dim = None
        for op in block.ops:
            if not isinstance(op, hir.DimOp):
                break
            if op.buffer is argument and op.axis.data == axis:
                return op.result
            last_dim = op
        point = InsertPoint.at_start(block) if last_dim is None else InsertPoint.after(last_dim)
        return self.rewriter.insert(hir.DimOp(argument, axis), point).result

    def _index(self, extent: Extent) -> SSAValue:
        if isinstance(extent, SSAValue):
            return extent
        return self.rewriter.insert(arith.ConstantOp.from_int_and_width(extent, IndexType())).result


# --------------------------------------------------------------------------- #
# Segments                                                                     #
# --------------------------------------------------------------------------- #


class OutlinePointwiseRun(RewritePattern):
    """A maximal run of pointwise ops and row reductions -> a segment function and a
    `func.call` of it.

    A kernel walks one iteration space, and writes each output at every point of it, or
    once per row where it reduces rows, so a run is cut where that does not hold
    (`kernel_run`); the next run starts there.

    The segment takes the values the run reads from outside and returns those used
    after it. A constant that only pointwise ops use stays where it is and each
    segment that reads it recomputes it, so no kernel exists to compute a scalar; it
    goes when the last of them has been outlined. The ops the run passes over stay where
    they are; the call goes before those that read it (`KernelRun.after`).
    """

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        function = host_function(op)
        # A run starts after an op that is not pointwise, or after a constant that stays
        # in place (the end of a run cut just after one).
        if (
            function is None
            or not (is_pointwise(op) or is_local_reduction(op))
            or (is_pointwise(op.prev_op) and not is_recomputed(op.prev_op))
        ):
            return
        run, after = kernel_run(op)
        moved = [o for o in run if not is_recomputed(o)]
        if not any(is_pointwise(o) for o in moved):
            return
        for o in moved:
            require_local(o)

        in_segment = set(moved)
        read = [operand for o in moved for operand in o.operands if operand.owner not in in_segment]
        constants = list(dict.fromkeys(v.owner for v in read if is_recomputed(v.owner)))
        inputs = list(dict.fromkeys(v for v in read if v.owner not in constants))
        outputs = [
            o.results[0] for o in moved if any(use.operation not in in_segment for use in o.results[0].uses)
        ]

        body = Block(arg_types=[value.type for value in inputs])
        values: dict[SSAValue, SSAValue] = dict(zip(inputs, body.args))
        for argument, value in zip(body.args, inputs):
            argument.name_hint = value.name_hint
        # Constants from before the run first, then the run's own ops in program order.
        from_before = [c for c in constants if c not in run]
        from_run = [o for o in run if o in in_segment or o in constants]
        body.add_ops([o.clone(values) for o in (*from_before, *from_run)])
        body.add_op(func.ReturnOp(*(values[value] for value in outputs)))
        name = hir.segment_name(function)
        segment = func.FuncOp(
            name,
            ([value.type for value in inputs], [value.type for value in outputs]),
            Region(body),
            "private",
        )
        rewriter.insert(segment, InsertPoint.before(function))

        call = func.CallOp(name, inputs, [value.type for value in outputs])
        rewriter.insert(call, InsertPoint.before(op) if after is None else InsertPoint.after(after))
        call.location = op.location
        for value, result in zip(outputs, call.results):
            rewriter.replace_all_uses_with(value, result)
        for o in reversed(moved):
            rewriter.erase(o)
        for constant in constants:
            if constant.result.first_use is None:
                rewriter.erase(constant)


class ColumnSumIntoSegment(RewritePattern):
    """A column sum of a segment's result that nothing else reads, where the segment reduces
    rows over the same space -> the segment returns the column sum instead of the value.

    A norm's backward computes its weight's gradient as the gradient times the normalized
    input, summed over the tokens: the segment wrote that product whole (in f32) and a
    reduction read it back. The segment's kernel walks the space row by row already; it sums
    each column of the product as it goes (docs/kernels.md, "Column sums"), and the product
    is never written. Rewritten where the sum is over every axis but the last, of f32 or f64
    values (`fusion.ReductionOp.sums_columns_in_a_kernel`; torch's decomposition of
    `_fused_rms_norm_backward`, which GPUs call, drops the summed axes), and the value has no
    stream axis (a stream loop's launches each walk a slice of the rows, and
    `stream-parallel` cannot slice a segment that reduces its stream axis).
    """

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        if not isinstance(op, fusion.SumOp) or not op.sums_columns_in_a_kernel or not is_local_reduction(op):
            return
        call = op.input.owner
        if not isinstance(call, func.CallOp) or not op.input.has_one_use():
            return
        segment = SymbolTable.lookup_symbol(call, call.callee)
        if not isinstance(segment, func.FuncOp) or segment.body.block.last_op is None:
            return
        returned = segment.body.block.last_op
        index = call.results.index(op.input)
        value = returned.operands[index]
        if tensor_type(value).stream_axis is not None:
            return  # a stream loop runs the segment slice by slice, each slice a part of the rows
        if not any(
            isinstance(r, fusion.ReductionOp)
            and not r.sums_columns
            and tensor_type(r.input).local_shape() == tensor_type(value).local_shape()
            for r in segment.body.block.ops
        ):
            return
        summed = op.clone({op.input: value})
        rewriter.insert(summed, InsertPoint.before(returned))
        returned.operands[index] = summed.result
        segment.update_function_type()
        new_call = func.CallOp(call.callee, call.arguments, segment.function_type.outputs.data)
        new_call.location = call.location
        rewriter.replace(call, new_call)
        new_call.results[index].name_hint = op.result.name_hint
        rewriter.replace(op, [], [new_call.results[index]])


def moves_data(op: Operation) -> bool:
    """A set or a `didx` reduction that communications compute."""
    return (isinstance(op, fusion.SetOp) or reduces_didx_axis(op)) and isinstance(plan_resharding(op), tuple)


def is_local_reduction(op: Operation | None) -> bool:
    """A sum or max that no communication computes (not over a `didx` axis)."""
    return isinstance(op, fusion.ReductionOp) and not reduces_didx_axis(op)


class KernelRun(NamedTuple):
    """The ops one kernel computes (`kernel_run`) and where its call goes."""

    ops: list[Operation]
    after: Operation | None
    """The last op the run passed over that its ops read, after which the call goes; None:
    at the run's first op."""


def kernel_run(first: Operation) -> KernelRun:
    """The pointwise ops and row reductions from `first` that one kernel computes.

    The run takes the ops that follow `first` up to the next communication, passing over
    the ops it cannot hold: local reductions it cannot compute (a column sum, a weight's
    gradient), GEMMs, attention, ATen calls, a rotation of a value of the run (a kernel
    reads a rotation's operand from memory, at the other half), and pointwise ops whose
    results do not broadcast with the run's (two independent computations side by side, say a weight's
    broadcast next to an activation's backward). Those that read the run (or read those)
    stay after the kernel, which computes nothing they do not already follow: so the two
    halves of SwiGLU's backward, which the GEMMs of a weight's gradient stand between in the
    program, are one kernel. The run also takes an op that reads one it passed over and
    none that reads the run, where every op it passed over and reads comes before every op
    that reads the run, unless it is an add of a GEMM's product (a sum of GEMMs' products
    is theirs to make: `sum-in-matmul`): the kernel then goes after the last of those it
    reads (the activation that aot_autograd's partitioner recomputes at the start of a
    backward joins the ops that need the incoming gradient, after the view that reads the
    gradient in; SwiGLU's silu joins the product with the up projection, after its GEMM).
    Once it has passed over an op that is neither pointwise nor a reduction, it takes no
    op of a stream axis, which would leave the stream loop that `stream-parallel` makes
    of its neighbours, and no broadcast but of a value of the run to pointwise ops
    (`_stays_put`); what it took from there and only writes out for later pointwise ops, at
    no fewer bytes than it reads, it leaves to their kernel (`_later_work`). Where
    their extents are dynamic, their types say nothing of their values, so it also ends
    before the first op unconnected to the first op's computation (no chain of reads
    within the run joins them, which would make their verifiers hold the extents alike)
    whose dynamic extents meet the run's (`_first_unrelated_dynamic`). It holds a
    reduction only over the last axis of the run's iteration space, kept (`keepdim`), on
    floating-point values (`_first_misplaced_reduction`): a kernel then walks the space row
    by row. Then it ends before the first op whose result is used after the run but is
    smaller than the run's iteration space (a broadcast that a later loop reads), which
    only a kernel of its own can write whole, unless it has one value per row of a run
    that reduces rows: such a kernel writes it once per row.
    """
    run, space, crossed = [first], _iterated_shape(first), False
    beyond: set[Operation] = set()  # the ops taken after passing over a GEMM (or the like)
    position = {first: 0}
    passed: set[Operation] = set()
    readers: set[Operation] = set()  # the ops passed over that read the run, or read those
    first_reader: int | None = None
    following = first
    while (following := following.next_op) is not None and not _ends_runs(following):
        position[following] = len(position)
        owners = {operand.owner for operand in following.operands}
        waits_for = owners & passed
        if (
            not owners & readers
            and not (
                isinstance(following, fusion.AddOp)
                and any(gemm in waits_for for gemm in following.gemms_added())
            )
            and (first_reader is None or all(position[o] < first_reader for o in waits_for))
            and (is_pointwise(following) or _reduces_rows(following, space))
            and not (isinstance(following, fusion.RotateHalfOp) and following.input.owner in run)
            and not (crossed and _stays_put(following, run))
            and (joined := _joined_space(space, following)) is not None
        ):
            run.append(following)
            space = joined
            if crossed:
                beyond.add(following)
            continue
        passed.add(following)
        if owners & readers or owners.intersection(run):
            readers.add(following)
            first_reader = position[following] if first_reader is None else first_reader
        crossed = crossed or not (is_pointwise(following) or is_local_reduction(following))
    later = _later_work(run, beyond)
    run = [op for op in run if op not in later]
    while run and (cut := _first_cut(run)) is not None:
        run = run[:cut]
    waited_for = [operand.owner for o in run for operand in o.operands if operand.owner in passed]
    return KernelRun(run, max(waited_for, key=position.__getitem__, default=None))


def _joined_space(space: Sequence[int], op: Operation) -> tuple[int, ...] | None:
    """The iteration space of a run of space `space` that takes `op`; None where their shapes
    do not broadcast together."""
    try:
        return broadcast_shapes(space, _iterated_shape(op))
    except VerifyException:
        return None


def _ends_runs(op: Operation) -> bool:
    """An op no run passes over: a communication (a kernel moved before it would delay it, and
    the peers' wait with it), or one that is no fusion op (the function's return)."""
    return moves_data(op) or not isinstance(op, FusionOp)


def _stays_put(op: Operation, run: Collection[Operation]) -> bool:
    """A pointwise op that no run takes from beyond a GEMM (or any op but a pointwise op or a
    reduction) that it passed over: one of a stream axis, which belongs in the stream loop of
    its neighbours, or a broadcast, which only moves data and is best read where its readers
    are than written whole where the run is, unless it broadcasts a value of the run to
    pointwise ops and reductions alone (SwiGLU's backward reading its recomputed
    activation with the batch axis put back)."""
    if isinstance(op, fusion.BroadcastOp | fusion.ExpandOp):
        return op.input.owner not in run or not all(
            is_pointwise(use.operation) or is_local_reduction(use.operation) for use in op.result.uses
        )
    return any(isinstance(result.type, TensorType) and result.type.stream_axis is not None for result in op.results)


def _first_cut(run: list[Operation]) -> int | None:
    """Where `run` must end, the earliest of its three rules; None where it may stay whole. A
    run keeps its first op unless that is a reduction no kernel of it computes."""
    cuts = [_first_unrelated_dynamic(run), _first_misplaced_reduction(run)]
    if (partial := _first_partial_output(run)) is not None:
        cuts.append(max(partial, 1))
    return min((cut for cut in cuts if cut is not None), default=None)


def _iterated_shape(op: Operation) -> tuple[int, ...]:
    """The shape a kernel walks to compute `op` on one device: a reduction's input's, any other
    op's result's, local (a `didx` axis of extent 1). Local, since a kernel walks a device's
    pieces: a varying value's device axis, first of its axes, then broadcasts with any axis
    of a value of higher rank (a `fusion.broadcast` that puts an axis after it), where the
    whole shapes would align it with a data axis."""
    return tensor_type(op.input if isinstance(op, fusion.ReductionOp) else op.results[0]).local_shape()


def _reduces_rows(op: Operation, space: Sequence[int]) -> bool:
    """Whether a kernel of iteration space `space` (with `op`'s input) computes `op` row by
    row: a local sum or max of floating-point values over their last axis, kept, which is
    the space's last axis, of an extent other than 1."""
    if not is_local_reduction(op):
        return False
    shape = tensor_type(op.input).local_shape()
    try:
        space = broadcast_shapes(space, shape)
    except VerifyException:
        return False
    return (
        op.keeps_dims
        and op.reduced_axes == (len(shape) - 1,)
        and len(shape) == len(space)
        and shape[-1] == space[-1] != 1
        and isinstance(tensor_type(op.input).element_type, AnyFloat)
    )


def _first_misplaced_reduction(run: list[Operation]) -> int | None:
    """The position of the first reduction of `run` that a kernel of the run's whole
    iteration space cannot compute row by row (the run grew past it)."""
    space = broadcast_shapes(*map(_iterated_shape, run))
    for i, op in enumerate(run):
        if isinstance(op, fusion.ReductionOp) and not _reduces_rows(op, space):
            return i
    return None


def _first_unrelated_dynamic(run: list[Operation]) -> int | None:
    """The position of the first op of `run` that no chain of reads within it connects to its
    first op and that has a dynamic extent where the run's iteration space has one."""
    space = broadcast_shapes(*map(_iterated_shape, run))
    first = next(set(ops) for ops in read_components(run) if run[0] in ops)
    for i, op in enumerate(run):
        if op not in first and _dynamic_extents_meet(space, _iterated_shape(op)):
            return i
    return None


def _later_work(run: Sequence[Operation], beyond: Collection[Operation]) -> set[Operation]:
    """The ops of `run` that the kernel of their readers computes at less cost: each
    component of `run` (ops joined by reads within it, `read_components`) taken from beyond an
    op that is neither pointwise nor a reduction (`beyond`), whose results only pointwise
    ops read outside the run (not a rotation, which a kernel reads from memory), and that
    reads from outside the run no more bytes per point of its iteration space than it
    writes. Such work would be written out by this kernel
    and read back by a later one, whose ops it joins where it stands; a norm's backward
    recomputing its normalized input in f32 from the saved bf16 activation would write two
    f32 values where its reader can read the one bf16 value."""
    later: set[Operation] = set()
    for ops in read_components(run):
        inside = set(ops)
        if not inside.issubset(beyond):
            continue
        results = [r for op in ops for r in op.results if any(u.operation not in inside for u in r.uses)]
        readers = [u.operation for r in results for u in r.uses if u.operation not in inside]
        if not all(is_pointwise(o) and not isinstance(o, fusion.RotateHalfOp) for o in readers):
            continue
        reads = {v for op in ops for v in op.operands if v.owner not in inside}
        space = broadcast_shapes(*map(_iterated_shape, ops))
        if _bytes_per_point(reads, space) <= _bytes_per_point(results, space):
            later |= inside
    return later


def _bytes_per_point(values: Collection[SSAValue], space: Sequence[int]) -> int:
    """The bytes `values` hold per point of the iteration space `space`, counting those that
    fill it (a broadcast value is read once per many points)."""
    return sum(
        tensor_type(v).element_type.size
        for v in values
        if _fills(tensor_type(v).local_shape(), space)
    )


def _fills(shape: Sequence[int], space: Sequence[int]) -> bool:
    """Whether a value of shape `shape` has a value at each point of `space`: a value of lower
    rank does where the axes it lacks have extent 1."""
    missing = space[: len(space) - len(shape)]
    return shapes_compatible(shape, space[len(space) - len(shape) :]) and all(e == 1 for e in missing)


def _dynamic_extents_meet(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether an axis of `a` and one of `b` that broadcasting aligns are both dynamic."""
    return any(x == DYNAMIC and y == DYNAMIC for x, y in zip(reversed(a), reversed(b)))


def _shape(op: Operation) -> tuple[int, ...]:
    return tensor_type(op.results[0]).local_shape()


def _first_partial_output(run: list[Operation]) -> int | None:
    """The position of the first op in `run` whose result is used after it but fills
    neither the run's iteration space nor, where the run reduces rows, its rows; None if
    there is none."""
    space = broadcast_shapes(*map(_iterated_shape, run))
    rows = (*space[:-1], 1) if any(isinstance(op, fusion.ReductionOp) for op in run) else None
    in_run = set(run)
    for i, op in enumerate(run):
        shape = _shape(op)
        used_after = any(use.operation not in in_run for use in op.results[0].uses)
        # A value of lower rank broadcast along the axes it lacks (a weight's cast) would be
        # written at every row.
        fills = _fills(shape, space)
        fills_rows = rows is not None and len(shape) == len(rows) and shapes_compatible(shape, rows)
        if used_after and not is_recomputed(op) and not fills and not fills_rows:
            return i
    return None


def is_recomputed(op: Operation | Block) -> bool:
    """A constant that only pointwise ops use: every segment that reads it computes it again."""
    return isinstance(op, fusion.ConstantOp) and all(is_pointwise(use.operation) for use in op.result.uses)


# --------------------------------------------------------------------------- #
# Lowering to buffers                                                          #
# --------------------------------------------------------------------------- #


class BufferLowering(RewritePattern, ABC):
    """Replaces an op of a host program by buffers for its results and the hir ops that fill them."""

    @abstractmethod
    def lowers(self, op: Operation) -> bool:
        """Whether this pattern is the one that lowers `op`."""

    @abstractmethod
    def fill(self, op: Operation, outs: Sequence[SSAValue]) -> list[Operation]:
        """The hir ops that compute `op` into the buffers `outs`."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        function = host_function(op)
        if function is None or not self.lowers(op):
            return
        extents = Extents(function, rewriter)
        buffers = [hir.AllocateOp(result.type, extents.sizes(result)) for result in op.results]
        outs = [buffer.result for buffer in buffers]
        lowered = [*buffers, *self.fill(op, outs)]
        for new_op in lowered:
            # Errors at run time then point at the line of the fusion op.
            new_op.location = op.location
        rewriter.replace(op, lowered, outs)


@dataclass(frozen=True)
class LowerCompute(BufferLowering):
    """A local `fusion.matmul` or `fusion.linear` -> the hir op of the same name."""

    fusion_op: type[FusionOp]
    hir_op: type[hir.ComputeOp]

    def lowers(self, op: Operation) -> bool:
        return isinstance(op, self.fusion_op)

    def fill(self, op: Operation, outs: Sequence[SSAValue]) -> list[Operation]:
        require_local(op)
        return [self.hir_op(op.operands, outs)]


class LowerAttention(BufferLowering):
    """`fusion.attention` or its backward -> the hir op of the same name, with its properties."""

    def lowers(self, op: Operation) -> bool:
        return isinstance(op, fusion.ATTENTION_OPS)

    def fill(self, op: fusion.ScaledDotProductOp, outs: Sequence[SSAValue]) -> list[Operation]:
        require_local(op)
        hir_op = hir.AttentionOp if isinstance(op, fusion.AttentionOp) else hir.AttentionBackwardOp
        return [hir_op(op.operands, outs, dict(op.properties))]


class LowerAten(BufferLowering):
    """`fusion.aten` -> `hir.aten` of the same overload and arguments."""

    def lowers(self, op: Operation) -> bool:
        return isinstance(op, fusion.AtenOp)

    def fill(self, op: fusion.AtenOp, outs: Sequence[SSAValue]) -> list[Operation]:
        require_local(op)
        return [hir.AtenOp(op.target, op.call, op.inputs, outs, op.returns)]


class LowerLocalReduction(BufferLowering):
    """A sum or max over axes that are not `didx` -> `hir.reduction`."""

    def lowers(self, op: Operation) -> bool:
        return isinstance(op, fusion.ReductionOp) and not reduces_didx_axis(op)

    def fill(self, op: fusion.ReductionOp, outs: Sequence[SSAValue]) -> list[Operation]:
        require_local(op)
        kind = op.name.removeprefix("fusion.")
        return [hir.ReductionOp(kind, op.reduced_axes, op.keeps_dims, [op.input], outs)]


class LowerLocalCopy(BufferLowering):
    """A set that moves no data between devices -> `hir.copy`."""

    def lowers(self, op: Operation) -> bool:
        return isinstance(op, fusion.SetOp) and isinstance(plan_resharding(op), LocalCopy)

    def fill(self, op: fusion.SetOp, outs: Sequence[SSAValue]) -> list[Operation]:
        return [hir.CopyOp([op.input], outs)]


class LowerLocalSlice(BufferLowering):
    """A set from a replicated input to a sharded output on devices that hold it -> a local slice.

    Each device copies slice (its index in the mesh) of the input's axis into its shard:
    `alias_select` of both, then `hir.copy`.
    """

    def lowers(self, op: Operation) -> bool:
        return isinstance(op, fusion.SetOp) and isinstance(plan_resharding(op), LocalSlice)

    def fill(self, op: fusion.SetOp, outs: Sequence[SSAValue]) -> list[Operation]:
        plan = plan_resharding(op)
        assert isinstance(plan, LocalSlice)
        device = hir.DeviceIndexOp()
        first = arith.ConstantOp.from_int_and_width(plan.first_device, IndexType())
        position = arith.SubiOp(device, first)
        shard = arith.ConstantOp.from_int_and_width(0, IndexType())
        source = hir.AliasSelectOp(op.input, plan.axis, position.result)
        target = hir.AliasSelectOp(outs[0], plan.axis, shard.result)
        return [
            device,
            first,
            position,
            shard,
            source,
            target,
            hir.CopyOp([source.result], [target.result]),
        ]


@dataclass(frozen=True)
class LowerCommunication(BufferLowering):
    """A set or a `didx` reduction that moves data -> its communications, each then `hir.wait`.

    With the `cuda` backend the copy engines move the bytes, which only the collectives
    with a copy-engine form allow (`hir.COPY_ENGINE_OPS`); the input they read becomes
    symmetric first (`peer_readable`), so that the peers can read it. With
    `nccl_reductions`, NCCL moves the collectives that reduce whatever the backend.
    """

    backend: hir.CommunicatorBackend
    nccl_reductions: bool = False

    def lowers(self, op: Operation) -> bool:
        return moves_data(op)

    def backend_of(self, collective: Collective) -> hir.CommunicatorBackend:
        if self.nccl_reductions and collective.reduce_op is not None:
            return hir.CommunicatorBackend.NCCL
        return self.backend

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter, /) -> None:
        copy_engines = [
            collective
            for collective in (plan_resharding(op) if host_function(op) and self.lowers(op) else ())
            if self.backend_of(collective) == hir.CommunicatorBackend.CUDA
        ]
        if copy_engines:
            for collective in copy_engines:
                if not collective.op.HAS_COPY_ENGINE_FORM:
                    raise HostirError.at(
                        op,
                        f"{op.name}: fusion-to-hir{{backend=cuda}} asks the copy engines to move "
                        f"this {collective.op.name}, which has no copy-engine form (the copy engines "
                        f"move {', '.join(hir.COPY_ENGINE_OPS)} only); lower it with backend=nccl",
                    )
            op.operands[0] = peer_readable(rewriter, op.operands[0], op)
        super().match_and_rewrite(op, rewriter)

    def fill(self, op: Operation, outs: Sequence[SSAValue]) -> list[Operation]:
        ops: list[Operation] = []
        for collective in plan_resharding(op):
            communication = collective.op(
                op.operands[0],
                outs[0],
                collective.team,
                root=collective.root,
                reduce_op=collective.reduce_op,
                backend=self.backend_of(collective),
            )
            ops += [communication, hir.WaitOp(communication.work)]
        return ops


class LowerSegmentCall(BufferLowering):
    """A call of a segment -> `hir.launch_kernel`, or `hir.post_on_stream` for broadcasts only."""

    def lowers(self, op: Operation) -> bool:
        return isinstance(op, func.CallOp)

    def fill(self, op: func.CallOp, outs: Sequence[SSAValue]) -> list[Operation]:
        segment = SymbolTable.lookup_symbol(op, op.callee)
        assert isinstance(segment, func.FuncOp)
        body = [o for o in segment.body.block.ops if not isinstance(o, func.ReturnOp)]
        moves_only = all(isinstance(o, (fusion.BroadcastOp, fusion.ExpandOp)) for o in body)
        launch = hir.PostOnStreamOp if moves_only else hir.LaunchKernelOp
        return [launch(op.callee, op.arguments, outs)]


@dataclass(frozen=True)
class FusionToHir(ModulePass):
    """Rewrites every fusion into a host program of buffers, communications and kernels.

    `backend` moves the bytes of the collectives: nccl, or cuda for the copy engines
    (`docs/copy-engine.md`); `nccl_reductions` leaves those that reduce (reduce-scatter,
    allreduce, reduce) to NCCL whatever the backend: on more than 2 GPUs the copy engines'
    reductions are slower than NCCL's (docs/benchmarks.md).
    """

    name = "fusion-to-hir"

    backend: str = "nccl"
    nccl_reductions: bool = False

    def __post_init__(self) -> None:
        # A backend the pass cannot use is refused when the pass is built, before it runs.
        check_choice(self.name, "backend", self.backend, hir.CommunicatorBackend)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        backend = hir.CommunicatorBackend(self.backend)
        dce(op)
        PatternRewriteWalker(OutlinePointwiseRun(), apply_recursively=False).rewrite_module(op)
        PatternRewriteWalker(ColumnSumIntoSegment(), apply_recursively=False).rewrite_module(op)
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    LowerCompute(fusion.MatmulOp, hir.MatmulOp),
                    LowerCompute(fusion.LinearOp, hir.LinearOp),
                    LowerAttention(),
                    LowerAten(),
                    LowerLocalReduction(),
                    LowerLocalCopy(),
                    LowerLocalSlice(),
                    LowerCommunication(backend, self.nccl_reductions),
                    LowerSegmentCall(),
                ],
                dce_enabled=False,
            ),
            apply_recursively=False,
        ).rewrite_module(op)
