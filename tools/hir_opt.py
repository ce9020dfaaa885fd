"""`hir-opt`: hostir's pass driver, xdsl-opt with hostir's dialects, passes and errors.

It is xDSL's `xDSLOptMain` with hostir's dialects, hostir's passes and xDSL's three
generic ones (`canonicalize`, `cse`, `dce`) registered, and with every error a user
can cause printed the way mlir-opt prints one, `file:line:col: error: message` with
the source line and a caret, followed by exit status 1, instead of a traceback:

    hir-opt fusion.mlir -p 'stream-parallel{p2p-backend=cuda},insert-deallocations'
    hir-opt --split-input-file --verify-diagnostics invalid.mlir

The run loop is hir-opt's own (xDSL's stops at the first error and prints
diagnostics to stdout): with `--split-input-file` every chunk is processed and every
error reported, and `--verify-diagnostics` checks the errors against MLIR's
`// expected-error` annotations instead of printing them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from typing import IO, Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.targets import get_all_targets
from xdsl.transforms import get_all_passes
from xdsl.utils.arg_spec import (
    ArgSpec,
    PipelineLexer,
    SpecTokenKind,
    _convert_arg_to_type,
    parse_pipeline,
)
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException
from xdsl.xdsl_opt_main import xDSLOptMain

from hostir_dialect import DIALECTS
from hostir_dialect.text import (
    HostirError,
    SourceLocation,
    parse_module,
    print_module,
    verify_module,
)
from passes import HOSTIR_PASSES

CHUNK_SEPARATOR = "// -----\n"
_CHUNK_SEPARATOR_LINE = re.compile(rb"^// -----[ \t]*\r?$", re.MULTILINE)

XDSL_PASSES = {
    "canonicalize": "Applies the canonicalization patterns of every op.",
    "cse": "Replaces an op by an identical earlier one (common subexpression elimination).",
    "dce": "Removes ops whose results are unused and that have no side effects.",
}
"""The generic xDSL passes hir-opt offers, with a summary for those without a docstring."""

UNSUPPORTED_XDSL_OPTIONS = {
    "allow_unregistered_dialect": "--allow-unregistered-dialect",
    "no_implicit_module": "--no-implicit-module",
    "parsing_diagnostics": "--parsing-diagnostics",
    "shrink": "--shrink",
}
"""xdsl-opt options that hostir's parser or run loop does not implement."""


