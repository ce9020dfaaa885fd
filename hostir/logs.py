"""What hostir says it did: one logger per kind, which `TORCH_LOGS` and `HOSTIR_DUMP` turn on.

| logger | level | what |
|---|---|---|
| `hostir.explain` | INFO | per graph that torch.compile hands hostir: what `hostir.explain` says of it |
| `hostir.pipelining` | INFO | each chain `auto-stream-parallel` pipelines, and each it declines, with the reason |
| `hostir.fusion` | DEBUG | the fusion imported from each graph |
| `hostir.host_ir` | DEBUG | the host program lowered from it |
| `hostir.cuda_kernel` | DEBUG | the CUDA C of each fused kernel, when it is compiled |

They are Python loggers under `hostir`, so torch.compile's usual switch shows them:
`TORCH_LOGS="hostir"` the INFO ones, `TORCH_LOGS="+hostir"` all of them, with torch's
format (TORCH_LOGS takes a package's name as a logger's). `HOSTIR_DUMP` names kinds to
print on stderr without any logging set up (`HOSTIR_DUMP=fusion,host_ir`), as NVFUSER_DUMP
does; a kind whose logger is on is logged instead, once.

Why not torch's named artifacts (`TORCH_LOGS="output_code"`): torch reads TORCH_LOGS when
it is imported, before any backend could register a name, and refuses a name it does not
know, so `TORCH_LOGS="host_ir"` would stop `import torch`; a package's name it takes.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import hostir.config as config

LEVELS = {
    "explain": logging.INFO,
    "pipelining": logging.INFO,
    "fusion": logging.DEBUG,
    "host_ir": logging.DEBUG,
    "cuda_kernel": logging.DEBUG,
}
"""Each kind and the level its logger says it at."""

_recorders: list[tuple[str, list[str]]] = []


def logger(kind: str) -> logging.Logger:
    return logging.getLogger(f"hostir.{kind}")


def wanted(kind: str) -> bool:
    """Whether something would show what is said of `kind`: HOSTIR_DUMP, its logger, a recorder."""
    return kind in config.dump or logger(kind).isEnabledFor(LEVELS[kind]) or any(k == kind for k, _ in _recorders)


def say(kind: str, text: str) -> None:
    """Says `text` on the logger of `kind`, or prints it on stderr where HOSTIR_DUMP alone asks
    for it; within `recorded(kind)`, records it instead."""
    for recorded_kind, texts in reversed(_recorders):
        if recorded_kind == kind:
            texts.append(text)
            return
    log, level = logger(kind), LEVELS[kind]
    if log.isEnabledFor(level):
        log.log(level, "%s", text)
    elif kind in config.dump:
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def recorded(kind: str) -> Iterator[list[str]]:
    """Within: what is said of `kind` is kept in the list yielded, and not said."""
    texts: list[str] = []
    _recorders.append((kind, texts))
    try:
        yield texts
    finally:
        _recorders.pop()
