"""torch.compile(backend="hostir"): tensor-parallel modules, forward and backward, against eager.

The distributed cases run on CPU ranks with gloo and compare with the same module run
eagerly with DTensor (torch's own tensor parallelism), from the same weights and
inputs: the forward output, the input's gradient and every parameter's gradient.
"""

from __future__ import annotations

import collections
import contextlib
import io
import math
import os
import re
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from xdsl.traits import SymbolTable

from examples.tp_decoder_layer import DecoderLayer, parallelize, rank_device, train
from hostir_dialect import fusion, hir
from hostir_dialect.builder import torch_dtype
from hostir_dialect.text import HostirError, parse_module
from hostir.frontend.backend import BackendOptions, HostirFallbackWarning, Parameters
from hostir.passes.analysis.cost_model import OverlapKind, OverlapProblem
from hostir.runtime.codegen.kernels import generated_source
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.distributed.copy_engine import why_not_copy_engines
from hostir.runtime.graphs import GraphReplayFallback
from hostir.runtime.launch import run_on_local_ranks
from test_communicator import needs_ranks


def _without_fallback(fn, *args):
    """`fn(*args)` on a rank, where a graph that hostir would run as torch eager ops
    (`HostirFallbackWarning`) is an error, as pyproject.toml's filter makes it in pytest's own
    process: a test of hostir must not pass on eager's results. (A rank is a process of its
    own, with the warning filters it started with.)"""
    warnings.simplefilter("error", HostirFallbackWarning)
    return fn(*args)


def run_on_hostir(fn, nproc: int, *args, timeout_s: float) -> list:
    """`run_on_local_ranks(fn, nproc, *args)`, each rank `_without_fallback`."""
    return run_on_local_ranks(_without_fallback, nproc, fn, *args, timeout_s=timeout_s)


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6)


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.full_tensor() for name, p in module.named_parameters()}


def _errors_against_eager(
    out: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, x_eager: torch.Tensor, module: nn.Module, eager: nn.Module
) -> dict[str, float]:
    """The largest errors of a compiled module's output, its input's gradient and its
    parameters' gradients (whole) against eager's."""
    errors = {"output": _max_error(out, expected), "input": _max_error(x.grad, x_eager.grad)}
    for name, grad in _grads(module).items():
        errors[name] = _max_error(grad, _grads(eager)[name])
    return errors


@contextlib.contextmanager
def _dumped(kinds: str):
    """HOSTIR_DUMP set to `kinds`; yields the text the backend printed."""
    stderr = io.StringIO()
    os.environ["HOSTIR_DUMP"] = kinds
    try:
        with contextlib.redirect_stderr(stderr):
            yield stderr
    finally:
        del os.environ["HOSTIR_DUMP"]


def _layer_on_rank(sequences: tuple[int, ...], dtype: torch.dtype, batch: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)
    reference = DecoderLayer()
    hostir_layer, eager_layer = DecoderLayer().to(device, dtype), DecoderLayer().to(device, dtype)
    for layer in (hostir_layer, eager_layer):
        layer.load_state_dict(reference.state_dict())
        parallelize(layer, mesh)
    # NCCL's lowering, whose collectives the test names (on GPUs, `auto` takes the copy engines).
    compiled = torch.compile(hostir_layer, backend="hostir", options={"chunks": 2, "backend": "nccl"})
    errors: dict[str, float] = {}
    with _dumped("fusion,host_ir") as dump:
        for sequence in sequences:
            torch.manual_seed(sequence)
            x = torch.randn(batch, sequence, 64, dtype=dtype).chunk(world, dim=1)[rank].to(device)
            x_hostir, x_eager = x.clone().requires_grad_(), x.clone().requires_grad_()
            out = compiled(x_hostir)
            expected = eager_layer(x_eager)
            (out * expected.detach()).sum().backward()
            (expected * expected.detach()).sum().backward()
            errors[f"output (sequence {sequence})"] = _max_error(out, expected)
            errors[f"input gradient (sequence {sequence})"] = _max_error(x_hostir.grad, x_eager.grad)
            for name, grad in _grads(hostir_layer).items():
                errors[f"{name} gradient (sequence {sequence})"] = _max_error(grad, _grads(eager_layer)[name])
            hostir_layer.zero_grad()
            eager_layer.zero_grad()
    return {"errors": errors, "dump": dump.getvalue()}


TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
"""Largest error relative to the largest eager value.

f32: hostir sums in another order than eager (a GEMM's K in chunks, partial products summed
across ranks by a pipelined reduce-scatter, fused pointwise runs), and each value compared
is at the end of a chain of at most about ten reductions (GEMMs of K <= 256, softmax,
RMSNorm, forward then backward). A sum of K terms reordered moves by about sqrt(K) roundings
of its largest term (random signs), 16 * 2**-24 = 1e-6 of it at K = 256, so ten of them stay
within 1e-5. Measured on the tests here: at most 4e-7 (the whole model's gradients), 2.6e-7
(the layer at 4 ranks), 1.2e-7 (the AdamW losses), 9e-8 (the MLP).

bf16: eager rounds every op's result to bf16 where hostir's fused kernels keep f32 between
pointwise ops (and the other way round): a few bf16 roundings of 2**-8 = 4e-3 each.
"""
F32_TOLERANCE = TOLERANCES[torch.float32]


@pytest.mark.parametrize(
    "world, dtype, batch, sequences",
    [
        pytest.param(4, torch.float32, 1, (16,), marks=needs_ranks(4)),
        pytest.param(2, torch.bfloat16, 2, (16, 24), marks=needs_ranks(2)),
    ],
)
def test_decoder_layer_forward_and_gradients_match_eager_dtensor(world, dtype, batch, sequences):
    """The layer at 4 ranks in f32, and at 2 in bf16, there followed by a new sequence
    length (a recompilation, with the sizes that dynamo then makes symbolic). The AdamW
    test runs it at 2 ranks in f32. (Every rank compiles each graph: the 4-rank case
    compiles once, to keep the suite's time.)

    With a batch of one sequence, sequence parallelism's all-gathers and reduce-scatters
    are pipelined with the GEMMs next to them (in the backward, the reduce-scatters of the
    input gradients' sums of GEMMs too); with two, the sequences' pieces are
    interleaved in the gathered tensor, which the importer keeps as a permutation of
    the pieces, and all of them are pipelined still."""
    results = run_on_hostir(_layer_on_rank, world, sequences, dtype, batch, timeout_s=600)
    for rank, result in enumerate(results):
        bad = {what: error for what, error in result["errors"].items() if error > TOLERANCES[dtype]}
        assert not bad, f"rank {rank}: {bad}"
        assert len(result["errors"]) == len(sequences) * (2 + len(list(DecoderLayer().parameters())))
    dump = results[0]["dump"]
    assert "HostirFallbackWarning" not in dump
    assert not _unplannable_kernels(dump)
    # What hostir understood, and what it calls ATen for.
    assert "fusion.set" in dump and "fusion.sum" in dump and "fusion.matmul" in dump
    assert "= fusion.attention " in dump and "= fusion.attention_backward " in dump
    # The collectives are communication ops (an all-gather that is a ring: sends and receives).
    assert "hir.reduce_scatter" in dump and ("hir.allgather" in dump or "hir.recv" in dump)
    assert results[1]["dump"] == "", "only the first rank of the mesh dumps"
    # A forward and a backward per sequence length: the graphs that dynamo recompiled with
    # a symbolic length are pipelined as the first ones are.
    programs = dump.split("// hostir: the host program of graph ")[1:]
    assert len(programs) == 2 * len(sequences), [program.split()[0] for program in programs]
    for sequence, forward, backward in zip(sequences, programs[0::2], programs[1::2]):
        pipelined = [body for body in _loops(forward) if "hir.matmul" in body]
        backward_pipelined = [body for body in _loops(backward) if "hir.matmul" in body]
        # Attention's QKV and the MLP's up projections on the ring, wo and w2 in chunks. With
        # two sequences, their pieces stay an axis of the gathered tensor (a permutation, not
        # a reshape): the rings, and the reduce-scatters sequence by sequence.
        assert sum("hir.recv" in body for body in pipelined) == 2, forward
        assert sum("hir.reduce_scatter" in body for body in pipelined) == 2, forward
        # The backward's input gradients through QKV and through w1 and w3 are sums of
        # GEMMs, reduce-scattered chunk by chunk (sequence by sequence).
        assert sum(
            "hir.reduce_scatter" in body and body.count("hir.matmul") >= 2 for body in backward_pipelined
        ) == 2, backward
        if batch > 1:
            # The activations the forward saves stay in their pieces' layout, which the
            # backward reads as they are (`SavedLayouts`): the forward copies a piece into the
            # FX layout for attention's q, k and v alone, and the backward the weight
            # gradients' operands that attention gives in the FX layout ([T, dim / D] each) and
            # attention's input gradient; the products the weight gradients contract over the
            # rows read the pieces in their order (8 copies, 13 in the FX layout).
            fx_copies = [_copies_out_of_a_layout(forward), _copies_out_of_a_layout(backward)]
            assert [len(copies) for copies in fx_copies] == [3, 5], fx_copies
            assert all(
                shape[-1] <= 64 // world and math.prod(shape) <= batch * sequence * 64 // world
                for copies in fx_copies
                for shape in copies
            ), fx_copies


