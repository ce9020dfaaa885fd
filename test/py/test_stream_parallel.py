"""stream-parallel: the axis maps it slices by, and the loops it builds for the reference fusions.

The axis maps are checked against torch itself: slicing every operand of an op along
the axis that its map gives for an output axis (at index 0 on an extent-1 axis) and
computing the op gives that slice of the whole output, which is the rewrite
stream-parallel makes. The pass runs on the reference fusions built with the Python
builder (after insert-reshardings and fusion-to-hir); the tests check the loops and
what they hold, the options, idempotence, and that the pipelined programs compute
what plain torch computes on the unsharded random inputs, every allocation poisoned.
The point-to-point allgather's ring is checked from its IR (the slot and the peers of
every device and iteration: every link busy, every send met by a recv in the same
iteration, merged work on the slot), with the loops it merges and refuses to merge,
and run in both orders on CPU ranks.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block

from examples.reference_fusions import REFERENCE_FUSIONS
from hostir_dialect import hir, hostir_context
from hostir_dialect.builder import FusionBuilder
from hostir_dialect.text import HostirError, print_module, verify_module
from hostir.passes.analysis import axis_mapping
from hostir.passes.analysis.axis_mapping import operand_axis
from hostir.passes.fusion.insert_reshardings import InsertReshardings
from hostir.passes.lowering.fusion_to_hir import FusionToHir
from hostir.passes.lowering.stream_parallel import StreamParallelLowering
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.launch import run_on_local_ranks
from hostir.runtime.program import Program
from hostir.runtime.reference import shard
from test_communicator import LAUNCH_TIMEOUT_S, needs_ranks
from test_interpreter import poisoned_allocations

# --------------------------------------------------------------------------- #
# Axis maps                                                                    #
# --------------------------------------------------------------------------- #


def _same_op(op):
    """An op that reads slices the way it reads whole tensors (its parameters name no axis)."""
    return lambda output_axis: op


def _sum(rank: int, axes: list[int], keepdim: bool):
    """torch.sum over `axes`; for the slices along an output axis, over the axes renumbered."""
    kept = [axis for axis in range(rank) if keepdim or axis not in axes]

    def op_for(output_axis: int | None):
        if output_axis is None:
            return lambda x: x.sum(dim=axes, keepdim=keepdim)
        removed = kept[output_axis]
        return lambda x: x.sum(dim=[a - (a > removed) for a in axes], keepdim=keepdim)

    return op_for


def _unsqueeze(rank: int, new_axes: list[int]):
    """Inserts extent-1 axes at `new_axes` of the result; for slices, at the positions renumbered."""

    def op_for(output_axis: int | None):
        positions = sorted(new_axes)
        if output_axis is not None:
            positions = [a - (a > output_axis) for a in positions if a != output_axis]

        def insert(x: torch.Tensor) -> torch.Tensor:
            for axis in positions:
                x = x.unsqueeze(axis)
            return x

        return insert

    return op_for


def _pointwise(*ranks: int) -> list[axis_mapping.AxisMap]:
    return [axis_mapping.right_aligned(rank, max(ranks)) for rank in ranks]


def refused_by_pass(case: str, shapes, maps, output_axis: int) -> bool:
    """Whether stream-parallel refuses a stream axis there: a matmul axis whose slices
    torch.matmul misreads, or a reduced axis kept with extent 1 (no input slice feeds it)."""
    if case.startswith("matmul"):
        return (
            axis_mapping.matmul_slice_problem(len(shapes[0]), len(shapes[1]), output_axis)
            is not None
        )
    if case.startswith("sum"):
        return operand_axis(maps[0], output_axis) is None
    return False


AXIS_MAP_CASES = {
    "matmul [M, K] @ [K, N]": ([(3, 4), (4, 5)], axis_mapping.matmul, _same_op(torch.matmul)),
    "matmul [K] @ [K, N]": ([(4,), (4, 5)], axis_mapping.matmul, _same_op(torch.matmul)),
    "matmul [M, K] @ [K]": ([(3, 4), (4,)], axis_mapping.matmul, _same_op(torch.matmul)),
    "matmul [B, M, K] @ [K, N]": ([(2, 3, 4), (4, 5)], axis_mapping.matmul, _same_op(torch.matmul)),
    "matmul [M, K] @ [B, K, N]": ([(3, 4), (2, 4, 5)], axis_mapping.matmul, _same_op(torch.matmul)),
    "matmul broadcast batch": (
        [(2, 1, 3, 4), (5, 4, 6)],
        axis_mapping.matmul,
        _same_op(torch.matmul),
    ),
    "matmul_AR-like": ([(2, 3, 4, 5), (3, 5, 6)], axis_mapping.matmul, _same_op(torch.matmul)),
    "matmul_RS-like": (
        [(2, 3, 3, 4, 5), (1, 3, 1, 5, 6)],
        axis_mapping.matmul,
        _same_op(torch.matmul),
    ),
    "linear with bias": (
        [(2, 3, 4), (5, 4), (5,)],
        axis_mapping.linear,
        _same_op(torch.nn.functional.linear),
    ),
    "linear without bias": (
        [(2, 3, 4), (5, 4)],
        lambda x, w: axis_mapping.linear(x, w, None),
        _same_op(torch.nn.functional.linear),
    ),
    "linear with a vector weight": (
        [(2, 3, 4), (4,)],
        lambda x, w: axis_mapping.linear(x, w, None),
        _same_op(torch.nn.functional.linear),
    ),
    "sum [1]": (
        [(2, 3, 4)],
        lambda r: [axis_mapping.reduction(r, [1], False)],
        _sum(3, [1], False),
    ),
    "sum [0, 2] keepdim": (
        [(2, 3, 4)],
        lambda r: [axis_mapping.reduction(r, [0, 2], True)],
        _sum(3, [0, 2], True),
    ),
    "broadcast [0, 2]": (
        [(3, 4, 5)],
        lambda r: [axis_mapping.broadcast(r, [0, 2])],
        _unsqueeze(3, [0, 2]),
    ),
    "add with broadcasting": ([(2, 3, 4), (3, 1)], _pointwise, _same_op(torch.add)),
    "add of a leading extent-1 axis": ([(1, 4), (3, 4)], _pointwise, _same_op(torch.add)),
}


def sliced_operand(x: torch.Tensor, axis_map, output_axis: int, index: int) -> torch.Tensor:
    """What stream-parallel feeds an op in iteration `index` of a loop over `output_axis`."""
    source = operand_axis(axis_map, output_axis)
    if source is None:
        return x
    return x.select(source, 0 if x.shape[source] == 1 else index)


def slices_match(op_for, operands, maps, output_axis) -> bool:
    """Whether the op of the slices along `output_axis` is each slice of the whole op."""
    output = op_for(None)(*operands)
    for index in range(output.shape[output_axis]):
        sliced = [sliced_operand(x, m, output_axis, index) for x, m in zip(operands, maps)]
        try:
            result = op_for(output_axis)(*sliced)
        except RuntimeError:
            return False
        expected = output.select(output_axis, index)
        if result.shape != expected.shape or not torch.allclose(result, expected):
            return False
    return True


@pytest.mark.parametrize("case", AXIS_MAP_CASES)
def test_slicing_the_operands_by_their_axis_maps_slices_the_output(case):
    """Every output axis slices right, except those that stream-parallel refuses, which indeed do not."""
    shapes, maps_of, op_for = AXIS_MAP_CASES[case]
    generator = torch.Generator().manual_seed(len(case))
    operands = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]
    maps = maps_of(*(len(shape) for shape in shapes))
    output = op_for(None)(*operands)
    assert [len(axis_map) for axis_map in maps] == [len(shape) for shape in shapes]
    assert all(
        0 <= axis < output.dim() for axis_map in maps for axis in axis_map if axis is not None
    )
    for output_axis in range(output.dim()):
        refused = refused_by_pass(case, shapes, maps, output_axis)
        assert slices_match(op_for, operands, maps, output_axis) != refused, output_axis


# --------------------------------------------------------------------------- #
# The pass on the reference fusions                                            #
# --------------------------------------------------------------------------- #


def host_program(name: str, **arguments) -> ModuleOp:
    """The reference fusion `name` after insert-reshardings and fusion-to-hir."""
    module = REFERENCE_FUSIONS[name](**arguments)
    context = hostir_context()
    InsertReshardings().apply(context, module)
    FusionToHir().apply(context, module)
    return module


def stream_parallel(module: ModuleOp, **options) -> ModuleOp:
    StreamParallelLowering(**options).apply(hostir_context(), module)
    verify_module(module)
    return module


def host(module: ModuleOp) -> func.FuncOp:
    (function,) = [
        op for op in module.ops if isinstance(op, func.FuncOp) and op.sym_visibility is None
    ]
    return function


SIZE_OPS = {
    "arith.constant",
    "arith.maxui",
    "hir.dim",
    "hir.get_current_stream",
    "hir.number_of_streams",
    "hir.device_index",
}
"""Ops that only compute extents and runtime values; the outlines leave them out."""


def outline(block: Block) -> list:
    """The block's ops by name, an op with regions as (name, [outline of each block])."""
    return [
        (
            (op.name, [outline(b) for region in op.regions for b in region.blocks])
            if op.regions
            else op.name
        )
        for op in block.ops
        if op.name not in SIZE_OPS
    ]


