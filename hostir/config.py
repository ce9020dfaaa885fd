"""hostir's settings: one typed entry each, with its environment variable and its default.

    import hostir.config

    hostir.config.num_streams                      # HOSTIR_NUM_STREAMS, else 4
    hostir.config.timeout_s = 30.0                 # from here on, whatever the environment says
    with hostir.config.patch(dump={"fusion"}):     # within the block only (a test's way)
        ...

A setting read is, in order: the value a `patch` gives it, the value assigned to it, its
environment variable, its default. The variable is read when the setting is read, not when
this module is imported: a rank of `run_on_local_ranks` starts from a server that imported
hostir before the launch, and takes on the launcher's environment only then. A variable
that holds no valid value is an error naming it, when the setting is read.

What a launcher's process sets or patches reaches the ranks it starts: `run_on_local_ranks`
hands them its environment with `environment()`, the variables of the settings it changed
in place of the inherited ones.

torchrun's variables (`RANK`, `WORLD_SIZE`, ...) are settings too, read-only: torchrun sets
them, and `torch.distributed` reads them itself when a process joins its group, so a patch
could only make hostir and torch disagree. `SETTINGS` lists every setting; docs/frontend.md
has the table.

Why not torch's own config modules (`torch._inductor.config`, built with the private
`torch.utils._config_module`): they read their variables once, at import, which a rank
forked from the launch server's preloaded modules would never see change, and they take
only booleans and strings, so a number in a variable would go unchecked.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from hostir_dialect.text import HostirError

T = TypeVar("T")

DUMP_KINDS = ("explain", "pipelining", "fusion", "host_ir", "cuda_kernel")
"""What HOSTIR_DUMP may name: per graph what `hostir.explain` says of it, the pipelining
decisions, the imported fusion, the lowered host program, the CUDA C of each fused kernel
(`hostir.logs`; docs/frontend.md, "Seeing what hostir did")."""

DEFAULT_TIMEOUT_S = 120.0
"""How long a communication may wait for its peers before it fails, unless HOSTIR_TIMEOUT_S says."""
MIN_TIMEOUT_S = 1.0
"""The shortest timeout taken: a communication among healthy peers on a busy machine takes
longer than a millisecond."""
MAX_TIMEOUT_S = 1e9
"""Longer timeouts are taken as this (about 31 years): datetime.timedelta ends near 8.6e13 s."""


def timeout_seconds(text: str) -> float:
    """`text` as a timeout in seconds: a finite number of at least MIN_TIMEOUT_S, or ValueError."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (MIN_TIMEOUT_S <= seconds < math.inf):
        raise ValueError(f"expected a finite number of seconds, at least {MIN_TIMEOUT_S:g}, got '{text}'")
    return min(seconds, MAX_TIMEOUT_S)


def _whole_number(least: int, as_torchrun_sets_it: bool = False) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            what = "as torchrun sets it" if as_torchrun_sets_it else f"at least {least}"
            raise ValueError(f"expected a whole number, {what}, got '{text}'")
        return int(text)

    return parse


