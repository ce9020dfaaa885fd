"""`hostir.explain(model, *inputs)`: what hostir does with each graph of a model, as
`torch._dynamo.explain` says what dynamo does.

    explanation = hostir.explain(model, x)                 # on every rank, as the model runs
    print(explanation)                                     # per graph: imported or not, and why
    explanation.fallbacks                                  # the graphs that run as torch eager ops

It compiles the model with the hostir backend and runs it once, forward and, where an
output needs gradients, backward (through `torch.autograd.grad`, so that no `.grad` of the
model or the inputs changes), and returns the explanation of every graph that run compiled
(`hostir.frontend.explanation`). Like `torch._dynamo.explain`, it resets dynamo first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from hostir.frontend.backend import HostirFallbackWarning, backend
from hostir.frontend.explanation import Explanation


def explain(model: Callable[..., Any], *inputs: Any, mode: str | None = None, **options: Any) -> Explanation:
    """Compiles `model` with the hostir backend (`options` and `mode` as `hostir.backend` takes
    them), runs it on `inputs`, and says what hostir did with each graph; see the module docstring."""
    compiler = backend(mode, **options)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=compiler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostirFallbackWarning)  # the explanation says it
        outputs = compiled(*inputs)
        differentiable = [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        parameters = model.parameters() if isinstance(model, nn.Module) else ()
        leaves = [t for t in (*parameters, *tree_leaves(inputs)) if isinstance(t, torch.Tensor) and t.requires_grad]
        if differentiable and leaves:
            torch.autograd.grad(differentiable, leaves, [torch.ones_like(t) for t in differentiable], allow_unused=True)
    return Explanation([explanation for graph in compiler.graphs for explanation in graph.explanations])
