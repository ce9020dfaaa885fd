"""Context parallelism: a Llama-style decoder layer whose sequence is sharded over the ranks,
`torch.compile(backend="hostir")` with its attention ring against torch's own context parallel.

    torchrun --nproc-per-node 4 benchmarks/cp_attention.py                # 32k, 64k, 128k tokens, bf16
    torchrun --nproc-per-node 2 benchmarks/cp_attention.py --sizes 4096,1,32768
    torchrun --nproc-per-node 2 benchmarks/cp_attention.py --sizes 4096,1,32768 --breakdown
    python benchmarks/cp_attention.py --smoke                              # 2 local CPU ranks, gloo, f32

The layer is examples/cp_decoder_layer.py's (RMSNorm, attention with rotary embeddings,
causal, RMSNorm, SwiGLU MLP), heads of 128 and an MLP of 3.5 x dim. Its sequence is cut
into 2 D chunks in torch's head-tail order: rank r holds chunks r and 2 D - 1 - r, and the
rotary tables and positions of its rows. The weights are whole on every rank. A size is
DIM,BATCH,SEQUENCE; the default sizes are dim 4096, one sequence of 32768, 65536 and
131072 tokens.

For each size, two steps are timed: the forward alone (under `torch.no_grad()`) and the
training step, forward then backward of the output with a fixed random gradient (no
optimizer). The contenders, in one run and in this order, each on its own copy of the
same weights and the same inputs:

  limit                  no layer: one rank's share of the layer's GEMMs and attention, with
                         its shapes, on local tensors with no communication: the projections
                         of its tokens, and the attention of its queries against the blocks
                         of keys that a head-tail causal mask leaves them (`Limit`)
  torch CP (allgather)   the layer with SDPA's causal mask in torch's
                         `context_parallel(mesh, buffers=...)`, eager, its all-gather rotation
                         (CUDA only: on CPU ranks torch's CP fails in DTensor)
  torch CP (alltoall)    the same with its all-to-all rotation
  hostir (nccl)          the plain DTensor plan (examples/cp_decoder_layer.py), compiled with
                         `backend="hostir"` and `options={"sequence_layout": "head_tail",
                         "backend": "nccl"}`: the attention ring, transfers on the process
                         group (gloo on CPU ranks)
  hostir (cuda)          the same with the copy engines (CUDA only)

Before it is timed, every contender's forward output, training-step output, input
gradient (each rank's rows) and parameter gradients (summed over the ranks) are compared
with the layer run eagerly on the whole sequence, which every rank computes once
(`--no-check` skips it where one GPU cannot hold the whole layer's activations). A hostir
contender fails if a graph of it runs as torch eager ops. Timing, the report
(cp_attention.md, .json and .png in `--output`, default build/cp_attention), `--breakdown`
(a profiled step of each kind per contender, split into GEMM, attention, communication not
hidden, other kernels and host, its traces kept in `--output`) and the exit status are
benchmarks/tp_layer.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.append(str(REPOSITORY))  # examples/ is no installed package; hostir as installed comes first

from examples.cp_decoder_layer import (  # noqa: E402
    DecoderLayer,
    context_parallel,
    layer_inputs,
    rank_inputs,
    shard_sequence,
)
from tp_layer import (  # noqa: E402
    LIMIT,
    MLP_RATIO,
    TOLERANCES,
    LayerSize,
    Measured,
    check_ran_on_hostir,
    contender_results,
    gathered,
    key_of,
    launch,
    layer_parser,
    measure_limit,
    parsed,
    relative_error,
    run_config,
    run_sizes,
    slowest_errors,
    step_breakdowns,
    step_times,
)
from tp_layer import Limit as TensorParallelLimit  # noqa: E402
from hostir.frontend.backend import compiled_graphs  # noqa: E402
from hostir.runtime.interpreter.attention import meeting_rows  # noqa: E402
from hostir_dialect.fusion import Causal  # noqa: E402

TORCH_ALLGATHER = "torch CP (allgather)"
TORCH_ALLTOALL = "torch CP (alltoall)"
HOSTIR = "hostir (nccl)"
HOSTIR_CUDA = "hostir (cuda)"
CONTENDERS = [LIMIT, TORCH_ALLGATHER, TORCH_ALLTOALL, HOSTIR, HOSTIR_CUDA]
"""In the order they run: a contender that hangs leaves the ones before it in the report."""
KEYS = dict(zip(["limit", "torch-allgather", "torch-alltoall", "hostir", "hostir-cuda"], CONTENDERS))
"""The contenders' names on the command line (--contenders)."""
REFERENCE = "the layer on the whole sequence, eager"
RING = {"sequence_layout": "head_tail"}