def _layer_with_an_eager_backward() -> dict:
    """The layer of two sequences, hostir's backward graph refused at its import: the
    forward hands over its saved activations in their pieces' layout, and the backward,
    run as torch eager ops, reads them in the FX layout after all."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hostir.frontend import backend
    from hostir.frontend.importer import UnsupportedGraph

    def forward_only(gm, name, *args):
        if name.startswith("backward"):
            raise UnsupportedGraph("the test refuses backward graphs")
        return imported(gm, name, *args)

    imported, backend.import_graph = backend.import_graph, forward_only
    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)
    layers = [parallelize(DecoderLayer().to(device), mesh) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    compiled = torch.compile(layers[0], backend="hostir", options={"backend": "cuda"})
    x = torch.randn(2, 16, 64).chunk(world, dim=1)[rank].to(device)
    inputs = [x.clone().requires_grad_() for _ in layers]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = [compiled(inputs[0]), layers[1](inputs[1])]
        for out in outputs:
            (out * outputs[1].detach()).sum().backward()
    forward = [graph for graph in backend.compiled_graphs() if graph.forward][-1]
    errors = {"input gradient": _max_error(inputs[0].grad, inputs[1].grad)}
    for name, grad in _grads(layers[0]).items():
        errors[name] = _max_error(grad, _grads(layers[1])[name])
    return {
        "errors": errors,
        "layouts": [layout for _, layout in forward.saved_layouts.layouts.values() if layout is not None],
        "warnings": [str(w.message) for w in caught if issubclass(w.category, HostirFallbackWarning)],
    }


@needs_ranks(2)
def test_a_backward_run_eagerly_reads_the_saved_activations_in_the_fx_layout():
    """An activation the forward saves is handed to the backward in its pieces' layout; a
    backward that hostir refuses turns it into the FX layout before torch's ops read it,
    and its gradients are eager's."""
    for rank, result in enumerate(run_on_local_ranks(_layer_with_an_eager_backward, 2, timeout_s=300)):
        assert result["layouts"], "the forward handed over nothing in a layout of its own"
        # The first rank of the mesh speaks for all.
        assert len(result["warnings"]) == (rank == 0)
        assert all("the test refuses backward graphs" in warning for warning in result["warnings"])
        bad = {what: error for what, error in result["errors"].items() if error > F32_TOLERANCE}
        assert not bad, f"rank {rank}: {bad}"


def test_saved_layouts_are_kept_from_the_first_compilation_and_checked_by_the_backward():
    """A saved tensor that the caller does not get may keep its piece's layout; once a
    compilation chose, a later one must keep that layout (the backward reads what it is
    given); the backward takes it for its input of that place, shape and dtype, and refuses
    a placeholder that is not the node the forward handed over."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from hostir.frontend.backend import SavedLayouts
    from hostir.frontend.importer import Layout

    def forward(x, w):
        y = x @ w
        z = y.relu()
        return (z, y, z)  # z to the caller; y and z saved

    gm = torch.fx.symbolic_trace(forward)
    FakeTensorProp(gm).propagate(torch.randn(4, 6), torch.randn(6, 8))
    items = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])
    saved, layouts = slice(1, 3), SavedLayouts()
    first = layouts.of_outputs(saved, items)
    assert (first.outputs, first.free_outputs) == ({}, {1}), "z is returned to the caller too"
    chosen = Layout((2, 2, 8), (1, 0, 2))
    layouts.record(saved, {1: chosen}, items)
    again = layouts.of_outputs(saved, items)
    assert (again.outputs, again.free_outputs) == ({1: chosen}, frozenset())

    def backward(matmul, relu, tangent):
        return (tangent * matmul,)

    args = [torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)]
    assert layouts.of_inputs(torch.fx.symbolic_trace(backward), args) == {0: chosen}

    def misnamed(other, relu, tangent):
        return (tangent * other,)

    with pytest.raises(HostirError, match=r"saved tensor #0 is 'other', where the forward graph handed over 'matmul'"):
        layouts.of_inputs(torch.fx.symbolic_trace(misnamed), args)


def _copies_out_of_a_layout(program: str) -> list[tuple[int, ...]]:
    """The shapes into which `program` reshapes a permuted piece (a copy, where its FX tensor
    is not a view of the piece), without the device axis."""
    permuted = set(re.findall(r'hir\.aten "aten\.permute\.default"\((%\w+)[^)]*\).*?outs\((%\w+)', program, re.S))
    outs = {out for _, out in permuted}
    reshapes = re.findall(r'hir\.aten "aten\.reshape\.default"\((%\w+), \[([\d, ]*)\]\)', program)
    return [tuple(int(extent) for extent in shape.split(", ")) for source, shape in reshapes if source in outs]


@needs_ranks(2)
def test_adamw_steps_track_eager():
    """Ten AdamW steps of the layer: the losses with hostir track the eager ones."""
    (losses, *_) = run_on_hostir(train, 2, 10, timeout_s=600)
    for step, (hostir_loss, eager_loss) in enumerate(losses):
        assert hostir_loss == pytest.approx(eager_loss, rel=F32_TOLERANCE), f"step {step}"
    assert losses[-1][0] != losses[0][0], "the weights changed"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def mlp_plan(sequence_parallel: bool) -> dict:
    """The MLP tensor parallel, its rows sharded between the blocks (`sequence_parallel`) or replicated."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if sequence_parallel:
        return {"up": ColwiseParallel(input_layouts=Shard(0)), "down": RowwiseParallel(output_layouts=Shard(0))}
    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def _mlp_on_rank(sequence_parallel: bool, checkpointed: bool = False) -> dict:
    """The MLP, tensor parallel with its rows sharded between the blocks (`sequence_parallel`)
    or replicated, compiled with two chunks, against eager DTensor; `checkpointed`: the
    compiled module runs under activation checkpointing, again in the backward."""
    from torch.utils.checkpoint import checkpoint

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    mesh = init_device_mesh(device.type, (world,))
    modules = [parallelize_module(module, mesh, mlp_plan(sequence_parallel)) for module in copies(MLP)]
    x = torch.randn(16, 16)
    x = (x.chunk(world)[rank] if sequence_parallel else x).to(device)
    x_hostir, x_eager = x.clone().requires_grad_(), x.clone().requires_grad_()
    with _dumped("host_ir") as dump:
        # NCCL's lowering, as in _layer_on_rank.
        compiled = torch.compile(modules[0], backend="hostir", options={"chunks": 2, "backend": "nccl"})
        out = checkpoint(compiled, x_hostir, use_reentrant=False) if checkpointed else compiled(x_hostir)
        out.sum().backward()
    expected = modules[1](x_eager)
    expected.sum().backward()
    errors = _errors_against_eager(out, expected, x_hostir, x_eager, *modules)
    return {"errors": errors, "dump": dump.getvalue()}


class ProjectionPair(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False))


