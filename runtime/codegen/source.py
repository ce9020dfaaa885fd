"""The CUDA C source of a segment's kernel: its body, and the loops around it for the layout of
a launch.

A pointwise segment's kernel is a grid-stride loop over the iteration space; a row segment's
walks it row by row, a warp or a block per row. Both move a thread's elements in *steps*
(`_step`): at a vector layout the accesses that walk the innermost axis load a vector of
elements each, the body runs on each element of it, and the results are stored as a vector;
at a scalar layout the body reads and writes each element in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import NamedTuple

from hostir.runtime.codegen.body import BODY_NAME, DeviceFunction, RowReduction, SegmentBody
from hostir.runtime.codegen.expressions import HELPERS, float_literal
from hostir.runtime.codegen.layout import BROADCAST, LINEAR, STRIDED, UNIT, LaunchLayout, Pattern, RowLayout

KERNEL_NAME = "hostir_segment"

BLOCK_THREADS_BOUND = 1024
"""The threads a row kernel is compiled for (`__launch_bounds__`), the most a block has: the
compiler keeps it to 64 registers a thread, so that any block a launch asks for starts."""


class _Access(NamedTuple):
    """A load or a store of the kernel: its pointer parameter and its register."""

    pointer: str
    """`in<k>` or `out<j>`."""
    register: str
    """`a<k>` or `r<j>`: the device functions' parameter it feeds."""
    storage: str
    pattern: Pattern | None
    stored: bool
    rotated: bool
    """Read at the other half of the last axis (`Access.rotated`)."""

    @property
    def vectorized(self) -> bool:
        """Whether it moves vectors, at a vector layout: it walks the innermost axis with unit stride."""
        return self.pattern is LINEAR or self.pattern[-1] == UNIT


def _accesses(body: SegmentBody, layout: LaunchLayout) -> list[_Access]:
    """The loads, then the stores."""
    named = [(f"in{k}", f"a{k}", t, False, a.rotated) for k, (t, a) in enumerate(zip(body.load_types, body.loads))]
    named += [(f"out{j}", f"r{j}", t, True, False) for j, t in enumerate(body.store_types)]
    return [
        _Access(p, r, t.storage, pattern, stored, rotated)
        for (p, r, t, stored, rotated), pattern in zip(named, layout.patterns)
    ]


def _parameters(body: SegmentBody, layout: LaunchLayout, counts: Sequence[str]) -> str:
    """The pointers, the counts, the extents of the merged axes but the outermost where an access
    is indexed by axis, the half extent of the last axis where a load is rotated, then the
    strides that are arguments (kernels.py passes them in this order)."""
    index = layout.index
    accesses = _accesses(body, layout)
    parameters = [f"const {a.storage}* {a.pointer}" for a in accesses[: len(body.loads)]]
    parameters += [f"{a.storage}* {a.pointer}" for a in accesses[len(body.loads) :]]
    parameters += [f"{index} {count}" for count in counts]
    indexed = [a for a in accesses if a.pattern is not LINEAR]
    if indexed:
        parameters += [f"{index} extent{d}" for d in range(1, layout.rank)]
        parameters += [f"{index} half"] if body.rotates else []
        parameters += [
            f"{index} {a.pointer}_stride{d}" for a in indexed for d, kind in enumerate(a.pattern) if kind == STRIDED
        ]
    return ", ".join(parameters)


def _terms(access: _Access, indices: Mapping[int, str]) -> list[str]:
    """The terms of the offset of `access` at the index `indices[d]` of each axis d given."""
    terms = []
    for d, kind in enumerate(access.pattern):
        index = indices.get(d)
        if index is not None and access.rotated and d == len(access.pattern) - 1:
            index = f"({index} < half ? {index} + half : {index} - half)"
        if index is not None and kind == UNIT:
            terms.append(index)
        elif index is not None and kind == STRIDED:
            terms.append(f"{index} * {access.pointer}_stride{d}")
    return terms


def _index_lines(axes: Collection[int], rank: int, index: str, linear: str) -> list[str]:
    """Statements computing `i<d>`, the index on axis d of element `linear` of the space, for d in `axes`."""
    if not axes:
        return []
    if rank == 1:
        return [f"const {index} i0 = {linear};"]
    lines = [f"{index} rest = {linear};"]
    for d in range(rank - 1, 0, -1):
        if d in axes:
            lines.append(f"const {index} i{d} = rest % extent{d};")
        if min(axes) < d:
            lines.append(f"rest /= extent{d};")
    if 0 in axes:
        lines.append(f"const {index} i0 = rest;")
    return lines


