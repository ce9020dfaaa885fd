"""Every op of the fusion and hir dialects prints and parses back, in its custom and generic form.

`SNIPPETS` holds, for each op, lines of IR that use it; `ATTRS` marks where a discardable
attribute goes, so that each snippet is checked with and without one. The test
enumerates the dialects' ops, so an op added without a snippet fails.
"""

import re
from pathlib import Path

import pytest
from xdsl.dialects.builtin import StringAttr

from hostir_dialect.fusion import BINARY_OPS, REDUCTION_OPS, UNARY_OPS, Fusion
from hostir_dialect.hir import COLLECTIVE_OPS, Hir
from hostir_dialect.text import READABLE_WIDTH, HostirError, parse_module, print_module

A = "!fusion.tensor<[?, 4], f32>"
V = "!fusion.tensor<[4], f32>"
M = "!fusion.tensor<[4, 4], f32>"
R = "!fusion.tensor<[?], f32>"
K = "!fusion.tensor<[?, 1], f32>"
S = "!fusion.tensor<[?, 2], f32, mesh = [0, 1], axes = [stream, didx]>"
SLICE = "!fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>"
GATHERED = "!fusion.tensor<[2], f32, mesh = [0, 1]>"

MODULE = f"""\
func.func private @seg(%x: {A}, %y: {V}) -> {A} {{
  %z = fusion.add %x, %y : ({A}, {V}) -> {A}
  func.return %z : {A}
}}
func.func @f(%a: {A}, %v: {V}, %m: {M}, %r: {R}, %k: {K},
             %s: {S}, %x: {SLICE}, %y: {GATHERED}, %i: index) {{
BODY
  func.return
}}
"""

ATTRIBUTE = '{note = "kept"}'


def _name(op) -> str:
    return op.name.split(".", 1)[1]


SPLIT_COLLECTIVES = {"hir.scatter", "hir.gather", "hir.allgather", "hir.reduce_scatter"}
"""The collectives between a device's slice and the whole: the others move pieces of one size."""


def _collective(op) -> list[str]:
    root = " root 1" if op.HAS_ROOT else ""
    reduce_op = " op sum" if op.HAS_REDUCE_OP else ""
    if op.name in SPLIT_COLLECTIVES:
        operands, types = "%x into %y", f"{SLICE}, {GATHERED}"
    else:
        operands, types = "%y into %y", f"{GATHERED}, {GATHERED}"
    return [f"%w = {op.name} {operands} team [0, 1]{root}{reduce_op} backend nccl ATTRS : {types}"]