def _sequence_parallel_pair_on_rank() -> dict[str, float]:
    """A bare pair of projections, sequence parallel over two sequences (`[2, 6, 8]`, each
    rank its 3 tokens of each), compiled with the default options, against eager DTensor:
    the errors of the output and of the gradients."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(rank_device().type, (world,))
    plan = {"0": ColwiseParallel(input_layouts=Shard(1)), "1": RowwiseParallel(output_layouts=Shard(1))}
    modules = [parallelize_module(module, mesh, plan) for module in copies(ProjectionPair)]
    x = torch.randn(2, 6, 8).chunk(world, dim=1)[rank].to(rank_device())
    x_hostir, x_eager = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = torch.compile(modules[0], backend="hostir")(x_hostir)
    out.square().sum().backward()
    expected = modules[1](x_eager)
    expected.square().sum().backward()
    return _errors_against_eager(out, expected, x_hostir, x_eager, *modules)


@needs_ranks(2)
def test_a_sequence_parallel_pair_over_two_sequences_matches_eager():
    """The all-gather of both sequences' chunks pipelines into the first projection, and the
    reduce-scatter of the second, whose chunks would be the sequences (another axis of the
    same values), is left whole: the program lowers (it did not), and matches eager."""
    for rank, errors in enumerate(run_on_hostir(_sequence_parallel_pair_on_rank, 2, timeout_s=300)):
        assert max(errors.values()) < F32_TOLERANCE, f"rank {rank}: {errors}"


def _loops(program: str) -> list[str]:
    """The bodies of the `scf.for` loops of a printed host program (to the closing brace
    at the loop's own indentation)."""
    return [
        body
        for indent in sorted(set(re.findall(r"\n( *)scf\.for ", program)))
        for body in re.findall(rf"\n{indent}scf\.for [^\n]*\{{\n(.*?)\n{indent}\}}", program, re.S)
    ]


def _unplannable_kernels(dump: str) -> list[str]:
    """The fused segments of the dumped host programs whose kernel (the one a GPU runs)
    cannot be planned on buffers of the shapes the launch declares, with the reason.
    The plan needs no GPU: it is the iteration space, every buffer mapped onto it."""
    problems = []
    for program in dump.split("// hostir: the host program of graph ")[1:]:
        # The module's text, up to its closing brace (a warning may follow it).
        text = program.split("\n", 1)[1].split("\n}\n", 1)[0] + "\n}\n"
        module = parse_module(text, "<dump>")
        for launch in module.walk():
            if not isinstance(launch, hir.LaunchKernelOp):
                continue
            buffers = [
                torch.empty(fusion.tensor_type(v).local_shape(), dtype=torch_dtype(fusion.tensor_type(v).element_type))
                for v in (*launch.ins, *launch.outs)
            ]
            segment = SymbolTable.lookup_symbol(launch, launch.callee)
            try:
                generated_source(segment, buffers[: len(launch.ins)], buffers[len(launch.ins) :])
            except HostirError as error:
                problems.append(str(error))
    return problems


def _mlp_programs(sequence_parallel: bool) -> list[str]:
    """The MLP's forward and backward host programs on 2 ranks, after checking its numbers."""
    results = run_on_hostir(_mlp_on_rank, 2, sequence_parallel, timeout_s=300)
    for rank, result in enumerate(results):
        assert max(result["errors"].values()) < F32_TOLERANCE, f"rank {rank}: {result['errors']}"
    programs = results[0]["dump"].split("// hostir: the host program of graph ")[1:]
    assert [p.split()[0].split("_")[0] for p in programs] == ["forward", "backward"]
    return programs


def _steps_on_rank(steps: int) -> dict:
    """The sequence-parallel MLP compiled and trained `steps` steps beside eager DTensor, each
    step on new inputs: each step's errors, and how often each program checked its inputs
    (`Program.check`, which exchanges a row with every peer) and ran."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from hostir.frontend.backend import compiled_graphs
    from hostir.runtime.program import Program

    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(rank_device().type, (world,))
    modules = [parallelize_module(module, mesh, mlp_plan(True)) for module in copies(MLP)]
    compiled = torch.compile(modules[0], backend="hostir", options={"chunks": 2, "backend": "nccl"})
    checks, runs = collections.Counter(), collections.Counter()
    check, run_checked = Program.check, Program.run_checked

    def counted_check(program, *args):
        checks[program.host.sym_name.data] += 1
        return check(program, *args)

    def counted_run(program, *args, **kwargs):
        runs[program.host.sym_name.data] += 1
        return run_checked(program, *args, **kwargs)

    Program.check, Program.run_checked = counted_check, counted_run
    errors, checked = [], []
    for step in range(steps):
        torch.manual_seed(step)
        x = torch.randn(16, 16).chunk(world)[rank].to(rank_device())
        x_hostir, x_eager = x.clone().requires_grad_(), x.clone().requires_grad_()
        for module in modules:
            module.zero_grad()
        out, expected = compiled(x_hostir), modules[1](x_eager)
        (out * expected.detach()).sum().backward()
        (expected * expected.detach()).sum().backward()
        errors.append(_errors_against_eager(out, expected, x_hostir, x_eager, *modules))
        checked.append(dict(checks))
    graphs = [graph for graph in compiled_graphs() if graph.compiled]
    return {"errors": errors, "checked": checked, "runs": dict(runs), "static": [g.static for g in graphs]}


@needs_ranks(2)
def test_a_graph_checks_its_inputs_across_ranks_at_its_first_call_only():
    """A compiled graph's later calls have the shapes, dtypes and devices of its first (dynamo's
    guards, for the graphs of static shapes that a DTensor module's are, its mesh argument
    included): each program checks its inputs across ranks at the first call alone, and every
    step still matches eager DTensor. On the CPU the first call checks once and every call runs
    the checked program; on GPUs the first call's warm-up runs check and capture a CUDA graph,
    which the later calls replay."""
    steps = 3
    replays = torch.cuda.is_available()
    for rank, result in enumerate(run_on_hostir(_steps_on_rank, 2, steps, timeout_s=300)):
        for step, errors in enumerate(result["errors"]):
            assert max(errors.values()) < F32_TOLERANCE, f"rank {rank}, step {step}: {errors}"
        assert result["static"] == [True, True], f"rank {rank}"
        first, *later = result["checked"]
        assert len(first) == 2 and all(checks == first for checks in later), f"rank {rank}: {result}"
        if not replays:
            assert first == dict.fromkeys(first, 1), f"rank {rank}: {result}"
            assert result["runs"] == dict.fromkeys(first, steps), f"rank {rank}: {result}"


def _replaced_parameters_on_rank() -> dict:
    """The tensor-parallel MLP compiled where dynamo skips the modules' guards, run on random
    inputs beside eager DTensor; then with its first layer's weight replaced by another of its
    shape, then with the hidden width of both layers changed: the errors of the first two
    runs, and what the third raised."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    world = dist.get_world_size()
    mesh = init_device_mesh(rank_device().type, (world,))
    modules = [parallelize_module(module, mesh, mlp_plan(False)) for module in copies(MLP)]
    options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe, "backend": "nccl"}
    compiled = torch.compile(modules[0], backend="hostir", options=options)

    def replace(name: str, full: torch.Tensor, placement) -> None:
        for module in modules:
            owner, attribute = name.rsplit(".", 1)
            value = distribute_tensor(full.to(rank_device()), mesh, [placement])
            setattr(module.get_submodule(owner), attribute, nn.Parameter(value))

    def error() -> float:
        torch.manual_seed(1)
        x = torch.randn(8, 16).to(rank_device())
        with torch.no_grad():
            return _max_error(compiled(x), modules[1](x))

    errors = [error()]
    torch.manual_seed(2)
    replace("up.weight", torch.randn(32, 16), Shard(0))
    errors.append(error())
    replace("up.weight", torch.randn(40, 16), Shard(0))
    replace("up.bias", torch.randn(40), Shard(0))
    replace("down.weight", torch.randn(16, 40), Shard(1))
    try:
        error()
    except HostirError as raised:
        return {"errors": errors, "raised": str(raised)}
    return {"errors": errors, "raised": None}


@needs_ranks(2)
def test_a_parameter_replaced_where_dynamo_skips_the_modules_guards_is_read_or_refused():
    """Under torch's guard filter that skips the modules' guards no guard sees a parameter
    replaced: one of the same shape is read where it is, and one of another shape, which the
    graph was not compiled for, is refused with the input and both shapes, on every rank,
    before anything is exchanged but the check."""
    world = 2
    for rank, result in enumerate(run_on_hostir(_replaced_parameters_on_rank, world, timeout_s=300)):
        assert max(result["errors"]) < F32_TOLERANCE, f"rank {rank}: {result}"
        raised = result["raised"]
        assert raised is not None, f"rank {rank}: the MLP of another width ran"
        expected = rf"input #\d+ of @\w+ on rank {rank}: expected local shape \[1, {32 // world}, 16\] .*, got \[{40 // world}, 16\]"
        assert re.search(expected, raised), f"rank {rank}: {raised}"


