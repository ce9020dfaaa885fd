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
import re
from dataclasses import dataclass

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.mlir_lexer import MLIRTokenKind

from hostir_dialect import hostir_context


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
    file = loc.filename.data
    line = loc.line.data
    lines = _SOURCES.get(file, [])
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return SourceLocation(file, line, loc.column.data, text)


class LocatingParser(Parser):
    """xDSL's parser, recording each operation's line and column as its location.

    `line_offset` is the line of the text's first line in its file, for a chunk of a
    file split with `// -----`.
    """

    def __init__(self, text: str, filename: str, line_offset: int = 0):
        super().__init__(hostir_context(), text, filename)
        self.line_offset = line_offset

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

    def parse_operation(self) -> Operation:
        start_span = self._current_token.span
        start = start_span.get_location()
        try:
            op = super().parse_operation()
        except VerifyException as e:
            # A custom or declarative parser that builds an op with an operand or result
            # of the wrong kind fails in the op's constructor, not in the parser.
            self.raise_error(str(e), start_span.start, self._current_token.span.start)
        if not isinstance(op.location, FileLineColLoc):
            op.location = FileLineColLoc(
                StringAttr(start.file), IntAttr(start.line + self.line_offset), IntAttr(start.col)
            )
        return op


def _remember_source(filename: str, text: str, line_offset: int) -> None:
    lines = _SOURCES.setdefault(filename, [])
    chunk = text.splitlines()
    if len(lines) < line_offset + len(chunk):
        lines.extend([""] * (line_offset + len(chunk) - len(lines)))
    lines[line_offset : line_offset + len(chunk)] = chunk


MAX_NESTING = 64
"""How many brackets (`{`, `[`, `(`, `<`) the text may nest.

xDSL's parser, verifier and printer recurse once per level, so deeper text would
overflow Python's stack; raising the recursion limit instead can crash the
interpreter. Real IR nests fewer than ten.
"""

_BRACKETS = re.compile(r'//[^\n]*|"(?:[^"\\\n]|\\.)*"|->|[{\[(<]|[}\])>]')
"""Comments and strings (skipped), `->` (not a bracket), and opening and closing brackets."""


def _check_nesting(text: str, filename: str, line_offset: int) -> None:
    """Refuses text nested deeper than `MAX_NESTING`, at the bracket that goes too deep."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token in "{[(<":
            depth += 1
            if depth > MAX_NESTING:
                raise _too_deep(text, filename, line_offset, match.start())
        elif token in "}])>":
            depth = max(0, depth - 1)


def _too_deep(text: str, filename: str, line_offset: int, offset: int) -> HostirError:
    return HostirError(
        f"nesting too deep: more than {MAX_NESTING} levels of nested brackets (the parser's limit)",
        SourceLocation.at_offset(text, filename, offset, line_offset=line_offset),
    )


def parse_module(
    text: str, filename: str = "<stdin>", verify: bool = True, line_offset: int = 0
) -> ModuleOp:
    """Parses (and verifies) a module; raises `HostirError` with the failing location.

    Text without any operation is an empty module, as in mlir-opt.
    """
    _remember_source(filename, text, line_offset)
    _check_nesting(text, filename, line_offset)
    parser = LocatingParser(text, filename, line_offset)
    try:
        module = parser.parse_module()
    except ParseError as e:
        location = SourceLocation.at_offset(text, filename, e.span.start, max(1, e.span.len), line_offset)
        raise HostirError(e.msg, location) from None
    except RecursionError:
        # `_check_nesting` should prevent it; the parser's place is still the best one.
        raise _too_deep(text, filename, line_offset, parser._current_token.span.start) from None
    if verify:
        verify_module(module)
    return module


def verify_module(module: Operation) -> None:
    """Verifies every op, innermost first; the first failure becomes a located HostirError."""
    for op in module.walk(reverse=True, region_first=True):
        try:
            op.verify(verify_nested_ops=False)
        except (VerifyException, DiagnosticException) as e:
            message = str(e.args[0]) if e.args else str(e)
            raise HostirError.at(op, message.removeprefix("Operation does not verify: ")) from None


def print_module(module: Operation, generic: bool = False) -> str:
    """The module's text, in the custom syntax or in MLIR's generic form."""
    out = io.StringIO()
    Printer(stream=out, print_generic_format=generic).print_op(module)
    out.write("\n")
    return out.getvalue()
