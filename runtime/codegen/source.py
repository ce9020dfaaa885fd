"""The CUDA C source of a segment's kernel: its body, and the grid-stride loop around it for
the layout of a launch.
"""

from __future__ import annotations

from hostir.runtime.codegen.body import BODY_NAME, SegmentBody
from hostir.runtime.codegen.expressions import HELPERS
from hostir.runtime.codegen.layout import LINEAR, LaunchLayout

KERNEL_NAME = "hostir_segment"



def _offset(k: str, pattern: tuple[bool, ...] | None) -> str:
    """The element of access `k` (a parameter name) that iteration element i reads or writes."""
    if pattern is LINEAR:
        return "i"
    terms = [f"i{d} * {k}_stride{d}" for d, walks in enumerate(pattern) if walks]
    return " + ".join(terms) or "0"


def _index_lines(axes: set[int], rank: int) -> list[str]:
    """Statements computing `i<d>`, the index on axis d of iteration element i, for d in `axes`."""
    if not axes:
        return []
    if rank == 1:
        return ["    const long long i0 = i;"]
    lines = ["    long long rest = i;"]
    for d in range(rank - 1, 0, -1):
        if d in axes:
            lines.append(f"    const long long i{d} = rest % extent{d};")
        if min(axes) < d:
            lines.append(f"    rest /= extent{d};")
    if 0 in axes:
        lines.append("    const long long i0 = rest;")
    return lines


def kernel_source(body: SegmentBody, layout: LaunchLayout) -> str:
    """The complete CUDA C of `body` for launches of `layout`: the cache key of the kernel."""
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
    kernel = "\n".join(lines)

    code = body.source + "\n" + kernel
    helpers = [source for name, source in HELPERS.items() if name in code]
    return "\n\n".join([*helpers, body.source, kernel]) + "\n"
