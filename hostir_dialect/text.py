"""Reading and writing hostir IR text, and errors that point at the line that caused them.

Every error a user can cause (a parse error, a verifier error, a pass diagnostic, a
runtime input that contradicts its type) is a `HostirError`, printed the way
mlir-opt prints one:

    fusion.mlir:3:8: error: result shape [4] does not match the shape [8] that the operands give
      %1 = fusion.neg %0 : !fusion.tensor<[8], f32> -> !fusion.tensor<[4], f32>
           ^

xDSL's parser attaches no location to an operation written without `loc(...)`, so
`parse_module` uses a parser that records where each operation starts; ops built in
Python have no location and are reported by name.
"""

from __future__ import annotations

import io
import linecache
import math
import re
import struct
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, FloatAttr, IntAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute, Block, BlockArgument, Operation, OpResult, ParametrizedAttribute, Region
from xdsl.irdl.dominance import DominanceInfo
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.mlir_lexer import MLIRTokenKind

from hostir_dialect import hostir_context
from hostir_dialect.fusion import DYNAMIC, ParallelType, TensorType, element_type_name


@dataclass
class SourceLocation:
    file: str
    line: int
    column: int
    text: str = ""
    """The whole source line, shown under the message."""
    length: int = 1
    """How many characters of the line the caret marks."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    @classmethod
    def at_offset(
        cls, text: str, file: str, offset: int, length: int = 1, line_offset: int = 0
    ) -> SourceLocation:
        """The place of character `offset` of `text`, whose first line is `line_offset + 1`."""
        line_start = text.rfind("\n", 0, offset) + 1
        line_end = text.find("\n", offset)
        return cls(
            file,
            text.count("\n", 0, offset) + 1 + line_offset,
            offset - line_start + 1,
            text[line_start : len(text) if line_end < 0 else line_end],
            length,
        )


class HostirError(Exception):
    """An error in the user's program, with the place in the text it comes from if known."""

    def __init__(self, message: str, location: SourceLocation | None = None, op_name: str = ""):
        super().__init__(message)
        self.message = message
        self.location = location
        self.op_name = op_name

    @classmethod
    def at(cls, op: Operation, message: str) -> HostirError:
        """An error about `op`, located where the op was parsed from if it was."""
        return cls(message, operation_location(op), op.name)

    def __str__(self) -> str:
        if self.location is None:
            where = f"'{self.op_name}' op: " if self.op_name else ""
            return f"error: {where}{self.message}"
        loc = self.location
        text = f"{loc}: error: {self.message}"
        if loc.text:
            caret = " " * (loc.column - 1) + "^" * max(1, min(loc.length, len(loc.text) - loc.column + 1))
            text += f"\n{loc.text}\n{caret}"
        return text


# The source text of every parsed file, so that a location found later (by a verifier
# or a pass) can show its line.
_SOURCES: dict[str, list[str]] = {}


def operation_location(op: Operation) -> SourceLocation | None:
    loc = op.location
    if not isinstance(loc, FileLineColLoc):
        return None
    return source_location(loc)


def remark(op: Operation, message: str) -> None:
    """`file:line:col: remark: message` on stderr, at `op`'s place (a pass's `explain`), as
    MLIR's remarks print."""
    location = operation_location(op)
    where = f"{location}: " if location is not None else ""
    print(f"{where}remark: {message}", file=sys.stderr)


def source_location(loc: FileLineColLoc) -> SourceLocation:
    """The place `loc` names, with its line: from IR text parsed here, or else from the file
    itself (the Python line where the builder made an op)."""
    file = loc.filename.data
    line = loc.line.data
    lines = _SOURCES.get(file)
    if lines is None:
        text = linecache.getline(file, line).rstrip("\n")
    else:
        text = lines[line - 1] if 0 < line <= len(lines) else ""
    return SourceLocation(file, line, loc.column.data, text)


