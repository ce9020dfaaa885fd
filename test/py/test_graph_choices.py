"""Which capture of its CUDA graphs a compiled model's run replays (`runtime.graphs`), with
autograd holding what it holds: layers compiled one by one, gradients accumulated or kept,
inference between backward and `zero_grad()`. Each test runs on a GPU where there is one,
and on the CPU with CUDA graphs emulated, so that CI runs them.

The emulation is `emulated_graphs.py`'s (the `replay_device` fixture). Values are
compared with the same model run eagerly.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hostir.frontend.backend import compiled_graphs
from hostir.runtime.graphs import GraphReplayFallback


@pytest.fixture
def device(replay_device):
    torch._dynamo.reset()
    yield replay_device
    torch._dynamo.reset()


def _model_and_reference(device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A small MLP on `device`, and a copy of it that runs eagerly."""
    torch.manual_seed(0)
    model, reference = (
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(device) for _ in range(2)
    )
    reference.load_state_dict(model.state_dict())
    return model, reference


def test_gradients_accumulated_over_steps_are_those_of_eager(device):
    """Gradient accumulation against a replayed backward that lends the parameters'
    gradients: AccumulateGrad keeps the first step's as `.grad` and adds the next ones into
    it, so those steps replay a second capture of the forward (whose first capture could
    overwrite the kept gradients) and of the backward (which reads the second forward's
    activations), with no warning; the gradients kept past the next backward are copied
    from then on. The gradients are eager's at every window."""
    earlier_graphs = set(compiled_graphs())
    model, reference = _model_and_reference(device)
    compiled = torch.compile(model, backend="hostir")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for window in range(3):
            for _ in range(3):
                x = torch.randn(8, 16, device=device)
                compiled(x).square().mean().backward()
                reference(x).square().mean().backward()
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, msg=f"window {window}, {name}")
            model.zero_grad()
            reference.zero_grad()
    said = [str(w.message) for w in caught if issubclass(w.category, GraphReplayFallback)]
    assert said == []
    forward, backward = (
        shapes.replayer
        for graph in compiled_graphs()
        if graph not in earlier_graphs
        for shapes in graph.compiled.values()
    )
    assert len(forward.runs()) == 2 and len(backward.runs()) == 2
    assert backward.copied_outputs and not any(run.on_loan for run in backward.runs()), "copied from then on"


def test_an_inference_run_while_gradients_are_held_leaves_them_lent(device):
    """An inference forward between the backward and `zero_grad()` (an evaluation, or a
    benchmark's forward) runs while `.grad` holds the gradients the backward lent, which
    may lie in its first capture's temporaries: it takes a second capture, once, and the
    backward goes on lending its gradients, with no warning and eager's values."""
    earlier_graphs = set(compiled_graphs())
    model, reference = _model_and_reference(device)
    compiled = torch.compile(model, backend="hostir")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():  # the inference graph is captured first, before the backward's
            compiled(torch.randn(8, 16, device=device))
        for step in range(4):
            x = torch.randn(8, 16, device=device)
            compiled(x).square().mean().backward()
            reference(x).square().mean().backward()
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), reference(x), msg=f"step {step}")
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, msg=f"step {step}, {name}")
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
    assert [str(w.message) for w in caught if issubclass(w.category, GraphReplayFallback)] == []
    replayers = {
        graph.name.rpartition("_")[0] + ("" if graph.saved is not None or not graph.forward else "_inference"): shapes.replayer
        for graph in compiled_graphs()
        if graph not in earlier_graphs
        for shapes in graph.compiled.values()
    }
    backward = replayers["backward"]
    assert backward.copied_outputs == set() and all(run.on_loan for run in backward.runs())
    assert len(replayers["forward_inference"].runs()) == 2