@needs_ranks(2)
def test_all_gather_and_reduce_scatter_are_pipelined_with_their_matmuls():
    """ColwiseParallel after a Shard(0) input, RowwiseParallel to a Shard(0) output: in the
    forward and in the backward, the all-gather is a ring of point-to-point transfers in the
    loop of its matmul, and the reduce-scatter runs chunk by chunk in the loop of the
    matmul that computes it."""
    for program in _mlp_programs(sequence_parallel=True):
        loops = _loops(program)
        assert any("hir.recv" in body and "hir.matmul" in body for body in loops), program
        assert any("hir.reduce_scatter" in body and "hir.matmul" in body for body in loops), program


@needs_ranks(2)
def test_allreduce_is_pipelined_with_its_matmul():
    """ColwiseParallel, then RowwiseParallel to a replicated output: the forward's allreduce
    of the second matmul's product, and the backward's of the input gradient, run chunk by
    chunk in the loop of the matmul that computes them."""
    for program in _mlp_programs(sequence_parallel=False):
        assert any("hir.allreduce" in body and "hir.matmul" in body for body in _loops(program)), program


def test_a_graph_that_holds_a_tensor_constant_takes_it_as_an_argument():
    """A constant of the traced code (here the fill value of a masked write) is an
    attribute of the FX graph; it reaches the program as an argument, unchanged."""

    def f(x):
        y = x.clone()
        y[x < 0] = torch.tensor(7.0)
        return y * 2

    x = torch.randn(64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostirFallbackWarning)
        out = torch.compile(f, backend="hostir")(x)
    assert torch.equal(out, f(x))
    from hostir.frontend.backend import compiled_graphs

    graph = compiled_graphs()[-1]
    (constant,) = graph.constants
    assert torch.equal(constant, torch.tensor(7.0))
    # The masked write is a `where`, which a CUDA graph can capture (no count on the host).
    assert "aten.index_put" not in graph.gm.code and "aten.where.self" in graph.gm.code


def test_only_a_masked_write_of_one_value_over_leading_axes_becomes_a_where():
    from torch.fx.experimental.proxy_tensor import make_fx

    from hostir.frontend.fx_rewrites import masked_writes_as_where

    def writes(x, mask, rows, v, vs):
        index_put = torch.ops.aten.index_put.default
        return (
            index_put(x, [mask], v),  # a where
            index_put(x, [mask], v, True),  # accumulates
            index_put(x, [rows], v),  # integer indices
            index_put(x, [mask], vs),  # one value per row written
        )

    x, mask, rows, v = torch.randn(4, 3), torch.tensor([True, False, True, False]), torch.tensor([0, 2]), torch.tensor(5.0)
    vs = torch.randn(2, 3)
    gm = make_fx(writes)(x, mask, rows, v, vs)
    assert masked_writes_as_where(gm)
    targets = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.aten.index_put.default) == 3 and torch.ops.aten.where.self in targets
    for got, expected in zip(gm(x, mask, rows, v, vs), writes(x, mask, rows, v, vs)):
        assert torch.equal(got, expected)


class Llama(nn.Module):
    """Token embeddings, two decoder layers, a norm and the output projection."""

    def __init__(self, vocabulary: int = 128, dim: int = 64):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocabulary, dim)
        self.layers = nn.ModuleList([DecoderLayer(dim) for _ in range(2)])
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocabulary, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def parallelize_llama(model: Llama, mesh) -> Llama:
    """torchtitan's plan: the vocabulary sharded in the embeddings and the output (whose
    logits stay DTensors, for `loss_parallel`), each layer as `parallelize` makes it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }
    parallelize_module(model, mesh, plan)
    for layer in model.layers:
        parallelize(layer, mesh)
    return model


def copies(module: type[nn.Module], count: int = 2) -> list[nn.Module]:
    """`count` `module()`s with the same random weights, on this rank's device: one to
    compile, one to run eagerly, ..."""
    torch.manual_seed(0)
    reference = module()
    made = [module().to(rank_device()) for _ in range(count)]
    for copy in made:
        copy.load_state_dict(reference.state_dict())
    return made


def _llama_on_rank(model: type[Llama]) -> dict:
    """The model with torchtitan's plan (the vocabulary sharded in the embeddings and the
    output, the loss computed on the sharded logits), one training step against eager DTensor."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    models = [parallelize_llama(copy, mesh) for copy in copies(model)]
    tokens, targets = (torch.randint(0, 128, (2, 16)).to(rank_device()) for _ in range(2))
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", HostirFallbackWarning)
        warnings.simplefilter("always", GraphReplayFallback)
        for model in (torch.compile(models[0], backend="hostir"), models[1]):
            with loss_parallel():
                loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
                loss.backward()
            losses.append(loss.full_tensor().item())
    errors = {name: _max_error(grad, _grads(models[1])[name]) for name, grad in _grads(models[0]).items()}
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, (HostirFallbackWarning, GraphReplayFallback))]
    # f32 attention on GPUs returns its random seed on the CPU, which the backward takes back:
    # that graph runs eagerly (GraphReplayer), the others replay.
    fallbacks = [f for f in fallbacks if not re.search(r"@backward_\d+ runs eagerly: input #\d+ is on the CPU", f)]
    return {"losses": losses, "errors": errors, "fallbacks": fallbacks}


def assert_the_whole_model_runs_on_hostir(model: type[Llama]) -> None:
    """Every graph of `model` with torchtitan's plan is hostir's, replayed as a CUDA graph on
    GPUs, and the loss and every gradient of a training step match eager DTensor's, on 2 ranks."""
    for rank, result in enumerate(run_on_hostir(_llama_on_rank, 2, model, timeout_s=600)):
        assert not result["fallbacks"], f"rank {rank}: {result['fallbacks']}"
        hostir_loss, eager_loss = result["losses"]
        assert hostir_loss == pytest.approx(eager_loss, rel=F32_TOLERANCE), f"rank {rank}"
        assert max(result["errors"].values()) < F32_TOLERANCE, f"rank {rank}: {result['errors']}"


@needs_ranks(2)
def test_a_whole_model_with_vocabulary_parallel_embeddings_and_loss_runs_on_hostir():
    """The embeddings' masked lookup holds tensor constants, and its masked writes are
    `where`s, which a CUDA graph captures."""
    assert_the_whole_model_runs_on_hostir(Llama)


def _layer_on_a_tensor_parallel_axis(fsdp: bool) -> dict:
    """The layer tensor-parallel on the inner axis of a 2 x 2 mesh, data parallel on the
    outer one, against eager DTensor: the replicas of the outer axis run different numbers
    of steps, or (`fsdp`) the parameters are sharded over them (FSDP2, `fully_shard`)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(rank_device().type, (2, 2), mesh_dim_names=("dp", "tp"))
    tp, replica = mesh["tp"], mesh.get_coordinate()[0]
    layers = [parallelize(layer, tp) for layer in copies(DecoderLayer)]
    if fsdp:
        for layer in layers:
            fully_shard(layer, mesh=mesh["dp"])
    compiled = torch.compile(layers[0], backend="hostir")
    torch.manual_seed(1 + replica)
    x = torch.randn(2, 16, 64).chunk(2, dim=1)[tp.get_local_rank()].to(rank_device())
    errors = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", HostirFallbackWarning)
        for step in range(1 if fsdp else 1 + replica):  # without FSDP, the second replica runs one step more
            outputs, gradients = [], []
            for layer in (compiled, layers[1]):
                x_step = x.clone().requires_grad_()
                out = layer(x_step)
                out.square().sum().backward()
                outputs.append(out.detach())
                gradients.append(x_step.grad)
            errors[f"output {step}"] = _max_error(*outputs)
            errors[f"input gradient {step}"] = _max_error(*gradients)
    for name, grad in _grads(layers[0]).items():
        errors[f"{name} gradient"] = _max_error(grad, _grads(layers[1])[name])
    from hostir.frontend.backend import compiled_graphs

    communicators = [shapes.communicator for graph in compiled_graphs() for shapes in graph.compiled.values() if shapes]
    return {
        "errors": errors,
        "fallbacks": [str(w.message) for w in caught if issubclass(w.category, HostirFallbackWarning)],
        "ranks": {c.ranks for c in communicators},
        "tp ranks": tuple(dist.get_process_group_ranks(tp.get_group())),
    }


@needs_ranks(4)
@pytest.mark.parametrize("fsdp", [False, True], ids=["replicas", "fsdp"])
def test_a_layer_tensor_parallel_on_one_axis_of_a_2d_mesh_runs_on_that_axis_group(fsdp):
    """Each graph's program runs on the ranks of its tensor-parallel group alone: its
    groups and its checks involve no other rank, so the two data-parallel replicas need
    not run in step; with FSDP2 on the other axis, its all-gathers and reduce-scatters
    stay torch's, outside the graphs."""
    results = run_on_hostir(_layer_on_a_tensor_parallel_axis, 4, fsdp, timeout_s=600)
    parameters = len(list(DecoderLayer().parameters()))
    for rank, result in enumerate(results):
        assert not result["fallbacks"], f"rank {rank}: {result['fallbacks']}"
        assert max(result["errors"].values()) < F32_TOLERANCE, f"rank {rank}: {result['errors']}"
        steps = 1 if fsdp else 1 + rank // 2
        assert len(result["errors"]) == 2 * steps + parameters
        assert result["ranks"] == {result["tp ranks"]} and rank in result["tp ranks"]