class LocatingParser(Parser):
    """xDSL's parser, recording each operation's line and column as its location.

    `line_offset` is the line of the text's first line in its file, for a chunk of a
    file split with `// -----`.
    """

    def __init__(self, text: str, filename: str, line_offset: int = 0, ctx: Context | None = None):
        super().__init__(ctx or hostir_context(), text, filename)
        self.line_offset = line_offset
        self.open_regions: list[int] = []
        """The offset of the `{` of each region being parsed, innermost last."""

    def parse_module(self, allow_implicit_module: bool = True) -> ModuleOp:
        """The module; input without any operation (empty, only comments) is an empty one."""
        try:
            return super().parse_module(allow_implicit_module)
        except ParseError as e:
            # xDSL raises this at the end of the input only when it found no operation.
            at_end = self._current_token.kind == MLIRTokenKind.EOF
            if at_end and e.msg == "Could not parse entire input!":
                return ModuleOp([])
            raise

    def _parse_dialect_type_or_attribute_body(
        self, attr_name: str, is_type: bool, is_opaque: bool, starting_opaque_pos: int | None
    ) -> Attribute:
        """A dialect's type or attribute; one that cannot be built is an error on its text.

        xDSL builds it right after parsing its parameters, outside any span: a verifier's
        VerifyException, or the ValueError of parameters the generic syntax parsed for
        an attribute that takes fewer (`!hir.work<[4, 8], 2>`), would have no location.
        """
        start = self._current_token.span.start
        definition = self.ctx.get_optional_type(attr_name) if is_type else self.ctx.get_optional_attr(attr_name)
        if (
            definition is not None
            and issubclass(definition, ParametrizedAttribute)
            and not definition.get_irdl_definition().parameters
            and definition.parse_parameters.__func__ is ParametrizedAttribute.parse_parameters.__func__
            and self._current_token.kind == MLIRTokenKind.LESS
        ):
            self.raise_error(f"'{'!' if is_type else '#'}{attr_name}' takes no parameters")
        try:
            return super()._parse_dialect_type_or_attribute_body(
                attr_name, is_type, is_opaque, starting_opaque_pos
            )
        except (VerifyException, ValueError) as e:
            self.raise_error(str(e), start, self.pos)

    def parse_optional_builtin_int_or_float_attr(self) -> Attribute | None:
        """A literal that does not fit its type is an error on the literal.

        An integer out of its type's range (`0xfff...f`, `300 : i8`): xDSL's IntegerAttr
        raises it outside any span, so in an alias definition, outside every op, it had no
        location. A float beyond its type's largest finite value (`1.0e39 : f32`): xDSL's
        packing raises OverflowError for f16 and f32 and rounds it to infinity for bf16 and
        f64 (a decimal literal never means infinity, which is written in hexadecimal, as
        its bits, as xDSL prints it); a hexadecimal literal with more bits than its type
        raises OverflowError too.
        """
        start = self._current_token.span.start
        hexadecimal = self._current_token.text[:2] in ("0x", "0X")
        try:
            attr = super().parse_optional_builtin_int_or_float_attr()
        except VerifyException as e:
            self.raise_error(str(e), start, self.pos)
        except OverflowError:
            pass  # packing it as f16 or f32
        else:
            if hexadecimal or not isinstance(attr, FloatAttr) or math.isfinite(attr.value.data):
                return attr
        literal, _, type = self.lexer.input.content[start : self.pos].partition(":")
        self.raise_error(f"float literal {literal.strip()} is out of range for type {type.strip()}", start, self.pos)

    def parse_optional_region(self, arguments: Any = None) -> Region | None:
        opens = self._current_token.kind == MLIRTokenKind.L_BRACE
        if opens:
            self.open_regions.append(self._current_token.span.start)
        try:
            return super().parse_optional_region(arguments)
        finally:
            if opens:
                self.open_regions.pop()

    def _parse_block(self) -> Block:
        """A labelled block; where a region goes on with something else, an error that says what
        was expected (xDSL's message is " in block definition"), and at the end of the input, the
        `}` that is missing, placed after the last character of the text."""
        token = self._current_token
        if token.kind != MLIRTokenKind.CARET_IDENT:
            text = self.lexer.input.content
            if token.kind == MLIRTokenKind.EOF:
                opening = self.open_regions[-1] if self.open_regions else 0
                line = text.count("\n", 0, opening) + 1 + self.line_offset
                end = len(text.rstrip())
                self.raise_error(
                    f"expected '}}' to close the region opened at line {line}, before the end of the input", end, end + 1
                )
            self.raise_error(f"expected an operation, a block label or '}}', got '{token.text}'")
        return super()._parse_block()

    def parse_operation(self) -> Operation:
        start_span = self._current_token.span
        start = start_span.get_location()
        try:
            op = super().parse_operation()
        except (VerifyException, ValueError) as e:
            # A custom or declarative parser that builds an op with an operand or result
            # of the wrong kind, or a property out of its type's range, fails in the op's
            # constructor, not in the parser.
            self.raise_error(str(e), start_span.start, self._current_token.span.start)
        except _PACKING_ERRORS as e:
            self._raise_out_of_range(e, start_span.start)
        if not isinstance(op.location, FileLineColLoc):
            op.location = FileLineColLoc(
                StringAttr(start.file), IntAttr(start.line + self.line_offset), IntAttr(start.col)
            )
        return op

    def _parse_alias_def(self) -> None:
        start = self._current_token.span.start
        try:
            super()._parse_alias_def()
        except _PACKING_ERRORS as e:
            self._raise_out_of_range(e, start)

    def _raise_out_of_range(self, error: Exception, start: int) -> NoReturn:
        """A dense array or tensor that holds a value out of its type's range, from `start` (the
        op or alias definition that holds it) to here: xDSL's dense arrays accept i64 values up
        to 2**64 - 1, then fail to pack them, and a float too large for its type fails to pack."""
        self.raise_error(f"a value is out of its type's range ({error})", start, self._current_token.span.start)


