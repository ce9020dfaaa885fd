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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, IntegerType
from xdsl.ir import Block, BlockArgument, Operation, OpResult, SSAValue
from xdsl.traits import SymbolTable

from hostir_dialect import fusion, hir
from hostir_dialect.fusion import DYNAMIC, ParallelType
from hostir_dialect.text import HostirError
from runtime import fusion_eval
from runtime.communicator import REDUCE_OPS, Communicator, Work
from runtime.streams import StreamPool

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


Step = Callable[[Environment, RunContext], None]
Handler = Callable[[Operation, "Preparation"], Step | None]
"""Builds the step of an op; None when the op is done while preparing."""

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


def _buffer_root(value: SSAValue) -> SSAValue:
    """The buffer that `value` is a view of (`value` itself unless made by alias_select)."""
    while isinstance(value, OpResult) and isinstance(value.op, hir.AliasSelectOp):
        value = value.op.input
    return value


class Preparation:
    """What preparing one function keeps: slots, constants, views of buffers, return slots."""

    def __init__(self, function: func.FuncOp):
        self.function = function
        self.slots: dict[SSAValue, int] = {}
        self.constants: dict[int, object] = {}
        self.result_slots: list[int] = []
        self.views: dict[SSAValue, list[SSAValue]] = defaultdict(list)
        for op in function.walk():
            if isinstance(op, hir.AliasSelectOp):
                self.views[_buffer_root(op.result)].append(op.result)

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
                step.op = op
                steps.append(step)
        return steps

    def check_writable(self, op: Operation, buffer: SSAValue) -> None:
        """Refuses an op that would write into one of the program's inputs (or a view of one)."""
        root = _buffer_root(buffer)
        if isinstance(root, BlockArgument) and root.owner is self.function.body.block:
            raise HostirError.at(
                op,
                f"writes into input #{root.index} of the host program; inputs are read-only "
                "(the host-program contract allocates every buffer an op writes)",
            )


class Interpreter:
    """A host program (`func.func` of hir, scf, arith ops) prepared to run on any rank."""

    def __init__(self, function: func.FuncOp):
        preparation = Preparation(function)
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


