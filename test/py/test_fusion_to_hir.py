"""fusion-to-hir: the host programs of the reference fusions, every communication, segments,
extents, diagnostics, idempotence; and the lowered communications run on local ranks.

Fusions are built with the Python builder. The op-sequence tests check what the pass
emits; the run test executes each lowered resharding on 4 gloo ranks, with every
buffer allocated full of NaN, and compares every rank's piece with plain torch on the
whole tensors.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects.shard import ReductionKind

from examples import reference_fusions
from hostir_dialect import fusion, hir, hostir_context
from hostir_dialect.builder import FusionBuilder
from hostir_dialect.fusion import TensorType
from hostir_dialect.text import HostirError, parse_module, print_module, verify_module
from hostir.passes.fusion.insert_reshardings import InsertReshardings
from hostir.passes.lowering.fusion_to_hir import FusionToHir
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.launch import run_on_local_ranks
from hostir.runtime.program import Program


def lower(module: ModuleOp) -> ModuleOp:
    """insert-reshardings then fusion-to-hir; the result verifies and is a fixed point of both."""
    context = hostir_context()
    InsertReshardings().apply(context, module)
    FusionToHir().apply(context, module)
    verify_module(module)
    once = print_module(module)
    FusionToHir().apply(context, module)
    InsertReshardings().apply(context, module)
    assert print_module(module) == once
    return module


def host(module: ModuleOp) -> func.FuncOp:
    (function,) = [
        op for op in module.ops if isinstance(op, func.FuncOp) and op.sym_visibility is None
    ]
    return function


def segments(module: ModuleOp) -> dict[str, list[str]]:
    """Each segment function's name and the names of its ops."""
    return {
        op.sym_name.data: [o.name for o in op.body.block.ops]
        for op in module.ops
        if isinstance(op, func.FuncOp) and op.sym_visibility is not None
    }


def op_names(module: ModuleOp) -> list[str]:
    return [op.name for op in host(module).body.block.ops]


def only(module: ModuleOp, op_type: type):
    (op,) = [op for op in host(module).body.block.ops if isinstance(op, op_type)]
    return op


def resharding(shape, source_mesh, source_axes, target_mesh, target_axes) -> ModuleOp:
    """`fusion.set` from one layout to another; axes are strings like "didx _"."""
    fb = FusionBuilder("reshard")
    x = fb.input(shape, "f32", mesh=source_mesh, axes=source_axes.split())
    y = fb.set(x)
    fb.set_mesh(y, target_mesh)
    for axis, parallel_type in enumerate(target_axes.split()):
        fb.parallelize(y, axis, parallel_type)
    fb.output(y)
    return fb.build()


def reduction(kind, shape, source_mesh, source_axes, axis, target_mesh, target_axes) -> ModuleOp:
    """`fusion.sum`/`fusion.max` over `axis`, whose result has the given layout."""
    fb = FusionBuilder("reduce")
    x = fb.input(shape, "f32", mesh=source_mesh, axes=source_axes.split())
    y = getattr(fb, kind)(x, [axis])
    fb.set_mesh(y, target_mesh)
    for output_axis, parallel_type in enumerate(target_axes.split()):
        fb.parallelize(y, output_axis, parallel_type)
    fb.output(y)
    return fb.build()


# --------------------------------------------------------------------------- #
# Reference fusions                                                            #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("num_devices", [8, 3])
def test_ag_linear_with_bias(num_devices):
    """pr3736: allocate the gathered input, allgather + wait, then the linear into its output."""
    module = lower(reference_fusions.ag_linear(num_devices))
    assert op_names(module) == [
        *["hir.dim"] * 5,
        "hir.allocate",
        "hir.allgather",
        "hir.wait",
        "arith.maxui",
        "hir.allocate",
        "hir.linear",
        "func.return",
    ]
    function = host(module)
    x, weight, bias = function.args
    allgather = only(module, hir.AllgatherOp)
    linear = only(module, hir.LinearOp)
    assert allgather.input is x and allgather.team_ids == tuple(range(num_devices))
    assert allgather.output.type.axes == linear.outs[0].type.axes  # the gather is streamed too
    assert list(linear.ins) == [allgather.output, weight, bias]
    assert function.get_return_op().arguments[0] is linear.outs[0]
    # N is the weight's extent 0 or the bias's, whichever is not 1.
    maxui = only(module, arith.MaxUIOp)
    assert {maxui.lhs.owner.buffer, maxui.rhs.owner.buffer} == {weight, bias}
    assert linear.outs[0].owner.dynamic_sizes[-1] is maxui.result


