"""The interpreter's handlers, one hand-written host program at a time, on one rank.

Collectives and send/recv need several ranks: test_communicator.py and
test_program.py run them. Here every other handler runs in this process, with a
`RunContext` whose rank may lie outside a buffer's mesh. Buffers the program
allocates are poisoned (NaN, or -7 for integers) so a value that is never written
shows up in the comparison; expected values come from plain torch on the inputs.
"""

from __future__ import annotations

import random
import warnings
import weakref
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, i64

from hostir_dialect import hir, hostir_context
from hostir_dialect.text import HostirError, parse_module, print_module
from hostir.passes.hir.buffer_layouts import BufferLayouts
from hostir.passes.hir.forward_buffers import ForwardBuffers
from hostir.passes.hir.sum_in_matmul import SumInMatmul
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.distributed.streams import stream_pool
from hostir.runtime.interpreter import HANDLERS, Interpreter, RunContext, compute, fusion_eval
from hostir.runtime.interpreter import aten_calls
from hostir.runtime.interpreter.aten_calls import RUN_BYTES, picker, prepare_call
from hostir.runtime.interpreter.core import Preparation, empty_in_order

# --------------------------------------------------------------------------- #
# Helpers shared with the other runtime tests                                  #
# --------------------------------------------------------------------------- #


def tensor(shape, dtype="f32", mesh=None, axes=None) -> str:
    """The text of a `!fusion.tensor` type: `tensor([2, "?"], mesh=[0, 1], axes="didx _")`."""
    text = "[" + ", ".join(map(str, shape)) + f"], {dtype}"
    if mesh is not None:
        text += f", mesh = {list(mesh)}"
    if axes is not None:
        text += ", axes = [" + ", ".join(axes.split()) + "]"
    return f"!fusion.tensor<{text}>"


@contextmanager
def poisoned_allocations():
    """Fills every tensor torch.empty makes with NaN (floats) or -7, so unwritten values show."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        result = empty(*args, **kwargs)
        return result.fill_(float("nan") if result.is_floating_point() else -7)

    with mock.patch.object(torch, "empty", poisoned):
        yield


@contextmanager
def poisoned_frees():
    """`hir.deallocate` fills its buffer with NaN (or -7) before it lets go of it, in the
    programs prepared meanwhile: as the memory's next owner may write it at once (a GPU's
    caching allocator hands a freed block to the next allocation on the same stream), so a
    buffer freed while something still reads it shows."""
    deallocate = HANDLERS[hir.DeallocateOp]

    def poisoning(op: hir.DeallocateOp, prep: Preparation):
        buffer, free = prep.slot(op.buffer), deallocate(op, prep)

        def step(env, context) -> None:
            env[buffer].fill_(float("nan") if env[buffer].is_floating_point() else -7)
            free(env, context)

        return step

    with mock.patch.dict(HANDLERS, {hir.DeallocateOp: poisoning}):
        yield


def host_function(text: str, entry: str = "main") -> func.FuncOp:
    module = parse_module(text)
    return next(op for op in module.ops if isinstance(op, func.FuncOp) and op.sym_name.data == entry)


CPU = torch.device("cpu")


def run_host(
    text: str,
    inputs,
    rank: int = 0,
    num_streams: int = 4,
    entry: str = "main",
    device: torch.device = CPU,
    input_extents: dict[tuple[int, int], int] | None = None,
) -> list:
    """Prepares `@entry` of `text` and runs it on `rank` of a world of one, allocations poisoned."""
    prepared = Interpreter(host_function(text, entry))
    communicator = Communicator.single(device)
    context = RunContext(
        rank,
        communicator.device,
        communicator,
        stream_pool(communicator.device, num_streams),
        input_extents=input_extents or {},
    )
    with poisoned_allocations():
        return prepared.run(inputs, context)


@pytest.fixture
def rng() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


# --------------------------------------------------------------------------- #
# func, scf, arith                                                             #
# --------------------------------------------------------------------------- #

INDEX_ARITHMETIC = """
func.func @main(%a: index, %b: index) -> (index, index, index, index, index, index, index, index, i1, i1, i1, i1, i1, i1, i1, i1, i1, i1) {
  %add = arith.addi %a, %b : index
  %sub = arith.subi %a, %b : index
  %mul = arith.muli %a, %b : index
  %rem = arith.remui %a, %b : index
  %div = arith.divui %a, %b : index
  %max = arith.maxui %a, %b : index
  %lt = arith.cmpi ult, %a, %b : index
  %sel = arith.select %lt, %a, %b : index
  %c7 = arith.constant 7 : index
  %eq = arith.cmpi eq, %a, %b : index
  %ne = arith.cmpi ne, %a, %b : index
  %slt = arith.cmpi slt, %a, %b : index
  %sle = arith.cmpi sle, %a, %b : index
  %sgt = arith.cmpi sgt, %a, %b : index
  %sge = arith.cmpi sge, %a, %b : index
  %ule = arith.cmpi ule, %a, %b : index
  %ugt = arith.cmpi ugt, %a, %b : index
  %uge = arith.cmpi uge, %a, %b : index
  func.return %add, %sub, %mul, %rem, %div, %max, %sel, %c7, %eq, %ne, %slt, %sle, %sgt, %sge, %lt, %ule, %ugt, %uge : index, index, index, index, index, index, index, index, i1, i1, i1, i1, i1, i1, i1, i1, i1, i1
}
"""


def test_index_arithmetic_matches_python():
    randomly = random.Random(7)
    for a, b in [(5, 5), (3, 9), *((randomly.randrange(1000), randomly.randrange(1, 50)) for _ in range(20))]:
        results = run_host(INDEX_ARITHMETIC, [a, b])
        assert results == [
            a + b, a - b, a * b, a % b, a // b, max(a, b), a if a < b else b, 7,
            a == b, a != b, a < b, a <= b, a > b, a >= b, a < b, a <= b, a > b, a >= b,
        ]


LOOPS = """
func.func @main(%lb: index, %ub: index, %step: index) -> (index, index, index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %sum, %count = scf.for %i = %lb to %ub step %step iter_args(%acc = %c0, %n = %c0) -> (index, index) {
    %acc2 = arith.addi %acc, %i : index
    %n2 = arith.addi %n, %c1 : index
    scf.yield %acc2, %n2 : index, index
  }
  %odd = scf.for %i = %lb to %ub step %step iter_args(%acc = %c0) -> (index) {
    %r = arith.remui %i, %c2 : index
    %is_odd = arith.cmpi eq, %r, %c1 : index
    %next = scf.if %is_odd -> (index) {
      %inner = scf.for %j = %c0 to %i step %c1 iter_args(%k = %acc) -> (index) {
        %k2 = arith.addi %k, %c1 : index
        scf.yield %k2 : index
      }
      scf.yield %inner : index
    } else {
      scf.yield %acc : index
    }
    scf.yield %next : index
  }
  func.return %sum, %count, %odd : index, index, index
}
"""


@pytest.mark.parametrize("bounds", [(0, 10, 1), (3, 17, 4), (5, 5, 1), (9, 2, 1), (1, 30, 7)])
def test_scf_for_carries_values_and_scf_if_yields(bounds):
    steps = range(*bounds)
    assert run_host(LOOPS, list(bounds)) == [sum(steps), len(steps), sum(i for i in steps if i % 2)]


SWAP = """
func.func @main(%a: index, %b: index, %n: index) -> (index, index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %x, %y = scf.for %i = %c0 to %n step %c1 iter_args(%p = %a, %q = %b) -> (index, index) {
    scf.yield %q, %p : index, index
  }
  func.return %x, %y : index, index
}
"""


def test_scf_yield_may_permute_loop_carried_values():
    assert run_host(SWAP, [1, 2, 3]) == [2, 1]
    assert run_host(SWAP, [1, 2, 4]) == [1, 2]


# --------------------------------------------------------------------------- #
# Buffers                                                                      #
# --------------------------------------------------------------------------- #

ALLOCATIONS = f"""
func.func @main(%x: {tensor(["?", 4, "?"], "bf16")}, %s: {tensor(["?", 3], "i32", mesh=[0, 1], axes="didx _")}) -> ({tensor(["?", 2, "?"], "bf16")}, {tensor(["?", 3], "i64", mesh=[0, 1], axes="didx _")}, {tensor([5], "f16", mesh=[1])}, {tensor([2, 2], "i1")}, index, index, index, index) {{
  %m = hir.dim %x, 0 : {tensor(["?", 4, "?"], "bf16")}
  %k = hir.dim %x, 2 : {tensor(["?", 4, "?"], "bf16")}
  %four = hir.dim %x, 1 : {tensor(["?", 4, "?"], "bf16")}
  %d = hir.dim %s, 0 : {tensor(["?", 3], "i32", mesh=[0, 1], axes="didx _")}
  %a = hir.allocate(%m, %k) : {tensor(["?", 2, "?"], "bf16")}
  %b = hir.allocate(%d) : {tensor(["?", 3], "i64", mesh=[0, 1], axes="didx _")}
  %c = hir.allocate() : {tensor([5], "f16", mesh=[1])}
  %e = hir.allocate() : {tensor([2, 2], "i1")}
  func.return %a, %b, %c, %e, %m, %k, %four, %d : {tensor(["?", 2, "?"], "bf16")}, {tensor(["?", 3], "i64", mesh=[0, 1], axes="didx _")}, {tensor([5], "f16", mesh=[1])}, {tensor([2, 2], "i1")}, index, index, index, index
}}
"""


def test_allocate_and_dim_honour_types_and_meshes():
    x = torch.zeros(6, 4, 9, dtype=torch.bfloat16)
    s = torch.zeros(1, 3, dtype=torch.int32)
    a, b, c, e, m, k, four, d = run_host(ALLOCATIONS, [x, s])
    assert (m, k, four, d) == (6, 9, 4, 2)  # logical extents; the didx axis spans the mesh
    assert (a.shape, a.dtype) == ((6, 2, 9), torch.bfloat16)
    assert (b.shape, b.dtype) == ((1, 3), torch.int64)  # local: extent 1 on the didx axis
    assert (c.shape, c.dtype) == ((0,), torch.float16)  # rank 0 is outside mesh [1]: a placeholder
    assert (e.shape, e.dtype) == ((2, 2), torch.bool)
    assert all(t.device == CPU for t in (a, b, c, e))


OUTSIDE = tensor(["?", "?"], mesh=[1])
DIMS_OUTSIDE_THE_MESH = f"""
func.func @main(%x: {OUTSIDE}) -> ({OUTSIDE}, index, index, index, index) {{
  %c0 = arith.constant 0 : index
  %m = hir.dim %x, 0 : {OUTSIDE}
  %k = hir.dim %x, 1 : {OUTSIDE}
  %y = hir.allocate(%k, %m) : {OUTSIDE}
  %row = hir.alias_select %y[0 = %c0] : {OUTSIDE} -> {tensor(["?"], mesh=[1])}
  %row_extent = hir.dim %row, 0 : {tensor(["?"], mesh=[1])}
  %column = hir.alias_select %x[0 = %c0] : {OUTSIDE} -> {tensor(["?"], mesh=[1])}
  %column_extent = hir.dim %column, 0 : {tensor(["?"], mesh=[1])}
  func.return %y, %m, %k, %row_extent, %column_extent : {OUTSIDE}, index, index, index, index
}}
"""


def test_dim_knows_dynamic_extents_on_ranks_outside_the_mesh(rng):
    """An input's extents come from the run's `input_extents`, an allocation's from its size operands."""
    x = torch.randn(5, 3, generator=rng)
    y, *inside = run_host(DIMS_OUTSIDE_THE_MESH, [x], rank=1)
    assert inside == [5, 3, 5, 3] and y.shape == (3, 5)
    extents = {(0, 0): 5, (0, 1): 3}
    y, *outside = run_host(DIMS_OUTSIDE_THE_MESH, [torch.empty(0)], rank=0, input_extents=extents)
    assert outside == [5, 3, 5, 3] and y.shape == (0,)
    with pytest.raises(
        HostirError,
        match=r"<stdin>:4:3: error: rank 0 is outside the mesh \[1\] of the buffer, so it does not know the "
        r"dynamic extent of axis 0 \(Program.run tells every rank the extents of every input; this run was "
        r"not given those of input #0\)",
    ):
        run_host(DIMS_OUTSIDE_THE_MESH, [torch.empty(0)], rank=0)


