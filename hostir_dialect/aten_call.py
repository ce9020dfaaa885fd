"""The arguments of an ATen call, as `fusion.aten` and `hir.aten` keep them in their `call` property.

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
call drops it from the operands and adds it back to the results. The importer encodes
(`encode_call`); the runtime decodes and calls (`hostir.runtime.interpreter.aten_calls`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hostir_dialect.text import HostirError

NAMED_KINDS: dict[str, tuple[type, Callable[[str], Any]]] = {
    "dtype": (torch.dtype, lambda name: getattr(torch, name)),
    "layout": (torch.layout, lambda name: getattr(torch, name)),
    "memory_format": (torch.memory_format, lambda name: getattr(torch, name)),
}
"""The torch objects encoded by name: each kind's type, and the object of a name."""


class NotEncodable(HostirError):
    """An argument that no literal of the `call` property can hold."""


CARRIERS: dict[torch.dtype, torch.dtype] = {
    torch.uint64: torch.int64,
    torch.uint32: torch.int32,
    torch.uint8: torch.int8,
}
"""Dtypes the fusion dialect has no element type for, and the signed type of the same size
whose buffers carry their bits (flash attention's random state is a uint64 tensor)."""


def carried(shape: Sequence[int], dtype: torch.dtype) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of the buffer that holds a tensor of `shape` and `dtype` in the IR:
    a complex tensor's real and imaginary parts (`torch.view_as_real`: an axis of 2 last, the
    real dtype of its size), an unsigned tensor's bits in the type `CARRIERS` names, any
    other tensor as it is."""
    if dtype.is_complex:
        return (*shape, 2), dtype.to_real()
    return tuple(shape), CARRIERS.get(dtype, dtype)


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
        for kind, (type_, _) in NAMED_KINDS.items():
            if isinstance(value, type_):
                return {kind: str(value).removeprefix("torch.")}
        raise NotEncodable(f"an argument of type {type(value).__name__} ({value!r}) has no encoding")

    return repr([[encode(a) for a in args], {key: encode(v) for key, v in kwargs.items()}])