@pytest.mark.parametrize("num_devices", [8, 3])
def test_ag_matmul(num_devices):
    module = lower(reference_fusions.ag_matmul(num_devices))
    assert [n for n in op_names(module) if n != "hir.dim"] == [
        "hir.allocate",
        "hir.allgather",
        "hir.wait",
        "hir.allocate",
        "hir.matmul",
        "func.return",
    ]
    matmul = only(module, hir.MatmulOp)
    assert matmul.ins[0] is only(module, hir.AllgatherOp).output


@pytest.mark.parametrize("num_devices", [8, 3])
def test_matmul_ar(num_devices):
    """A local matmul over the sharded batch axis, then the sum over it is an allreduce."""
    module = lower(reference_fusions.matmul_ar(num_devices))
    assert [n for n in op_names(module) if n != "hir.dim"] == [
        "hir.allocate",
        "hir.matmul",
        "hir.allocate",
        "hir.allreduce",
        "hir.wait",
        "func.return",
    ]
    allreduce = only(module, hir.AllreduceOp)
    assert allreduce.input is only(module, hir.MatmulOp).outs[0]
    assert allreduce.reduce_op.data == ReductionKind.SUM
    assert allreduce.team_ids == tuple(range(num_devices))


@pytest.mark.parametrize("num_devices", [8, 3])
def test_matmul_rs_through_bcast(num_devices):
    """The broadcast of B is a segment of data movement only: post_on_stream, as nvFuser's HostUnit."""
    module = lower(reference_fusions.matmul_rs_through_bcast(num_devices))
    assert [n for n in op_names(module) if n != "hir.dim"] == [
        "hir.allocate",
        "hir.post_on_stream",
        "hir.allocate",
        "hir.matmul",
        "hir.allocate",
        "hir.reduce_scatter",
        "hir.wait",
        "func.return",
    ]
    assert segments(module) == {
        "matmul_rs_through_bcast_segment_0": ["fusion.broadcast", "func.return"]
    }
    post = only(module, hir.PostOnStreamOp)
    assert post.callee.string_value() == "matmul_rs_through_bcast_segment_0"
    assert list(post.ins) == [host(module).args[1]]
    assert only(module, hir.MatmulOp).ins[1] is post.outs[0]
    reduce_scatter = only(module, hir.ReduceScatterOp)
    assert reduce_scatter.input is only(module, hir.MatmulOp).outs[0]


@pytest.mark.parametrize(
    "name, compute",
    [
        ("single_set", "hir.copy"),
        ("reduction", "hir.reduction"),
        ("matmul", "hir.matmul"),
        ("linear", "hir.linear"),
        ("single_binary", "hir.launch_kernel"),
    ],
)
def test_single_device_fusions(name, compute):
    module = lower(reference_fusions.REFERENCE_FUSIONS[name]())
    sizes = ("hir.dim", "arith.maxui")  # the linear's N is the weight's or the bias's extent
    assert [n for n in op_names(module) if n not in sizes] == [
        "hir.allocate",
        compute,
        "func.return",
    ]
    assert not any(isinstance(op, hir.CommunicationOp) for op in host(module).walk())


def test_single_device_reduction_keeps_kind_axes_and_keepdim():
    fb = FusionBuilder("amax")
    y = fb.max(fb.input([None, 4, None], "f32"), [2], keepdim=True)
    fb.output(y)
    reduce = only(lower(fb.build()), hir.ReductionOp)
    assert (reduce.kind.data, list(reduce.axes.get_values()), reduce.keepdim is not None) == (
        "max",
        [2],
        True,
    )


