"""Reading and running a pass pipeline, as hir-opt, `Program.compile` and hir-run all do.

`parse_pass_pipeline` builds the passes of a `-p` text such as
`'stream-parallel{p2p-backend=cuda},cse'`, and every mistake in it is a `HostirError`
located in that text (`pass-pipeline:1:col`, the text and a caret), as xDSL locates its
syntax errors: an unknown pass (with hostir's passes listed and the closest names), a
pass whose module does not import, an unknown option, a value of the wrong type, an
option given twice, a value the pass refuses.

`run_passes` applies them, as xDSL's `PassPipeline`, whose callback between two passes
reports on the one that ran and announces the next. A `Pipeline` (a pass made of passes,
`hir-lowering`) runs as its passes, so that what is printed, timed, verified or reported
before or after a pass names the pass that runs, as mlir-opt does for the passes of a
pipeline.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import time
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.arg_spec import (
    ArgSpec,
    PipelineLexer,
    SpecTokenKind,
    _convert_arg_to_type,
    parse_pipeline,
)
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException

from hostir_dialect.text import HostirError, SourceLocation, verify_module
from hostir.passes import HOSTIR_PASSES

PassFactories = Mapping[str, Callable[[], type[ModulePass]]]

# --------------------------------------------------------------------------- #
# Running                                                                      #
# --------------------------------------------------------------------------- #


class Pipeline(ModulePass, ABC):
    """A pass that runs a sequence of passes, each of them a pass of its own to the drivers."""

    @abstractmethod
    def passes(self) -> tuple[ModulePass, ...]: ...

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        run_passes(self.passes(), ctx, op)


def expand(passes: Iterable[ModulePass]) -> tuple[ModulePass, ...]:
    """`passes` with each `Pipeline` replaced by its passes, at every depth."""
    return tuple(
        inner for p in passes for inner in (expand(p.passes()) if isinstance(p, Pipeline) else (p,))
    )


AfterPass = Callable[[ModulePass, ModuleOp, float], None]
"""Called after each pass with the pass, the module and the seconds the pass took."""
BeforePass = Callable[[ModulePass, ModuleOp], None]
"""Called before each pass with the pass and the module."""


def run_passes(
    passes: Iterable[ModulePass],
    ctx: Context,
    module: ModuleOp,
    verify: bool = False,
    after: AfterPass | None = None,
    before: BeforePass | None = None,
) -> None:
    """Applies `passes`, their pipelines expanded, in order (xDSL's `PassPipeline`).

    An xDSL diagnostic raised by a pass becomes a `HostirError` naming the pass. With
    `verify`, the module is verified after each pass, and invalid IR is an error at the
    offending op that names the pass that left it.
    """
    running: list[Any] = [None, 0.0]
    """The pass that runs, and when it started (the callback's time excluded)."""

    def between(done: ModulePass | None, module: ModuleOp, following: ModulePass | None) -> None:
        if done is not None:
            seconds = time.perf_counter() - running[1]
            if verify:
                try:
                    verify_module(module)
                except HostirError as error:
                    raise HostirError(
                        f"pass '{done.name}' produced invalid IR: {error.message}", error.location, error.op_name
                    ) from None
            if after is not None:
                after(done, module, seconds)
        if following is not None:
            if before is not None:
                before(following, module)
            running[:] = [following, time.perf_counter()]

    try:
        PassPipeline(expand(passes), between).apply(ctx, module)
    except DiagnosticException as error:
        raise HostirError(f"pass '{running[0].name}' failed: {error}") from None


# --------------------------------------------------------------------------- #
# Reading                                                                      #
# --------------------------------------------------------------------------- #

PIPELINE_FILE = "pass-pipeline"
"""The file name of a location in the pipeline text, as in xDSL's syntax errors."""


def parse_pass_pipeline(text: str, available: PassFactories) -> tuple[ModulePass, ...]:
    """The passes of the pipeline `text`, built from the factories of `available`.

    Raises a `HostirError` located in `text` at the first mistake; see the module docstring.
    """
    try:
        specs = list(parse_pipeline(text))
    except ArgSpecParseError as error:
        raise pipeline_syntax_error(error) from None
    passes = []
    for spec, place in zip(specs, pipeline_places(text), strict=True):
        if spec.name not in available:
            raise place.error(text, unknown_pass_message(spec.name, available))
        try:
            pass_class = load_pass(spec.name, available[spec.name])
        except HostirError as error:
            raise place.error(text, error.message) from None
        check_pass_options(pass_class, spec, place, text)
        problem = _refusal(pass_class, spec)
        if problem is not None:
            raise place.error(text, f"{spec.name}: {problem}")
        passes.append(pass_class.from_pass_spec(spec))
    return tuple(passes)


def unknown_pass_message(name: str, available: PassFactories) -> str:
    """Names the passes closest to `name`, hostir's passes, and how to list every one."""
    message = f"unknown pass '{name}'"
    close = difflib.get_close_matches(name, list(available), n=3, cutoff=0.75)
    if close:
        message += " (did you mean " + " or ".join(f"'{c}'" for c in close) + "?)"
    hostir = sorted(n for n in available if n in HOSTIR_PASSES)
    others = len(available) - len(hostir)
    return (
        f"{message}; hostir's passes are {', '.join(hostir)}; "
        f"`hir-opt --list-passes` lists them with xDSL's {others} others"
    )


@dataclass
class PassPlace:
    """Where one pass of a pipeline is written: offsets into the pipeline text."""

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
        # The caret stops at the end of the line.
        return HostirError(message, SourceLocation.at_offset(text, PIPELINE_FILE, start, max(1, end - start)))


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


def describe_type(hint: Any) -> str:
    """`bool` -> 'true or false', ...: what an option takes, in words."""
    return _TYPE_NAMES.get(hint, str(hint).replace("typing.", ""))


def _in_users_words(message: str, pass_class: type[ModulePass], spellings: dict[str, str]) -> str:
    """A pass's message with its option fields spelt as the user wrote them (or with dashes)."""
    for field_name in option_fields(pass_class):
        spelling = spellings.get(field_name, field_name.replace("_", "-"))
        message = re.sub(rf"(?<![\w-]){re.escape(field_name)}(?![\w-])", spelling, message)
    return message


def option_fields(pass_class: type[ModulePass]) -> dict[str, dataclasses.Field[Any]]:
    """The options of a pass: the fields of its dataclass."""
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
    fields = option_fields(pass_class)
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
                f"{describe_type(hints[field_name])}, got {got}",
                start,
                end,
            ) from None
        problem = _refusal(pass_class, ArgSpec(name, {key: value}))
        if problem is not None:
            raise place.error(text, f"{name}: {_in_users_words(problem, pass_class, spellings)}", start, end)


def _refusal(pass_class: type[ModulePass], spec: ArgSpec) -> str | None:
    """Why the pass refuses to be built with these options, or None."""
    try:
        pass_class.from_pass_spec(spec)
    except HostirError as error:
        message = error.message
    except ValueError as error:
        message = str(error)
    else:
        return None
    # A pass names itself ("stream-parallel: unknown ..."), or the pass it builds (a
    # pipeline); the caller names the pass the user wrote.
    return re.sub(r"^[\w-]+: ", "", message)


def load_pass(name: str, factory: Callable[[], type[ModulePass]]) -> type[ModulePass]:
    """The pass class; a pass whose module cannot be imported is an error about it alone."""
    try:
        return factory()
    except ImportError as error:
        raise HostirError(f"pass '{name}' is not available: {error}") from None


_PIPELINE_ERROR = re.compile(r"pass-pipeline:(\d+):(\d+)\n(.*)\n.*\n\s*(.*)")
"""xDSL's pipeline syntax error: location, pipeline text, caret line, message."""


def pipeline_syntax_error(error: ArgSpecParseError) -> HostirError:
    """xDSL's error on the pipeline text, as a located error on that text."""
    match = _PIPELINE_ERROR.search(str(error))
    if match is None:
        return HostirError(f"cannot parse the pass pipeline: {error}")
    line, column, text, message = match.groups()
    return HostirError(
        f"cannot parse the pass pipeline: {message}",
        SourceLocation(PIPELINE_FILE, int(line), int(column), text),
    )