def test_rank_outside_a_mesh_gets_placeholders_and_skips_compute(rng):
    program = f"""
    func.func @main(%x: {tensor([4, 3], mesh=[1])}) -> {tensor([4, 3], mesh=[1])} {{
      %y = hir.allocate() : {tensor([4, 3], mesh=[1])}
      %c0 = arith.constant 0 : index
      %xv = hir.alias_select %x[0 = %c0] : {tensor([4, 3], mesh=[1])} -> {tensor([3], mesh=[1])}
      %yv = hir.alias_select %y[0 = %c0] : {tensor([4, 3], mesh=[1])} -> {tensor([3], mesh=[1])}
      hir.pointwise "neg" ins(%xv : {tensor([3], mesh=[1])}) outs(%yv : {tensor([3], mesh=[1])})
      hir.copy ins(%x : {tensor([4, 3], mesh=[1])}) outs(%y : {tensor([4, 3], mesh=[1])})
      func.return %y : {tensor([4, 3], mesh=[1])}
    }}
    """
    x = torch.randn(4, 3, generator=rng)
    (outside,) = run_host(program, [torch.empty(0)], rank=0)
    assert outside.shape == (0,)
    (inside,) = run_host(program, [x], rank=1)
    torch.testing.assert_close(inside, x)


VIEWS = f"""
func.func @main(%x: {tensor([3, 5])}) -> ({tensor([3, 4, 5])}, {tensor([3, 5])}) {{
  %c2 = arith.constant 2 : index
  %buffer = hir.allocate() : {tensor([3, 4, 5])}
  %view = hir.alias_select %buffer[1 = %c2] : {tensor([3, 4, 5])} -> {tensor([3, 5])}
  hir.copy ins(%x : {tensor([3, 5])}) outs(%view : {tensor([3, 5])})
  func.return %buffer, %view : {tensor([3, 4, 5])}, {tensor([3, 5])}
}}
"""


def test_alias_select_is_a_view_that_writes_through(rng):
    x = torch.randn(3, 5, generator=rng)
    buffer, view = run_host(VIEWS, [x])
    assert view._base is buffer or view._base is buffer._base
    assert view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    torch.testing.assert_close(buffer[:, 2], x)
    assert buffer[:, [0, 1, 3]].isnan().all()  # nothing else was written
    view.fill_(4.0)
    assert (buffer[:, 2] == 4.0).all()


ATEN_RESULTS = f"""
func.func @main(%x: {tensor([3, 5])}) -> ({tensor([5, 3])}, {tensor([5, 3])}, {tensor([2, 5, 3])}) {{
  %c1 = arith.constant 1 : index
  %t = hir.allocate() : {tensor([5, 3])}
  hir.aten "aten.t.default" call "[[{{'operand': 0}}], {{}}]" ins(%x : {tensor([3, 5])}) outs(%t : {tensor([5, 3])}) adopted [0]
  %clone = hir.allocate() : {tensor([5, 3])}
  hir.aten "aten.clone.default" call "[[{{'operand': 0}}], {{}}]" ins(%t : {tensor([5, 3])}) outs(%clone : {tensor([5, 3])}) adopted [0]
  %both = hir.allocate() : {tensor([2, 5, 3])}
  %second = hir.alias_select %both[0 = %c1] : {tensor([2, 5, 3])} -> {tensor([5, 3])}
  hir.aten "aten.clone.default" call "[[{{'operand': 0}}], {{}}]" ins(%t : {tensor([5, 3])}) outs(%second : {tensor([5, 3])})
  func.return %t, %clone, %both : {tensor([5, 3])}, {tensor([5, 3])}, {tensor([2, 5, 3])}
}}
"""


