"""The program API: compile a fusion (or take a lowered host program) once, run it many times.

    program = Program.compile(text_or_module)             # lowers with DEFAULT_PIPELINE
    outputs = program.run(local_inputs, communicator)     # on every rank

`run` checks its inputs and the world before the program communicates. Each rank
checks its own inputs, then the ranks exchange their verdicts and the dynamic
extents of the inputs they hold in one small all-gather, so that a mistake on any
rank fails on every rank at once (instead of leaving the others waiting for a peer
that raised), and every rank knows every input's extents, also those of inputs it
holds no piece of.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import VerifyException

from hostir_dialect import hir, hostir_context
from hostir_dialect.builder import torch_dtype
from hostir_dialect.fusion import DYNAMIC, FusionOp, ParallelType, TensorType, shape_str
from hostir_dialect.text import HostirError, parse_module, verify_module
from hostir.passes import DEFAULT_PIPELINE, available_passes
from hostir.passes.analysis.extents import buffer_extent
from hostir.passes.driver import parse_pass_pipeline, run_passes
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.interpreter import Interpreter, RunContext, StepWrapper
from hostir.runtime.reference import full_shape


def _entry(module: ModuleOp, name: str | None) -> func.FuncOp:
    """The function named `name`, or the module's only public function."""
    functions = [op for op in module.ops if isinstance(op, func.FuncOp)]
    if name is not None:
        matches = [f for f in functions if f.sym_name.data == name]
        if not matches:
            raise HostirError(
                f"the module has no function @{name}; it has "
                + ", ".join(f"@{f.sym_name.data}" for f in functions)
            )
        return _with_body(matches[0])
    public = [f for f in functions if f.sym_visibility is None or f.sym_visibility.data == "public"]
    if len(public) != 1:
        raise HostirError(
            f"the module has {len(public)} public functions "
            f"({', '.join('@' + f.sym_name.data for f in public)}); name the entry to run"
        )
    return _with_body(public[0])


def _with_body(function: func.FuncOp) -> func.FuncOp:
    if function.is_declaration:
        raise HostirError.at(function, f"@{function.sym_name.data} has no body to run")
    return function


def _lower(module: ModuleOp, pipeline: str) -> None:
    """Runs `pipeline` as hir-opt does: the same passes, and the same errors, located in
    the pipeline text, for an unknown pass or a bad option. The module is verified once,
    at the end: verifying after every pass, as hir-opt does, triples the time to compile."""
    run_passes(parse_pass_pipeline(pipeline, available_passes()), hostir_context(), module)
    verify_module(module)


def _with_shape(type: TensorType, shape: Sequence[int]) -> TensorType:
    return TensorType(shape, type.element_type, type.mesh, type.axes.data)


def _tensor_types(function: func.FuncOp, types: Sequence, what: str) -> list[TensorType]:
    for i, type in enumerate(types):
        if not isinstance(type, TensorType):
            raise HostirError.at(function, f"{what} #{i} is a {type}, not a !fusion.tensor")
    return list(types)


def dynamic_axes(input_types: Sequence[TensorType]) -> list[tuple[int, int]]:
    """(input index, axis) of every input axis whose extent the inputs set: a `?` axis, but a
    didx axis, whose extent is the mesh size."""
    return [
        (index, axis)
        for index, type in enumerate(input_types)
        for axis, (extent, parallel_type) in enumerate(zip(type.get_shape(), type.parallel_types()))
        if extent == DYNAMIC and parallel_type != ParallelType.DIDX
    ]


def aten_only_inputs(host: func.FuncOp) -> set[int]:
    """The inputs of `host` that ATen calls alone read."""
    return {
        i
        for i, argument in enumerate(host.args)
        if argument.uses and all(isinstance(use.operation, hir.AtenOp) for use in argument.uses)
    }


def symmetric_outputs(host: func.FuncOp) -> list[int]:
    """The outputs of `host` that are (views of) buffers of `hir.allocate symmetric`."""
    returned = host.get_return_op()
    return [i for i, value in enumerate(returned.operands if returned else ()) if hir.in_symmetric_allocation(value)]