def _indent(lines: Sequence[str], depth: int = 1) -> list[str]:
    return ["  " * depth + line if not line.startswith("#") else line for line in lines]


def _vector(access: _Access, width: int) -> str:
    return f"hostir_vector<{access.storage}, {width}>"


def _call(function: DeviceFunction, element: Callable[[int], str], loads: int, first_half: str = "") -> str:
    """The call of `function` on the elements of its loads (`element(k)` is access k's), whether
    the elements are in the first half of the last axis (`first_half`, the C of it) for each
    rotated load, the reductions' values, and the elements of its stores (accesses `loads + j`)."""
    arguments = [element(k) for k in function.loads] + [first_half for _ in function.rotated]
    arguments += [f"s{i}" for i in function.reduced]
    arguments += [element(loads + j) for j in function.stores]
    return f"{function.name}({', '.join(arguments)})"


Calls = Sequence[tuple[DeviceFunction, Callable[[str], list[str]]]]
"""Device functions, each with the statements that use the C of a call of it."""


def _step(
    accesses: Sequence[_Access],
    calls: Calls,
    width: int,
    offset: Callable[[int], str],
    kept: Collection[int] = (),
    first_half: str = "",
) -> list[str]:
    """The lines of one step of a thread over `width` elements (1: one element) of the accesses
    of the functions of `calls`, at `offset(k)` for access k: for each element, each
    function's `statements(call)`, where `call` is the C of calling the function there. A
    scalar step reads and writes elements in place. A vector step loads a vector of each
    access that walks the innermost axis (one element of each other: it is broadcast along
    that axis), runs the statements on each element, and stores the results' vectors. Loads
    in `kept` are in the registers `a<k>[c]` already (a row's vector c of this thread).
    `first_half` is the C of whether the step's elements are in the first half of the last
    axis, for the rotated loads (a vector lies in one half: its width divides the half)."""
    loads = sum(not a.stored for a in accesses)

    def statements_at(element: Callable[[int], str]) -> list[str]:
        """Each function's statements on the element that `element(k)` names of access k."""
        return [line for f, statements in calls for line in statements(_call(f, element, loads, first_half))]

    if width == 1:

        def in_place(k: int) -> str:
            return f"{accesses[k].register}[c]" if k in kept else f"{accesses[k].pointer}[{offset(k)}]"

        return statements_at(in_place)

    def element(k: int) -> str:
        a = accesses[k]
        if not a.vectorized:
            return a.register
        return f"{a.register}[c].v[e]" if k in kept else f"{a.register}.v[e]"

    before, after = [], []
    used = [*(k for f, _ in calls for k in f.loads), *(loads + j for f, _ in calls for j in f.stores)]
    for k in dict.fromkeys(used):
        a = accesses[k]
        if k in kept:
            continue
        if a.stored:
            before.append(f"{_vector(a, width) if a.vectorized else a.storage} {a.register};")
            stored = f"hostir_store({a.pointer} + {offset(k)}, {a.register});"
            after.append(stored if a.vectorized else f"{a.pointer}[{offset(k)}] = {a.register};")
        elif a.vectorized:
            before.append(f"const {_vector(a, width)} {a.register} = hostir_load<{width}>({a.pointer} + {offset(k)});")
        else:
            before.append(f"const {a.storage} {a.register} = {a.pointer}[{offset(k)}];")
    return [
        *before,
        "#pragma unroll",
        f"for (int e = 0; e < {width}; ++e) {{",
        *_indent(statements_at(element)),
        "}",
        *after,
    ]


