"""A tensor-parallel Llama-style decoder layer: `torch.compile(backend="hostir")` against torch's own.

    torchrun --nproc-per-node 8 benchmarks/tp_layer.py                 # one rank per GPU, bf16
    torchrun --nproc-per-node 2 benchmarks/tp_layer.py --sizes 4096,1,8192
    python benchmarks/tp_layer.py --smoke                               # 2 local CPU ranks, gloo, f32
    torchrun --nproc-per-node 4 benchmarks/tp_layer.py --breakdown      # and where each step's time goes

The layer is examples/tp_decoder_layer.py's (RMSNorm, attention with causal SDPA, RMSNorm,
SwiGLU MLP), parallelized with torchtitan's plan by `parallelize_module`: QKV and the
MLP's up projections colwise, the output projections rowwise, sequence parallelism on
the norms. Head dim 128 and MLP hidden 3.5 x dim (14336 at dim 4096, 28672 at 8192).
A size is DIM,BATCH,SEQUENCE; every rank holds SEQUENCE / D of each sequence. With
`--layers N` the model is a stack of N such layers, each compiled on its own as torchtitan
compiles its models: torch compiles the layer's code once, and every layer calls the same
graphs with its own parameters; with `--whole` too, the stack is compiled whole, as
`torch.compile(model)` compiles a model: one forward graph and one backward graph.
With `--skip-module-guards` every compiled contender is compiled with
`options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}`: dynamo
no longer checks the modules' attributes at each call, most of torch's host time
before a compiled forward's first kernel (docs/frontend.md, *Host time*). With `--rotary`
the attention turns its queries and keys by torchtitan's rotary embeddings, written in
complex numbers (`examples/tp_decoder_layer.py`'s `rotary`).

For each size, two steps are timed: the forward alone (under `torch.no_grad()`) and the
training step, forward then backward of the output with a fixed random gradient (no
optimizer). The contenders, in one run and in this order, each on its own copy of the
same weights and the same inputs:

  eager DTensor       the parallelized layer run by torch eagerly
  limit               no layer: the layer's GEMMs and attention of one rank, with its
                      shapes, run back to back on local tensors with no communication
                      (`Limit` says which): what a perfect overlap of all communication
                      and free pointwise work would take
  inductor            torch.compile(layer) with inductor
  inductor async-TP   the same with `_micro_pipeline_tp` and symmetric memory for the
                      group: torch's async-TP (CUDA only)
  hostir (nccl)       torch.compile(layer, backend="hostir", options={"backend": "nccl"}):
                      collectives on the process group (NCCL on GPUs, gloo on CPU ranks)
  hostir (cuda)       the same with options={"backend": "cuda"}: the copy engines (CUDA
                      only; what the default, "auto", picks on one host of 2 GPUs with
                      peer access)
  hostir (auto)       torch.compile(layer, backend="hostir"), the default options: on one
                      host of more than 2 GPUs with peer access the copy engines for the
                      all-gathers and NCCL for the reductions (run where that differs
                      from both contenders above)

Before it is timed, every contender's forward output, training-step output, input
gradient and parameter gradients (each rank's shard) are compared with eager DTensor's:
the largest error relative to the largest |eager value|, the slowest rank's. A hostir
contender fails if any of its graphs runs as torch eager ops (hostir's fallback for a
graph it cannot import), whose time would pass for hostir's. Then each
step runs `--warmup` times and `--reps` times timed (CUDA events around the step, after
a barrier; host timers on CPU ranks). A contender's time is the median over the timed
steps of one rank, the slowest rank's median; the ratio is to the limit's.

With `--breakdown`, one more step of each kind runs under `torch.profiler` per contender
and rank, and its time is split (benchmarks/step_breakdown.py): GEMMs, attention,
communication not hidden behind compute, every other kernel (count and time), and host
time with no kernel running; the traces stay in `--output` for Perfetto. The profiler
slows the host down, so on GPUs the steps are also timed with the host ahead of the GPU
(which waits `HOST_AHEAD_MS` before each): the time the GPU waits for its host in a
timed step is the difference, without the profiler.

Rank 0 prints a line per contender as it is measured and rewrites tp_layer.md,
tp_layer.json and tp_layer.png in `--output` (default build/tp_layer, ignored by git)
after each, so that a run cut short leaves what it measured; it prints the tables
(Markdown) at the end. A contender that cannot run here is reported as
unavailable (or skipped), with the reason, and one that raises as failed; the exit
status is 1 when a contender failed or its check did.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import os
import shlex
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.append(str(REPOSITORY))  # examples/ is no installed package; hostir as installed comes first

from examples.tp_decoder_layer import DecoderLayer, parallelize  # noqa: E402
from overlap_report import machine  # noqa: E402
from step_breakdown import STEP, Breakdown, table  # noqa: E402
from hostir.frontend.backend import COPY_ENGINE_REDUCTION_RANKS, compiled_graphs  # noqa: E402
from hostir.runtime.distributed.communicator import Communicator  # noqa: E402
from hostir.runtime.graphs import release_captured_graphs  # noqa: E402
from hostir.runtime.launch import plain_message, run_on_local_ranks  # noqa: E402
from hostir.runtime.distributed.streams import hold_current_stream  # noqa: E402

MLP_RATIO = 3.5
TOLERANCES = {torch.bfloat16: 3e-2, torch.float32: 1e-4}
"""Largest error relative to the largest |eager value| a contender may have."""

EAGER = "eager DTensor"
INDUCTOR = "inductor"
ASYNC_TP = "inductor async-TP"
HOSTIR = "hostir (nccl)"
HOSTIR_CUDA = "hostir (cuda)"
HOSTIR_AUTO = "hostir (auto)"
HOSTIRS = (HOSTIR, HOSTIR_CUDA, HOSTIR_AUTO)
LIMIT = "limit"
CONTENDERS = [EAGER, LIMIT, INDUCTOR, ASYNC_TP, *HOSTIRS]
"""In the order they run: a contender that hangs leaves the ones before it in the report."""
KEYS = dict(zip(["eager", "limit", "inductor", "async-tp", "hostir", "hostir-cuda", "hostir-auto"], CONTENDERS))
"""The contenders' names on the command line (--contenders)."""
STEPS = {"forward": "Forward", "train": "Training step (forward + backward)"}