@needs_ranks(2)
def test_a_compiled_module_under_activation_checkpointing_matches_eager():
    """Checkpointing around the compiled module (inside it, torch's own aot_autograd fails
    for DTensor modules, docs/frontend.md): its forward runs again in the backward."""
    results = run_on_hostir(_mlp_on_rank, 2, True, True, timeout_s=300)
    for rank, result in enumerate(results):
        assert max(result["errors"].values()) < F32_TOLERANCE, f"rank {rank}: {result['errors']}"
    programs = results[0]["dump"].split("// hostir: the host program of graph ")[1:]
    assert [p.split("_")[0] for p in programs] == ["forward", "backward"], "the recomputation reuses the forward's program"


def test_an_op_hostir_does_not_model_runs_as_aten():
    def f(x, y, tokens, table):
        return torch.cumsum(x, dim=1) * torch.atan(y) + x.flip(0) + F.embedding(tokens, table)

    x, y, table = torch.randn(4, 8), torch.randn(4, 8), torch.randn(10, 8)
    tokens = torch.randint(0, 10, (4,))
    with _dumped("fusion") as dump:
        out = torch.compile(f, backend="hostir")(x, y, tokens, table)
    torch.testing.assert_close(out, f(x, y, tokens, table))
    assert 'fusion.aten "aten.cumsum.default"' in dump.getvalue()
    assert 'fusion.aten "aten.embedding.default"' in dump.getvalue()
    assert "fusion.mul" in dump.getvalue() and "fusion.add" in dump.getvalue()


def test_an_aten_op_whose_tuple_holds_more_than_its_results_names_them():
    """layer_norm without weights: its backward returns the input gradient and two
    undefined tensors (None); the op's one result is item 0 of ATen's tuple."""

    def f(x):
        return F.layer_norm(x, (6,)) * x

    x = torch.randn(4, 6)
    compiled_x, eager_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    with _dumped("fusion") as dump:
        out = torch.compile(f, backend="hostir")(compiled_x)
        out.backward(torch.ones_like(out))
    expected = f(eager_x)
    expected.backward(torch.ones_like(expected))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)
    assert '"aten.native_layer_norm_backward.default"' in dump.getvalue()
    assert re.search(r"returns \[0\]\s+:", dump.getvalue()), "item 0 of the tuple is the result"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activations_and_their_gradients_are_one_fused_pointwise_run(dtype):
    """gelu (exact and tanh), silu and their backward ops are imported as the fusion ops
    ATen's kernels compute, in f32 for bf16, so each graph's pointwise run is one segment."""

    def f(x, y, z):
        return F.gelu(x) * F.gelu(y, approximate="tanh") + F.silu(z)

    torch.manual_seed(0)
    inputs = [torch.randn(6, 8, dtype=dtype) for _ in range(3)]
    compiled_inputs = [x.clone().requires_grad_() for x in inputs]
    eager_inputs = [x.clone().requires_grad_() for x in inputs]
    torch._dynamo.reset()
    with _dumped("fusion,host_ir") as dump:
        out = torch.compile(f, backend="hostir")(*compiled_inputs)
        out.backward(torch.ones_like(out))
    expected = f(*eager_inputs)
    expected.backward(torch.ones_like(expected))
    tolerance = TOLERANCES[dtype]
    assert _max_error(out.float(), expected.float()) < tolerance
    for actual, reference in zip(compiled_inputs, eager_inputs, strict=True):
        assert _max_error(actual.grad.float(), reference.grad.float()) < tolerance
    text = dump.getvalue()
    assert "fusion.aten" not in text and all(op in text for op in ("fusion.erf", "fusion.tanh", "fusion.sigmoid"))
    programs = text.split("// hostir: the host program of graph ")[1:]
    assert len(programs) == 2 and all(p.count("hir.launch_kernel") == 1 for p in programs), programs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reciprocal_is_a_division_of_one_as_aten_computes_it(dtype):
    """`reciprocal` (torch 2.11's SiLU backward writes its sigmoid with it) is the pointwise
    `1 / x`, with ATen's values to the bit."""

    def f(x):
        return torch.reciprocal(x)

    x = torch.randn(6, 8, dtype=dtype, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    with _dumped("fusion") as dump:
        out = torch.compile(f, backend="hostir", options={"fallback": False})(x)
    assert torch.equal(out, f(x))
    assert "fusion.aten" not in dump.getvalue() and "fusion.div" in dump.getvalue()


def test_addmm_adds_its_bias_before_it_rounds_the_product():
    """`addmm` with a bias row is one fusion.matmul with its bias, which the GEMM adds
    before it rounds, as ATen does: bf16 results equal eager's bit for bit (a matmul then
    an add rounds twice, and differs in about a quarter of them). A bias of the product's
    shape is ATen's addmm itself."""

    def f(x, w, row, full):
        return torch.addmm(row, x, w.t()), torch.addmm(full, x, w.t())

    torch.manual_seed(0)
    x, w = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(128, 64, dtype=torch.bfloat16) / 8
    row, full = torch.randn(128, dtype=torch.bfloat16), torch.randn(64, 128, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with _dumped("fusion") as dump:
        out = torch.compile(f, backend="hostir")(x, w, row, full)
    for actual, expected in zip(out, f(x, w, row, full), strict=True):
        assert torch.equal(actual, expected)
    assert re.search(r"%addmm = fusion.matmul %\w+, %t, %\w+ :", dump.getvalue()), dump.getvalue()
    assert 'fusion.aten "aten.addmm.default"' in dump.getvalue()
    assert "fusion.add" not in dump.getvalue()


def _scalar_input_on_rank() -> dict:
    """A graph with a collective (its inputs vary, each rank's piece its own) and a 0-dim
    int64 input, a different value on each rank, that an ATen op hostir does not model
    reads: the result against eager, and the shape and device of what ATen got."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.utils._python_dispatch import TorchDispatchMode

    from hostir.frontend.backend import compiled_graphs

    def f(x, seed):
        return torch.fmod(funcol.all_reduce(x, "sum", dist.group.WORLD), seed)

    rank = dist.get_rank()
    # The seed stays on the CPU, as an attention kernel's does; x is on the rank's device.
    x, seed = (torch.randn(4, 8, generator=torch.Generator().manual_seed(rank)) * 10).to(rank_device()), torch.tensor(3 + rank)
    torch._dynamo.reset()
    with _dumped("fusion") as dump:
        out = torch.compile(f, backend="hostir", options={"fallback": False})(x, seed)

    class SeenByFmod(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: list[tuple[list[int], str]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.fmod.Tensor:
                self.seen.append((list(args[1].shape), args[1].device.type))
            return func(*args, **(kwargs or {}))

    (graph,) = compiled_graphs()
    (shapes,) = graph.compiled.values()
    with SeenByFmod() as fmod:  # the program as the backend runs it, a device axis added to each input
        (again,) = shapes.run([x, seed])
    equal = torch.equal(out, f(x, seed)) and torch.equal(again, out)
    return {"equal": equal, "seen": fmod.seen, "dump": dump.getvalue()}


@needs_ranks(2)
def test_a_0_dim_input_reaches_aten_as_a_0_dim_tensor():
    """An attention kernel's random seed and offset are 0-dim CPU tensors that its backward
    takes back. Such an input varies as every graph input does (a device axis, each
    rank's piece of extent 1), and ATen gets it as the 0-dim tensor it was: ATen takes a
    CPU tensor beside CUDA tensors only so (Program.check refuses any other CPU input)."""
    results = run_on_local_ranks(_scalar_input_on_rank, 2, timeout_s=300)
    for rank, result in enumerate(results):
        assert result["equal"], f"rank {rank}"
        assert result["seen"] == [([], "cpu")], f"rank {rank}: {result['seen']}"
    dump = results[0]["dump"]
    assert 'fusion.aten "aten.fmod.Tensor"' in dump and "!fusion.tensor<[2], i64, mesh = [0, 1], axes = [didx]>" in dump


BF16_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def _bf16_values(low: float, high: float, smallest: float) -> torch.Tensor:
    """Every bf16 value x with low <= x <= high and smallest <= |x|, in order."""
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    wide = values.float()
    return values[(wide >= low) & (wide <= high) & (wide.abs() >= smallest)].sort().values


def _bf16_steps(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How many bf16 values lie between `actual` and `expected`, elementwise (0: the same bits):
    the distance of their bit patterns, read as integers ordered as the values are."""

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.int16).int()
        return torch.where(bits < 0, -(2**15) - bits, bits)

    return (ordered(actual) - ordered(expected)).abs()


@pytest.mark.parametrize("name", list(BF16_ACTIVATIONS))
def test_bf16_activations_and_their_gradients_are_eager_atens_to_the_bit(name):
    """An activation of bf16 values and its backward compute in f32, as ATen's CPU kernels do
    (their opmath), and round once: on every bf16 value of [-3, 2**16] (but the smallest, below
    2**-100), forward and backward against random gradients, the results are ATen's bits.

    Not always: the importer writes ATen's formula in another order (`x * (0.5 * (1 +
    erf(x / sqrt 2)))` for `0.5 * x * (1 + erf(x / sqrt 2))`), so its f32 result may differ by
    an f32 rounding and then round to the bf16 neighbour of ATen's; no more than one in a
    thousand do, by one bf16 step. Outside that range the formula itself is ill-conditioned and
    both results are off (below -3, 1 + erf(x / sqrt 2) < 3e-3 cancels, and a last-bit
    difference in erf becomes more than a bf16 step; x**3 of the tanh form overflows f32 past
    7e12), and ATen's kernel flushes results below f32's smallest normal to zero.

    Computed in bf16 (its constants rounded to bf16), GELU's results differ from ATen's by
    several steps. The fusion shows the f32 ops, which for SiLU (constants 1.0) is all that
    tells it from a bf16 computation on the CPU."""
    activation = BF16_ACTIVATIONS[name]
    x = _bf16_values(-3.0, 2.0**16, 2.0**-100)
    gradient = torch.randn(x.shape, generator=torch.Generator().manual_seed(0)).bfloat16()
    torch._dynamo.reset()
    compiled_x, eager_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostirFallbackWarning)
        compiled = torch.compile(activation, backend="hostir")(compiled_x)
        compiled.backward(gradient)
    eager = activation(eager_x)
    eager.backward(gradient)
    for what, actual, expected in (
        ("forward", compiled.detach(), eager.detach()),
        ("backward", compiled_x.grad, eager_x.grad),
    ):
        steps = _bf16_steps(actual, expected)
        differing = x[steps > 0].tolist()
        assert steps.max() <= 1, f"{name} {what}: {int((steps > 1).sum())} of {x.numel()} values off by more than a bf16 step"
        assert len(differing) <= x.numel() // 1000, f"{name} {what}: one bf16 step off at {len(differing)} values {differing[:20]}"
    from hostir.frontend.backend import compiled_graphs

    graphs = [graph for graph in compiled_graphs() if graph.compiled][-2:]  # this test's forward and backward
    computing = [
        fusion.tensor_type(op.results[0]).element_type
        for graph in graphs
        for shapes in graph.compiled.values()
        for op in shapes.imported.module.walk()
        if isinstance(op, (fusion.ErfOp, fusion.TanhOp, fusion.SigmoidOp, fusion.ExpOp))
    ]
    assert computing and all(str(element_type) == "f32" for element_type in computing), computing


def test_unsigned_tensors_are_carried_bit_for_bit():
    """uint8 (and flash attention's uint64 random state) have no element type in the
    fusion dialect: their buffers carry their bits in the signed type of the same size."""

    def f(x, y):
        return (torch.bitwise_xor(x, 3) + 1).to(torch.float32) * y, x.flip(0)

    x, y = torch.randint(0, 256, (4, 8), dtype=torch.uint8), torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostirFallbackWarning)
        out = torch.compile(f, backend="hostir")(x, y)
    for actual, expected in zip(out, f(x, y), strict=True):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)