# --------------------------------------------------------------------------- #
# Every communication                                                          #
# --------------------------------------------------------------------------- #


def communications(module: ModuleOp) -> list[tuple[str, tuple[int, ...], int | None, str | None]]:
    """(name, team, root, reduce op) of each communication, each of which must be waited on."""
    ops = list(host(module).body.block.ops)
    found = []
    for op, following in zip(ops, ops[1:]):
        if isinstance(op, hir.CommunicationOp):
            assert isinstance(following, hir.WaitOp) and following.work is op.work
            found.append(
                (
                    op.name,
                    op.team_ids,
                    None if op.root is None else op.root.data,
                    None if op.reduce_op is None else op.reduce_op.data.value,
                )
            )
    return found


@pytest.mark.parametrize("d", [8, 3])
def test_allgather(d):
    module = lower(resharding([d, None], range(d), "didx _", range(d), "_ _"))
    assert communications(module) == [("hir.allgather", tuple(range(d)), None, None)]


@pytest.mark.parametrize("d", [8, 3])
@pytest.mark.parametrize("kind", ["sum", "max"])
def test_allreduce(d, kind):
    module = lower(reduction(kind, [None, d], range(d), "_ didx", 1, range(d), "_"))
    assert communications(module) == [("hir.allreduce", tuple(range(d)), None, kind)]


@pytest.mark.parametrize("d", [8, 3])
def test_reduce_scatter(d):
    module = lower(reduction("sum", [d, d, None], range(d), "didx _ _", 0, range(d), "didx _"))
    assert communications(module) == [("hir.reduce_scatter", tuple(range(d)), None, "sum")]


@pytest.mark.parametrize("d", [8, 3])
def test_scatter(d):
    module = lower(resharding([d, None], [0], "_ _", range(d), "didx _"))
    assert communications(module) == [("hir.scatter", tuple(range(d)), 0, None)]


@pytest.mark.parametrize("d", [8, 3])
def test_scatter_from_a_root_outside_the_mesh_joins_the_team_last(d):
    module = lower(resharding([d, None], [d], "_ _", range(d), "didx _"))
    assert communications(module) == [("hir.scatter", (*range(d), d), d, None)]


@pytest.mark.parametrize("d", [8, 3])
def test_gather(d):
    module = lower(resharding([d, None], range(d), "didx _", [1], "_ _"))
    assert communications(module) == [("hir.gather", tuple(range(d)), 1, None)]


@pytest.mark.parametrize("d", [8, 3])
def test_broadcast(d):
    module = lower(resharding([None, 5], [2], "_ _", range(d), "_ _"))
    assert communications(module) == [("hir.broadcast", tuple(range(d)), 2, None)]


@pytest.mark.parametrize("d", [8, 3])
def test_reduce(d):
    module = lower(reduction("sum", [None, d], range(d), "_ didx", 1, [d - 1], "_"))
    assert communications(module) == [("hir.reduce", tuple(range(d)), d - 1, "sum")]


@pytest.mark.parametrize("d", [8, 3])
def test_send_recv_one_per_device_pair(d):
    module = lower(resharding([d, None], range(d), "didx _", range(d, 2 * d), "didx _"))
    assert communications(module) == [("hir.send_recv", (i, d + i), i, None) for i in range(d)]


def test_send_recv_between_single_devices():
    module = lower(resharding([None, 4], [3], "_ _", [1], "_ _"))
    assert communications(module) == [("hir.send_recv", (3, 1), 3, None)]