def segment_runner(callee: func.FuncOp) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]:
    """How a segment runs: `run(ins, outs)` evaluates `callee` and writes its results into `outs`.

    The one place a segment is executed, for `hir.launch_kernel` and
    `hir.post_on_stream` alike: a compiled CUDA kernel for launch_kernel plugs in here.
    """
    evaluate = fusion_eval.compile_function(callee)

    def run(ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        for out, result in zip(outs, evaluate(ins), strict=True):
            out.copy_(result)

    return run


def _mesh(value: SSAValue) -> frozenset[int]:
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
    dtype = fusion_eval.torch_dtype(buffer_type.element_type)
    mesh = _mesh(op.result)
    result = prep.slot(op.result)
    # The local shape, its dynamic extents filled in each run from the size operands;
    # a didx axis is 1 whatever its logical size.
    shape = list(buffer_type.local_shape())
    dynamic: list[tuple[int, int]] = []
    sizes = iter(prep.slots_of(op.dynamic_sizes))
    for axis, (extent, parallel_type) in enumerate(
        zip(buffer_type.get_shape(), buffer_type.parallel_types())
    ):
        if extent == DYNAMIC:
            slot = next(sizes)
            if parallel_type != ParallelType.DIDX:
                dynamic.append((axis, slot))

    def step(env: Environment, context: RunContext) -> None:
        if context.rank not in mesh:
            env[result] = torch.empty(0, dtype=dtype, device=context.device)
            return
        local_shape = shape.copy()
        for axis, slot in dynamic:
            local_shape[axis] = env[slot]
        env[result] = torch.empty(local_shape, dtype=dtype, device=context.device)

    return step


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
    buffer_type = fusion.tensor_type(op.buffer)
    axis = op.axis.data
    extent = buffer_type.get_shape()[axis]
    if extent != DYNAMIC:
        prep.constant(op.result, extent)
        return None
    if buffer_type.parallel_types()[axis] == ParallelType.DIDX:
        prep.constant(op.result, buffer_type.mesh.size)
        return None
    buffer, result = prep.slot(op.buffer), prep.slot(op.result)
    mesh = _mesh(op.buffer)

    def step(env: Environment, context: RunContext) -> None:
        if context.rank not in mesh:
            raise HostirError.at(
                op,
                f"rank {context.rank} is outside the mesh {sorted(mesh)} of the buffer, so "
                f"it does not know the dynamic extent of axis {axis}",
            )
        env[result] = env[buffer].shape[axis]

    return step


@handles(hir.AliasSelectOp)
def _alias_select(op: hir.AliasSelectOp, prep: Preparation) -> Step:
    """A view (`Tensor.select`), never a copy; a placeholder stays a placeholder."""
    buffer, index, result = prep.slots_of((op.input, op.index, op.result))
    axis = op.axis.data
    mesh = _mesh(op.input)

    def step(env: Environment, context: RunContext) -> None:
        if context.rank in mesh:
            env[result] = env[buffer].select(axis, env[index])
        else:
            env[result] = env[buffer]

    return step


# --------------------------------------------------------------------------- #
# Runtime scalars and streams                                                  #
# --------------------------------------------------------------------------- #


def _storing(read: Callable[[RunContext], object]) -> Handler:
    """The handler of an op whose step stores `read(context)` in the op's result."""

    def handler(op: Operation, prep: Preparation) -> Step:
        result = prep.slot(op.results[0])

        def step(env: Environment, context: RunContext) -> None:
            env[result] = read(context)

        return step

    return handler


HANDLERS[hir.DeviceIndexOp] = _storing(lambda context: context.rank)
HANDLERS[hir.NumberOfStreamsOp] = _storing(lambda context: context.streams.size)
HANDLERS[hir.GetCurrentStreamOp] = _storing(lambda context: context.streams.current())


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


# --------------------------------------------------------------------------- #
# Communication                                                                #
# --------------------------------------------------------------------------- #


Issue = Callable[[Communicator, torch.Tensor | None, torch.Tensor | None], Work]


def _collective_step(op: hir.CommunicationOp, prep: Preparation, issue: Issue) -> Step:
    """The step of a collective: `issue(communicator, input, output)`, None for a buffer this rank lacks."""
    prep.check_writable(op, op.output)
    input, output, work = prep.slots_of((op.input, op.output, op.work))
    input_mesh, output_mesh = _mesh(op.input), _mesh(op.output)

    def step(env: Environment, context: RunContext) -> None:
        rank = context.rank
        issued = issue(
            context.communicator,
            env[input] if rank in input_mesh else None,
            env[output] if rank in output_mesh else None,
        )
        env[work] = issued
        context.issued.append(issued)

    return step


def _didx_axis(op: Operation, value: SSAValue, role: str) -> int:
    axis = fusion.tensor_type(value).didx_axis
    if axis is None:
        raise HostirError.at(
            op,
            f"{op.name} needs a didx axis on its {role}, but the {role} has "
            f"{fusion.tensor_type(value).sharding_str()}",
        )
    return axis


def _reduce_op(op: hir.CommunicationOp):
    return REDUCE_OPS[op.reduce_op.data]


@handles(hir.AllgatherOp)
def _allgather(op: hir.AllgatherOp, prep: Preparation) -> Step:
    axis, team = _didx_axis(op, op.input, "input"), op.team_ids
    return _collective_step(op, prep, lambda comm, x, y: comm.allgather(x, y, team, axis))


@handles(hir.GatherOp)
def _gather(op: hir.GatherOp, prep: Preparation) -> Step:
    axis, team, root = _didx_axis(op, op.input, "input"), op.team_ids, op.root.data
    return _collective_step(op, prep, lambda comm, x, y: comm.gather(x, y, team, root, axis))


@handles(hir.ScatterOp)
def _scatter(op: hir.ScatterOp, prep: Preparation) -> Step:
    axis, team, root = _didx_axis(op, op.output, "output"), op.team_ids, op.root.data
    return _collective_step(op, prep, lambda comm, x, y: comm.scatter(x, y, team, root, axis))


@handles(hir.AllreduceOp)
def _allreduce(op: hir.AllreduceOp, prep: Preparation) -> Step:
    team, reduce_op = op.team_ids, _reduce_op(op)
    return _collective_step(op, prep, lambda comm, x, y: comm.allreduce(x, y, team, reduce_op))


@handles(hir.ReduceOp)
def _reduce(op: hir.ReduceOp, prep: Preparation) -> Step:
    team, root, reduce_op = op.team_ids, op.root.data, _reduce_op(op)
    return _collective_step(op, prep, lambda comm, x, y: comm.reduce(x, y, team, root, reduce_op))


@handles(hir.ReduceScatterOp)
def _reduce_scatter(op: hir.ReduceScatterOp, prep: Preparation) -> Step:
    """The scattered axis is the output's didx axis, counted in the input's axes."""
    reduced = _didx_axis(op, op.input, "input")
    scattered = _didx_axis(op, op.output, "output")
    if fusion.tensor_type(op.output).rank < fusion.tensor_type(op.input).rank and scattered >= reduced:
        scattered += 1
    team, reduce_op = op.team_ids, _reduce_op(op)
    return _collective_step(
        op, prep, lambda comm, x, y: comm.reduce_scatter(x, y, team, reduce_op, scattered)
    )


@handles(hir.BroadcastOp)
def _broadcast(op: hir.BroadcastOp, prep: Preparation) -> Step:
    team, root = op.team_ids, op.root.data
    return _collective_step(op, prep, lambda comm, x, y: comm.broadcast(x, y, team, root))


@handles(hir.SendRecvOp)
def _send_recv(op: hir.SendRecvOp, prep: Preparation) -> Step:
    team, root = op.team_ids, op.root.data
    return _collective_step(op, prep, lambda comm, x, y: comm.send_recv(x, y, team, root))


P2P_TRANSFERS: dict[type[Operation], Callable[[Communicator, torch.Tensor, int], Work]] = {
    hir.SendOp: Communicator.send,
    hir.RecvOp: Communicator.recv,
}


@handles(*P2P_TRANSFERS)
def _p2p(op: hir.P2POp, prep: Preparation) -> Step:
    if isinstance(op, hir.RecvOp):
        prep.check_writable(op, op.buffer)
    transfer = P2P_TRANSFERS[type(op)]
    buffer, peer, work = prep.slots_of((op.buffer, op.peer, op.work))

    def step(env: Environment, context: RunContext) -> None:
        issued = transfer(context.communicator, env[buffer], env[peer])
        env[work] = issued
        context.issued.append(issued)

    return step


@handles(hir.StartCoalescingOp)
def _start_coalescing(op: hir.StartCoalescingOp, prep: Preparation) -> Step:
    def step(env: Environment, context: RunContext) -> None:
        context.communicator.start_coalescing()

    return step


HANDLERS[hir.EndCoalescingOp] = _storing(lambda context: context.communicator.end_coalescing())


@handles(hir.WaitOp)
def _wait(op: hir.WaitOp, prep: Preparation) -> Step:
    work = prep.slot(op.work)

    def step(env: Environment, context: RunContext) -> None:
        env[work].wait()

    return step


# --------------------------------------------------------------------------- #
# Compute                                                                      #
# --------------------------------------------------------------------------- #


Compute = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


def _compute_step(op: hir.ComputeOp, prep: Preparation, compute: Compute) -> Step:
    """The step of a compute op: `compute(ins, outs)` on ranks in the mesh of its first output."""
    if not op.outs:
        raise HostirError.at(op, f"{op.name} has no output to write")
    for out in op.outs:
        prep.check_writable(op, out)
    ins, outs = prep.slots_of(op.ins), prep.slots_of(op.outs)
    mesh = _mesh(op.outs[0])

    def step(env: Environment, context: RunContext) -> None:
        if context.rank in mesh:
            compute([env[s] for s in ins], [env[s] for s in outs])

    return step


@handles(hir.LaunchKernelOp, hir.PostOnStreamOp)
def _segment(op: hir.SegmentCallOp, prep: Preparation) -> Step:
    callee = SymbolTable.lookup_symbol(op, op.callee)
    if not isinstance(callee, func.FuncOp):
        raise HostirError.at(op, f"'{op.callee.string_value()}' is not a function in this module")
    return _compute_step(op, prep, segment_runner(callee))


@handles(hir.MatmulOp)
def _matmul(op: hir.MatmulOp, prep: Preparation) -> Step:
    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        lhs, rhs = ins
        if lhs.dim() == 1 and rhs.dim() > 1:
            # torch computes a vector-matrix product into `out=` by resizing the output to
            # [1, N], which loses the data of a strided view; a [1, K] matrix keeps the view.
            torch.matmul(lhs.unsqueeze(0), rhs, out=outs[0].unsqueeze(-2))
        else:
            torch.matmul(lhs, rhs, out=outs[0])

    return _compute_step(op, prep, compute)


@handles(hir.LinearOp)
def _linear(op: hir.LinearOp, prep: Preparation) -> Step:
    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        outs[0].copy_(torch.nn.functional.linear(*ins))

    return _compute_step(op, prep, compute)


@handles(hir.CopyOp)
def _copy(op: hir.CopyOp, prep: Preparation) -> Step:
    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        outs[0].copy_(ins[0])

    return _compute_step(op, prep, compute)


POINTWISE_KINDS: dict[str, type[Operation]] = {
    op.name.removeprefix("fusion."): op for op in fusion_eval.POINTWISE_FUNCTIONS
}


@handles(hir.PointwiseOp)
def _pointwise(op: hir.PointwiseOp, prep: Preparation) -> Step:
    """One pointwise op with fusion_eval's precision, rounded once into the output.

    `copy_` rather than torch's `out=`: the f32 result of a bf16 op must be rounded on
    store, which `out=` does not do (and torch.relu has no `out=`). A cast is the copy.
    """
    if op.kind.data == "cast":
        return _copy(op, prep)
    function = fusion_eval.POINTWISE_FUNCTIONS[POINTWISE_KINDS[op.kind.data]]

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        outs[0].copy_(function(*map(fusion_eval.upcast, ins)))

    return _compute_step(op, prep, compute)


REDUCTIONS: dict[str, Callable[..., torch.Tensor]] = {"sum": torch.sum, "max": torch.amax}


@handles(hir.ReductionOp)
def _reduction(op: hir.ReductionOp, prep: Preparation) -> Step:
    reduce = REDUCTIONS[op.kind.data]
    rank = fusion.tensor_type(op.ins[0]).rank
    axes = fusion.normalize_axes(op.axes.get_values(), rank, "reduction")
    keepdim = op.keepdim is not None

    def compute(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        reduce(ins[0], dim=axes, keepdim=keepdim, out=outs[0])

    return _compute_step(op, prep, compute)