def test_an_aten_result_keeps_atens_layout_and_a_slice_out_gets_a_copy(rng):
    """An out marked `adopted` is ATen's result as ATen made it: a view stays a view of the
    input, a clone of a transpose keeps the transposed strides (which flash attention's
    backward depends on); a slice of a larger buffer gets the result copied in. Without
    the marks (a program not lowered with forward-buffers), every result is copied in."""
    x = torch.randn(3, 5, generator=rng)
    t, clone, both = run_host(ATEN_RESULTS, [x])
    assert t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert clone.stride() == x.t().clone().stride() == (1, 5)
    torch.testing.assert_close(clone, x.t())
    torch.testing.assert_close(both[1], x.t())
    assert both[0].isnan().all()  # the rest of the buffer is not written
    t, clone, both = run_host(ATEN_RESULTS.replace(" adopted [0]", ""), [x])
    assert t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr() and clone.is_contiguous()
    torch.testing.assert_close(t, x.t())
    torch.testing.assert_close(clone, x.t())


def test_an_adopted_buffer_gets_no_memory(rng, monkeypatch):
    """The allocation of an out that its op adopts holds no memory: the op's result replaces
    it, so memory there would be allocated at every run and dropped unused."""
    allocated = []
    empty = torch.empty

    def recording_empty(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        allocated.append(tensor.numel())
        return tensor

    monkeypatch.setattr(torch, "empty", recording_empty)
    x = torch.randn(3, 5, generator=rng)
    t, clone, both = run_host(ATEN_RESULTS, [x])
    assert 15 not in allocated and 30 in allocated  # only the buffer whose slice gets a copy
    torch.testing.assert_close(clone, x.t())
    allocated.clear()
    run_host(ATEN_RESULTS.replace(" adopted [0]", ""), [x])
    assert allocated.count(15) == 2


ATEN_INTO_A_VIEWED_BUFFER = f"""
func.func @main(%x: {tensor([3, 5])}) -> ({tensor([5, 3])}, {tensor([3])}) {{
  %c1 = arith.constant 1 : index
  %t = hir.allocate() : {tensor([5, 3])}
  %row = hir.alias_select %t[0 = %c1] : {tensor([5, 3])} -> {tensor([3])}
  hir.aten "aten.t.default" call "[[{{'operand': 0}}], {{}}]" ins(%x : {tensor([3, 5])}) outs(%t : {tensor([5, 3])})
  func.return %t, %row : {tensor([5, 3])}, {tensor([3])}
}}
"""


def test_an_aten_result_into_a_buffer_viewed_before_it_is_copied_in(rng):
    """A view made before the op sees what the op writes: the buffer keeps its memory."""
    x = torch.randn(3, 5, generator=rng)
    t, row = run_host(ATEN_INTO_A_VIEWED_BUFFER, [x])
    torch.testing.assert_close(t, x.t())
    torch.testing.assert_close(row, x.t()[1])


ATEN_RETURNS = f"""
func.func @main(%g: {tensor([4, 6])}, %x: {tensor([4, 6])}, %mean: {tensor([4, 1])}, %rstd: {tensor([4, 1])}, %w: {tensor([6])}) -> ({tensor([4, 6])}, {tensor([6])}, {tensor([6])}, {tensor([4], "i64")}) {{
  %gx = hir.allocate() : {tensor([4, 6])}
  %gw = hir.allocate() : {tensor([6])}
  %gb = hir.allocate() : {tensor([6])}
  hir.aten "aten.native_layer_norm_backward.default" call "[[{{'operand': 0}}, {{'operand': 1}}, [6], {{'operand': 2}}, {{'operand': 3}}, {{'operand': 4}}, {{'operand': 4}}, [True, False, True]], {{}}]" returns [0, 1, 2] ins(%g, %x, %mean, %rstd, %w : {tensor([4, 6])}, {tensor([4, 6])}, {tensor([4, 1])}, {tensor([4, 1])}, {tensor([6])}) outs(%gx, %gw, %gb : {tensor([4, 6])}, {tensor([6])}, {tensor([6])})
  %where = hir.allocate() : {tensor([4], "i64")}
  hir.aten "aten.max.dim" call "[[{{'operand': 0}}, 1], {{}}]" returns [1] ins(%x : {tensor([4, 6])}) outs(%where : {tensor([4], "i64")})
  func.return %gx, %gw, %gb, %where : {tensor([4, 6])}, {tensor([6])}, {tensor([6])}, {tensor([4], "i64")}
}}
"""


def test_aten_returns_picks_results_by_position_and_an_undefined_one_stays_unwritten(rng):
    """`returns` names the items of ATen's tuple that fill the outs: the indices alone of
    `max.dim`; the layer norm backward's three gradients, of which the masked-off weight
    gradient is an undefined tensor (None) that leaves its out as it was."""
    g, x, w = (torch.randn(*shape, generator=rng) for shape in ((4, 6), (4, 6), (6,)))
    mean, rstd = x.mean(1, keepdim=True), x.var(1, unbiased=False, keepdim=True).add(1e-5).rsqrt()
    gx, gw, gb, where = run_host(ATEN_RETURNS, [g, x, mean, rstd, w])
    expected = torch.ops.aten.native_layer_norm_backward(g, x, [6], mean, rstd, w, w, [True, False, True])
    torch.testing.assert_close(gx, expected[0])
    assert gw.isnan().all()
    torch.testing.assert_close(gb, expected[2])
    assert torch.equal(where, x.argmax(1))


STREAMED = f"""
func.func @main() -> {tensor([2, 3, 4], axes="_ stream _")} {{
  %b = hir.allocate() : {tensor([2, 3, 4], axes="_ stream _")}
  func.return %b : {tensor([2, 3, 4], axes="_ stream _")}
}}
"""


def test_a_buffer_with_a_stream_axis_has_it_outermost_in_memory():
    """Each slice that a pipelined loop reads or writes is one contiguous block; a buffer of
    an `order` has its axes in memory in that order, the outermost first."""
    (buffer,) = run_host(STREAMED, [])
    assert buffer.shape == (2, 3, 4)
    assert all(buffer.select(1, i).is_contiguous() for i in range(3))
    (ordered,) = run_host(STREAMED.replace("hir.allocate()", "hir.allocate() order [2, 0, 1]"), [])
    assert ordered.shape == (2, 3, 4) and ordered.permute(2, 0, 1).is_contiguous()
    assert empty_in_order([2, 3], [0, 1], torch.float32, CPU).is_contiguous()


def test_atens_results_that_do_not_fit_the_op_are_named():
    """What ATen returns is checked against the op's results at every call: a position past
    the tuple, a count that differs, an item that is no tensor."""
    x = torch.zeros(2)
    with pytest.raises(HostirError, match=r"aten.f returned 2 results, but 'returns' names position 3"):
        picker("aten.f", DenseArrayBase.from_list(i64, [0, 3]), 2)((x, x))
    with pytest.raises(HostirError, match=r"aten.f returned 2 results for 1; name them with 'returns'"):
        picker("aten.f", None, 1)((x, x))
    with pytest.raises(HostirError, match=r"aten.f returned a int where a tensor was expected"):
        picker("aten.f", None, 2)((x, 5))
    assert picker("aten.f", DenseArrayBase.from_list(i64, [1]), 1)((5, x, None))[0] is x


HANDED_OVER = f"""
func.func @main(%x: {tensor([4, 6])}) -> ({tensor([4, 6])}, {tensor([4, 6])}, {tensor([4, 6])}, {tensor([4, 6], axes="stream _")}, {tensor([4, 6])}) {{
  %streamed = hir.allocate() : {tensor([4, 6], axes="stream _")}
  hir.pointwise "neg" ins(%x : {tensor([4, 6])}) outs(%streamed : {tensor([4, 6], axes="stream _")})
  %whole = hir.allocate() : {tensor([4, 6])}
  hir.copy ins(%streamed : {tensor([4, 6], axes="stream _")}) outs(%whole : {tensor([4, 6])})
  hir.deallocate %streamed : {tensor([4, 6], axes="stream _")}
  %kept = hir.allocate() : {tensor([4, 6])}
  hir.pointwise "exp" ins(%x : {tensor([4, 6])}) outs(%kept : {tensor([4, 6])})
  %copy = hir.allocate() : {tensor([4, 6])}
  hir.copy ins(%kept : {tensor([4, 6])}) outs(%copy : {tensor([4, 6])})
  hir.pointwise "abs" ins(%x : {tensor([4, 6])}) outs(%kept : {tensor([4, 6])})
  %saved = hir.allocate() : {tensor([4, 6], axes="stream _")}
  hir.pointwise "tanh" ins(%x : {tensor([4, 6])}) outs(%saved : {tensor([4, 6], axes="stream _")})
  %flat = hir.allocate() : {tensor([4, 6])}
  hir.copy ins(%saved : {tensor([4, 6], axes="stream _")}) outs(%flat : {tensor([4, 6])})
  %read = hir.allocate() : {tensor([4, 6])}
  hir.pointwise "sigmoid" ins(%flat : {tensor([4, 6])}) outs(%read : {tensor([4, 6])})
  hir.deallocate %flat : {tensor([4, 6])}
  func.return %whole, %copy, %kept, %saved, %read : {tensor([4, 6])}, {tensor([4, 6])}, {tensor([4, 6])}, {tensor([4, 6], axes="stream _")}, {tensor([4, 6])}
}}
"""


def test_a_copy_of_a_buffer_that_dies_there_is_the_buffer_itself(monkeypatch, rng):
    """A pipelined loop's result copied into a buffer without the stream axis, and freed:
    forward-buffers marks the copy `forwards_source`, and the out is the source's memory;
    so is one returned (a loop's result saved for a backward) whose out a kernel reads
    before it is freed. A source written after the copy is copied."""
    module = parse_module(HANDED_OVER)
    ForwardBuffers().apply(hostir_context(), module)
    copies = [op for op in module.walk() if isinstance(op, hir.CopyOp)]
    assert [op.forwards_source is not None for op in copies] == [True, False, True]
    marked = print_module(module)
    made: list[torch.Tensor] = []
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: made.append(empty(*args, **kwargs)) or made[-1])
    x = torch.randn(4, 6, generator=rng)
    whole, copy, kept, saved, read = run_host(marked, [x])
    torch.testing.assert_close(whole, -x)
    torch.testing.assert_close(saved, x.tanh())
    torch.testing.assert_close(read, x.tanh().sigmoid())
    torch.testing.assert_close(copy, x.exp())
    torch.testing.assert_close(kept, x.abs())
    assert copy.untyped_storage().data_ptr() != kept.untyped_storage().data_ptr()
    assert whole.untyped_storage().data_ptr() == made[0].untyped_storage().data_ptr()  # %streamed's


