"""Every collective of the hir dialect, on its own, at world sizes 1, 2 and 4 (gloo on CPU).

Each case is a host program of one collective (or two in flight) with the layouts of
docs/design.md: the gathered, reduced and scattered axes come from the types, on the
outermost axis and on inner ones, into contiguous buffers and strided views, with a
reversed team and a sub-team, with a root outside the mesh that holds the shards
(written by hand and lowered from fusions), and with sends and receives that the
ranks outside their buffers' mesh skip. At world size 4 every collective and
point-to-point pattern also runs over teams whose order is neither sorted nor its own
inverse (`TEAMS_IN_ORDER`), through NCCL/gloo and through the copy engines (whose CPU
form sends torch.distributed messages). Every rank runs every case in one spawn; the
parent compares each rank's output with its piece of plain torch on the unsharded data.
Inputs are random, allocations are poisoned with NaN, inputs are checked unchanged.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import pytest
import torch

from hostir_dialect.text import HostirError
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.launch import run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import shard
from test_interpreter import poisoned_allocations, poisoned_frees, tensor


LAUNCH_TIMEOUT_S = 300
"""How long a launch of ranks that run many cases may take before it counts as hung. On the
GPU suite's machine the pytest workers share the cores, and a world-4 launch that makes NCCL
groups for many teams took over 120 s there (one minute alone)."""


def needs_ranks(n: int):
    """With CUDA the ranks use NCCL, one GPU each."""
    return pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.device_count() < n,
        reason=f"needs {n} GPUs when CUDA is present (one per NCCL rank)",
    )


@dataclass
class Case:
    name: str
    program: str
    """A host program `@main`."""
    inputs: list[torch.Tensor]
    """Unsharded inputs."""
    expected: list[torch.Tensor]
    """Unsharded outputs."""
    pipeline: str | None = None
    """What lowers `program` first, if it is a fusion."""


def one_collective(kind: str, input: str, output: str, team, attributes: str = "", backend: str = "nccl") -> str:
    """A host program of one collective; with `backend` cuda (the copy engines) its input is
    first copied into a symmetric buffer, which the peers read."""
    source, symmetric = "%x", ""
    if backend == "cuda":
        source, symmetric = "%symmetric", f"""
      %symmetric = hir.allocate() symmetric : {input}
      hir.copy ins(%x : {input}) outs(%symmetric : {input})"""
    return f"""
    func.func @main(%x: {input}) -> {output} {{{symmetric}
      %y = hir.allocate() : {output}
      %w = hir.{kind} {source} into %y team {list(team)}{attributes} backend {backend} : {input}, {output}
      hir.wait %w
      func.return %y : {output}
    }}"""


def index_per_rank(name: str, values: dict[int, int]) -> tuple[str, str]:
    """Lines that give each rank (`%rank`, its `hir.device_index`) its value of `values`, a
    chain of selects from the first value, which a rank not in `values` keeps; (the lines,
    the name of the value)."""
    items = list(values.items())
    lines = [f"%{name}_0 = arith.constant {items[0][1]} : index"]
    for i, (rank, value) in enumerate(items[1:], start=1):
        lines += [
            f"%{name}_rank_{i} = arith.constant {rank} : index",
            f"%{name}_value_{i} = arith.constant {value} : index",
            f"%{name}_is_{i} = arith.cmpi eq, %rank, %{name}_rank_{i} : index",
            f"%{name}_{i} = arith.select %{name}_is_{i}, %{name}_value_{i}, %{name}_{i - 1} : index",
        ]
    return "\n      ".join(lines), f"%{name}_{len(items) - 1}"


def ring_exchange(team: list[int], backend: str) -> str:
    """Each member of `team` sends a copy of its shard to the next member in team order and
    receives the previous member's, in one coalesced batch: the whole output is the input
    rolled by one along its sharded axis. The copy is a buffer of the program (symmetric with
    `backend` cuda), which nothing uses after the send but the wait of its batch."""
    shard = tensor([len(team), 3], mesh=team, axes="didx _")
    following, next_peer = index_per_rank("next", {d: team[(k + 1) % len(team)] for k, d in enumerate(team)})
    preceding, previous_peer = index_per_rank("previous", {d: team[k - 1] for k, d in enumerate(team)})
    symmetric = " symmetric" if backend == "cuda" else ""
    return f"""
    func.func @main(%x: {shard}) -> {shard} {{
      %rank = hir.device_index
      {following}
      {preceding}
      %sent = hir.allocate(){symmetric} : {shard}
      hir.copy ins(%x : {shard}) outs(%sent : {shard})
      %y = hir.allocate() : {shard}
      hir.start_coalescing
      %r = hir.recv %y from {previous_peer} backend {backend} : {shard}
      %s = hir.send %sent to {next_peer} backend {backend} : {shard}
      %w = hir.end_coalescing
      hir.wait %w
      func.return %y : {shard}
    }}"""


def resharding(op: str, source: str, target: str) -> str:
    """A fusion of one `fusion.set` (or `fusion.sum` over axis 0) from `source` to `target`."""
    reduced = " [0]" if op == "sum" else ""
    return f"""
    func.func @main(%x: {source}) -> {target} {{
      %y = fusion.{op} %x{reduced} : {source} -> {target}
      func.return %y : {target}
    }}"""


def collective_cases(n: int) -> list[Case]:
    """The cases at world size `n`; every rank and the parent build the same ones."""
    generator = torch.Generator().manual_seed(100 + n)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    everyone, last = list(range(n)), n - 1
    reversed_team = everyone[::-1]
    cases = []

    def case(name, program, inputs, expected, pipeline=None):
        cases.append(Case(name, program, inputs, expected, pipeline))

    x = randn(n, 3)
    case("allgather outermost", one_collective(
        "allgather", tensor([n, 3], mesh=everyone, axes="didx _"), tensor([n, 3], mesh=everyone), everyone
    ), [x], [x])
    x = randn(2, n, 3).bfloat16()
    case("allgather inner axis, bf16", one_collective(
        "allgather", tensor([2, n, 3], "bf16", everyone, "_ didx _"), tensor([2, n, 3], "bf16", everyone), everyone
    ), [x], [x])
    x = randn(n, 3)
    buffer = torch.full((n, 2, 3), float("nan"))
    buffer[:, 1] = x
    sharded, view, whole = (
        tensor([n, 3], mesh=everyone, axes="didx _"), tensor([n, 3], mesh=everyone), tensor([n, 2, 3], mesh=everyone)
    )
    case("allgather into a strided view", f"""
    func.func @main(%x: {sharded}) -> {whole} {{
      %c1 = arith.constant 1 : index
      %b = hir.allocate() : {whole}
      %y = hir.alias_select %b[1 = %c1] : {whole} -> {view}
      %w = hir.allgather %x into %y team {everyone} backend nccl : {sharded}, {view}
      hir.wait %w
      func.return %b : {whole}
    }}""", [x], [buffer])
    x = randn(n, 3)
    case("allgather with a reversed team", one_collective(
        "allgather", tensor([n, 3], mesh=reversed_team, axes="didx _"), tensor([n, 3], mesh=reversed_team),
        reversed_team,
    ), [x], [x])
    x = randn(n, n, 2)
    case("reduce_scatter with a reversed team", one_collective(
        "reduce_scatter", tensor([n, n, 2], mesh=reversed_team, axes="didx _ _"),
        tensor([n, 2], mesh=reversed_team, axes="didx _"), reversed_team, " op sum",
    ), [x], [x.sum(0)])
    x = randn(3, n)
    case("scatter with a reversed team", one_collective(
        "scatter", tensor([3, n], mesh=[0]), tensor([3, n], mesh=reversed_team, axes="_ didx"), reversed_team,
        " root 0",
    ), [x], [x])
    x = randn(3, n)
    case("gather with a reversed team", one_collective(
        "gather", tensor([3, n], mesh=reversed_team, axes="_ didx"), tensor([3, n], mesh=[0]), reversed_team,
        " root 0",
    ), [x], [x])
    x = randn(3, n)
    case("gather on an inner axis to the last rank", one_collective(
        "gather", tensor([3, n], mesh=everyone, axes="_ didx"), tensor([3, n], mesh=[last]), everyone,
        f" root {last}",
    ), [x], [x])
    x = randn(3, n)
    case("scatter on an inner axis from rank 0", one_collective(
        "scatter", tensor([3, n], mesh=[0]), tensor([3, n], mesh=everyone, axes="_ didx"), everyone, " root 0"
    ), [x], [x])
    x = randn(n, 4)
    case("allreduce sum", one_collective(
        "allreduce", tensor([n, 4], mesh=everyone, axes="didx _"), tensor([4], mesh=everyone), everyone, " op sum"
    ), [x], [x.sum(0)])
    x = randn(4, n)
    case("allreduce max keeping the reduced axis", one_collective(
        "allreduce", tensor([4, n], mesh=everyone, axes="_ didx"), tensor([4, 1], mesh=everyone), everyone, " op max"
    ), [x], [x.amax(1, keepdim=True)])
    x = torch.randint(-100, 100, (n, 5), generator=generator)
    case("allreduce min, i64", one_collective(
        "allreduce", tensor([n, 5], "i64", everyone, "didx _"), tensor([5], "i64", everyone), everyone, " op min"
    ), [x], [x.amin(0)])
    x = torch.rand(n, 3, generator=generator) + 0.5
    case("allreduce product", one_collective(
        "allreduce", tensor([n, 3], mesh=everyone, axes="didx _"), tensor([3], mesh=everyone), everyone,
        " op product",
    ), [x], [x.prod(0)])
    x = randn(n, 4)
    case("reduce sum to the last rank", one_collective(
        "reduce", tensor([n, 4], mesh=everyone, axes="didx _"), tensor([4], mesh=[last]), everyone,
        f" root {last} op sum",
    ), [x], [x.sum(0)])
    x = randn(n, n, 2)
    case("reduce_scatter sum", one_collective(
        "reduce_scatter", tensor([n, n, 2], mesh=everyone, axes="didx _ _"), tensor([n, 2], mesh=everyone, axes="didx _"),
        everyone, " op sum",
    ), [x], [x.sum(0)])
    x = randn(n, n, 3)
    case("reduce_scatter max, reduced axis inner", one_collective(
        "reduce_scatter", tensor([n, n, 3], mesh=everyone, axes="_ didx _"), tensor([n, 3], mesh=everyone, axes="didx _"),
        everyone, " op max",
    ), [x], [x.amax(1)])
    x = randn(4, 2)
    case("broadcast from the last rank", one_collective(
        "broadcast", tensor([4, 2], mesh=[last]), tensor([4, 2], mesh=everyone), everyone, f" root {last}"
    ), [x], [x])
    x = randn(n, 4)
    sharded, summed, gathered = (
        tensor([n, 4], mesh=everyone, axes="didx _"), tensor([4], mesh=everyone), tensor([n, 4], mesh=everyone)
    )
    case("two collectives in flight, waited in reverse order", f"""
    func.func @main(%x: {sharded}) -> ({summed}, {gathered}) {{
      %s = hir.allocate() : {summed}
      %g = hir.allocate() : {gathered}
      %w1 = hir.allreduce %x into %s team {everyone} op sum backend nccl : {sharded}, {summed}
      %w2 = hir.allgather %x into %g team {everyone} backend nccl : {sharded}, {gathered}
      hir.wait %w2
      hir.wait %w1
      func.return %s, %g : {summed}, {gathered}
    }}""", [x], [x.sum(0), x])
    if n >= 2:
        x = randn(5)
        case("send_recv from rank 0 to the last", one_collective(
            "send_recv", tensor([5], mesh=[0]), tensor([5], mesh=[last]), [0, last], " root 0"
        ), [x], [x])
        x = randn(2, 3)
        case("send_recv from the last rank to rank 0", one_collective(
            "send_recv", tensor([2, 3], mesh=[last]), tensor([2, 3], mesh=[0]), [last, 0], f" root {last}"
        ), [x], [x])
    if n >= 2:
        x = randn(n, 3)
        case("a coalesced send's buffer, freed after the wait of its batch", ring_exchange(everyone, "nccl"),
             [x], [x.roll(1, 0)], "insert-deallocations")
        # A root outside the mesh that holds the shards is the team's last member (the
        # team rule of docs/design.md): it holds no shard of a gather or a scatter, and
        # adds nothing to a reduce.
        shards, root = everyone[:-1], last
        team = [*shards, root]
        x = randn(3, n - 1)
        case("gather to a root outside the mesh", one_collective(
            "gather", tensor([3, n - 1], mesh=shards, axes="_ didx"), tensor([3, n - 1], mesh=[root]), team,
            f" root {root}",
        ), [x], [x])
        x = randn(n - 1, 4)
        case("scatter from a root outside the mesh", one_collective(
            "scatter", tensor([n - 1, 4], mesh=[root]), tensor([n - 1, 4], mesh=shards, axes="didx _"), team,
            f" root {root}",
        ), [x], [x])
        x = randn(n - 1, 4)
        case("reduce sum to a root outside the mesh", one_collective(
            "reduce", tensor([n - 1, 4], mesh=shards, axes="didx _"), tensor([4], mesh=[root]), team,
            f" root {root} op sum",
        ), [x], [x.sum(0)])
        x = -randn(n - 1, 3).abs() - 1
        case("reduce max of negatives to a root outside the mesh", one_collective(
            "reduce", tensor([n - 1, 3], mesh=shards, axes="didx _"), tensor([3], mesh=[root]), team,
            f" root {root} op max",
        ), [x], [x.amax(0)])
        x = torch.rand(n - 1, 3, generator=generator) + 0.5
        case("reduce product to a root outside the mesh", one_collective(
            "reduce", tensor([n - 1, 3], mesh=shards, axes="didx _"), tensor([3], mesh=[root]), team,
            f" root {root} op product",
        ), [x], [x.prod(0)])
        x = torch.randint(1, 100, (n - 1, 5), generator=generator)
        case("reduce min of i64 to a root outside the mesh", one_collective(
            "reduce", tensor([n - 1, 5], "i64", shards, "didx _"), tensor([5], "i64", [root]), team,
            f" root {root} op min",
        ), [x], [x.amin(0)])
        pair = [0, 1]
        slot, sent = tensor([2, 3], mesh=pair), tensor([2, 3], mesh=pair, axes="didx _")
        x = randn(2, 3)
        case("send and recv skipped outside the buffers' mesh", f"""
    func.func @main(%x: {sent}) -> {slot} {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %rank = hir.device_index
      %peer = arith.subi %c1, %rank : index
      %y = hir.allocate() : {slot}
      %mine = hir.alias_select %y[0 = %rank] : {slot} -> {tensor([3], mesh=pair)}
      %theirs = hir.alias_select %y[0 = %peer] : {slot} -> {tensor([3], mesh=pair)}
      %own = hir.alias_select %x[0 = %c0] : {sent} -> {tensor([3], mesh=pair)}
      hir.copy ins(%own : {tensor([3], mesh=pair)}) outs(%mine : {tensor([3], mesh=pair)})
      hir.start_coalescing
      %r = hir.recv %theirs from %peer backend nccl : {tensor([3], mesh=pair)}
      %s = hir.send %x to %peer backend nccl : {sent}
      %w = hir.end_coalescing
      hir.wait %w
      func.return %y : {slot}
    }}""", [x], [x])
    if n >= 4:
        # The same through fusion-to-hir, whose teams put the root last.
        x = randn(3, 2)
        case("fusion: gather from [0, 1] onto device 2", resharding(
            "set", tensor([3, 2], mesh=[0, 1], axes="_ didx"), tensor([3, 2], mesh=[2])
        ), [x], [x], "hir-lowering")
        x = randn(2, 4)
        case("fusion: sum over [0, 1] onto device 3", resharding(
            "sum", tensor([2, 4], mesh=[0, 1], axes="didx _"), tensor([4], mesh=[3])
        ), [x], [x.sum(0)], "hir-lowering")
        x = randn(2, 4)
        case("fusion: scatter from device 3 over [0, 1]", resharding(
            "set", tensor([2, 4], mesh=[3]), tensor([2, 4], mesh=[0, 1], axes="didx _")
        ), [x], [x], "hir-lowering")
        x = randn(3, 2)
        case("gather from a sub-mesh to a root outside it and its team", one_collective(
            "gather", tensor([3, 2], mesh=[0, 1], axes="_ didx"), tensor([3, 2], mesh=[3]), [0, 1, 3], " root 3"
        ), [x], [x])
        x = randn(2, 3)
        case("allgather in a sub-team", one_collective(
            "allgather", tensor([2, 3], mesh=[1, 3], axes="didx _"), tensor([2, 3], mesh=[1, 3]), [1, 3]
        ), [x], [x])
        x = randn(2, 5)
        case("allreduce in another sub-team", one_collective(
            "allreduce", tensor([2, 5], mesh=[2, 0], axes="didx _"), tensor([5], mesh=[2, 0]), [2, 0], " op sum"
        ), [x], [x.sum(0)])
        for team in TEAMS_IN_ORDER:
            cases += team_order_cases(team, n, randn)
    return cases


TEAMS_IN_ORDER = ([1, 2, 3, 0], [2, 0, 3, 1], [1, 2, 0])
"""Teams of a world of 4 whose order is neither sorted nor its own inverse: rotated, shuffled,
and a sub-team. Shard k of a team's axis lies on its k-th device, while torch.distributed
orders a group's ranks sorted; the permutation between the two, applied the wrong way round,
is the identity for a sorted team and the same permutation for a reversed one, so only such
teams tell the two apart."""


def team_order_cases(team: list[int], world: int, randn) -> list[Case]:
    """Every collective and point-to-point pattern over `team`, its buffers' meshes listed in
    team order: through NCCL/gloo, and through the copy engines where they have a form
    (allgather, allreduce, reduce_scatter, a batch of sends and recvs). A sub-team also
    gathers to, scatters from and reduces to the device outside it."""
    m, cases = len(team), []

    def case(what, program, inputs, expected):
        cases.append(Case(f"{what}, team {team}", program, inputs, expected))

    def sharded(shape, axes):
        return tensor(shape, mesh=team, axes=axes)

    for backend in ("nccl", "cuda"):
        x = randn(m, 3)
        case(f"allgather ({backend})", one_collective(
            "allgather", sharded([m, 3], "didx _"), tensor([m, 3], mesh=team), team, backend=backend
        ), [x], [x])
        x = randn(2, m, 3)
        case(f"allgather inner axis ({backend})", one_collective(
            "allgather", sharded([2, m, 3], "_ didx _"), tensor([2, m, 3], mesh=team), team, backend=backend
        ), [x], [x])
        x = randn(m, 5)
        case(f"allreduce sum ({backend})", one_collective(
            "allreduce", sharded([m, 5], "didx _"), tensor([5], mesh=team), team, " op sum", backend
        ), [x], [x.sum(0)])
        x = randn(m, m, 2)
        case(f"reduce_scatter sum ({backend})", one_collective(
            "reduce_scatter", sharded([m, m, 2], "didx _ _"), sharded([m, 2], "didx _"), team, " op sum", backend
        ), [x], [x.sum(0)])
        x = randn(m, 2, m)
        case(f"reduce_scatter max, scattered axis inner ({backend})", one_collective(
            "reduce_scatter", sharded([m, 2, m], "didx _ _"), sharded([2, m], "_ didx"), team, " op max", backend
        ), [x], [x.amax(0)])
        x = randn(m, 3)
        case(f"ring of sends and recvs in team order ({backend})", ring_exchange(team, backend), [x], [x.roll(1, 0)])
    x = randn(3, m)
    case("gather to the second member", one_collective(
        "gather", sharded([3, m], "_ didx"), tensor([3, m], mesh=[team[1]]), team, f" root {team[1]}"
    ), [x], [x])
    x = randn(m, 4)
    case("scatter from the last member", one_collective(
        "scatter", tensor([m, 4], mesh=[team[-1]]), sharded([m, 4], "didx _"), team, f" root {team[-1]}"
    ), [x], [x])
    x = randn(m, 4)
    case("reduce sum to the third member", one_collective(
        "reduce", sharded([m, 4], "didx _"), tensor([4], mesh=[team[2]]), team, f" root {team[2]} op sum"
    ), [x], [x.sum(0)])
    x = randn(4, 2)
    case("broadcast from the second member", one_collective(
        "broadcast", tensor([4, 2], mesh=[team[1]]), tensor([4, 2], mesh=team), team, f" root {team[1]}"
    ), [x], [x])
    x = randn(5)
    case("send_recv from the last member to the first", one_collective(
        "send_recv", tensor([5], mesh=[team[-1]]), tensor([5], mesh=[team[0]]), [team[-1], team[0]], f" root {team[-1]}"
    ), [x], [x])
    for outsider in sorted(set(range(world)) - set(team)):
        with_root = [*team, outsider]
        x = randn(3, m)
        case(f"gather to device {outsider} outside", one_collective(
            "gather", sharded([3, m], "_ didx"), tensor([3, m], mesh=[outsider]), with_root, f" root {outsider}"
        ), [x], [x])
        x = randn(m, 4)
        case(f"scatter from device {outsider} outside", one_collective(
            "scatter", tensor([m, 4], mesh=[outsider]), sharded([m, 4], "didx _"), with_root, f" root {outsider}"
        ), [x], [x])
        x = randn(m, 4)
        case(f"reduce sum to device {outsider} outside", one_collective(
            "reduce", sharded([m, 4], "didx _"), tensor([4], mesh=[outsider]), with_root, f" root {outsider} op sum"
        ), [x], [x.sum(0)])
    return cases


def run_collective_cases(n: int) -> list[list[torch.Tensor]]:
    """One rank: runs every case on its pieces of the inputs; returns its outputs per case.
    What a program frees is overwritten (`poisoned_frees`), so a buffer freed before a
    communication is done with it shows in the peer's output."""
    communicator = Communicator.from_env()
    results = []
    for case in collective_cases(n):
        with poisoned_frees():
            program = Program.compile(case.program, pipeline=case.pipeline)
        inputs = [
            shard(full, type, communicator.rank).to(communicator.device)
            for full, type in zip(case.inputs, program.input_types)
        ]
        originals = [x.clone() for x in inputs]
        with poisoned_allocations():
            outputs = program.run(inputs, communicator)
        for x, original in zip(inputs, originals):
            assert torch.equal(x, original), f"{case.name}: an input changed"
        results.append([out.cpu() for out in outputs])
    for team in program.teams:
        assert communicator.group(team) is communicator.group(list(team))
    return results


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=needs_ranks(2)), pytest.param(4, marks=needs_ranks(4))])
def test_every_collective_matches_plain_torch(n):
    results = run_on_local_ranks(run_collective_cases, n, n, timeout_s=LAUNCH_TIMEOUT_S)
    for i, case in enumerate(collective_cases(n)):
        output_types = Program.compile(case.program, pipeline=case.pipeline).output_types
        for rank in range(n):
            for output, full, type in zip(results[rank][i], case.expected, output_types):
                torch.testing.assert_close(
                    output, shard(full, type, rank), equal_nan=True, msg=lambda m: f"{case.name}, rank {rank}: {m}"
                )


