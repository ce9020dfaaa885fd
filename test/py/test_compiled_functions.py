"""Property tests (Hypothesis) of the torch.compile backend on functions drawn at random.

A function is a composition of the ops a model's layers are made of, on activations `x` and
`y` of shape [2, 6, 8], a weight `w` [8, 8] and a vector `v` [8]: pointwise ops,
activations, products with the weight, normalizations and other reductions read back
against their rows, and views taken and undone (transposes, flattened rows, halves
concatenated again), attention, each keeping the activations' shape. It is compiled with
`backend="hostir"` and `fallback=False` (no graph may run as torch eager ops), run forward
and backward, and compared with eager torch on the same inputs, its gradients too: in f32
(with `dynamic=True` at two sequence lengths, drawn), and in bf16 on a GPU against
inductor's distance from eager. On a GPU (where one is visible) the programs run the
generated CUDA kernels and replay as CUDA graphs; on the CPU, the interpreter's.

CI runs ten functions of the `ci` profile (each compiles two graphs); on a GPU machine
`pytest test/py/test_compiled_functions.py --hypothesis-profile=search` takes about a
minute, and `--hypothesis-profile=long` searches ten times longer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

SHAPE = (2, 6, 8)

UNARY = {
    "neg": torch.neg,
    "exp of tanh": lambda a: torch.exp(torch.tanh(a)),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu tanh": lambda a: F.gelu(a, approximate="tanh"),
    "relu": F.relu,
    "abs": torch.abs,
    "square": lambda a: a * a,
    "pow 2": lambda a: a.pow(2),
    "sqrt": lambda a: torch.sqrt(a.abs() + 1),
    "rsqrt": lambda a: torch.rsqrt(a * a + 1),
    "reciprocal": lambda a: torch.reciprocal(a * a + 1),
    "log": lambda a: torch.log(a * a + 1),
    "erf": torch.erf,
    "scaled": lambda a: a * 0.5,
    "one minus": lambda a: 1 - a,
    "minus the row mean": lambda a: a - a.mean(-1, keepdim=True),
    "times the column max": lambda a: a * a.amax(1, keepdim=True),
    "plus the sequence sum": lambda a: a + a.sum(1, keepdim=True),
    "softmax": lambda a: F.softmax(a, -1),
    "log softmax": lambda a: F.log_softmax(a, -1),
    "layer norm": lambda a: F.layer_norm(a, (SHAPE[-1],)),
    "transposed": lambda a: (a.transpose(1, 2) * 2).transpose(1, 2),
    "on rows": lambda a: torch.tanh(a.reshape(-1, a.shape[-1])).reshape(a.shape),
    "halves": lambda a: torch.cat([a[:, : SHAPE[1] // 2] * 2, a[:, SHAPE[1] // 2 :]], 1),
    "rotated halves": lambda a: torch.cat([-a[..., SHAPE[-1] // 2 :], a[..., : SHAPE[-1] // 2]], -1),
    "clamp": lambda a: torch.clamp(a, -0.5, 0.7),
    "leaky relu": lambda a: F.leaky_relu(a, 0.1),
    "softplus": F.softplus,
    "cube": lambda a: a**3,
    "root": lambda a: (a * a + 1) ** 0.5,
    "masked fill": lambda a: a.masked_fill(a > 0.5, 0.25),
    "cumulative sum": lambda a: torch.cumsum(a, 1),
    "minus the row variance": lambda a: a - a.var(-1, keepdim=True),
    "over the row norm": lambda a: a / (a.norm(dim=-1, keepdim=True) + 1),
    "softmax over the sequence": lambda a: F.softmax(a, 1),
    "minus the log sum exp": lambda a: a - torch.logsumexp(a, -1, keepdim=True),
    "plus the batch mean": lambda a: a + a.mean(0, keepdim=True),
    "in f32": lambda a: F.silu(a.float()).to(a.dtype),
}
"""Ops of one activation."""

WITH_PARAMETER = {
    "plus v": (lambda a, v: a + v, "v"),
    "times v": (lambda a, v: a * v, "v"),
    "linear": (F.linear, "w"),
    "matmul": (torch.matmul, "w"),
    "rms norm": (lambda a, v: F.rms_norm(a, (SHAPE[-1],), v), "v"),
}
"""Ops of one activation and the weight `w` or the vector `v`."""

BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b * b + 1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where": lambda a, b: torch.where(a > b, a, b * 2),
    "swiglu": lambda a, b: F.silu(a) * b,
    "attention": lambda a, b: F.scaled_dot_product_attention(a[:, None], b[:, None], b[:, None], is_causal=True)[:, 0],
    "scores": lambda a, b: F.softmax(a @ b.transpose(1, 2) * SHAPE[-1] ** -0.5, -1) @ b,
}


@dataclass(frozen=True)
class Ops:
    """The ops an expression is drawn from: of one tensor, of two, and of one tensor and a
    named input (`with_parameter`: name -> (function, the input's name)). An expression is
    a leaf (an input's name) or (op, operands...)."""

    unary: dict[str, Callable[..., torch.Tensor]]
    binary: dict[str, Callable[..., torch.Tensor]]
    with_parameter: dict[str, tuple[Callable[..., torch.Tensor], str]]

    def expressions(self, leaves: Sequence[str], max_leaves: int) -> st.SearchStrategy:
        return st.recursive(
            st.sampled_from(list(leaves)),
            lambda inner: st.one_of(
                st.tuples(st.sampled_from([*self.unary, *self.with_parameter]), inner),
                st.tuples(st.sampled_from(list(self.binary)), inner, inner),
            ),
            max_leaves=max_leaves,
        )

    def evaluate(self, expression, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if isinstance(expression, str):
            return inputs[expression]
        op, *operands = expression
        values = [self.evaluate(operand, inputs) for operand in operands]
        if op in self.binary:
            return self.binary[op](*values)
        if op in self.with_parameter:
            function, parameter = self.with_parameter[op]
            return function(*values, inputs[parameter])
        return self.unary[op](*values)


LAYER_OPS = Ops(UNARY, BINARY, WITH_PARAMETER)


def expressions() -> st.SearchStrategy:
    """An expression of the layer's ops on the activations "x" and "y"."""
    return LAYER_OPS.expressions(["x", "y"], max_leaves=5)


def function_of(expression) -> Callable[..., torch.Tensor]:
    def function(x, y, w, v):
        return LAYER_OPS.evaluate(expression, {"x": x, "y": y, "w": w, "v": v})

    return function


def _inputs(seed: int, sequence: int = SHAPE[1]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    activation = (SHAPE[0], sequence, SHAPE[2])
    shapes = {"x": activation, "y": activation, "w": (SHAPE[-1], SHAPE[-1]), "v": (SHAPE[-1],), "grad": activation}
    return {name: torch.randn(shape, generator=generator).to(DEVICE) for name, shape in shapes.items()}


def _trained(function, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    """`function`'s output on `inputs` and the gradient of every input, from the output's
    gradient `inputs["grad"]`."""
    leaves = {key: value.clone().requires_grad_() for key, value in inputs.items() if key != "grad"}
    out = function(**leaves)
    out.backward(inputs["grad"])
    return out.detach(), {key: leaf.grad for key, leaf in leaves.items()}


@settings(
    max_examples=max(4, settings().max_examples // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(expression=expressions(), seed=st.integers(0, 2**16), dynamic=st.booleans())
def test_a_compiled_function_trains_as_eager_does(expression, seed, dynamic):
    """Forward and gradients of every input match eager's (f32), and no graph falls back;
    compiled with `dynamic=True`, at two sequence lengths."""
    note(repr(expression))
    function = function_of(expression)

    torch._dynamo.reset()  # a new function of one code object: no cached graph, no recompile limit
    compiled = torch.compile(function, backend="hostir", dynamic=dynamic, options={"fallback": False})
    for sequence in (SHAPE[1], 10) if dynamic else (SHAPE[1],):
        inputs = _inputs(seed, sequence)
        (expected, expected_grads), (got, grads) = _trained(function, inputs), _trained(compiled, inputs)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        for name, grad in grads.items():
            if expected_grads[name] is None:
                assert grad is None or not grad.any(), name
            else:
                message = lambda m, n=name: f"{n}: {m}"  # noqa: E731
                torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-4, msg=message)


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).abs().max() / (expected.double().abs().max() + 1e-6)).item()


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the yardstick is inductor on a GPU (on the CPU it compiles C++ for minutes)"
)
@settings(
    max_examples=max(4, settings().max_examples // 10),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(expression=expressions(), seed=st.integers(0, 2**16))
def test_a_compiled_function_in_bf16_is_as_close_to_eager_as_inductor(expression, seed):
    """In bf16, hostir's forward and gradients are as close to eager's as inductor's are, on
    the same function and inputs (or within one bf16 rounding, 2^-8, of them): both compute
    between the casts in f32, where eager rounds every op's result."""
    note(repr(expression))
    function = function_of(expression)
    inputs = {name: value.bfloat16() for name, value in _inputs(seed).items()}
    compilers = {"inductor": {"backend": "inductor"}, "hostir": {"backend": "hostir", "options": {"fallback": False}}}
    torch._dynamo.reset()
    results = {}
    for name, run in (("eager", function), *((name, torch.compile(function, **o)) for name, o in compilers.items())):
        out, grads = _trained(run, inputs)
        results[name] = [out] + [torch.zeros_like(inputs[key]) if grad is None else grad for key, grad in grads.items()]
    for what, eager, inductor, hostir in zip(["output", *"xywv"], results["eager"], results["inductor"], results["hostir"]):
        hostir_error, inductor_error = _relative_error(hostir, eager), _relative_error(inductor, eager)
        assert hostir_error <= 2 * inductor_error + 2**-8, f"{what}: hostir {hostir_error:.2e}, inductor {inductor_error:.2e}"


def test_a_size_that_the_forward_saves_is_this_compilations_where_fake_propagation_keeps_the_traces(monkeypatch):
    """`dynamic=True`, a second sequence length: the backward views its gradient on rows by
    a size that the forward computes and saves (2 x the sequence), which must be the second
    compilation's, also where torch's FakeTensorProp leaves an int result the trace's symbol
    (torch 2.11's, emulated here), whose value is the first trace's."""
    original = FakeTensorProp.run_node

    def keeping_the_traces_symbol(self, n):
        traced = n.meta.get("val")
        result = original(self, n)
        if isinstance(result, int) and isinstance(traced, torch.SymInt):
            n.meta["val"] = traced
        return result

    monkeypatch.setattr(FakeTensorProp, "run_node", keeping_the_traces_symbol)
    function = function_of(("on rows", "x"))
    torch._dynamo.reset()
    compiled = torch.compile(function, backend="hostir", dynamic=True, options={"fallback": False})
    for sequence in (SHAPE[1], 10):
        inputs = _inputs(0, sequence)
        (expected, expected_grads), (got, grads) = _trained(function, inputs), _trained(compiled, inputs)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(grads["x"], expected_grads["x"])
