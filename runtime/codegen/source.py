"""The CUDA C source of a segment's kernel: its body, and the grid-stride loop around it for
the layout of a launch.
"""

from __future__ import annotations

from hostir.runtime.codegen.body import BODY_NAME, DeviceFunction, RowReduction, SegmentBody
from hostir.runtime.codegen.expressions import HELPERS
from hostir.runtime.codegen.layout import LINEAR, LaunchLayout, RowLayout

KERNEL_NAME = "hostir_segment"



def _offset(k: str, pattern: tuple[bool, ...] | None) -> str:
    """The element of access `k` (a parameter name) that iteration element i reads or writes."""
    if pattern is LINEAR:
        return "i"
    terms = [f"i{d} * {k}_stride{d}" for d, walks in enumerate(pattern) if walks]
    return " + ".join(terms) or "0"


def _index_lines(axes: set[int], rank: int, linear: str = "i") -> list[str]:
    """Statements computing `i<d>`, the index on axis d of element `linear` of the space, for d in `axes`."""
    if not axes:
        return []
    if rank == 1:
        return [f"    const long long i0 = {linear};"]
    lines = [f"    long long rest = {linear};"]
    for d in range(rank - 1, 0, -1):
        if d in axes:
            lines.append(f"    const long long i{d} = rest % extent{d};")
        if min(axes) < d:
            lines.append(f"    rest /= extent{d};")
    if 0 in axes:
        lines.append("    const long long i0 = rest;")
    return lines


def kernel_source(body: SegmentBody, layout: LaunchLayout | RowLayout) -> str:
    """The complete CUDA C of `body` for launches of `layout`: the cache key of the kernel."""
    if isinstance(layout, RowLayout):
        return _with_helpers(body, _row_kernel(body, layout))
    names = [f"in{k}" for k in range(len(body.loads))] + [
        f"out{j}" for j in range(len(body.stores))
    ]
    types = [*body.load_types, *body.store_types]
    strided = [(n, p) for n, p in zip(names, layout.patterns) if p is not LINEAR]
    parameters = [f"const {t.storage}* in{k}" for k, t in enumerate(body.load_types)]
    parameters += [f"{t.storage}* out{j}" for j, t in enumerate(body.store_types)]
    parameters.append("long long n")
    if strided:
        parameters += [f"long long extent{d}" for d in range(1, layout.rank)]
        parameters += [
            f"long long {n}_stride{d}" for n, p in strided for d, walks in enumerate(p) if walks
        ]

    lines = [
        f'extern "C" __global__ void {KERNEL_NAME}({", ".join(parameters)}) {{',
        "  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;",
        "  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;",
    ]
    start = "first"
    if layout.vector > 1:
        width = layout.vector
        vector_types = [f"hostir_vector<{t.storage}, {width}>" for t in types]
        loads = len(body.loads)
        elements = [f"a{k}.v[j]" for k in range(loads)]
        elements += [f"r{j}.v[j]" for j in range(len(body.stores))]
        lines += [
            f"  const long long vectors = n / {width};",
            "  for (long long k = first; k < vectors; k += step) {",
            *(
                f"    const {v} a{k} = reinterpret_cast<const {v}*>(in{k})[k];"
                for k, v in enumerate(vector_types[:loads])
            ),
            *(f"    {v} r{j};" for j, v in enumerate(vector_types[loads:])),
            "#pragma unroll",
            f"    for (int j = 0; j < {width}; ++j) {{",
            f"      {BODY_NAME}({', '.join(elements)});",
            "    }",
            *(
                f"    reinterpret_cast<{v}*>(out{j})[k] = r{j};"
                for j, v in enumerate(vector_types[loads:])
            ),
            "  }",
        ]
        start = f"vectors * {width} + first"
    lines.append(f"  for (long long i = {start}; i < n; i += step) {{")
    lines += _index_lines(
        {d for _, p in strided for d, walks in enumerate(p) if walks}, layout.rank
    )
    arguments = [f"{n}[{_offset(n, p)}]" for n, p in zip(names, layout.patterns)]
    lines += [f"    {BODY_NAME}({', '.join(arguments)});", "  }", "}"]
    return _with_helpers(body, "\n".join(lines))


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
    compute = reduction.element.compute
    if reduction.kind == "sum":
        return "0.0f" if compute == "float" else "0.0"
    if compute == "float":
        return "-__int_as_float(0x7f800000)"
    return "-__longlong_as_double(0x7ff0000000000000ll)"