STREAM = ["arith.remui", "hir.stream", "hir.set_current_stream"]
SYNC_LOOP = ("scf.for", [[*STREAM, "hir.synchronize_stream", "scf.yield"]])
BACK_TO_CALLER = ["hir.set_current_stream", "hir.synchronize_stream", "scf.yield"]


@dataclass(frozen=True)
class Loop:
    """The expected outline of one stream-parallel loop: its work ops."""

    work: tuple


def loop(*work: object) -> Loop:
    return Loop(work)


def expand(expected: list, separate_sync_loop: bool) -> list:
    """The outline with each Loop written out: a synchronisation loop then the work loop,
    or the work loop alone that waits for the caller's stream first."""
    items = []
    for item in expected:
        if not isinstance(item, Loop):
            items.append(item)
        elif separate_sync_loop:
            items += [SYNC_LOOP, ("scf.for", [[*STREAM, *item.work, *BACK_TO_CALLER]])]
        else:
            items.append(
                ("scf.for", [[*STREAM, "hir.synchronize_stream", *item.work, *BACK_TO_CALLER]])
            )
    return [*items, "func.return"]


SLICE = "hir.alias_select"
ALLOC = "hir.allocate"
EXCHANGE = [
    "hir.start_coalescing",
    "hir.recv",
    "hir.send",
    "hir.end_coalescing",
    "hir.wait",
    "scf.yield",
]
OWN_COPY = [SLICE, "hir.copy", "scf.yield"]
P2P = (
    "arith.addi",  # position + i
    "arith.remui",  # the slot, mod D
    SLICE,
    "arith.cmpi",  # i == 0
    ("scf.if", [OWN_COPY, ["arith.subi", "arith.remui", *EXCHANGE]]),  # send peer (p + D - i) mod D
)
"""The ring point-to-point allgather in its loop (on a mesh that starts at device 0)."""
RING_SETUP = "arith.addi"
"""position + D, before the loops of a ring."""
P2P_DEVICE_ORDER = (SLICE, "arith.cmpi", ("scf.if", [OWN_COPY, EXCHANGE]))
"""pr4515's point-to-point allgather in its loop."""