def process_group_teams(host: func.FuncOp) -> list[tuple[int, ...]]:
    """The teams of `host` that need a process group, each once, in program order: those of
    the collectives (send_recv is point to point, and the members of a symmetric buffer's
    mesh exchange their handles through the world's store)."""
    communications = [op for op in host.walk() if isinstance(op, hir.CommunicationOp)]
    return list(dict.fromkeys(op.team_ids for op in communications if not isinstance(op, hir.SendRecvOp)))


def largest_device(host: func.FuncOp) -> int:
    """The largest device that `host` names: in the mesh of a buffer or in a team."""
    meshes = [
        value.type.mesh.ids
        for op in host.walk()
        for value in (*op.results, *(a for r in op.regions for b in r.blocks for a in b.args))
        if isinstance(value.type, TensorType)
    ]
    teams = [op.team_ids for op in host.walk() if isinstance(op, hir.CommunicationOp)]
    return max((device for devices in (*meshes, *teams) for device in devices), default=0)


class Program:
    """A lowered host program, prepared once, run many times."""

    def __init__(self, module: ModuleOp, host: func.FuncOp, fusion: func.FuncOp | None):
        self.module = module
        self.host = host
        self.fusion = fusion
        """The unlowered fusion, or None when given an already lowered module."""
        self.input_types = _tensor_types(host, host.function_type.inputs.data, "input")
        self.declared_inputs = tuple(map(DeclaredInput.of, self.input_types))
        """What `check` reads of each input's type, read once."""
        self.dynamic_axes = dynamic_axes(self.input_types)
        """(input index, axis) of every input axis whose extent the inputs set (a didx axis's is the mesh size)."""
        self.symmetric_inputs = [i for i, argument in enumerate(host.args) if hir.is_symmetric_input(argument)]
        """The inputs marked `hir.symmetric`, which the caller passes in symmetric memory of their
        mesh (`symmetric_empty`)."""
        self.unread_inputs = frozenset(i for i, argument in enumerate(host.args) if not argument.uses)
        """The inputs no op reads (a value a graph takes and lowering left unused), which a CUDA
        graph's replay need not copy in."""
        self.aten_inputs = aten_only_inputs(host)
        """The inputs that only ATen calls read: one that gives them a 0-dim tensor may be a CPU
        tensor beside a GPU program, as ATen's own kernels return some (an attention kernel's
        random seed and offset) and take them back (`_input_problem`)."""
        self.output_types = _tensor_types(host, host.function_type.outputs.data, "output")
        self.symmetric_outputs = symmetric_outputs(host)
        """The outputs in a buffer of `hir.allocate symmetric`: made once and given back to
        every run (peers map it), so a later run overwrites what an earlier one returned."""
        self.interpreter = Interpreter(host)
        self._fitting_shapes: set[tuple[tuple[int, ...], ...]] = set()
        """The whole input shapes `check_extents` found to fit the fusion."""
        self.teams = process_group_teams(host)
        """The teams that need a process group, each once, in program order."""
        self.largest_device = largest_device(host)
        self.expected_values: dict[int, tuple[torch.Tensor, str]] = {}
        """Inputs whose values are promised (`expect`): each one's value on this rank, and what it is."""
        self._kept_promises: dict[int, tuple[weakref.ref[torch.UntypedStorage], tuple]] = {}
        """Per promised input, the memory that last kept the promise, and where the input
        viewed it and its version then (`_unwritten_since`)."""

    def __repr__(self) -> str:
        """The entry's signature in IR types, the world it needs, its process-group teams, and
        whether it was lowered here (from the fusion kept in `fusion`) or given lowered."""
        inputs = ", ".join(
            f"{type}{' symmetric' if i in self.symmetric_inputs else ''}"
            for i, type in enumerate(self.input_types)
        )
        outputs = ", ".join(map(str, self.output_types))
        teams = ", ".join("[" + ", ".join(map(str, team)) + "]" for team in self.teams) or "none"
        origin = "lowered from its fusion" if self.fusion is not None else "given lowered"
        return (
            f"<Program @{self.host.sym_name.data}({inputs}) -> ({outputs}); "
            f"needs {self.largest_device + 1} rank(s); teams {teams}; {origin}>"
        )

    @classmethod
    def compile(
        cls,
        source: ModuleOp | str,
        pipeline: str | None = DEFAULT_PIPELINE,
        entry: str | None = None,
        filename: str = "<string>",
    ) -> Program:
        """Parses `source` if it is text, lowers it with `pipeline` (None: already lowered), prepares it.

        A module given as an object is not changed: the pipeline lowers a copy.
        """
        module = parse_module(source, filename) if isinstance(source, str) else source.clone()
        function = _entry(module, entry)
        fusion = None
        if pipeline is not None:
            fusion = function.clone()
            _lower(module, pipeline)
            function = _entry(module, function.sym_name.data)
        return cls(module, function, fusion)

    def run(
        self,
        inputs: Sequence[torch.Tensor],
        communicator: Communicator | None = None,
        num_streams: int | None = None,
        wrap_step: StepWrapper | None = None,
        views_of: Collection[int] = (),
    ) -> list[torch.Tensor]:
        """Runs the program on this rank's local inputs; returns this rank's local outputs.

        `communicator` defaults to the process group torchrun describes when
        torch.distributed is initialised, else a world of one. Raises `HostirError`
        before any communication when the inputs or the world do not fit the program.
        `wrap_step` runs a copy of the program prepared with every step wrapped (a
        tracer, say); the prepared program itself stays unwrapped.

        An output never shares memory with an input: where the program made it a view of
        one (an op's result adopted as its buffer, docs/runtime.md), it is copied, so
        that writing into an output leaves the inputs as they were. Nor with a later run:
        an output in symmetric memory, which every run reuses, is copied too. Views of the inputs
        whose indices are in `views_of` are returned as they are, for a caller that knows
        which outputs alias its inputs (torch.compile's, which rebuilds those views
        itself) or that reads them in place (a CUDA graph's parameters).
        """
        communicator = communicator or Communicator.default()
        context = self.checked_context(inputs, communicator, num_streams)
        interpreter = self.interpreter if wrap_step is None else Interpreter(self.host, wrap_step)
        return self.run_checked(inputs, context, views_of, interpreter)

    def checked_context(
        self, inputs: Sequence[torch.Tensor], communicator: Communicator, num_streams: int | None = None
    ) -> RunContext:
        """`run`'s preamble: `check` on every rank, and the process groups of the program's
        teams; the context of a run on `inputs`, for `run_checked`."""
        input_extents = self.check(inputs, communicator)
        communicator.create_groups(self.teams)
        return RunContext.of(communicator, num_streams, input_extents)

    def run_checked(
        self,
        inputs: Sequence[torch.Tensor],
        context: RunContext,
        views_of: Collection[int] = (),
        interpreter: Interpreter | None = None,
    ) -> list[torch.Tensor]:
        """`run` after its check: `inputs` are ones that `check` accepted, with the extents
        in `context`, so nothing is exchanged between ranks but the program's own
        communication. A CUDA-graph replayer runs a captured signature so where it cannot
        replay it."""
        outputs = (interpreter or self.interpreter).run(inputs, context)
        for i in self.symmetric_outputs:  # the next run writes the same memory
            if isinstance(outputs[i], torch.Tensor):
                outputs[i] = outputs[i].clone()
        kept = set(views_of)
        return _apart_from([x for i, x in enumerate(inputs) if i not in kept], outputs)

    def expect(self, index: int, value: torch.Tensor, what: str) -> None:
        """Promises that input `index` holds `value` on this rank (`what` says what it is): every
        run checks it with the inputs' types, before the program communicates, and fails on every
        rank where one rank's input breaks it. For a caller that compiled the program on the
        strength of input values (the torch.compile backend, on the positions of a sequence laid
        out as its `sequence_layout` option says), so that no run computes something else in silence."""
        self.expected_values[index] = (value, what)

    @property
    def value_checked_inputs(self) -> frozenset[int]:
        """The inputs whose check looks at more than their type: at their values (`expect`) or
        at their memory (`symmetric_inputs`). The check of the others depends on their shapes,
        dtypes and devices alone: a caller that runs the program many times on inputs it knows
        to have the shapes, dtypes and devices of one that `check` accepted on every rank, a
        compiled signature, need not check them again (`run_checked`)."""
        return frozenset(self.symmetric_inputs) | self.expected_values.keys()

    def value_problem(self, index: int, value: torch.Tensor) -> str | None:
        """How `value`, as input `index` on this rank, breaks the promise of `expect`, if it does."""
        if index not in self.expected_values:
            return None
        expected, what = self.expected_values[index]
        problem = f"its values are not {what}, which the program was compiled for"
        if (value.shape, value.dtype, value.device) != (expected.shape, expected.dtype, expected.device):
            given, promised = (f"{list(t.shape)} {t.dtype} on {t.device}" for t in (value, expected))
            return f"{problem} (given {given}, expected {promised})"
        # The very tensor (a mask the caller made once and hands back) needs no comparison, nor
        # does one that kept the promise and was not written since: a comparison reads the
        # values back, which waits for the GPU to finish its work, every call.
        if value.data_ptr() == expected.data_ptr() and value.stride() == expected.stride():
            return None
        owner, state = _unwritten_since(value)
        kept = self._kept_promises.get(index)
        if kept is not None and kept[0]() is owner and kept[1] == state:
            return None
        if torch.equal(value, expected):
            if not value.is_inference():  # an inference tensor counts no versions
                self._kept_promises[index] = (weakref.ref(owner), state)
            return None
        differ = (value != expected).nonzero()
        first = tuple(differ[0].tolist())
        return (
            f"{problem} ({len(differ)} of {value.numel()} elements differ; at {list(first)}: "
            f"{value[first].item()}, expected {expected[first].item()})"
        )

    def symmetric_empty(
        self, index: int, shape: Sequence[int], communicator: Communicator | None = None
    ) -> torch.Tensor:
        """An uninitialised tensor of `shape` for input `index` (marked `hir.symmetric`), in
        memory that the devices of the input's mesh map, as the program expects it.

        Collective: every rank of the world calls it with the same arguments, in the same
        order (a rank outside the input's mesh gets an empty placeholder), and the devices
        of the mesh map each other's memory (runtime/distributed/symmetric_memory.py). The memory belongs to the
        communicator's copy engine for as long as it lives; fill it, pass it to `run` as
        many times as wanted, and write it again only once the run that reads it is over
        on the current stream (peers read it during the run, never after it).
        """
        communicator = communicator or Communicator.default()
        if index not in self.symmetric_inputs:
            raise HostirError(
                f"input #{index} of @{self.host.sym_name.data} is not marked 'hir.symmetric'; "
                f"its symmetric inputs are {self.symmetric_inputs}"
            )
        declared = self.input_types[index]
        dtype = torch_dtype(declared.element_type)
        # Every rank creates the process groups, as the communicator asks, its own mesh or not.
        communicator.create_groups(self.teams)
        if communicator.rank not in declared.mesh.ids:
            return torch.empty(0, dtype=dtype, device=communicator.device)
        what = f"input #{index} of @{self.host.sym_name.data} (Program.symmetric_empty)"
        return communicator.copy_engine.allocate(tuple(shape), dtype, declared.mesh.ids, what).tensor

    def with_symmetric_inputs(
        self, inputs: Sequence[torch.Tensor], communicator: Communicator | None = None
    ) -> list[torch.Tensor]:
        """`inputs` (this rank's) as the program takes them: each input marked `hir.symmetric`
        copied into a new tensor of `symmetric_empty` (collective, as that is), the others
        as they are. Each call allocates anew, and the memory stays with the communicator:
        place the inputs once and write new values into them, rather than calling this
        for every run."""
        communicator = communicator or Communicator.default()
        return [
            self.symmetric_empty(i, value.shape, communicator).copy_(value)
            if i in self.symmetric_inputs
            else value
            for i, value in enumerate(inputs)
        ]

    def check(self, inputs: Sequence[torch.Tensor], communicator: Communicator) -> dict[tuple[int, int], int]:
        """Raises `HostirError` if the world or any rank's inputs contradict the program.

        Returns the extent of every dynamic axis of every input, by (input index, axis).
        Every rank raises alike: the world is the same everywhere, and in a world of
        several ranks the ranks all-gather one row of int64 each on the CPU (`_exchange`),
        with their verdict on their own inputs and the extents they hold. A rank whose inputs
        are wrong raises what is wrong with them; the others name the rank and the input.
        """
        if communicator.world_size <= self.largest_device:
            raise HostirError(
                f"the program uses device {self.largest_device} but the world has only "
                f"{communicator.world_size} rank(s); run it on at least {self.largest_device + 1}"
            )
        rows = self._exchange_started(inputs, communicator, self._input_problem(inputs, communicator))()
        extents = self._agreed_extents(rows)
        if extents:
            self.check_extents([full_shape(t, i, extents, UNKNOWN_EXTENT) for i, t in enumerate(self.input_types)])
        else:  # every whole shape is static
            self.check_extents([declared.whole_shape for declared in self.declared_inputs])
        return extents

    def check_values(self, inputs: Sequence[torch.Tensor], communicator: Communicator) -> None:
        """`check` of a later call whose inputs have the shapes, dtypes and devices of inputs that
        `check` accepted (a compiled signature): what such a call can change alone, the values
        and memory of `value_checked_inputs`, with the same exchange, so that every rank raises
        alike. The types of the others could only pass again."""
        self.start_check_values(inputs, communicator)()

    def start_check_values(
        self, inputs: Sequence[torch.Tensor], communicator: Communicator
    ) -> Callable[[], dict[int, list[int]]]:
        """`check_values` in two halves: this rank's verdict, sent to the others, then the wait
        for theirs (the callable returned), which raises as `check_values` would. Between the
        two the caller may do what no peer waits for, such as a CUDA graph's copy of the
        inputs into its own buffers, while the exchange travels."""
        problem = self._input_problem(inputs, communicator, values_only=True)
        return self._exchange_started(inputs, communicator, problem)

    def _exchange_started(
        self, inputs: Sequence[torch.Tensor], communicator: Communicator, problem: tuple[int, str] | None
    ) -> Callable[[], dict[int, list[int]]]:
        """Sends this rank's report (`_report`) to the others; the wait for every rank's report,
        by rank, which raises this rank's own `problem`, or what another rank's report says."""
        row = self._report(inputs, communicator, problem)
        received = (lambda: {communicator.rank: row}) if len(communicator.ranks) == 1 else _exchange(row, communicator)

        def exchanged() -> dict[int, list[int]]:
            rows = received()
            if problem is not None:
                raise HostirError(problem[1])
            faults = [self._fault(rank, row) for rank, row in rows.items() if row[0] != INPUTS_OK]
            if faults:
                raise HostirError(
                    f"the inputs of @{self.host.sym_name.data} are wrong on another rank, so no rank "
                    f"runs it: {'; '.join(faults)}"
                )
            return rows

        return exchanged

    def check_extents(self, shapes: Sequence[Sequence[int]]) -> None:
        """Raises `HostirError` if whole inputs of `shapes` cannot go through the program
        together (the K of a matmul differs between its operands, say), which their types
        alone allow; each set of shapes is checked once. `check` calls it on every rank
        alike, before the program communicates.

        With the fusion, the shapes go through a copy of it op by op, by each op's
        `infer_shape` (the shape rule its verifier uses). A program given lowered is
        checked where a wrong extent would go unnoticed: a `hir.scatter` gives each device
        of its output's mesh one slice of its input, so it would drop the input's further
        slices, or send unwritten ones, in silence; a gather, an allgather and a
        reduce-scatter alike, and a collective that would receive more elements than
        are sent (`_check_collectives`).
        """
        key = tuple(tuple(shape) for shape in shapes)
        if key in self._fitting_shapes:
            return
        if self.fusion is None:
            self._check_collectives(key)
        else:
            self._check_fusion(key)
        self._fitting_shapes.add(key)

    def _check_fusion(self, shapes: tuple[tuple[int, ...], ...]) -> None:
        """Refuses the first op of the fusion whose shape rule refuses the shapes it gets."""
        copy = self.fusion.clone()
        for argument, shape in zip(copy.args, shapes):
            Rewriter.replace_value_with_new_type(argument, _with_shape(argument.type, shape))
        for op, original in zip(list(copy.walk()), list(self.fusion.walk())):
            if not isinstance(op, FusionOp):
                continue
            try:
                shape = op.infer_shape()
                result_type = _with_shape(op.results[0].type, shape)
            except NotImplementedError:  # an op without a shape rule (fusion.aten) keeps its type
                continue
            except (VerifyException, HostirError) as error:
                raise self._misfit(
                    original, shapes, error.message if isinstance(error, HostirError) else str(error)
                ) from None
            Rewriter.replace_value_with_new_type(op.results[0], result_type)

    def _check_collectives(self, shapes: tuple[tuple[int, ...], ...]) -> None:
        """Refuses a collective whose buffers' extents, where the input shapes fix them, do
        not fit it (`CommunicationOp.extent_problem`, which the verifier asks of the types)."""
        for op in self.host.walk():
            if not isinstance(op, hir.CommunicationOp):
                continue
            problem = op.extent_problem(lambda buffer, axis: self._known_extent(buffer, axis, shapes))
            if problem is not None:
                raise self._misfit(op, shapes, problem)

    def _known_extent(self, buffer: SSAValue, axis: int, shapes: Sequence[Sequence[int]]) -> int | None:
        """The extent of `axis` of `buffer` where its type or the whole input `shapes` fix it
        (`buffer_extent`); None where only running the program tells it."""

        def input_extent(argument: BlockArgument, axis: int) -> int | None:
            if argument.owner is not self.host.body.block or shapes[argument.index][axis] < 0:
                return None
            return shapes[argument.index][axis]

        extent = buffer_extent(buffer, axis, input_extent)
        return extent if isinstance(extent, int) else None

    def _misfit(self, op: Operation, shapes: Sequence[Sequence[int]], why: str) -> HostirError:
        """The error of inputs of `shapes` that do not fit together at `op`."""
        shapes_text = ", ".join(f"input #{i} is {shape_str(shape)}" for i, shape in enumerate(shapes))
        return HostirError.at(
            op, f"the inputs of @{self.host.sym_name.data} do not fit together ({shapes_text}): {why}"
        )

    def _input_problem(
        self, inputs: Sequence[torch.Tensor], communicator: Communicator, values_only: bool = False
    ) -> tuple[int, str] | None:
        """This rank's verdict on its inputs: (WRONG_INPUT_COUNT or the first wrong input's index,
        why); with `values_only`, on the values and memory of `value_checked_inputs` alone."""
        name = self.host.sym_name.data
        if len(inputs) != len(self.input_types):
            return WRONG_INPUT_COUNT, f"@{name} takes {len(self.input_types)} input(s), got {len(inputs)}"
        for i in sorted(self.value_checked_inputs) if values_only else range(len(inputs)):
            value, declared = inputs[i], self.declared_inputs[i]
            problem = None if values_only else _input_problem(value, declared, communicator, i in self.aten_inputs)
            if not problem and i in self.symmetric_inputs:
                problem = _symmetric_input_problem(value, declared.type, communicator)
            if not problem:
                problem = self.value_problem(i, value)
            if problem:
                return i, f"input #{i} of @{name} on rank {communicator.rank}: {problem}"
        return None

    def _report(
        self,
        inputs: Sequence[torch.Tensor],
        communicator: Communicator,
        problem: tuple[int, str] | None,
    ) -> list[int]:
        """What this rank tells the others: [verdict, number of inputs, extent of each dynamic axis]."""
        if problem is not None:
            return [problem[0], len(inputs)] + [UNKNOWN_EXTENT] * len(self.dynamic_axes)
        held = [communicator.rank in declared.mesh for declared in self.declared_inputs]
        extents = [inputs[i].shape[axis] if held[i] else UNKNOWN_EXTENT for i, axis in self.dynamic_axes]
        return [INPUTS_OK, len(inputs), *extents]

    def _fault(self, rank: int, row: Sequence[int]) -> str:
        """What another rank's report says is wrong with its inputs."""
        verdict, count = row[0], row[1]
        if verdict == WRONG_INPUT_COUNT:
            name, takes = self.host.sym_name.data, len(self.input_types)
            return f"rank {rank} gave {count} input(s), @{name} takes {takes}"
        return f"input #{verdict} on rank {rank} is not what the program takes (rank {rank} says how)"

    def _agreed_extents(self, rows: dict[int, Sequence[int]]) -> dict[tuple[int, int], int]:
        """The extent of each dynamic input axis, which every rank holding the input must agree on."""
        extents = {}
        for column, (index, axis) in enumerate(self.dynamic_axes, start=2):
            held = {rank: row[column] for rank, row in rows.items() if row[column] != UNKNOWN_EXTENT}
            if len(set(held.values())) > 1:
                raise HostirError(
                    f"input #{index} of @{self.host.sym_name.data}: the ranks holding it disagree on "
                    f"the extent of axis {axis}: "
                    + ", ".join(f"rank {rank} has {extent}" for rank, extent in held.items())
                )
            (extents[index, axis],) = set(held.values())
        return extents