PERMUTED_PRODUCT = f"""
func.func @main(%x: {tensor([2, 3, 4])}, %w: {tensor([4, 5])}) -> {tensor([2, 6, 5])} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %s = hir.allocate() : {tensor([2, 2, 3, 5], axes="stream _ _ _")}
  scf.for %i = %c0 to %c2 step %c1 {{
    %chunk = hir.alias_select %s[0 = %i] : {tensor([2, 2, 3, 5], axes="stream _ _ _")} -> {tensor([2, 3, 5])}
    %xi = hir.allocate() : {tensor([2, 3, 4])}
    hir.pointwise "mul" ins(%x, %x : {tensor([2, 3, 4])}, {tensor([2, 3, 4])}) outs(%xi : {tensor([2, 3, 4])})
    hir.matmul ins(%xi, %w : {tensor([2, 3, 4])}, {tensor([4, 5])}) outs(%chunk : {tensor([2, 3, 5])})
    hir.deallocate %xi : {tensor([2, 3, 4])}
  }}
  %whole = hir.allocate() : {tensor([2, 2, 3, 5])}
  hir.copy ins(%s : {tensor([2, 2, 3, 5], axes="stream _ _ _")}) outs(%whole : {tensor([2, 2, 3, 5])}) forwards_source
  hir.deallocate %s : {tensor([2, 2, 3, 5], axes="stream _ _ _")}
  %p = hir.allocate() : {tensor([2, 2, 3, 5])}
  hir.aten "aten.permute.default"(%whole, [1, 0, 2, 3]) ins(%whole : {tensor([2, 2, 3, 5])}) outs(%p : {tensor([2, 2, 3, 5])}) adopted [0]
  hir.deallocate %whole : {tensor([2, 2, 3, 5])}
  %r = hir.allocate() : {tensor([2, 6, 5])}
  hir.aten "aten.reshape.default"(%p, [2, 6, 5]) ins(%p : {tensor([2, 2, 3, 5])}) outs(%r : {tensor([2, 6, 5])}) adopted [0]
  hir.deallocate %p : {tensor([2, 2, 3, 5])}
  func.return %r : {tensor([2, 6, 5])}
}}
"""


@pytest.mark.parametrize("laid_out", [True, False], ids=["buffer_layouts", "in_order"])
def test_a_product_read_through_a_permute_is_written_in_its_order(monkeypatch, rng, laid_out):
    """A pipelined loop's GEMMs, read back through a permute and a reshape: buffer-layouts
    allocates their buffer in the permute's order, the GEMMs write their chunks as strided
    views, and the reshape's result is that buffer's memory, not a copy; in order (the pass
    left out), the same values through a copy."""
    module = parse_module(PERMUTED_PRODUCT)
    if laid_out:
        BufferLayouts().apply(hostir_context(), module)
    made: list[torch.Tensor] = []
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: made.append(empty(*args, **kwargs)) or made[-1])
    x, w = torch.randn(2, 3, 4, generator=rng), torch.randn(4, 5, generator=rng)
    (result,) = run_host(print_module(module), [x, w])
    chunk = (x * x) @ w
    torch.testing.assert_close(result, torch.stack([chunk, chunk]).permute(1, 0, 2, 3).reshape(2, 6, 5))
    gemms_buffer = made[0].untyped_storage().data_ptr()  # %s's
    assert (result.untyped_storage().data_ptr() == gemms_buffer) == laid_out


SUMMED_PRODUCTS = f"""
func.func private @add(%a: {tensor([6, 5])}, %b: {tensor([6, 5])}) -> {tensor([6, 5])} {{
  %sum = fusion.add %a, %b : ({tensor([6, 5])}, {tensor([6, 5])}) -> {tensor([6, 5])}
  func.return %sum : {tensor([6, 5])}
}}
func.func @main(%dq: {tensor([6, 4])}, %wq: {tensor([4, 5])}, %dk: {tensor([6, 4])}, %wk: {tensor([4, 5])}) -> {tensor([6, 5])} {{
  %p = hir.allocate() : {tensor([6, 5])}
  hir.matmul ins(%dq, %wq : {tensor([6, 4])}, {tensor([4, 5])}) outs(%p : {tensor([6, 5])})
  %q = hir.allocate() : {tensor([6, 5])}
  hir.matmul ins(%dk, %wk : {tensor([6, 4])}, {tensor([4, 5])}) outs(%q : {tensor([6, 5])})
  %s = hir.allocate() : {tensor([6, 5])}
  hir.launch_kernel @add ins(%p, %q : {tensor([6, 5])}, {tensor([6, 5])}) outs(%s : {tensor([6, 5])})
  func.return %s : {tensor([6, 5])}
}}
"""


def test_a_sum_of_two_products_made_in_the_second_gemm_is_the_sum(rng):
    """sum-in-matmul: the second GEMM adds its product into the first's, and the program's
    result is still the sum of the two products, the kernel that added them gone."""
    module = parse_module(SUMMED_PRODUCTS)
    SumInMatmul().apply(hostir_context(), module)
    text = print_module(module)
    assert "hir.matmul accumulate" in text and "hir.launch_kernel" not in text
    dq, dk = (torch.randn(6, 4, generator=rng) for _ in range(2))
    wq, wk = (torch.randn(4, 5, generator=rng) for _ in range(2))
    (result,) = run_host(text, [dq, wq, dk, wk])
    torch.testing.assert_close(result, dq @ wq + dk @ wk)