EXPECTED_OUTLINES = {
    ("single_set", 0): [ALLOC, loop(SLICE, SLICE, "hir.copy")],
    ("single_set", 1): [ALLOC, loop(SLICE, SLICE, "hir.copy")],
    ("two_sets",): [ALLOC, ALLOC, loop(SLICE, SLICE, "hir.copy", SLICE, "hir.copy")],
    ("three_sets",): [
        ALLOC,
        loop(SLICE, SLICE, "hir.copy"),
        ALLOC,
        "hir.copy",
        ALLOC,
        loop(SLICE, SLICE, "hir.copy"),
    ],
    ("reduction",): [ALLOC, loop(SLICE, SLICE, "hir.reduction")],
    ("single_binary",): [ALLOC, loop(SLICE, SLICE, SLICE, "hir.launch_kernel")],
    ("matmul", 0): [ALLOC, loop(SLICE, SLICE, "hir.matmul")],
    ("matmul", 1): [ALLOC, loop(SLICE, SLICE, "hir.matmul")],
    ("linear",): [ALLOC, loop(SLICE, SLICE, "hir.linear")],
    ("ag_linear",): [
        ALLOC,
        ALLOC,
        loop(SLICE, SLICE, "hir.allgather", "hir.wait", SLICE, "hir.linear"),
    ],
    ("allgather",): [ALLOC, loop(SLICE, SLICE, "hir.allgather", "hir.wait")],
    ("allreduce",): [ALLOC, loop(SLICE, SLICE, "hir.allreduce", "hir.wait")],
    ("reduce_scatter",): [ALLOC, loop(SLICE, SLICE, "hir.reduce_scatter", "hir.wait")],
    ("ag_matmul",): [
        ALLOC,
        ALLOC,
        loop(SLICE, SLICE, "hir.allgather", "hir.wait", SLICE, "hir.matmul"),
    ],
    ("matmul_ar",): [
        ALLOC,
        ALLOC,
        loop(SLICE, SLICE, "hir.matmul", SLICE, "hir.allreduce", "hir.wait"),
    ],
    ("matmul_rs_through_bcast",): [
        ALLOC,
        "hir.post_on_stream",
        ALLOC,
        ALLOC,
        loop(SLICE, SLICE, SLICE, "hir.matmul", SLICE, "hir.reduce_scatter", "hir.wait"),
    ],
    ("allgather_p2p",): [ALLOC, RING_SETUP, loop(*P2P)],
    ("ag_matmul_p2p",): [ALLOC, RING_SETUP, ALLOC, loop(*P2P, SLICE, "hir.matmul")],
}


