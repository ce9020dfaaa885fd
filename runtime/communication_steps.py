"""The interpreter's handlers of hir's communication ops: collectives, send/recv, coalescing, wait.

Each handler turns an op into a step that issues the communication through the run's
`Communicator` and stores its `Work` handle; `hir.wait` waits for it on the current
stream. A rank outside the mesh of a buffer passes None for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from xdsl.ir import Operation, SSAValue

from hostir_dialect import fusion, hir
from hostir_dialect.text import HostirError
from runtime.communicator import REDUCE_OPS, Communicator, Work
from runtime.interpreter import HANDLERS, Environment, Preparation, RunContext, Step, handles, mesh_of, storing



Issue = Callable[[Communicator, torch.Tensor | None, torch.Tensor | None], Work]


def _collective_step(op: hir.CommunicationOp, prep: Preparation, issue: Issue) -> Step:
    """The step of a collective: `issue(communicator, input, output)`, None for a buffer this rank lacks."""
    prep.check_writable(op, op.output)
    input, output, work = prep.slots_of((op.input, op.output, op.work))
    input_mesh, output_mesh = mesh_of(op.input), mesh_of(op.output)

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


HANDLERS[hir.EndCoalescingOp] = storing(lambda context: context.communicator.end_coalescing())


@handles(hir.WaitOp)
def _wait(op: hir.WaitOp, prep: Preparation) -> Step:
    work = prep.slot(op.work)

    def step(env: Environment, context: RunContext) -> None:
        env[work].wait()

    return step