SNIPPETS: dict[str, list[str]] = {
    "fusion.set": [f"%o = fusion.set %s ATTRS : {S} -> !fusion.tensor<[?, 2], f32, mesh = [0, 1]>"],
    **{op.name: [f"%o = {op.name} %a ATTRS : {A} -> {A}"] for op in UNARY_OPS},
    **{op.name: [f"%o = {op.name} %a, %v ATTRS : ({A}, {V}) -> {A}"] for op in BINARY_OPS},
    "fusion.rotate_half": [f"%o = fusion.rotate_half %a ATTRS : {A} -> {A}"],
    "fusion.constant": [
        "%o = fusion.constant 2.5 : f32 ATTRS : !fusion.tensor<[], f32>",
        "%p = fusion.constant -3 : i64 : !fusion.tensor<[], i64, mesh = [0, 1]>",
        "%q = fusion.constant true : !fusion.tensor<[], i1>",
    ],
    "fusion.cast": [f"%o = fusion.cast %a ATTRS : {A} -> !fusion.tensor<[?, 4], bf16>"],
    **{
        op.name: [
            f"%o = {op.name} %a [1] ATTRS : {A} -> {R}",
            f"%p = {op.name} %a [0, 1] keepdim : {A} -> !fusion.tensor<[1, 1], f32>",
        ]
        for op in REDUCTION_OPS
    },
    "fusion.broadcast": [
        f"%o = fusion.broadcast %v [0, 2] ATTRS : {V} -> !fusion.tensor<[1, 4, 1], f32>"
    ],
    "fusion.expand": [f"%o = fusion.expand %k ATTRS : {K} -> !fusion.tensor<[?, 4], f32>"],
    "fusion.matmul": [
        f"%o = fusion.matmul %a, %m ATTRS : ({A}, {M}) -> {A}",
        f"%p = fusion.matmul %a, %v : ({A}, {V}) -> {R}",
    ],
    "fusion.linear": [
        f"%o = fusion.linear %a, %m ATTRS : ({A}, {M}) -> {A}",
        f"%p = fusion.linear %a, %m, %v : ({A}, {M}, {V}) -> {A}",
    ],
    "fusion.aten": [
        f'%o = fusion.aten "aten.gelu.default"(%a, approximate = "tanh") ATTRS : ({A}) -> {A}',
        f'%p:2 = fusion.aten "aten.var_mean.correction"(%m, [1], keepdim = False) : ({M}) -> ({V}, {V})',
        f'%q = fusion.aten "aten.max.dim"(%m, -1) returns [0] : ({M}) -> {V}',
        # The call as its Python literal, as hostir wrote it before the call syntax.
        f"%l = fusion.aten \"aten.where.self\"(%m, %a) call \"[[{{'operand': 0}}, {{'operand': 1}}, 0.5], {{}}]\""
        f" : ({M}, {A}) -> {A}",
    ],
    "fusion.attention": [
        f"%o, %l = fusion.attention %m, %m, %m causal top_left scale 0.5 ATTRS : ({M}, {M}, {M}) -> ({M}, {V})",
        f"%p, %q = fusion.attention %m, %m, %m mask %m : ({M}, {M}, {M}, {M}) -> ({M}, {V})",
    ],
    "fusion.attention_backward": [
        f"%o, %p, %q = fusion.attention_backward %m, %m, %m, %m, %m, %v causal top_left ATTRS"
        f" : ({M}, {M}, {M}, {M}, {M}, {V}) -> ({M}, {M}, {M})",
    ],
    "hir.allocate": [
        f"%n = hir.dim %a, 0 : {A}",
        f"%o = hir.allocate(%n) ATTRS : {A}",
        f"%p = hir.allocate() : {M}",
    ],
    "hir.deallocate": [f"%o = hir.allocate() : {M}", f"hir.deallocate %o ATTRS : {M}"],
    "hir.dim": [f"%o = hir.dim %s, 1 ATTRS : {S}"],
    "hir.alias_select": [f"%o = hir.alias_select %s[0 = %i] ATTRS : {S} -> {SLICE}"],
    "hir.device_index": ["%o = hir.device_index ATTRS"],
    "hir.number_of_streams": ["%o = hir.number_of_streams ATTRS"],
    "hir.get_current_stream": ["%o = hir.get_current_stream ATTRS"],
    "hir.stream": ["%o = hir.stream %i ATTRS"],
    "hir.set_current_stream": ["%o = hir.stream %i", "hir.set_current_stream %o ATTRS"],
    "hir.synchronize_stream": ["%o = hir.get_current_stream", "hir.synchronize_stream %o ATTRS"],
    **{op.name: _collective(op) for op in COLLECTIVE_OPS},
    "hir.send": [f"%o = hir.send %a to %i backend nccl ATTRS : {A}"],
    "hir.recv": [f"%o = hir.recv %a from %i backend cuda ATTRS : {A}"],
    "hir.start_coalescing": ["hir.start_coalescing ATTRS"],
    "hir.end_coalescing": ["hir.start_coalescing", "%o = hir.end_coalescing ATTRS"],
    "hir.wait": ["hir.start_coalescing", "%o = hir.end_coalescing", "hir.wait %o ATTRS"],
    "hir.matmul": [f"hir.matmul ins(%a, %m : {A}, {M}) outs(%a : {A}) ATTRS"],
    "hir.linear": [
        f"hir.linear ins(%a, %m : {A}, {M}) outs(%a : {A}) ATTRS",
        f"hir.linear ins(%a, %m, %v : {A}, {M}, {V}) outs(%a : {A})",
    ],
    "hir.copy": [f"hir.copy ins(%s : {S}) outs(%s : {S}) ATTRS"],
    "hir.aten": [
        f'hir.aten "aten.t.default"(%m) ins(%m : {M}) outs(%m : {M}) ATTRS',
        f'hir.aten "aten.var_mean.correction"(%m, [1]) ins(%m : {M}) outs(%v, %v : {V}, {V})',
        f'hir.aten "aten.max.dim"(%m, 1) returns [0] ins(%m : {M}) outs(%v : {V})',
        f'hir.aten "aten.randn.default"([4], dtype = torch.float32, device = device) ins() outs(%v : {V})',
        f"hir.aten \"aten.clone.default\" call \"[[{{'operand': 0}}], {{}}]\" ins(%m : {M}) outs(%m : {M})",
    ],
    "hir.pointwise": [
        f'hir.pointwise "add" ins(%a, %v : {A}, {V}) outs(%a : {A}) ATTRS',
        f'hir.pointwise "neg" ins(%a : {A}) outs(%a : {A})',
    ],
    "hir.reduction": [
        f'hir.reduction "sum" [1] ins(%a : {A}) outs(%r : {R}) ATTRS',
        f'hir.reduction "max" [1] keepdim ins(%a : {A}) outs(%k : {K})',
    ],
    "hir.attention": [
        f"hir.attention causal top_left ins(%m, %m, %m : {M}, {M}, {M}) outs(%m, %v : {M}, {V}) ATTRS",
        f"hir.attention ins(%m, %m, %m, %m : {M}, {M}, {M}, {M}) outs(%m, %v : {M}, {V})",
    ],
    "hir.attention_backward": [
        f"hir.attention_backward scale 0.5 ins(%m, %m, %m, %m, %m, %v : {M}, {M}, {M}, {M}, {M}, {V})"
        f" outs(%m, %m, %m : {M}, {M}, {M}) ATTRS",
    ],
    "hir.launch_kernel": [f"hir.launch_kernel @seg ins(%a, %v : {A}, {V}) outs(%a : {A}) ATTRS"],
    "hir.post_on_stream": [f"hir.post_on_stream @seg ins(%a, %v : {A}, {V}) outs(%a : {A}) ATTRS"],
}

