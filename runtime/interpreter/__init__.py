"""The interpreter of host programs, on one rank: `Interpreter(function).run(inputs, context)`.

`core.py` prepares a program into steps through the dispatch table `HANDLERS` and holds
the handlers of func, scf, arith, buffers and streams; `compute.py`, `attention.py` and
`communication.py` hold the handlers of hir's compute, attention and communication ops,
and register them in `HANDLERS` as they are imported, as xDSL's interpreter functions do per
dialect. This package imports them here, so that importing any part of it prepares
every op; they import the core, and the core imports none of them.

`fusion_eval.py` evaluates fusion ops with plain torch (the segments a program runs
eagerly, and the unsharded reference of a fusion), and `aten_calls.py` decodes and makes
the ATen calls of `hir.aten` and `fusion.aten`.
"""

from hostir.runtime.interpreter import attention, communication, compute  # noqa: F401  (their handlers register)
from hostir.runtime.interpreter.core import (
    HANDLERS,
    Environment,
    Interpreter,
    Preparation,
    RunContext,
    Step,
    StepWrapper,
    handles,
)

__all__ = [
    "HANDLERS",
    "Environment",
    "Interpreter",
    "Preparation",
    "RunContext",
    "Step",
    "StepWrapper",
    "handles",
]
