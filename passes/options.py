"""Reading the options of hostir's passes."""

from __future__ import annotations

from enum import Enum

from hostir_dialect.text import HostirError


def check_choice(pass_name: str, option: str, value: str, choices: type[Enum]) -> None:
    """Refuses a value of the option `option` that is none of `choices` (a string enum,
    Python's or xDSL's), naming the pass, the option and the choices. Passes call it when
    they are built (`__post_init__`), so that a bad pipeline fails before it runs;
    `choices(value)` is then the choice."""
    if value not in set(choices):
        raise HostirError(
            f"{pass_name}: unknown {option} '{value}'; expected one of "
            + ", ".join(choice.value for choice in choices)
        )