def build(case: tuple) -> ModuleOp:
    name, *stream_axis = case
    return host_program(name, **({"stream_axis": stream_axis[0]} if stream_axis else {}))


@pytest.mark.parametrize("separate_sync_loop", [True, False])
@pytest.mark.parametrize("case", EXPECTED_OUTLINES, ids=lambda case: "-".join(map(str, case)))
def test_reference_fusion_loops(case, separate_sync_loop):
    function = host(stream_parallel(build(case), separate_sync_loop=separate_sync_loop))
    assert outline(function.body.block) == expand(EXPECTED_OUTLINES[case], separate_sync_loop)
    # The caller's stream is read once, before every loop.
    (main,) = [op for op in function.walk() if isinstance(op, hir.GetCurrentStreamOp)]
    assert main.parent_op() is function
    first_loop = next(op for op in function.body.block.ops if op.regions)
    assert main.is_before_in_block(first_loop)


@pytest.mark.parametrize("name", REFERENCE_FUSIONS)
def test_idempotent(name):
    once = print_module(stream_parallel(host_program(name)))
    assert print_module(stream_parallel(host_program(name), separate_sync_loop=True)) == once
    module = stream_parallel(host_program(name))
    assert print_module(stream_parallel(module)) == once


def loop_ops(module: ModuleOp, op_type: type) -> list:
    return [op for op in host(module).walk() if isinstance(op, op_type)]


def test_matmul_n_slices_the_weight_not_the_input():
    module = stream_parallel(host_program("matmul", stream_axis=1))
    a, b = host(module).body.block.args
    (matmul,) = loop_ops(module, hir.MatmulOp)
    lhs, rhs = matmul.ins
    assert lhs is a
    assert (
        isinstance(rhs.owner, hir.AliasSelectOp)
        and rhs.owner.input is b
        and rhs.owner.axis.data == 1
    )
    assert rhs.owner.index is matmul.parent_block().args[0]


def test_reduction_axes_are_renumbered_for_the_slice():
    (reduction,) = loop_ops(stream_parallel(host_program("reduction")), hir.ReductionOp)
    assert reduction.axes.get_values() == (1,)
    assert reduction.ins[0].type.rank == 2