def _row_kernel(body: SegmentBody, layout: RowLayout) -> str:
    """The kernel of a segment that reduces rows: per row, each reduction accumulated over
    the row's elements and reduced across the threads of the row's warp or block, then the
    row's elements computed and stored, then one thread's per-row stores."""
    names = [f"in{k}" for k in range(len(body.loads))] + [f"out{j}" for j in range(len(body.stores))]
    parameters = [f"const {t.storage}* in{k}" for k, t in enumerate(body.load_types)]
    parameters += [f"{t.storage}* out{j}" for j, t in enumerate(body.store_types)]
    parameters += ["long long rows", "long long columns"]
    parameters += [f"long long extent{d}" for d in range(1, layout.rank)]
    parameters += [f"long long {n}_stride{d}" for n, p in zip(names, layout.patterns) for d, walks in enumerate(p) if walks]
    parameters += [f"long long {n}_column_stride" for n, c in zip(names, layout.columns) if c == "strided"]

    def element(k: int, j: str) -> str:
        """Access k (a load, then the stores) at element `j` of its row."""
        column = layout.columns[k]
        offset = f"{names[k]}_row" + {"": "", "unit": f" + {j}", "strided": f" + {j} * {names[k]}_column_stride"}[column]
        return f"{names[k]}[{offset}]"

    def call(function: DeviceFunction, j: str) -> str:
        arguments = [element(k, j) for k in function.loads] + [f"s{i}" for i in function.reduced]
        arguments += [f"r{j}" for j in function.stores]
        return f"{function.name}({', '.join(arguments)})"

    if layout.warp_per_row:
        lines = [
            f'extern "C" __global__ void {KERNEL_NAME}({", ".join(parameters)}) {{',
            "  // One warp per row.",
            "  const int first = threadIdx.x % 32;",
            "  const int step = 32;",
            "  const long long warps = blockDim.x / 32;",
            "  for (long long row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += gridDim.x * warps) {",
        ]
    else:
        lines = [
            f'extern "C" __global__ void {KERNEL_NAME}({", ".join(parameters)}) {{',
            "  // One block per row; each warp's partial reductions meet in shared memory.",
            *(f"  __shared__ {r.element.compute} partials{i}[32];" for i, r in enumerate(body.reductions)),
            "  const int first = threadIdx.x;",
            "  const int step = blockDim.x;",
            "  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {",
        ]
    lines += _index_lines({d for p in layout.patterns for d, walks in enumerate(p) if walks}, layout.rank, "row")
    for n, p in zip(names, layout.patterns):
        terms = [f"i{d} * {n}_stride{d}" for d, walks in enumerate(p) if walks]
        lines.append(f"    const long long {n}_row = {' + '.join(terms) or '0'};")
    for i, reduction in enumerate(body.reductions):
        compute, maximum = reduction.element.compute, reduction.kind == "max"
        combined = f"(s{i} > e || s{i} != s{i}) ? s{i} : e" if maximum else f"s{i} + e"
        across = f"hostir_warp_reduce<{str(maximum).lower()}>(s{i})"
        if not layout.warp_per_row:
            across = f"hostir_block_reduce<{str(maximum).lower()}>(s{i}, partials{i}, {reduction_identity(reduction)})"
        lines += [
            f"    {compute} s{i} = {reduction_identity(reduction)};",
            "    for (long long j = first; j < columns; j += step) {",
            f"      const {compute} e = {call(reduction.function, 'j')};",
            f"      s{i} = {combined};",
            "    }",
            f"    s{i} = {reduction.element.rounding.format(across)};",
        ]
    for function in body.functions:
        stores = [f"      {body.store_types[j].storage} r{j};" for j in function.stores]
        written = [f"      {element(len(body.loads) + j, 'j')} = r{j};" for j in function.stores]
        if function.name == BODY_NAME:
            lines += ["    for (long long j = first; j < columns; j += step) {", *stores, f"      {call(function, 'j')};", *written, "    }"]
        else:
            lines += ["    if (first == 0) {", *stores, f"      {call(function, '0')};", *written, "    }"]
    lines += ["  }", "}"]
    return "\n".join(lines)