INPUTS_OK = -1
"""The verdict of a rank whose inputs fit the program; otherwise the index of the first wrong input."""
WRONG_INPUT_COUNT = -2
"""The verdict of a rank given the wrong number of inputs."""
UNKNOWN_EXTENT = -1
"""The extent a rank reports for an input it holds no piece of."""


def _apart_from(inputs: Sequence[object], outputs: list) -> list:
    """`outputs`, each that shares memory with one of `inputs` replaced by a copy."""
    shared = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor) and x.numel()}
    if not shared:  # the torch.compile backend's every run: it takes views of all its inputs
        return outputs
    return [
        y.clone() if isinstance(y, torch.Tensor) and y.numel() and y.untyped_storage().data_ptr() in shared else y
        for y in outputs
    ]


def _unwritten_since(value: torch.Tensor) -> tuple[torch.UntypedStorage, tuple]:
    """The storage of `value`'s memory, and what tells that `value`'s elements were not written
    since: where `value` views that memory, and the version counter, which views and detached
    aliases share with their base, so that a write through any of them counts. The storage,
    not the tensor, is what lasts from call to call: a compiled graph hands the program a view
    of a varying input made anew at every call (the device axis in front), and aot_autograd
    hands the backward a new alias of each saved tensor at every step. Its Python object
    lives as long as the memory does, so no later tensor in reused memory passes for it."""
    return value.untyped_storage(), (value.data_ptr(), value.shape, value.stride(), value._version)


