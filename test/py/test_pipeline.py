"""hir-lowering: the reference fusions, built with the Python builder, lowered by the default pipeline.

The tests check the lowered op sequence of every reference fusion (loops, what they
hold, where buffers are freed) on meshes of 8 and 4 devices, that the pipeline's
options reach stream-parallel, that canonicalize and cse keep every hir op with
effects while sharing the pure ones, and that lowering twice is lowering once. What
the lowered programs compute is checked end to end in test_e2e.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from xdsl.dialects import scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline
from xdsl.traits import is_side_effect_free
from xdsl.universe import Universe

from examples.reference_fusions import REFERENCE_FUSIONS
from hostir_dialect import hir, hostir_context
from hostir_dialect.fusion import Fusion
from hostir_dialect.hir import Hir
from hostir_dialect.text import HostirError, parse_module, print_module, verify_module
from hostir.passes import HOSTIR_PASSES, available_passes, driver
from hostir.passes.pipeline import HirLowering
from hostir.runtime.program import Program
from hostir.tools import hir_opt
from test_stream_parallel import (
    ALLOC,
    P2P,
    P2P_DEVICE_ORDER,
    RING_SETUP,
    SLICE,
    expand,
    host,
    loop,
    outline,
)

REPOSITORY = Path(__file__).resolve().parents[2]

FREE = "hir.deallocate"
PER_STREAM = "arith.minui"
"""min(extent, number_of_streams): the slices of a buffer that per-stream-buffers shares."""

EXPECTED_OUTLINES = {
    ("single_set", 0): [ALLOC, loop(SLICE, SLICE, "hir.copy")],
    ("single_set", 1): [ALLOC, loop(SLICE, SLICE, "hir.copy")],
    ("two_sets",): [PER_STREAM, ALLOC, ALLOC, loop(SLICE, SLICE, "hir.copy", SLICE, "hir.copy"), FREE],
    ("three_sets",): [
        ALLOC,
        loop(SLICE, SLICE, "hir.copy"),
        ALLOC,
        "hir.copy",
        FREE,
        ALLOC,
        loop(SLICE, SLICE, "hir.copy"),
        FREE,
    ],
    ("reduction",): [ALLOC, loop(SLICE, SLICE, "hir.reduction")],
    ("single_binary",): [ALLOC, loop(SLICE, SLICE, SLICE, "hir.launch_kernel")],
    ("matmul", 0): [ALLOC, loop(SLICE, SLICE, "hir.matmul")],
    ("matmul", 1): [ALLOC, loop(SLICE, SLICE, "hir.matmul")],
    ("linear",): [ALLOC, loop(SLICE, SLICE, "hir.linear")],
    ("ag_linear",): [
        PER_STREAM,
        ALLOC,
        ALLOC,
        loop(SLICE, SLICE, "hir.allgather", "hir.wait", SLICE, "hir.linear"),
        FREE,
    ],
    ("allgather",): [ALLOC, loop(SLICE, SLICE, "hir.allgather", "hir.wait")],
    ("allreduce",): [ALLOC, loop(SLICE, SLICE, "hir.allreduce", "hir.wait")],
    ("reduce_scatter",): [ALLOC, loop(SLICE, SLICE, "hir.reduce_scatter", "hir.wait")],
    ("ag_matmul",): [
        PER_STREAM,
        ALLOC,
        ALLOC,
        loop(SLICE, SLICE, "hir.allgather", "hir.wait", SLICE, "hir.matmul"),
        FREE,
    ],
    # allreduce-in-place: each chunk's GEMM writes into the output's slice, seen as the
    # partial sums (an adopted alias), which the allreduce sums in place.
    ("matmul_ar",): [
        ALLOC,
        loop(SLICE, SLICE, ALLOC, "hir.aten", "hir.matmul", "hir.allreduce", "hir.wait", FREE),
    ],
    ("matmul_rs_through_bcast",): [
        ALLOC,
        "hir.post_on_stream",
        PER_STREAM,
        ALLOC,
        ALLOC,
        loop(SLICE, SLICE, SLICE, "hir.matmul", SLICE, "hir.reduce_scatter", "hir.wait"),
        FREE,
        FREE,
    ],
    ("allgather_p2p",): [ALLOC, RING_SETUP, loop(*P2P)],
    ("ag_matmul_p2p",): [PER_STREAM, ALLOC, RING_SETUP, ALLOC, loop(*P2P, SLICE, "hir.matmul"), FREE],
}

MULTI_DEVICE = {
    "ag_linear",
    "allgather",
    "allreduce",
    "reduce_scatter",
    "ag_matmul",
    "matmul_ar",
    "matmul_rs_through_bcast",
    "allgather_p2p",
    "ag_matmul_p2p",
}

CASES = [
    (case, mesh)
    for case in EXPECTED_OUTLINES
    for mesh in ((8, 4) if case[0] in MULTI_DEVICE else (None,))
]


def build(case: tuple, num_devices: int | None) -> ModuleOp:
    name, *stream_axis = case
    arguments = {"stream_axis": stream_axis[0]} if stream_axis else {}
    if num_devices is not None:
        arguments["num_devices"] = num_devices
    return REFERENCE_FUSIONS[name](**arguments)


def lower(module: ModuleOp, lowering: HirLowering | None = None) -> ModuleOp:
    (lowering or HirLowering()).apply(hostir_context(), module)
    verify_module(module)
    return module


def case_id(case_mesh) -> str:
    case, mesh = case_mesh
    return "-".join(map(str, case)) + (f"-mesh{mesh}" if mesh else "")


@pytest.mark.parametrize("case,mesh", CASES, ids=map(case_id, CASES))
def test_lowered_op_sequence(case, mesh):
    function = host(lower(build(case, mesh)))
    assert outline(function.body.block) == expand(EXPECTED_OUTLINES[case], separate_sync_loop=True)
    teams = {op.team_ids for op in function.walk() if isinstance(op, hir.CommunicationOp)}
    assert teams <= {tuple(range(mesh))} if mesh else not teams


@pytest.mark.parametrize("name", REFERENCE_FUSIONS)
def test_lowering_twice_is_lowering_once(name):
    once = print_module(lower(REFERENCE_FUSIONS[name]()))
    assert print_module(lower(lower(REFERENCE_FUSIONS[name]()))) == once


def test_options_reach_stream_parallel():
    lowering = PassPipeline.parse_spec(
        HOSTIR_PASSES, "hir-lowering{p2p_backend=cuda separate_sync_loop=false copy_engine_pipelining=false}"
    ).passes[0]
    assert lowering == HirLowering(p2p_backend="cuda", separate_sync_loop=False, copy_engine_pipelining=False)
    function = host(lower(build(("ag_matmul_p2p",), 8), lowering))
    # The copy engines read the shard of A from a symmetric copy made before the loops;
    # the shards received, which no peer reads, still take one slice per stream.
    staged = [
        PER_STREAM,
        ALLOC,
        ALLOC,
        "hir.copy",
        RING_SETUP,
        ALLOC,
        loop(*P2P, SLICE, "hir.matmul"),
        FREE,
        FREE,
    ]
    assert outline(function.body.block) == expand(staged, separate_sync_loop=False)
    p2p = [op for op in function.walk() if isinstance(op, hir.SendOp | hir.RecvOp)]
    assert len(p2p) == 2 and {op.backend.data.value for op in p2p} == {"cuda"}
    (send,) = (op for op in p2p if isinstance(op, hir.SendOp))
    assert send.buffer.owner.symmetric is not None


def test_copy_engine_rings_are_software_pipelined_on_the_callers_stream_by_default():
    """copy-engine-pipelining runs in hir-lowering: the ring of a copy-engine point-to-point
    allgather leaves the pool streams, and its transfers' work is carried by the loop."""
    function = host(lower(build(("ag_matmul_p2p",), 8), HirLowering(p2p_backend="cuda")))
    ops = list(function.walk())
    assert not any(isinstance(op, hir.SetCurrentStreamOp | hir.SynchronizeStreamOp) for op in ops)
    (loop,) = (op for op in ops if isinstance(op, scf.ForOp))
    assert [arg.type for arg in loop.iter_args] == [hir.WorkType()]
    waits = [op for op in ops if isinstance(op, hir.WaitOp)]
    assert len(waits) == 2, "one in the loop, one after it"
    assert sum(isinstance(op, hir.EndCoalescingOp) for op in ops) == 2, "iteration 1's, and the loop's"