@dataclass(frozen=True)
class LayerSize:
    dim: int
    batch: int
    sequence: int
    head_dim: int = 128
    layers: int = 1
    """Layers of the model, each compiled on its own (`--layers`)."""
    whole: bool = False
    """Whether a stack of layers is compiled whole rather than layer by layer (`--whole`)."""
    module_guards: bool = True
    """Whether dynamo guards the modules' attributes at each call (`--skip-module-guards`: not)."""
    rotary: bool = False
    """Whether the attention has torchtitan's rotary embeddings, in complex numbers (`--rotary`)."""

    @property
    def heads(self) -> int:
        return self.dim // self.head_dim

    @property
    def hidden(self) -> int:
        return int(self.dim * MLP_RATIO)

    @property
    def label(self) -> str:
        compiled = "whole" if self.whole else "one by one"
        layers = f", {self.layers} layers compiled {compiled}" if self.layers > 1 else ""
        guards = "" if self.module_guards else ", no module guards"
        rotary = ", rotary" if self.rotary else ""
        return f"dim {self.dim}, {self.batch} x {self.sequence} tokens{rotary}{layers}{guards}"

    def check(self, world: int) -> None:
        """Exits with a message where `world` ranks cannot split this size."""
        where = f"size {self.dim},{self.batch},{self.sequence} (head dim {self.head_dim})"
        if self.dim % self.head_dim:
            raise SystemExit(f"{where}: dim is not a multiple of the head dim")
        for what, extent in (("heads", self.heads), ("MLP hidden", self.hidden), ("sequence", self.sequence)):
            if extent == 0 or extent % world:
                raise SystemExit(f"{where}: {what} {extent} is not a multiple of the {world} ranks")


DEFAULT_SIZES = [LayerSize(4096, 1, 8192), LayerSize(4096, 2, 8192), LayerSize(8192, 1, 8192), LayerSize(8192, 2, 8192)]
"""The GPU sizes: hidden 4096 and 8192, 8192 and 16384 tokens as sequences of 8192."""
SMOKE_SIZES = [LayerSize(64, 2, 16, head_dim=16)]


@dataclass
class Result:
    """One contender and step at one size, as the ranks agreed on it."""

    size: LayerSize
    step: str
    contender: str
    status: str = "ok"
    """ok, or why there is no time: `unavailable: ...`, `failed: ...`."""
    ms: float | None = None
    """The slowest rank's median step time, each step started from an idle GPU (`median_ms`)."""
    rank_ms: list[float] = field(default_factory=list)
    """Each rank's median."""
    errors: dict[str, float] = field(default_factory=dict)
    """Largest error against eager DTensor of each checked tensor, the slowest rank's."""
    tolerance: float | None = None
    first_s: float | None = None
    """The slowest rank's wall time of the contender's first forward and first training step
    together (the checked ones): its compilation, for torch.compile's backends."""
    breakdown: list[dict] = field(default_factory=list)
    """With --breakdown: each rank's `Breakdown` of one profiled step, in rank order."""
    host_ahead_ms: list[float] = field(default_factory=list)
    """With --breakdown on GPUs: each rank's median step time with the GPU held before each
    step until the host has issued it (`median_ms`'s `host_ahead`): `rank_ms` minus it is
    `hold_gain`."""
    loop_ms: float | None = None
    """The slowest rank's median step time with the steps back to back, as a training loop
    runs them (`back_to_back_ms`)."""
    loop_rank_ms: list[float] = field(default_factory=list)
    """Each rank's median back to back."""

    @property
    def check_ok(self) -> bool | None:
        return None if not self.errors else max(self.errors.values()) <= self.tolerance


# --------------------------------------------------------------------------- #
# The contenders                                                               #
# --------------------------------------------------------------------------- #


def unavailable_reason(contender: str, device: torch.device, world: int) -> str | None:
    """Why `contender` cannot run on this machine, or None."""
    if contender in (ASYNC_TP, HOSTIR_CUDA) and device.type != "cuda":
        what = "async-TP needs CUDA GPUs and symmetric memory" if contender == ASYNC_TP else "the copy engines are CUDA's"
        return f"unavailable: {what}"
    if contender == HOSTIR_AUTO and device.type != "cuda":
        return "unavailable: on CPU ranks auto lowers for the process group, which hostir (nccl) measures"
    if contender == HOSTIR_AUTO and world <= COPY_ENGINE_REDUCTION_RANKS:
        return f"skipped: on {world} GPUs auto takes the copy engines throughout, which hostir (cuda) measures"
    if contender == INDUCTOR and device.type == "cpu":
        from torch._inductor import cpp_builder

        compiler = cpp_builder.get_cpp_compiler()
        if shutil.which(compiler) is None:
            return f"unavailable: inductor on the CPU needs a C++ compiler ({compiler} is not on PATH)"
    return None


def model_of(size: LayerSize, dtype: torch.dtype) -> nn.Module:
    """The layer at `size`, or a stack of `size.layers` of them, on the current device."""
    positions = size.sequence if size.rotary else 0
    layers = [DecoderLayer(size.dim, size.heads, size.hidden, positions).to(dtype) for _ in range(size.layers)]
    return layers[0] if size.layers == 1 else nn.Sequential(*layers)


def parallelized(model: nn.Module, mesh) -> nn.Module:
    """`model_of`'s model with torchtitan's plan applied to each layer."""
    if isinstance(model, nn.Sequential):
        for layer in model:
            parallelize(layer, mesh)
        return model
    return parallelize(model, mesh)