DEALLOCATION = f"""
func.func @main(%x: {tensor([64])}) -> {tensor([64])} {{
  %c0 = arith.constant 0 : index
  %t = hir.allocate() : {tensor([2, 64])}
  %out = hir.allocate() : {tensor([64])}
  %v = hir.alias_select %t[0 = %c0] : {tensor([2, 64])} -> {tensor([64])}
  hir.copy ins(%x : {tensor([64])}) outs(%v : {tensor([64])})
  hir.pointwise "neg" ins(%v : {tensor([64])}) outs(%out : {tensor([64])})
  %before = hir.device_index
  hir.deallocate %t : {tensor([2, 64])}
  %after = hir.device_index
  func.return %out : {tensor([64])}
}}
"""


def test_deallocate_frees_the_buffer_and_its_views(monkeypatch, rng):
    """`hir.device_index` is made a probe that records which allocations are still alive."""
    allocated: list[weakref.ref] = []
    alive_at_probes: list[list[bool]] = []
    empty = torch.empty

    def recording_empty(*args, **kwargs):
        result = empty(*args, **kwargs)
        allocated.append(weakref.ref(result))
        return result

    def probe(op, prep):
        def step(env, context):
            alive_at_probes.append([ref() is not None for ref in allocated])

        return step

    monkeypatch.setitem(HANDLERS, hir.DeviceIndexOp, probe)
    monkeypatch.setattr(torch, "empty", recording_empty)
    x = torch.randn(64, generator=rng)
    (out,) = run_host(DEALLOCATION, [x])
    assert alive_at_probes == [[True, True], [False, True]]
    torch.testing.assert_close(out, -x)


# --------------------------------------------------------------------------- #
# Streams on the CPU                                                           #
# --------------------------------------------------------------------------- #

STREAMS = f"""
func.func @main(%x: {tensor([6, 4])}) -> ({tensor([6, 4])}, index) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c6 = arith.constant 6 : index
  %out = hir.allocate() : {tensor([6, 4])}
  %main = hir.get_current_stream
  %ns = hir.number_of_streams
  scf.for %i = %c0 to %c6 step %c1 {{
    %j = arith.remui %i, %ns : index
    %s = hir.stream %j
    hir.set_current_stream %s
    hir.synchronize_stream %main
  }}
  scf.for %i = %c0 to %c6 step %c1 {{
    %j = arith.remui %i, %ns : index
    %s = hir.stream %j
    hir.set_current_stream %s
    %xi = hir.alias_select %x[0 = %i] : {tensor([6, 4])} -> {tensor([4])}
    %yi = hir.alias_select %out[0 = %i] : {tensor([6, 4])} -> {tensor([4])}
    hir.pointwise "exp" ins(%xi : {tensor([4])}) outs(%yi : {tensor([4])})
    hir.set_current_stream %main
    hir.synchronize_stream %s
  }}
  func.return %out, %ns : {tensor([6, 4])}, index
}}
"""


@pytest.mark.parametrize("num_streams", [1, 3, 4, 8])
def test_stream_ops_run_in_program_order_on_cpu(num_streams, rng):
    x = torch.randn(6, 4, generator=rng)
    out, reported = run_host(STREAMS, [x], num_streams=num_streams)
    assert reported == num_streams
    torch.testing.assert_close(out, torch.exp(x))


def test_stream_index_past_the_pool_is_an_error_at_hir_stream():
    program = """
    func.func @main(%i: index) -> () {
      %s = hir.stream %i
      hir.set_current_stream %s
      func.return
    }
    """
    run_host(program, [3], num_streams=4)
    with pytest.raises(HostirError, match=r"(?s):3:7: .*stream index 4 is out of range for a pool of 4.*hir.stream"):
        run_host(program, [4], num_streams=4)


# --------------------------------------------------------------------------- #
# Compute                                                                      #
# --------------------------------------------------------------------------- #

UNARY = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
         "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
          "maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow}


