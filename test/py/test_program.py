"""The Program API, and whole host programs of nvFuser's reference pipelines written by hand.

The multi-rank programs are pr4515's point-to-point allgather (send/recv coalesced,
an scf.if on the device index, stream ops) alone and feeding a matmul, and pr4401's
collective AG+matmul pipeline. They run at world sizes 2 and 4 with 1 and 3
streams, checked against plain torch on the unsharded data; inputs must come back
unchanged.
"""

from __future__ import annotations

import re

import pytest
import torch
from xdsl.dialects import func

from hostir_dialect.fusion import TensorType
from hostir_dialect.text import HostirError, parse_module, print_module
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.interpreter import compute
from hostir.runtime.launch import run_on_local_ranks
from hostir.runtime.program import (
    Program,
    aten_only_inputs,
    dynamic_axes,
    largest_device,
    process_group_teams,
    symmetric_outputs,
)
from hostir.runtime.reference import shard
from test_communicator import LAUNCH_TIMEOUT_S, needs_ranks
from test_interpreter import poisoned_allocations, tensor


def stream_loops(extent: str, body: str) -> str:
    """nvFuser's stream pipeline: a loop that makes every stream wait for the caller's, then the work loop."""
    return f"""
  %main = hir.get_current_stream
  %ns = hir.number_of_streams
  scf.for %i = %c0 to {extent} step %c1 {{
    %j = arith.remui %i, %ns : index
    %s = hir.stream %j
    hir.set_current_stream %s
    hir.synchronize_stream %main
  }}
  scf.for %i = %c0 to {extent} step %c1 {{
    %j = arith.remui %i, %ns : index
    %s = hir.stream %j
    hir.set_current_stream %s
    {body}
    hir.set_current_stream %main
    hir.synchronize_stream %s
  }}"""


def p2p_allgather_into(sharded: str, gathered: str, row: str, buffer: str = "%gathered") -> str:
    """pr4515's loop body: copy the own row, else receive row i from device i and send it ours."""
    return f"""
    %dst = hir.alias_select {buffer}[0 = %i] : {gathered} -> {row}
    %rank = hir.device_index
    %here = arith.cmpi eq, %i, %rank : index
    scf.if %here {{
      %src = hir.alias_select %in[0 = %c0] : {sharded} -> {row}
      hir.copy ins(%src : {row}) outs(%dst : {row})
    }} else {{
      hir.start_coalescing
      %r = hir.recv %dst from %i backend nccl : {row}
      %t = hir.send %in to %i backend nccl : {sharded}
      %e = hir.end_coalescing
      hir.wait %e
    }}"""


def allgather_p2p(n: int) -> str:
    """pr4515 AllgatherP2p: [DIDx(n), ?] -> [Stream(n), ?]."""
    devices = list(range(n))
    sharded = tensor([n, "?"], mesh=devices, axes="didx _")
    gathered = tensor([n, "?"], mesh=devices, axes="stream _")
    row = tensor(["?"], mesh=devices)
    return f"""
func.func @allgather_p2p(%in: {sharded}) -> {gathered} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = hir.dim %in, 0 : {sharded}
  %k = hir.dim %in, 1 : {sharded}
  %gathered = hir.allocate(%k) : {gathered}
  {stream_loops("%n", p2p_allgather_into(sharded, gathered, row))}
  func.return %gathered : {gathered}
}}"""


