"""The meaning of fusion ops in plain torch, for segments and for unsharded references.

`evaluate` runs a `func.func` of fusion ops (value semantics) on whatever tensors it
is given: the local slices a host program passes to a segment, or the whole unsharded
tensors a reference check passes to the fusion itself. Both uses must agree bit for
bit on what a segment computes, so both go through the same `compile_function`.

Precision follows nvFuser's kernels, which the CUDA path of `hir.launch_kernel`
reproduces: a pointwise op on bf16/f16 values computes in f32, and the f32 value flows
on to the next pointwise op without rounding; a value is rounded to its declared type
once, where it is stored: at the function's outputs, and where a non-pointwise op
(set, reduction, matmul, linear) reads it, since those ops read buffers. A
`fusion.cast` to bf16/f16 rounds, as a cast in a kernel does; a cast to f32 of a bf16
intermediate keeps the unrounded f32 value.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from hostir_dialect import fusion
from hostir_dialect.builder import constant_value, torch_dtype
from hostir_dialect.text import HostirError
from hostir.runtime.interpreter import aten_calls
from hostir.runtime.interpreter.attention import evaluate_attention, evaluate_attention_backward

LOW_PRECISION = (torch.bfloat16, torch.float16)
"""Element types that pointwise math computes in f32."""


def _ignoring_op(torch_function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A TORCH_OPS entry for an op whose semantics need no attribute of the op."""
    return lambda op, *inputs: torch_function(*inputs)


def _cast(op: fusion.CastOp, input: torch.Tensor) -> torch.Tensor:
    return input.to(torch_dtype(fusion.tensor_type(op.result).element_type))


def _broadcast(op: fusion.BroadcastOp, input: torch.Tensor) -> torch.Tensor:
    rank = input.dim() + len(op.new_axes.get_values())
    for axis in sorted(fusion.normalize_axes(op.new_axes.get_values(), rank, "broadcast")):
        input = input.unsqueeze(axis)
    return input


def _expand(op: fusion.ExpandOp, input: torch.Tensor) -> torch.Tensor:
    """The axes the op's types expand (1 to a static extent, never a `didx` one), whether
    `input` is a device's piece or the whole tensor."""
    sizes = zip(fusion.tensor_type(op.input).get_shape(), fusion.tensor_type(op.result).get_shape())
    return input.expand([expanded if size == 1 else -1 for size, expanded in sizes])


def _reduction(torch_function: Callable[..., torch.Tensor]):
    def reduce(op: fusion.ReductionOp, input: torch.Tensor) -> torch.Tensor:
        return torch_function(input, dim=op.reduced_axes, keepdim=op.keeps_dims)

    return reduce


