"""insert-reshardings: which operands get a `fusion.set`, into which layout, and what stays.

Fusions are built with the Python builder; the pass runs on them as the pipeline runs
it, and the result must verify and be a fixed point of the pass.
"""

import pytest
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, f32

from examples import reference_fusions
from hostir_dialect import fusion, hostir_context
from hostir_dialect.builder import FusionBuilder
from hostir_dialect.fusion import DYNAMIC, TensorType, tensor_type
from hostir_dialect.text import HostirError, parse_module, print_module, verify_module
from hostir.passes.analysis.sharding import resharded_operands
from hostir.passes.fusion.insert_reshardings import InsertReshardings
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.program import Program


def tensor(shape, mesh, axes) -> TensorType:
    """`None` in `shape` is a dynamic extent; `axes` is a string like "_ didx stream"."""
    return TensorType(
        [DYNAMIC if d is None else d for d in shape],
        f32,
        list(mesh),
        ["serial" if a == "_" else a for a in axes.split()],
    )


def insert_reshardings(module: ModuleOp) -> ModuleOp:
    """Runs the pass, checks that the result verifies and that a second run changes nothing."""
    InsertReshardings().apply(hostir_context(), module)
    verify_module(module)
    once = print_module(module)
    InsertReshardings().apply(hostir_context(), module)
    assert print_module(module) == once
    return module


def body(module: ModuleOp) -> list:
    (function,) = [op for op in module.ops if isinstance(op, func.FuncOp)]
    return list(function.body.block.ops)


def assert_all_local(module: ModuleOp) -> None:
    """Only sets and reductions over a didx axis may still reshard."""
    for op in body(module):
        if isinstance(op, fusion.FusionOp) and not isinstance(op, fusion.SetOp):
            reduces_didx = (
                isinstance(op, fusion.ReductionOp)
                and tensor_type(op.input).didx_axis in op.reduced_axes
            )
            assert reduces_didx or not resharded_operands(op), op


@pytest.mark.parametrize("num_devices", [8, 3])
@pytest.mark.parametrize("name", ["ag_linear", "ag_matmul"])
def test_gathered_input_takes_the_stream_axis_of_the_output(name, num_devices):
    """pr3736 / AG_matmul: `g = set(in) : [Stream(S), D, M, K]`, then the op reads `g`."""
    module = insert_reshardings(reference_fusions.REFERENCE_FUSIONS[name](num_devices, "f32"))
    ops = body(module)
    assert [type(op) for op in ops[:2]] == [fusion.SetOp, type(ops[1])]
    gather, compute = ops[0], ops[1]
    mesh = range(num_devices)
    assert gather.input.type == tensor([None, num_devices, None, None], mesh, "_ didx _ _")
    assert gather.result.type == tensor([None, num_devices, None, None], mesh, "stream _ _ _")
    assert compute.operands[0] is gather.result
    assert all(not isinstance(op, fusion.SetOp) for op in ops[1:])
    assert_all_local(module)


@pytest.mark.parametrize(
    "name",
    [
        "allgather",
        "allreduce",
        "reduce_scatter",
        "matmul_ar",
        "matmul_rs_through_bcast",
        "allgather_p2p",
    ],
)
def test_fusions_whose_only_resharding_is_a_set_or_a_didx_reduction_are_unchanged(name):
    module = reference_fusions.REFERENCE_FUSIONS[name](4)
    before = print_module(module)
    assert print_module(insert_reshardings(module)) == before


@pytest.mark.parametrize(
    "name",
    ["single_set", "two_sets", "three_sets", "reduction", "single_binary", "matmul", "linear"],
)
def test_single_device_fusions_are_unchanged(name):
    module = reference_fusions.REFERENCE_FUSIONS[name]()
    before = print_module(module)
    assert print_module(insert_reshardings(module)) == before