def allgather_matmul_p2p(n: int, m: int = 3, k: int = 5, p: int = 4) -> str:
    """pr4515 AG_matmul_P2p: [DIDx(n), m, k] x [k, p] -> [Stream(n), m, p]."""
    devices = list(range(n))
    sharded = tensor([n, m, k], mesh=devices, axes="didx _ _")
    gathered = tensor([n, m, k], mesh=devices, axes="stream _ _")
    weight = tensor([k, p], mesh=devices)
    out = tensor([n, m, p], mesh=devices, axes="stream _ _")
    chunk, out_chunk = tensor([m, k], mesh=devices), tensor([m, p], mesh=devices)
    body = p2p_allgather_into(sharded, gathered, chunk) + f"""
    %o = hir.alias_select %out[0 = %i] : {out} -> {out_chunk}
    hir.matmul ins(%dst, %w : {chunk}, {weight}) outs(%o : {out_chunk})"""
    return f"""
func.func @ag_matmul_p2p(%in: {sharded}, %w: {weight}) -> {out} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c{n} = arith.constant {n} : index
  %gathered = hir.allocate() : {gathered}
  %out = hir.allocate() : {out}
  {stream_loops(f"%c{n}", body)}
  hir.deallocate %gathered : {gathered}
  func.return %out : {out}
}}"""


def allgather_matmul(n: int, s: int = 3, m: int = 2, k: int = 4, p: int = 5) -> str:
    """pr4401 AG_matmul: [s, DIDx(n), m, k] x [k, p] -> [Stream(s), n, m, p], one allgather per chunk."""
    devices = list(range(n))
    sharded = tensor([s, n, m, k], mesh=devices, axes="_ didx _ _")
    gathered = tensor([s, n, m, k], mesh=devices, axes="stream _ _ _")
    weight = tensor([k, p], mesh=devices)
    out = tensor([s, n, m, p], mesh=devices, axes="stream _ _ _")
    in_chunk = tensor([n, m, k], mesh=devices, axes="didx _ _")
    chunk, out_chunk = tensor([n, m, k], mesh=devices), tensor([n, m, p], mesh=devices)
    body = f"""
    %a = hir.alias_select %in[0 = %i] : {sharded} -> {in_chunk}
    %g = hir.alias_select %gathered[0 = %i] : {gathered} -> {chunk}
    %w = hir.allgather %a into %g team {devices} backend nccl : {in_chunk}, {chunk}
    hir.wait %w
    %o = hir.alias_select %out[0 = %i] : {out} -> {out_chunk}
    hir.matmul ins(%g, %b : {chunk}, {weight}) outs(%o : {out_chunk})"""
    return f"""
func.func @ag_matmul(%in: {sharded}, %b: {weight}) -> {out} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c{s} = arith.constant {s} : index
  %gathered = hir.allocate() : {gathered}
  %out = hir.allocate() : {out}
  {stream_loops(f"%c{s}", body)}
  func.return %out : {out}
}}"""


def pipeline_cases(n: int) -> list[tuple[str, list[torch.Tensor], torch.Tensor]]:
    """(program, unsharded inputs, unsharded output) of each pipeline at world size `n`."""
    generator = torch.Generator().manual_seed(n)
    x = torch.randn(n, 7, generator=generator)
    a, w = torch.randn(n, 3, 5, generator=generator), torch.randn(5, 4, generator=generator)
    b, v = torch.randn(3, n, 2, 4, generator=generator), torch.randn(4, 5, generator=generator)
    return [
        (allgather_p2p(n), [x], x),
        (allgather_matmul_p2p(n), [a, w], a @ w),
        (allgather_matmul(n), [b, v], b @ v),
    ]


def run_pipelines(n: int) -> list[torch.Tensor]:
    """One rank: every pipeline with 1 and 3 streams; returns this rank's outputs."""
    communicator = Communicator.from_env()
    outputs = []
    for text, inputs, _ in pipeline_cases(n):
        program = Program.compile(text, pipeline=None)
        local = [shard(x, t, communicator.rank).to(communicator.device) for x, t in zip(inputs, program.input_types)]
        originals = [x.clone() for x in local]
        for num_streams in (1, 3):
            with poisoned_allocations():
                (out,) = program.run(local, communicator, num_streams=num_streams)
            outputs.append(out.cpu())
        assert all(torch.equal(x, original) for x, original in zip(local, originals)), "an input changed"
    return outputs


