"""Complex tensors: computed on their real pairs (`complex_as_real_pairs`), so that rotary
embeddings written in complex numbers, as Llama's and torchtitan's are, run on hostir."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, note, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from examples.tp_decoder_layer import rank_device, rotary, rotary_frequencies
from hostir.frontend.backend import HostirFallbackWarning
from hostir.frontend.fx_rewrites import complex_as_real_pairs
from hostir.frontend.importer import PAIR_VIEWS, UnsupportedGraph, import_graph
from test_communicator import needs_ranks
from test_compiled_functions import Ops
from test_torch_backend import TOLERANCES, Llama, _dumped, _max_error, assert_the_whole_model_runs_on_hostir, run_on_hostir

aten = torch.ops.aten


# Each: a function of complex a [2, 3, 4], complex b [3, 4], real r [2, 3, 4] and real x
# [2, 3, 8], and the ops its trace must hold.
COMPLEX_FUNCTIONS = {
    "rotary": (lambda a, b, r, x: torch.view_as_real(torch.view_as_complex(x.reshape(2, 3, 4, 2)) * b).flatten(2), aten.mul.Tensor),
    "conjugate product": (lambda a, b, r, x: a * b.conj(), aten._conj.default),
    "by a real tensor": (lambda a, b, r, x: (a * r, r * a, a / r), aten.div.Tensor),
    "by a number": (lambda a, b, r, x: (a * 3, a / 4, 2.5 * a), aten.mul.Tensor),
    "sums": (lambda a, b, r, x: (a + b, a - b, -a, a.add(b, alpha=2)), aten.sub.Tensor),
    "views": (
        lambda a, b, r, x: (a[:, 1:], a.select(-1, 2), a.unsqueeze(-1), a.transpose(-1, -2), a.permute(2, 0, 1),
                            b.expand(2, 3, 4), a.reshape(6, 4), a.clone()),
        aten.permute.default,
    ),
    "another precision": (lambda a, b, r, x: a.to(torch.complex128) * b.to(torch.complex128), aten._to_copy.default),
    "real parts": (lambda a, b, r, x: (a * b).real + torch.view_as_real(b)[..., 1], aten.view_as_real.default),
}


def _complex_inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return (
        torch.randn(2, 3, 4, dtype=torch.complex64),
        torch.randn(3, 4, dtype=torch.complex64),
        torch.randn(2, 3, 4),
        torch.randn(2, 3, 8),
    )


def _complex_value(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.is_complex()


@pytest.mark.parametrize("name", list(COMPLEX_FUNCTIONS))
def test_complex_ops_are_computed_on_real_pairs(name):
    """The rewritten graph holds complex tensors only where it reads its inputs and returns its
    outputs, and computes what the complex ops do."""
    function, traced_op = COMPLEX_FUNCTIONS[name]
    inputs = _complex_inputs()
    gm = make_fx(function)(*inputs)
    assert traced_op in {node.target for node in gm.graph.nodes}
    assert complex_as_real_pairs(gm)
    gm.graph.lint()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target not in PAIR_VIEWS:
            assert not any(map(_complex_value, node.all_input_nodes)), node.format_node()
    expected, got = function(*inputs), gm(*inputs)
    for e, g in zip(expected if isinstance(expected, tuple) else (expected,), got if isinstance(got, tuple) else (got,)):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "function, op",
    [
        (lambda a: a.abs(), "aten.abs.default"),  # complex to real, not a view of the pairs
        (lambda a: a + 1.0, "aten.add.Tensor"),  # a number added to the real parts alone
        (lambda a: a * 2j, "aten.mul.Tensor"),  # a complex factor turns the pairs
        (lambda a: (a.real.to(torch.complex64) * a), "aten._to_copy.default"),  # real to complex
    ],
)
def test_a_complex_op_without_a_pair_form_leaves_the_graph_as_it_was_and_is_named(function, op):
    a = torch.randn(3, 4, dtype=torch.complex64)
    gm = make_fx(function)(a)
    code = gm.code
    assert not complex_as_real_pairs(gm)
    assert gm.code == code
    FakeTensorProp(gm).propagate(a)
    with pytest.raises(UnsupportedGraph, match=rf"{op}.*dtype torch.complex64 are not supported by this op"):
        import_graph(gm)


def test_complex_inputs_and_outputs_of_a_compiled_function_are_hostirs(replay_device):
    """Complex in, complex out, replayed (a CUDA graph on a GPU, emulated on the CPU): no
    fallback, and eager's values, the caller's inputs untouched."""

    def turn(x, freqs, scale):
        turned = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * freqs
        return turned * scale, torch.view_as_real(turned.conj().resolve_conj()).flatten(-2)

    torch.manual_seed(0)
    x = torch.randn(4, 8, 16, device=replay_device)
    freqs = rotary_frequencies(8, 16).to(replay_device)
    scale = torch.randn(4, 8, 8, device=replay_device)
    kept = [t.clone() for t in (x, freqs, scale)]
    compiled = torch.compile(turn, backend="hostir", options={"fallback": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostirFallbackWarning)
        for _ in range(3):  # compile, capture, replay
            got = compiled(x, freqs, scale)
    for g, e in zip(got, turn(x, freqs, scale)):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    for t, k in zip((x, freqs, scale), kept):
        assert torch.equal(t, k)


def test_the_rotation_of_bf16_values_read_in_f32_is_one_kernel():
    """torchtitan's rotation of bf16 queries (`x.float()` read as complex pairs, turned, cast
    back): one kernel reads x where it is and writes the turned bf16 values, rather than a
    kernel that writes x in f32 for a second, or an ATen `cat`; eager's values."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 4, 16, generator=generator).bfloat16()
    freqs = rotary_frequencies(16, 16)
    torch._dynamo.reset()
    with _dumped("host_ir") as dump:
        out = torch.compile(rotary, backend="hostir", options={"fallback": False})(x, freqs)
    torch.testing.assert_close(out, rotary(x, freqs))
    program = dump.getvalue().split("// hostir: the host program", 1)[1]
    assert program.count("hir.launch_kernel") == 1 and "aten.cat" not in program, program


