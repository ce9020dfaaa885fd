"""`hir-opt`: hostir's pass driver, xdsl-opt with hostir's dialects, passes and errors.

It is xDSL's `xDSLOptMain` with every dialect and pass of xDSL's universe (xDSL's own,
and those of any plugin installed) next to hostir's, and with every error a user can
cause printed the way mlir-opt prints one, `file:line:col: error: message` with the
source line and a caret, followed by exit status 1, instead of a traceback:

    hir-opt fusion.mlir -p 'stream-parallel{p2p-backend=cuda},insert-deallocations'
    hir-opt --split-input-file --verify-diagnostics invalid.mlir

The run loop is hir-opt's own (xDSL's stops at the first error and prints
diagnostics to stdout): with `--split-input-file` every chunk is processed and every
error reported, and `--verify-diagnostics` checks the errors against MLIR's
`// expected-error` annotations instead of printing them. A pipeline pass
(`hir-lowering`) runs as its passes, each printed, timed and verified by name.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from typing import IO, Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.targets import get_all_targets
from xdsl.utils.arg_spec import parse_spec
from xdsl.xdsl_opt_main import xDSLOptMain

from hostir_dialect.text import HostirError, SourceLocation, check_printed_nesting, parse_module, print_module
from hostir.passes import available_dialects, available_passes
from hostir.version import version_line
from hostir.passes import HOSTIR_PASSES
from hostir.passes.driver import (
    describe_type,
    expand,
    load_pass,
    option_fields,
    parse_pass_pipeline,
    run_passes,
    unknown_pass_message,
)
from hostir.passes.options import option_choices

CHUNK_SEPARATOR = "// -----\n"
_CHUNK_SEPARATOR_LINE = re.compile(rb"^// -----[ \t]*\r?$", re.MULTILINE)

STDIO = "-"
"""The file name that means stdin for the input and stdout for `-o`, as in mlir-opt."""

XDSL_PASS_SUMMARIES = {
    "cse": "Replaces an op by an identical earlier one (common subexpression elimination).",
    "dce": "Removes ops whose results are unused and that have no side effects.",
}
"""Summaries of the generic xDSL passes that have no docstring."""

UNSUPPORTED_XDSL_OPTIONS = {
    "allow_unregistered_dialect": "--allow-unregistered-dialect",
    "no_implicit_module": "--no-implicit-module",
    "parsing_diagnostics": "--parsing-diagnostics",
    "shrink": "--shrink",
}
"""xdsl-opt options that hostir's parser or run loop does not implement."""