@pytest.mark.parametrize("d, first", [(8, 0), (3, 2)])
def test_local_slice(d, first):
    """Replicated -> sharded on devices that hold the input: select this device's slice, copy it."""
    mesh = range(first, first + d)
    module = lower(resharding([None, d], mesh, "_ _", mesh, "_ didx"))
    assert op_names(module) == [
        "hir.dim",
        "hir.allocate",
        "hir.device_index",
        "arith.constant",
        "arith.subi",
        "arith.constant",
        "hir.alias_select",
        "hir.alias_select",
        "hir.copy",
        "func.return",
    ]
    ops = list(host(module).body.block.ops)
    device, first_device, position, zero, whole, shard, copy = ops[2:9]
    assert first_device.value.value.data == first and zero.value.value.data == 0
    assert (position.lhs, position.rhs) == (device.result, first_device.result)
    assert (whole.input, whole.axis.data, whole.index) == (host(module).args[0], 1, position.result)
    assert (shard.input, shard.axis.data, shard.index) == (ops[1].result, 1, zero.result)
    assert (list(copy.ins), list(copy.outs)) == ([whole.result], [shard.result])


def test_a_replicated_input_set_onto_fewer_of_its_devices_is_a_copy():
    module = lower(resharding([None, 4], range(4), "_ _", [2, 3], "_ _"))
    assert [n for n in op_names(module) if n != "hir.dim"] == [
        "hir.allocate",
        "hir.copy",
        "func.return",
    ]


# --------------------------------------------------------------------------- #
# Pointwise segments                                                           #
# --------------------------------------------------------------------------- #


def test_one_run_is_one_segment_with_its_constant_inside():
    fb = FusionBuilder("gelu_ish")
    x = fb.input([None, 8], "f32")
    y = fb.mul(fb.tanh(x), 0.5) + x
    fb.output(y)
    module = lower(fb.build())
    assert segments(module) == {
        "gelu_ish_segment_0": [
            "fusion.tanh",
            "fusion.constant",
            "fusion.mul",
            "fusion.add",
            "func.return",
        ]
    }
    assert [n for n in op_names(module) if n != "hir.dim"] == [
        "hir.allocate",
        "hir.launch_kernel",
        "func.return",
    ]
    launch = only(module, hir.LaunchKernelOp)
    assert list(launch.ins) == [host(module).args[0]]
    assert host(module).get_return_op().arguments[0] is launch.outs[0]


def test_two_runs_split_by_a_matmul_are_two_segments():
    fb = FusionBuilder("mlp")
    x = fb.input([None, 8], "f32")
    w = fb.input([8, 8], "f32")
    h = fb.matmul(fb.relu(x), w)
    y = fb.sigmoid(h) * x
    fb.output(y)
    module = lower(fb.build())
    assert segments(module) == {
        "mlp_segment_0": ["fusion.relu", "func.return"],
        "mlp_segment_1": ["fusion.sigmoid", "fusion.mul", "func.return"],
    }
    assert [n for n in op_names(module) if n != "hir.dim"] == [
        "hir.allocate",
        "hir.launch_kernel",
        "hir.allocate",
        "hir.matmul",
        "hir.allocate",
        "hir.launch_kernel",
        "func.return",
    ]
    first, second = [op for op in host(module).body.block.ops if isinstance(op, hir.LaunchKernelOp)]
    matmul = only(module, hir.MatmulOp)
    assert matmul.ins[0] is first.outs[0]
    assert list(second.ins) == [matmul.outs[0], host(module).args[0]]


def test_a_segment_returns_each_value_used_after_it():
    fb = FusionBuilder("two_outputs")
    x = fb.input([None, 8], "f32")
    a = fb.exp(x)
    b = fb.neg(a)
    fb.output(fb.sum(a, [1]))
    fb.output(b)
    module = lower(fb.build())
    launch = only(module, hir.LaunchKernelOp)
    assert len(launch.outs) == 2
    assert only(module, hir.ReductionOp).ins[0] is launch.outs[0]
    assert host(module).get_return_op().arguments[1] is launch.outs[1]


