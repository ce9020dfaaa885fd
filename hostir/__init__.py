"""hostir: a compiler and runtime for tensor programs sharded over many GPUs.

    import hostir

    program = hostir.Program.compile(text)                 # lower a fusion, run it on each rank
    outputs = hostir.run_on_local_ranks(fn, 4, *args)      # N local ranks, as torchrun starts them
    model = torch.compile(model, backend="hostir")         # tensor-parallel modules
    print(hostir.explain(model, x))                        # what hostir did with each graph

The names below are hostir's public API; each is imported when first used, so that
`import hostir` costs nothing (`hir-opt` never loads torch's compiler, and `TORCH_LOGS`,
which imports this package to find its loggers, loads nothing else). The package's
modules are `hostir.config` (the settings), `hostir.passes`, `hostir.runtime`,
`hostir.frontend` and `hostir.tools`; the dialects are `hostir_dialect`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hostir.version import __version__

_PUBLIC = {
    "FusionBuilder": "hostir_dialect.builder",
    "HostirError": "hostir_dialect.text",
    "parse_module": "hostir_dialect.text",
    "print_module": "hostir_dialect.text",
    "Program": "hostir.runtime.program",
    "run_on_local_ranks": "hostir.runtime.launch",
    "RankFailed": "hostir.runtime.launch",
    "shard": "hostir.runtime.reference",
    "unshard": "hostir.runtime.reference",
    "reference_outputs": "hostir.runtime.reference",
    "release_captured_graphs": "hostir.runtime.graphs",
    "backend": "hostir.frontend.backend",
    "compiled_graphs": "hostir.frontend.backend",
    "HostirFallbackWarning": "hostir.frontend.backend",
    "explain": "hostir.frontend.explain",
    "Explanation": "hostir.frontend.explanation",
}
"""Each public name and the module it comes from."""

__all__ = ["__version__", "config", *_PUBLIC]

if TYPE_CHECKING:
    from hostir import config
    from hostir.frontend.backend import HostirFallbackWarning, backend, compiled_graphs
    from hostir.frontend.explain import explain
    from hostir.frontend.explanation import Explanation
    from hostir.runtime.graphs import release_captured_graphs
    from hostir.runtime.launch import RankFailed, run_on_local_ranks
    from hostir.runtime.program import Program
    from hostir.runtime.reference import reference_outputs, shard, unshard
    from hostir_dialect.builder import FusionBuilder
    from hostir_dialect.text import HostirError, parse_module, print_module


def __getattr__(name: str) -> Any:
    if name == "config":
        return importlib.import_module("hostir.config")
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hostir' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