@pytest.mark.parametrize("leaf_input", [False, True], ids=["embedded_input", "leaf_input_kept"])
def test_blocks_compiled_one_by_one_replay_a_capture_each(device, leaf_input):
    """A model whose blocks are compiled one by one (as torchtitan compiles its layers):
    torch compiles the block's code once, so every block calls the same forward and
    backward graphs. Each block replays a capture of its own, with no warning: the next
    block's forward runs while autograd holds the last one's saved activations, its
    backward while AccumulateGrad holds the last one's gradients; what one block passes to
    the next, forward and backward, is read in place. Loss and gradients are eager's over
    five SGD steps, with inputs of fresh values each step.

    With the input a leaf that the loss of the step before still holds, with its gradient,
    during the next forward (`leaf_input_kept`), the first block's backward copies that
    gradient from then on, and no capture is made after the third step (at most three per
    block: 6 of the forward and 8 of the backward, on one H200)."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(16, 48), torch.nn.Linear(48, 16)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    earlier_graphs = set(compiled_graphs())
    torch.manual_seed(0)
    model, reference = (
        torch.nn.Sequential(torch.nn.Linear(16, 16), *(Block() for _ in range(3))).to(device) for _ in range(2)
    )
    reference.load_state_dict(model.state_dict())
    for block in model[1:]:
        block.compile(backend="hostir")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    counts = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            x = torch.randn(8, 16, device=device, requires_grad=True)
            x_reference = x.detach().clone().requires_grad_()
            if leaf_input:
                loss = model[1:](x).square().mean()
                expected = reference[1:](x_reference).square().mean()
            else:
                loss, expected = model(x).square().mean(), reference(x_reference).square().mean()
            loss.backward()
            expected.backward()
            torch.testing.assert_close(loss, expected, msg=f"step {step}")
            torch.testing.assert_close(x.grad, x_reference.grad, msg=f"step {step}")
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, msg=f"step {step}, {name}")
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
            replayers = [
                shapes.replayer
                for graph in compiled_graphs()
                if graph not in earlier_graphs
                for shapes in graph.compiled.values()
            ]
            counts.append([len(replayer.runs()) for replayer in replayers])
    said = [str(w.message) for w in caught if issubclass(w.category, GraphReplayFallback)]
    assert said == [], (said, counts)
    if leaf_input:
        assert counts[2] == counts[3] == counts[4] and max(counts[-1]) <= 3 * 3, counts
        return
    assert counts[-1] == [3, 3], counts
    # Every block's backward reads its block's weights in place, which the first backward's
    # compilation, the last block's, knew as parameters. Each block's forward reads the
    # output that the block before lent in place, but the first (an eager layer's output);
    # each backward reads in place the gradient that the block after passed on, but the
    # last (the loss's gradient), and its input, but the first block's.
    forward, backward = replayers
    assert backward.static_inputs and all(run.parameter_addresses for run in backward.runs())
    copies = [[sum(static is not None for static in run.inputs) for run in r.runs()] for r in (forward, backward)]
    assert copies == [[1, 0, 0], [1, 0, 1]], copies


def _train_keeping(device: torch.device, keep) -> tuple[list, list[list[int]], list[str], list]:
    """Six SGD steps of `_model_and_reference`'s model compiled and of its eager copy on fresh
    inputs, `keep(model, reference, out, expected)` called after each backward: what it
    kept, each step's count of captures per graph, the replays' warnings, and the graphs."""
    earlier_graphs = set(compiled_graphs())
    model, reference = _model_and_reference(device)
    compiled = torch.compile(model, backend="hostir")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    kept, counts = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(6):
            x = torch.randn(8, 16, device=device)
            out, expected = compiled(x), reference(x)
            out.square().mean().backward()
            expected.square().mean().backward()
            kept.append(keep(model, reference, out, expected))
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
            graphs = [graph for graph in compiled_graphs() if graph not in earlier_graphs]
            counts.append([len(shapes.replayer.runs()) for graph in graphs for shapes in graph.compiled.values()])
    said = [str(w.message) for w in caught if issubclass(w.category, GraphReplayFallback)]
    return kept, counts, said, graphs


def test_gradients_kept_across_steps_stay_right_and_captures_stop_growing(device):
    """A caller that keeps each step's gradients past the next step (a list of `.grad` for
    a log): the replays never overwrite what it kept, the gradients it kept are eager's,
    and after the first steps no capture is made any more: the kept gradients are copied
    from then on."""

    def gradients(model, reference, out, expected):
        return [p.grad for p in model.parameters()], [q.grad.clone() for q in reference.parameters()]

    kept, counts, said, _ = _train_keeping(device, gradients)
    assert said == []
    for step, (grads, expected) in enumerate(kept):
        for grad, value in zip(grads, expected):
            torch.testing.assert_close(grad, value, msg=f"step {step}")
    assert counts[3] == counts[-1] and max(counts[-1]) <= 3, counts


def test_outputs_kept_across_steps_stay_right_and_are_copied_from_then_on(device):
    """A training loop that keeps every step's output (its variable until the next step
    reassigns it, a list for a log): what the forward lends its caller is never overwritten
    while kept, each kept output is eager's, and once one blocked a replay the forward
    copies its output from then on, so captures stop growing."""
    kept, counts, said, graphs = _train_keeping(
        device, lambda model, reference, out, expected: (out, expected.detach().clone())
    )
    assert said == []
    for step, (out, expected) in enumerate(kept):
        torch.testing.assert_close(out, expected, msg=f"step {step}")
    forward = next(shapes.replayer for graph in graphs if graph.forward for shapes in graph.compiled.values())
    assert forward.copied_outputs, "the kept output is copied from then on"
    assert counts[3] == counts[-1] and max(counts[-1]) <= 3, counts


def _tp_layers_one_by_one(steps: int) -> dict:
    """On this CPU rank, with CUDA graphs emulated: two of `examples/tp_decoder_layer.py`'s
    layers, tensor-parallel over every rank, each compiled on its own, trained `steps` SGD
    steps against the same layers run eagerly with DTensor."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from emulated_graphs import emulate_cuda_graphs
    from examples.tp_decoder_layer import DecoderLayer, parallelize
    from hostir.runtime.graphs import release_captured_graphs
    from test_torch_backend import _grads, _max_error

    with pytest.MonkeyPatch.context() as monkeypatch:
        emulate_cuda_graphs(monkeypatch)
        world, rank = dist.get_world_size(), dist.get_rank()
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        layers = [DecoderLayer() for _ in range(2)]
        model, reference = (torch.nn.Sequential(*(parallelize(copy.deepcopy(layer), mesh) for layer in layers)) for _ in range(2))
        for layer in model:
            layer.compile(backend="hostir")
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, reference)]
        errors = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GraphReplayFallback)
            for step in range(steps):
                x = torch.randn(2, 32, 64).chunk(world, dim=1)[rank].contiguous()
                out, expected = model(x), reference(x)
                out.square().mean().backward()
                expected.square().mean().backward()
                errors[f"output {step}"] = _max_error(out, expected)
                expected_grads = _grads(reference)
                errors |= {f"{name} {step}": _max_error(g, expected_grads[name]) for name, g in _grads(model).items()}
                for optimizer in optimizers:
                    optimizer.step()
                    optimizer.zero_grad()
        counts = [len(shapes.replayer.runs()) for graph in compiled_graphs() for shapes in graph.compiled.values()]
        release_captured_graphs()
    return {"errors": errors, "said": [str(w.message) for w in caught], "counts": counts}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU ranks emulate CUDA graphs; GPUs replay them (the tests above)")
