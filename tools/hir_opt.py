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
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from typing import IO, Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.targets import get_all_targets
from xdsl.transforms import get_all_passes
from xdsl.utils.arg_spec import ArgSpec, parse_pipeline
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
        """Checks the pipeline first, so that a bad one is an error naming the pass.

        xDSL then builds it with its own callback (`--print-between-passes`,
        `--time-passes`), which hostir's runs before: located verification after every
        pass and `--print-ir-after-all`.
        """
        for spec in self.pass_specs():
            if spec.name not in self.available_passes:
                raise HostirError(
                    f"unknown pass '{spec.name}'; known passes: "
                    + ", ".join(sorted(self.available_passes))
                )
            pass_class = load_pass(spec.name, self.available_passes[spec.name])
            try:
                pass_class.from_spec(spec)
            except ValueError as error:
                raise HostirError(f"bad options for pass '{spec.name}': {error}") from None
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

    def read_chunk(self, chunk: IO[bytes]) -> str:
        with chunk:
            data = chunk.read()
        try:
            return data.decode()
        except UnicodeDecodeError as error:
            raise HostirError(
                f"{self.get_input_name()} is not UTF-8 text ({error.reason} at byte {error.start})"
            ) from None

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
                source = self.read_chunk(chunk)
                if verifier is not None:
                    verifier.expect(self.get_input_name(), source, line_offset)
                try:
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


def main(args: list[str] | None = None) -> int:
    """The `hir-opt` command; returns the exit status."""
    try:
        return HirOptMain(args).run()
    except HostirError as error:
        print(error, file=sys.stderr)
        return 1