def _dump_kinds(text: str) -> frozenset[str]:
    kinds = frozenset(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = kinds - set(DUMP_KINDS)
    if unknown:
        raise ValueError(f"names {sorted(unknown)}; it takes a comma-separated list of {', '.join(DUMP_KINDS)}")
    return kinds


def _text(value: Any) -> str:
    """A value as its environment variable holds it."""
    if isinstance(value, frozenset):
        return ",".join(sorted(value))
    return str(value)


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: its environment variable, its default, and how the variable's text reads."""

    variable: str
    default: T
    parse: Callable[[str], T]
    patchable: bool = True
    """False for torchrun's variables, which torch.distributed reads itself."""

    def read(self, environment: Mapping[str, str]) -> T:
        text = environment.get(self.variable)
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as error:
            raise HostirError(f"{self.variable}: {error}") from None

    def checked(self, value: Any) -> T:
        """`value` given in Python, checked as the variable's text of it would be."""
        if isinstance(self.default, frozenset) and not isinstance(value, str):
            value = ",".join(value)
        try:
            return self.parse(_text(value))
        except ValueError as error:
            raise HostirError(f"{self.variable}: {error}") from None


def _torchrun(variable: str, parse: Callable[[str], Any]) -> Setting[Any]:
    """A variable torchrun sets: read only, None where it is not set."""
    return Setting(variable, None, parse, patchable=False)


SETTINGS: dict[str, Setting[Any]] = {
    # What to print on stderr (hostir.logs), as NVFUSER_DUMP does.
    "dump": Setting("HOSTIR_DUMP", frozenset(), _dump_kinds),
    # The size of the stream pool when `Program.run` is given none.
    "num_streams": Setting("HOSTIR_NUM_STREAMS", 4, _whole_number(1)),
    # How long a communication may wait for its peers.
    "timeout_s": Setting("HOSTIR_TIMEOUT_S", DEFAULT_TIMEOUT_S, timeout_seconds),
    # torchrun's: this process's rank, the ranks, this machine's, the rendezvous.
    "rank": _torchrun("RANK", _whole_number(0, as_torchrun_sets_it=True)),
    "world_size": _torchrun("WORLD_SIZE", _whole_number(1, as_torchrun_sets_it=True)),
    "local_rank": _torchrun("LOCAL_RANK", _whole_number(0, as_torchrun_sets_it=True)),
    "local_world_size": _torchrun("LOCAL_WORLD_SIZE", _whole_number(1, as_torchrun_sets_it=True)),
    "master_addr": _torchrun("MASTER_ADDR", str),
    "master_port": _torchrun("MASTER_PORT", _whole_number(0, as_torchrun_sets_it=True)),
}
"""Every setting by name: the attribute of this module that reads it."""

# The settings as attributes, for type checkers; reading one goes through `_ConfigModule`.
dump: frozenset[str]
num_streams: int
timeout_s: float
rank: int | None
world_size: int | None
local_rank: int | None
local_world_size: int | None
master_addr: str | None
master_port: int | None

_assigned: dict[str, Any] = {}
_patches: list[dict[str, Any]] = []


def _checked_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    checked = {}
    for name, value in changes.items():
        setting = SETTINGS.get(name)
        if setting is None:
            raise AttributeError(f"hostir.config has no setting {name!r}; its settings are {', '.join(SETTINGS)}")
        if not setting.patchable:
            raise AttributeError(
                f"hostir.config.{name} is torchrun's {setting.variable}, which torch.distributed reads "
                "from the environment itself: set the variable"
            )
        checked[name] = setting.checked(value)
    return checked


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Within: the settings named take the values given (as a decorator: while the function runs)."""
    _patches.append(_checked_changes(changes))
    try:
        yield
    finally:
        _patches.pop()


def changed() -> dict[str, Any]:
    """The settings that a patch or an assignment gives a value, with that value."""
    values = dict(_assigned)
    for layer in _patches:
        values.update(layer)
    return values


def environment() -> dict[str, str]:
    """This process's environment, with the variables of the settings changed here set to their
    values: what a process started from here reads the same settings from."""
    return {**os.environ, **{SETTINGS[name].variable: _text(value) for name, value in changed().items()}}


def check() -> None:
    """Reads every setting, so that a variable holding no valid value is an error now, once,
    rather than on every rank when it is first needed."""
    module = sys.modules[__name__]
    for name in SETTINGS:
        getattr(module, name)


def under_torchrun() -> bool:
    """Whether this process is a rank that torchrun (or a launcher like it) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


class _ConfigModule(types.ModuleType):
    """This module, whose settings are read as attributes (see the module docstring)."""

    def __getattr__(self, name: str) -> Any:
        setting = SETTINGS.get(name)
        if setting is None:
            raise AttributeError(f"hostir.config has no setting {name!r}; its settings are {', '.join(SETTINGS)}")
        for layer in reversed(_patches):
            if name in layer:
                return layer[name]
        if name in _assigned:
            return _assigned[name]
        return setting.read(os.environ)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in SETTINGS:
            _assigned.update(_checked_changes({name: value}))
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        """`del hostir.config.num_streams`: the setting reads its variable again."""
        if name in SETTINGS:
            _assigned.pop(name, None)
        else:
            super().__delattr__(name)


sys.modules[__name__].__class__ = _ConfigModule