def test_a_broadcast_operand_needs_no_movement():
    """A replicated [N] added to a sharded [DIDx(D), N]: every device holds the whole operand."""
    fb = FusionBuilder("bias")
    x = fb.input([4, None], "f32", mesh=range(4), axes=["didx", "_"])
    b = fb.input([None], "f32", mesh=range(4))
    y = fb.add(x, b)
    fb.parallelize(y, 0, "didx")
    fb.output(y)
    module = fb.build()
    before = print_module(module)
    assert print_module(insert_reshardings(module)) == before


def test_a_replicated_operand_of_a_sharded_op_is_set_to_the_sharded_layout():
    fb = FusionBuilder("sharded_add")
    x = fb.input([4, None], "f32", mesh=range(4), axes=["didx", "_"])
    w = fb.input([4, None], "f32", mesh=range(4))
    y = fb.add(x, w)
    fb.parallelize(y, 0, "didx")
    fb.output(y)
    ops = body(insert_reshardings(fb.build()))
    x_arg, w_arg = ops[0].parent_block().args
    assert [type(op) for op in ops] == [fusion.SetOp, fusion.AddOp, func.ReturnOp]
    assert ops[0].input is w_arg
    assert ops[0].result.type == tensor([4, None], range(4), "didx _")
    assert ops[1].lhs is x_arg and ops[1].rhs is ops[0].result


def test_an_operand_on_another_mesh_is_set_to_the_output_mesh():
    fb = FusionBuilder("moved")
    x = fb.input([2, None], "f32", mesh=[0, 1], axes=["didx", "_"])
    y = fb.neg(x)
    fb.set_mesh(y, [2, 3])
    fb.parallelize(y, 0, "didx")
    fb.output(y)
    ops = body(insert_reshardings(fb.build()))
    assert [type(op) for op in ops] == [fusion.SetOp, fusion.NegOp, func.ReturnOp]
    assert ops[0].result.type == tensor([2, None], [2, 3], "didx _")
    assert ops[1].input is ops[0].result


def test_one_set_serves_an_operand_used_twice():
    fb = FusionBuilder("square")
    x = fb.input([4, None], "f32", mesh=range(4), axes=["didx", "_"])
    fb.output(fb.mul(x, x))
    ops = body(insert_reshardings(fb.build()))
    assert [type(op) for op in ops] == [fusion.SetOp, fusion.MulOp, func.ReturnOp]
    assert ops[1].lhs is ops[0].result and ops[1].rhs is ops[0].result
    assert ops[0].result.type == tensor([4, None], range(4), "_ _")


def test_a_reduction_over_a_serial_axis_gathers_its_sharded_input_first():
    """sum([DIDx(D), M], 1) -> [D] replicated: the input is gathered, the sum stays local."""
    fb = FusionBuilder("row_sums")
    x = fb.input([4, None], "f32", mesh=range(4), axes=["didx", "_"])
    fb.output(fb.sum(x, [1]))
    ops = body(insert_reshardings(fb.build()))
    assert [type(op) for op in ops] == [fusion.SetOp, fusion.SumOp, func.ReturnOp]
    assert ops[0].result.type == tensor([4, None], range(4), "_ _")


@pytest.mark.parametrize("keepdim", [False, True])
def test_a_reduction_over_the_didx_axis_and_others_is_split(keepdim):
    """sum(x, [0, 2]) with axis 0 didx: a local sum over axis 2, then a sum over the didx axis."""
    fb = FusionBuilder("total")
    x = fb.input([4, None, None], "f32", mesh=range(4), axes=["didx", "stream", "_"])
    y = fb.sum(x, [0, 2], keepdim=keepdim)
    fb.parallelize(y, 1 if keepdim else 0, "stream")
    fb.output(y)
    module = insert_reshardings(fb.build())
    ops = body(module)
    assert [type(op) for op in ops] == [fusion.SumOp, fusion.SumOp, func.ReturnOp]
    partial, total = ops[0], ops[1]
    assert partial.reduced_axes == (2,)
    assert partial.result.type == (
        tensor([4, None, 1], range(4), "didx stream _")
        if keepdim
        else tensor([4, None], range(4), "didx stream")
    )
    assert total.input is partial.result and total.reduced_axes == (0,)
    assert total.result.type == y.type
    assert partial.keeps_dims == total.keeps_dims == keepdim
    assert_all_local(module)


