"""Bad input is a HostirError that says what is wrong, raised before any rank communicates.

And when a rank raises, exits or hangs in the middle of a program, the other ranks
fail with a clear error within the (short, in these tests) process-group timeout,
and `run_on_local_ranks` reports every failing rank.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
from pathlib import Path

import pytest
import torch

from examples.reference_fusions import REFERENCE_FUSIONS
from hostir_dialect.text import HostirError, parse_module, print_module
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.interpreter import compute
from hostir.runtime.launch import RankFailed, run_on_local_ranks
from hostir.runtime.program import Program
from test_communicator import needs_ranks
from test_interpreter import tensor
from hostir.tools.hir_opt import main as hir_opt_main
from hostir.tools.hir_run import main as hir_run_main

SHARDED = tensor([2, 3], mesh=[0, 1], axes="didx _")
REPLICATED = tensor([3], mesh=[0, 1])

ALLREDUCE = f"""
func.func @main(%x: {SHARDED}) -> {REPLICATED} {{
  %y = hir.allocate() : {REPLICATED}
  %w = hir.allreduce %x into %y team [0, 1] op sum backend nccl : {SHARDED}, {REPLICATED}
  hir.wait %w
  func.return %y : {REPLICATED}
}}"""

COPY = f"""
func.func @main(%x: {tensor([4, 3])}) -> {tensor([4, 3])} {{
  %y = hir.allocate() : {tensor([4, 3])}
  hir.copy ins(%x : {tensor([4, 3])}) outs(%y : {tensor([4, 3])})
  func.return %y : {tensor([4, 3])}
}}"""


DEVICE = Communicator.single().device
"""Where `Program.run` runs without a communicator: the current GPU, else the CPU."""


def rank(rank: int, world_size: int) -> Communicator:
    """A rank's communicator before anything communicates: enough for what `run` checks first."""
    return Communicator(rank, world_size, torch.device("cpu"), "gloo", 5.0)


# --------------------------------------------------------------------------- #
# Inputs and the world, checked before running                                 #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "inputs, message",
    [
        ([], r"@main takes 1 input\(s\), got 0"),
        ([torch.zeros(4, 3), torch.zeros(4, 3)], r"@main takes 1 input\(s\), got 2"),
        ([torch.zeros(4, 4)], r"input #0 of @main on rank 0: expected local shape \[4, 3\] \(mesh = \[0\], axes = \[_, _\]\), got \[4, 4\]"),
        ([torch.zeros(12)], r"expected local shape \[4, 3\].*got \[12\]"),
        ([torch.zeros(4, 3, dtype=torch.float64)], r"expected dtype torch.float32, got torch.float64"),
        ([torch.zeros(4, 3, device="meta")], rf"expected a tensor on {DEVICE}, got one on meta"),
        ([[[0.0] * 3] * 4], r"expected a torch.Tensor, got list"),
    ],
)
def test_inputs_that_contradict_their_types(inputs, message):
    with pytest.raises(HostirError, match=message):
        Program.compile(COPY, pipeline=None).run(inputs)


def test_a_world_smaller_than_the_program_needs():
    with pytest.raises(HostirError, match=r"uses device 1 but the world has only 1 rank\(s\); run it on at least 2"):
        Program.compile(ALLREDUCE, pipeline=None).run([torch.zeros(1, 3)])
    team_only = ALLREDUCE.replace("team [0, 1]", "team [0, 3]")
    with pytest.raises(HostirError, match=r"uses device 3 but the world has only 2"):
        Program.compile(team_only, pipeline=None).run([torch.zeros(1, 3)], rank(0, 2))


def test_bad_stream_counts(monkeypatch):
    program = Program.compile(COPY, pipeline=None)
    with pytest.raises(HostirError, match=r"the number of streams must be at least 1, got 0"):
        program.run([torch.zeros(4, 3, device=DEVICE)], num_streams=0)
    for text in ("many", "0", "-2"):
        monkeypatch.setenv("HOSTIR_NUM_STREAMS", text)
        with pytest.raises(HostirError, match=rf"HOSTIR_NUM_STREAMS: expected a whole number, at least 1, got '{text}'"):
            program.run([torch.zeros(4, 3, device=DEVICE)])


# --------------------------------------------------------------------------- #
# Inputs wrong on one rank: every rank raises at once                          #
# --------------------------------------------------------------------------- #

EXCHANGE_TIMEOUT_S = 60
"""The process-group timeout of these tests. A rank that waited for a peer until a timeout
fired would fail after it; failing in less than half of it (`AT_ONCE_S`) says no rank did,
with room that a loaded machine does not eat."""
AT_ONCE_S = EXCHANGE_TIMEOUT_S / 2