class RotaryAttention(nn.Module):
    """Attention with torchtitan's rotary embeddings in complex numbers, grouped keys and values."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2, sequence: int = 16):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.register_buffer("freqs_cis", rotary_frequencies(sequence, self.head_dim), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, sequence, _ = x.shape
        q, k, v = (w(x).view(batch, sequence, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        freqs = self.freqs_cis[:sequence]
        q, k = rotary(q, freqs), rotary(k, freqs)
        repeats = q.shape[2] // k.shape[2]
        k, v = (t.repeat_interleave(repeats, dim=2) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, sequence, -1))


def _rotary_attention_on_rank(dtype: torch.dtype) -> dict:
    """The attention, tensor parallel over the ranks (heads split, the output projection's
    sums reduced), compiled with hostir, one forward and backward against plain torch's on
    the whole weights and input."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device = rank_device()
    torch.manual_seed(0)
    reference = RotaryAttention().to(device, dtype)
    model = RotaryAttention().to(device, dtype)
    model.load_state_dict(reference.state_dict())
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    plan = {name: ColwiseParallel() for name in ("wq", "wk", "wv")} | {"wo": RowwiseParallel()}
    compiled = torch.compile(parallelize_module(model, mesh, plan), backend="hostir")
    x = torch.randn(2, 16, 64, device=device, dtype=dtype)
    gradient = torch.randn(2, 16, 64, device=device, dtype=dtype)
    inputs = [x.clone().requires_grad_() for _ in range(2)]
    out = compiled(inputs[0])
    out.backward(gradient)
    expected = reference(inputs[1])
    expected.backward(gradient)
    errors = {"output": _max_error(out.float(), expected.float()), "input gradient": _max_error(inputs[0].grad.float(), inputs[1].grad.float())}
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        errors[f"{name} gradient"] = _max_error(p.grad.full_tensor().float(), q.grad.float())
    return errors