# --------------------------------------------------------------------------- #
# Locations and refusals                                                       #
# --------------------------------------------------------------------------- #

TRANSPOSED_ADD = """\
!rows = !fusion.tensor<[4, 4], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!cols = !fusion.tensor<[4, 4], f32, mesh = [0, 1, 2, 3], axes = [_, didx]>
func.func @f(%a: !rows, %b: !cols) -> !rows {
  %c = fusion.add %a, %b : (!rows, !cols) -> !rows
  func.return %c : !rows
}
"""


GATHERED_LINEAR = """\
!in = !fusion.tensor<[?, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2, 3]>
!b = !fusion.tensor<[?], bf16, mesh = [0, 1, 2, 3]>
!out = !fusion.tensor<[?, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [stream, _, _, _]>
func.func @ag_linear(%in: !in, %w: !w, %b: !b) -> !out {
  %out = fusion.linear %in, %w, %b : (!in, !w, !b) -> !out
  func.return %out : !out
}
"""


def test_an_inserted_set_has_the_location_of_the_op_it_serves():
    module = insert_reshardings(parse_module(GATHERED_LINEAR, "gathered.mlir"))
    gather, linear = body(module)[:2]
    assert isinstance(gather, fusion.SetOp) and isinstance(linear, fusion.LinearOp)
    assert gather.location == linear.location
    assert (gather.location.filename.data, gather.location.line.data) == ("gathered.mlir", 6)


def test_a_resharding_no_communication_does_is_an_error_at_the_users_op():
    module = parse_module(TRANSPOSED_ADD, "transposed.mlir")
    with pytest.raises(HostirError) as error:
        InsertReshardings().apply(hostir_context(), module)
    assert error.value.op_name == "fusion.add"
    assert (error.value.location.file, error.value.location.line) == ("transposed.mlir", 4)
    assert error.value.message.startswith(
        "fusion.add: operand 1 `rhs` (input #1 of @f) must be resharded from mesh = [0, 1, 2, 3], axes = [_, didx] "
        "to mesh = [0, 1, 2, 3], axes = [didx, _]"
    )
    assert error.value.message.endswith("no communication moves a didx axis to another axis")



def broadcast_against_didx(num_devices: int) -> ModuleOp:
    """`a [1, DIDx(D)] + c [DIDx(D), 1] -> [DIDx(D), D]`: a's axis 0 broadcasts against the
    result's didx axis, which on one device has a's extent, 1."""
    fb = FusionBuilder("broadcast_against_didx")
    a = fb.input([1, num_devices], "f32", mesh=range(num_devices), axes=["_", "didx"])
    c = fb.input([num_devices, 1], "f32", mesh=range(num_devices), axes=["didx", "_"])
    y = fb.add(a, c)
    fb.parallelize(y, 0, "didx")
    fb.output(y)
    return fb.build()


@pytest.mark.parametrize("num_devices", [4, 2, 1])
def test_an_extent_1_broadcast_axis_is_no_didx_axis_on_one_device(num_devices):
    """On every mesh, one device included, `a` is gathered (its didx axis made serial) and
    its axis 0 broadcast: not moved onto the result's didx axis, which no communication does."""
    ops = body(insert_reshardings(broadcast_against_didx(num_devices)))
    assert [type(op) for op in ops] == [fusion.SetOp, fusion.AddOp, func.ReturnOp]
    assert ops[0].result.type == tensor([1, num_devices], range(num_devices), "_ _")
    assert_all_local(insert_reshardings(broadcast_against_didx(num_devices)))


def test_a_one_device_mesh_runs_what_a_larger_one_runs():
    program = Program.compile(broadcast_against_didx(1))
    a, c = torch.randn(1, 1), torch.randn(1, 1)
    (y,) = program.run([a, c], Communicator.single(torch.device("cpu")))
    torch.testing.assert_close(y, a + c)
