"""`fusion.attention` and `fusion.attention_backward`: their meaning on tensors against torch's
SDPA and autograd (random inputs, f32 and bf16), in a program and in the unsharded
reference; the causal layouts of a sharded sequence, whole and block by block; and the
importer, which maps SDPA's kernels to them, those of the CPU from compiled graphs and
those of GPUs from graphs traced on fake tensors, run here on the CPU's kernel.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from hostir_dialect import fusion
from hostir_dialect.fusion import Causal
from hostir.frontend.backend import layout_tensor
from hostir.frontend.importer import LayoutValue, import_graph
from hostir.frontend.rules.attention import HIDDEN_AT_MOST
from hostir.runtime.interpreter.attention import (
    Mask,
    attention,
    attention_backward,
    block_attention,
    block_attention_backward,
    layout_mask,
    positions,
    whole_sequence,
)
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.program import Program
from hostir.runtime.reference import reference_outputs
from test_torch_backend import _dumped

aten = torch.ops.aten
B, H, L, E = 2, 3, 8, 16
NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.bool: "i1"}

CPU = Communicator.single(torch.device("cpu"))
"""Where the programs here run, on a machine with GPUs too: the CPU's SDPA kernels are the
references, and the GPUs' kernels are imported from graphs made on fake tensors."""


def tensor_type(shape, dtype=torch.float32, devices: int = 1, varying: bool = False) -> str:
    """The text of a !fusion.tensor: `shape` (the device axis first where `varying`) on a mesh of `devices`."""
    mesh = "" if devices == 1 else f", mesh = [{', '.join(map(str, range(devices)))}]"
    axes = f", axes = [didx{', _' * (len(shape) - 1)}]" if varying else ""
    return f"!fusion.tensor<[{', '.join(map(str, shape))}], {NAMES[dtype]}{mesh}{axes}>"


def attention_program(q_shape, k_shape, dtype, properties: str = "", mask=None, backward=False, v_shape=None) -> Program:
    """A one-device fusion of one attention (and with `backward` its backward) on its inputs."""
    v_shape = v_shape or k_shape
    q, k, v = (tensor_type(s, dtype) for s in (q_shape, k_shape, v_shape))
    out_shape = (*torch.broadcast_shapes(q_shape[:-2], (1,) * 0), q_shape[-2], v_shape[-1])
    out, lse = tensor_type(out_shape, dtype), tensor_type(out_shape[:-1])
    arguments = [f"%q: {q}", f"%k: {k}", f"%v: {v}"]
    operand_types = [q, k, v]
    mask_text = ""
    if mask is not None:
        m = tensor_type(tuple(mask.shape), mask.dtype)
        arguments.append(f"%m: {m}")
        operand_types.append(m)
        mask_text = " mask %m"
    types = ", ".join(operand_types)
    body = f"%out, %lse = fusion.attention %q, %k, %v{mask_text}{properties} : ({types}) -> ({out}, {lse})\n"
    results, result_types = ["%out", "%lse"], [out, lse]
    if backward:
        arguments.append(f"%dout: {out}")
        grads = [q, k, v]
        body += (
            f"  %dq, %dk, %dv = fusion.attention_backward %dout, %q, %k, %v, %out, %lse{mask_text}{properties}"
            f" : ({out}, {q}, {k}, {v}, {out}, {lse}{', ' + operand_types[3] if mask is not None else ''})"
            f" -> ({', '.join(grads)})\n"
        )
        results += ["%dq", "%dk", "%dv"]
        result_types += grads
    text = (
        f"func.func @attention({', '.join(arguments)}) -> ({', '.join(result_types)}) {{\n  {body}"
        f"  func.return {', '.join(results)} : {', '.join(result_types)}\n}}\n"
    )
    return Program.compile(text)