def test_inputs_of_a_new_shape_recompile():
    def f(x, w):
        return F.silu(x @ w).sum(dim=-1)

    compiled = torch.compile(f, backend="hostir")
    for rows in (4, 6, 9):
        x, w = torch.randn(rows, 8), torch.randn(8, 5)
        torch.testing.assert_close(compiled(x, w), f(x, w))


def test_an_unsupported_graph_runs_eagerly_and_says_why():
    def f(x):
        return (x.to(torch.complex64) * 2).real

    x = torch.randn(3, 4)
    with pytest.warns(HostirFallbackWarning, match="complex64"):
        out = torch.compile(f, backend="hostir")(x)
    torch.testing.assert_close(out, x * 2)


def test_without_fallback_the_unsupported_construct_is_an_error():
    def f(x):
        return (x.to(torch.complex64) * 2).real

    torch._dynamo.reset()
    with warnings.catch_warnings(), pytest.raises(Exception, match="dtype torch.complex64 are not supported"):
        torch.compile(f, backend="hostir", options={"fallback": False})(torch.randn(3, 4))


def test_an_unknown_option_is_refused():
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown hostir backend option"):
        torch.compile(lambda x: x + 1, backend="hostir", options={"chunk": 4})(torch.randn(2))


def test_auto_takes_the_copy_engines_only_for_a_host_of_gpus_with_peer_access(monkeypatch):
    """What each rank of two sees decides, with no communication: GPUs, both ranks on this
    host, and peer access both ways."""
    cuda_pair = Communicator(0, 2, torch.device("cuda", 0), "nccl", 60.0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    no_access = set()
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: (a, b) not in no_access)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    auto, nccl, cuda = (BackendOptions.of({"backend": b}) for b in ("auto", "nccl", "cuda"))
    assert BackendOptions.of({}) == auto
    assert why_not_copy_engines(cuda_pair) is None
    assert auto.backends(cuda_pair) == ["cuda", "nccl"]
    assert (nccl.backends(cuda_pair), cuda.backends(cuda_pair)) == (["nccl"], ["cuda"])

    no_access.add((1, 0))
    assert why_not_copy_engines(cuda_pair) == "GPU 1 has no peer access to GPU 0"
    assert auto.backends(cuda_pair) == ["nccl"]
    no_access.clear()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one of two hosts
    assert "not all on this host (LOCAL_WORLD_SIZE is 1)" in why_not_copy_engines(cuda_pair)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert "LOCAL_WORLD_SIZE is not set" in why_not_copy_engines(cuda_pair)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # CUDA_VISIBLE_DEVICES per rank
    assert why_not_copy_engines(cuda_pair) == "this host shows 1 GPU(s) to each of its 2 ranks"
    cpu_pair = Communicator(0, 2, torch.device("cpu"), "gloo", 60.0)
    assert why_not_copy_engines(cpu_pair) == "the copy engines are CUDA's, and this rank runs gloo on cpu"
    assert auto.backends(cpu_pair) == ["nccl"]
    assert why_not_copy_engines(Communicator.single(torch.device("cuda", 0))) is not None
    tensor_parallel_pair = Communicator(0, 4, torch.device("cuda", 0), "nccl", 60.0, ranks=(0, 1))
    assert "ranks [0, 1] are part of the world" in why_not_copy_engines(tensor_parallel_pair)
    with pytest.raises(ValueError, match="choose auto, nccl or cuda"):
        BackendOptions.of({"backend": "copy"})


GATHERED = """
func.func @gathered(%x: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, 4], f32, mesh = [0, 1]> {
  %y = fusion.set %x : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
  func.return %y : !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
}
"""
SCATTERED = """
func.func @scattered(%x: !fusion.tensor<[2, 4], f32>) -> !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]> {
  %y = fusion.set %x : !fusion.tensor<[2, 4], f32> -> !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  func.return %y : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
}
"""