def compile_options(contender: str, mesh, module_guards: bool = True) -> dict[str, Any]:
    """The arguments of `torch.compile` for `contender`, which is not eager; without
    `module_guards`, with the guard filter that skips dynamo's guards on the modules."""
    options = backend_options(contender, mesh)
    if module_guards:
        return options
    guard_filter = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    return {**options, "options": {**options.get("options", {}), **guard_filter}}


def backend_options(contender: str, mesh) -> dict[str, Any]:
    """The backend of `contender`, which is not eager, and its options."""
    if contender == INDUCTOR:
        return {"backend": "inductor"}
    if contender == ASYNC_TP:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated in torch 2.13, needed before it
            enable_symm_mem_for_group(mesh.get_group().group_name)
        return {"backend": "inductor", "options": {"_micro_pipeline_tp": True}}
    if contender == HOSTIR:
        return {"backend": "hostir", "options": {"backend": "nccl"}}
    if contender == HOSTIR_CUDA:
        return {"backend": "hostir", "options": {"backend": "cuda"}}
    if contender == HOSTIR_AUTO:
        return {"backend": "hostir"}
    raise ValueError(contender)


def wrap(contender: str, layer: nn.Module, mesh, whole: bool = False, module_guards: bool = True) -> nn.Module:
    """The contender's callable of `layer` (its own copy): a stack of layers is compiled layer by
    layer, as torchtitan compiles its models, or `whole`; without `module_guards`, dynamo
    does not guard the modules (`compile_options`). The caller resets dynamo after each
    contender: none reuses another's graphs or counts against another's recompile limit."""
    if contender == EAGER:
        return layer
    options = compile_options(contender, mesh, module_guards)
    if isinstance(layer, nn.Sequential) and not whole:
        for block in layer:
            block.compile(**options)
        return layer
    return torch.compile(layer, **options)


@dataclass
class Inputs:
    """One rank's input (its slice of the sequence) and the gradient of the output."""

    x: torch.Tensor
    grad_output: torch.Tensor