def kernel_source(body: SegmentBody, layout: LaunchLayout) -> str:
    """The complete CUDA C of `body` for launches of `layout`: the cache key of the kernel."""
    if isinstance(layout, RowLayout):
        return _with_helpers(body, _row_kernel(body, layout))
    index, width = layout.index, layout.vector
    accesses = _accesses(body, layout)
    (function,) = body.functions
    axes = {d for a in accesses if a.pattern is not LINEAR for d, kind in enumerate(a.pattern) if kind != BROADCAST}
    if body.rotates:
        # A rotated load's sign reads the last axis's index, even where no access walks that
        # axis by index (the rotated buffer broadcast along it, the others linear).
        axes.add(layout.rank - 1)
    indices = {d: f"i{d}" for d in range(layout.rank)}

    def offset(k: int) -> str:
        if accesses[k].pattern is LINEAR:
            return "i"
        return " + ".join(_terms(accesses[k], indices)) or "0"

    def loop(start: str, stop: str, width: int) -> list[str]:
        """The grid-stride loop over the steps of `width` elements from `start` to `stop`: over
        the vectors `k`, from element `i = k * width`, or over the elements `i`."""
        counter = "k" if width > 1 else "i"
        lines = [f"for ({index} {counter} = {start}; {counter} < {stop}; {counter} += step) {{"]
        if width > 1:
            lines.append(f"  const {index} i = k * {width};")
        lines += _indent(_index_lines(axes, layout.rank, index, "i"))
        first_half = f"i{layout.rank - 1} < half" if body.rotates else ""
        step = _step(accesses, [(function, _statement)], width, offset, first_half=first_half)
        return [*lines, *_indent(step), "}"]

    lines = [
        f"const {index} step = static_cast<{index}>(gridDim.x) * blockDim.x;",
        f"const {index} first = static_cast<{index}>(blockIdx.x) * blockDim.x + threadIdx.x;",
    ]
    if width == 1:
        lines += loop("first", "n", 1)
    else:
        lines += [f"// Vectors of {width} elements; a thread moves one a step.", f"const {index} vectors = n / {width};"]
        lines += loop("first", "vectors", width)
        if layout.rank == 1:  # the elements after the last whole vector
            lines += loop(f"vectors * {width} + first", "n", 1)
    source = [
        f'extern "C" __global__ void {KERNEL_NAME}({_parameters(body, layout, ["n"])}) {{',
        *_indent(lines),
        "}",
    ]
    return _with_helpers(body, "\n".join(source))


def _statement(call: str) -> list[str]:
    return [f"{call};"]


def _with_helpers(body: SegmentBody, kernel: str) -> str:
    """The source of `kernel`: the helpers it and the body name (and those they name), the
    body, the kernel."""
    code = body.source + "\n" + kernel
    helpers: list[str] = []
    for name, source in reversed(HELPERS.items()):  # a helper names only those before it
        if name in code:
            helpers.insert(0, source)
            code += "\n" + source
    return "\n\n".join([*helpers, body.source, kernel]) + "\n"


def reduction_identity(reduction: RowReduction) -> str:
    """The C of the value a reduction starts from: 0 for a sum, -infinity for a max."""
    return float_literal(0.0 if reduction.kind == "sum" else -math.inf, reduction.element.compute)