class HirOptMain(xDSLOptMain):
    """xdsl-opt for hostir programs; see the module docstring."""

    version_format = "hir-opt built from xdsl version {xdsl_version}"

    running_pass: ModulePass | None = None
    """The pass being applied, to name it when it fails."""

    def __init__(self, args: list[str] | None = None):
        super().__init__("hostir's pass driver (xdsl-opt conventions)", args)
        for option, flag in UNSUPPORTED_XDSL_OPTIONS.items():
            if getattr(self.args, option):
                raise HostirError(f"hir-opt does not support xdsl-opt's option {flag}")

    # -- registration --------------------------------------------------------- #

    def register_all_dialects(self) -> None:
        for dialect in DIALECTS:
            self.ctx.load_dialect(dialect)

    def register_all_passes(self) -> None:
        xdsl_passes = get_all_passes()
        for name in XDSL_PASSES:
            self.register_pass(name, xdsl_passes[name])
        for name, factory in HOSTIR_PASSES.items():
            self.register_pass(name, factory)

    def register_all_targets(self) -> None:
        self.available_targets["mlir"] = get_all_targets()["mlir"]

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        # argparse has no public way to change an inherited option's help text.
        options = arg_parser._option_string_actions
        options["--verify-diagnostics"].help = (
            "Check the errors against the input's `// expected-error {{...}}` annotations"
        )
        options["--passes"].help = (
            "Comma-separated pass pipeline; options as name{key=value ...}, "
            "e.g. 'stream-parallel{p2p-backend=cuda},cse'. See --list-passes"
        )
        options["--disable-verify"].help = "Skip verification after parsing and after each pass"
        options["--version"].help = "Print the xDSL version hir-opt is built on and exit"
        for flag in UNSUPPORTED_XDSL_OPTIONS.values():
            options[flag].help = argparse.SUPPRESS
        arg_parser.add_argument(
            "--print-ir-after-all",
            default=False,
            action="store_true",
            help="Print the IR to stderr after every pass, as mlir-opt does",
        )
        arg_parser.add_argument(
            "--list-passes",
            action=ListPassesAction,
            passes=self.available_passes,
            help="List the passes with a one-line summary each and exit",
        )

    # -- the pass pipeline ---------------------------------------------------- #

    def setup_pipeline(self) -> None:
        """Checks the pipeline first, so that a bad one is an error on the `-p` text.

        xDSL then builds it with its own callback (`--print-between-passes`,
        `--time-passes`), which hostir's runs before: located verification after every
        pass and `--print-ir-after-all`.
        """
        text = self.args.passes
        for spec, place in zip(self.pass_specs(), pipeline_places(text), strict=True):
            if spec.name not in self.available_passes:
                raise place.error(
                    text,
                    f"unknown pass '{spec.name}'; known passes: "
                    + ", ".join(sorted(self.available_passes)),
                )
            try:
                pass_class = load_pass(spec.name, self.available_passes[spec.name])
            except HostirError as error:
                raise place.error(text, error.message) from None
            check_pass_options(pass_class, spec, place, text)
        super().setup_pipeline()
        xdsl_callback = self.pipeline.callback
        assert xdsl_callback is not None

        def callback(previous: ModulePass | None, module: ModuleOp, next: ModulePass | None):
            self.after_pass(previous, module)
            xdsl_callback(previous, module, next)
            self.running_pass = next

        self.pipeline = PassPipeline(self.pipeline.passes, callback)

    def pass_specs(self) -> list[ArgSpec]:
        try:
            return list(parse_pipeline(self.args.passes))
        except ArgSpecParseError as error:
            raise pipeline_syntax_error(error) from None

    def after_pass(self, previous: ModulePass | None, module: ModuleOp) -> None:
        if previous is None:
            return
        if not self.args.disable_verify:
            try:
                verify_module(module)
            except HostirError as error:
                raise HostirError(
                    f"pass '{previous.name}' produced invalid IR: {error.message}",
                    error.location,
                    error.op_name,
                ) from None
        if self.args.print_ir_after_all:
            sys.stderr.write(
                f"// -----// IR Dump After {previous.name} //----- //\n"
                + print_module(module, generic=self.args.print_op_generic)
            )

    def apply_passes(self, prog: ModuleOp) -> None:
        """Applies the pipeline; an xDSL diagnostic from a pass becomes a HostirError."""
        try:
            super().apply_passes(prog)
        except DiagnosticException as error:
            name = self.running_pass.name if self.running_pass else "pipeline"
            raise HostirError(f"pass '{name}' failed: {error}") from None

    # -- input and output ----------------------------------------------------- #

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        """The input; any file, whatever its extension, is hostir text."""
        if self.args.input_file is None:
            return sys.stdin.buffer, "mlir"
        try:
            return open(self.args.input_file, "rb"), "mlir"
        except OSError as error:
            raise HostirError(
                f"cannot open input file '{self.args.input_file}': {error.strerror}"
            ) from None

    def prepare_input(self) -> tuple[list[tuple[IO[bytes], int]], str]:
        """The chunks of the input and the line of the file each starts after.

        With `--split-input-file`, a line that is exactly `// -----` separates chunks,
        as in mlir-opt; xDSL splits wherever the text occurs, even inside a comment
        such as `// CHECK: // -----`.
        """
        stream, extension = self.get_input_stream()
        with stream:
            data = stream.read()
        if not self.args.split_input_file:
            return [(BytesIO(data), 0)], extension
        separators = list(_CHUNK_SEPARATOR_LINE.finditer(data))
        starts = [0, *(separator.end() for separator in separators)]
        ends = [*(separator.start() for separator in separators), len(data)]
        chunks = [
            (BytesIO(data[start:end]), data.count(b"\n", 0, start))
            for start, end in zip(starts, ends)
        ]
        return chunks, extension

    def get_input_name(self) -> str:
        return self.args.input_file or "<stdin>"

    def prepare_output(self) -> IO[str]:
        try:
            return super().prepare_output()
        except OSError as error:
            raise HostirError(
                f"cannot open output file '{self.args.output_file}': {error.strerror}"
            ) from None

    def read_chunk(self, chunk: IO[bytes], line_offset: int) -> str:
        """The chunk's text; bytes that are not UTF-8 are an error at the first of them."""
        with chunk:
            data = chunk.read()
        try:
            return data.decode()
        except UnicodeDecodeError as error:
            raise not_utf8_error(self.get_input_name(), data, error, line_offset) from None

    def process_chunk(self, source: str, line_offset: int) -> str:
        """Parses, verifies and transforms one chunk; returns its output text."""
        module = parse_module(
            source,
            self.get_input_name(),
            verify=not self.args.disable_verify,
            line_offset=line_offset,
        )
        self.apply_passes(module)
        return self.output_resulting_program(module)

    def run(self) -> int:
        """Processes every chunk, reports every error; returns the exit status."""
        chunks, _ = self.prepare_input()
        output = self.prepare_output()
        verifier = DiagnosticVerifier() if self.args.verify_diagnostics else None
        errors: list[HostirError] = []
        try:
            for i, (chunk, line_offset) in enumerate(chunks):
                if i > 0:
                    output.write(CHUNK_SEPARATOR)
                try:
                    source = self.read_chunk(chunk, line_offset)
                    if verifier is not None:
                        verifier.expect(self.get_input_name(), source, line_offset)
                    output.write(self.process_chunk(source, line_offset))
                except HostirError as error:
                    errors.append(error)
        finally:
            if output is not sys.stdout:
                output.close()
        if verifier is not None:
            errors = verifier.mismatches(errors)
        for error in errors:
            print(error, file=sys.stderr)
        return 1 if errors else 0