def _mesh_change(world: int) -> str:
    """[?, ?] on device 0 -> set -> on the last device: the ranks past 0 hold no input."""
    x, y = tensor(["?", "?"], mesh=[0]), tensor(["?", "?"], mesh=[world - 1])
    return f"""
func.func @mesh_change(%x: {x}) -> {y} {{
  %y = fusion.set %x : {x} -> {y}
  func.return %y : {y}
}}"""


def wrong_inputs_on_the_last_rank(world: int) -> dict[str, tuple[str | None, float]]:
    """Each case: the last rank's inputs are wrong in one way; what each rank raised, and how fast."""
    communicator = Communicator.from_env()
    rank, last = communicator.rank, world - 1
    allreduce = Program.compile(REFERENCE_FUSIONS["allreduce"](world))
    mesh_change = Program.compile(_mesh_change(world))
    generator = torch.Generator().manual_seed(world)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(communicator.device)

    sharded, matrix = random(4, 1, 5), random(4, 5)
    cases = {
        "shape": (allreduce, sharded, [random(4, 2, 5)]),
        "dtype": (allreduce, sharded, [sharded.double()]),
        "count": (allreduce, sharded, [sharded, sharded]),
        "extent": (allreduce, sharded, [random(4, 1, 6)]),
        "placeholder": (mesh_change, matrix, [matrix]),
    }
    # A first run makes the groups that the check and the program use (the check's
    # exchange group, NCCL's communicator): each case then times its check alone.
    allreduce.run([sharded], communicator)
    outcomes = {}
    for case, (program, good, wrong) in cases.items():
        held = rank in program.input_types[0].mesh.ids
        inputs = wrong if rank == last else [good if held else good.new_empty(0)]
        start = time.monotonic()
        try:
            program.run(inputs, communicator)
            outcomes[case] = (None, time.monotonic() - start)
        except HostirError as error:
            outcomes[case] = (str(error), time.monotonic() - start)
    # The exchange leaves nothing behind: the same programs then run.
    (reduced,) = allreduce.run([sharded], communicator)
    outcomes["then"] = (str(torch.allclose(reduced, sharded.sum(1) * world)), 0.0)
    return outcomes


@pytest.mark.parametrize(
    "world", [pytest.param(2, marks=needs_ranks(2)), pytest.param(4, marks=needs_ranks(4))]
)
def test_inputs_wrong_on_one_rank_make_every_rank_raise_at_once(world, monkeypatch):
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", str(EXCHANGE_TIMEOUT_S))
    outcomes = run_on_local_ranks(wrong_inputs_on_the_last_rank, world, world, timeout_s=90)
    last = world - 1
    others = rf"the inputs of @{{name}} are wrong on another rank, so no rank runs it: {{fault}}"
    expected = {
        "shape": (
            rf"input #0 of @allreduce on rank {last}: expected local shape \[\?, 1, \?\] \(mesh = \[{', '.join(map(str, range(world)))}\], axes = \[_, didx, _\]\), got \[4, 2, 5\]",
            others.format(
                name="allreduce",
                fault=rf"input #0 on rank {last} is not what the program takes \(rank {last} says how\)",
            ),
        ),
        "dtype": (
            rf"input #0 of @allreduce on rank {last}: expected dtype torch.float32, got torch.float64",
            others.format(name="allreduce", fault=rf"input #0 on rank {last} is not what the program takes"),
        ),
        "count": (
            r"@allreduce takes 1 input\(s\), got 2",
            others.format(name="allreduce", fault=rf"rank {last} gave 2 input\(s\), @allreduce takes 1"),
        ),
        "placeholder": (
            rf"input #0 of @mesh_change on rank {last}: rank {last} is outside the mesh \[0\], so it takes an empty placeholder",
            others.format(name="mesh_change", fault=rf"input #0 on rank {last} is not what the program takes"),
        ),
    }
    disagreement = (
        r"input #0 of @allreduce: the ranks holding it disagree on the extent of axis 2: "
        + ", ".join(f"rank {r} has {6 if r == last else 5}" for r in range(world))
    )
    for rank, outcome in enumerate(outcomes):
        for case, (on_the_last_rank, on_the_others) in expected.items():
            message, elapsed = outcome[case]
            pattern = on_the_last_rank if rank == last else on_the_others
            assert re.match("error: " + pattern, message), (rank, case, message)
            assert elapsed < AT_ONCE_S, (rank, case, elapsed)
        message, elapsed = outcome["extent"]
        assert message == "error: " + disagreement, (rank, message)
        assert elapsed < AT_ONCE_S, (rank, elapsed)
        assert outcome["then"][0] == "True"