@pytest.mark.parametrize("n", [pytest.param(2, marks=needs_ranks(2)), pytest.param(4, marks=needs_ranks(4))])
def test_reference_pipelines_written_by_hand(n):
    results = run_on_local_ranks(run_pipelines, n, n, timeout_s=LAUNCH_TIMEOUT_S)
    for rank, outputs in enumerate(results):
        expected = [full for _, _, full in pipeline_cases(n) for _ in (1, 3)]
        for output, full in zip(outputs, expected, strict=True):
            # Every rank holds the whole gathered result (the stream axis is not sharded).
            torch.testing.assert_close(output, full)


# --------------------------------------------------------------------------- #
# Dynamic extents on ranks outside a mesh                                      #
# --------------------------------------------------------------------------- #


def set_to_mesh(name: str, source: list[int], target: list[int], axes: str | None = None) -> str:
    """[?, ?] on `source` -> fusion.set -> on `target` (sharded by `axes`): a communication
    whose receivers outside `source` allocate buffers of the input's dynamic extents."""
    x, y = tensor(["?", "?"], mesh=source), tensor(["?", "?"], mesh=target, axes=axes)
    return f"""
func.func @{name}(%x: {x}) -> {y} {{
  %y = fusion.set %x : {x} -> {y}
  func.return %y : {y}
}}"""


def exp_on_device_0() -> str:
    """A single-device fusion: in a larger world the other ranks run it on placeholders."""
    x = tensor(["?", "?"])
    return f"""
func.func @exp(%x: {x}) -> {x} {{
  %y = fusion.exp %x : {x} -> {x}
  func.return %y : {x}
}}"""