def _rounded(function, dtype, *inputs):
    """Plain torch at f32 for bf16/f16 inputs, rounded once: what a pointwise op must give."""
    return function(*(x.float() for x in inputs)).to(dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_pointwise_kinds_into_strided_views(dtype, rng):
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    t, v = tensor([4, 2, 3], dtype), tensor([4, 3], dtype)
    kinds = [*UNARY, *BINARY]
    body = []
    for n, kind in enumerate(kinds):
        ins = "%xv : " + v if kind in UNARY else f"%xv, %zv : {v}, {v}"
        body.append(f"""
      %out{n} = hir.allocate() : {t}
      %o{n} = hir.alias_select %out{n}[1 = %c1] : {t} -> {v}
      hir.pointwise "{kind}" ins({ins}) outs(%o{n} : {v})""")
    program = f"""
    func.func @main(%x: {t}, %z: {t}) -> ({", ".join([t] * len(kinds))}) {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %xv = hir.alias_select %x[1 = %c0] : {t} -> {v}
      %zv = hir.alias_select %z[1 = %c1] : {t} -> {v}
      {"".join(body)}
      func.return {", ".join(f"%out{n}" for n in range(len(kinds)))} : {", ".join([t] * len(kinds))}
    }}
    """
    x = torch.rand(4, 2, 3, generator=rng).add(0.5).to(torch_dtype)
    z = torch.randn(4, 2, 3, generator=rng).to(torch_dtype)
    outs = run_host(program, [x, z])
    for kind, out in zip(kinds, outs):
        function = UNARY.get(kind) or BINARY[kind]
        operands = (x[:, 0],) if kind in UNARY else (x[:, 0], z[:, 1])
        torch.testing.assert_close(out[:, 1], _rounded(function, torch_dtype, *operands), msg=kind)
        assert out[:, 0].isnan().all(), kind


def test_cast_pointwise_rounds_into_the_output_type(rng):
    program = f"""
    func.func @main(%x: {tensor([8])}) -> {tensor([8], "bf16")} {{
      %y = hir.allocate() : {tensor([8], "bf16")}
      hir.pointwise "cast" ins(%x : {tensor([8])}) outs(%y : {tensor([8], "bf16")})
      func.return %y : {tensor([8], "bf16")}
    }}
    """
    x = torch.randn(8, generator=rng)
    (y,) = run_host(program, [x])
    assert torch.equal(y, x.bfloat16())


MATMUL_LINEAR = f"""
func.func @main(%a: {tensor([3, 5, 4])}, %b: {tensor([4, 6])}, %w: {tensor([6, 4])}, %bias: {tensor([6])}) -> ({tensor([3, 5, 6])}, {tensor([5, 2, 6])}, {tensor([3, 5, 6])}, {tensor([3, 5, 4])}, {tensor([6, 2])}) {{
  %c1 = arith.constant 1 : index
  %c0 = arith.constant 0 : index
  %mm = hir.allocate() : {tensor([3, 5, 6])}
  hir.matmul ins(%a, %b : {tensor([3, 5, 4])}, {tensor([4, 6])}) outs(%mm : {tensor([3, 5, 6])})
  %strided = hir.allocate() : {tensor([5, 2, 6])}
  %a0 = hir.alias_select %a[0 = %c0] : {tensor([3, 5, 4])} -> {tensor([5, 4])}
  %s1 = hir.alias_select %strided[1 = %c1] : {tensor([5, 2, 6])} -> {tensor([5, 6])}
  hir.linear ins(%a0, %w : {tensor([5, 4])}, {tensor([6, 4])}) outs(%s1 : {tensor([5, 6])})
  %lin = hir.allocate() : {tensor([3, 5, 6])}
  hir.linear ins(%a, %w, %bias : {tensor([3, 5, 4])}, {tensor([6, 4])}, {tensor([6])}) outs(%lin : {tensor([3, 5, 6])})
  %copy = hir.allocate() : {tensor([3, 5, 4])}
  hir.copy ins(%a : {tensor([3, 5, 4])}) outs(%copy : {tensor([3, 5, 4])})
  %vector = hir.alias_select %a0[0 = %c0] : {tensor([5, 4])} -> {tensor([4])}
  %columns = hir.allocate() : {tensor([6, 2])}
  %column = hir.alias_select %columns[1 = %c1] : {tensor([6, 2])} -> {tensor([6])}
  hir.matmul ins(%vector, %b : {tensor([4])}, {tensor([4, 6])}) outs(%column : {tensor([6])})
  func.return %mm, %strided, %lin, %copy, %columns : {tensor([3, 5, 6])}, {tensor([5, 2, 6])}, {tensor([3, 5, 6])}, {tensor([3, 5, 4])}, {tensor([6, 2])}
}}
"""


def test_matmul_linear_and_copy(rng):
    a, b = torch.randn(3, 5, 4, generator=rng), torch.randn(4, 6, generator=rng)
    w, bias = torch.randn(6, 4, generator=rng), torch.randn(6, generator=rng)
    mm, strided, lin, copy, columns = run_host(MATMUL_LINEAR, [a, b, w, bias])
    torch.testing.assert_close(mm, a @ b)
    torch.testing.assert_close(strided[:, 1], a[0] @ w.T)
    assert strided[:, 0].isnan().all()
    torch.testing.assert_close(lin, a @ w.T + bias)
    assert torch.equal(copy, a) and copy.data_ptr() != a.data_ptr()
    torch.testing.assert_close(columns[:, 1], a[0, 0] @ b)  # a vector-matrix product into a strided view
    assert columns[:, 0].isnan().all()


@pytest.mark.parametrize(
    "lhs, rhs, axis",
    [
        ([2, 3, 4], [4, 5], 1),  # a batch folded into the rows of a view that cannot be one matrix
        ([2, 3, 4], [4], 1),
        ([2, 2, 3, 4], [4, 5], 1),
        ([2, 2, 3, 4], [4, 5], 2),
        ([1, 2, 3, 4], [4], 2),
        ([2, 3, 4], [4, 5], 0),  # a contiguous view: torch folds the batch
        ([4], [4, 5], 1),  # vector-matrix
        ([4], [2, 4, 5], 2),
        ([3, 4], [2, 4, 5], 1),
    ],
)
def test_matmul_into_a_strided_view_neither_resizes_nor_loses_data(lhs, rhs, axis, rng):
    """torch.matmul(out=) resizes these outputs (a UserWarning, data lost) or raises; hir.matmul must not."""
    a, b = torch.randn(lhs, generator=rng), torch.randn(rhs, generator=rng)
    expected = torch.matmul(a, b)
    shape = list(expected.shape)
    big = [*shape[:axis], 3, *shape[axis:]]
    program = f"""
    func.func @main(%a: {tensor(lhs)}, %b: {tensor(rhs)}) -> {tensor(big)} {{
      %c1 = arith.constant 1 : index
      %big = hir.allocate() : {tensor(big)}
      %out = hir.alias_select %big[{axis} = %c1] : {tensor(big)} -> {tensor(shape)}
      hir.matmul ins(%a, %b : {tensor(lhs)}, {tensor(rhs)}) outs(%out : {tensor(shape)})
      func.return %big : {tensor(big)}
    }}"""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (result,) = run_host(program, [a, b])
    torch.testing.assert_close(result.select(axis, 1), expected)
    assert result.select(axis, 0).isnan().all() and result.select(axis, 2).isnan().all()


@pytest.mark.parametrize(
    "lhs, rhs, axis",
    [
        ([3, 4], [4, 5], 0),  # addmm_ into a contiguous view
        ([3, 4], [4, 5], 1),  # addmm_ into a strided one
        ([1, 3, 4], [1, 4, 5], 1),  # a batch of one: addmm_ on its matrices
        ([2, 3, 4], [2, 4, 5], 1),  # baddbmm_
        ([2, 3, 4], [4, 5], 0),  # broadcast: the product added after it
        ([2, 2, 3, 4], [2, 2, 4, 5], 1),
        ([4], [4, 5], 1),
    ],
)
def test_an_accumulating_matmul_adds_its_product_to_what_its_output_holds(lhs, rhs, axis, rng):
    """`hir.matmul accumulate` into a slice of a buffer: the slice becomes what it held plus
    the product; the other slices are left as they were."""
    a, b = torch.randn(lhs, generator=rng), torch.randn(rhs, generator=rng)
    shape = list(torch.matmul(a, b).shape)
    big = [*shape[:axis], 3, *shape[axis:]]
    before = torch.randn(big, generator=rng)
    program = f"""
    func.func @main(%a: {tensor(lhs)}, %b: {tensor(rhs)}, %before: {tensor(big)}) -> {tensor(big)} {{
      %c1 = arith.constant 1 : index
      %big = hir.allocate() : {tensor(big)}
      hir.copy ins(%before : {tensor(big)}) outs(%big : {tensor(big)})
      %out = hir.alias_select %big[{axis} = %c1] : {tensor(big)} -> {tensor(shape)}
      hir.matmul accumulate ins(%a, %b : {tensor(lhs)}, {tensor(rhs)}) outs(%out : {tensor(shape)})
      func.return %big : {tensor(big)}
    }}"""
    (result,) = run_host(program, [a, b, before])
    torch.testing.assert_close(result.select(axis, 1), before.select(axis, 1) + torch.matmul(a, b))
    for untouched in (0, 2):
        assert torch.equal(result.select(axis, untouched), before.select(axis, untouched))


@pytest.mark.parametrize(
    "lhs, rhs, bias, axis",
    [
        ([6, 8], [8, 5], [5], 0),  # addmm into a contiguous view, the bias row a vector
        ([1, 6, 8], [1, 8, 5], [1, 1, 5], 0),  # a batch of one: addmm on its matrices
        ([6, 8], [8, 5], [6, 5], 0),  # a bias of the product's shape
        ([6, 8], [8, 5], [5], 1),  # a strided view
        ([2, 6, 8], [8, 5], [5], 0),  # a broadcast batch
    ],
)
def test_a_matmul_with_a_bias_rounds_once(lhs, rhs, bias, axis, rng):
    """`hir.matmul` with a bias in bf16: the bias joins the product before it is rounded
    (ATen's addmm), into any view of a buffer; rounding the product first would change
    about a quarter of the elements by one unit in the last place."""
    a, b, c = (torch.randn(shape, generator=rng).bfloat16() for shape in (lhs, rhs, bias))
    expected = (torch.matmul(a.float(), b.float()) + c.float()).bfloat16()
    assert not torch.equal(expected, (torch.matmul(a, b).float() + c.float()).bfloat16())
    shape = list(expected.shape)
    big = [*shape[:axis], 3, *shape[axis:]]
    program = f"""
    func.func @main(%a: {tensor(lhs, "bf16")}, %b: {tensor(rhs, "bf16")}, %c: {tensor(bias, "bf16")}) -> {tensor(big, "bf16")} {{
      %c1 = arith.constant 1 : index
      %big = hir.allocate() : {tensor(big, "bf16")}
      %out = hir.alias_select %big[{axis} = %c1] : {tensor(big, "bf16")} -> {tensor(shape, "bf16")}
      hir.matmul ins(%a, %b, %c : {tensor(lhs, "bf16")}, {tensor(rhs, "bf16")}, {tensor(bias, "bf16")}) outs(%out : {tensor(shape, "bf16")})
      func.return %big : {tensor(big, "bf16")}
    }}"""
    (result,) = run_host(program, [a, b, c])
    assert torch.equal(result.select(axis, 1), expected)
    assert result.select(axis, 0).isnan().all() and result.select(axis, 2).isnan().all()


@pytest.mark.parametrize(
    "lhs, rhs, out, gemm",
    [
        ([3, 4], [4, 5], [3, 5], "addmm_"),
        ([1, 3, 4], [1, 4, 5], [1, 3, 5], "addmm_"),
        ([2, 3, 4], [2, 4, 5], [2, 3, 5], "baddbmm_"),
        ([2, 3, 4], [4, 5], [2, 3, 5], "addmm_"),  # the batch folded into the rows
        ([2, 3, 4], [1, 4, 5], [2, 3, 5], "addmm_"),
        ([1, 3, 4], [2, 4, 5], [2, 3, 5], "baddbmm_"),  # the lhs broadcast along the batch
        ([2, 2, 3, 4], [2, 2, 4, 5], [2, 2, 3, 5], "baddbmm_"),  # one batch per outermost slice
        ([2, 2, 3, 4], [1, 1, 4, 5], [2, 2, 3, 5], "addmm_"),
        ([3, 4], [4], [3], "add_"),  # a vector's product
    ],
)
def test_an_accumulating_matmul_sums_in_the_gemm_where_torch_can(lhs, rhs, out, gemm, rng):
    """One matrix product (a batch of matrices times one matrix, its rows folded), or one batch
    of them (either side broadcast), adds in the GEMM's epilogue (`addmm_`, `baddbmm_`: no pass
    of its own over the output), several batch axes one outermost slice at a time; a vector's
    product adds after. The sum is the product's."""

    class Calls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    a, b, c = (torch.randn(shape, generator=rng) for shape in (lhs, rhs, out))
    expected = c + torch.matmul(a, b)
    with Calls() as calls:
        compute.matmul_accumulate_into(a, b, c)
    assert gemm in calls.names and not ({"addmm_", "baddbmm_", "add_"} - {gemm}) & set(calls.names)
    torch.testing.assert_close(c, expected)


@pytest.mark.parametrize("x_shape", [[5], [3, 5], [2, 3, 5], [2, 2, 3, 5]])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("axis", [0, -1], ids=["contiguous-view", "strided-view"])
def test_linear_into_a_view_matches_torch(x_shape, bias, axis, rng):
    """hir.linear writes x @ w^T + b into its output in place (a slice of a poisoned buffer),
    contiguous or strided, with any batch, with or without a bias."""
    x, w, b = torch.randn(x_shape, generator=rng), torch.randn(4, 5, generator=rng), torch.randn(4, generator=rng)
    expected = torch.nn.functional.linear(x.double(), w.double(), b.double() if bias else None).float()
    shape = list(expected.shape)
    axis = axis % (len(shape) + 1)
    big = [*shape[:axis], 3, *shape[axis:]]
    types = [tensor(x_shape), tensor([4, 5])] + ([tensor([4])] if bias else [])
    names = ["%x", "%w"] + (["%b"] if bias else [])
    arguments = ", ".join(f"{name}: {type}" for name, type in zip(names, types))
    program = f"""
    func.func @main({arguments}) -> {tensor(big)} {{
      %c1 = arith.constant 1 : index
      %big = hir.allocate() : {tensor(big)}
      %out = hir.alias_select %big[{axis} = %c1] : {tensor(big)} -> {tensor(shape)}
      hir.linear ins({", ".join(names)} : {", ".join(types)}) outs(%out : {tensor(shape)})
      func.return %big : {tensor(big)}
    }}"""
    (result,) = run_host(program, [x, w] + ([b] if bias else []))
    torch.testing.assert_close(result.select(axis, 1), expected)
    assert result.select(axis, 0).isnan().all() and result.select(axis, 2).isnan().all()


REDUCTIONS = f"""
func.func @main(%x: {tensor([4, 5, 6])}) -> ({tensor([4, 6])}, {tensor([1, 5, 1])}, {tensor([5])}) {{
  %s = hir.allocate() : {tensor([4, 6])}
  hir.reduction "sum" [1] ins(%x : {tensor([4, 5, 6])}) outs(%s : {tensor([4, 6])})
  %m = hir.allocate() : {tensor([1, 5, 1])}
  hir.reduction "max" [0, -1] keepdim ins(%x : {tensor([4, 5, 6])}) outs(%m : {tensor([1, 5, 1])})
  %n = hir.allocate() : {tensor([5])}
  hir.reduction "sum" [2, 0] ins(%x : {tensor([4, 5, 6])}) outs(%n : {tensor([5])})
  func.return %s, %m, %n : {tensor([4, 6])}, {tensor([1, 5, 1])}, {tensor([5])}
}}
"""


def test_reductions(rng):
    x = torch.randn(4, 5, 6, generator=rng)
    s, m, n = run_host(REDUCTIONS, [x])
    torch.testing.assert_close(s, x.sum(1))
    torch.testing.assert_close(m, x.amax((0, 2), keepdim=True))
    torch.testing.assert_close(n, x.sum((0, 2)))


SEGMENTS = f"""
func.func private @gelu_ish(%x: {tensor(["?", 4], "bf16")}, %b: {tensor([4], "bf16")}) -> ({tensor(["?", 4], "bf16")}, {tensor(["?", 4], "f32")}) {{
  %c = fusion.constant 0.5 : bf16 : {tensor([], "bf16")}
  %y = fusion.add %x, %b : ({tensor(["?", 4], "bf16")}, {tensor([4], "bf16")}) -> {tensor(["?", 4], "bf16")}
  %t = fusion.tanh %y : {tensor(["?", 4], "bf16")} -> {tensor(["?", 4], "bf16")}
  %h = fusion.mul %t, %c : ({tensor(["?", 4], "bf16")}, {tensor([], "bf16")}) -> {tensor(["?", 4], "bf16")}
  %f = fusion.cast %h : {tensor(["?", 4], "bf16")} -> {tensor(["?", 4], "f32")}
  func.return %h, %f : {tensor(["?", 4], "bf16")}, {tensor(["?", 4], "f32")}
}}
func.func private @spread(%b: {tensor([4], "bf16")}) -> {tensor([1, 4, 1], "bf16")} {{
  %s = fusion.broadcast %b [0, 2] : {tensor([4], "bf16")} -> {tensor([1, 4, 1], "bf16")}
  func.return %s : {tensor([1, 4, 1], "bf16")}
}}
func.func @main(%x: {tensor(["?", 4], "bf16")}, %b: {tensor([4], "bf16")}) -> ({tensor(["?", 4], "bf16")}, {tensor(["?", 4], "f32")}, {tensor([1, 4, 1], "bf16")}) {{
  %m = hir.dim %x, 0 : {tensor(["?", 4], "bf16")}
  %h = hir.allocate(%m) : {tensor(["?", 4], "bf16")}
  %f = hir.allocate(%m) : {tensor(["?", 4], "f32")}
  hir.launch_kernel @gelu_ish ins(%x, %b : {tensor(["?", 4], "bf16")}, {tensor([4], "bf16")}) outs(%h, %f : {tensor(["?", 4], "bf16")}, {tensor(["?", 4], "f32")})
  %s = hir.allocate() : {tensor([1, 4, 1], "bf16")}
  hir.post_on_stream @spread ins(%b : {tensor([4], "bf16")}) outs(%s : {tensor([1, 4, 1], "bf16")})
  func.return %h, %f, %s : {tensor(["?", 4], "bf16")}, {tensor(["?", 4], "f32")}, {tensor([1, 4, 1], "bf16")}
}}
"""


def test_segments_compute_in_f32_and_round_once_on_store(rng):
    x = torch.randn(7, 4, generator=rng).bfloat16()
    b = torch.randn(4, generator=rng).bfloat16()
    h, f, s = run_host(SEGMENTS, [x, b])
    in_f32 = torch.tanh(x.float() + b.float()) * 0.5
    assert torch.equal(h, in_f32.bfloat16())
    assert torch.equal(f, in_f32)  # the intermediate was never rounded to bf16
    assert not torch.equal(f, in_f32.bfloat16().float())
    assert torch.equal(s, b.reshape(1, 4, 1))


def test_a_torch_error_mid_run_names_the_op_and_its_line(rng):
    program = f"""
    func.func @main(%a: {tensor(["?", 4])}, %b: {tensor([5, 3])}) -> {tensor(["?", 3])} {{
      %m = hir.dim %a, 0 : {tensor(["?", 4])}
      %y = hir.allocate(%m) : {tensor(["?", 3])}
      hir.matmul ins(%a, %b : {tensor(["?", 4])}, {tensor([5, 3])}) outs(%y : {tensor(["?", 3])})
      func.return %y : {tensor(["?", 3])}
    }}"""
    with pytest.raises(HostirError, match=r"<stdin>:5:7: error: failed on rank 0: RuntimeError"):
        run_host(program, [torch.randn(2, 4, generator=rng), torch.randn(5, 3, generator=rng)])


def test_segment_runner_is_the_one_seam_for_fused_segments(monkeypatch, rng):
    """launch_kernel's segments go through `segment_runner`, bound once when the program
    is prepared; post_on_stream's move data, which their outs adopt as views."""
    prepared: list[str] = []
    original = compute.segment_runner

    def recording(callee):
        prepared.append(callee.sym_name.data)
        return original(callee)

    monkeypatch.setattr(compute, "segment_runner", recording)
    x = torch.randn(3, 4, generator=rng).bfloat16()
    b = torch.randn(4, generator=rng).bfloat16()
    run_host(SEGMENTS, [x, b])
    assert prepared == ["gelu_ish"]


BROADCAST_CONSTANT = f"""
func.func private @scale(%x: {tensor(["?", 4])}) -> {tensor(["?", 4])} {{
  %c = fusion.constant 2.5 : f32 : {tensor([])}
  %row = fusion.broadcast %c [0] : {tensor([])} -> {tensor([1])}
  %y = fusion.mul %x, %row : ({tensor(["?", 4])}, {tensor([1])}) -> {tensor(["?", 4])}
  func.return %y : {tensor(["?", 4])}
}}
func.func @main(%x: {tensor(["?", 4])}) -> ({tensor(["?", 4])}, {tensor(["?", 4])}) {{
  %m = hir.dim %x, 0 : {tensor(["?", 4])}
  %y = hir.allocate(%m) : {tensor(["?", 4])}
  hir.launch_kernel @scale ins(%x : {tensor(["?", 4])}) outs(%y : {tensor(["?", 4])})
  %z = hir.allocate(%m) : {tensor(["?", 4])}
  hir.post_on_stream @scale ins(%x : {tensor(["?", 4])}) outs(%z : {tensor(["?", 4])})
  func.return %y, %z : {tensor(["?", 4])}, {tensor(["?", 4])}
}}
"""


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        "meta",
        pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
    ],
)
def test_constants_are_made_on_the_device_of_the_run(device, rng):
    """A broadcast constant is 1-d: made on the CPU, it would not mix with tensors elsewhere.

    The meta device stands in for a GPU on machines without one: a CPU tensor does not
    mix with meta tensors either, so the check is the same.
    """
    x = torch.randn(3, 4, generator=rng).to(device)
    segment = host_function(BROADCAST_CONSTANT, "scale")
    (evaluated,) = fusion_eval.evaluate(segment, [x])
    kernel_path, eager_path = run_host(BROADCAST_CONSTANT, [x], device=torch.device(device))
    for result in (evaluated, kernel_path, eager_path):
        assert result.device == x.device and result.shape == x.shape
        if device != "meta":
            torch.testing.assert_close(result, x * 2.5)


