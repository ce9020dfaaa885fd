"""Every op of the fusion and hir dialects prints and parses back, in its custom and generic form.

`SNIPPETS` holds, for each op, lines of IR that use it; `ATTRS` marks where a discardable
attribute goes, so that each snippet is checked with and without one. The test
enumerates the dialects' ops, so an op added without a snippet fails.
"""

import pytest
from xdsl.dialects.builtin import StringAttr

from hostir_dialect.fusion import BINARY_OPS, REDUCTION_OPS, UNARY_OPS, Fusion
from hostir_dialect.hir import COLLECTIVE_OPS, Hir
from hostir_dialect.text import parse_module, print_module

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
    "fusion.matmul": [
        f"%o = fusion.matmul %a, %m ATTRS : ({A}, {M}) -> {A}",
        f"%p = fusion.matmul %a, %v : ({A}, {V}) -> {R}",
    ],
    "fusion.linear": [
        f"%o = fusion.linear %a, %m ATTRS : ({A}, {M}) -> {A}",
        f"%p = fusion.linear %a, %m, %v : ({A}, {M}, {V}) -> {A}",
    ],
    "fusion.aten": [
        f"%o = fusion.aten \"aten.gelu.default\"(%a) call \"[[{{'operand': 0}}], {{'approximate': 'tanh'}}]\" ATTRS"
        f" : ({A}) -> {A}",
        f"%p:2 = fusion.aten \"aten.var_mean.correction\"(%m) call \"[[{{'operand': 0}}, [1]], {{}}]\""
        f" : ({M}) -> ({V}, {V})",
        f"%q = fusion.aten \"aten.max.dim\"(%m) call \"[[{{'operand': 0}}, 1], {{}}]\" returns [0]"
        f" : ({M}) -> {V}",
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
        f"hir.aten \"aten.t.default\" call \"[[{{'operand': 0}}], {{}}]\" ins(%m : {M}) outs(%m : {M}) ATTRS",
        f"hir.aten \"aten.var_mean.correction\" call \"[[{{'operand': 0}}, [1]], {{}}]\" ins(%m : {M})"
        f" outs(%v, %v : {V}, {V})",
        f"hir.aten \"aten.max.dim\" call \"[[{{'operand': 0}}, 1], {{}}]\" returns [0] ins(%m : {M})"
        f" outs(%v : {V})",
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