@pytest.mark.parametrize(("text", "backend"), [(GATHERED, "cuda"), (SCATTERED, "nccl")])
def test_auto_lowers_for_nccl_what_the_copy_engines_cannot_move(monkeypatch, text, backend):
    """An allgather goes to the copy engines; a scatter, which has no copy-engine form, to NCCL."""
    monkeypatch.setattr("hostir.frontend.backend.why_not_copy_engines", lambda communicator: None)
    communicator = Communicator(0, 2, torch.device("cpu"), "gloo", 60.0)
    lowered = BackendOptions.of({}).compile(parse_module(text), communicator)
    assert lowered.backend == backend
    backends = {op.properties["backend"].data for op in lowered.program.host.walk() if "backend" in op.properties}
    assert backends == {hir.CommunicatorBackend(backend)}
    assert lowered.pipeline == f"auto-stream-parallel{{enabled=true}},hir-lowering{{backend={backend}}}"
    why = "every rank on this host, with peer access" if backend == "cuda" else "the copy engines cannot move this graph's collectives: "
    assert lowered.why.startswith(f"backend='auto': {why}"), lowered.why


def _gathered_and_summed(ranks: int) -> str:
    mesh = ", ".join(map(str, range(ranks)))
    varying = f"!fusion.tensor<[{ranks}, 4], f32, mesh = [{mesh}], axes = [didx, _]>"
    whole = f"!fusion.tensor<[{ranks}, 4], f32, mesh = [{mesh}]>"
    summed = f"!fusion.tensor<[4], f32, mesh = [{mesh}]>"
    return f"""
func.func @mixed(%x: {varying}, %p: {varying}) -> ({whole}, {summed}) {{
  %y = fusion.set %x : {varying} -> {whole}
  %s = fusion.sum %p [0] : {varying} -> {summed}
  func.return %y, %s : {whole}, {summed}
}}
"""


@pytest.mark.parametrize(("ranks", "reductions"), [(2, "cuda"), (4, "nccl")])
def test_auto_leaves_the_reductions_of_more_than_two_ranks_to_nccl(monkeypatch, ranks, reductions):
    """Where the copy engines serve the world, `auto` gives them the all-gathers, and the
    allreduces and reduce-scatters too on 2 ranks; on more, NCCL reduces, and `why` says so."""
    monkeypatch.setattr("hostir.frontend.backend.why_not_copy_engines", lambda communicator: None)
    communicator = Communicator(0, ranks, torch.device("cpu"), "gloo", 60.0)
    lowered = BackendOptions.of({}).compile(parse_module(_gathered_and_summed(ranks)), communicator)
    backends = {op.name: op.properties["backend"].data for op in lowered.program.host.walk() if "backend" in op.properties}
    assert backends == {"hir.allgather": hir.CommunicatorBackend.CUDA, "hir.allreduce": hir.CommunicatorBackend(reductions)}
    assert ("nccl_reductions=true" in lowered.pipeline) == (reductions == "nccl")
    assert ("NCCL reduces" in lowered.why) == (reductions == "nccl"), lowered.why
    explicit = BackendOptions.of({"backend": "cuda"}).compile(parse_module(_gathered_and_summed(ranks)), communicator)
    assert {op.properties["backend"].data for op in explicit.program.host.walk() if "backend" in op.properties} == {
        hir.CommunicatorBackend.CUDA
    }


@pytest.mark.parametrize(
    ("options", "ranks", "form"),
    [
        ({}, (0, 1), {"reduction_in_matmul": True}),
        ({}, (0, 1, 2, 3), {}),
        ({"backend": "cuda"}, (0, 1, 2, 3), {"destination_ring": True}),
        ({"backend": "cuda"}, (0, 2, 4, 6), {}),
        ({"backend": "nccl"}, (0, 1), {}),
    ],
)
def test_the_cost_model_weighs_a_gemm_rs_in_the_form_its_lowering_gives_it(monkeypatch, options, ranks, form):
    """The importer's chunks are chosen for the form that lowering for the graph's ranks gives
    a GEMM+RS: on the copy engines, summed in the GEMM for a pair and a ring of destinations
    for more consecutive ranks, unless NCCL reduces (`auto` on more than two), as the
    lowering's passes make them; the all-gathers keep the plain form."""
    monkeypatch.setattr("hostir.frontend.backend.why_not_copy_engines", lambda communicator: None)
    world = max(ranks) + 1
    communicator = Communicator(0, world, torch.device("cpu"), "gloo", 60.0, ranks=ranks)
    backend = BackendOptions.of(options)
    rs = OverlapProblem(OverlapKind.MATMUL_REDUCE_SCATTER, 4096, 4096, 1024, len(ranks))
    assert backend.lowered_form(rs, communicator) == replace(rs, **form)
    ag = OverlapProblem(OverlapKind.ALLGATHER_MATMUL, 4096, 4096, 1024, len(ranks))
    assert backend.lowered_form(ag, communicator) == ag


def _layer_on_the_copy_engines() -> dict:
    """The decoder layer's forward and backward with `backend="cuda"` on this rank (gloo's
    messages stand for the copy engines on CPU ranks; on GPUs they are the copy engines),
    against eager DTensor; what the host programs' reduce-scatters became."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hostir.frontend import backend

    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)
    layers = [parallelize(DecoderLayer().to(device), mesh) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    compiled = torch.compile(layers[0], backend="hostir", options={"backend": "cuda"})
    x = torch.randn(2, 16, 64).chunk(world, dim=1)[rank].to(device)
    inputs = [x.clone().requires_grad_() for _ in layers]
    outputs = [compiled(inputs[0]), layers[1](inputs[1])]
    for out in outputs:
        (out * outputs[1].detach()).sum().backward()
    errors = _errors_against_eager(*outputs, *inputs, *layers)
    graphs = backend.compiled_graphs()
    programs = [str(shapes.program.host) for graph in graphs for shapes in graph.compiled.values() if shapes]
    pipelining = [line for graph in graphs for explanation in graph.explanations for line in explanation.pipelining]
    return {
        "said": [line for line in pipelining if "destination by destination" in line],
        "errors": errors,
        "reduce_scatters": sum(text.count("hir.reduce_scatter") for text in programs),
        "staged": sum(len(re.findall(r"%staging\S* = hir.allocate", text)) for text in programs),
        "accumulating": sum(text.count("hir.matmul accumulate") for text in programs),
    }


@pytest.mark.parametrize("world", [pytest.param(w, marks=needs_ranks(w), id=f"w{w}") for w in (2, 4)])
def test_the_layer_on_the_copy_engines_sends_its_reduce_scatters_rows_from_the_gemms(world):
    """With the copy engines, every reduce-scatter of the layer, forward and backward (the
    latter's of the input gradients' sums), is computed destination by destination: a pair
    adds the own rows in the GEMMs of its exchange (reduce-scatter-in-matmul), four ranks
    run a ring of destinations and reduce what arrived (reduce-scatter-ring); the output,
    the input gradient and every parameter's gradient are eager DTensor's."""
    for rank, result in enumerate(run_on_hostir(_layer_on_the_copy_engines, world, timeout_s=300)):
        assert result["reduce_scatters"] == 0, f"rank {rank}: {result}"
        # Two reduce-scatters forward, two backward; a ring stages each one's rows.
        assert result["accumulating"] > 0 and result["staged"] == (4 if world > 2 else 0), f"rank {rank}: {result}"
        # What each rewrite did is said with the graph's pipelining (`hostir.explain`).
        rewrite = "reduce-scatter-ring" if world > 2 else "reduce-scatter-in-matmul"
        assert len(result["said"]) == 4 and all(rewrite in line for line in result["said"]), result["said"]
        bad = {what: error for what, error in result["errors"].items() if error > F32_TOLERANCE}
        assert not bad, f"rank {rank}: {bad}"


def test_the_backward_takes_what_lives_in_a_parameters_storage_as_a_parameter():
    """A CUDA graph reads parameters in place: the forward's are aot_autograd's static
    inputs; the backward's are the tensors in their storage (a weight's transpose that
    the forward saved), not its activations or gradients."""
    weight, bias, x = torch.randn(4, 3), torch.randn(4), torch.randn(2, 3)
    parameters = Parameters(forward=frozenset({0, 1}))
    assert parameters.among([weight, bias, x, 5], forward=True) == {0, 1}
    assert parameters.among([x, weight.t(), torch.randn(2, 4), bias[1:]], forward=False) == {1, 3}


def test_the_forward_hands_over_what_only_the_backward_reads():
    """A replay of the forward hands over, with no copy, the activations saved for the
    backward (aot_autograd's saved tensors), and copies what it returns to the caller,
    who may keep it; an inference graph saves nothing."""
    from hostir.frontend.backend import compiled_graphs

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    compiled = torch.compile(model, backend="hostir")
    compiled(torch.randn(5, 4, requires_grad=True)).sum().backward()
    forward = [graph for graph in compiled_graphs() if graph.forward][-1]
    (shapes,) = forward.compiled.values()
    outputs = shapes.imported.outputs
    handed = forward._saved_only(shapes.imported)
    saved = range(*forward.saved.indices(len(outputs)))
    returned = outputs[0][1][0]
    assert handed and returned not in handed
    assert handed == {outputs[j][1][0] for j in saved if outputs[j][0] == "fusion"} - {returned}
    with torch.no_grad():
        compiled(torch.randn(5, 4))
    inference = [graph for graph in compiled_graphs() if graph.forward][-1]
    assert inference is not forward and inference.saved is None


def test_the_backward_lends_the_parameters_gradients_and_hands_over_the_inputs():
    """A replay of the backward lends, with no copy, the gradients of the parameters (which
    AccumulateGrad takes as `.grad`), and hands over the input's gradient (which the engine
    hands to the backward of what made the input, a graph that reads it in place): read by
    their shapes, the lent outputs are the weights' and biases', the handed-over one the
    input's. The forward has neither."""
    from hostir.frontend.backend import compiled_graphs

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    compiled = torch.compile(model, backend="hostir")
    compiled(torch.randn(5, 4, requires_grad=True)).sum().backward()
    forward = [graph for graph in compiled_graphs() if graph.forward][-1]
    backward = [graph for graph in compiled_graphs() if not graph.forward][-1]
    (shapes,) = backward.compiled.values()
    lent, handed = backward._parameter_gradients(shapes.imported), backward._input_gradients(shapes.imported)
    shapes_of = {i: tuple(t.get_shape()) for i, t in enumerate(shapes.program.host.function_type.outputs.data)}
    assert sorted(shapes_of[i] for i in lent) == sorted(tuple(p.shape) for p in model.parameters())
    assert [shapes_of[i] for i in handed] == [(5, 4)]
    imported = next(iter(forward.compiled.values())).imported
    assert forward._parameter_gradients(imported) == set() == forward._input_gradients(imported)


