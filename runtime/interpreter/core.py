"""The interpreter of lowered host programs: prepared once, run every step, on one rank.

A host program runs every training step, so the interpreter does per program what
it can: `Interpreter(function)` walks the `func.func` once, gives every SSA value a
slot in a flat environment list, and turns every op into a *step*, a closure over its
slots built by the op class's entry in the dispatch table `HANDLERS`. Loop and if
bodies become nested step lists. Running is then a loop over closures that index
the environment and call torch, so the cost per op is a Python call or two on top of
the torch call (docs/runtime.md has the measurements against xDSL's interpreter).
Constants (`arith.constant`, static `hir.dim`) are computed while preparing and sit
in the initial environment.

Values in the environment are torch tensors (buffers, with reference semantics, and
views of them), Python ints and bools (index arithmetic), streams and `Work` handles.
A rank outside the mesh of a buffer holds an empty placeholder for it and skips the
compute that writes it, as the host-program contract says.

An op without a handler is an error while preparing, before anything runs. An error
while running is re-raised as a `HostirError` naming the op it came from.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, IntegerType
from xdsl.ir import Block, BlockArgument, Operation, SSAValue

from hostir_dialect import fusion, hir
from hostir_dialect.builder import torch_dtype
from hostir_dialect.fusion import DYNAMIC, ParallelType
from hostir_dialect.text import HostirError
from hostir import config
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.distributed.copy_engine import SymmetricAllocation
from hostir.runtime.distributed.streams import StreamPool, stream_pool
from hostir.runtime.distributed.work import Work
from hostir.runtime.interpreter.aten_calls import carried

Environment = list
"""The values of one run, indexed by slot."""


@dataclass(slots=True)
class RunContext:
    """What one run of a program on one rank needs besides the environment."""

    rank: int
    device: torch.device
    communicator: Communicator
    streams: StreamPool
    issued: list[Work] = field(default_factory=list)
    """Every communication issued in this run, completed before the run returns."""
    input_extents: Mapping[tuple[int, int], int] = field(default_factory=dict)
    """(input index, axis) -> the logical extent of each dynamic axis of each input, on every
    rank: `Program.run` exchanges them, so that `hir.dim` works outside an input's mesh."""

    @classmethod
    def of(
        cls,
        communicator: Communicator,
        num_streams: int | None = None,
        input_extents: Mapping[tuple[int, int], int] | None = None,
    ) -> RunContext:
        """A run on `communicator`'s rank and device, with its pool of `num_streams` streams
        (None: `hostir.config.num_streams`, HOSTIR_NUM_STREAMS or its default)."""
        size = config.num_streams if num_streams is None else num_streams
        return cls(
            communicator.rank,
            communicator.device,
            communicator,
            stream_pool(communicator.device, size),
            input_extents=input_extents or {},
        )


Step = Callable[[Environment, RunContext], None]
Handler = Callable[[Operation, "Preparation"], Step | None]
"""Builds the step of an op; None when the op is done while preparing."""

StepWrapper = Callable[[Operation, Step], Step]
"""Wraps the step of every op while preparing (a tracer, say); costs nothing when absent."""

HANDLERS: dict[type[Operation], Handler] = {}
"""The dispatch table: op class -> the handler that prepares its step."""


def handles(*op_types: type[Operation]) -> Callable[[Handler], Handler]:
    """Registers a handler for `op_types` in `HANDLERS`."""

    def register(handler: Handler) -> Handler:
        for op_type in op_types:
            HANDLERS[op_type] = handler
        return handler

    return register


def run_steps(steps: list[Step], env: Environment, context: RunContext) -> None:
    """Runs `steps` in order; an error becomes a `HostirError` at the op that raised it."""
    try:
        for step in steps:
            step(env, context)
    except HostirError:
        raise
    except Exception as error:
        raise HostirError.at(
            step.op, f"failed on rank {context.rank}: {type(error).__name__}: {error}"
        ) from error