def _exchange(row: list[int], communicator: Communicator) -> Callable[[], dict[int, list[int]]]:
    """Starts the all-gather of the `row` of every rank that runs the program
    (`communicator.ranks`), one row of int64 each on the CPU, and returns the wait for the
    rows, by rank."""
    local = torch.tensor(row, dtype=torch.int64)
    rows = [torch.empty_like(local) for _ in communicator.ranks]
    work = dist.all_gather(rows, local, group=_exchange_group(communicator), async_op=True)

    def received() -> dict[int, list[int]]:
        work.wait()
        return {rank: r.tolist() for rank, r in zip(sorted(communicator.ranks), rows)}

    return received


@functools.cache
def _exchange_group(communicator: Communicator) -> dist.ProcessGroup | None:
    """Where the ranks exchange their reports: their own group when it is gloo, else a
    gloo group of theirs (made once, by each of them, at the first run).

    On the CPU the exchange waits for nothing on the GPU: through NCCL its result would
    come after the work queued on the current stream, so every run would make the host
    wait for the GPU to drain, and the host could no longer run ahead of the device.
    """
    if communicator.backend == "gloo":
        return communicator.group(communicator.ranks)
    return dist.new_group(
        None if communicator.spans_world else sorted(communicator.ranks),
        backend="gloo",
        timeout=timedelta(seconds=communicator.timeout_s),
        use_local_synchronization=not communicator.spans_world,
    )