_PACKING_ERRORS = (struct.error, OverflowError)
"""What xDSL's packing of values into bytes raises for a value out of its type's range."""


def _remember_source(filename: str, text: str, line_offset: int) -> None:
    lines = _SOURCES.setdefault(filename, [])
    chunk = text.splitlines()
    if len(lines) < line_offset + len(chunk):
        lines.extend([""] * (line_offset + len(chunk) - len(lines)))
    lines[line_offset : line_offset + len(chunk)] = chunk


MAX_NESTING = 64
"""How many brackets (`{`, `[`, `(`, `<`) the text may nest, read or printed.

xDSL's parser, verifier and printer recurse once per level, so deeper text would
overflow Python's stack; raising the recursion limit instead can crash the
interpreter. The limit holds for what hostir prints too (`print_module`, and hir-opt's
output, refuse deeper text), so that whatever is printed reads back. Real IR nests fewer
than ten.
"""

_LEXEMES = re.compile(
    r"""
      (?P<comment>//[^\n]*)
    | (?P<string>"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*")
    | (?P<bad_string>")
    | [%^@#!][\w$.-]+ | [A-Za-z_][\w$.]*                      # identifiers, digits included
    | 0[xX][0-9A-Fa-f]+ | [0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?   # hexadecimal and float literals
    | (?P<integer>[0-9]+)
    | ->
    | (?P<open>[{\[(<])
    | (?P<close>[}\])>])
    """,
    re.VERBOSE | re.ASCII,
)
"""The lexemes `_check_text` looks at: comments and strings (whose brackets do not count),
string quotes that open no valid string, decimal integers, and brackets (`->` is none).

The string pattern matches one character per step, so a string left open fails in time
linear in its line's length (see `_check_text`)."""

_STRING_BODY = re.compile(r'(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*')