class Preparation:
    """What preparing one function keeps: slots, constants, views of buffers, return slots."""

    def __init__(self, function: func.FuncOp, wrap_step: StepWrapper | None = None):
        self.function = function
        self.wrap_step = wrap_step
        self.slots: dict[SSAValue, int] = {}
        self.constants: dict[int, object] = {}
        self.result_slots: list[int] = []
        self.views: dict[SSAValue, list[SSAValue]] = defaultdict(list)
        for op in function.walk():
            if isinstance(op, hir.AliasSelectOp):
                self.views[hir.view_root(op.result)].append(op.result)

    def slot(self, value: SSAValue) -> int:
        return self.slots.setdefault(value, len(self.slots))

    def slots_of(self, values: Sequence[SSAValue]) -> list[int]:
        return [self.slot(v) for v in values]

    def constant(self, value: SSAValue, python_value: object) -> None:
        self.constants[self.slot(value)] = python_value

    def block(self, block: Block) -> list[Step]:
        steps = []
        for op in block.ops:
            handler = HANDLERS.get(type(op))
            if handler is None:
                raise HostirError.at(op, f"the runtime has no handler for '{op.name}'")
            step = handler(op, self)
            if step is not None:
                if self.wrap_step is not None:
                    step = self.wrap_step(op, step)
                step.op = op
                steps.append(step)
        return steps

    def is_input(self, value: SSAValue) -> bool:
        """Whether `value` is an argument of the program (not of a loop body)."""
        return isinstance(value, BlockArgument) and value.owner is self.function.body.block

    def check_writable(self, op: Operation, buffer: SSAValue) -> None:
        """Refuses an op that would write into one of the program's inputs (or a view of one)."""
        root = hir.view_root(buffer)
        if self.is_input(root):
            raise HostirError.at(
                op,
                f"writes into input #{root.index} of the host program; inputs are read-only "
                "(the host-program contract allocates every buffer an op writes)",
            )


class Interpreter:
    """A host program (`func.func` of hir, scf, arith ops) prepared to run on any rank."""

    def __init__(self, function: func.FuncOp, wrap_step: StepWrapper | None = None):
        preparation = Preparation(function, wrap_step)
        self.argument_slots = preparation.slots_of(function.args)
        self.steps = preparation.block(function.body.block)
        self.result_slots = preparation.result_slots
        self.initial_env: Environment = [None] * len(preparation.slots)
        for slot, value in preparation.constants.items():
            self.initial_env[slot] = value

    def run(self, inputs: Sequence[object], context: RunContext) -> list:
        """Runs the program on `inputs` (this rank's buffers); returns its results.

        Every communication the run issued is complete (waited for on the current
        stream) when it returns, and the caller's current stream is restored.
        """
        env = self.initial_env.copy()
        for slot, value in zip(self.argument_slots, inputs):
            env[slot] = value
        with context.streams.restoring():
            run_steps(self.steps, env, context)
            try:
                for work in context.issued:
                    work.wait()
            except Exception as error:
                raise HostirError(
                    f"on rank {context.rank}, a communication the program did not wait for "
                    f"failed: {type(error).__name__}: {error}"
                ) from error
        return [env[slot] for slot in self.result_slots]


def mesh_of(value: SSAValue) -> frozenset[int]:
    return frozenset(fusion.tensor_type(value).mesh.ids)


# --------------------------------------------------------------------------- #
# func, scf, arith                                                             #
# --------------------------------------------------------------------------- #


@handles(func.ReturnOp)
def _return(op: func.ReturnOp, prep: Preparation) -> None:
    prep.result_slots = prep.slots_of(op.arguments)


@handles(scf.ForOp)
def _for(op: scf.ForOp, prep: Preparation) -> Step:
    lb, ub, step_size = prep.slots_of((op.lb, op.ub, op.step))
    index, *carried = prep.slots_of(op.body.block.args)
    initial = prep.slots_of(op.iter_args)
    results = prep.slots_of(op.results)
    body = prep.block(op.body.block)

    def step(env: Environment, context: RunContext) -> None:
        for source, target in zip(initial, carried):
            env[target] = env[source]
        for i in range(env[lb], env[ub], env[step_size]):
            env[index] = i
            run_steps(body, env, context)
        for source, target in zip(carried, results):
            env[target] = env[source]

    return step


@handles(scf.IfOp)
def _if(op: scf.IfOp, prep: Preparation) -> Step:
    condition = prep.slot(op.cond)
    then_steps = prep.block(op.true_region.block)
    else_steps = prep.block(op.false_region.block) if op.false_region.blocks else []

    def step(env: Environment, context: RunContext) -> None:
        run_steps(then_steps if env[condition] else else_steps, env, context)

    return step


@handles(scf.YieldOp)
def _yield(op: scf.YieldOp, prep: Preparation) -> Step | None:
    """Copies the yielded values to where the parent takes them: loop-carried values or if results."""
    if not op.arguments:
        return None
    parent = op.parent_op()
    targets = prep.slots_of(
        parent.body.block.args[1:] if isinstance(parent, scf.ForOp) else parent.results
    )
    sources = prep.slots_of(op.arguments)

    def step(env: Environment, context: RunContext) -> None:
        # Read all before writing any: a yield may permute loop-carried values.
        values = [env[s] for s in sources]
        for target, value in zip(targets, values):
            env[target] = value

    return step


@handles(arith.ConstantOp)
def _arith_constant(op: arith.ConstantOp, prep: Preparation) -> None:
    if not isinstance(op.value, IntegerAttr):
        raise HostirError.at(op, f"host programs compute on integers and indices, not {op.value}")
    value = op.value.value.data
    prep.constant(op.result, bool(value) if op.result.type == IntegerType(1) else value)