ALL_OPS = [*Fusion.operations, *Hir.operations]


@pytest.mark.parametrize("with_attribute", [False, True], ids=["plain", "attribute"])
@pytest.mark.parametrize("op", ALL_OPS, ids=lambda op: op.name)
def test_custom_and_generic_text_are_fixed_points(op, with_attribute, assert_round_trips):
    if op.name not in SNIPPETS:
        pytest.fail(f"{op.name} has no printer test: add IR that uses it to SNIPPETS")
    body = "\n".join(SNIPPETS[op.name]).replace("ATTRS", ATTRIBUTE if with_attribute else "")
    module = parse_module(MODULE.replace("BODY", body))
    instances = [o for o in module.walk() if isinstance(o, op)]
    assert instances, f"the snippet of {op.name} does not use it"
    if with_attribute:
        assert any(o.attributes.get("note") == StringAttr("kept") for o in instances)

    custom = assert_round_trips(module)
    assert (ATTRIBUTE[1:-1] in custom) == with_attribute
    assert f'"{op.name}"' not in custom, "the custom form printed the op generically"
    assert f'"{op.name}"' in print_module(module, generic=True)


# --------------------------------------------------------------------------- #
# The call of an ATen op                                                       #
# --------------------------------------------------------------------------- #

EVERY_KIND = (
    "[[{'operand': 0}, {'operand': 1, 'view': 'uint64'}, {'operand': 0}, -3, 2.5, 1e-05, -0.25, True, None, 'two words', "
    "[1, [2, {'operand': 1, 'view': 'uint64'}]], {'float': '-inf'}], {'dtype': {'dtype': 'bfloat16'}, "
    "'layout': {'layout': 'strided'}, 'memory_format': {'memory_format': 'contiguous_format'}, 'device': {'device': None}, "
    "'fill': {'float': 'nan'}, 'flag': False}]"
)
READABLY = (
    '"aten.anything.default"(%m, %a as torch.uint64, %m, -3, 2.5, 1.0e-05, -0.25, True, None, "two words", '
    "[1, [2, %a as torch.uint64]], -inf, dtype = torch.bfloat16, layout = torch.strided, "
    "memory_format = torch.contiguous_format, device = device, fill = nan, flag = False)"
)