def _check_text(text: str, filename: str, line_offset: int) -> None:
    """Refuses, with a located error, text that xDSL's lexer and parser cannot read safely.

    * A string literal that is not closed on its line, or holds an invalid escape: xDSL's
      lexer matches strings with a regular expression that backtracks exponentially in
      the length of such a string (30 characters take half a minute).
    * A decimal integer longer than Python converts (`sys.get_int_max_str_digits()`).
    * Text nested deeper than `MAX_NESTING` brackets.
    """

    def error(message: str, offset: int, length: int = 1) -> HostirError:
        return HostirError(message, SourceLocation.at_offset(text, filename, offset, length, line_offset))

    max_digits = sys.get_int_max_str_digits()
    for match in _LEXEMES.finditer(text):
        kind = match.lastgroup
        if kind == "integer" and max_digits and len(match.group()) > max_digits:
            raise error(
                f"integer literal of {len(match.group())} digits is too long (at most {max_digits})",
                match.start(),
                len(match.group()),
            )
        if kind == "bad_string":
            end = _STRING_BODY.match(text, match.end()).end()
            if text.startswith("\\", end):
                raise error("invalid escape sequence in string literal", end, 2)
            if end < len(text) and text[end] in "\v\f":
                raise error("string literal holds a vertical tab or form feed", end)
            raise error("string literal is not closed on its line", match.start(), end - match.start())
    if (offset := _too_deep_offset(text)) is not None:
        raise _too_deep(text, filename, line_offset, offset)


def _too_deep(text: str, filename: str, line_offset: int, offset: int) -> HostirError:
    return HostirError(
        f"nesting too deep: more than {MAX_NESTING} levels of nested brackets (the parser's limit)",
        SourceLocation.at_offset(text, filename, offset, line_offset=line_offset),
    )


def parse_module(
    text: str,
    filename: str = "<stdin>",
    verify: bool = True,
    line_offset: int = 0,
    ctx: Context | None = None,
) -> ModuleOp:
    """Parses (and verifies) a module; raises `HostirError` with the failing location.

    Text without any operation is an empty module, as in mlir-opt. Every way into
    parsing (hir-opt, hir-run, `Program.compile`) comes through here. `ctx` holds the
    dialects the text may use (default: `hostir_context()`; hir-opt's knows xDSL's too).
    """
    _remember_source(filename, text, line_offset)
    _check_text(text, filename, line_offset)
    parser = None
    try:
        # The parser lexes its first token when built, so building it can fail too.
        parser = LocatingParser(text, filename, line_offset, ctx)
        module = parser.parse_module()
    except ParseError as e:
        location = SourceLocation.at_offset(text, filename, e.span.start, max(1, e.span.len), line_offset)
        raise HostirError(e.msg, location) from None
    except RecursionError:
        # `_check_text` should prevent it; the parser's place is still the best one.
        offset = parser._current_token.span.start if parser is not None else 0
        raise _too_deep(text, filename, line_offset, offset) from None
    if verify:
        verify_module(module)
    return module


def verify_module(module: Operation) -> None:
    """Verifies every op, innermost first; the first failure becomes a located HostirError.

    Beyond xDSL's verifiers: every operand is defined before its use (xDSL's parser
    accepts `%y = fusion.neg %y`). How deep the module's text nests is checked where
    text is made (`check_printed_nesting`), not here: a module that is never printed
    (a program compiled from Python) pays nothing for it.
    """
    positions: dict[Block, dict[Operation, int]] = {}
    for op in module.walk(reverse=True, region_first=True):
        try:
            op.verify(verify_nested_ops=False)
        except (VerifyException, DiagnosticException) as e:
            message = str(e.args[0]) if e.args else str(e)
            raise HostirError.at(op, message.removeprefix("Operation does not verify: ")) from None
        except RecursionError:
            raise HostirError.at(op, f"nesting too deep: more than {MAX_NESTING} levels") from None
        _check_dominance(op, positions)