@pytest.mark.parametrize("named", [True, False], ids=["backend_named_hostir", "hostir.backend()"])
def test_dynamo_reset_resets_the_backend(monkeypatch, named):
    """torch._dynamo.reset() calls `reset` on every backend torch compiled with; hostir's frees
    the CUDA graphs its replays captured (`reset_backend`), which torch's autograd wrappers
    would otherwise keep alive, with their memory pools, after dynamo dropped its code."""
    import hostir
    from hostir.frontend import backend as hostir_backend

    released = []
    monkeypatch.setattr(hostir_backend, "release_captured_graphs", lambda: released.append(True))
    torch._dynamo.reset()
    released.clear()
    compiled = torch.compile(torch.nn.Linear(4, 3), backend="hostir" if named else hostir.backend())
    compiled(torch.randn(2, 4)).sum().backward()
    assert not released
    torch._dynamo.reset()
    assert released


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CUDA graphs")
def test_gpu_dynamo_reset_frees_the_graphs_the_replays_captured():
    """After torch._dynamo.reset() no replay of the graphs compiled before holds a captured
    CUDA graph (nor the memory its pool keeps), although torch still holds the replays."""
    from hostir.frontend.backend import compiled_graphs

    torch._dynamo.reset()
    earlier_graphs = set(compiled_graphs())
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).cuda()
    compiled = torch.compile(model, backend="hostir")
    for _ in range(3):
        compiled(torch.randn(8, 16, device="cuda")).square().mean().backward()
    replayers = [
        shapes.replayer
        for graph in compiled_graphs()
        if graph not in earlier_graphs
        for shapes in graph.compiled.values()
    ]
    assert len(replayers) == 2 and all(replayer.runs() for replayer in replayers)
    torch._dynamo.reset()
    assert not any(replayer.runs() for replayer in replayers)


def _layer_on_gpu(backend: str) -> dict:
    """The layer in bf16 on this rank's GPU, its collectives on NCCL or the copy engines:
    three training steps (SGD) and three forwards under no_grad against eager DTensor,
    and whether its programs replayed as CUDA graphs."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hostir.frontend.backend import compiled_graphs

    world, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device()
    mesh = init_device_mesh("cuda", (world,))
    torch.manual_seed(0)
    reference = DecoderLayer()
    layers = []
    for _ in range(2):
        layer = DecoderLayer().to(device, torch.bfloat16)
        layer.load_state_dict(reference.state_dict())
        layers.append(parallelize(layer, mesh))
    compiled = torch.compile(layers[0], backend="hostir", options={"backend": backend})
    # A replay reads the parameters in place: each step's update must be seen, and is (it moves
    # the output by 10 to 17%). The loss is a mean: with its sum (gradients up to 30), SGD
    # diverges in eager f32 itself by the second step, and two runs that differ by bf16's
    # rounding part ways.
    optimizers = [torch.optim.SGD(layer.parameters(), lr=5.0) for layer in layers]
    errors = {}
    with warnings.catch_warnings(record=True) as outside:
        warnings.simplefilter("always", GraphReplayFallback)
        for step in range(3):
            x = torch.randn(2, 32, 64, dtype=torch.bfloat16).chunk(world, dim=1)[rank].to(device)
            with torch.no_grad():
                errors[f"inference output {step}"] = _max_error(compiled(x).float(), layers[1](x).float())
            out, expected = compiled(x), layers[1](x)
            out.float().square().mean().backward()
            expected.float().square().mean().backward()
            errors[f"output {step}"] = _max_error(out.float(), expected.float())
            # A comprehension, whose names end with it: on one rank `full_tensor()` is the
            # gradient itself, and a loop's variable would keep it past the step.
            expected_grads = _grads(layers[1])
            errors |= {
                f"{name} {step}": _max_error(grad.float(), expected_grads[name].float())
                for name, grad in _grads(layers[0]).items()
            }
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
    compiled_shapes = [shapes for graph in compiled_graphs() for shapes in graph.compiled.values() if shapes is not None]
    replayers = [shapes.replayer for shapes in compiled_shapes]
    replayed = [replayer is not None and replayer.replays and bool(replayer.runs()) for replayer in replayers]
    runs = [run for replayer in replayers if replayer is not None for run in replayer.runs()]
    return {
        "errors": errors,
        "replayed": replayed,
        "outside": [str(w.message) for w in outside if issubclass(w.category, GraphReplayFallback)],
        "lent": sum(len(run.lent) for run in runs),
        "on_loan": sum(len(run.on_loan) for run in runs),
        "handed_over": sum(len(run.handed_over) for run in runs),
        "backends": {shapes.backend for shapes in compiled_shapes},
        "why_not_copy_engines": why_not_copy_engines(compiled_shapes[0].communicator),
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: NCCL ranks and CUDA graphs")
@pytest.mark.parametrize(("world", "backend"), [(1, "nccl"), (2, "nccl"), (2, "cuda"), (2, "auto")])
def test_decoder_layer_on_gpus_with_graph_replay(world, backend):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, this machine has {torch.cuda.device_count()}")
    # auto: the copy engines where the GPUs have peer access (the ranks are all on this host)
    peers = all(torch.cuda.can_device_access_peer(a, b) for a in range(world) for b in range(world) if a != b)
    expected = ("cuda" if peers else "nccl") if backend == "auto" else backend
    for rank, result in enumerate(run_on_hostir(_layer_on_gpu, world, backend, timeout_s=600)):
        bad = {what: error for what, error in result["errors"].items() if error > 3e-2}
        assert not bad, f"rank {rank}: {bad}"
        assert result["replayed"] and all(result["replayed"]), f"rank {rank}: {result['replayed']}"
        # The activations the forward saves reach the backward with no copy, and every
        # step replays: the backward lets go of them before the next forward.
        assert result["lent"] > 0 and result["handed_over"] > 0, f"rank {rank}: {result}"
        # The backward lends the parameters' gradients: zero_grad() lets go of them each step.
        assert result["on_loan"] > 0, f"rank {rank}: {result}"
        assert not result["outside"], f"rank {rank}: {result['outside']}"
        assert result["backends"] == {expected}, f"rank {rank}: {result['why_not_copy_engines']}"