def test_an_aten_call_prints_as_it_reads_and_reads_back_to_its_literal():
    """Every encoding of a call's literal (hostir_dialect.aten_call) prints as the call reads,
    the operands by name, and reads back to the same literal, in both ops."""
    body = (
        f"%o = fusion.aten \"aten.anything.default\"(%m, %a) call \"{EVERY_KIND}\" : ({M}, {A}) -> {M}\n"
        f"hir.aten \"aten.anything.default\" call \"{EVERY_KIND}\" ins(%m, %a : {M}, {A}) outs(%m : {M})"
    )
    module = parse_module(MODULE.replace("BODY", body))
    text = print_module(module)
    assert f"%o = fusion.aten {READABLY} : (" in text
    assert f"hir.aten {READABLY} ins(%m, %a : {M}, {A}) outs(%m : {M})" in text
    again = parse_module(text)
    assert [op.call.data for op in again.walk() if op.name.endswith(".aten")] == [EVERY_KIND, EVERY_KIND]
    assert print_module(again) == text


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('"aten.t.default"(%m, dtype = torch.float32, 2)', "a positional argument after a keyword argument"),
        ('"aten.t.default"(%m, x = 1, x = 2)', "the keyword argument 'x' is given twice"),
        ('"aten.t.default"(%m, float32)', "'float32' is no value of an ATen call"),
        ('"aten.t.default"(%m, - None)', "expected a number or inf after '-', got 'None'"),
        ('"aten.t.default"(%m as uint64)', "expected a dtype such as torch.uint64, got 'uint64'"),
        ('"aten.t.default"', "expected the call of aten.t.default, as in"),
        ("\"aten.t.default\"(%m, 2) call \"[[{'operand': 0}], {}]\"", 'before `call "..."`, the list holds the operands alone'),
    ],
)
def test_a_call_that_cannot_be_read_is_an_error_at_its_place(call, message):
    text = MODULE.replace("BODY", f"%o = fusion.aten {call} : ({M}) -> {M}")
    with pytest.raises(HostirError, match=re.escape(message)) as error:
        parse_module(text)
    assert error.value.location is not None and error.value.location.line == 7  # BODY's


def test_the_ins_of_hir_aten_are_what_its_call_names():
    body = f'hir.aten "aten.add.Tensor"(%a, %m) ins(%m, %a : {M}, {A}) outs(%a : {A})'
    with pytest.raises(HostirError, match=r"ins are the buffers the call names, in the order it names them: %a, %m"):
        parse_module(MODULE.replace("BODY", body))
    literal = f"hir.aten \"aten.add.Tensor\" call \"[[{{'operand': 1}}, {{'operand': 0}}], {{}}]\" ins(%m, %a : {M}, {A}) outs(%a : {A})"
    with pytest.raises(HostirError, match=r"the call names operands \[1, 0\] in that order; it must name each of its 2"):
        parse_module(MODULE.replace("BODY", literal))


# --------------------------------------------------------------------------- #
# Type aliases and readable lines (the dumps' printing)                        #
# --------------------------------------------------------------------------- #

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.mlir"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_printed_with_aliases_a_module_reads_back_the_same(path):
    """Each example, and its lowered host program: every tensor type by an alias defined
    above, lines cut after their commas, and the same module read back."""
    from hostir.runtime.program import Program

    fusion = parse_module(path.read_text())
    for module in (fusion, Program.compile(fusion).module):
        text = print_module(module, aliases=True)
        assert "!fusion.tensor" not in text.split("\n\n", 1)[1], "every type by its alias"
        again = parse_module(text)
        assert again.is_structurally_equivalent(module)
        assert print_module(again, aliases=True) == text
        assert all(len(line) <= READABLE_WIDTH for line in text.splitlines() if ", " in line.strip()[60:])


def test_aliases_name_what_a_type_is_and_tell_meshes_apart():
    two_meshes = """\
func.func @f(%x: !fusion.tensor<[?, 2], f32, mesh = [0, 1], axes = [_, didx]>,
             %y: !fusion.tensor<[?, 2], f32, mesh = [2, 3], axes = [_, didx]>, %z: !fusion.tensor<[], bf16>) -> !fusion.tensor<[], bf16> {
  func.return %z : !fusion.tensor<[], bf16>
}
"""
    text = print_module(parse_module(two_meshes), aliases=True)
    assert text.startswith(
        "!f32_Nx2_didx = !fusion.tensor<[?, 2], f32, mesh = [0, 1], axes = [_, didx]>\n"
        "!f32_Nx2_didx_1 = !fusion.tensor<[?, 2], f32, mesh = [2, 3], axes = [_, didx]>\n"
        "!bf16_scalar = !fusion.tensor<[], bf16>\n\n"
    ), text
    assert "func.func @f(%x: !f32_Nx2_didx, %y: !f32_Nx2_didx_1, %z: !bf16_scalar) -> !bf16_scalar {" in text