def dynamic_extent_cases(world: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(fusion, whole input, whole expected output) with extents that are not powers of two."""
    generator = torch.Generator().manual_seed(world)
    x, y = torch.randn(5, 3, generator=generator), torch.randn(5, world, generator=generator)
    devices = list(range(world))
    return [
        (set_to_mesh("send_recv", [0], [world - 1]), x, x),
        (set_to_mesh("broadcast", [world - 1], devices), x, x),
        (set_to_mesh("scatter", [0], devices, "_ didx"), y, y),
        (exp_on_device_0(), x, torch.exp(x)),
    ]


def run_dynamic_extent_cases(world: int) -> list[torch.Tensor]:
    """One rank: every case lowered by the default pipeline, run on this rank's piece."""
    communicator = Communicator.from_env()
    outputs = []
    for text, full, _ in dynamic_extent_cases(world):
        program = Program.compile(text)
        local = shard(full, program.input_types[0], communicator.rank).to(communicator.device)
        with poisoned_allocations():
            (out,) = program.run([local], communicator)
        outputs.append(out.cpu())
    return outputs


@pytest.mark.parametrize(
    "world", [pytest.param(2, marks=needs_ranks(2)), pytest.param(4, marks=needs_ranks(4))]
)
def test_ranks_outside_a_mesh_know_the_dynamic_extents_of_its_inputs(world):
    """Every receiver allocates from the extents of an input it holds no piece of."""
    results = run_on_local_ranks(run_dynamic_extent_cases, world, world, timeout_s=LAUNCH_TIMEOUT_S)
    for case, (text, full, expected) in enumerate(dynamic_extent_cases(world)):
        output_type = Program.compile(text).output_types[0]
        for rank, outputs in enumerate(results):
            torch.testing.assert_close(outputs[case], shard(expected, output_type, rank))


# --------------------------------------------------------------------------- #
# One rank                                                                     #
# --------------------------------------------------------------------------- #


def stream_axis_inner(n: int = 6) -> str:
    """pr4147's single-device pipeline with the stream axis not outermost: y = exp(x), Stream on axis 1."""
    whole, slice_ = tensor([4, n, 3]), tensor([4, 3])
    streamed = tensor([4, n, 3], axes="_ stream _")
    body = f"""
    %xi = hir.alias_select %x[1 = %i] : {whole} -> {slice_}
    %yi = hir.alias_select %y[1 = %i] : {streamed} -> {slice_}
    hir.launch_kernel @exp ins(%xi : {slice_}) outs(%yi : {slice_})"""
    return f"""
func.func private @exp(%x: {slice_}) -> {slice_} {{
  %y = fusion.exp %x : {slice_} -> {slice_}
  func.return %y : {slice_}
}}
func.func @main(%x: {whole}) -> {streamed} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = hir.dim %x, 1 : {whole}
  %y = hir.allocate() : {streamed}
  {stream_loops("%n", body)}
  func.return %y : {streamed}
}}"""


DEVICE = Communicator.single().device
"""Where `Program.run` runs without a communicator: the current GPU, else the CPU."""


def test_program_runs_a_lowered_module_on_one_rank():
    program = Program.compile(stream_axis_inner(), pipeline=None)
    assert program.fusion is None
    assert program.host.sym_name.data == "main"
    assert program.input_types == [TensorType([4, 6, 3], program.input_types[0].element_type)]
    assert program.output_types[0].stream_axis == 1
    x = torch.randn(4, 6, 3, device=DEVICE)
    with poisoned_allocations():
        (y,) = program.run([x])
    torch.testing.assert_close(y, torch.exp(x))


def test_compile_takes_text_or_a_module_and_leaves_the_module_alone():
    text = stream_axis_inner()
    module = parse_module(text)
    before = print_module(module)
    from_module = Program.compile(module, pipeline=None, entry="main")
    assert print_module(module) == before and from_module.module is not module
    assert print_module(from_module.module) == print_module(Program.compile(text, pipeline=None).module)


FUSION = f"""
func.func @f(%x: {tensor(["?", 4])}, %y: {tensor(["?", 4])}) -> {tensor(["?"])} {{
  %a = fusion.add %x, %y : ({tensor(["?", 4])}, {tensor(["?", 4])}) -> {tensor(["?", 4])}
  %b = fusion.exp %a : {tensor(["?", 4])} -> {tensor(["?", 4])}
  %s = fusion.sum %b [1] : {tensor(["?", 4])} -> {tensor(["?"])}
  func.return %s : {tensor(["?"])}
}}"""


def test_compile_lowers_a_fusion_and_keeps_it():
    program = Program.compile(FUSION)
    assert isinstance(program.fusion, func.FuncOp)
    assert [op.name for op in program.fusion.body.block.ops] == ["fusion.add", "fusion.exp", "fusion.sum", "func.return"]
    assert not any(op.name.startswith("fusion.") for op in program.host.body.block.ops)
    x, y = torch.randn(5, 4, device=DEVICE), torch.randn(5, 4, device=DEVICE)
    with poisoned_allocations():
        (s,) = program.run([x, y])
    torch.testing.assert_close(s, torch.exp(x + y).sum(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stream_parallel_program_uses_the_pool_streams_and_restores_the_callers(monkeypatch):
    streams_used = []
    original = compute.segment_runner

    def recording(callee):
        run = original(callee)

        def recorded(ins, outs):
            streams_used.append(torch.cuda.current_stream().cuda_stream)
            run(ins, outs)

        return recorded

    monkeypatch.setattr(compute, "segment_runner", recording)
    program = Program.compile(stream_axis_inner(8), pipeline=None)
    caller = torch.cuda.Stream()
    x = torch.randn(4, 8, 3, device="cuda")
    with torch.cuda.stream(caller):
        (y,) = program.run([x], num_streams=4)
        assert torch.cuda.current_stream() == caller
        caller.synchronize()
    torch.testing.assert_close(y, torch.exp(x))
    assert len(streams_used) == 8 and len(set(streams_used)) == 4
    assert caller.cuda_stream not in streams_used


SPREAD_WEIGHT = f"""
func.func private @spread(%w: {tensor([4, 3], "bf16")}) -> {tensor([1, 4, 3], "bf16")} {{
  %s = fusion.broadcast %w [0] : {tensor([4, 3], "bf16")} -> {tensor([1, 4, 3], "bf16")}
  func.return %s : {tensor([1, 4, 3], "bf16")}
}}
func.func @main(%x: {tensor([2, 5, 4], "bf16")}, %w: {tensor([4, 3], "bf16")}) -> ({tensor([2, 5, 3], "bf16")}, {tensor([1, 4, 3], "bf16")}) {{
  %s = hir.allocate() : {tensor([1, 4, 3], "bf16")}
  hir.post_on_stream @spread ins(%w : {tensor([4, 3], "bf16")}) outs(%s : {tensor([1, 4, 3], "bf16")}) adopted [0]
  %y = hir.allocate() : {tensor([2, 5, 3], "bf16")}
  hir.matmul ins(%x, %s : {tensor([2, 5, 4], "bf16")}, {tensor([1, 4, 3], "bf16")}) outs(%y : {tensor([2, 5, 3], "bf16")})
  func.return %y, %s : {tensor([2, 5, 3], "bf16")}, {tensor([1, 4, 3], "bf16")}
}}"""


SIGNATURE = """
!x = !fusion.tensor<[?, ?, 8], f32, mesh = [1, 2], axes = [_, didx, _]>
!w = !fusion.tensor<[8], f32, mesh = [1, 2]>
!seed = !fusion.tensor<[1], i64, mesh = [1, 2]>
func.func @main(%x: !x, %w: !w {hir.symmetric}, %seed: !seed) -> (!w, !w) {
  %sum = hir.allocate() symmetric : !w
  hir.aten "aten.add.Tensor" call "[[{'operand': 0}, {'operand': 1}], {}]" ins(%w, %seed : !w, !seed) outs(%sum : !w)
  %copy = hir.allocate() : !w
  %sent = hir.send_recv %w into %copy team [1, 2] root 1 backend nccl : !w, !w
  hir.wait %sent
  %spread = hir.broadcast %w into %copy team [1, 2, 3] root 3 backend nccl : !w, !w
  hir.wait %spread
  func.return %sum, %copy : !w, !w
}
"""


def test_what_the_signature_of_a_host_program_tells_before_it_runs():
    """The signature analysis of `Program`, each part on its own: the input axes whose
    extents the inputs set (not a didx one), the inputs only ATen reads, the outputs in
    symmetric memory, the teams that need a process group (collectives but send_recv, each
    once; symmetric buffers and inputs need none), and the largest device named."""
    host = next(op for op in parse_module(SIGNATURE).ops if isinstance(op, func.FuncOp))
    types = [argument.type for argument in host.args]
    assert dynamic_axes(types) == [(0, 0)]
    assert aten_only_inputs(host) == {2}
    assert symmetric_outputs(host) == [0]
    assert process_group_teams(host) == [(1, 2, 3)]
    assert largest_device(host) == 3


def test_a_broadcast_weight_is_read_in_place_and_no_output_shares_an_inputs_memory():
    """The broadcast that a matmul reads (the importer's for a linear layer's weight), its out
    `adopted` as forward-buffers marks it, is a view of the weight, even transposed, not a
    copy made every step. A view that is an
    output is copied: writing into an output leaves the caller's inputs unchanged,
    unless the caller asks for views of those inputs (as torch.compile's backend does)."""
    program = Program.compile(SPREAD_WEIGHT, pipeline=None)
    rng = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 4, generator=rng).bfloat16().to(DEVICE)
    weight = torch.randn(3, 4, generator=rng).bfloat16().to(DEVICE)
    w = weight.t()
    kept = w.clone()
    with poisoned_allocations():
        y, s = program.run([x, w])
    torch.testing.assert_close(y, torch.matmul(x.float(), w.float()).bfloat16(), rtol=1e-2, atol=1e-2)
    assert torch.equal(s[0], w) and s.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    s.add_(1)
    assert torch.equal(w, kept)
    _, view = program.run([x, w], views_of=[1])
    assert view.data_ptr() == w.data_ptr() and view[0].stride() == w.stride()


def test_an_output_in_symmetric_memory_stays_the_callers_after_the_next_run():
    """A symmetric buffer is made once and given back to every run (peers map it): an
    output in one is copied, so that the next run does not overwrite what the caller holds."""
    vector = tensor([4], mesh=[0])
    program = Program.compile(
        f"""
        func.func @main(%x: {vector}) -> {vector} {{
          %s = hir.allocate() symmetric : {vector}
          hir.copy ins(%x : {vector}) outs(%s : {vector})
          func.return %s : {vector}
        }}""",
        pipeline=None,
    )
    assert program.symmetric_outputs == [0]
    communicator = Communicator.single(DEVICE)
    x = torch.arange(4.0, device=DEVICE)
    (first,) = program.run([x], communicator)
    (second,) = program.run([x + 10], communicator)
    assert torch.equal(first, x) and torch.equal(second, x + 10)


def _seeded(seed: str, x: str = "!fusion.tensor<[4], f32>") -> str:
    """x plus a seed that only an ATen call reads, minus x: the seed, in the type of x."""
    return f"""
func.func @seeded(%seed: {seed}, %x: {x}) -> {x} {{
  %y = fusion.aten "aten.add.Tensor"(%x, %seed) call "[[{{'operand': 0}}, {{'operand': 1}}], {{}}]" : ({x}, {seed}) -> {x}
  %z = fusion.neg %x : {x} -> {x}
  %w = fusion.add %y, %z : ({x}, {x}) -> {x}
  func.return %w : {x}
}}
"""


def test_the_inputs_no_op_reads_are_known():
    """A graph's input that lowering left unread (the mask a ring never reads) is one a CUDA
    graph's replay need not copy in (`Program.unread_inputs`)."""
    x = "!fusion.tensor<[4], f32>"
    program = Program.compile(
        f"""
func.func @unread(%x: {x}, %mask: !fusion.tensor<[4, 4], f32>, %y: {x}) -> {x} {{
  %z = fusion.add %x, %y : ({x}, {x}) -> {x}
  func.return %z : {x}
}}
"""
    )
    assert program.unread_inputs == {1}


def test_a_promised_value_is_compared_until_a_tensor_keeps_it_unwritten(monkeypatch):
    """An input whose values are promised (`Program.expect`) is compared at every run, but
    the tensor that kept the promise is not again until it is written (its version): a
    comparison reads the values back, which waits for the GPU."""
    x = "!fusion.tensor<[4], i64>"
    program = Program.compile(f"func.func @p(%x: {x}) -> {x} {{\n  func.return %x : {x}\n}}")
    program.expect(0, torch.arange(4), "the positions")
    compared = []
    equal = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(a) or equal(a, b))
    communicator = Communicator.single(torch.device("cpu"))
    positions = torch.arange(4)
    program.check([positions], communicator)
    program.check([positions], communicator)
    assert len(compared) == 1
    program.check([torch.arange(4)], communicator)  # another tensor: compared
    positions.add_(0)  # written: compared again
    program.check([positions], communicator)
    assert len(compared) == 3
    positions[0] = 7
    with pytest.raises(HostirError, match="its values are not the positions"):
        program.check([positions], communicator)
    # A view made anew at every call (as a compiled graph hands a varying input over, its
    # device axis in front) of a tensor that kept the promise is not compared again either,
    # nor a new alias of it (as aot_autograd hands the backward a saved tensor), until the
    # tensor is written, through itself or through a view.
    whole = torch.arange(4)
    program.check([whole.reshape(4)[:]], communicator)
    program.check([whole.view(4)[:]], communicator)
    program.check([whole.detach()[:]], communicator)
    assert len(compared) == 5
    whole.view(2, 2)[1, 1] = 9
    with pytest.raises(HostirError, match="its values are not the positions"):
        program.check([whole.view(4)[:]], communicator)
    assert len(compared) == 6
    # Another view of the same memory is compared: it is not where the promise was kept.
    both = torch.cat([torch.arange(4), torch.arange(4) + 1])
    program.check([both[:4]], communicator)
    with pytest.raises(HostirError, match="its values are not the positions"):
        program.check([both[4:]], communicator)
    assert len(compared) == 8


def test_a_later_calls_check_reads_the_promised_values_alone():
    """`check_values`, a later call's check of inputs whose shapes, dtypes and devices a
    compiled signature vouches for: the promised values are checked (and the count of inputs),
    the other inputs' types are not read again, which `check` would refuse."""
    x = "!fusion.tensor<[4], i64>"
    program = Program.compile(f"func.func @p(%x: {x}, %y: {x}) -> {x} {{\n  func.return %x : {x}\n}}")
    program.expect(0, torch.arange(4), "the positions")
    communicator = Communicator.single(torch.device("cpu"))
    other = torch.zeros(4)  # f32 where the program takes i64
    program.check_values([torch.arange(4), other], communicator)
    with pytest.raises(HostirError, match="input #1 of @p"):
        program.check([torch.arange(4), other], communicator)
    with pytest.raises(HostirError, match="input #0 of @p on rank 0: its values are not the positions"):
        program.check_values([torch.arange(4).flip(0), other], communicator)
    with pytest.raises(HostirError, match="@p takes 2 input"):
        program.check_values([torch.arange(4)], communicator)
    # In two halves: the wait for the verdicts raises, not the start.
    wait = program.start_check_values([torch.arange(4).flip(0), other], communicator)
    with pytest.raises(HostirError, match="its values are not the positions"):
        wait()


SEEDED = _seeded("!fusion.tensor<[], i64>")
"""An attention kernel's random seed as its backward takes it back: a 0-dim input that only
an ATen call reads."""


@pytest.mark.parametrize(
    "seed_type, x_type, seed, problem",
    [
        ("!fusion.tensor<[], i64>", "!fusion.tensor<[4], f32>", torch.tensor(3), None),
        # Varying: ATen reads its piece, without the device axis, as a 0-dim tensor.
        (
            "!fusion.tensor<[1], i64, mesh = [0], axes = [didx]>",
            "!fusion.tensor<[1, 4], f32, mesh = [0], axes = [didx, _]>",
            torch.tensor([3]),
            None,
        ),
        # ATen would read [1], which it refuses beside CUDA tensors.
        (
            "!fusion.tensor<[1], i64>",
            "!fusion.tensor<[4], f32>",
            torch.tensor([3]),
            "the ATen calls that read it would get shape [1], where they take a CPU tensor beside "
            "another device's only as a 0-dim scalar",
        ),
    ],
    ids=["0-dim", "varying-piece", "one-element"],
)
def test_a_cpu_input_beside_a_gpu_program_is_a_0_dim_tensor_only_aten_reads(seed_type, x_type, seed, problem):
    """As ATen's kernels return some (an attention kernel's random seed and offset) and take
    them back. Any other input must be on the program's device, and so must one that would
    reach ATen with a shape."""
    program = Program.compile(_seeded(seed_type, x_type))
    assert program.aten_inputs == {0}
    x = torch.randn(program.input_types[1].local_shape())
    gpu = Communicator(0, 1, torch.device("cuda", 0), "nccl", 60.0, joined=False)
    if problem is None:
        # The seed on the CPU passes (input #0); x does not (input #1).
        problem = (
            "input #1 of @seeded on rank 0: expected a tensor on cuda:0, got one on cpu; only an input "
            "that ATen calls alone read may stay on the CPU"
        )
    else:
        problem = f"input #0 of @seeded on rank 0: expected a tensor on cuda:0, got one on cpu; {problem}"
    with pytest.raises(HostirError, match=re.escape(problem)):
        program.check([seed, x], gpu)
    cpu = Communicator.single(torch.device("cpu"))
    torch.testing.assert_close(program.run([seed, x], cpu)[0], (x + 3) - x)