def forward_step(model: nn.Module, inputs: Inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(inputs.x)


def train_step(model: nn.Module, inputs: Inputs, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward, then backward of the output with `grad_output`; the output and the input's gradient.
    The gradients of the step before are dropped, so none is accumulated."""
    for parameter in layer.parameters():
        parameter.grad = None
    x = inputs.x.detach().requires_grad_()
    out = model(x)
    out.backward(inputs.grad_output)
    return out, x.grad


def local_gradients(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.to_local() for name, p in layer.named_parameters()}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.abs().max().float().item()
    return (actual.float() - expected.float()).abs().max().item() / max(scale, 1e-12)


@dataclass
class Limit:
    """The operands of one rank's GEMMs and attention, with the shapes of the parallelized layer.

    Per rank, with T = batch x sequence tokens and D ranks: the q, k and v projections
    [T, dim] x [dim, dim/D], attention over heads/D heads of the whole sequence (causal SDPA),
    the output projection [T, dim/D] x [dim/D, dim], w1 and w3 [T, dim] x [dim, hidden/D],
    and w2 [T, hidden/D] x [hidden/D, dim]: the GEMMs of the layer's forward after its
    all-gathers (which gather the sequence) and before its reduce-scatters. The training
    step adds, for each of the 7 projections Y = X W^T, dX = dY W and dW = dY^T X, and
    attention's backward. Norms, SiLU, the products and the residual adds are left out,
    and so is all communication.
    """

    x: torch.Tensor
    attention_weights: list[torch.Tensor]
    wo: torch.Tensor
    up_weights: list[torch.Tensor]
    w2: torch.Tensor
    o: torch.Tensor
    h: torch.Tensor
    grad_y: torch.Tensor
    size: LayerSize

    @classmethod
    def of(cls, size: LayerSize, world: int, dtype: torch.dtype, device: torch.device) -> Limit:
        tokens = size.batch * size.sequence
        return cls(**cls.operands(size, tokens, size.dim // world, size.hidden // world, dtype, device))

    @staticmethod
    def operands(
        size: LayerSize, tokens: int, width: int, hidden: int, dtype: torch.dtype, device: torch.device
    ) -> dict[str, Any]:
        """Random operands for `tokens` rows: of the q, k and v projections to `width` columns
        (the rank's heads), of the output projection from them, and of the MLP's to `hidden`."""
        dim = size.dim

        def random(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, dtype=dtype, device=device) * shape[-1] ** -0.5

        return dict(
            x=random(tokens, dim),
            attention_weights=[random(width, dim) for _ in range(3)],
            wo=random(dim, width),
            up_weights=[random(hidden, dim) for _ in range(2)],
            w2=random(dim, hidden),
            o=random(tokens, width),
            h=random(tokens, hidden),
            grad_y=random(tokens, dim),
            size=size,
        )

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """[T, heads x head_dim] as SDPA's [batch, heads, rows, head_dim]."""
        size = self.size
        return t.view(size.batch, -1, t.shape[-1] // size.head_dim, size.head_dim).transpose(1, 2)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        """The rank's attention calls: causal SDPA over its heads of the whole sequence."""
        return [F.scaled_dot_product_attention(q, k, v, is_causal=True)]

    def forward(self, grad: bool = False):
        q, k, v = (self.heads(F.linear(self.x, w)).requires_grad_(grad) for w in self.attention_weights)
        attention = self.attend(q, k, v)
        F.linear(self.o, self.wo)
        for w in self.up_weights:
            F.linear(self.x, w)
        F.linear(self.h, self.w2)
        return (q, k, v), attention

    def forward_step(self) -> None:
        with torch.no_grad():
            for _ in range(self.size.layers):
                self.forward()

    def train_step(self) -> None:
        for _ in range(self.size.layers):
            self.layer_train_step()

    def layer_train_step(self) -> None:
        qkv, attention = self.forward(grad=True)
        grad_attention = self.heads(self.o)
        torch.autograd.grad(attention, qkv, [grad_attention[..., : a.shape[-2], :] for a in attention])
        with torch.no_grad():
            for x, w, grad_y in [
                *((self.x, w, self.o) for w in self.attention_weights),
                (self.o, self.wo, self.grad_y),
                *((self.x, w, self.h) for w in self.up_weights),
                (self.h, self.w2, self.grad_y),
            ]:
                grad_y @ w  # dX = dY W
                grad_y.t() @ x  # dW = dY^T X


# --------------------------------------------------------------------------- #
# Timing                                                                       #
# --------------------------------------------------------------------------- #


HOST_AHEAD_MS = 30.0
"""How long the GPU waits before a step timed with the host ahead (`median_ms`'s `host_ahead`):
longer than any contender's host takes to issue a step."""


def median_ms(
    step: Callable[[], object], device: torch.device, warmup: int, reps: int, host_ahead: bool = False
) -> float:
    """This rank's median time of `step` over `reps` runs after `warmup`, each run started after a
    barrier. With `host_ahead` (GPUs), the GPU waits before each run until the host has issued
    it (`hold_current_stream`): the time is the GPU's alone, none of it spent waiting for the host."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            dist.barrier()
            if host_ahead:
                hold_current_stream(device, HOST_AHEAD_MS)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            dist.barrier()
            began = time.perf_counter()
            step()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def back_to_back_ms(step: Callable[[], object], device: torch.device, reps: int) -> float:
    """This rank's median time of `step` over `reps` runs issued back to back, as a training
    loop issues its steps: the host issues a step while the GPU runs the one before, so a
    step's time is the GPU's unless the host falls behind. The ranks start together, once."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    if device.type != "cuda":
        marks = [time.perf_counter()]
        for _ in range(reps):
            step()
            marks.append(time.perf_counter())
        return statistics.median((b - a) * 1e3 for a, b in zip(marks, marks[1:]))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    events[0].record()
    for event in events[1:]:
        step()
        event.record()
    events[-1].synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(events, events[1:]))


def gathered(value):
    """Every rank's `value`, in rank order."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def agreed_status(status: str) -> str:
    """The first rank's failure, if any rank failed, so that every rank goes on alike."""
    return next((s for s in gathered(status) if s != "ok"), "ok")


# --------------------------------------------------------------------------- #
# One size on one rank                                                         #
# --------------------------------------------------------------------------- #


def measure_size(
    size: LayerSize,
    contenders: list[str],
    config: dict,
    device: torch.device,
    mesh,
    results: list[Result],
    measured: Callable[[], None],
) -> None:
    """Adds every contender at `size` to `results`, as the ranks agreed on it, calling `measured`
    after each; eager DTensor runs first: it is the reference of the checks."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, config["dtype"])
    tolerance = TOLERANCES[dtype]
    warmup, reps = config["warmup"], config["reps"]
    torch.manual_seed(config["seed"])
    with torch.device(device):
        base = model_of(size, dtype)
        x = torch.randn(size.batch, size.sequence, size.dim, dtype=dtype)
        grad_output = torch.randn(size.batch, size.sequence, size.dim, dtype=dtype)
    inputs = Inputs(x.chunk(world, dim=1)[rank].contiguous(), grad_output.chunk(world, dim=1)[rank].contiguous())
    del x, grad_output
    expected: dict[str, dict[str, torch.Tensor]] = {}
    for contender in contenders:
        status = config["skip"].get(contender) or unavailable_reason(contender, device, world) or "ok"
        if contender == LIMIT:
            limit = functools.partial(Limit.of, size, world, dtype, device)
            measure = functools.partial(measure_limit, limit, device, warmup, reps)
        else:
            traces = Path(config["output"]) if config["breakdown"] else None
            measure = functools.partial(
                measure_layer, contender, base, mesh, inputs, expected, warmup, reps, traces, size.whole, size.module_guards
            )
        results += contender_results(size, contender, status, measure, tolerance, device)
        measured()


Measured = tuple[
    dict[str, tuple[list[float], list[float]]],
    dict[str, dict[str, float]],
    "float | None",
    dict[str, tuple[list[dict], list[float]]],
]
"""A contender's every rank's medians of each step (`step_times`), the slowest rank's error of each checked
tensor, the slowest rank's time of the first (checked) steps, and each step's breakdowns
(`measure_layer`)."""


def measure_limit(limit: Callable[[], Any], device: torch.device, warmup: int, reps: int) -> Measured:
    """Every rank's median of the steps of the `limit()` made (its `forward_step` and `train_step`)."""
    made = limit()
    return step_times({"forward": made.forward_step, "train": made.train_step}, device, warmup, reps), {}, None, {}


def contender_results(
    size: LayerSize,
    contender: str,
    status: str,
    measure: Callable[[], Measured],
    tolerance: float,
    device: torch.device,
) -> list[Result]:
    """Each step's result of `contender` at `size`, as the ranks agreed on it: where `status` is
    "ok", what `measure()` measured or how it failed; what it compiled and allocated goes before
    the next contender runs."""
    if status == "ok":
        try:
            times, errors, first_s, breakdowns = measure()
        except Exception as error:  # noqa: BLE001  (reported, and the run goes on)
            status = f"failed: {plain_message(error)}"
        finally:
            torch._dynamo.reset()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        status = agreed_status(status)
    results = []
    for step in STEPS:
        result = Result(size, step, contender, tolerance=tolerance, status=status)
        if status == "ok":
            (result.rank_ms, result.loop_rank_ms), result.errors = times[step], errors.get(step, {})
            result.ms, result.loop_ms, result.first_s = max(result.rank_ms), max(result.loop_rank_ms), first_s
            result.breakdown, result.host_ahead_ms = breakdowns.get(step, ([], []))
        results.append(result)
    return results


def step_times(
    steps: dict[str, Callable[[], object]], device: torch.device, warmup: int, reps: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Every rank's median of each step, started from an idle GPU and back to back."""
    return {
        step: (gathered(median_ms(run, device, warmup, reps)), gathered(back_to_back_ms(run, device, reps)))
        for step, run in steps.items()
    }


def slowest_errors(errors: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """For each step, the largest of the ranks' errors of each checked tensor."""
    return {
        step: {name: max(values) for name, values in zip(what, zip(*gathered(list(what.values()))))}
        for step, what in errors.items()
    }


def measure_layer(
    contender: str,
    base: nn.Module,
    mesh,
    inputs: Inputs,
    expected: dict[str, dict[str, torch.Tensor]],
    warmup: int,
    reps: int,
    traces: Path | None = None,
    whole: bool = False,
    module_guards: bool = True,
) -> Measured:
    """A copy of `base` parallelized and run by `contender`: every rank's median of each step, the
    slowest rank's error of each checked tensor, the slowest rank's time of the first (checked)
    steps, and with `traces` (a folder for the trace files) every rank's breakdown of each step
    and, on GPUs, its median with the host ahead (`median_ms`)."""
    layer = parallelized(copy.deepcopy(base), mesh)
    earlier_graphs = set(compiled_graphs())
    model = wrap(contender, layer, mesh, whole, module_guards)
    began = time.perf_counter()
    errors = check(model, layer, inputs, expected, reference=contender == EAGER)
    first_s = max(gathered(time.perf_counter() - began))
    if contender in HOSTIRS:
        check_ran_on_hostir([graph for graph in compiled_graphs() if graph not in earlier_graphs])
    errors = slowest_errors(errors)
    steps = {"forward": lambda: forward_step(model, inputs), "train": lambda: train_step(model, inputs, layer)}
    device = inputs.x.device
    times = step_times(steps, device, warmup, reps)
    breakdowns = {}
    if traces is not None:
        layers = f"-l{len(layer)}{'-whole' if whole else ''}" if isinstance(layer, nn.Sequential) else ""
        guards = "" if module_guards else "-no-module-guards"
        size = f"d{layer_dim(layer)}-b{inputs.x.shape[0]}-s{inputs.x.shape[1] * dist.get_world_size()}{layers}{guards}"
        breakdowns = step_breakdowns(steps, device, reps, traces / f"trace-{size}-{key_of(KEYS, contender)}")
    return times, errors, first_s, breakdowns


def key_of(keys: dict[str, str], contender: str) -> str:
    """The command-line key of `contender` in `keys` (key -> contender), which its trace files are named by."""
    return next(key for key, named in keys.items() if named == contender)


def step_breakdowns(
    steps: dict[str, Callable[[], object]], device: torch.device, reps: int, stem: Path
) -> dict[str, tuple[list[dict], list[float]]]:
    """Each step's breakdown on every rank (`profiled`, its trace `stem`-`step`-rank`r`.json),
    and on GPUs every rank's median with the GPU held first (`median_ms`'s `host_ahead`)."""
    breakdowns = {}
    for step, run in steps.items():
        path = stem.with_name(f"{stem.name}-{step}-rank{dist.get_rank()}.json")
        ahead = median_ms(run, device, 0, reps, host_ahead=True) if device.type == "cuda" else None
        breakdowns[step] = (gathered(asdict(profiled(run, device, path))), [] if ahead is None else gathered(ahead))
    return breakdowns


def layer_dim(layer: nn.Module) -> int:
    return next(p for p in layer.parameters()).shape[-1]


def profiled(step: Callable[[], object], device: torch.device, path: Path) -> Breakdown:
    """The breakdown of one run of `step` (already warm), whose trace is written to `path`
    (Chrome's format: Perfetto opens it). The ranks start it together, as a timed step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    with profile(activities=activities) as profiler:
        with record_function(STEP):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    profiler.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return Breakdown.of_trace(events, device.type)


def check_ran_on_hostir(graphs: list) -> None:
    """Raises unless the backend compiled `graphs`, a hostir contender's, and every one of them
    runs as a host program: one that hostir could not import runs as torch eager ops (its
    `compiled` value None)."""
    if not graphs:
        raise RuntimeError("hostir compiled no graph: the layer ran as torch eager ops")
    eager = [graph.name for graph in graphs if None in graph.compiled.values()]
    if eager:
        raise RuntimeError(f"hostir ran graph(s) {', '.join(eager)} as torch eager ops, not importing them")


def progress(outcome: list[Result]) -> str:
    """One line on a contender at one size (a result per step), as it is measured."""
    first = outcome[0]
    line = f"# {first.size.label}: {first.contender}: "
    if first.status != "ok":
        return line + first.status
    line += ", ".join(
        f"{r.step} {r.ms:.3f} ms ({r.loop_ms:.3f} back to back)" + ("" if r.check_ok is not False else " WRONG")
        for r in outcome
    )
    return line + ("" if first.first_s is None else f" (first steps {first.first_s:.1f} s)")


def check(
    model: nn.Module,
    layer: nn.Module,
    inputs: Inputs,
    expected: dict[str, dict[str, torch.Tensor]],
    reference: bool = False,
) -> dict[str, dict[str, float]]:
    """This rank's errors against eager DTensor per step; eager's run (`reference`) fills `expected`."""
    if not reference and not expected:
        raise RuntimeError("nothing to check against: eager DTensor did not run")
    errors: dict[str, dict[str, float]] = {}
    steps = {"forward": lambda: {"output": forward_step(model, inputs)}, "train": lambda: train_outputs(model, inputs, layer)}
    for step, run in steps.items():
        actual = run()
        if reference:
            expected[step] = {name: t.detach().clone() for name, t in actual.items()}
        # Compared at once: a replayed CUDA graph may write its next run's results into the same memory.
        errors[step] = {name: relative_error(t, expected[step][name]) for name, t in actual.items()}
    return errors


def train_outputs(model: nn.Module, inputs: Inputs, layer: nn.Module) -> dict[str, torch.Tensor]:
    out, grad_x = train_step(model, inputs, layer)
    return {"output": out, "input gradient": grad_x, **{f"{name} gradient": g for name, g in local_gradients(layer).items()}}


def run_rank(sizes: list[LayerSize], contenders: list[str], config: dict, output: Path, command: str) -> int:
    """Every size on this rank. Rank 0 prints a line per contender and rewrites the report after
    each, so that a run cut short leaves what it measured; at the end it prints the tables and
    returns the exit status."""
    return run_sizes(measure_size, "tp_layer", sizes, contenders, config, output, command)


def run_sizes(
    measure_size: Callable[..., None],
    name: str,
    sizes: list[LayerSize],
    contenders: list[str],
    config: dict,
    output: Path,
    command: str,
) -> int:
    """`measure_size(size, contenders, config, device, mesh, results, measured)` for every size on
    this rank, on a mesh of every rank; rank 0 prints a line per contender and rewrites the
    report (`name`.md, ...) after each; at the end it prints the tables and returns the exit status."""
    from torch.distributed.device_mesh import init_device_mesh

    communicator = Communicator.from_env()
    device = communicator.device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    info = machine(communicator)
    results: list[Result] = []

    def measured() -> None:
        if dist.get_rank() == 0:
            print(progress(results[-len(STEPS) :]), flush=True)
            report(results, info, config, output, command, name)

    for size in sizes:
        measure_size(size, contenders, config, device, mesh, results, measured)
    if dist.get_rank() != 0:
        return 0
    print(tables(results, info, config, command), flush=True)
    print(f"# wrote {output / f'{name}.md'}, {name}.json and {name}.png", flush=True)
    return exit_status(results)


# --------------------------------------------------------------------------- #
# The report (rank 0)                                                          #
# --------------------------------------------------------------------------- #


def ratio(result: Result, results: list[Result], back_to_back: bool = False) -> float | None:
    """`result`'s time over the limit's at its size and step (its steps back to back, or not)."""
    time_of = (lambda r: r.loop_ms) if back_to_back else (lambda r: r.ms)
    same = (result.size, result.step, LIMIT)
    limit = next((time_of(r) for r in results if (r.size, r.step, r.contender) == same), None)
    return None if time_of(result) is None or not limit else time_of(result) / limit


def describe_machine(info: dict) -> str:
    device = info.get("gpu", "CPU")
    versions = ", ".join(f"{name} {info[name]}" for name in ("torch", "cuda", "nccl") if name in info)
    return f"{info['ranks']} x {device} ({info['backend']}; {versions}; commit {info.get('hostir_commit')})"


def tables(results: list[Result], info: dict, config: dict, command: str) -> str:
    """Per step, sizes by contenders: `median ms (ratio to the limit)`; then the checks against
    `config["reference"]` (default eager DTensor); then the notes."""
    contenders = list(dict.fromkeys(r.contender for r in results))
    sizes = list(dict.fromkeys(r.size for r in results))
    notes: dict[str, str] = {}

    def note(status: str) -> str:
        mark = notes.setdefault(status, str(len(notes) + 1))
        return f"{status.split(':')[0]} [{mark}]"

    def find(size, step, contender) -> Result | None:
        """None for a contender not measured yet at `size` (in a report written during the run)."""
        return next((r for r in results if (r.size, r.step, r.contender) == (size, step, contender)), None)

    def time_cell(result: Result | None, back_to_back: bool) -> str:
        """`ms (ratio to the limit)` of one timing, or why there is none."""
        if result is None:
            return ""
        if result.ms is None:
            return note(result.status)
        ms = result.loop_ms if back_to_back else result.ms
        if ms is None:
            return ""
        r = ratio(result, results, back_to_back)
        text = f"{ms:.3f}" + (f" ({r:.2f}x)" if r is not None and result.contender != LIMIT else "")
        return text + (" WRONG" if result.check_ok is False else "")

    sections = [
        f"Machine: {describe_machine(info)}",
        f"Command: `{command}`",
        f"{config['dtype']}, median of {config['reps']} steps after {config['warmup']}, the slowest rank's: each "
        "step from an idle GPU (synchronized, the ranks met at a barrier), and the same steps "
        "issued back to back",
    ]
    timings = {False: "each from an idle GPU", True: "back to back, as a training loop runs them"}
    if not any(r.loop_ms is not None for r in results):
        del timings[True]
    for step, title in STEPS.items():
        for back_to_back, how in timings.items():
            header = "| size | " + " | ".join(contenders) + " |"
            rows = [f"### {title}, {how} (median ms, ratio to the limit)", "", header]
            rows.append("|---" * (len(contenders) + 1) + "|")
            for size in sizes:
                cells = [time_cell(find(size, step, contender), back_to_back) for contender in contenders]
                rows.append(f"| {size.label} | " + " | ".join(cells) + " |")
            sections.append("\n".join(rows))
    checked = [c for c in contenders if c != LIMIT]
    rows = [
        f"### Checks against {config.get('reference', EAGER)} (largest error relative to its largest |value|)",
        "",
        "| size | step | " + " | ".join(checked) + " |",
        "|---" * (len(checked) + 2) + "|",
    ]
    for size in sizes:
        for step in STEPS:
            cells = []
            for contender in checked:
                result = find(size, step, contender)
                if result is None or not result.errors:
                    cells.append(note(result.status) if result and result.status != "ok" else "")
                    continue
                cells.append(f"{max(result.errors.values()):.1e} {'ok' if result.check_ok else 'WRONG'}")
            rows.append(f"| {size.label} | {step} | " + " | ".join(cells) + " |")
    sections.append("\n".join(rows))
    tolerance = ", ".join(f"{str(d).removeprefix('torch.')} {t:g}" for d, t in TOLERANCES.items())
    gradients = config.get("parameter_gradients", "each rank's shard")
    sections.append(
        "Training step: the output, the input's gradient and every parameter's gradient "
        f"({gradients}); forward: the output. Tolerance: {tolerance}."
    )
    sections += breakdown_sections(results, sizes)
    if notes:
        sections.append("\n".join(f"[{mark}] {status}" for status, mark in notes.items()))
    return "\n\n".join(sections) + "\n"


def hold_gain(result: Result, rank: int) -> float | None:
    """How much shorter `rank`'s step was with its GPU held 30 ms first, until the host had
    issued the step: its median from an idle GPU minus its median held (GPUs; None on CPU
    ranks). Not the GPU waiting for the host: a hold longer than the host takes to issue the
    step still shortens it, and the steps back to back are no shorter than from idle."""
    if not result.host_ahead_ms:
        return None
    return result.rank_ms[rank] - result.host_ahead_ms[rank]


def breakdown_sections(results: list[Result], sizes: list[LayerSize]) -> list[str]:
    """Per size and step with breakdowns (--breakdown): a row per contender and rank, then each
    contender's other kernels that take the most time on rank 0, and its longest idle gaps."""
    sections = []
    for size in sizes:
        for step, title in STEPS.items():
            measured = [r for r in results if r.size == size and r.step == step and r.breakdown]
            if not measured:
                continue
            rows = [
                (f"{r.contender}, {rank}", Breakdown(**b), hold_gain(r, rank))
                for r in measured
                for rank, b in enumerate(r.breakdown)
            ]
            lines = [f"### Where the time goes: {title}, {size.label} (ms)", "", table(rows), ""]
            rank_0 = [(r.contender, Breakdown(**r.breakdown[0])) for r in measured]
            for contender, breakdown in rank_0:
                if breakdown.top_other:
                    named = "; ".join(f"{name[:60]} x{count} {ms:.3f}" for name, count, ms in breakdown.top_other[:5])
                    lines.append(f"- {contender}, rank 0, other kernels: {named}")
            for contender, breakdown in rank_0:
                if breakdown.longest_gaps:
                    gaps = breakdown.longest_gaps
                    named = "; ".join(f"{ms:.3f} after {before[:40]}, before {after[:40]}" for ms, before, after in gaps)
                    lines.append(f"- {contender}, rank 0, longest idle gaps: {named}")
            sections.append("\n".join(lines))
    return sections


STYLES = [dict(marker=m, linestyle=s) for m, s in zip("osD^vP", ["-", "-.", ":", "-", "-.", ":"])]


def plot(results: list[Result], info: dict, path: Path) -> None:
    """Time against size, a panel per step; none, with the reason printed, without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        print("# no PNG: matplotlib is not installed (pip install matplotlib)", flush=True)
        return
    sizes = list(dict.fromkeys(r.size for r in results))
    contenders = list(dict.fromkeys(r.contender for r in results))
    figure, axes = pyplot.subplots(1, len(STEPS), figsize=(12, 5.5), squeeze=False)
    for axis, (step, title) in zip(axes[0], STEPS.items()):
        for index, contender in enumerate(contenders):
            points = [
                (sizes.index(r.size), r.ms)
                for r in results
                if r.step == step and r.contender == contender and r.ms is not None
            ]
            style = dict(color="black", linestyle="--", marker="x") if contender == LIMIT else STYLES[index % len(STYLES)]
            # Every contender has its entry in the legend; one without points says so.
            label = contender if points else f"{contender} (not run)"
            axis.plot(*(zip(*points) if points else ([], [])), label=label, **style)
        axis.set_xticks(range(len(sizes)), [f"dim {s.dim}\n{s.batch} x {s.sequence}" for s in sizes], fontsize=8)
        axis.set_xlabel("size (dim, batch x sequence)")
        axis.set_ylabel("ms (median, slowest rank)")
        axis.set_title(title, fontsize=10)
        axis.set_ylim(bottom=0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncols=3, fontsize=8, frameon=False)
    figure.suptitle(describe_machine(info), fontsize=9)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def report(
    results: list[Result],
    info: dict,
    config: dict,
    output: Path,
    command: str,
    name: str = "tp_layer",
) -> None:
    """Writes `name`.md, .json and .png into `output` (tp_layer.md, ...)."""
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{name}.md").write_text(tables(results, info, config, command))
    document = {
        "machine": info,
        "command": command,
        "config": config,
        "results": [
            {
                **asdict(r),
                "ratio_to_limit": ratio(r, results),
                "loop_ratio_to_limit": ratio(r, results, back_to_back=True),
                "check_ok": r.check_ok,
            }
            for r in results
        ],
    }
    (output / f"{name}.json").write_text(json.dumps(document, indent=1) + "\n")
    plot(results, info, output / f"{name}.png")


# --------------------------------------------------------------------------- #
# Command line                                                                 #
# --------------------------------------------------------------------------- #


def parse_sizes(text: str, head_dim: int, kind: type[LayerSize] = LayerSize) -> list[LayerSize]:
    """The sizes of `--sizes`, as `kind`s."""
    sizes = []
    for spec in filter(None, (s.strip() for s in text.split(";"))):
        try:
            dim, batch, sequence = (int(v) for v in spec.split(","))
        except ValueError:
            raise ValueError(f"size {spec!r}: write DIM,BATCH,SEQUENCE") from None
        sizes.append(kind(dim, batch, sequence, head_dim))
    return sizes


def layer_parser(
    doc: str, name: str, keys: dict[str, str], reps: int, sizes: str, contenders: str
) -> argparse.ArgumentParser:
    """The options a layer benchmark shares (`doc`: its module's): its report in build/`name`,
    its contenders' `keys`, `reps` timed steps, the default `sizes`, a word on `contenders`."""
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="CPU ranks, gloo, f32, tiny sizes: CI's smoke test")
    parser.add_argument("--sizes", help=f"'DIM,BATCH,SEQUENCE;...' (default: {sizes})")
    parser.add_argument("--head-dim", type=int, help="default 128; --smoke: 16")
    parser.add_argument("--contenders", help=f"comma list among {','.join(keys)} (default: all{contenders})")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], help="default bfloat16 on GPUs, float32 on CPU")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=reps, help="timed steps (the median is reported)")
    parser.add_argument("--nproc", type=int, help="local ranks to start without torchrun (default: GPUs, or 2 on CPU)")
    parser.add_argument("--output", type=Path, default=REPOSITORY / "build" / name)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="profile one step of each kind per contender and split its time (GEMM, attention, "
        "communication not hidden, other kernels, host); the traces go to --output for Perfetto",
    )
    return parser


def parsed(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    sizes: list[LayerSize],
    smoke_sizes: list[LayerSize],
    keys: dict[str, str],
) -> tuple[argparse.Namespace, list[str]]:
    """The arguments, their sizes made (`sizes`' kind, the head dim given), and the contenders
    chosen by `--contenders` (all by default); a bad one is the parser's error."""
    args = parser.parse_args(argv)
    head_dim = args.head_dim or (16 if args.smoke else 128)
    if args.sizes:
        try:
            args.sizes = parse_sizes(args.sizes, head_dim, type(sizes[0]))
        except ValueError as error:
            parser.error(str(error))
    else:
        args.sizes = smoke_sizes if args.smoke else [replace(s, head_dim=head_dim) for s in sizes]
    chosen = [c.strip() for c in args.contenders.split(",")] if args.contenders else list(keys)
    unknown = [c for c in chosen if c not in keys]
    if unknown:
        parser.error(f"unknown contender(s) {unknown}; choose among {','.join(keys)}")
    return args, [keys[c] for c in chosen]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    sizes = "the four of DEFAULT_SIZES; --smoke: 64,2,16"
    parser = layer_parser(__doc__, "tp_layer", KEYS, 20, sizes, "; eager always runs")
    parser.add_argument(
        "--layers", type=int, default=1, help="a stack of this many layers, each compiled on its own (as torchtitan does)"
    )
    parser.add_argument(
        "--whole", action="store_true", help="with --layers: compile the stack whole, as torch.compile(model) does"
    )
    parser.add_argument(
        "--skip-module-guards",
        action="store_true",
        help="compile with torch.compiler.skip_guard_on_all_nn_modules_unsafe as the guard filter",
    )
    parser.add_argument(
        "--rotary", action="store_true", help="rotary embeddings on the queries and keys, in complex numbers as torchtitan's"
    )
    args, chosen = parsed(parser, argv, DEFAULT_SIZES, SMOKE_SIZES, KEYS)
    if args.layers < 1:
        parser.error(f"--layers {args.layers}: at least one layer")
    if args.whole and args.layers < 2:
        parser.error("--whole needs --layers 2 or more")
    args.sizes = [
        replace(size, layers=args.layers, whole=args.whole, module_guards=not args.skip_module_guards, rotary=args.rotary)
        for size in args.sizes
    ]
    args.contenders_given = bool(args.contenders)
    # Eager DTensor runs first whatever is chosen: every check compares with it.
    args.contenders = [c for c in CONTENDERS if c in chosen or c == EAGER]
    args.inductor_chosen = INDUCTOR in chosen and args.contenders_given
    return args


CPU_INDUCTOR_SKIP = (
    "skipped: inductor compiles C++ for every graph on the CPU, minutes for a smoke test; "
    "--contenders inductor runs it"
)


def run_config(args: argparse.Namespace, **more: Any) -> dict:
    """What every rank runs with (and the report says), by the arguments, and `more`; `--smoke`
    hides the GPUs, before torch looks for them."""
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    return {
        "dtype": dtype,
        "warmup": args.warmup,
        "reps": args.reps,
        "seed": args.seed,
        "breakdown": args.breakdown,
        **more,
        "output": str(args.output),
    }


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    config = run_config(args, skip={})
    cuda = torch.cuda.is_available()
    if not cuda and INDUCTOR in args.contenders and not args.inductor_chosen:
        config["skip"][INDUCTOR] = CPU_INDUCTOR_SKIP
    return launch(run_rank, args, config)


def launch(run_rank: Callable[..., int], args: argparse.Namespace, config: dict) -> int:
    """`run_rank(sizes, contenders, config, output, command)` on every rank, once each size is
    known to fit them: on this one under torchrun, else on `--nproc` local ranks (default: one
    per GPU, or 2 on the CPU); the first rank's exit status."""
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    cuda = torch.cuda.is_available()
    nproc = int(os.environ["WORLD_SIZE"]) if torchrun else args.nproc or (torch.cuda.device_count() if cuda else 2)
    for size in args.sizes:
        size.check(nproc)
    if torchrun:
        command = f"torchrun --nproc-per-node {os.environ.get('LOCAL_WORLD_SIZE', '?')} {shlex.join(sys.argv)}"
        status = run_rank(args.sizes, args.contenders, config, args.output, command)
        release_captured_graphs()
        dist.destroy_process_group()
        return status
    command = shlex.join(["python", *sys.argv])
    return run_on_local_ranks(run_rank, nproc, args.sizes, args.contenders, config, args.output, command)[0]


def exit_status(results: list[Result]) -> int:
    """1 when a contender failed or its check did; a contender that cannot run here is no failure."""
    return int(any(r.status.startswith("failed") or r.check_ok is False for r in results))


if __name__ == "__main__":
    sys.exit(main())