def test_fusion_eval_gives_every_fusion_op_torch_semantics(rng):
    """The segment semantics op by op (f32), against plain torch."""
    m, v, s, w = tensor([3, 4]), tensor([4]), tensor([]), tensor([5, 4])
    unary = [f"%{k} = fusion.{k} %x : {m} -> {m}" for k in UNARY]
    binary = [f"%{k} = fusion.{k} %x, %y : ({m}, {m}) -> {m}" for k in BINARY]
    others = [
        f"%two = fusion.constant 2.0 : f32 : {s}",
        f"%scaled = fusion.mul %x, %two : ({m}, {s}) -> {m}",
        f"%cast = fusion.cast %y : {m} -> {tensor([3, 4], 'i32')}",
        f"%bcast = fusion.broadcast %b [0, 2] : {v} -> {tensor([1, 4, 1])}",
        f"%sum = fusion.sum %y [1] keepdim : {m} -> {tensor([3, 1])}",
        f"%max = fusion.max %y [0] : {m} -> {v}",
        f"%matmul = fusion.matmul %y, %wt : ({m}, {tensor([4, 5])}) -> {tensor([3, 5])}",
        f"%addmm = fusion.matmul %y, %wt, %c : ({m}, {tensor([4, 5])}, {tensor([5])}) -> {tensor([3, 5])}",
        f"%linear = fusion.linear %y, %w, %c : ({m}, {w}, {tensor([5])}) -> {tensor([3, 5])}",
        f"%set = fusion.set %y : {m} -> {m}",
    ]
    names = [*UNARY, *BINARY, "scaled", "cast", "bcast", "sum", "max", "matmul", "addmm", "linear", "set"]
    types = [m] * (len(UNARY) + len(BINARY) + 1) + [
        tensor([3, 4], "i32"), tensor([1, 4, 1]), tensor([3, 1]), v, tensor([3, 5]), tensor([3, 5]), tensor([3, 5]), m
    ]
    body = "\n  ".join([*unary, *binary, *others])
    text = f"""
func.func @all(%x: {m}, %y: {m}, %b: {v}, %wt: {tensor([4, 5])}, %w: {w}, %c: {tensor([5])}) -> ({", ".join(types)}) {{
  {body}
  func.return {", ".join("%" + n for n in names)} : {", ".join(types)}
}}"""
    x = torch.rand(3, 4, generator=rng) + 0.5
    y, b = torch.randn(3, 4, generator=rng) * 3, torch.randn(4, generator=rng)
    wt, w_, c = torch.randn(4, 5, generator=rng), torch.randn(5, 4, generator=rng), torch.randn(5, generator=rng)
    results = dict(zip(names, fusion_eval.evaluate(host_function(text, "all"), [x, y, b, wt, w_, c])))
    expected = {
        **{k: f(x) for k, f in UNARY.items()},
        **{k: f(x, y) for k, f in BINARY.items()},
        "scaled": x * 2, "cast": y.to(torch.int32), "bcast": b.reshape(1, 4, 1),
        "sum": y.sum(1, keepdim=True), "max": y.amax(0), "matmul": y @ wt, "addmm": y @ wt + c,
        "linear": y @ w_.T + c, "set": y,
    }
    for name in names:
        torch.testing.assert_close(results[name], expected[name], msg=name, equal_nan=True)