def _aten(op: fusion.AtenOp, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """The ATen op on whole tensors: once per device along the device axis of varying ones.
    A result that ATen leaves undefined is zeros."""
    call = aten_calls.prepare_call(op.target.data, op.call.data)
    pick = aten_calls.picker(op.target.data, op.returns, len(op.outputs))
    varying = [fusion.tensor_type(v).didx_axis == 0 for v in op.inputs]
    device = inputs[0].device if inputs else torch.device("cpu")

    def results(operands: list[torch.Tensor]) -> list[torch.Tensor]:
        return [_defined(result, out, device) for result, out in zip(pick(call(operands, device)), op.outputs)]

    if not any(fusion.tensor_type(r).didx_axis == 0 for r in op.outputs):
        return results(list(inputs))
    devices = fusion.tensor_type(op.outputs[0]).mesh.size
    per_device = [results([x[d] if varies else x for x, varies in zip(inputs, varying)]) for d in range(devices)]
    return [torch.stack(pieces) for pieces in zip(*per_device)]


def _defined(result: torch.Tensor | None, out: SSAValue, device: torch.device) -> torch.Tensor:
    """`result`, or zeros of one device's piece of `out` where ATen left it undefined."""
    if result is not None:
        return result
    out_type = fusion.tensor_type(out)
    return torch.zeros(out_type.piece_shape, dtype=torch_dtype(out_type.element_type), device=device)


def matmul(lhs: torch.Tensor, rhs: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`fusion.matmul`: torch.matmul, and with a bias `matmul_with_bias_into`'s sum."""
    if bias is None:
        return torch.matmul(lhs, rhs)
    shape = torch.matmul(lhs.to("meta"), rhs.to("meta")).shape
    out = torch.empty(shape, dtype=lhs.dtype, device=lhs.device)
    matmul_with_bias_into(lhs, rhs, bias, out)
    return out


def matmul_with_bias_into(lhs: torch.Tensor, rhs: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
    """`bias + torch.matmul(lhs, rhs)` written into `out`, summed as ATen's addmm sums it: the
    bias joins the product in the GEMM's accumulator (f32 for bf16 and f16), and the sum is
    rounded once. Rounding the product first and adding the bias after would round twice,
    and a bf16 model's gradients would drift from eager's by far more than bf16's rounding
    (docs/design.md).

    Where the product is one matrix (every batch axis of extent 1) into a contiguous `out`,
    and the bias a row or a matrix, this is `torch.addmm` itself, the call eager's
    `nn.Linear` makes, bias in the GEMM's epilogue; anywhere else, the product is computed
    and summed with the bias in f32 (bf16 and f16 upcast), and rounded into `out`.
    """
    operands = (lhs, rhs, out)
    if (
        out.is_contiguous()
        and all(t.dim() >= 2 and math.prod(t.shape[:-2]) == 1 for t in operands)
        and math.prod(bias.shape[:-2]) == 1
    ):
        lhs, rhs, out = (t.view(t.shape[-2:]) for t in operands)
        bias = bias.reshape(bias.shape[-2:])
        # A bias row as a vector: eager's bias, which cuBLAS adds in the GEMM's epilogue.
        torch.addmm(bias[0] if bias.dim() == 2 and bias.shape[0] == 1 else bias, lhs, rhs, out=out)
        return
    out.copy_(torch.matmul(upcast(lhs), upcast(rhs)).add_(upcast(bias)))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """`fusion.rotate_half`: the halves of the last axis swapped, the new first one negated."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


POINTWISE_FUNCTIONS: dict[type[Operation], Callable[..., torch.Tensor]] = {
    fusion.NegOp: torch.neg,
    fusion.AbsOp: torch.abs,
    fusion.ExpOp: torch.exp,
    fusion.LogOp: torch.log,
    fusion.SqrtOp: torch.sqrt,
    fusion.RsqrtOp: torch.rsqrt,
    fusion.ReluOp: torch.relu,
    fusion.TanhOp: torch.tanh,
    fusion.SigmoidOp: torch.sigmoid,
    fusion.ErfOp: torch.erf,
    fusion.AddOp: torch.add,
    fusion.SubOp: torch.sub,
    fusion.MulOp: torch.mul,
    fusion.DivOp: torch.div,
    fusion.MaximumOp: torch.maximum,
    fusion.MinimumOp: torch.minimum,
    fusion.PowOp: torch.pow,
}
"""The unary and binary pointwise ops: plain torch functions of their operands."""

TORCH_OPS: dict[type[Operation], Callable[..., torch.Tensor]] = {
    **{op: _ignoring_op(function) for op, function in POINTWISE_FUNCTIONS.items()},
    fusion.SetOp: lambda op, input: input,
    fusion.CastOp: _cast,
    fusion.BroadcastOp: _broadcast,
    fusion.ExpandOp: _expand,
    fusion.RotateHalfOp: _ignoring_op(rotate_half),
    fusion.SumOp: _reduction(torch.sum),
    fusion.MaxOp: _reduction(torch.amax),
    fusion.MatmulOp: _ignoring_op(matmul),
    fusion.LinearOp: _ignoring_op(torch.nn.functional.linear),
    fusion.AtenOp: _aten,
    fusion.AttentionOp: evaluate_attention,
    fusion.AttentionBackwardOp: evaluate_attention_backward,
}
"""Fusion op class -> `function(op, *input tensors)` giving the op's result.

`fusion.constant` is not here: it has no inputs, and its tensor is made on the device
of the run (`compile_function`)."""


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in LOW_PRECISION else dtype


def _stored(value: SSAValue) -> torch.dtype:
    return torch_dtype(fusion.tensor_type(value).element_type)


Conversion = Callable[[torch.Tensor], torch.Tensor]
"""What a value becomes where an op reads it or makes it: the dtype the op computes in or stores."""


def _to(dtype: torch.dtype) -> Conversion:
    return lambda value: value.to(dtype)


def _as_it_flows(value: torch.Tensor) -> torch.Tensor:
    return value


CompiledFunction = Callable[[Sequence[torch.Tensor], torch.device], list[torch.Tensor]]
"""`run(inputs, device)`: the function's outputs; `device` is where its constants are made."""


def compile_function(function: func.FuncOp) -> CompiledFunction:
    """Resolves every op of `function` once; the result maps input tensors to outputs.

    Constants are made on the device the caller names, which is the device of the run:
    a CPU constant would take part in ops on CUDA tensors only while it is 0-d, and a
    broadcast makes it 1-d. Raises `HostirError` for an op that has no torch semantics.
    """
    slots: dict[SSAValue, int] = {arg: i for i, arg in enumerate(function.args)}
    constants: list[tuple[int, bool | int | float, torch.dtype]] = []
    # (result slots, semantics, (operand slot, conversion) per operand, conversion per result)
    steps: list[tuple[list[int], Callable[..., torch.Tensor], list[tuple[int, Conversion]], list[Conversion]]] = []
    outputs: list[tuple[int, torch.dtype]] = []
    for op in function.body.block.ops:
        if isinstance(op, func.ReturnOp):
            outputs = [(slots[v], _stored(v)) for v in op.arguments]
            continue
        result = op.results[0]
        if isinstance(op, fusion.ConstantOp):
            slots[result] = len(slots)
            constants.append((slots[result], constant_value(op), _compute_dtype(_stored(result))))
            continue
        semantics = TORCH_OPS.get(type(op))
        if semantics is None:
            raise HostirError.at(op, f"'{op.name}' has no torch semantics in a fusion")
        declared = [_to(_stored(r)) for r in op.results]
        if isinstance(op, (fusion.BroadcastOp, fusion.ExpandOp)):
            # A broadcast computes nothing: the value flows through it as it is, a view,
            # which the next pointwise op upcasts or a store rounds.
            operands, declared = [(slots[op.input], _as_it_flows)], [_as_it_flows]
        elif isinstance(op, fusion.POINTWISE_OPS):
            operands = [(slots[v], upcast) for v in op.operands]
            if not isinstance(op, fusion.CastOp):
                declared = [_to(_compute_dtype(_stored(r))) for r in op.results]
        else:
            operands = [(slots[v], _to(_stored(v))) for v in op.operands]
        result_slots = []
        for r in op.results:
            slots[r] = len(slots)
            result_slots.append(slots[r])
        steps.append((result_slots, functools.partial(semantics, op), operands, declared))

    def run(inputs: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        if len(inputs) != len(function.args):
            raise HostirError.at(
                function, f"@{function.sym_name.data} takes {len(function.args)} input(s), got {len(inputs)}"
            )
        values: list[torch.Tensor | None] = [*inputs, *[None] * (len(slots) - len(inputs))]
        for slot, value, dtype in constants:
            values[slot] = torch.full((), value, dtype=dtype, device=device)
        for result_slots, semantics, operands, result_conversions in steps:
            results = semantics(*[convert(values[operand]) for operand, convert in operands])
            if isinstance(results, torch.Tensor):
                results = [results]
            for slot, result, convert in zip(result_slots, results, result_conversions, strict=True):
                values[slot] = convert(result)
        return [values[slot].to(dtype) for slot, dtype in outputs]

    return run


def upcast(value: torch.Tensor) -> torch.Tensor:
    """The value a pointwise op computes on: f32 for a bf16/f16 tensor."""
    return value.float() if value.dtype in LOW_PRECISION else value


def evaluate(
    function: func.FuncOp, inputs: Sequence[torch.Tensor], device: torch.device | None = None
) -> list[torch.Tensor]:
    """Evaluates a function of fusion ops with plain torch on `inputs` (value semantics).

    Constants are made on `device`; None means the device of the first input (the CPU
    when there is none).
    """
    if device is None:
        device = inputs[0].device if inputs else torch.device("cpu")
    return compile_function(function)(inputs, device)