def test_a_constant_used_across_a_matmul_is_recomputed_in_each_segment():
    text = """
    func.func @f(%x: !fusion.tensor<[4, 4], f32>) -> !fusion.tensor<[4, 4], f32> {
      %c = fusion.constant 3.0 : f32 : !fusion.tensor<[], f32>
      %a = fusion.mul %x, %c : (!fusion.tensor<[4, 4], f32>, !fusion.tensor<[], f32>) -> !fusion.tensor<[4, 4], f32>
      %m = fusion.matmul %a, %x : (!fusion.tensor<[4, 4], f32>, !fusion.tensor<[4, 4], f32>) -> !fusion.tensor<[4, 4], f32>
      %b = fusion.add %m, %c : (!fusion.tensor<[4, 4], f32>, !fusion.tensor<[], f32>) -> !fusion.tensor<[4, 4], f32>
      func.return %b : !fusion.tensor<[4, 4], f32>
    }
    """
    module = lower(parse_module(text))
    assert segments(module) == {
        "f_segment_0": ["fusion.constant", "fusion.mul", "func.return"],
        "f_segment_1": ["fusion.constant", "fusion.add", "func.return"],
    }
    assert "fusion.constant" not in op_names(module)
    launches = [op for op in host(module).body.block.ops if isinstance(op, hir.LaunchKernelOp)]
    assert [len(launch.ins) for launch in launches] == [1, 1]  # no buffer holds the constant


def test_unused_ops_are_dropped():
    fb = FusionBuilder("dead")
    x = fb.input([None, 8], "f32")
    fb.exp(x)
    fb.output(fb.neg(x))
    module = lower(fb.build())
    assert segments(module) == {"dead_segment_0": ["fusion.neg", "func.return"]}


# --------------------------------------------------------------------------- #
# Extents                                                                      #
# --------------------------------------------------------------------------- #


def test_dims_are_made_once_at_the_top_and_only_where_needed():
    """[?, ?] @ [?, ?]: M from lhs, N from rhs; K of neither is needed."""
    module = lower(reference_fusions.matmul())
    ops = list(host(module).body.block.ops)
    lhs, rhs = host(module).args
    assert [(op.buffer, op.axis.data) for op in ops[:2]] == [(lhs, 0), (rhs, 1)]
    assert list(ops[2].dynamic_sizes) == [ops[0].result, ops[1].result]


def test_two_dynamic_extents_that_broadcast_give_their_maximum():
    fb = FusionBuilder("add")
    fb.output(fb.add(fb.input([None, 4], "f32"), fb.input([None, 4], "f32")))
    module = lower(fb.build())
    assert op_names(module) == [
        "hir.dim",
        "hir.dim",
        "arith.maxui",
        "hir.allocate",
        "hir.launch_kernel",
        "func.return",
    ]
    maxui = only(module, arith.MaxUIOp)
    assert [maxui.lhs.owner.buffer, maxui.rhs.owner.buffer] == list(host(module).args)


def test_an_extent_one_operand_does_not_size_the_result():
    fb = FusionBuilder("stretch")
    fb.output(fb.add(fb.input([None, 4], "f32"), fb.input([1, 4], "f32")))
    module = lower(fb.build())
    assert "arith.maxui" not in op_names(module)
    allocate = only(module, hir.AllocateOp)
    assert allocate.dynamic_sizes[0].owner.buffer is host(module).args[0]


def test_a_dynamic_result_extent_known_statically_is_a_constant():
    text = """
    func.func @f(%x: !fusion.tensor<[4, 8], f32>) -> !fusion.tensor<[?, 8], f32> {
      %y = fusion.neg %x : !fusion.tensor<[4, 8], f32> -> !fusion.tensor<[?, 8], f32>
      func.return %y : !fusion.tensor<[?, 8], f32>
    }
    """
    module = lower(parse_module(text))
    allocate = only(module, hir.AllocateOp)
    assert allocate.dynamic_sizes[0].owner.value.value.data == 4