# --------------------------------------------------------------------------- #
# Programs refused while preparing                                             #
# --------------------------------------------------------------------------- #


def test_an_op_without_a_handler_is_found_when_preparing():
    unlowered = f"""
    func.func @main(%x: {tensor([4])}) -> {tensor([4])} {{
      %y = fusion.neg %x : {tensor([4])} -> {tensor([4])}
      func.return %y : {tensor([4])}
    }}"""
    with pytest.raises(HostirError, match=r"<string>:3:7: error: the runtime has no handler for 'fusion.neg'"):
        Program.compile(unlowered, pipeline=None)
    in_a_loop = f"""
    func.func @main(%x: {tensor([4])}) -> {tensor([4])} {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      scf.for %i = %c0 to %c1 step %c1 {{
        %m = arith.shli %i, %c1 : index
      }}
      func.return %x : {tensor([4])}
    }}"""
    with pytest.raises(HostirError, match=r"<string>:6:9: error: the runtime has no handler for 'arith.shli'"):
        Program.compile(in_a_loop, pipeline=None)
    floats = f"""
    func.func @main(%x: {tensor([4])}) -> {tensor([4])} {{
      %a = arith.constant 1.0 : f32
      func.return %x : {tensor([4])}
    }}"""
    with pytest.raises(HostirError, match=r"host programs compute on integers and indices, not 1.0"):
        Program.compile(floats, pipeline=None)


@pytest.mark.parametrize(
    "body, op",
    [
        (f"hir.copy ins(%y : {tensor([4, 3])}) outs(%x : {tensor([4, 3])})", "hir.copy"),
        (
            f"""%c0 = arith.constant 0 : index
      %row = hir.alias_select %x[0 = %c0] : {tensor([4, 3])} -> {tensor([3])}
      %col = hir.alias_select %row[0 = %c0] : {tensor([3])} -> {tensor([])}
      hir.pointwise "neg" ins(%col : {tensor([])}) outs(%col : {tensor([])})""",
            "hir.pointwise",
        ),
        (
            f"""%w = hir.broadcast %y into %x team [0] root 0 backend nccl : {tensor([4, 3])}, {tensor([4, 3])}
      hir.wait %w""",
            "hir.broadcast",
        ),
        (
            f"""%c0 = arith.constant 0 : index
      %w = hir.recv %x from %c0 backend nccl : {tensor([4, 3])}""",
            "hir.recv",
        ),
    ],
)
def test_a_program_that_writes_into_its_input_is_refused(body, op):
    program = f"""
    func.func @main(%x: {tensor([4, 3])}) -> {tensor([4, 3])} {{
      %y = hir.allocate() : {tensor([4, 3])}
      {body}
      func.return %y : {tensor([4, 3])}
    }}"""
    with pytest.raises(HostirError, match=r"writes into input #0 of the host program; inputs are read-only") as error:
        Program.compile(program, pipeline=None)
    assert op in str(error.value)


def test_a_collective_without_the_sharding_its_layout_needs():
    program = f"""
    func.func @main(%x: {REPLICATED}) -> {REPLICATED} {{
      %y = hir.allocate() : {REPLICATED}
      %w = hir.allgather %x into %y team [0, 1] backend nccl : {REPLICATED}, {REPLICATED}
      func.return %y : {REPLICATED}
    }}"""
    with pytest.raises(HostirError, match=r"hir.allgather needs a didx axis on its input, but the input has mesh = \[0, 1\], axes = \[_\]"):
        Program.compile(program, pipeline=None)


def test_bad_compile_arguments():
    with pytest.raises(HostirError, match=r"unknown pass 'no-such-pass'; hostir's passes are"):
        Program.compile(COPY, pipeline="no-such-pass")
    with pytest.raises(HostirError, match=r"the module has no function @other; it has @main"):
        Program.compile(COPY, pipeline=None, entry="other")
    two = COPY + COPY.replace("@main", "@second")
    with pytest.raises(HostirError, match=r"2 public functions \(@main, @second\); name the entry"):
        Program.compile(two, pipeline=None)
    assert Program.compile(two, pipeline=None, entry="second").host.sym_name.data == "second"
    for entry in (None, "main"):
        with pytest.raises(HostirError, match=r"<string>:1:1: error: @main has no body to run"):
            Program.compile("func.func @main() {\n}\n", pipeline=None, entry=entry)


# --------------------------------------------------------------------------- #
# Ranks that fail                                                              #
# --------------------------------------------------------------------------- #

