"""An ATen call as `fusion.aten` and `hir.aten` write it: `"aten.gelu.default"(%x, approximate = "tanh")`.

The op keeps the call in its `call` property, the Python literal `[args, kwargs]` of
`hostir_dialect.aten_call` (`{'operand': i}` for operand `i`); the custom syntax writes it as
the call reads, as torch.fx prints a node:

| `call` holds | written |
|---|---|
| `{'operand': i}` | the operand's SSA name, `%x` |
| `{'operand': i, 'view': 'uint64'}` | `%x as torch.uint64` |
| `{'dtype': 'bfloat16'}`, `{'layout': 'strided'}`, `{'memory_format': 'contiguous_format'}` | `torch.bfloat16`, `torch.strided`, `torch.contiguous_format` |
| `{'device': None}` | `device` |
| `{'float': 'inf'}` | `inf`, `-inf`, `nan` |
| None, True, False, 3, -0.5, 'tanh', [1, 2] | `None`, `True`, `False`, `3`, `-0.5`, `"tanh"`, `[1, 2]` |
| a keyword argument | `name = value` |

The operands are those the call names, in the order it first names them (operand `i` is
the `i`-th name). No torch is needed to read or write it: hir-opt never imports torch.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from xdsl.ir import SSAValue
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer

NAMES: dict[str, Any] = {
    "None": None,
    "True": True,
    "False": False,
    "device": {"device": None},
    "inf": {"float": "inf"},
    "nan": {"float": "nan"},
}
"""The bare names of a call and what the `call` literal holds for each."""


def _torch_name(name: str) -> dict[str, str]:
    """`torch.<name>` as the `call` literal holds it: a layout, a memory format or a dtype,
    told apart by torch's names for them."""
    if name == "strided" or name.startswith(("sparse_", "_mkldnn", "jagged")):
        return {"layout": name}
    if name.endswith("_format") or name.startswith("channels_last"):
        return {"memory_format": name}
    return {"dtype": name}


def _float_text(value: float) -> str:
    """A finite float as the MLIR lexer reads it: with a point before any exponent (`1.0e-05`)."""
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    return text if "." in mantissa else f"{mantissa}.0{e}{exponent}"


def decode_call(call: str) -> tuple[list[Any], dict[str, Any]]:
    """The `[args, kwargs]` of a `call` text, as `hostir_dialect.aten_call.encode_call` wrote
    them (the encodings of operands, dtypes and the like left as they are); ValueError or
    SyntaxError where the text is no literal."""
    args, kwargs = ast.literal_eval(call)
    return args, kwargs


def print_call(printer: Printer, call: str, operands: Sequence[SSAValue]) -> None:
    """Prints `(args, name = value)` of the `call` literal, operand `i` as `operands[i]`'s name."""
    args, kwargs = decode_call(call)

    def value(item: Any) -> None:
        if isinstance(item, dict) and "operand" in item:
            printer.print_operand(operands[item["operand"]])
            if "view" in item:
                printer.print_string(f" as torch.{item['view']}")
        elif isinstance(item, dict):
            ((kind, name),) = item.items()
            printer.print_string({"device": "device", "float": str(name)}.get(kind, f"torch.{name}"))
        elif isinstance(item, list):
            printer.print_string("[")
            printer.print_list(item, value)
            printer.print_string("]")
        elif isinstance(item, str):
            printer.print_string_literal(item)
        elif isinstance(item, float):
            printer.print_string(_float_text(item))
        else:  # None, a bool, an int
            printer.print_string(repr(item))

    def keyword(entry: tuple[str, Any]) -> None:
        printer.print_string(f"{entry[0]} = ")
        value(entry[1])

    printer.print_string("(")
    printer.print_list(args, value)
    if args and kwargs:
        printer.print_string(", ")
    printer.print_list(kwargs.items(), keyword)
    printer.print_string(")")


def call_operands(call: str) -> list[int]:
    """The operands the `call` literal names, in the order it first names them."""
    named: list[int] = []

    def visit(item: Any) -> None:
        if isinstance(item, dict) and "operand" in item and item["operand"] not in named:
            named.append(item["operand"])
        elif isinstance(item, (list, tuple)):
            for inner in item:
                visit(inner)
        elif isinstance(item, dict):
            for inner in item.values():
                visit(inner)

    visit(decode_call(call))
    return named


def parse_optional_call(parser: Parser) -> tuple[str, list[UnresolvedOperand]] | None:
    """Reads what `print_call` prints, if the text goes on with `(`: the `call` literal, and
    the operands it names in the order it first names them."""
    operands: list[UnresolvedOperand] = []
    indices: dict[str, int] = {}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}

    def operand(unresolved: UnresolvedOperand) -> dict[str, Any]:
        name = unresolved.span.text
        if name not in indices:
            indices[name] = len(operands)
            operands.append(unresolved)
        item: dict[str, Any] = {"operand": indices[name]}
        if parser.parse_optional_keyword("as") is not None:
            start = parser.pos
            view = parser.parse_identifier(" after 'as': the dtype the operand's bits are read in")
            if not view.startswith("torch."):
                parser.raise_error(f"expected a dtype such as torch.uint64, got '{view}'", start, parser.pos)
            item["view"] = view.removeprefix("torch.")
        return item

    def named(name: str, start: int) -> Any:
        if name in NAMES:
            return NAMES[name]
        if name.startswith("torch."):
            return _torch_name(name.removeprefix("torch."))
        parser.raise_error(
            f"'{name}' is no value of an ATen call: give a %value, a number, a string, a list, "
            "None, True, False, device, inf, nan or torch.<dtype, layout or memory format>",
            start,
            parser.pos,
        )

    def value() -> Any:
        if (unresolved := parser.parse_optional_unresolved_operand()) is not None:
            return operand(unresolved)
        items = parser.parse_optional_comma_separated_list(parser.Delimiter.SQUARE, value)
        if items is not None:
            return items
        if (text := parser.parse_optional_str_literal()) is not None:
            return text
        start = parser.pos
        negative = parser.parse_optional_punctuation("-") is not None
        if (number := parser.parse_optional_number()) is not None:
            return -number if negative else number
        name = parser.parse_optional_identifier()
        if name is None:
            parser.raise_error("expected a value of an ATen call")
        if negative:
            if name != "inf":
                parser.raise_error(f"expected a number or inf after '-', got '{name}'", start, parser.pos)
            return {"float": "-inf"}
        return named(name, start)

    def argument() -> None:
        start = parser.pos
        name = parser.parse_optional_identifier()
        if name is not None and parser.parse_optional_punctuation("=") is not None:
            if name in kwargs:
                parser.raise_error(f"the keyword argument '{name}' is given twice", start, parser.pos)
            kwargs[name] = value()
            return
        if kwargs:
            parser.raise_error("a positional argument after a keyword argument", start)
        args.append(value() if name is None else named(name, start))

    if parser.parse_optional_comma_separated_list(parser.Delimiter.PAREN, argument, " in an ATen call") is None:
        return None
    return repr([args, kwargs]), operands