@dataclass(frozen=True)
class SequenceSize(LayerSize):
    def check(self, world: int) -> None:
        """Exits with a message where `world` ranks cannot hold this size in head-tail order."""
        where = f"size {self.dim},{self.batch},{self.sequence} (head dim {self.head_dim})"
        if self.dim % self.head_dim:
            raise SystemExit(f"{where}: dim is not a multiple of the head dim")
        if self.sequence % (2 * world):
            raise SystemExit(f"{where}: the sequence does not cut into {2 * world} chunks of one length")


DEFAULT_SIZES = [SequenceSize(4096, 1, 32768), SequenceSize(4096, 1, 65536), SequenceSize(4096, 1, 131072)]
SMOKE_SIZES = [SequenceSize(64, 2, 32, head_dim=16)]


# --------------------------------------------------------------------------- #
# The contenders                                                               #
# --------------------------------------------------------------------------- #


def unavailable_reason(contender: str, device: torch.device) -> str | None:
    """Why `contender` cannot run on this machine, or None."""
    if contender in (TORCH_ALLGATHER, TORCH_ALLTOALL) and device.type != "cuda":
        return (
            "unavailable: torch's context parallel does not run on CPU ranks (DTensor has no sharding "
            "strategy for aten._scaled_dot_product_flash_attention_for_cpu, nor CP a handler)"
        )
    if contender == HOSTIR_CUDA and device.type != "cuda":
        return "unavailable: the copy engines are CUDA's"
    return None


@dataclass
class Inputs:
    """One rank's rows of the layer's inputs (x, cos, sin, positions) and of the output's gradient,
    and the whole ones (torch's CP shards the whole buffers itself)."""

    local: tuple[torch.Tensor, ...]
    grad_output: torch.Tensor
    whole: tuple[torch.Tensor, ...]
    whole_grad_output: torch.Tensor