def test_single_communicator_copies_locally():
    communicator = Communicator.single(torch.device("cpu"))
    assert (communicator.rank, communicator.world_size, communicator.backend) == (0, 1, "gloo")
    assert communicator.where == "cpu, no process group"
    x = torch.randn(1, 3)
    y = torch.empty(3)
    communicator.allreduce(x, y, [0], None).wait()
    assert torch.equal(y, x[0])
    assert communicator.allgather(x, torch.empty(1, 3), [1], 0).works == []  # not a member


def test_more_local_ranks_than_gpus_fail_on_every_rank_before_joining(monkeypatch):
    """Each rank of a machine with too few GPUs says so, the ranks that have one included
    (which would otherwise wait in NCCL's rendezvous for the others)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(Communicator, "_from_env", None)
    environment = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    for name, value in {**environment, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(HostirError, match=r"2 ranks on this machine need 2 GPUs .* it has 1: .*CUDA_VISIBLE_DEVICES="):
        Communicator.from_env()
    assert not torch.distributed.is_initialized()


def pass_rank_to_the_next(inboxes: list) -> tuple[int, bool, int]:
    """This rank's number into the next rank's inbox: (this rank, whether it is in a process
    group, the number it received)."""
    rank = int(os.environ["RANK"])
    inboxes[(rank + 1) % len(inboxes)].put(rank)
    return rank, torch.distributed.is_initialized(), inboxes[rank].get(timeout=30)


def test_ranks_launched_without_a_group_talk_through_their_arguments():
    """`run_on_local_ranks(..., join_group=False)`: each rank has torchrun's variables but no
    process group, and no GPU of its own to ask for (three ranks here, whatever the GPUs);
    its peers are reached through what the arguments carry."""
    context = torch.multiprocessing.get_context("spawn")
    inboxes = [context.Queue() for _ in range(3)]
    results = run_on_local_ranks(pass_rank_to_the_next, 3, inboxes, join_group=False)
    assert results == [(0, False, 2), (1, False, 0), (2, False, 1)]


def join_late_then_wait_alone(joining, late_s: float, timeout_s: float) -> tuple[float, str] | None:
    """Rank 1 joins `late_s` after rank 0 has begun to join (the event `joining`), then leaves
    rank 0 alone in a collective: on rank 0, the seconds that joining took, and the error of
    that collective."""
    rank = int(os.environ["RANK"])
    if rank == 1:
        assert joining.wait(timeout=60), "rank 0 never began to join"
        time.sleep(late_s)
    else:
        joining.set()
    start = time.monotonic()
    Communicator.from_env(timeout_s=timeout_s)
    torch.distributed.barrier()
    joined = time.monotonic() - start
    if rank == 1:
        time.sleep(late_s + timeout_s)  # keeps its connections open while rank 0 waits
        return None
    with pytest.raises(RuntimeError) as failed:
        torch.distributed.all_reduce(torch.zeros(1))
    return joined, str(failed.value)


def test_joining_waits_for_a_late_rank_longer_than_a_communication_does(monkeypatch):
    """A rank that starts late on a loaded machine is no failed communication: joining waits
    for it past the 1 s timeout, which then bounds the collectives. Rank 1 starts its delay
    once rank 0 is joining, so a loaded machine can only lengthen rank 0's wait; the timeout
    that fires is read from gloo's message, not from the clock."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    joining = torch.multiprocessing.get_context("spawn").Event()
    (joined, error), _ = run_on_local_ranks(join_late_then_wait_alone, 2, joining, 2.0, 1.0, join_group=False)
    assert joined >= 2.0, f"rank 0 joined after {joined:.2f} s, before rank 1 did"
    assert re.search(r"Timed out waiting 1000ms", error), error