DIES_MIDWAY = f"""
func.func private @identity(%x: {REPLICATED}) -> {REPLICATED} {{
  func.return %x : {REPLICATED}
}}
func.func @main(%x: {SHARDED}, %z: {tensor(["?"], mesh=[0])}) -> {REPLICATED} {{
  %y = hir.allocate() : {REPLICATED}
  %y2 = hir.allocate() : {REPLICATED}
  %w = hir.allreduce %x into %y team [0, 1] op sum backend nccl : {SHARDED}, {REPLICATED}
  hir.wait %w
  hir.launch_kernel @identity ins(%y : {REPLICATED}) outs(%y2 : {REPLICATED})
  %n = hir.dim %z, 0 : {tensor(["?"], mesh=[0])}
  %w2 = hir.allreduce %x into %y team [0, 1] op max backend nccl : {SHARDED}, {REPLICATED}
  hir.wait %w2
  func.return %y : {REPLICATED}
}}"""


def fail_on_rank_1(how: str) -> None:
    """Rank 1 fails in the middle of DIES_MIDWAY, after the first allreduce; rank 0 carries on."""
    communicator = Communicator.from_env()
    if communicator.rank == 1:
        def failing(callee):
            def run(ins, outs):
                if how == "raise":
                    raise RuntimeError("rank 1 fails on purpose")
                if how == "exit":
                    os._exit(5)
                time.sleep(60)

            return run

        compute.segment_runner = failing
    program = Program.compile(DIES_MIDWAY, pipeline=None)
    z = torch.zeros(4) if communicator.rank == 0 else torch.empty(0)
    # Every rank checks its inputs alike: all fail together, before communicating.
    with pytest.raises(HostirError, match=r"expected local shape \[1, 3\]"):
        program.run([torch.zeros(2, 3), z], communicator)
    program.run([torch.ones(1, 3), z], communicator)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="checks gloo's failure reports; with CUDA the ranks use NCCL, whose watchdog aborts a rank that times out",
)
@pytest.mark.parametrize(
    "how, rank_1_failure, rank_0_failure",
    [
        (
            "raise",
            r"failed on rank 1: RuntimeError: rank 1 fails on purpose",
            r"Connection (closed|reset) by peer",
        ),
        ("exit", r"exited with code 5 before returning a result", r"Connection (closed|reset) by peer"),
        ("hang", r"still running 5 s after rank 0 failed; killed", r"Timed out waiting 2000ms"),
    ],
)
def test_the_other_ranks_fail_clearly_within_the_timeout(how, rank_1_failure, rank_0_failure, monkeypatch):
    """Rank 0 reports its own error, the lost peer or the 2 s timeout, instead of being killed."""
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", "2")
    with pytest.raises(RankFailed) as failed:
        run_on_local_ranks(fail_on_rank_1, 2, how)
    failures = failed.value.failures
    assert set(failures) == {0, 1}
    assert re.search(rank_1_failure, failures[1]), failures[1]
    # Rank 0 got through the first allreduce and fails at the second, naming it.
    assert re.match(r"<string>:1[23]:\d+: error: failed on rank 0: RuntimeError: ", failures[0]), failures[0]
    assert re.search(r"hir\.(allreduce|wait) %w2", failures[0]), failures[0]
    assert re.search(rank_0_failure, failures[0]), failures[0]


# --------------------------------------------------------------------------- #
# Text that once gave a traceback, a hang or output that did not read back     #
# --------------------------------------------------------------------------- #

T = "!fusion.tensor<[4, 3], f32>"
R = "!fusion.tensor<[4], f32>"


def _function(body: str, arguments: str = f"%x: {T}") -> str:
    return f"func.func @f({arguments}) {{\n  {body}\n  func.return\n}}\n"