def test_extents_flow_through_segments_and_buffers():
    """The segment's output sizes come from the call's inputs; the matmul's from the buffers."""
    fb = FusionBuilder("chain")
    x = fb.input([None, None], "f32")
    w = fb.input([None, None], "f32")
    y = fb.matmul(fb.exp(x), w)
    fb.output(y)
    module = lower(fb.build())
    ops = list(host(module).body.block.ops)
    x_arg, w_arg = host(module).args
    allocations = [op for op in ops if isinstance(op, hir.AllocateOp)]
    dims = {(op.buffer, op.axis.data): op.result for op in ops if isinstance(op, hir.DimOp)}
    assert list(allocations[0].dynamic_sizes) == [dims[x_arg, 0], dims[x_arg, 1]]
    assert list(allocations[1].dynamic_sizes) == [dims[x_arg, 0], dims[w_arg, 1]]


# --------------------------------------------------------------------------- #
# Diagnostics                                                                  #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "module, message",
    [
        (
            lambda: resharding([2, 2], [0, 1], "didx _", [2, 3], "_ didx"),
            "fusion.set: cannot lower the change from mesh = [0, 1], axes = [didx, _] to "
            "mesh = [2, 3], axes = [_, didx]: no communication moves a didx axis to another axis",
        ),
        (
            lambda: resharding([2, 2], [0, 1], "didx _", [0, 1], "_ didx"),
            "no communication moves a didx axis to another axis",
        ),
        (
            lambda: resharding([2, None], [0, 1], "didx _", [2, 3], "_ _"),
            "no communication changes both the mesh and the didx axis",
        ),
        (
            lambda: resharding([None, 4], [0, 1], "_ _", [2, 3, 4], "_ _"),
            "pairs the devices one to one, so the meshes must have equal sizes",
        ),
        (
            lambda: resharding([2, None], [0, 1], "didx _", [0, 2], "didx _"),
            "device 0 is at the same position of both meshes",
        ),
        (
            lambda: resharding([None, 3], [0, 2, 4], "_ _", [0, 2, 4], "_ didx"),
            "its id minus 0 only in a mesh of consecutive devices",
        ),
        (
            lambda: reduction("sum", [None, 2], [0, 1], "_ didx", 1, [2, 3], "_"),
            "a reduction over the didx axis ends on the input's mesh or on a single device",
        ),
    ],
)
def test_sharding_changes_without_a_rule(module, message):
    with pytest.raises(HostirError) as error:
        lower(module())
    assert message in error.value.message
    assert error.value.message.startswith(error.value.op_name + ": cannot lower the change from ")


def test_a_resharding_compute_op_asks_for_insert_reshardings():
    module = reference_fusions.ag_matmul(4)
    with pytest.raises(HostirError) as error:
        FusionToHir().apply(hostir_context(), module)
    assert error.value.message == (
        "fusion.matmul: operand 0 `lhs` (input #0 of @ag_matmul) is at mesh = [0, 1, 2, 3], "
        "axes = [_, didx, _, _] but the op "
        "computes at mesh = [0, 1, 2, 3], axes = [stream, _, _, _]; run insert-reshardings "
        "first, which moves it with a fusion.set"
    )


def test_a_resharding_pointwise_op_asks_for_insert_reshardings():
    fb = FusionBuilder("neg")
    fb.output(fb.neg(fb.input([2, 3], "f32", mesh=[0, 1], axes=["didx", "_"])))
    module = fb.build()  # the result is replicated on the input's mesh
    expected = r"fusion.neg: operand 0 `input` \(input #0 of @neg\) is at .* run insert-reshardings"
    with pytest.raises(HostirError, match=expected):
        FusionToHir().apply(hostir_context(), module)


def test_a_didx_reduction_over_more_axes_asks_for_insert_reshardings():
    fb = FusionBuilder("total")
    fb.output(fb.sum(fb.input([2, None], "f32", mesh=[0, 1], axes=["didx", "_"]), [0, 1]))
    with pytest.raises(HostirError, match=r"also reduces axes \[1\]; insert-reshardings splits"):
        FusionToHir().apply(hostir_context(), fb.build())


# --------------------------------------------------------------------------- #
# Idempotence                                                                  #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", sorted(reference_fusions.REFERENCE_FUSIONS))
def test_every_reference_fusion_lowers_to_a_fixed_point(name):
    build = reference_fusions.REFERENCE_FUSIONS[name]
    module = lower(build(4) if "num_devices" in inspect.signature(build).parameters else build())
    assert not any(isinstance(op, fusion.FusionOp) for op in host(module).walk())