def test_device_order_without_per_stream_buffers_is_pr4515s_program():
    spec = "hir-lowering{p2p_order=device per_stream_buffers=false}"
    lowering = PassPipeline.parse_spec(HOSTIR_PASSES, spec).passes[0]
    assert lowering == HirLowering(p2p_order="device", per_stream_buffers=False)
    function = host(lower(build(("ag_matmul_p2p",), 8), lowering))
    pr4515 = [ALLOC, ALLOC, loop(*P2P_DEVICE_ORDER, SLICE, "hir.matmul"), FREE]
    assert outline(function.body.block) == expand(pr4515, separate_sync_loop=True)


def test_bad_option_is_an_error():
    with pytest.raises(HostirError, match="unknown p2p_backend 'mpi'"):
        lower(build(("allgather_p2p",), 8), HirLowering(p2p_backend="mpi"))
    with pytest.raises(HostirError, match="unknown p2p_order 'random'"):
        lower(build(("allgather_p2p",), 8), HirLowering(p2p_order="random"))


def effectful_ops(module: ModuleOp) -> Counter:
    """How many ops of each kind with effects (or unknown ones) the module holds."""
    return Counter(
        op.name for op in module.walk() if not op.regions and not is_side_effect_free(op)
    )


@pytest.mark.parametrize("name", REFERENCE_FUSIONS)
def test_canonicalize_and_cse_keep_every_op_with_effects(name):
    before_cleanup = REFERENCE_FUSIONS[name]()
    PassPipeline(
        tuple(
            HOSTIR_PASSES[p]()()
            for p in (
                "insert-reshardings",
                "fusion-to-hir",
                "stream-parallel",
                "allreduce-in-place",
                "insert-deallocations",
            )
        )
    ).apply(hostir_context(), before_cleanup)
    lowered = lower(REFERENCE_FUSIONS[name]())
    assert effectful_ops(lowered) == effectful_ops(before_cleanup)
    assert effectful_ops(lowered)["hir.synchronize_stream"] >= 2


