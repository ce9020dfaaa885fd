"""The arguments of an ATen call, as `fusion.aten` and `hir.aten` keep them, and the call itself.

The `call` property is the Python literal `[args, kwargs]` of the call, so that it reads
as the FX graph did and `ast.literal_eval` reads it back without running code. What a
literal cannot hold is a one-key dict:

| argument | encoded as |
|---|---|
| operand `i` (a tensor) | `{'operand': i}` |
| operand `i` of a dtype the IR carries in another (`uint64`) | `{'operand': i, 'view': 'uint64'}` |
| a dtype | `{'dtype': 'bfloat16'}` |
| a device | `{'device': None}`: the device of the run, wherever the graph was traced |
| a layout, a memory format | `{'layout': 'strided'}`, `{'memory_format': 'contiguous_format'}` |
| inf, -inf, nan | `{'float': 'inf'}` |

A varying operand's buffer has the device axis first (extent 1 on its device): the
call drops it from the operands and adds it back to the results.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from xdsl.dialects.builtin import DenseArrayBase

from hostir_dialect.text import HostirError

_NAMED_KINDS: dict[str, tuple[type, Callable[[str], Any]]] = {
    "dtype": (torch.dtype, lambda name: getattr(torch, name)),
    "layout": (torch.layout, lambda name: getattr(torch, name)),
    "memory_format": (torch.memory_format, lambda name: getattr(torch, name)),
}


class NotEncodable(HostirError):
    """An argument that no literal of the `call` property can hold."""


CARRIERS: dict[torch.dtype, torch.dtype] = {
    torch.uint64: torch.int64,
    torch.uint32: torch.int32,
    torch.uint8: torch.int8,
}
"""Dtypes the fusion dialect has no element type for, and the signed type of the same size
whose buffers carry their bits (flash attention's random state is a uint64 tensor)."""


def encode_call(
    args: Sequence[Any],
    kwargs: dict[str, Any],
    operand: Callable[[Any], int | None],
    carried_dtype: Callable[[int], torch.dtype | None] = lambda index: None,
) -> str:
    """The `call` text of `args` and `kwargs`; `operand(value)` is the operand index of a
    tensor argument, and `carried_dtype(index)` the dtype of an operand whose buffer
    carries it in another (`CARRIERS`), else None."""

    def encode(value: Any) -> Any:
        index = operand(value)
        if index is not None and (view := carried_dtype(index)) is not None:
            return {"operand": index, "view": str(view).removeprefix("torch.")}
        if index is not None:
            return {"operand": index}
        match value:
            case None | bool() | int() | str():
                return value
            case float() if math.isfinite(value):
                return value
            case float():
                return {"float": repr(value)}
            case torch.device():
                return {"device": None}
            case list() | tuple():
                return [encode(item) for item in value]
        for kind, (type_, _) in _NAMED_KINDS.items():
            if isinstance(value, type_):
                return {kind: str(value).removeprefix("torch.")}
        raise NotEncodable(f"an argument of type {type(value).__name__} ({value!r}) has no encoding")

    return repr([[encode(a) for a in args], {key: encode(v) for key, v in kwargs.items()}])


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
            if kind in _NAMED_KINDS:
                constant = _NAMED_KINDS[kind][1](payload)
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