def test_broadcast_weight_is_read_at_index_zero_in_every_iteration():
    module = stream_parallel(host_program("matmul_rs_through_bcast"))
    (matmul,) = loop_ops(module, hir.MatmulOp)
    weight = matmul.ins[1].owner
    assert isinstance(weight, hir.AliasSelectOp) and weight.input.type.get_shape()[0] == 1
    assert weight.index.owner.value.value.data == 0
    assert isinstance(weight.input.owner, hir.AllocateOp)


def test_kernel_runs_a_sliced_copy_of_its_segment():
    module = stream_parallel(host_program("single_binary"))
    (launch,) = loop_ops(module, hir.LaunchKernelOp)
    segments = {
        op.sym_name.data: op
        for op in module.ops
        if isinstance(op, func.FuncOp) and op.sym_visibility
    }
    assert list(segments) == [launch.callee.string_value()]
    assert launch.callee.string_value().endswith("_slice")
    segment = segments[launch.callee.string_value()]
    assert list(segment.function_type.inputs) == [value.type for value in launch.ins]
    assert [t.rank for t in segment.function_type.outputs] == [1]


def test_point_to_point_backend_is_the_option():
    for backend in ("nccl", "cuda"):
        module = stream_parallel(host_program("ag_matmul_p2p"), p2p_backend=backend)
        p2p = loop_ops(module, hir.SendOp) + loop_ops(module, hir.RecvOp)
        assert len(p2p) == 2 and {op.backend.data.value for op in p2p} == {backend}


def test_unknown_backend_is_refused():
    with pytest.raises(HostirError, match="unknown p2p_backend 'ucc'; expected one of nccl, cuda"):
        stream_parallel(host_program("allgather_p2p"), p2p_backend="ucc")


def test_an_uncovered_stream_axis_names_the_users_operand_and_line():
    """A fusion built in Python whose matmul contracts a stream axis: the error is at the
    matmul's line and names its operand as `fusion.matmul` does (`lhs`, `rhs`) and where
    its value comes from, an input or the line of the op that filled its buffer."""
    cases = []
    for streamed in ("input", "computed"):
        fb = FusionBuilder("f")
        a, w = fb.input([None, None], "f32"), fb.input([None, None], "f32")
        lhs, rhs = (fb.neg(a), w) if streamed == "computed" else (a, w)
        fb.parallelize(lhs, 1, "stream")
        matmul_line = inspect.currentframe().f_lineno + 1
        fb.output(fb.matmul(lhs, rhs))
        with pytest.raises(HostirError) as error:
            Program.compile(fb.build())
        cases.append((streamed, matmul_line, str(error.value).splitlines()[0]))
    type = "!fusion.tensor<[?, ?], f32, axes = [_, stream]>"
    for streamed, line, message in cases:
        origin = "input #0 of @f" if streamed == "input" else f"the buffer allocated at {__file__}:{line - 3}"
        assert message == (
            f"{__file__}:{line}:19: error: hir.matmul contracts axis 1 of operand 0 `lhs` ({origin}) "
            f"of type {type}, which is that operand's stream axis; a reduced axis cannot be stream-parallel"
        ), message


def test_device_order_is_pr4515s_loop():
    for name, outline_of_loop in [
        ("allgather_p2p", [ALLOC, loop(*P2P_DEVICE_ORDER)]),
        ("ag_matmul_p2p", [ALLOC, ALLOC, loop(*P2P_DEVICE_ORDER, SLICE, "hir.matmul")]),
    ]:
        module = stream_parallel(host_program(name), p2p_order="device")
        function = host(module)
        assert outline(function.body.block) == expand(outline_of_loop, separate_sync_loop=True)
        (recv,), (send,) = loop_ops(module, hir.RecvOp), loop_ops(module, hir.SendOp)
        index = recv.parent_op().parent_block().args[0]
        assert recv.peer is index and send.peer is index


def test_unknown_order_is_refused():
    with pytest.raises(HostirError, match="unknown p2p_order 'tree'; expected one of ring, device"):
        stream_parallel(host_program("allgather_p2p"), p2p_order="tree")


# The ring's schedule, computed from the IR: the index arithmetic of the loop evaluated
# for each device and iteration.