class CopiesSeen(TorchDispatchMode):
    """The shapes that `aten.copy_` writes."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default:
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "shape, order, runs",
    [
        # The ranks' order of two sequences' gradient: 4 runs of a whole [rows, width] block.
        ((2, 2, RUN_BYTES // (4 * 256), 256), (1, 0, 2, 3), 4),
        # Heads put between rows: runs of one row, too short to copy one by one.
        ((2, 64, 4, 32), (0, 2, 1, 3), 0),
    ],
    ids=["blocks", "rows"],
)
def test_a_reshape_that_copies_copies_long_runs_one_by_one(rng, shape, order, runs):
    """`aten.reshape` of a permute that no view reshapes: where the permute moves whole blocks
    that lie in memory as in the copy (a few runs of a MiB or more), each block is one
    contiguous copy; else ATen's copy. ATen's values either way, and a view stays a view."""
    reshape = prepare_call("aten.reshape.default", repr([[{"operand": 0}, [-1, shape[-1]]], {}]))
    permuted = torch.randn(shape, generator=rng).permute(order)
    with CopiesSeen() as seen:
        result = reshape([permuted], torch.device("cpu"))
    torch.testing.assert_close(result, permuted.reshape(-1, shape[-1]), rtol=0, atol=0)
    if runs:
        assert seen.shapes == [permuted.shape[2:]] * runs
    else:
        assert len(seen.shapes) <= 1 and permuted.shape[2:] not in seen.shapes
    whole = torch.randn(shape, generator=rng)
    with CopiesSeen() as seen:
        assert reshape([whole], torch.device("cpu")).data_ptr() == whole.data_ptr() and not seen.shapes


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=5).flatmap(
        lambda shape: st.tuples(st.just(shape), st.permutations(range(len(shape))), st.integers(0, 2**31 - 1))
    )
)
def test_a_copy_in_runs_is_atens_copy_whatever_the_permute(case):
    """`contiguous_in_runs` on any permute, with runs of any length copied one by one (the
    shortest run lowered to one element): ATen's contiguous copy, to the bit."""
    shape, order, seed = case
    permuted = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).permute(order)
    with mock.patch.object(aten_calls, "RUN_BYTES", 1):
        copy = aten_calls.contiguous_in_runs(permuted)
    assert copy.is_contiguous() and torch.equal(copy, permuted.contiguous())