class HirOptMain(xDSLOptMain):
    """xdsl-opt for hostir programs; see the module docstring."""

    version_format = version_line("hir-opt")
    """What `--version` prints (xDSL's format string: no braces of its own)."""

    passes: tuple[ModulePass, ...] = ()
    """The pipeline, its pipeline passes expanded."""

    passes_done = 0
    """How many passes have run on the current chunk."""

    def __init__(self, args: list[str] | None = None):
        super().__init__("hostir's pass driver (xdsl-opt conventions)", args)
        for option, flag in UNSUPPORTED_XDSL_OPTIONS.items():
            if getattr(self.args, option):
                raise HostirError(f"hir-opt does not support xdsl-opt's option {flag}")

    # -- registration --------------------------------------------------------- #

    def register_all_dialects(self) -> None:
        for name, factory in available_dialects().items():
            self.ctx.register_dialect(name, factory)

    def register_all_passes(self) -> None:
        for name, factory in available_passes().items():
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
        options["--output-file"].help = "Write the output there instead of to stdout ('-': stdout)"
        options["--time-passes"].help = "Print the time each pass takes to stderr"
        options["--disable-verify"].help = "Skip verification after parsing and after each pass"
        options["--version"].help = "Print hostir's version, and xDSL's and torch's, and exit"
        for flag in UNSUPPORTED_XDSL_OPTIONS.values():
            options[flag].help = argparse.SUPPRESS
        (input_file,) = (a for a in arg_parser._actions if a.dest == "input_file")
        input_file.help = "The input file ('-' or none: stdin)"
        arg_parser.add_argument(
            "--print-ir-after-all",
            default=False,
            action="store_true",
            help="Print the IR to stderr after every pass, as mlir-opt does",
        )
        for when in ("before", "after"):
            arg_parser.add_argument(
                f"--print-ir-{when}",
                metavar="PASS[,PASS...]",
                type=lambda text: [name for name in text.split(",") if name],
                action="extend",
                default=[],
                help=f"Print the IR to stderr {when} each pass named (repeatable), as mlir-opt does",
            )
        arg_parser.add_argument(
            "--list-passes",
            nargs="?",
            const="all",
            choices=("all", "hostir"),
            action=ListPassesAction,
            passes=self.available_passes,
            help="List the passes, hostir's first, each with its summary and options, and exit; "
            "--list-passes=hostir lists hostir's alone",
        )

    # -- the pass pipeline ---------------------------------------------------- #

    def setup_pipeline(self) -> None:
        """Builds the pipeline first, so that a bad one is an error on the `-p` text, and
        checks that the passes `--print-ir-before` and `--print-ir-after` name are in it."""
        self.passes = expand(parse_pass_pipeline(self.args.passes, self.available_passes))
        running = [p.name for p in self.passes]
        for when in ("before", "after"):
            for name in getattr(self.args, f"print_ir_{when}"):
                if name not in self.available_passes:
                    raise HostirError(f"--print-ir-{when}: {unknown_pass_message(name, self.available_passes)}")
                if name not in running:
                    raise HostirError(
                        f"--print-ir-{when} names '{name}', which the pipeline does not run; it runs "
                        + (", ".join(dict.fromkeys(running)) or "no pass")
                    )

    def apply_passes(self, prog: ModuleOp) -> None:
        """Applies the pipeline, verifying after each pass; prints what the options ask."""
        run_passes(
            self.passes,
            self.ctx,
            prog,
            verify=not self.args.disable_verify,
            after=self.after_pass,
            before=self.before_pass,
        )

    def before_pass(self, coming: ModulePass, module: ModuleOp) -> None:
        if coming.name in self.args.print_ir_before:
            self.print_ir("Before", coming, module)

    def print_ir(self, when: str, named: ModulePass, module: ModuleOp) -> None:
        sys.stderr.write(
            f"// -----// IR Dump {when} {named.name} //----- //\n"
            + print_module(module, generic=self.args.print_op_generic)
        )

    def after_pass(self, done: ModulePass, module: ModuleOp, seconds: float) -> None:
        if self.args.time_passes:
            print(f"Pass {done.name} took {seconds:.6f} seconds", file=sys.stderr)
        if self.args.print_ir_after_all or done.name in self.args.print_ir_after:
            self.print_ir("After", done, module)
        self.passes_done += 1
        if self.args.print_between_passes and self.passes_done < len(self.passes):
            print(f"IR after {done.name}:")
            print(print_module(module) + "\n\n")

    # -- input and output ----------------------------------------------------- #

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        """The input; any file, whatever its extension, is hostir text."""
        if self.args.input_file in (None, STDIO):
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
        return "<stdin>" if self.args.input_file in (None, STDIO) else self.args.input_file

    def prepare_output(self) -> IO[str]:
        if self.args.output_file in (None, STDIO):
            return sys.stdout
        try:
            return open(self.args.output_file, "w")
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
            ctx=self.ctx,
        )
        self.passes_done = 0
        self.apply_passes(module)
        output = self.output_resulting_program(module)
        if parse_spec(self.args.target).name == "mlir":
            check_printed_nesting(module, output, self.args.print_op_generic)
        return output

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


# --------------------------------------------------------------------------- #
# --list-passes                                                                #
# --------------------------------------------------------------------------- #


def pass_summary(name: str, pass_class: type[ModulePass]) -> str:
    """The first paragraph of the pass's docstring, on one line."""
    doc = pass_class.__dict__.get("__doc__") or ""
    if doc.startswith(f"{pass_class.__name__}("):  # the signature dataclass writes for a class without one
        doc = ""
    paragraph = textwrap.dedent(doc).strip().split("\n\n")[0]
    return " ".join(paragraph.split()) or XDSL_PASS_SUMMARIES.get(name, "(no summary)")


def _option_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(_option_value, value))
    return "none" if value is None else str(value)


def option_lines(pass_class: type[ModulePass]) -> list[str]:
    """One line per option of the pass: `name=default  (what it takes)`."""
    hints = typing.get_type_hints(pass_class)
    choices = option_choices(pass_class)
    lines = []
    for name, field in option_fields(pass_class).items():
        takes = f"one of {', '.join(choices[name])}" if name in choices else describe_type(hints[name])
        if field.default is not dataclasses.MISSING:
            default = f"={_option_value(field.default)}"
        elif field.default_factory is not dataclasses.MISSING:
            default = f"={_option_value(field.default_factory())}"
        else:
            default, takes = "", f"required; {takes}"
        lines.append(f"{name.replace('_', '-')}{default}  ({takes})")
    return lines


def pass_listing(name: str, factory: Callable[[], type[ModulePass]]) -> list[str]:
    """The lines `--list-passes` prints for one pass: its name and summary, then its options."""
    try:
        pass_class = load_pass(name, factory)
    except HostirError as error:
        return [f"{name}  (unavailable: {error.message})"]
    return [f"{name}  {pass_summary(name, pass_class)}", *(f"    {line}" for line in option_lines(pass_class))]


HOSTIR_HEADING = "hostir's passes:"
XDSL_HEADING = "xDSL's passes, and those of its plugins:"