def _symmetric_input_problem(
    value: torch.Tensor, declared: TensorType, communicator: Communicator
) -> str | None:
    """What is wrong with `value` as an input marked `hir.symmetric`, if anything: it must be
    the whole of a tensor of `Program.symmetric_empty`, which every peer maps at the same
    place (a view would have peers read their own buffer at another offset)."""
    if communicator.rank not in declared.mesh.ids:
        return None
    try:
        buffer = communicator.copy_engine.symmetric_of(value, declared.mesh.ids)
        got = "a view of one"
    except HostirError as error:
        buffer, got = None, f"memory the peers cannot read ({error.message})"
    whole = buffer is not None and (buffer.tensor.data_ptr(), buffer.tensor.shape, buffer.tensor.stride()) == (
        value.data_ptr(),
        value.shape,
        value.stride(),
    )
    if not whole:
        return (
            "it is marked 'hir.symmetric', so it must be a whole tensor of Program.symmetric_empty "
            f"for the mesh {list(declared.mesh.ids)}, which peers read in place; got {got}"
        )
    return None


@dataclass(frozen=True)
class DeclaredInput:
    """What the check of an input reads of its type, read once: a program runs every step, and
    each read of an xDSL attribute builds Python objects anew."""

    type: TensorType
    local_shape: tuple[int, ...]
    """This rank's piece, `DYNAMIC` where the inputs set the extent."""
    dtype: torch.dtype
    mesh: tuple[int, ...]
    didx_axis: int | None
    whole_shape: tuple[int, ...]
    """The whole shape, `UNKNOWN_EXTENT` where the inputs set the extent (`full_shape`)."""

    @classmethod
    def of(cls, type: TensorType) -> DeclaredInput:
        return cls(
            type,
            tuple(type.local_shape()),
            torch_dtype(type.element_type),
            tuple(type.mesh.ids),
            type.didx_axis,
            full_shape(type, -1, {}, UNKNOWN_EXTENT),
        )