@pytest.mark.parametrize("world", [pytest.param(1), pytest.param(2, marks=needs_ranks(2))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_tensor_parallel_attention_with_complex_rotary_embeddings_matches_plain_torch(world, dtype):
    for rank, errors in enumerate(run_on_hostir(_rotary_attention_on_rank, world, dtype, timeout_s=600)):
        assert max(errors.values()) < TOLERANCES[dtype], f"rank {rank}: {errors}"


class RotaryLlama(Llama):
    """test_torch_backend's model, each layer's attention with rotary embeddings in complex numbers."""

    def __init__(self):
        super().__init__()
        for layer in self.layers:
            layer.attention = RotaryAttention()


@needs_ranks(2)
def test_a_whole_model_with_complex_rotary_embeddings_and_torchtitans_plan_runs_on_hostir():
    assert_the_whole_model_runs_on_hostir(RotaryLlama)


# The ops of the property below, on complex tensors of shape [2, 3, 4] (the leaves "a" and
# "b", b expanded from [3, 4]) and the real "r". Each view ends in the shape it began with,
# so that any expression may be an operand of any other.
_VIEWS = {
    "transpose": lambda x: x.transpose(-1, 0).transpose(0, 2),
    "permute": lambda x: x.permute(1, -1, 0).permute(2, 0, 1),
    "reshape": lambda x: x.reshape(6, 4).view(2, 3, 4),
    "unsqueeze": lambda x: x.unsqueeze(-2).squeeze(2),
    "halves expanded": lambda x: x[:1].expand(2, 3, 4) - x[1:].expand(2, 3, 4),
    "selected": lambda x: x.select(1, 2).unsqueeze(1).expand(2, 3, 4),
}
_UNARY = {
    "neg": lambda x: -x,
    "conj": lambda x: x.conj(),
    "conj_physical": torch.conj_physical,
    "resolved conj": lambda x: x.conj().resolve_conj(),
    "clone": torch.clone,
    "by 2.5": lambda x: x * 2.5,
    "by 2.5, left": lambda x: 2.5 * x,
    "over 4": lambda x: x / 4,
}
COMPLEX_OPS = Ops(
    unary={**_UNARY, **_VIEWS},
    binary={"mul": torch.mul, "add": torch.add, "sub": torch.sub},
    with_parameter={
        "by r": (lambda x, r: x * r, "r"),
        "r by": (lambda x, r: r * x, "r"),
        "over r": (lambda x, r: x / r, "r"),
    },
)


@settings(deadline=None)
@given(expression=COMPLEX_OPS.expressions(["a", "b"], max_leaves=6), ending=st.sampled_from(["complex", "pairs", "real parts", "complex128"]))
def test_any_composition_of_complex_ops_with_a_pair_form_is_computed_on_pairs(expression, ending):
    """Compositions of the ops with a pair form (products, sums, conjugates, real scaling,
    views), drawn at random: the rewritten graph reads and returns complex values only at its
    edges, computes eager's values, and holds only ops that the importer maps."""
    note(repr(expression))

    def function(a, b, r):  # one output in a tuple, as the graphs of torch.compile return theirs
        value = COMPLEX_OPS.evaluate(expression, {"a": a, "b": b.expand(2, 3, 4), "r": r})
        if ending == "pairs":
            return (torch.view_as_real(value.resolve_conj()).flatten(-2),)
        if ending == "real parts":
            return (value.real,)
        return (value.to(torch.complex128) if ending == "complex128" else value,)

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 4, dtype=torch.complex64, generator=generator)
    b = torch.randn(3, 4, dtype=torch.complex64, generator=generator)
    r = torch.rand(2, 3, 4, generator=generator) + 0.5  # away from zero: it divides
    gm = make_fx(function)(a, b, r)
    assert complex_as_real_pairs(gm), gm.code
    gm.graph.lint()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target not in PAIR_VIEWS:
            assert not any(_complex_value(arg) for arg in node.all_input_nodes), node.format_node()
    (expected,), (got,) = function(a, b, r), gm(a, b, r)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected.resolve_conj(), rtol=1e-5, atol=1e-5)
    FakeTensorProp(gm).propagate(a, b, r)
    import_graph(gm)  # raises UnsupportedGraph, naming the op, for one the importer does not map