def sdpa_with_gradients(q, k, v, dout, **kwargs):
    """SDPA's output, the CPU flash kernel's log-sum-exp, and autograd's gradients for `dout`."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, **kwargs)
    out.backward(dout)
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(mask.logical_not(), -math.inf)
    _, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=kwargs.get("is_causal", False), attn_mask=mask, scale=kwargs.get("scale")
    )
    return [out.detach(), lse, *(leaf.grad for leaf in leaves)]


MASKS = ["none", "top_left", "boolean", "additive"]


def _mask(kind: str, dtype: torch.dtype, generator: torch.Generator) -> tuple[str, torch.Tensor | None, dict]:
    """The op's properties, the mask operand and SDPA's arguments for a kind of mask."""
    if kind == "top_left":
        return " causal top_left", None, {"is_causal": True}
    if kind == "none":
        return "", None, {}
    seen = torch.rand(L, L, generator=generator) > 0.4
    seen.fill_diagonal_(True)  # every row sees a key (a row that sees none is tested below)
    mask = seen if kind == "boolean" else torch.randn(L, L, generator=generator).to(dtype).masked_fill(~seen, -math.inf)
    return "", mask, {"attn_mask": mask}


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))],
)
@pytest.mark.parametrize("batch", [1, 2], ids=["one_sequence", "two_sequences"])
def test_the_kernels_lay_out_their_results_with_the_heads_inside_the_rows(device, batch):
    """Queries, keys and values as a projection makes them (`[B, L, H, E]` in memory, read as
    `[B, H, L, E]`): the gradients (and on the GPU the output too, whose CPU kernel writes
    `[B, H, L, E]`) come with the heads inside the rows and the sequences outside them, so
    that turning them back into the projection's rows `[B L, H * E]` is a view, not a copy;
    and they are SDPA's and autograd's."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    generator = torch.Generator().manual_seed(7)
    q, k, v, dout = (
        torch.randn(batch, 64, 4, 32, generator=generator).to(device, dtype).transpose(1, 2) for _ in range(4)
    )
    mask = Mask(None, True, None)
    out, lse = attention(q, k, v, mask)
    grads = attention_backward(dout, q, k, v, out, lse, mask)
    expected = sdpa_with_gradients(*(t.cpu().float() for t in (q, k, v, dout)), is_causal=True)
    tolerance = {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {}
    for result, reference in zip([out, lse, *grads], expected, strict=True):
        torch.testing.assert_close(result.cpu().float(), reference, **tolerance)
    for name, result in zip(["dq", "dk", "dv", "out"], [*grads, out]):
        if name != "out" or device == "cuda":
            rows = result.transpose(1, 2).view(batch * 64, 4 * 32)  # raises where it is not a view
            assert rows.data_ptr() == result.data_ptr(), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("scale", [None, 0.3], ids=["default_scale", "scale"])
def test_attention_and_its_backward_are_sdpa_and_autograd(dtype, mask_kind, scale):
    """Output, log-sum-exp and the three gradients of a program against SDPA and autograd on the
    same random inputs, and the unsharded reference (fusion_eval) alike."""
    generator = torch.Generator().manual_seed(len(mask_kind) + (scale is not None))
    q, k, v, dout = (torch.randn(B, H, L, E, generator=generator).to(dtype) for _ in range(4))
    properties, mask, kwargs = _mask(mask_kind, dtype, generator)
    if scale is not None:
        properties += f" scale {scale}"
        kwargs["scale"] = scale
    program = attention_program(q.shape, k.shape, dtype, properties, mask, backward=True)
    inputs = [q, k, v, *([mask] if mask is not None else []), dout]
    expected = sdpa_with_gradients(q, k, v, dout, **kwargs)
    for results in (program.run(inputs, CPU), reference_outputs(program.fusion, inputs)):
        for result, reference in zip(results, expected, strict=True):
            torch.testing.assert_close(result, reference.to(result.dtype))


def test_keys_in_blocks_are_the_blocks_rows_in_order():
    """Keys and values `[C, *batch, rows, width]` read as blocks: the attention over their rows
    in block order, and the gradients of the keys and values in blocks again."""
    generator = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(B, H, L, E, generator=generator) for _ in range(2))
    k, v = (torch.randn(4, B, H, L // 2, E, generator=generator) for _ in range(2))
    program = attention_program(q.shape, k.shape, torch.float32, " causal top_left blocks", backward=True)
    out, lse, dq, dk, dv = program.run([q, k, v, dout], CPU)
    flat = [t.movedim(0, -3).flatten(-3, -2) for t in (k, v)]
    expected = sdpa_with_gradients(q, *flat, dout, is_causal=True)
    for result, reference in zip((out, lse, dq), expected[:3]):
        torch.testing.assert_close(result, reference)
    for result, reference in zip((dk, dv), expected[3:]):
        torch.testing.assert_close(result, reference.unflatten(-2, (4, L // 2)).movedim(-3, 0))


def test_a_row_that_sees_no_key_has_output_0_and_log_sum_exp_minus_infinity():
    """The identity of the merge of a ring, where the CPU's kernel says log-sum-exp 0; its
    gradients are 0."""
    generator = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 1, 4, E, generator=generator) for _ in range(4))
    seen = torch.ones(4, 4, dtype=torch.bool)
    seen[2] = False
    program = attention_program(q.shape, k.shape, torch.float32, mask=seen, backward=True)
    for out, lse, dq, _, _ in (program.run([q, k, v, seen, dout], CPU), reference_outputs(program.fusion, [q, k, v, seen, dout])):
        assert (out[..., 2, :] == 0).all() and lse[..., 2].isneginf().all() and (dq[..., 2, :] == 0).all()
        assert lse[..., [0, 1, 3]].isfinite().all()


def sequence_order(pieces: torch.Tensor, layout: Causal) -> torch.Tensor:
    """`pieces [D, ..., rows, width]`, each device's rows in `layout`, as the whole sequence in order."""
    devices, rows = pieces.shape[0], pieces.shape[-2]
    order = whole_sequence(devices, rows, layout, pieces.device)
    whole = torch.cat(list(pieces), dim=-2)
    return whole[..., order.argsort(), :]


@pytest.mark.parametrize("layout", [Causal.CONTIGUOUS, Causal.HEAD_TAIL])
@pytest.mark.parametrize("devices", [1, 2, 4])
def test_a_causal_layout_is_the_causal_mask_of_the_positions(layout, devices):
    """Each device's queries (varying) against the keys of every device (replicated, in blocks
    as all-gathered): the unsharded reference, put in sequence order, is causal attention over
    the whole sequence, and its gradients autograd's."""
    generator = torch.Generator().manual_seed(devices)
    q, dout = (torch.randn(devices, B, H, L, E, generator=generator) for _ in range(2))
    k, v = (torch.randn(devices, B, H, L, E, generator=generator) for _ in range(2))
    varying = tensor_type((devices, B, H, L, E), devices=devices, varying=True)
    blocks = tensor_type((devices, B, H, L, E), devices=devices)
    lse = tensor_type((devices, B, H, L), devices=devices, varying=True)
    shares = tensor_type((devices, devices, B, H, L, E), devices=devices, varying=True)  # each device's, in blocks
    text = f"""
func.func @layout(%q: {varying}, %k: {blocks}, %v: {blocks}, %dout: {varying}) -> ({varying}, {lse}, {varying}, {shares}, {shares}) {{
  %out, %lse = fusion.attention %q, %k, %v causal {layout.value} blocks : ({varying}, {blocks}, {blocks}) -> ({varying}, {lse})
  %dq, %dk, %dv = fusion.attention_backward %dout, %q, %k, %v, %out, %lse causal {layout.value} blocks : ({varying}, {varying}, {blocks}, {blocks}, {varying}, {lse}) -> ({varying}, {shares}, {shares})
  func.return %out, %lse, %dq, %dk, %dv : {varying}, {lse}, {varying}, {shares}, {shares}
}}
"""
    program = Program.compile(text)
    out, out_lse, dq, dk, dv = reference_outputs(program.fusion, [q, k, v, dout])
    whole = [sequence_order(t, layout) for t in (q, k, v, dout)]
    expected = sdpa_with_gradients(*whole, is_causal=True)
    torch.testing.assert_close(sequence_order(out, layout), expected[0])
    torch.testing.assert_close(sequence_order(out_lse[..., None], layout)[..., 0], expected[1])
    torch.testing.assert_close(sequence_order(dq, layout), expected[2])
    # Each device's share of the keys' gradient, summed: autograd's.
    torch.testing.assert_close(sequence_order(dk.sum(dim=0), layout), expected[3])
    torch.testing.assert_close(sequence_order(dv.sum(dim=0), layout), expected[4])


@pytest.mark.parametrize("layout", [Causal.CONTIGUOUS, Causal.HEAD_TAIL])
def test_a_block_computes_the_rows_that_meet_as_the_mask_of_the_positions_would(layout):
    """For every device and every block of 4: the block's attention and its gradients, computed on
    the rows that meet only, equal attention under the positional mask of that block (a row
    that meets no key: output 0, log-sum-exp -inf, gradients 0)."""
    devices, generator = 4, torch.Generator().manual_seed(2)
    for position, source in itertools.product(range(devices), repeat=2):
        q, k, v, dout = (torch.randn(B, H, L, E, generator=generator) for _ in range(4))
        seen = layout_mask(positions(position, devices, L, layout, q.device), positions(source, devices, L, layout, q.device))
        expected_out, expected_lse = attention(q, k, v, Mask(seen))
        out, lse = torch.full((B, H, L, E), math.nan), torch.full((B, H, L), math.nan)  # every element written
        block_attention(q, k, v, out, lse, layout, None, position, source)
        torch.testing.assert_close(out, expected_out)
        torch.testing.assert_close(lse, expected_lse)
        # The gradients from the whole attention's output and log-sum-exp (the ring's): those of
        # the merged output, here any finite ones.
        whole_out, whole_lse = attention(q, k, v, Mask(None, position >= source))
        expected = attention_backward(dout, q, k, v, whole_out, whole_lse, Mask(seen))
        grads = [torch.full((B, H, L, E), math.nan) for _ in range(3)]
        block_attention_backward(dout, q, k, v, whole_out, whole_lse, grads, layout, None, position, source)
        for grad, reference in zip(grads, expected):
            torch.testing.assert_close(grad, reference)


# --------------------------------------------------------------------------- #
# The importer                                                                 #
# --------------------------------------------------------------------------- #


def _ops_of(dump: str, name: str) -> int:
    return dump.count(f"= {name} ")


@pytest.mark.parametrize("mask_kind", MASKS)
def test_sdpa_on_the_cpu_imports_as_fusion_attention(mask_kind):
    """SDPA compiled with hostir on the CPU (its flash kernel and that kernel's backward): one
    `fusion.attention` and one `fusion.attention_backward`, and eager's numbers."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, L, E, generator=generator, requires_grad=True) for _ in range(3))
    _, mask, kwargs = _mask(mask_kind, torch.float32, generator)
    kwargs["scale"] = 0.2

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    torch._dynamo.reset()
    with _dumped("fusion") as dump:
        out = torch.compile(f, backend="hostir", options={"fallback": False})(q, k, v)
        out.square().sum().backward()
    grads = [t.grad for t in (q, k, v)]
    expected = sdpa_with_gradients(q, k, v, 2 * f(q, k, v).detach(), **kwargs)
    torch.testing.assert_close(out, expected[0])
    for grad, reference in zip(grads, expected[2:]):
        torch.testing.assert_close(grad, reference)
    text = dump.getvalue()
    assert _ops_of(text, "fusion.attention") == 1 and _ops_of(text, "fusion.attention_backward") == 1, text
    assert "scaled_dot_product" not in text.replace("%_scaled_dot_product", "%"), "no attention runs as fusion.aten"
    assert ("causal top_left" in text) == (mask_kind == "top_left") and (" mask %" in text) == (mask is not None)


def _fake_graph(function, shapes_and_dtypes, scalars: tuple[float, ...] = ()) -> torch.fx.GraphModule:
    """`function` traced, its nodes' values propagated on fake GPU tensors of the given shapes and
    dtypes; its last arguments, one per number of `scalars`, are `aten.scalar_tensor`s of them
    computed in the graph (which the trace would make constants)."""
    graph = torch.fx.symbolic_trace(function)
    arguments = [node for node in graph.graph.nodes if node.op == "placeholder"]
    for node, value in zip(arguments[len(arguments) - len(scalars) :], scalars):
        with graph.graph.inserting_after(node):
            node.replace_all_uses_with(graph.graph.call_function(aten.scalar_tensor.default, (value,)))
        graph.graph.erase_node(node)
    graph.recompile()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        inputs = [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in shapes_and_dtypes]
        FakeTensorProp(graph, mode).propagate_dont_convert_inputs(*inputs)
    return graph


def _flash(q, k, v, dout):
    forward = aten._scaled_dot_product_flash_attention.default(q, k, v, 0.0, True, False, scale=0.25)
    grads = aten._scaled_dot_product_flash_attention_backward.default(
        dout, q, k, v, forward[0], forward[1], forward[2], forward[3], forward[4], forward[5], 0.0, True,
        forward[6], forward[7], scale=0.25,
    )
    return forward[0], grads[0], grads[1], grads[2]


def _efficient(q, k, v, dout, bias):
    forward = aten._scaled_dot_product_efficient_attention.default(q, k, v, bias, True, 0.0, False, scale=0.25)
    grads = aten._scaled_dot_product_efficient_attention_backward.default(
        dout, q, k, v, bias, forward[0], forward[1], forward[2], forward[3], 0.0, [True, True, True, False], False,
        scale=0.25,
    )
    return forward[0], grads[0], grads[1], grads[2]


def _cudnn(q, k, v, dout):
    forward = aten._scaled_dot_product_cudnn_attention.default(q, k, v, None, True, 0.0, True, False, scale=0.25)
    grads = aten._scaled_dot_product_cudnn_attention_backward.default(
        dout, q, k, v, forward[0], forward[1], forward[6], forward[7], None, None, None, forward[4], forward[5], 0.0,
        True, scale=0.25,
    )
    return forward[0], grads[0], grads[1], grads[2]


@pytest.mark.parametrize(
    "function, dtype, masked",
    [(_flash, torch.bfloat16, False), (_efficient, torch.float32, True), (_cudnn, torch.bfloat16, False)],
    ids=["flash", "efficient", "cudnn"],
)
def test_the_gpus_kernels_import_as_fusion_attention_and_run_on_the_cpu(function, dtype, masked):
    """A graph of a GPU kernel and its backward, traced on fake GPU tensors (40 rows: efficient
    attention pads its log-sum-exp to 64, cuDNN's has a trailing axis): one fusion.attention
    and one fusion.attention_backward, whose program, run on the CPU, is SDPA and autograd."""
    rows = 40
    shapes = [((B, H, rows, E), dtype)] * 4 + ([((rows, rows), dtype)] if masked else [])
    imported = import_graph(_fake_graph(function, shapes))
    ops = [op.name for op in imported.module.walk()]
    assert ops.count("fusion.attention") == 1 and ops.count("fusion.attention_backward") == 1, ops
    program = Program.compile(imported.module)
    generator = torch.Generator().manual_seed(4)
    q, k, v, dout = (torch.randn(B, H, rows, E, generator=generator).to(dtype) for _ in range(4))
    bias = [torch.randn(rows, rows, generator=generator).to(dtype)] if masked else []
    results = program.run([q, k, v, dout, *bias], CPU)
    kwargs = {"attn_mask": bias[0]} if masked else {"is_causal": True}
    expected = sdpa_with_gradients(q, k, v, dout, scale=0.25, **kwargs)
    for result, reference in zip(results, [expected[0], *expected[2:]], strict=True):
        torch.testing.assert_close(result, reference)


def _efficient_masked_by_positions(q, k, v, dout, queries, keys, zero, minus_inf):
    """Efficient attention and its backward as SDPA calls them on GPUs for a boolean mask of the
    tokens' positions: the mask made 0 and -inf, then expanded to the batch and the heads."""
    seen = aten.ge.Tensor(aten.unsqueeze.default(queries, 1), aten.unsqueeze.default(keys, 0))
    mask = aten.where.self(seen, zero, minus_inf)
    bias = aten.expand.default(mask, [B, H, -1, -1])
    forward = aten._scaled_dot_product_efficient_attention.default(q, k, v, bias, True, 0.0, False, scale=0.25)
    grads = aten._scaled_dot_product_efficient_attention_backward.default(
        dout, q, k, v, bias, forward[0], forward[1], forward[2], forward[3], 0.0, [True, True, True, False], False,
        scale=0.25,
    )
    return forward[0], grads[0], grads[1], grads[2], mask


def _cudnn_masked_by_positions(q, k, v, dout, queries, keys, zero, hidden):
    """cuDNN attention and its backward as SDPA calls them on GPUs for a boolean mask of the
    tokens' positions: the mask made 0 and float16's lowest (cuDNN gets no -inf)."""
    seen = aten.ge.Tensor(aten.unsqueeze.default(queries, 1), aten.unsqueeze.default(keys, 0))
    mask = aten.where.self(seen, zero, hidden)
    forward = aten._scaled_dot_product_cudnn_attention.default(q, k, v, mask, True, 0.0, False, False, scale=0.25)
    grads = aten._scaled_dot_product_cudnn_attention_backward.default(
        dout, q, k, v, forward[0], forward[1], forward[6], forward[7], mask, forward[2], forward[3], forward[4],
        forward[5], 0.0, False, scale=0.25,
    )
    return forward[0], grads[0], grads[1], grads[2], mask


@pytest.mark.parametrize(
    ("function", "hidden", "batch"),
    [(_efficient_masked_by_positions, -math.inf, (B, H)), (_cudnn_masked_by_positions, HIDDEN_AT_MOST, ())],
    ids=["efficient", "cudnn"],
)
def test_the_gpus_mask_of_positions_is_the_sequence_layouts(function, hidden, batch):
    """With `sequence_layout`, the mask that SDPA hands efficient attention on GPUs (0 and -inf,
    expanded to the batch and the heads) or cuDNN attention (0 and -65504) is read as the
    layout's causal mask: the attention and its backward are causal in the layout, with no
    mask operand, the positions are checked inputs, and the mask the graph returns (saved for a
    backward) is the layout's, which the backend makes with the graph's value for hidden keys
    (broadcast as a saved mask would be)."""
    shapes = [((B, H, L, E), torch.float32)] * 4 + [((L,), torch.int64)] * 2
    graph = _fake_graph(function, shapes, scalars=(0.0, hidden))
    imported = import_graph(graph, sequence_layout=Causal.HEAD_TAIL)
    attentions = [op for op in imported.module.walk() if isinstance(op, (fusion.AttentionOp, fusion.AttentionBackwardOp))]
    assert len(attentions) == 2 and all(op.causal_mask == Causal.HEAD_TAIL and op.mask is None for op in attentions)
    assert [(index, value.kind) for index, value in imported.layout_inputs] == [(4, "queries"), (5, "keys")] * 2
    kind, (mask, dtype) = imported.outputs[-1]
    assert (kind, mask, dtype) == ("layout", LayoutValue("mask", L, Causal.HEAD_TAIL, hidden=hidden), torch.float32)
    saved = LayoutValue("mask", L, Causal.HEAD_TAIL, batch, hidden)
    made = layout_tensor(saved, torch.bfloat16, 1, 2, CPU.device)
    seen = layout_mask(positions(1, 2, L, Causal.HEAD_TAIL, CPU.device), whole_sequence(2, L, Causal.HEAD_TAIL, CPU.device))
    assert made.shape == (*batch, L, 2 * L)
    expected = torch.where(seen, 0.0, hidden).to(torch.bfloat16).expand(*batch, L, 2 * L)
    assert torch.equal(made, expected) and made.amin().item() == (-65536.0 if batch == () else -math.inf)


def test_a_mask_that_hides_keys_by_a_value_of_no_weight_only():
    """A float mask's value for hidden keys must give them no weight in softmax: -inf, or
    float16's lowest or less; a mask of 0 and -100 is a bias like any other, not causal."""
    shapes = [((B, H, L, E), torch.float32)] * 4 + [((L,), torch.int64)] * 2
    imported = import_graph(_fake_graph(_cudnn_masked_by_positions, shapes, scalars=(0.0, -100.0)), sequence_layout=Causal.HEAD_TAIL)
    attentions = [op for op in imported.module.walk() if isinstance(op, (fusion.AttentionOp, fusion.AttentionBackwardOp))]
    assert attentions and all(op.mask is not None for op in attentions)
    assert not imported.layout_inputs


def _math(q, k, v):
    out, weights = aten._scaled_dot_product_attention_math.default(q, k, v, None, 0.0, True)
    return (out,)


def _math_with_weights(q, k, v):
    out, weights = aten._scaled_dot_product_attention_math.default(q, k, v, None, 0.0, True)
    return out, weights


def test_the_math_fallback_imports_where_its_weights_go_unread():
    """SDPA's math kernel returns the attention weights, which fusion.attention does not: a call
    whose weights are read stays ATen's."""
    shapes = [((B, H, L, E), torch.float32)] * 3
    unread = [op.name for op in import_graph(_fake_graph(_math, shapes)).module.walk()]
    assert "fusion.attention" in unread and "fusion.aten" not in unread
    read = import_graph(_fake_graph(_math_with_weights, shapes)).module
    assert [op.target.data for op in read.walk() if isinstance(op, fusion.AtenOp)] == [
        "aten._scaled_dot_product_attention_math.default"
    ]
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, H, L, E, generator=generator) for _ in range(3))
    (out,) = Program.compile(import_graph(_fake_graph(_math, shapes)).module).run([q, k, v], CPU)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_grouped_query_attention_runs_as_atens_kernel():
    """Fewer heads of keys and values than of queries (SDPA's `enable_gqa`, which the CPU's
    flash kernel and its backward take from the shapes alone): the fusion op has no such
    form, so the kernels stay ATen's calls, and the values and gradients are eager's."""
    generator = torch.Generator().manual_seed(6)
    q = torch.randn(B, 4, L, E, generator=generator, requires_grad=True)
    k, v = (torch.randn(B, 2, L, E, generator=generator, requires_grad=True) for _ in range(2))

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    torch._dynamo.reset()
    with _dumped("fusion") as dump:
        out = torch.compile(f, backend="hostir", options={"fallback": False})(q, k, v)
        out.square().sum().backward()
    grads = [t.grad for t in (q, k, v)]
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    expected = f(*inputs)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    for grad, t in zip(grads, inputs):
        torch.testing.assert_close(grad, t.grad)
    text = dump.getvalue()
    assert _ops_of(text, "fusion.attention") == 0 and "aten._scaled_dot_product_flash_attention_for_cpu" in text


def test_a_gemm_added_to_rows_of_attentions_output_leaves_the_output_the_backward_reads():
    """`attention(x, x, x)[:, 0] + x @ w`: the GEMM adds its product into the selected rows
    (`sum-in-matmul`), which must not be the attention's output itself (the select's view,
    `forward-buffers`): the backward reads that output, and the gradients are eager's."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(B, L, E, generator=generator)
    w = torch.randn(E, E, generator=generator)
    grad = torch.randn(B, L, E, generator=generator)

    def f(x, w):
        return F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None], is_causal=True)[:, 0] + x @ w

    torch._dynamo.reset()
    results = []
    for run in (f, torch.compile(f, backend="hostir", options={"fallback": False})):
        leaves = [t.clone().requires_grad_() for t in (x, w)]
        out = run(*leaves)
        out.backward(grad)
        results.append((out, *(t.grad for t in leaves)))
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected)