def _input_problem(value: object, declared: DeclaredInput, communicator: Communicator, aten_only: bool) -> str | None:
    """What is wrong with `value` as this rank's piece of a tensor of type `declared`, if
    anything; `aten_only`: only ATen calls read it.

    A CPU tensor beside a program on another device is an input that only ATen calls read
    and that gives them a 0-dim tensor (a 0-dim input, or a varying one whose piece is its
    device axis alone, which they read without it): ATen takes a CPU tensor beside CUDA
    tensors only as a 0-dim scalar, and refuses even one of shape [1]."""
    if not isinstance(value, torch.Tensor):
        return f"expected a torch.Tensor, got {type(value).__name__}"
    if communicator.rank not in declared.mesh:
        if value.numel() != 0:
            return (
                f"rank {communicator.rank} is outside the mesh {list(declared.mesh)}, so it takes "
                f"an empty placeholder (torch.empty(0)), got a tensor of shape {list(value.shape)}"
            )
        return None
    expected = declared.local_shape
    if len(value.shape) != len(expected) or any(
        e != DYNAMIC and e != d for e, d in zip(expected, value.shape)
    ):
        return (
            f"expected local shape {shape_str(expected)} ({declared.type.sharding_str()}), "
            f"got {list(value.shape)}"
        )
    if value.dtype != declared.dtype:
        return f"expected dtype {declared.dtype}, got {value.dtype}"
    if value.device == communicator.device:
        return None
    problem = f"expected a tensor on {communicator.device}, got one on {value.device}"
    if value.device.type != "cpu":
        return problem
    if not aten_only:
        return f"{problem}; only an input that ATen calls alone read may stay on the CPU"
    read = value.shape[1:] if declared.didx_axis == 0 else value.shape
    if read:
        return (
            f"{problem}; the ATen calls that read it would get shape {list(read)}, where they take a "
            "CPU tensor beside another device's only as a 0-dim scalar"
        )
    return None