# Two identical dims, streams and allocations, and two copies into the same buffer.
DUPLICATES = """
!t = !fusion.tensor<[?, 4], f32>
func.func @duplicates(%x: !t) -> !t {
  %n = hir.dim %x, 0 : !t
  %m = hir.dim %x, 0 : !t
  %a = hir.allocate(%n) : !t
  %b = hir.allocate(%m) : !t
  %c0 = arith.constant 0 : index
  %s = hir.stream %c0
  %t = hir.stream %c0
  hir.set_current_stream %s
  hir.copy ins(%x : !t) outs(%a : !t)
  hir.set_current_stream %t
  hir.copy ins(%x : !t) outs(%a : !t)
  hir.copy ins(%a : !t) outs(%b : !t)
  func.return %b : !t
}
"""


def test_cse_shares_pure_hir_ops_and_keeps_the_others():
    module = lower(parse_module(DUPLICATES))
    names = Counter(op.name for op in host(module).walk())
    assert names["hir.dim"] == 1 and names["hir.stream"] == 1
    assert names["hir.allocate"] == 2 and names["hir.copy"] == 3
    assert names["hir.set_current_stream"] == 2 and names["hir.deallocate"] == 1


# --------------------------------------------------------------------------- #
# The drivers: hir-opt, Program.compile and hir-run read and run pipelines alike #
# --------------------------------------------------------------------------- #

AG_LINEAR = (REPOSITORY / "examples" / "ag_linear.mlir").read_text()


def test_hir_lowering_runs_as_its_passes():
    """A pipeline pass is expanded into its passes, which the drivers run, time and print by name."""
    lowering = HirLowering(per_stream_buffers=False)
    names = [p.name for p in driver.expand([lowering])]
    assert names == [p.name for p in lowering.passes()]
    assert names[:5] == ["cat-to-rotate-half", "flatten-rows", "insert-reshardings", "fusion-to-hir", "stream-parallel"]
    assert "per-stream-buffers" not in names and names[-2:] == ["canonicalize", "cse"]
    ran = []
    driver.run_passes(
        driver.parse_pass_pipeline("hir-lowering{per-stream-buffers=false},dce", available_passes()),
        hostir_context(),
        build(("allgather",), 2),
        verify=True,
        after=lambda done, module, seconds: ran.append(done.name),
    )
    assert ran == [*names, "dce"]


@pytest.mark.parametrize(
    "pipeline",
    [
        "no-such-pass",
        "cse,stream-paralel",
        "cse,,dce",
        "fusion-to-hir{bakend=cuda}",
        "hir-lowering{backend=ucc}",
        "stream-parallel{separate-sync-loop=maybe}",
        # A pass that fails: fusion-to-hir without insert-reshardings before it.
        "fusion-to-hir",
    ],
)
def test_program_compile_reports_a_pipeline_error_as_hir_opt_does(pipeline, tmp_path, capsys):
    path = tmp_path / "ag_linear.mlir"
    path.write_text(AG_LINEAR)
    with pytest.raises(HostirError) as raised:
        Program.compile(AG_LINEAR, pipeline=pipeline, filename=str(path))
    assert hir_opt.main([str(path), "-p", pipeline]) == 1
    assert capsys.readouterr().err == f"{raised.value}\n"
    assert str(raised.value).startswith("pass-pipeline:1:" if pipeline != "fusion-to-hir" else f"{path}:10:")


def test_a_pipeline_of_xdsl_passes_compiles():
    """Program.compile knows every pass hir-opt knows, xDSL's among them."""
    program = Program.compile(AG_LINEAR, pipeline="hir-lowering,licm,dce")
    assert program.host.sym_name.data == "ag_linear"


def test_xdsl_finds_hostir_through_its_plugin_entry_point():
    """`pip install` registers `passes:HOSTIR_UNIVERSE` in the `xdsl.universe` group, where
    xdsl-opt and xdsl-run look for dialects and passes."""
    multiverse = Universe.get_multiverse()
    assert multiverse.all_dialects["fusion"]() is Fusion
    assert multiverse.all_dialects["hir"]() is Hir
    assert {name: multiverse.all_passes[name] for name in HOSTIR_PASSES} == HOSTIR_PASSES
    assert {"licm", "convert-scf-to-cf"} <= set(available_passes())


def test_program_repr_shows_the_signature_the_world_and_the_teams():
    program = Program.compile(AG_LINEAR)
    x, w, b = program.input_types
    (out,) = program.output_types
    assert repr(program) == (
        f"<Program @ag_linear({x}, {w}, {b}) -> ({out}); needs 4 rank(s); "
        "teams [0, 1, 2, 3]; lowered from its fusion>"
    )
    assert repr(Program.compile(program.module, pipeline=None)).endswith("; given lowered>")