ARITH_BINARY: dict[type[Operation], Callable[[int, int], int]] = {
    arith.AddiOp: operator.add,
    arith.SubiOp: operator.sub,
    arith.MuliOp: operator.mul,
    arith.RemUIOp: operator.mod,
    arith.DivUIOp: operator.floordiv,
    arith.MaxUIOp: max,
    arith.MinUIOp: min,
}
"""Index arithmetic on Python ints (indices are non-negative, so unsigned ops are the plain ones)."""

CMPI_PREDICATES: tuple[Callable[[int, int], bool], ...] = (
    operator.eq,
    operator.ne,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
)
"""arith.cmpi's predicates in xDSL's order: eq ne slt sle sgt sge ult ule ugt uge."""


def _binary_step(function: Callable[[int, int], object], op: Operation, prep: Preparation) -> Step:
    lhs, rhs = prep.slots_of(op.operands)
    result = prep.slot(op.results[0])

    def step(env: Environment, context: RunContext) -> None:
        env[result] = function(env[lhs], env[rhs])

    return step


@handles(*ARITH_BINARY)
def _arith_binary(op: Operation, prep: Preparation) -> Step:
    return _binary_step(ARITH_BINARY[type(op)], op, prep)


@handles(arith.CmpiOp)
def _cmpi(op: arith.CmpiOp, prep: Preparation) -> Step:
    return _binary_step(CMPI_PREDICATES[op.predicate.value.data], op, prep)


@handles(arith.SelectOp)
def _select(op: arith.SelectOp, prep: Preparation) -> Step:
    condition, if_true, if_false = prep.slots_of(op.operands)
    result = prep.slot(op.result)

    def step(env: Environment, context: RunContext) -> None:
        env[result] = env[if_true] if env[condition] else env[if_false]

    return step


# --------------------------------------------------------------------------- #
# Buffers                                                                      #
# --------------------------------------------------------------------------- #


@handles(hir.AllocateOp)
def _allocate(op: hir.AllocateOp, prep: Preparation) -> Step:
    buffer_type = fusion.tensor_type(op.result)
    dtype = torch_dtype(buffer_type.element_type)
    mesh = mesh_of(op.result)
    result = prep.slot(op.result)
    symmetric = SymmetricAllocation.of(op, buffer_type.mesh.ids, dtype) if op.symmetric else None
    order = op.memory_order()
    if order == tuple(range(len(order))):
        order = None  # row-major: torch.empty's own layout, no view to make at every run
    # The local shape, its dynamic extents filled in each run from the size operands;
    # a didx axis is 1 whatever its logical size.
    shape = list(buffer_type.local_shape())
    dynamic = [
        (axis, prep.slot(op.size_of(axis)))
        for axis, (extent, parallel_type) in enumerate(zip(buffer_type.get_shape(), buffer_type.parallel_types()))
        if extent == DYNAMIC and parallel_type != ParallelType.DIDX
    ]

    adopted = op.is_adopted()

    def step(env: Environment, context: RunContext) -> None:
        if context.rank not in mesh:
            env[result] = torch.empty(0, dtype=dtype, device=context.device)
            return
        local_shape = shape.copy()
        for axis, slot in dynamic:
            local_shape[axis] = env[slot]
        if adopted:
            # The op that adopts the buffer reads only its shape and element type (`fill_outs`):
            # one element seen at every index, which no op can write, in place of memory that
            # would be dropped unused.
            env[result] = torch.empty((), dtype=dtype, device=context.device).expand(local_shape)
        elif symmetric is None and order is None:
            env[result] = torch.empty(local_shape, dtype=dtype, device=context.device)
        elif symmetric is None:
            env[result] = empty_in_order(local_shape, order, dtype, context.device)
        else:
            env[result] = symmetric(context.communicator, local_shape)

    return step


def fill_outs(
    env: Environment, slots: Sequence[int], results: Sequence[torch.Tensor | None], adopted: Collection[int]
) -> None:
    """The outs in `slots` get an op's `results`: an out that `adopted` names becomes its
    result (a view stays a view, the kernel's strides stay), seen in the out's local shape (a
    varying out's device axis of one put back), and the others get their result copied in;
    a None result is one the op leaves undefined, which no op reads."""
    for index, (slot, result) in enumerate(zip(slots, results, strict=True)):
        if result is None:
            continue
        target = env[slot]
        result = carried(result, target)
        if result.shape != target.shape:
            result = result.view(target.shape)
        if index in adopted:
            env[slot] = result
        else:
            target.copy_(result)