@pytest.mark.parametrize(
    "text, location, message",
    [
        ("@", "1:1", "Unexpected end of file after @."),
        ("\\", "1:1", "Unexpected character: \\"),
        ("\ufefffunc.func @f() {\n}", "1:1", "Unexpected character"),
        (_function(f"%c = arith.constant {'9' * 5000} : index"), "2:23", "integer literal of 5000 digits is too long (at most 4300)"),
        (
            _function(f"%y = fusion.sum %x [{2**70}] : {T} -> {R}"),
            "2:23",
            f"axis {2**70} is out of range: an axis must fit in a signed 64-bit integer",
        ),
        (
            _function(f"%y = fusion.broadcast %x [{2**64}] : {T} -> {T}"),
            "2:29",
            f"axis {2**64} is out of range",
        ),
        (
            _function(f'hir.reduction "sum" [{2**64 - 1}] ins(%x : {T}) outs(%y : {R})', f"%x: {T}, %y: {R}"),
            "2:3",
            "a value is out of its type's range",
        ),
        ("!t = 0x" + "f" * 40 + "<[4], f32>\n", "1:6", "Integer value 14615016373309029182036848327162830196559"),
        ("func.func @f() attributes {a = 300 : i8} {\n}", "1:32", "Integer value 300 is out of range for type i8"),
        ("func.func @f() attributes {a = 1.0e39 : f32} {\n}", "1:32", "float literal 1.0e39 is out of range for type f32"),
        ("#a = -1.0e39 : bf16\n", "1:6", "float literal -1.0e39 is out of range for type bf16"),
        ("#a = array<f16: 1.0e5>\n", "1:1", "a value is out of its type's range (float too large to pack with e format)"),
        (
            _function("%c1 = arith.constant 1 : index\n  scf.for %i = %c1 to %n step %c1 {\n    %n = hir.dim %x, 0 : " + T + "\n  }"),
            "3:3",
            "operand #1 is not defined in a region that encloses its use",
        ),
        (_function("", "%w: !hir.work<[4, 8], 2>"), "1:27", "'!hir.work' takes no parameters"),
        (
            _function(f"%y = fusion.set %x : {T} -> !fusion.tensor<[?, 3], f32, mesh = [0, 1], axes = [didx, _]>"),
            "2:3",
            "axis 0 of extent 4 cannot become a didx axis over the 2 device(s) of the result's mesh",
        ),
        (_function(f"%y = fusion.neg %y : {T} -> {T}"), "2:3", "operand #0 (%y) is the result of the op that uses it"),
        (
            _function(f"%y = fusion.neg %z : {T} -> {T}\n  %z = fusion.neg %x : {T} -> {T}"),
            "2:3",
            "operand #0 (%z) is used before it is defined",
        ),
        (
            _function("", f"%x: !fusion.tensor<[4], f32, mesh = [0, {2**40}]>"),
            "1:50",
            f"device id {2**40} is too large: a device id is a torch.distributed rank, a signed 32-bit integer (at most 2147483647)",
        ),
        (_function("", "%x: i32") + 'func.func @g() attributes {s = "' + "a" * 40, "5:32", "string literal is not closed on its line"),
        (_function("") + 'func.func @g() attributes {s = "a\\q"} {\n}', "5:34", "invalid escape sequence in string literal"),
    ],
)
def test_malformed_text_is_a_located_error(text, location, message):
    with pytest.raises(HostirError) as error:
        parse_module(text, "bad.mlir")
    first_line = str(error.value).splitlines()[0]
    assert first_line.startswith(f"bad.mlir:{location}: error: {message}"), first_line


@pytest.mark.parametrize("generic", [False, True])
def test_text_that_would_print_too_deep_is_refused_when_printed(generic):
    """64 levels read, but the printer adds the implicit module around the function, one
    level more than the parser reads: printing it is an error at the op, not text that
    does not read back."""
    text = "func.func @f() attributes {a = " + "[" * 63 + "]" * 63 + "} {\n  func.return\n}"
    module = parse_module(text, "deep.mlir")
    with pytest.raises(HostirError) as error:
        print_module(module, generic=generic)
    form = "generic" if generic else "custom"
    first_line = str(error.value).splitlines()[0]
    assert first_line.startswith(
        f"deep.mlir:1:1: error: nesting too deep: the {form} form of this op nests more than 64 levels of brackets"
    ), first_line


OPEN_STRING = _function(f"%y = fusion.neg %x : {T} -> {T}") + 'func.func @g() attributes {s = "' + "a" * 10_000 + "} {\n}\n"
"""A string left open on its line, 10,000 characters long: xDSL's lexer alone takes
exponential time in its length (30 characters take half a minute)."""