def _check_dominance(op: Operation, positions: dict[Block, dict[Operation, int]]) -> None:
    """Refuses an operand that is not defined before `op`, in a block that encloses it."""
    for i, operand in enumerate(op.operands):
        name = f"operand #{i}" + (f" (%{operand.name_hint})" if operand.name_hint else "")
        if isinstance(operand, OpResult):
            block, definer = operand.op.parent_block(), operand.op
        elif isinstance(operand, BlockArgument):
            block, definer = operand.block, None
        else:
            # xDSL's parser leaves a name used above the region that defines it unresolved.
            raise HostirError.at(op, f"{name} is not defined in a region that encloses its use")
        if block is None:
            continue
        user = _ancestor_in_region_of(block, op)
        if user is None:
            raise HostirError.at(op, f"{name} is used outside the region that defines it")
        if user.parent_block() is not block:
            if block.parent is not None and not DominanceInfo(block.parent).dominates(block, user.parent_block()):
                raise HostirError.at(op, f"{name} is used in a block that its definition does not dominate")
        elif definer is not None:
            order = positions.get(block)
            if order is None:
                order = positions[block] = {o: k for k, o in enumerate(block.ops)}
            if definer is user:
                raise HostirError.at(op, f"{name} is the result of the op that uses it")
            if order[definer] > order[user]:
                raise HostirError.at(op, f"{name} is used before it is defined")


def _ancestor_in_region_of(block: Block, op: Operation) -> Operation | None:
    """`op` or the op enclosing it that sits in a block of `block`'s region."""
    while op.parent_region() is not block.parent:
        if (op := op.parent_op()) is None:
            return None
    return op


class _OpPlacePrinter(Printer):
    """A printer that records where in its output each operation starts and ends."""

    def __init__(self, stream: io.StringIO, generic: bool):
        super().__init__(stream=stream, print_generic_format=generic)
        self.op_spans: list[list[Any]] = []
        """[start, end, op] in the order the ops start; the end is None until printed."""

    def print_op(self, op: Operation) -> None:
        span = [self.stream.tell(), None, op]
        self.op_spans.append(span)
        super().print_op(op)
        span[1] = self.stream.tell()

    def op_at(self, offset: int) -> Operation:
        """The innermost op whose text holds `offset` (or is being printed there)."""
        return next(op for start, end, op in reversed(self.op_spans) if start <= offset and (end is None or offset < end))


def check_printed_nesting(module: Operation, text: str, generic: bool) -> None:
    """Refuses `text`, the printed form of `module`, where it nests deeper than `MAX_NESTING`.

    A module read from text within the limit can still print deeper: the printer adds the
    implicit `builtin.module {`, expands type aliases, and the generic form puts each
    region in `({`. The error is on the op whose text goes too deep, found by printing the
    module again, which only a refused module pays.
    """
    if _too_deep_offset(text) is None:
        return
    out = io.StringIO()
    printer = _OpPlacePrinter(out, generic)
    printer.print_op(module)
    # hir-opt's printer options (--print-no-properties) may nest its text deeper than this.
    offset = _too_deep_offset(out.getvalue())
    form = "generic" if generic else "custom"
    raise HostirError.at(
        module if offset is None else printer.op_at(offset),
        f"nesting too deep: the {form} form of this op nests more than {MAX_NESTING} "
        "levels of brackets, more than the parser reads",
    )


def _too_deep_offset(text: str) -> int | None:
    """The offset of the first bracket of `text` deeper than `MAX_NESTING`, if any."""
    depth = 0
    for match in _LEXEMES.finditer(text):
        if match.lastgroup == "open":
            depth += 1
            if depth > MAX_NESTING:
                return match.start()
        elif match.lastgroup == "close":
            depth = max(0, depth - 1)
    return None