# --------------------------------------------------------------------------- #
# Passes                                                                       #
# --------------------------------------------------------------------------- #


@dataclass
class PassPlace:
    """Where one pass of a `-p` pipeline is written: offsets into the pipeline text."""

    name_start: int
    name_end: int
    options: list[tuple[str, int, int]] = field(default_factory=list)
    """Each option as written (`p2p-backend`), with the offsets of `key=value`."""

    def error(
        self, text: str, message: str, start: int | None = None, end: int | None = None
    ) -> HostirError:
        """An error on the pass name, or on `text[start:end]`."""
        start = self.name_start if start is None else start
        end = self.name_end if end is None else end
        # `pass-pipeline:line:col` as xDSL's; the caret stops at the end of the line.
        return HostirError(message, SourceLocation.at_offset(text, "pass-pipeline", start, max(1, end - start)))


def pipeline_places(text: str) -> list[PassPlace]:
    """Where each pass and each option of a pipeline xDSL has parsed is written.

    xDSL's `ArgSpec` keeps no positions, so the pipeline's tokens are walked again.
    """
    places: list[PassPlace] = []
    state = "pass"
    lexer = PipelineLexer(text)
    while (token := lexer.lex()).kind is not SpecTokenKind.EOF:
        kind, span = token.kind, token.span
        if state == "pass" and kind is SpecTokenKind.IDENT:
            places.append(PassPlace(span.start, span.end))
            state = "after pass"
            continue
        if not places:
            continue
        place = places[-1]
        if state == "after pass" and kind is SpecTokenKind.COMMA:
            state = "pass"
            continue
        if state == "after pass":
            if kind is SpecTokenKind.L_BRACE:
                state = "key"
        elif state == "key" and kind is SpecTokenKind.IDENT:
            place.options.append((span.text, span.start, span.end))
            state = "option"
        elif kind is SpecTokenKind.R_BRACE:
            state = "after pass"
        elif kind is SpecTokenKind.SPACE:
            state = "key"
        elif state == "option":
            name, start, _ = place.options[-1]
            place.options[-1] = (name, start, span.end)
    return places


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _describe_type(hint: Any) -> str:
    """`bool` -> 'true or false', ...: what an option takes (the passes hir-opt knows take
    booleans, integers and strings)."""
    return _TYPE_NAMES.get(hint, str(hint))


