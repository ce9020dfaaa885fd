"""Reading the options of hostir's passes, and describing every pass's options.

A string option with a fixed set of values is checked with `check_choice` when its pass
is built. The check also tells `option_choices` the values, so that `--list-passes`
lists them from the place that enforces them.
"""

from __future__ import annotations

import typing
import warnings
from enum import Enum

from xdsl.passes import ModulePass

from hostir_dialect.text import HostirError

_listening: list[dict[str, tuple[str, ...]]] = []
"""While `option_choices` builds a pass: the choices of each option checked, by option name."""


def check_choice(pass_name: str, option: str, value: str, choices: type[Enum]) -> None:
    """Refuses a value of the option `option` that is none of `choices` (a string enum,
    Python's or xDSL's), naming the pass, the option and the choices. Passes call it when
    they are built (`__post_init__`), so that a bad pipeline fails before it runs;
    `choices(value)` is then the choice."""
    values = tuple(choice.value for choice in choices)
    for heard in _listening:
        heard[option] = values
    if value not in values:
        raise HostirError(f"{pass_name}: unknown {option} '{value}'; expected one of " + ", ".join(values))


def option_choices(pass_class: type[ModulePass]) -> dict[str, tuple[str, ...]]:
    """The values each option of `pass_class` may take, for the options its pass checks with
    `check_choice`: building it with its defaults checks them. A pipeline (`hir-lowering`)
    hands each option to the pass of the same option name, which checks it."""
    heard: dict[str, tuple[str, ...]] = {}
    _listening.append(heard)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a deprecated pass warns its users; this is no use of it
            pass_class()
    except (HostirError, TypeError, ValueError):
        return {}  # a pass with a required option, or one whose defaults it refuses
    finally:
        _listening.pop()
    names = {name for name in typing.get_type_hints(pass_class)}
    return {option: values for option, values in heard.items() if option in names}