class _AliasingPrinter(Printer):
    """A printer that writes each `!fusion.tensor` type of `aliases` by its alias, and records
    every one it writes, in order, in `seen`."""

    def __init__(self, stream: io.StringIO, generic: bool, aliases: dict[Attribute, str]):
        super().__init__(stream=stream, print_generic_format=generic)
        self.aliases = aliases
        self.seen: dict[Attribute, None] = {}

    def print_attribute(self, attribute: Attribute) -> None:
        if isinstance(attribute, TensorType):
            self.seen[attribute] = None
            if attribute in self.aliases:
                self.print_string(f"!{self.aliases[attribute]}")
                return
        super().print_attribute(attribute)


def type_alias(type: TensorType) -> str:
    """A tensor type's alias, from what it is: `f32_2x16x32_didx` (element type, extents with
    `N` for a dynamic one, the parallel types other than serial)."""
    extents = "x".join("N" if extent == DYNAMIC else str(extent) for extent in type.get_shape()) or "scalar"
    kinds = [kind.value for kind in type.parallel_types() if kind != ParallelType.SERIAL]
    return "_".join([element_type_name(type.element_type), extents, *kinds])


READABLE_WIDTH = 100
"""The length past which `print_module(..., aliases=True)` cuts an op's line."""

_CUTS = re.compile(r'"(?:[^"\\]|\\.)*"|(, | (?=: )| (?=-> ))')
"""String literals, skipped whole, and where a line may be cut: after the `, ` between two
items, and before the `: ` of the types and the `-> ` of the results."""


def _cut(line: str, width: int) -> list[str]:
    """`line`, cut where `_CUTS` finds (outside string literals) into lines of at most
    `width` characters where it can be, each going on four spaces further in: the parser
    reads a line break as any other space."""
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    cuts = [match.end(1) for match in _CUTS.finditer(line) if match.group(1)]
    lines, start, prefix = [], 0, ""
    while len(prefix) + len(line) - start > width:
        fitting = [cut for cut in cuts if cut > start and len(prefix) + cut - start - 1 <= width]
        later = [cut for cut in cuts if cut > start]
        cut = fitting[-1] if fitting else (later[0] if later else None)
        if cut is None:
            break
        lines.append(prefix + line[start:cut].rstrip())
        start, prefix = cut, indent
    lines.append(prefix + line[start:])
    return lines


def print_module(module: Operation, generic: bool = False, aliases: bool = False) -> str:
    """The module's text, in the custom syntax or in MLIR's generic form; a located
    HostirError where that text would nest too deep to read back (`check_printed_nesting`).

    With `aliases`, every `!fusion.tensor` type is written by an alias defined at the top
    (`!f32_2x16x32_didx = !fusion.tensor<[2, 16, 32], f32, mesh = [0, 1], axes = [didx, _, _]>`),
    as the repository's examples write them by hand, and an op's line longer than
    `READABLE_WIDTH` is cut after its commas: the dumps of torch.compile's graphs read so,
    and parse to the same module."""
    out = io.StringIO()
    printer = _AliasingPrinter(out, generic, {})
    printer.print_op(module)
    if aliases and printer.seen:
        names: dict[Attribute, str] = {}
        taken: set[str] = set()
        for type in printer.seen:  # types of one alias on several meshes are told apart by a number
            name = base = type_alias(type)
            number = 1
            while name in taken:
                name, number = f"{base}_{number}", number + 1
            names[type] = name
            taken.add(name)
        out = io.StringIO()
        for type, name in names.items():
            out.write(f"!{name} = ")
            Printer(stream=out).print_attribute(type)
            out.write("\n")
        out.write("\n")
        _AliasingPrinter(out, generic, names).print_op(module)
        out = io.StringIO("\n".join(cut for line in out.getvalue().split("\n") for cut in _cut(line, READABLE_WIDTH)))
        out.seek(0, io.SEEK_END)
    out.write("\n")
    text = out.getvalue()
    check_printed_nesting(module, text, generic)
    return text