class ListPassesAction(argparse.Action):
    """`--list-passes[=all|hostir]`: prints the passes, hostir's first, each with its summary
    and options (`--list-passes=hostir`: hostir's alone), then exits as `--version` does."""

    def __init__(self, *args: Any, passes: dict[str, Callable[[], type[ModulePass]]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.passes = passes

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        hostir = sorted(name for name in self.passes if name in HOSTIR_PASSES)
        others = sorted(name for name in self.passes if name not in HOSTIR_PASSES)
        sections = [(None, hostir)] if values == "hostir" else [(HOSTIR_HEADING, hostir), (XDSL_HEADING, others)]
        for heading, names in sections:
            if heading is not None:
                print(heading)
            for name in names:
                print("\n".join(pass_listing(name, self.passes[name])))
        parser.exit()


# --------------------------------------------------------------------------- #
# --verify-diagnostics                                                         #
# --------------------------------------------------------------------------- #

SEVERITIES = ("error", "warning", "note", "remark")

_ANNOTATION = re.compile(rf"expected-({'|'.join(SEVERITIES)})(\S*?)\s*\{{\{{(.*)\}}\}}")
"""What looks like an annotation: `expected-<severity><suffix> {{message}}` (the message
ends at the line's last `}}`, as in MLIR). Text that names a severity without `{{` is prose."""

_SUFFIX = re.compile(r"(?P<regex>-re)?(?:@(?P<where>above|below|[+-]\d+))?")
"""What may follow the severity: `-re`, then `@above`, `@below`, `@+N` or `@-N`."""

_REGEX_PART = re.compile(r"\{\{(.*?)\}\}")


@dataclass
class ExpectedDiagnostic:
    """An annotation: a diagnostic of `severity` whose message matches `pattern`, on `line`."""

    annotation: SourceLocation
    severity: str
    line: int
    message: str
    pattern: re.Pattern[str]


class DiagnosticVerifier:
    """Matches the errors of a run against MLIR's `expected-*` annotations, as mlir-opt does.

    `// expected-error {{text}}` expects an error on its own line; `@above` and `@below`
    the line above or below, `@+N` and `@-N` the line N below or above. An error matches
    when its message contains the text; with `expected-error-re`, `{{...}}` parts of the
    text are regular expressions. hostir reports errors only, so an
    `expected-warning`, `expected-note` or `expected-remark` is never produced and fails
    the check, as in mlir-opt when the diagnostic does not occur. An annotation that
    cannot be read (`expected-error@3 {{...}}`) is an error, never skipped.
    """

    def __init__(self):
        self.expected: list[ExpectedDiagnostic] = []
        self.unreadable: list[HostirError] = []

    def expect(self, filename: str, source: str, line_offset: int) -> None:
        """Collects the annotations of a chunk whose first line is `line_offset + 1`."""
        for number, text in enumerate(source.splitlines(), line_offset + 1):
            for match in _ANNOTATION.finditer(text):
                location = SourceLocation(
                    filename, number, match.start() + 1, text, match.end() - match.start()
                )
                severity, suffix, message = match.groups()
                parsed = _SUFFIX.fullmatch(suffix)
                if parsed is None:
                    self.unreadable.append(
                        HostirError(
                            f"cannot read the annotation 'expected-{severity}{suffix}': expected "
                            f"expected-{severity}, then -re, @above, @below, @+N or @-N, then {{{{message}}}}",
                            dataclasses.replace(location, length=len(severity) + len(suffix) + 9),
                        )
                    )
                    continue
                try:
                    pattern = _message_pattern(message, parsed["regex"])
                except re.error as error:
                    self.unreadable.append(
                        HostirError(f"cannot read the regular expression of the annotation: {error}", location)
                    )
                    continue
                where = parsed["where"]
                offset = {None: 0, "above": -1, "below": 1}.get(where)
                line = number + (int(where) if offset is None else offset)
                self.expected.append(ExpectedDiagnostic(location, severity, line, message, pattern))

    def mismatches(self, errors: list[HostirError]) -> list[HostirError]:
        """The errors no annotation expects, the annotations that cannot be read, then the
        annotations no error produced."""
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
        return unexpected + self.unreadable + [
            HostirError(f'expected {e.severity} "{e.message}" was not produced', e.annotation)
            for e in pending
        ]

    @staticmethod
    def matches(expected: ExpectedDiagnostic, error: HostirError) -> bool:
        return (
            expected.severity == "error"
            and error.location is not None
            and error.location.file == expected.annotation.file
            and error.location.line == expected.line
            and expected.pattern.search(error.message) is not None
        )


def _message_pattern(message: str, regex: str | None) -> re.Pattern[str]:
    """The message as a pattern: literal text, with its `{{...}}` parts as regexes in `-re` form."""
    if not regex:
        return re.compile(re.escape(message))
    parts = _REGEX_PART.split(message)
    return re.compile("".join(part if i % 2 else re.escape(part) for i, part in enumerate(parts)))


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