def empty_in_order(shape: Sequence[int], order: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised buffer of `shape` whose axes lie in memory in `order`, the outermost
    first (`hir.AllocateOp.memory_order`: a stream axis outermost, so that each slice a
    pipelined loop reads or writes is one block)."""
    # torch.empty rather than torch.empty_permuted: one allocator entry point, which tests
    # poison to show unwritten values.
    laid_out = torch.empty([shape[axis] for axis in order], dtype=dtype, device=device)
    return laid_out.permute([order.index(axis) for axis in range(len(order))])


@handles(hir.DeallocateOp)
def _deallocate(op: hir.DeallocateOp, prep: Preparation) -> Step:
    """Drops the buffer and every view of it from the environment, so its memory is freed."""
    slots = prep.slots_of([op.buffer, *prep.views[op.buffer]])

    def step(env: Environment, context: RunContext) -> None:
        for slot in slots:
            env[slot] = None

    return step


@handles(hir.DimOp)
def _dim(op: hir.DimOp, prep: Preparation) -> Step | None:
    """The logical extent of an axis, on every rank, whether or not it holds the buffer.

    A static extent and a `didx` axis are constants. Otherwise the extent is traced through
    views to the root buffer: an allocation's is the size operand it was made with; an
    input's is its tensor's on ranks in its mesh and the exchanged `input_extents`
    elsewhere; any other buffer's is its tensor's, known in its mesh only.
    """
    extent = hir.type_extent(op.buffer, op.axis.data)
    if extent is not None:
        prep.constant(op.result, extent)
        return None
    axis = op.axis.data
    result = prep.slot(op.result)
    allocated_size = hir.allocated_size(op.buffer, axis)
    if allocated_size is not None:
        size = prep.slot(allocated_size)

        def allocated(env: Environment, context: RunContext) -> None:
            env[result] = env[size]

        return allocated
    root, root_axis = hir.root_axis(op.buffer, axis)
    buffer, mesh = prep.slot(op.buffer), mesh_of(root)
    input_index = root.index if prep.is_input(root) else None

    def step(env: Environment, context: RunContext) -> None:
        if context.rank in mesh:
            env[result] = env[buffer].shape[axis]
        elif (input_index, root_axis) in context.input_extents:
            env[result] = context.input_extents[input_index, root_axis]
        else:
            raise HostirError.at(
                op,
                f"rank {context.rank} is outside the mesh {sorted(mesh)} of the buffer, so "
                f"it does not know the dynamic extent of axis {axis}"
                + (
                    f" (Program.run tells every rank the extents of every input; this run "
                    f"was not given those of input #{input_index})"
                    if input_index is not None
                    else ""
                ),
            )

    return step


@handles(hir.AliasSelectOp)
def _alias_select(op: hir.AliasSelectOp, prep: Preparation) -> Step:
    """A view (`Tensor.select`), never a copy; a placeholder stays a placeholder."""
    buffer, index, result = prep.slots_of((op.input, op.index, op.result))
    axis = op.axis.data
    mesh = mesh_of(op.input)

    def step(env: Environment, context: RunContext) -> None:
        if context.rank in mesh:
            env[result] = env[buffer].select(axis, env[index])
        else:
            env[result] = env[buffer]

    return step


# --------------------------------------------------------------------------- #
# Runtime scalars and streams                                                  #
# --------------------------------------------------------------------------- #


def storing(read: Callable[[RunContext], object]) -> Handler:
    """The handler of an op whose step stores `read(context)` in the op's result."""

    def handler(op: Operation, prep: Preparation) -> Step:
        result = prep.slot(op.results[0])

        def step(env: Environment, context: RunContext) -> None:
            env[result] = read(context)

        return step

    return handler


HANDLERS[hir.DeviceIndexOp] = storing(lambda context: context.rank)
HANDLERS[hir.NumberOfStreamsOp] = storing(lambda context: context.streams.size)
HANDLERS[hir.GetCurrentStreamOp] = storing(lambda context: context.streams.current())


@handles(hir.StreamOp)
def _stream(op: hir.StreamOp, prep: Preparation) -> Step:
    index, result = prep.slots_of((op.index, op.result))

    def step(env: Environment, context: RunContext) -> None:
        env[result] = context.streams.get(env[index])

    return step


@handles(hir.SetCurrentStreamOp)
def _set_current_stream(op: hir.SetCurrentStreamOp, prep: Preparation) -> Step:
    stream = prep.slot(op.stream)

    def step(env: Environment, context: RunContext) -> None:
        context.streams.set_current(env[stream])

    return step


@handles(hir.SynchronizeStreamOp)
def _synchronize_stream(op: hir.SynchronizeStreamOp, prep: Preparation) -> Step:
    stream = prep.slot(op.stream)

    def step(env: Environment, context: RunContext) -> None:
        context.streams.synchronize(env[stream])

    return step

