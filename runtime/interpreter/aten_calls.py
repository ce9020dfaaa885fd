"""Decoding the `call` property of `hir.aten` (and `fusion.aten`) into the ATen call itself.

`hostir_dialect.aten_call` says how the arguments are encoded; here they are decoded
once per op and called on the operand tensors of each run.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.dialects.builtin import DenseArrayBase

from hostir_dialect.aten_call import CARRIERS, NAMED_KINDS
from hostir_dialect.aten_syntax import decode_call
from hostir_dialect.text import HostirError


def aten_overload(target: str) -> torch._ops.OpOverload:
    """`torch.ops.aten.gelu.default` for `"aten.gelu.default"`."""
    namespace, _, rest = target.partition(".")
    packet_name, _, overload = rest.rpartition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet_name), overload)
    except (AttributeError, RuntimeError):
        raise HostirError(f"'{target}' names no ATen operator overload of this torch") from None


aten = torch.ops.aten

RUN_BYTES = 1 << 20
"""The shortest contiguous run that `contiguous_in_runs` copies on its own."""
MAX_RUNS = 64
"""The most runs it copies one by one: each is an op the host issues."""


def long_runs(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The outer axes of `tensor` over whose indices its innermost axes lie in memory as in a
    contiguous copy, in a few runs of at least `RUN_BYTES` each (a permute of whole blocks);
    None where they are many or short, or where the tensor is one run (contiguous)."""
    shape, strides = tensor.shape, tensor.stride()
    run, axis = 1, tensor.dim()
    while axis > 0 and (shape[axis - 1] == 1 or strides[axis - 1] == run):
        run *= shape[axis - 1]
        axis -= 1
    outer = tuple(shape[:axis])
    if axis == 0 or run * tensor.element_size() < RUN_BYTES or math.prod(outer) > MAX_RUNS:
        return None
    return outer


def contiguous_in_runs(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `tensor`, made one contiguous run at a time where it has a few long
    ones (`long_runs`): the gradient of an activation put in the ranks' order for its weight's
    GEMM, say. Each run is then one contiguous copy, where ATen copies a permuted tensor with
    its strided kernel: on an H200, 0.169 ms for 128 MB, against 0.075 ms as runs
    (docs/benchmarks.md). Else ATen's copy."""
    outer = long_runs(tensor)
    return tensor.contiguous() if outer is None else _copy_in_runs(tensor, outer)


def _copy_in_runs(tensor: torch.Tensor, outer: tuple[int, ...]) -> torch.Tensor:
    """A contiguous copy of `tensor`, one copy per index of its `outer` axes (`long_runs`)."""
    copy = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    for index in itertools.product(*map(range, outer)):
        copy[index].copy_(tensor[index])
    return copy


def reshape(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`aten.reshape`: ATen's (a view where the strides allow one, else a copy), except that a
    tensor with a few long runs (`long_runs`) that no view reshapes is copied run by run."""
    outer = None if tensor.is_contiguous() else long_runs(tensor)
    if outer is None:
        return aten.reshape.default(tensor, shape)
    try:
        return tensor.view(shape)
    except RuntimeError:  # no view of these strides has that shape; the copy is megabytes
        return _copy_in_runs(tensor, outer).view(shape)


IMPLEMENTATIONS: dict[str, Callable[..., Any]] = {"aten.reshape.default": reshape}
"""ATen overloads called through an implementation of hostir's own, with the same results."""


AtenCall = Callable[[Sequence[torch.Tensor], torch.device], Any]
"""`call(operands, device)`: the overload's result on these operand tensors."""


@functools.cache
def prepare_call(target: str, call: str) -> AtenCall:
    """Resolves the overload and decodes the arguments once (per text: the reference
    evaluator asks at every evaluation); the result makes the call."""
    overload = IMPLEMENTATIONS.get(target) or aten_overload(target)
    try:
        args, kwargs = decode_call(call)
    except (ValueError, SyntaxError) as error:
        raise HostirError(f"the arguments of {target} are not a literal [args, kwargs]: {error}") from None

    def decoder(value: Any) -> Callable[[Sequence[torch.Tensor], torch.device], Any]:
        if isinstance(value, dict) and set(value) == {"operand", "view"}:
            index, view = value["operand"], getattr(torch, value["view"])
            return lambda operands, device: operands[index].view(view)
        if isinstance(value, dict) and len(value) == 1:
            ((kind, payload),) = value.items()
            if kind == "operand":
                return lambda operands, device: operands[payload]
            if kind == "device":
                return lambda operands, device: device
            if kind == "float":
                number = float(payload)
                return lambda operands, device: number
            if kind in NAMED_KINDS:
                constant = NAMED_KINDS[kind][1](payload)
                return lambda operands, device: constant
        if isinstance(value, list):
            items = [decoder(item) for item in value]
            return lambda operands, device: [item(operands, device) for item in items]
        return lambda operands, device: value

    decoded_args = [decoder(a) for a in args]
    decoded_kwargs = {key: decoder(v) for key, v in kwargs.items()}

    def run(operands: Sequence[torch.Tensor], device: torch.device) -> Any:
        return overload(
            *(a(operands, device) for a in decoded_args),
            **{key: v(operands, device) for key, v in decoded_kwargs.items()},
        )

    return run


def carried(result: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`result` as the buffer `out` holds it: its bits, where `out` carries its dtype."""
    return result.view(out.dtype) if CARRIERS.get(result.dtype) == out.dtype else result


def picker(target: str, returns: DenseArrayBase | None, count: int) -> Callable[[Any], list[torch.Tensor | None]]:
    """How to take the results of an ATen call for its op's `count` results (made once per
    op): the items of the tuple at `returns`, or the whole result (one tensor, or every
    item of the tuple).

    An item may be None where the graph's trace had a tensor: a kernel that leaves a
    result undefined (a log-sum-exp an inference call does not need), which no op reads.
    """
    positions = None if returns is None else tuple(returns.get_values())

    def pick(result: Any) -> list[torch.Tensor | None]:
        items = list(result) if isinstance(result, (tuple, list)) else [result]
        if positions is not None:
            if max(positions) >= len(items):
                raise HostirError(f"{target} returned {len(items)} results, but 'returns' names position {max(positions)}")
            items = [items[p] for p in positions]
        if len(items) != count:
            raise HostirError(f"{target} returned {len(items)} results for {count}; name them with 'returns'")
        for item in items:
            if item is not None and not isinstance(item, torch.Tensor):
                raise HostirError(f"{target} returned a {type(item).__name__} where a tensor was expected")
        return items

    return pick