def _hir_opt(path: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = hir_opt_main([str(path)])
    return status, err.getvalue()


def _hir_run(path: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = hir_run_main([str(path)])
    return status, err.getvalue()


def _compile(path: Path) -> tuple[int, str]:
    try:
        Program.compile(path.read_text(), filename=str(path))
    except HostirError as error:
        return 1, str(error)
    return 0, ""


@pytest.mark.parametrize("entry", [_hir_opt, _hir_run, _compile], ids=["hir-opt", "hir-run", "Program.compile"])
@pytest.mark.parametrize(
    "text, location, message",
    [
        (OPEN_STRING, "5:32", "string literal is not closed on its line"),
        ("`", "1:1", "Unexpected character: `"),
        (_function(f"%y = fusion.neg %y : {T} -> {T}"), "2:3", "operand #0 (%y) is the result of the op that uses it"),
    ],
    ids=["open string", "first token", "self-use"],
)
def test_every_way_into_parsing_reports_a_located_error_at_once(entry, text, location, message, tmp_path):
    path = tmp_path / "bad.mlir"
    path.write_text(text)
    start = time.monotonic()
    status, err = entry(path)
    assert status == 1
    assert re.search(rf"^(hir-run: )?{re.escape(f'{path}:{location}: error: {message}')}", err, re.MULTILINE), err
    assert "Traceback" not in err
    # xDSL's lexer would take time exponential in the 10,000 characters of the open string
    # (30 take half a minute): a minute is room that only that, not a loaded machine, eats.
    assert time.monotonic() - start < 60


def test_a_dynamic_extent_that_a_set_splits_over_the_mesh_must_be_the_mesh_size():
    """A `?` that `fusion.set` makes a didx axis passes the verifier; an input extent other
    than the mesh's size is refused on that op before any rank communicates."""
    dynamic = "!fusion.tensor<[?, 3], f32>"
    split = "!fusion.tensor<[?, 3], f32, mesh = [0, 1], axes = [didx, _]>"
    text = (
        f"func.func @f(%x: {dynamic}) -> {split} {{\n"
        f"  %y = fusion.set %x : {dynamic} -> {split}\n"
        f"  func.return %y : {split}\n}}\n"
    )
    program = Program.compile(text, filename="set.mlir")
    program.check_extents([[2, 3]])
    with pytest.raises(HostirError) as error:
        program.check_extents([[8, 3]])
    assert str(error.value).startswith(
        "set.mlir:2:3: error: the inputs of @f do not fit together (input #0 is [8, 3]): "
        "axis 0 of extent 8 cannot become a didx axis over the 2 device(s)"
    ), str(error.value)



def test_dynamic_extents_that_a_matmul_cannot_contract_are_refused_before_the_run():
    """`?` lets the types through; the inputs' extents meet at the matmul, which says so,
    at its line, before anything runs (and so before any rank communicates)."""
    a, b, y = tensor(["?", "?"]), tensor(["?", 4]), tensor(["?", 4])
    text = (
        f"func.func @f(%a: {a}, %b: {b}) -> {y} {{\n"
        f"  %y = fusion.matmul %a, %b : ({a}, {b}) -> {y}\n"
        f"  func.return %y : {y}\n}}\n"
    )
    program = Program.compile(text, filename="mm.mlir")
    program.check_extents([[2, 3], [3, 4]])
    with pytest.raises(HostirError) as error:
        program.check_extents([[2, 3], [5, 4]])
    assert str(error.value).startswith(
        "mm.mlir:2:3: error: the inputs of @f do not fit together (input #0 is [2, 3], input #1 is [5, 4]): "
        "matmul contracts axis of extent 3 of [2, 3] with extent 5 of [5, 4]; they must be equal"
    ), str(error.value)


def _scatter_program(input_type: str, body: str = "", scattered: str = "%x") -> str:
    """A program given lowered: `scattered`, made by `body` from `%x`, scattered over devices 0 and 1."""
    dynamic, split = tensor(["?", 3]), tensor(["?", 3], mesh=[0, 1], axes="didx _")
    return (
        f"func.func @f(%x: {input_type}) -> {split} {{\n"
        + "".join(f"  {line.format(x=input_type, s=dynamic)}\n" for line in body.splitlines())
        + f"  %c2 = arith.constant 2 : index\n"
        f"  %y = hir.allocate(%c2) : {split}\n"
        f"  %w = hir.scatter {scattered} into %y team [0, 1] root 0 backend nccl : {dynamic}, {split}\n"
        f"  hir.wait %w\n"
        f"  func.return %y : {split}\n}}\n"
    )


@pytest.mark.parametrize(
    "input_type, body, fitting, too_long, extent",
    [
        (tensor(["?", 3]), "", [2, 3], [8, 3], 8),
        (
            tensor(["?", "?", 3]),
            "%c0 = arith.constant 0 : index\n%s = hir.alias_select %x[0 = %c0] : {x} -> {s}",
            [5, 2, 3],
            [5, 8, 3],
            8,
        ),
        (tensor(["?", "?"]), "%n = hir.dim %x, 0 : {x}\n%s = hir.allocate(%n) : {s}", [2, 7], [3, 7], 3),
    ],
    ids=["input", "view", "allocation"],
)
def test_a_lowered_scatter_refuses_an_input_extent_other_than_its_mesh_size(
    input_type, body, fitting, too_long, extent
):
    """A `?` on the axis a `hir.scatter` splits, traced to the inputs' extents through views
    and allocation sizes, must be the output mesh's size, as the fusion path asks of `fusion.set`."""
    text = _scatter_program(input_type, body, "%s" if body else "%x")
    program = Program.compile(text, pipeline=None, filename="scatter.mlir")
    program.check_extents([fitting])
    with pytest.raises(HostirError) as error:
        program.check_extents([too_long])
    line = 4 + len(body.splitlines())
    assert str(error.value).splitlines()[0] == (
        f"scatter.mlir:{line}:3: error: the inputs of @f do not fit together (input #0 is "
        f"[{', '.join(map(str, too_long))}]): hir.scatter splits axis 0 of its input, of extent "
        f"{extent}, over the 2 member(s) of its team in its output's mesh, one slice each; the extent must be 2"
    )


def scatter_rows(row_counts: list[int]) -> list[torch.Tensor | str]:
    """This rank's result, or its error, of a lowered scatter of the first rows of one matrix."""
    communicator = Communicator.from_env()
    program = Program.compile(_scatter_program(tensor(["?", 3])), pipeline=None, filename="scatter.mlir")
    whole = torch.arange(24, dtype=torch.float32, device=communicator.device).reshape(8, 3)
    outcomes = []
    for rows in row_counts:
        inputs = [whole[:rows] if communicator.rank == 0 else whole.new_empty(0)]
        try:
            outcomes.append(program.run(inputs, communicator)[0].cpu())
        except HostirError as error:
            outcomes.append(str(error).splitlines()[0])
    return outcomes


@needs_ranks(2)
def test_a_lowered_scatter_of_too_many_or_too_few_slices_fails_on_every_rank(monkeypatch):
    """Rank 1 holds no input, yet refuses it as rank 0 does, before the scatter; then a
    fitting input scatters one row to each rank, as plain torch splits it."""
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", str(EXCHANGE_TIMEOUT_S))
    per_rank = run_on_local_ranks(scatter_rows, 2, [8, 1, 2], timeout_s=90)
    whole = torch.arange(24, dtype=torch.float32).reshape(8, 3)
    for rank, (too_long, too_short, fitting) in enumerate(per_rank):
        for rows, message in ((8, too_long), (1, too_short)):
            assert message == (
                f"scatter.mlir:4:3: error: the inputs of @f do not fit together (input #0 is [{rows}, 3]): "
                f"hir.scatter splits axis 0 of its input, of extent {rows}, over the 2 member(s) of its "
                "team in its output's mesh, one slice each; the extent must be 2"
            ), (rank, message)
        assert torch.equal(fitting, whole[:2].chunk(2)[rank]), (rank, fitting)


ALLOCATED = "%y = hir.allocate(%n) : {rows}"
VIEWED = (
    "%z = hir.allocate(%n) : {stack}\n"
    "%c1 = arith.constant 1 : index\n"
    "%y = hir.alias_select %z[0 = %c1] : {stack} -> {rows}"
)


def _gather_program(body: str, collective: str = "gather") -> str:
    """A program given lowered: the rows of `%x`, one per device, gathered (at root 0) or
    all-gathered into `%y`, which `body` makes with as many rows as `%like` has."""
    mesh = [0] if collective == "gather" else [0, 1]
    rows, stack = tensor(["?", 3], mesh=mesh), tensor([2, "?", 3], mesh=mesh)
    root = " root 0" if collective == "gather" else ""
    lines = [
        f"%n = hir.dim %like, 0 : {rows}",
        *body.format(rows=rows, stack=stack).splitlines(),
        f"%w = hir.{collective} %x into %y team [0, 1]{root} backend nccl : {SHARDED}, {rows}",
        "hir.wait %w",
        f"func.return %y : {rows}",
    ]
    return f"func.func @f(%x: {SHARDED}, %like: {rows}) -> {rows} {{\n" + "".join(f"  {line}\n" for line in lines) + "}\n"


def _fill_misfit(collective: str, rows: int) -> str:
    """The reason a `_gather_program` refuses `%like` of `rows` rows."""
    return (
        f"the inputs of @f do not fit together (input #0 is [2, 3], input #1 is [{rows}, 3]): "
        f"hir.{collective} fills axis 0 of its output, of extent {rows}, from the 2 member(s) of "
        "its team in its input's mesh, one slice each; the extent must be 2"
    )


@pytest.mark.parametrize(
    "collective, body",
    [("gather", ALLOCATED), ("gather", VIEWED), ("allgather", ALLOCATED)],
    ids=["gather-allocation", "gather-view", "allgather-allocation"],
)
def test_a_lowered_gather_refuses_an_output_extent_other_than_its_team_size(collective, body):
    """A `?` on the axis a `hir.gather` or `hir.allgather` fills, traced to the inputs' extents
    through views and allocation sizes, must be the number of devices that send a slice."""
    program = Program.compile(_gather_program(body, collective), pipeline=None, filename="gather.mlir")
    program.check_extents([[2, 3], [2, 3]])
    for rows in (8, 1):
        with pytest.raises(HostirError) as error:
            program.check_extents([[2, 3], [rows, 3]])
        line = 3 + len(body.splitlines())
        assert str(error.value).splitlines()[0] == (
            f"gather.mlir:{line}:3: error: {_fill_misfit(collective, rows)}"
        )


def test_a_lowered_reduce_scatter_refuses_an_input_extent_other_than_its_team_size():
    """The input's axis a `hir.reduce_scatter` splits (the output's didx axis, counted past
    the reduced one) must hold one slice per member, as a scatter's."""
    partial, scattered = tensor([2, "?", 3], mesh=[0, 1], axes="didx _ _"), SHARDED
    text = (
        f"func.func @f(%p: {partial}) -> {scattered} {{\n"
        f"  %y = hir.allocate() : {scattered}\n"
        f"  %w = hir.reduce_scatter %p into %y team [0, 1] op sum backend nccl : {partial}, {scattered}\n"
        "  hir.wait %w\n"
        f"  func.return %y : {scattered}\n}}\n"
    )
    program = Program.compile(text, pipeline=None, filename="rs.mlir")
    program.check_extents([[2, 2, 3]])
    with pytest.raises(HostirError) as error:
        program.check_extents([[2, 5, 3]])
    assert str(error.value).splitlines()[0] == (
        "rs.mlir:3:3: error: the inputs of @f do not fit together (input #0 is [2, 5, 3]): "
        "hir.reduce_scatter splits axis 1 of its input, of extent 5, over the 2 member(s) of its "
        "team in its output's mesh, one slice each; the extent must be 2"
    )


def gather_rows(row_counts: list[int]) -> list[torch.Tensor | str]:
    """This rank's result, or its error, of a lowered gather of one row per rank into as
    many rows as rank 0's `%like` has."""
    communicator = Communicator.from_env()
    program = Program.compile(_gather_program(ALLOCATED), pipeline=None, filename="gather.mlir")
    whole = torch.arange(6, dtype=torch.float32, device=communicator.device).reshape(2, 3)
    shard = whole[communicator.rank : communicator.rank + 1]
    outcomes = []
    for rows in row_counts:
        like = whole.new_zeros(rows, 3) if communicator.rank == 0 else whole.new_empty(0)
        try:
            outcomes.append(program.run([shard, like], communicator)[0].cpu())
        except HostirError as error:
            outcomes.append(str(error).splitlines()[0])
    return outcomes


@needs_ranks(2)
def test_a_lowered_gather_into_too_many_or_too_few_rows_fails_on_every_rank(monkeypatch):
    """Rank 1 holds neither `%like` nor the output (its result is empty), yet refuses the
    extent as rank 0 does, before the gather; then a fitting output gets every rank's row
    at the root, as plain torch concatenates them."""
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", str(EXCHANGE_TIMEOUT_S))
    per_rank = run_on_local_ranks(gather_rows, 2, [8, 1, 2], timeout_s=90)
    whole = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for rank, (too_long, too_short, fitting) in enumerate(per_rank):
        for rows, message in ((8, too_long), (1, too_short)):
            assert message == f"gather.mlir:4:3: error: {_fill_misfit('gather', rows)}", (rank, message)
        if rank == 0:
            assert torch.equal(fitting, torch.cat([whole[r : r + 1] for r in range(2)])), fitting
        else:
            assert fitting.numel() == 0, fitting


def test_a_lowered_send_recv_refuses_an_output_longer_than_its_input():
    """A receive buffer sized by the inputs' extents must hold as many elements as are sent,
    or the receiver returns elements that nobody wrote."""
    sent, received = tensor(["?"], mesh=[0]), tensor(["?"], mesh=[1])
    text = (
        f"func.func @f(%x: {sent}, %like: {received}) -> {received} {{\n"
        f"  %n = hir.dim %like, 0 : {received}\n"
        f"  %y = hir.allocate(%n) : {received}\n"
        f"  %w = hir.send_recv %x into %y team [0, 1] root 0 backend nccl : {sent}, {received}\n"
        "  hir.wait %w\n"
        f"  func.return %y : {received}\n}}\n"
    )
    program = Program.compile(text, pipeline=None, filename="p2p.mlir")
    program.check_extents([[4], [4]])
    with pytest.raises(HostirError) as error:
        program.check_extents([[4], [8]])
    assert str(error.value).splitlines()[0] == (
        "p2p.mlir:4:3: error: the inputs of @f do not fit together (input #0 is [4], input #1 is [8]): "
        "hir.send_recv moves 4 element(s) of its input into 8 of its output; they must be as many"
    )