def evaluate(value, rank: int, index: int) -> int:
    """The value of an index `value` of a stream loop on device `rank` at iteration `index`."""
    owner = value.owner
    if isinstance(owner, Block):
        return index
    if isinstance(owner, hir.DeviceIndexOp):
        return rank
    if isinstance(owner, arith.ConstantOp):
        return owner.value.value.data
    lhs, rhs = (evaluate(operand, rank, index) for operand in owner.operands)
    operations = {arith.AddiOp: int.__add__, arith.SubiOp: int.__sub__, arith.RemUIOp: int.__mod__}
    result = operations[type(owner)](lhs, rhs)
    assert result >= 0, f"{owner.name} is negative on device {rank} at iteration {index}"
    return result


@dataclass(frozen=True)
class Step:
    """What a device does in one iteration of the point-to-point allgather."""

    slot: int
    own: bool
    recv_from: int
    send_to: int
    matmul_slot: int | None


def schedule(module: ModuleOp, mesh: range) -> dict[tuple[int, int], Step]:
    """(device, iteration) -> its step, for every device of `mesh`."""
    (recv,), (send,) = loop_ops(module, hir.RecvOp), loop_ops(module, hir.SendOp)
    exchange = recv.parent_op()
    (is_own,) = exchange.operands
    slot = recv.buffer.owner.index
    matmuls = loop_ops(module, hir.MatmulOp)
    steps = {}
    for rank in mesh:
        for i in range(len(mesh)):
            steps[rank, i] = Step(
                slot=evaluate(slot, rank, i),
                own=bool(evaluate(is_own.owner.lhs, rank, i) == evaluate(is_own.owner.rhs, rank, i)),
                recv_from=evaluate(recv.peer, rank, i),
                send_to=evaluate(send.peer, rank, i),
                matmul_slot=evaluate(matmuls[0].outs[0].owner.index, rank, i) if matmuls else None,
            )
    return steps


def p2p_on_mesh(name: str, mesh: range) -> ModuleOp:
    """A point-to-point allgather fusion on `mesh` (static extents): `allgather_p2p` or `ag_matmul_p2p`."""
    fb = FusionBuilder(name)
    a = fb.input([len(mesh), 3, 5], "f32", mesh=mesh, axes=["didx", "_", "_"])
    if name == "ag_matmul_p2p":
        out = fb.matmul(a, fb.input([5, 4], "f32", mesh=mesh))
    else:
        out = fb.set(a)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


@pytest.mark.parametrize("mesh", [range(8), range(4, 8), range(1, 4), range(2)], ids=str)
@pytest.mark.parametrize("name", ["allgather_p2p", "ag_matmul_p2p"])
def test_ring_keeps_every_link_busy_and_pairs_every_send_with_a_recv(name, mesh):
    module = REFERENCE_FUSIONS[name](num_devices=8) if mesh == range(8) else p2p_on_mesh(name, mesh)
    context = hostir_context()
    InsertReshardings().apply(context, module)
    FusionToHir().apply(context, module)
    steps = schedule(stream_parallel(module), mesh)
    D = len(mesh)
    for rank in mesh:
        p = rank - mesh[0]
        # Each device fills every slot once, its own first, and the matmul works on that slot.
        assert sorted(steps[rank, i].slot for i in range(D)) == list(range(D))
        for i in range(D):
            step = steps[rank, i]
            assert step.slot == (p + i) % D and step.own == (i == 0)
            assert step.matmul_slot == (step.slot if name == "ag_matmul_p2p" else None)
            if i:
                # It receives slot s from the device holding shard s, which sends to it in
                # the same iteration.
                assert step.recv_from == mesh[step.slot]
                assert steps[step.recv_from, i].send_to == rank
                assert steps[step.send_to, i].recv_from == rank
    for i in range(1, D):
        # Every step: each device sends to one peer and receives from another, all distinct.
        assert sorted(steps[rank, i].send_to for rank in mesh) == list(mesh)
        assert sorted(steps[rank, i].recv_from for rank in mesh) == list(mesh)
        assert all(steps[rank, i].send_to != rank for rank in mesh)