def test_tp_layers_compiled_one_by_one_on_two_ranks_replay_alike():
    """Two tensor-parallel layers (DTensor, sequence parallel) compiled one by one on two CPU
    ranks, with CUDA graphs emulated: every rank replays captures of the layers' forward
    and backward graphs, the ranks choose alike (the emulated replays run the layers'
    collectives, which would hang otherwise), with no warning and eager's values over three
    SGD steps."""
    from test_torch_backend import F32_TOLERANCE, run_on_hostir

    for rank, result in enumerate(run_on_hostir(_tp_layers_one_by_one, 2, 3, timeout_s=600)):
        bad = {what: error for what, error in result["errors"].items() if error > F32_TOLERANCE}
        assert not bad, f"rank {rank}: {bad}"
        assert result["said"] == [], f"rank {rank}: {result['said']}"
        # A forward and a backward graph per input kind (the first layer's input needs no
        # gradient, the second's does), each with at most two captures: the output kept
        # in a variable past the next step takes a second one, then is copied.
        assert len(result["counts"]) == 4 and max(result["counts"]) <= 2, f"rank {rank}: {result['counts']}"


def test_a_dropout_draws_a_new_mask_at_every_replay_and_its_backward_reads_that_mask(device):
    """A random op in a replayed graph draws new numbers at each replay (a capture registers
    the device's generator, whose offset every replay advances), not the capture's again:
    each call drops other elements, about half of them at p = 0.5, and the backward scales
    the gradient of exactly the elements kept."""
    torch.manual_seed(0)
    compiled = torch.compile(torch.nn.Dropout(0.5), backend="hostir")
    x = torch.randn(64, 256, device=device)
    masks = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphReplayFallback)
        for _ in range(5):  # compile, capture, then replays
            leaf = x.clone().requires_grad_()
            out = compiled(leaf)
            out.backward(torch.ones_like(out))
            kept = out != 0
            torch.testing.assert_close(out, torch.where(kept, x * 2, 0.0))
            torch.testing.assert_close(leaf.grad, kept.float() * 2)
            assert 0.45 < kept.float().mean().item() < 0.55
            masks.append(kept)
    assert all(not torch.equal(a, b) for a, b in zip(masks, masks[1:]))
