"""Decoding the `call` property of `hir.aten` (and `fusion.aten`) into the ATen call itself.

`hostir_dialect.aten_call` says how the arguments are encoded; here they are decoded
once per op and called on the operand tensors of each run.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.dialects.builtin import DenseArrayBase

from hostir_dialect.aten_call import CARRIERS, NAMED_KINDS
from hostir_dialect.text import HostirError


def aten_overload(target: str) -> torch._ops.OpOverload:
    """`torch.ops.aten.gelu.default` for `"aten.gelu.default"`."""
    namespace, _, rest = target.partition(".")
    packet_name, _, overload = rest.rpartition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet_name), overload)
    except (AttributeError, RuntimeError):
        raise HostirError(f"'{target}' names no ATen operator overload of this torch") from None


AtenCall = Callable[[Sequence[torch.Tensor], torch.device], Any]
"""`call(operands, device)`: the overload's result on these operand tensors."""


@functools.cache
def prepare_call(target: str, call: str) -> AtenCall:
    """Resolves the overload and decodes the arguments once (per text: the reference
    evaluator asks at every evaluation); the result makes the call."""
    overload = aten_overload(target)
    try:
        args, kwargs = ast.literal_eval(call)
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