def _row_kernel(body: SegmentBody, layout: RowLayout) -> str:
    """The kernel of a segment that reduces rows: per row, each reduction accumulated over
    the row's elements and reduced across the threads of the row's warp or block, then the
    row's elements computed and stored, then one thread's per-row stores. Where the layout
    keeps the row in registers, the loads of the reductions are read once, before them."""
    index, width, cached = layout.index, layout.vector, layout.cached
    counted = cached or layout.steps
    accesses = _accesses(body, layout)
    loads = len(body.loads)
    rank = layout.rank
    walking = {k for k, a in enumerate(accesses) if a.pattern[rank] != BROADCAST}
    kept = sorted({k for r in body.reductions for k in r.function.loads} & walking) if cached else []

    def offset(k: int) -> str:
        return " + ".join([f"{accesses[k].pointer}_row", *_terms(accesses[k], {rank: "j"})])

    def walk(lines: list[str]) -> list[str]:
        """`lines` for each step of this thread along the row, at its column `j`: the `c`th step
        where the layout counts them."""
        if counted:
            column = f"(first + c * step) * {width}" if width > 1 else "first + c * step"
            return [
                "#pragma unroll",
                f"for (int c = 0; c < {counted}; ++c) {{",
                f"  const {index} j = {column};",
                "  if (j < columns) {",
                *_indent(lines, 2),
                "  }",
                "}",
            ]
        start, stride = (f"first * {width}", f"step * {width}") if width > 1 else ("first", "step")
        return [f"for ({index} j = {start}; j < columns; j += {stride}) {{", *_indent(lines), "}"]

    sums = [
        f"{c.element.compute} column_sum{i}[{counted}]{f'[{width}]' if width > 1 else ''} = {{}};"
        for i, c in enumerate(body.column_sums)
    ]
    if sums:
        sums.insert(0, "// This thread's sums of its columns over the rows it walks.")
    if layout.warp_per_row:
        lines = [
            *sums,
            "// One warp per row.",
            "const int first = threadIdx.x % 32;",
            "const int step = 32;",
            f"const {index} warps = blockDim.x / 32;",
            f"for ({index} row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {{",
        ]
    else:
        lines = [
            "// One block per row; each warp's partial reductions meet in shared memory.",
            *(f"__shared__ {r.element.compute} partials{i}[32];" for i, r in enumerate(body.reductions)),
            *sums,
            "const int first = threadIdx.x;",
            "const int step = blockDim.x;",
            f"for ({index} row = blockIdx.x; row < rows; row += gridDim.x) {{",
        ]
    row_indices = {d: f"i{d}" for d in range(rank)}
    row = _index_lines({d for a in accesses for d, kind in enumerate(a.pattern[:rank]) if kind != BROADCAST}, rank, index, "row")
    row += [f"const {index} {a.pointer}_row = {' + '.join(_terms(a, row_indices)) or '0'};" for a in accesses]
    if kept:
        held = f"{cached} vector{'s' * (cached > 1)} of {width}" if width > 1 else f"{cached} element{'s' * (cached > 1)}"
        row.append(f"// This thread's {held} of the row, read once.")
        for k in kept:
            a = accesses[k]
            row.append(f"{_vector(a, width) if width > 1 else a.storage} {a.register}[{cached}];")
        loaded = [f"hostir_load<{width}>({accesses[k].pointer} + {offset(k)})" if width > 1 else f"{accesses[k].pointer}[{offset(k)}]" for k in kept]
        row += walk([f"{accesses[k].register}[c] = {value};" for k, value in zip(kept, loaded)])
    for i, reduction in enumerate(body.reductions):
        compute, maximum = reduction.element.compute, reduction.kind == "max"
        combined = f"(s{i} > x || s{i} != s{i}) ? s{i} : x" if maximum else f"s{i} + x"
        across = f"hostir_warp_reduce<{str(maximum).lower()}>(s{i})"
        if not layout.warp_per_row:
            across = f"hostir_block_reduce<{str(maximum).lower()}>(s{i}, partials{i}, {reduction_identity(reduction)})"

        def accumulate(call: str, i: int = i, compute: str = compute, combined: str = combined) -> list[str]:
            return [f"const {compute} x = {call};", f"s{i} = {combined};"]

        row.append(f"{compute} s{i} = {reduction_identity(reduction)};")
        row += walk(_step(accesses, [(reduction.function, accumulate)], width, offset, kept))
        row.append(f"s{i} = {reduction.element.rounding.format(across)};")
    element = "[c][e]" if width > 1 else "[c]"

    def summed(i: int) -> Callable[[str], list[str]]:
        return lambda call: [f"column_sum{i}{element} += {call};"]

    # The row's elements: each stored, and each added to its column's sum.
    passes = [(f, _statement) for f in body.functions if f.name == BODY_NAME]
    passes += [(c.function, summed(i)) for i, c in enumerate(body.column_sums)]
    if passes:
        row += walk(_step(accesses, passes, width, offset, kept))
    for function in body.functions:
        if function.name != BODY_NAME:  # the per-row stores, at the row's first column
            call = _call(function, lambda k: f"{accesses[k].pointer}[{accesses[k].pointer}_row]", loads)
            row += ["if (first == 0) {", f"  {call};", "}"]
    lines += [*_indent(row), "}"]
    if body.column_sums:
        # Row `partial` of each column sum's partial sums: this block's, or this warp's.
        partial = "blockIdx.x * warps + threadIdx.x / 32" if layout.warp_per_row else "blockIdx.x"
        lines.append(f"const {index} partial = {partial};")
        written = [
            f"out{c.output}[partial * columns + j{' + e' if width > 1 else ''}] = column_sum{i}{element};"
            for i, c in enumerate(body.column_sums)
        ]
        if width > 1:
            written = ["#pragma unroll", f"for (int e = 0; e < {width}; ++e) {{", *_indent(written), "}"]
        lines += walk(written)
    source = [
        f'extern "C" __global__ void __launch_bounds__({BLOCK_THREADS_BOUND}) '
        f"{KERNEL_NAME}({_parameters(body, layout, ['rows', 'columns'])}) {{",
        *_indent(lines),
        "}",
    ]
    return "\n".join(source)