def test_merged_matmul_reads_the_slice_that_arrived():
    module = stream_parallel(host_program("ag_matmul_p2p"))
    (recv,), (matmul,) = loop_ops(module, hir.RecvOp), loop_ops(module, hir.MatmulOp)
    slot = recv.buffer.owner.index
    assert slot.name_hint == "slot" and isinstance(slot.owner, arith.RemUIOp)
    assert matmul.ins[0] is recv.buffer
    assert matmul.outs[0].owner.index is slot


def plain_then_ring(num_devices: int = 4, dtype: str = "f32") -> ModuleOp:
    """-x [Stream(D), M] (a plain loop), then the ring allgather of A [DIDx(D), M], then their sum.

    The sum merges into the ring's loop (at the slot); the ring does not merge into the
    plain loop, whose iteration i works on slot i.
    """
    fb = FusionBuilder("plain_then_ring")
    x = fb.input([num_devices, None], dtype, mesh=range(num_devices))
    negated = fb.neg(x)
    fb.parallelize(negated, 0, "stream")
    a = fb.input([num_devices, None], dtype, mesh=range(num_devices), axes=["didx", "_"])
    gathered = fb.set(a)
    fb.parallelize(gathered, 0, "stream")
    out = fb.add(negated, gathered)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def test_a_ring_loop_does_not_merge_into_a_plain_loop():
    module = plain_then_ring()
    context = hostir_context()
    InsertReshardings().apply(context, module)
    FusionToHir().apply(context, module)
    function = host(stream_parallel(module))
    ring = loop(*P2P, SLICE, SLICE, "hir.launch_kernel")
    expected = [ALLOC, loop(SLICE, SLICE, "hir.launch_kernel"), ALLOC, RING_SETUP, ALLOC, ring]
    assert outline(function.body.block) == expand(expected, separate_sync_loop=True)
    (recv,) = loop_ops(module, hir.RecvOp)
    plain, merged = loop_ops(module, hir.LaunchKernelOp)
    slot = recv.buffer.owner.index
    assert all(operand.owner.index is plain.parent_block().args[0] for operand in plain.operands)
    assert all(operand.owner.index is slot for operand in merged.operands)
    lowered = print_module(module)
    assert print_module(stream_parallel(module)) == lowered


# --------------------------------------------------------------------------- #
# What the pipelined programs compute                                          #
# --------------------------------------------------------------------------- #


SINGLE_DEVICE = {
    "single_set": (lambda x: x, [(5, 3)]),
    "two_sets": (lambda x: x, [(5, 3)]),
    "three_sets": (lambda x: x, [(5, 3)]),
    "reduction": (lambda x: x.sum(2), [(3, 4, 5)]),
    "single_binary": (torch.add, [(5, 3), (5, 3)]),
    "matmul": (torch.matmul, [(5, 4), (4, 3)]),
    "linear": (torch.nn.functional.linear, [(3, 5, 4), (6, 4), (6,)]),
}


def pipelined(name: str, separate_sync_loop: bool, **arguments) -> Program:
    options = f"separate_sync_loop={str(separate_sync_loop).lower()}"
    return Program.compile(
        REFERENCE_FUSIONS[name](**arguments),
        pipeline=f"insert-reshardings,fusion-to-hir,stream-parallel{{{options}}},insert-deallocations",
    )


@pytest.mark.parametrize("separate_sync_loop", [True, False])
@pytest.mark.parametrize("name", SINGLE_DEVICE)
def test_single_device_pipelines_compute_what_torch_computes(name, separate_sync_loop):
    expected, shapes = SINGLE_DEVICE[name]
    generator = torch.Generator().manual_seed(7)
    inputs = [torch.randn(shape, generator=generator) for shape in shapes]
    device = Communicator.single().device
    program = pipelined(name, separate_sync_loop)
    for num_streams in (1, 3):
        with poisoned_allocations():
            (output,) = program.run([x.to(device) for x in inputs], num_streams=num_streams)
        torch.testing.assert_close(output.cpu(), expected(*inputs))


