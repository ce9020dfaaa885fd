"""Fixtures shared by the pytest suites."""

from collections.abc import Callable

import pytest
from xdsl.ir import Operation

from hostir_dialect.text import parse_module, print_module


def _check_round_trip(module: Operation | str) -> str:
    """Checks that print is a fixed point of parse-then-print; returns the custom text.

    Custom: print(parse(print(m))) == print(m). Generic: the same with the generic
    printer. And the generic text parses back to the custom text.
    """
    if isinstance(module, str):
        module = parse_module(module)
    custom = print_module(module)
    generic = print_module(module, generic=True)
    assert print_module(parse_module(custom)) == custom
    assert print_module(parse_module(generic), generic=True) == generic
    assert print_module(parse_module(generic)) == custom
    return custom


@pytest.fixture
def assert_round_trips() -> Callable[[Operation | str], str]:
    """`assert_round_trips(module_or_text)`: see `_check_round_trip`."""
    return _check_round_trip
