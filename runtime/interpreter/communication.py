"""The interpreter's handlers of hir's communication ops: collectives, send/recv, coalescing, wait.

Each handler turns an op into a step that issues the communication through the run's
`Communicator` and stores its `Work` handle; `hir.wait` waits for it on the current
stream. A rank outside the mesh of a buffer passes None for it to a collective, and
skips a send or recv of it, as it skips a collective of a team it is not in.

With `backend cuda` the copy engines move the bytes (`runtime/distributed/copy_engine.py`); what
they need of the program is checked while preparing, so that a program that breaks it
fails before it runs: the buffers peers read come from `hir.allocate symmetric` or are
inputs marked `hir.symmetric`, and a
send or recv sits in a batch with the recv or send of the same peer, whose buffer the
recv reads on the peer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from xdsl.ir import Operation, SSAValue

from hostir_dialect import fusion, hir
from hostir_dialect.text import HostirError
from hostir.runtime.distributed.communicator import REDUCE_OPS, Communicator
from hostir.runtime.distributed.work import DONE, Work
from hostir.runtime.interpreter.core import (
    HANDLERS,
    Environment,
    Preparation,
    RunContext,
    Step,
    handles,
    mesh_of,
    storing,
)

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


def copy_engine_transfers(function: Operation) -> list[hir.CommunicationOp | hir.P2POp]:
    """The communications of `function` that the copy engines make (`backend cuda`)."""
    return [op for op in function.walk() if hir.uses_copy_engines(op)]


def _check_symmetric(op: Operation, buffer: SSAValue, role: str) -> None:
    """Refuses a copy-engine op whose peers would read a buffer that is not symmetric."""
    if not hir.is_symmetric(buffer):
        raise HostirError.at(
            op,
            f"{op.name} with backend cuda lets its peers read its {role}, which must therefore be "
            "(a view of) a buffer of 'hir.allocate symmetric' or an input marked 'hir.symmetric'; "
            "fusion-to-hir{backend=cuda} and stream-parallel{p2p_backend=cuda} make it so",
        )


@handles(hir.AllgatherOp)
def _allgather(op: hir.AllgatherOp, prep: Preparation) -> Step:
    axis, team, backend = _didx_axis(op, op.input, "input"), op.team_ids, op.backend.data
    if hir.uses_copy_engines(op):
        _check_symmetric(op, op.input, "input")
    return _collective_step(op, prep, lambda comm, x, y: comm.allgather(x, y, team, axis, backend))


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
    team, reduce_op, backend = op.team_ids, _reduce_op(op), op.backend.data
    if hir.uses_copy_engines(op):
        _check_symmetric(op, op.input, "input")
    return _collective_step(op, prep, lambda comm, x, y: comm.allreduce(x, y, team, reduce_op, backend))


@handles(hir.ReduceOp)
def _reduce(op: hir.ReduceOp, prep: Preparation) -> Step:
    team, root, reduce_op = op.team_ids, op.root.data, _reduce_op(op)
    return _collective_step(op, prep, lambda comm, x, y: comm.reduce(x, y, team, root, reduce_op))


@handles(hir.ReduceScatterOp)
def _reduce_scatter(op: hir.ReduceScatterOp, prep: Preparation) -> Step:
    _didx_axis(op, op.input, "input")
    _didx_axis(op, op.output, "output")
    scattered = op.scattered_axis()
    team, reduce_op, backend = op.team_ids, _reduce_op(op), op.backend.data
    if hir.uses_copy_engines(op):
        _check_symmetric(op, op.input, "input")
    return _collective_step(
        op, prep, lambda comm, x, y: comm.reduce_scatter(x, y, team, reduce_op, scattered, backend)
    )


@handles(hir.BroadcastOp)
def _broadcast(op: hir.BroadcastOp, prep: Preparation) -> Step:
    team, root = op.team_ids, op.root.data
    return _collective_step(op, prep, lambda comm, x, y: comm.broadcast(x, y, team, root))


@handles(hir.SendRecvOp)
def _send_recv(op: hir.SendRecvOp, prep: Preparation) -> Step:
    team, root = op.team_ids, op.root.data
    return _collective_step(op, prep, lambda comm, x, y: comm.send_recv(x, y, team, root))


def _batch(op: hir.P2POp) -> list[Operation]:
    """The ops between the `hir.start_coalescing` and the `hir.end_coalescing` around `op`."""
    around = op.batch()
    if around is None:
        raise HostirError.at(
            op,
            f"{op.name} with backend cuda must sit between hir.start_coalescing and "
            "hir.end_coalescing, with the transfer of the other direction to the same peer",
        )
    start, end = around
    batch, next_op = [], start.next_op
    while next_op is not end:
        batch.append(next_op)
        next_op = next_op.next_op
    return batch


def _partner(op: hir.P2POp, partner_type: type[hir.P2POp]) -> hir.P2POp:
    """The copy-engine transfer of the other direction in `op`'s batch: the one with the
    same peer, or else the only one of the batch.

    The copy engines pull: a recv reads, on the peer, the buffer that this rank sends in
    the same batch (every rank runs the same program, so the peer's send of the pair is
    of that same buffer), and a send lets the peer read it. In a pairwise exchange the
    send of the batch goes to the same peer; in a ring (the point-to-point allgather's
    default order) it goes to another one, whose recv of that batch reads it.
    """
    candidates = [
        other for other in _batch(op) if isinstance(other, partner_type) and hir.uses_copy_engines(other)
    ]
    same_peer = [other for other in candidates if other.peer == op.peer]
    partners = same_peer or candidates
    if len(partners) != 1:
        raise HostirError.at(
            op,
            f"{op.name} with backend cuda pairs with exactly one {partner_type.name} with backend "
            f"cuda of the same peer in its batch, or else with the only one of its batch (the "
            f"copy engines read, on the peer, the buffer this rank sends in the batch); the batch "
            f"has {len(same_peer)} of the same peer and {len(candidates)} in all",
        )
    return partners[0]


def _p2p_step(op: hir.P2POp, prep: Preparation, transfer) -> Step:
    """The step of a send or recv: `transfer(communicator, env)`, skipped outside the buffer's mesh."""
    work = prep.slot(op.work)
    mesh = mesh_of(op.buffer)

    def step(env: Environment, context: RunContext) -> None:
        issued = transfer(context.communicator, env) if context.rank in mesh else DONE
        env[work] = issued
        context.issued.append(issued)

    return step


@handles(hir.SendOp)
def _send(op: hir.SendOp, prep: Preparation) -> Step:
    buffer, peer = prep.slots_of((op.buffer, op.peer))
    backend = op.backend.data
    if hir.uses_copy_engines(op):
        _partner(op, hir.RecvOp)
        _check_symmetric(op, op.buffer, "buffer")
    return _p2p_step(op, prep, lambda comm, env: comm.send(env[buffer], env[peer], backend))


@handles(hir.RecvOp)
def _recv(op: hir.RecvOp, prep: Preparation) -> Step:
    prep.check_writable(op, op.buffer)
    buffer, peer = prep.slots_of((op.buffer, op.peer))
    if not hir.uses_copy_engines(op):
        return _p2p_step(op, prep, lambda comm, env: comm.recv(env[buffer], env[peer]))
    source = prep.slot(_partner(op, hir.SendOp).buffer)
    backend = op.backend.data
    return _p2p_step(op, prep, lambda comm, env: comm.recv(env[buffer], env[peer], backend, env[source]))


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