# --------------------------------------------------------------------------- #
# Running the lowered communications                                           #
# --------------------------------------------------------------------------- #

WORLD = 4

RUN_CASES = {
    "allgather": (lambda: resharding([4, 3], range(4), "didx _", range(4), "_ _"), lambda x: x),
    "allreduce": (
        lambda: reduction("sum", [3, 4], range(4), "_ didx", 1, range(4), "_"),
        lambda x: x.sum(1),
    ),
    "allreduce_max": (
        lambda: reduction("max", [3, 4], range(4), "_ didx", 1, range(4), "_"),
        lambda x: x.amax(1),
    ),
    "reduce_scatter": (
        lambda: reduction("sum", [4, 4, 3], range(4), "didx _ _", 0, range(4), "didx _"),
        lambda x: x.sum(0),
    ),
    "scatter": (lambda: resharding([4, 3], [2], "_ _", range(4), "didx _"), lambda x: x),
    "gather": (lambda: resharding([3, 3], [1, 2, 3], "_ didx", [1], "_ _"), lambda x: x),
    "broadcast": (lambda: resharding([2, 3], [3], "_ _", [0, 1, 2], "_ _"), lambda x: x),
    "reduce": (
        lambda: reduction("sum", [4, 3], range(4), "didx _", 0, [2], "_"),
        lambda x: x.sum(0),
    ),
    "send_recv": (lambda: resharding([2, 3], [0, 1], "didx _", [2, 3], "didx _"), lambda x: x),
    "local_slice": (lambda: resharding([3, 3], [1, 2, 3], "_ _", [1, 2, 3], "didx _"), lambda x: x),
    "subset_copy": (lambda: resharding([2, 3], range(4), "_ _", [1, 3], "_ _"), lambda x: x),
}


def local_piece(full: torch.Tensor, type: TensorType, rank: int) -> torch.Tensor:
    """What `rank` holds of a tensor of `type` whose whole value is `full`."""
    if rank not in type.mesh.ids:
        return torch.empty(0, dtype=full.dtype)
    if type.didx_axis is None:
        return full
    return full.narrow(type.didx_axis, type.mesh.ids.index(rank), 1)


def _nan_filled_empty(empty):
    def poisoned(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    return poisoned


def run_lowered(names: list[str]) -> list[list[torch.Tensor]]:
    """On one rank: each case's lowered program run on this rank's piece of a seeded input."""
    torch.empty = _nan_filled_empty(torch.empty)
    communicator = Communicator.from_env()
    outputs = []
    for name in names:
        module = RUN_CASES[name][0]()
        program = Program.compile(module, pipeline="insert-reshardings,fusion-to-hir")
        (input_type,) = program.input_types
        full = torch.randn(input_type.get_shape(), generator=torch.Generator().manual_seed(7))
        piece = local_piece(full, input_type, communicator.rank).to(communicator.device)
        outputs.append([out.cpu() for out in program.run([piece], communicator)])
    return outputs


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < WORLD,
    reason=f"with CUDA the ranks use NCCL, one GPU each: needs {WORLD} GPUs",
)
def test_lowered_communications_compute_what_torch_computes():
    names = sorted(RUN_CASES)
    per_rank = run_on_local_ranks(run_lowered, WORLD, names)
    for index, name in enumerate(names):
        build, reference = RUN_CASES[name]
        module = build()
        (input_type,) = host(module).function_type.inputs.data
        (output_type,) = host(module).function_type.outputs.data
        full = torch.randn(input_type.get_shape(), generator=torch.Generator().manual_seed(7))
        expected = reference(full)
        for rank in range(WORLD):
            (got,) = per_rank[rank][index]
            want = local_piece(expected, output_type, rank)
            if rank in output_type.mesh.ids:
                want = want.reshape(output_type.local_shape())
            torch.testing.assert_close(got, want, msg=f"{name} on rank {rank}")