class Contender:
    """A contender's layer and steps: `forward()` and `train()` (the output, the input's gradient)."""

    def __init__(self, contender: str, base: DecoderLayer, mesh, inputs: Inputs):
        self.contender, self.inputs = contender, inputs
        self.context = contextlib.nullcontext()
        self.layer = copy.deepcopy(base)
        if contender in (HOSTIR, HOSTIR_CUDA):
            backend = "nccl" if contender == HOSTIR else "cuda"
            options = {**RING, "backend": backend}
            self.model = torch.compile(context_parallel(self.layer, mesh), backend="hostir", options=options)
            self.arguments = inputs.local
        else:  # torch's CP: SDPA's causal mask, the buffers sharded by its context manager
            from torch.distributed.tensor.experimental import context_parallel as torch_context_parallel
            from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

            set_rotate_method("allgather" if contender == TORCH_ALLGATHER else "alltoall")
            _cp_options.enable_load_balance = True  # its head-tail order, the inputs' rows
            self.model = self.layer
            self.arguments = tuple(t.clone() for t in inputs.whole)
            self.context = torch_context_parallel(mesh, buffers=list(self.arguments), buffer_seq_dims=[1, 0, 0, 0])

    def forward(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model(*self.arguments)

    def train(self) -> tuple[torch.Tensor, torch.Tensor]:
        for parameter in self.layer.parameters():
            parameter.grad = None
        x = self.arguments[0].detach().requires_grad_()
        out = self.model(x, *self.arguments[1:])
        out.backward(self.inputs.grad_output)
        return out, x.grad

    def gradients(self) -> dict[str, torch.Tensor]:
        """Each parameter's gradient, the ranks' shares summed."""
        grads = {}
        for name, parameter in self.layer.named_parameters():
            grad = parameter.grad.clone()
            dist.all_reduce(grad)
            grads[f"{name} gradient"] = grad
        return grads


def expected_results(base: DecoderLayer, inputs: Inputs, rank: int, world: int) -> dict[str, dict[str, torch.Tensor]]:
    """What each step checks, from the layer run eagerly on the whole sequence: this rank's rows of
    the output and of the input's gradient, and every parameter's gradient."""
    layer = copy.deepcopy(base)
    with torch.no_grad():
        forward = layer(*inputs.whole)
    x = inputs.whole[0].detach().requires_grad_()
    out = layer(x, *inputs.whole[1:])
    out.backward(inputs.whole_grad_output)
    return {
        "forward": {"output": shard_sequence(forward, 1, rank, world)},
        "train": {
            "output": shard_sequence(out.detach(), 1, rank, world),
            "input gradient": shard_sequence(x.grad, 1, rank, world),
            **{f"{name} gradient": p.grad for name, p in layer.named_parameters()},
        },
    }


@dataclass
class Limit(TensorParallelLimit):
    """One rank's share of the layer's GEMMs and attention, with its shapes, without communication.

    Per rank, with T = batch x sequence / D tokens: the q, k, v and output projections
    [T, dim] x [dim, dim], w1 and w3 [T, dim] x [dim, hidden] and w2 [T, hidden] x [hidden,
    dim]; and attention of its queries against each block of keys that the head-tail causal
    mask leaves them (`meeting_rows`: its own block with SDPA's causal mask, then half a
    block per other rank), as the ring computes them. The training step adds, for each of
    the 7 projections Y = X W^T, dX = dY W and dW = dY^T X, and attention's backward of each
    block. Norms, rotary embeddings, SiLU, the products, the residual adds, the merges of
    the blocks and all communication are left out."""

    position: int
    world: int

    @classmethod
    def of(
        cls, size: SequenceSize, world: int, dtype: torch.dtype, device: torch.device, position: int | None = None
    ) -> Limit:
        """The limit of the rank at `position` (default: this rank) of `world`."""
        operands = cls.operands(size, size.batch * size.sequence // world, size.dim, size.hidden, dtype, device)
        return cls(**operands, position=dist.get_rank() if position is None else position, world=world)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        """Each block's attention of the rank's ring (the rank's own keys stand for every block's)."""
        rows = q.shape[-2]
        outputs = []
        for source in range(self.world):
            meeting = meeting_rows(self.position, source, Causal.HEAD_TAIL, rows)
            keys = meeting.keys
            outputs.append(
                F.scaled_dot_product_attention(
                    q[..., meeting.queries, :], k[..., keys, :], v[..., keys, :], is_causal=meeting.top_left
                )
            )
        return outputs


# --------------------------------------------------------------------------- #
# One size on one rank                                                         #
# --------------------------------------------------------------------------- #


def measure_size(size: SequenceSize, contenders: list[str], config: dict, device, mesh, results, measured) -> None:
    """Adds every contender at `size` to `results`, as the ranks agreed on it, calling `measured` after each."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, config["dtype"])
    torch.manual_seed(config["seed"])
    with torch.device(device):
        base = DecoderLayer(size.dim, size.heads, size.hidden).to(dtype)
        x = torch.randn(size.batch, size.sequence, size.dim, dtype=dtype)
        grad_output = torch.randn(size.batch, size.sequence, size.dim, dtype=dtype)
    whole = tuple(t.to(dtype) if t.is_floating_point() else t for t in layer_inputs(x, size.head_dim))
    local = tuple(t.to(dtype) if t.is_floating_point() else t for t in rank_inputs(x, size.head_dim, rank, world))
    inputs = Inputs(local, shard_sequence(grad_output, 1, rank, world), whole, grad_output)
    expected = expected_results(base, inputs, rank, world) if config["check"] else {}
    warmup, reps = config["warmup"], config["reps"]
    for contender in contenders:
        status = unavailable_reason(contender, device) or "ok"
        if contender == LIMIT:
            limit = functools.partial(Limit.of, size, world, dtype, device)
            measure = functools.partial(measure_limit, limit, device, warmup, reps)
        else:
            traces = Path(config["output"]) if config["breakdown"] else None
            measure = functools.partial(measure_layer, contender, base, mesh, inputs, expected, warmup, reps, traces)
        results += contender_results(size, contender, status, measure, TOLERANCES[dtype], device)
        measured()


def measure_layer(
    contender: str,
    base: DecoderLayer,
    mesh,
    inputs: Inputs,
    expected: dict,
    warmup: int,
    reps: int,
    traces: Path | None = None,
) -> Measured:
    """Every rank's median of each step, the slowest rank's error of each checked tensor, the
    slowest rank's time of the first (checked) steps, and with `traces` (a folder for the
    trace files) every rank's breakdown of each step (`step_breakdowns`)."""
    earlier = set(compiled_graphs())
    runner = Contender(contender, base, mesh, inputs)
    with runner.context:
        began = time.perf_counter()
        actual = {"forward": {"output": runner.forward()}}
        out, grad_x = runner.train()
        actual["train"] = {"output": out, "input gradient": grad_x, **runner.gradients()}
        first_s = max(gathered(time.perf_counter() - began))
        if contender in (HOSTIR, HOSTIR_CUDA):
            check_ran_on_hostir([graph for graph in compiled_graphs() if graph not in earlier])
        errors = {}
        if expected:
            errors = {
                step: {name: relative_error(t, expected[step][name]) for name, t in tensors.items()}
                for step, tensors in actual.items()
            }
        steps = {"forward": runner.forward, "train": runner.train}
        device = inputs.local[0].device
        times = step_times(steps, device, warmup, reps)
        breakdowns = {}
        if traces is not None:
            batch, sequence, dim = inputs.whole_grad_output.shape
            stem = f"trace-d{dim}-b{batch}-s{sequence}-{key_of(KEYS, contender)}"
            breakdowns = step_breakdowns(steps, device, reps, traces / stem)
    return times, slowest_errors(errors), first_s, breakdowns


def run_rank(sizes: list[SequenceSize], contenders: list[str], config: dict, output: Path, command: str) -> int:
    """Every size on this rank (`run_sizes`): the report is cp_attention.md, .json and .png."""
    return run_sizes(measure_size, "cp_attention", sizes, contenders, config, output, command)


# --------------------------------------------------------------------------- #
# Command line                                                                 #
# --------------------------------------------------------------------------- #


def arguments(argv: list[str] | None) -> argparse.Namespace:
    sizes = "4096,1,32768;4096,1,65536;4096,1,131072; --smoke: 64,2,32"
    parser = layer_parser(__doc__, "cp_attention", KEYS, 10, sizes, "")
    parser.add_argument("--no-check", action="store_true", help="skip the checks against the whole layer")
    args, chosen = parsed(parser, argv, DEFAULT_SIZES, SMOKE_SIZES, KEYS)
    args.contenders = [c for c in CONTENDERS if c in chosen]
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    config = run_config(
        args,
        check=not args.no_check,
        reference="nothing (--no-check)" if args.no_check else REFERENCE,
        parameter_gradients="the ranks' shares summed",
        mlp_ratio=MLP_RATIO,
    )
    return launch(run_rank, args, config)


if __name__ == "__main__":
    sys.exit(main())