def _in_users_words(message: str, pass_class: type[ModulePass], spellings: dict[str, str]) -> str:
    """A pass's message with its option fields spelt as the user wrote them (or with dashes)."""
    for field_name in _option_fields(pass_class):
        spelling = spellings.get(field_name, field_name.replace("_", "-"))
        message = re.sub(rf"(?<![\w-]){re.escape(field_name)}(?![\w-])", spelling, message)
    return message


def _option_fields(pass_class: type[ModulePass]) -> dict[str, dataclasses.Field[Any]]:
    return {
        f.name: f
        for f in dataclasses.fields(pass_class)  # type: ignore[arg-type]
        if f.init and f.name != "name"
    }


def check_pass_options(pass_class: type[ModulePass], spec: ArgSpec, place: PassPlace, text: str) -> None:
    """Refuses an option the pass lacks, a value of the wrong type or one the pass rejects.

    Each error points at the option as written in the pipeline. A pass refuses a value
    it cannot use when it is built (hostir's passes check their values in
    `__post_init__`), so each option is tried alone.
    """
    name = spec.name
    fields = _option_fields(pass_class)
    hints = typing.get_type_hints(pass_class)
    spellings: dict[str, str] = {}
    for key, start, end in place.options:
        field_name = key.replace("-", "_")
        if field_name not in fields:
            known = ", ".join(f.replace("_", "-") for f in fields)
            raise place.error(
                text,
                f"pass '{name}' has no option '{key}'; "
                + (f"its options are {known}" if known else "it takes no options"),
                start,
                start + len(key),
            )
        if field_name in spellings:
            raise place.error(text, f"option '{key}' of pass '{name}' is given twice", start, end)
        spellings[field_name] = key
        value = spec.parameters[key]
        value_text = text[start + len(key) + 1 : end] if end > start + len(key) else ""
        try:
            _convert_arg_to_type(value, hints[field_name])
        except ValueError:
            got = f"'{value_text}'" if value_text else "no value"
            raise place.error(
                text,
                f"option '{key}' of pass '{name}' takes "
                f"{_describe_type(hints[field_name])}, got {got}",
                start,
                end,
            ) from None
        problem = _refusal(pass_class, ArgSpec(name, {key: value}))
        if problem is not None:
            raise place.error(text, f"{name}: {_in_users_words(problem, pass_class, spellings)}", start, end)


def _refusal(pass_class: type[ModulePass], spec: ArgSpec) -> str | None:
    """Why the pass refuses to be built with these options, or None."""
    try:
        pass_class.from_spec(spec)
    except HostirError as error:
        message = error.message
    except ValueError as error:
        message = str(error)
    else:
        return None
    # A pass names itself ("stream-parallel: unknown ..."), or the pass it builds (a
    # pipeline); the caller names the pass the user wrote.
    return re.sub(r"^[\w-]+: ", "", message)


def not_utf8_error(
    filename: str, data: bytes, error: UnicodeDecodeError, line_offset: int
) -> HostirError:
    """An error at the first byte of `data` that is not UTF-8, shown in its line."""
    location = SourceLocation.at_offset(
        data.decode(errors="replace"), filename, len(data[: error.start].decode()), line_offset=line_offset
    )
    # Control bytes of a binary file would garble the terminal; one character each keeps the caret.
    shown = "".join(c if c.isprintable() or c == "\t" else "\ufffd" for c in location.text)
    return HostirError(
        f"input is not UTF-8 text ({error.reason}: byte 0x{data[error.start]:02x})",
        dataclasses.replace(location, text=shown),
    )


def load_pass(name: str, factory: Callable[[], type[ModulePass]]) -> type[ModulePass]:
    """The pass class; a pass whose module cannot be imported is an error about it alone."""
    try:
        return factory()
    except ImportError as error:
        raise HostirError(f"pass '{name}' is not available: {error}") from None


def pass_summary(name: str, factory: Callable[[], type[ModulePass]]) -> str:
    if name in XDSL_PASSES:
        return XDSL_PASSES[name]
    try:
        doc = load_pass(name, factory).__doc__ or ""
    except HostirError as error:
        return f"(unavailable: {error.message})"
    return doc.strip().partition("\n")[0]