def multi_device_cases(n: int) -> list[tuple[str, list[torch.Tensor], torch.Tensor]]:
    """(fusion, unsharded inputs, unsharded output) over a mesh of `n` devices."""
    generator = torch.Generator().manual_seed(n)
    x = torch.randn(n, 6, generator=generator)
    a, b = torch.randn(n, 3, 5, generator=generator), torch.randn(5, 4, generator=generator)
    c, d = torch.randn(2, n, 3, 5, generator=generator), torch.randn(n, 5, 4, generator=generator)
    return [
        ("allgather_p2p", [x], x),
        ("ag_matmul_p2p", [a, b], a @ b),
        ("matmul_ar", [c, d], torch.einsum("sdmk,dkn->smn", c, d)),
    ]


def run_on_this_rank(program: Program, inputs: list[torch.Tensor], communicator: Communicator) -> torch.Tensor:
    """This rank's output of `program` on its shards of the unsharded `inputs`: 2 streams,
    every allocation poisoned."""
    local = [
        shard(value, t, communicator.rank).to(communicator.device)
        for value, t in zip(inputs, program.input_types)
    ]
    with poisoned_allocations():
        (output,) = program.run(local, communicator, num_streams=2)
    return output.cpu()


def run_without_separate_sync_loop(n: int) -> list[torch.Tensor]:
    """One rank: each multi-device case, pipelined without the separate synchronisation loop."""
    communicator = Communicator.from_env()
    return [
        run_on_this_rank(pipelined(name, separate_sync_loop=False, num_devices=n), inputs, communicator)
        for name, inputs, _ in multi_device_cases(n)
    ]


def point_to_point_cases(n: int) -> list[tuple[str, str, ModuleOp, list, torch.Tensor, range]]:
    """(what, p2p_order, fusion, unsharded inputs, unsharded output, the devices that hold it):
    the point-to-point cases in both orders, the plain loop then the ring, and AG+matmul
    on a mesh that leaves out device 0 (devices 1 .. n-1)."""
    generator = torch.Generator().manual_seed(n)
    x, a = torch.randn(n, 6, generator=generator), torch.randn(n, 6, generator=generator)
    u, b = torch.randn(n - 1, 3, 5, generator=generator), torch.randn(5, 4, generator=generator)
    everywhere, upper = range(n), range(1, n)
    cases = [
        (name, order, REFERENCE_FUSIONS[name](num_devices=n), inputs, expected, everywhere)
        for name, inputs, expected in multi_device_cases(n)[:2]
        for order in ("ring", "device")
    ]
    cases.append(("plain_then_ring", "ring", plain_then_ring(n), [x, a], a - x, everywhere))
    for order in ("ring", "device"):
        upper_matmul = p2p_on_mesh("ag_matmul_p2p", upper)
        cases.append(("ag_matmul_p2p on 1 ..", order, upper_matmul, [u, b], u @ b, upper))
    return cases


def run_point_to_point_cases(n: int) -> list[torch.Tensor]:
    """One rank: the output of each of `point_to_point_cases(n)`, lowered with its order."""
    communicator = Communicator.from_env()
    return [
        run_on_this_rank(
            Program.compile(module, pipeline=f"hir-lowering{{p2p_order={order}}}"), inputs, communicator
        )
        for _, order, module, inputs, _, _ in point_to_point_cases(n)
    ]


@pytest.mark.parametrize("n", [pytest.param(n, marks=needs_ranks(n)) for n in (2, 4)])
def test_point_to_point_orders_compute_what_torch_computes(n):
    cases = point_to_point_cases(n)
    for rank, outputs in enumerate(run_on_local_ranks(run_point_to_point_cases, n, n, timeout_s=LAUNCH_TIMEOUT_S)):
        for output, (what, order, _, _, expected, holders) in zip(outputs, cases, strict=True):
            where = f"{what} in {order} order, rank {rank}"
            if rank in holders:
                torch.testing.assert_close(output, expected, msg=lambda m: f"{where}: {m}")
            else:
                assert output.numel() == 0, where


@needs_ranks(2)
def test_multi_device_pipelines_without_a_separate_sync_loop():
    for outputs in run_on_local_ranks(run_without_separate_sync_loop, 2, 2, timeout_s=LAUNCH_TIMEOUT_S):
        # These outputs are replicated: every rank holds the whole gathered or reduced result.
        for output, (_, _, expected) in zip(outputs, multi_device_cases(2), strict=True):
            torch.testing.assert_close(output, expected)