class ListPassesAction(argparse.Action):
    """`--list-passes`: prints every pass and its summary, then exits as `--version` does."""

    def __init__(
        self, *args: Any, passes: dict[str, Callable[[], type[ModulePass]]], **kwargs: Any
    ):
        super().__init__(*args, nargs=0, **kwargs)
        self.passes = passes

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        width = max(map(len, self.passes))
        for name in sorted(self.passes):
            print(f"{name:<{width}}  {pass_summary(name, self.passes[name])}")
        parser.exit()


_PIPELINE_ERROR = re.compile(r"pass-pipeline:(\d+):(\d+)\n(.*)\n.*\n\s*(.*)")
"""xDSL's pipeline syntax error: location, pipeline text, caret line, message."""


def pipeline_syntax_error(error: ArgSpecParseError) -> HostirError:
    """xDSL's error on the `-p` text, as a located error on that text."""
    match = _PIPELINE_ERROR.search(str(error))
    if match is None:
        return HostirError(f"cannot parse the pass pipeline: {error}")
    line, column, text, message = match.groups()
    return HostirError(
        f"cannot parse the pass pipeline: {message}",
        SourceLocation("pass-pipeline", int(line), int(column), text),
    )


# --------------------------------------------------------------------------- #
# --verify-diagnostics                                                         #
# --------------------------------------------------------------------------- #

_EXPECTED_ERROR = re.compile(r"expected-error(?:@(?P<offset>[+-]\d+))?\s*\{\{(?P<message>.*?)\}\}")


@dataclass
class ExpectedError:
    """An annotation: an error whose message contains `message` is expected on `line`."""

    annotation: SourceLocation
    line: int
    message: str


class DiagnosticVerifier:
    """Matches the errors of a run against MLIR's `expected-error` annotations.

    `// expected-error {{text}}` expects an error on its own line, `expected-error@+N`
    and `@-N` on the line N below or above; an error matches when its message
    contains the text.
    """

    def __init__(self):
        self.expected: list[ExpectedError] = []

    def expect(self, filename: str, source: str, line_offset: int) -> None:
        """Collects the annotations of a chunk whose first line is `line_offset + 1`."""
        for number, text in enumerate(source.splitlines(), line_offset + 1):
            for match in _EXPECTED_ERROR.finditer(text):
                self.expected.append(
                    ExpectedError(
                        SourceLocation(
                            filename, number, match.start() + 1, text, match.end() - match.start()
                        ),
                        number + int(match["offset"] or 0),
                        match["message"],
                    )
                )

    def mismatches(self, errors: list[HostirError]) -> list[HostirError]:
        """The errors no annotation expects, then the annotations no error produced."""
        pending = list(self.expected)
        unexpected: list[HostirError] = []
        for error in errors:
            match = next((e for e in pending if self.matches(e, error)), None)
            if match is None:
                unexpected.append(
                    HostirError(f"unexpected error: {error.message}", error.location, error.op_name)
                )
            else:
                pending.remove(match)
        return unexpected + [
            HostirError(f'expected error "{e.message}" was not produced', e.annotation)
            for e in pending
        ]

    @staticmethod
    def matches(expected: ExpectedError, error: HostirError) -> bool:
        return (
            error.location is not None
            and error.location.file == expected.annotation.file
            and error.location.line == expected.line
            and expected.message in error.message
        )


BROKEN_PIPE_STATUS = 141
"""The status of a command a closed pipe ends (128 + SIGPIPE), as in `seq 1000 | head -1`."""


def main(args: list[str] | None = None) -> int:
    """The `hir-opt` command; returns the exit status.

    Output into a pipe that the reader has closed (`hir-opt --list-passes | head -1`)
    ends the command quietly, as it ends other command-line tools.
    """
    try:
        try:
            status = HirOptMain(args).run()
        except HostirError as error:
            print(error, file=sys.stderr)
            status = 1
        except RecursionError:
            # The parser refuses text nested deeper than text.MAX_NESTING, so this is a
            # pass or a printer recursing through IR a pass made deeper.
            print("error: nesting too deep: the IR nests too deeply to process", file=sys.stderr)
            status = 1
        except SystemExit:
            sys.stdout.flush()  # --help, --version, --list-passes
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _discard_stdout()
        return BROKEN_PIPE_STATUS


def _discard_stdout() -> None:
    """Points stdout at /dev/null, so that Python's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
