"""Fused CUDA kernels for pointwise segments: CUDA C generated from the segment, compiled by CuPy.

`hir.launch_kernel @seg` runs a `func.func` of pointwise fusion ops on buffers. On a
GPU, `SegmentKernel(seg).launch(ins, outs)` runs it as one kernel that reads every
input once and writes every output once; it returns False where it cannot (CPU
tensors, no CuPy), and the caller then evaluates the segment eagerly with
`fusion_eval`, whose results the kernel reproduces (docs/kernels.md).

Code generation has two halves. The *body* depends only on the segment: one
`__device__` function that takes one stored element per load and computes every
output element in registers. Which element of an input a thread reads follows
from torch broadcasting (operands align on their last axes; `fusion.broadcast`
inserts axes), so every input is read through an *axis map*: the axes of the
iteration space its own axes walk. The *kernel* around the body depends on the
buffers' layout: the iteration space with mergeable axes merged, which accesses are
linear (element i of the space is element i of the buffer), which axes of the
others are broadcast (stride 0), and how many elements a thread moves per vector
access. Sizes, strides and pointers are kernel arguments, so the generated source
is exactly what the compiled code depends on, and it is the cache key.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from hostir_dialect import fusion
from hostir_dialect.builder import constant_value, torch_dtype
from hostir_dialect.text import HostirError

try:
    import cupy
except ImportError:  # CuPy is the optional `gpu` extra; without it segments run eagerly.
    cupy = None

KERNEL_NAME = "hostir_segment"
BODY_NAME = "hostir_segment_body"
THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 128
"""The most blocks per SM a launch asks for (16 waves of 8 resident blocks); grid-stride
loops do the rest. On an H100 this moved 10% more bytes per second than one wave, and
10% more than one vector per thread (docs/kernels.md)."""
VECTOR_BYTES = 16
"""The widest load a thread issues (ld.global.v4.u32)."""

FLOATING, INTEGER, BOOLEAN = "floating-point", "integer", "boolean"


@dataclass(frozen=True)
class ElementType:
    """How elements of one fusion element type are stored and computed on in CUDA C."""

    storage: str
    """The C type of a buffer element."""
    compute: str
    """The C type pointwise math runs in: f32 for bf16/f16, as fusion_eval does."""
    category: str
    load: str = "{}"
    """Storage -> compute."""
    store: str = "{}"
    """Compute -> storage, rounding once."""

    @property
    def rounding(self) -> str:
        """Compute -> compute through storage: what a cast to this type does to a value."""
        return self.load.format(self.store)

    @property
    def math_suffix(self) -> str:
        """`f` for the float overloads of libm (expf), nothing for double (exp)."""
        return "f" if self.compute == "float" else ""


ELEMENT_TYPES: dict[str, ElementType] = {
    "f64": ElementType("double", "double", FLOATING),
    "f32": ElementType("float", "float", FLOATING),
    "f16": ElementType(
        "unsigned short", "float", FLOATING, "hostir_f16_to_f32({})", "hostir_f32_to_f16({})"
    ),
    "bf16": ElementType(
        "unsigned short", "float", FLOATING, "hostir_bf16_to_f32({})", "hostir_f32_to_bf16({})"
    ),
    "i64": ElementType("long long", "long long", INTEGER),
    "i32": ElementType("int", "int", INTEGER),
    "i8": ElementType("signed char", "signed char", INTEGER),
    "i1": ElementType("bool", "bool", BOOLEAN),
}
"""bf16 and f16 are stored as their 16 bits: CuPy has no bf16, and no CUDA header is needed."""

HELPERS: dict[str, str] = {
    "hostir_bf16_to_f32": """\
__device__ __forceinline__ float hostir_bf16_to_f32(unsigned short bits) {
  return __uint_as_float(static_cast<unsigned int>(bits) << 16);
}""",
    "hostir_f32_to_bf16": """\
// Round to nearest even, as torch's c10::BFloat16; a NaN stays a quiet NaN.
__device__ __forceinline__ unsigned short hostir_f32_to_bf16(float value) {
  const unsigned int bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<unsigned short>((bits >> 16) | 0x40u);
  }
  return static_cast<unsigned short>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}""",
    "hostir_f16_to_f32": """\
__device__ __forceinline__ float hostir_f16_to_f32(unsigned short bits) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
  return value;
}""",
    "hostir_f32_to_f16": """\
__device__ __forceinline__ unsigned short hostir_f32_to_f16(float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}""",
    "hostir_powi": """\
// torch's integer pow: exponentiation by squaring in the operands' type.
template <typename T>
__device__ __forceinline__ T hostir_powi(T base, T exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exponent % 2) ? -1 : 1;
    return 0;
  }
  T result = 1;
  while (exponent) {
    if (exponent & 1) result *= base;
    exponent /= 2;
    base *= base;
  }
  return result;
}""",
    "hostir_vector": """\
template <typename T, int N>
struct alignas(sizeof(T) * N) hostir_vector {
  T v[N];
};""",
}
"""Device code the generated source includes when it names it."""


def element_type(value: SSAValue) -> ElementType:
    return ELEMENT_TYPES[fusion.element_type_name(fusion.tensor_type(value).element_type)]


def _torch_dtype(value: SSAValue) -> torch.dtype:
    return torch_dtype(fusion.tensor_type(value).element_type)


# --------------------------------------------------------------------------- #
# Expressions of ops                                                           #
# --------------------------------------------------------------------------- #

Expression = Callable[[Operation, Sequence[str]], str]
"""`expression(op, operand variables)`: the C expression of the op's result."""


def _pointwise(**by_category: str) -> Expression:
    """The expression of an op from a template per element category; other categories are refused.

    `{0}`, `{1}` are the operands, `{f}` the libm suffix of the compute type.
    """

    def expression(op: Operation, operands: Sequence[str]) -> str:
        dtype = fusion.element_type_name(fusion.tensor_type(op.operands[0]).element_type)
        element = ELEMENT_TYPES[dtype]
        template = by_category.get(element.category)
        if template is None:
            raise HostirError.at(
                op,
                f"'{op.name}' on {dtype} cannot be fused into a kernel: it takes "
                + " or ".join(by_category)
                + f" element types only (on {dtype} torch computes it in floating point or "
                "rejects it); insert a fusion.cast",
            )
        return template.format(*operands, f=element.math_suffix)

    return expression


def _cast(op: fusion.CastOp, operands: Sequence[str]) -> str:
    source, target = element_type(op.input), element_type(op.result)
    value = operands[0]
    if target.category == BOOLEAN:
        value = f"({value} != 0)"
    elif source.compute != target.compute:
        value = f"static_cast<{target.compute}>({value})"
    return target.rounding.format(value)


def _constant(op: fusion.ConstantOp, operands: Sequence[str]) -> str:
    value = constant_value(op)
    compute = element_type(op.result).compute
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value == -(2**63):
            return "(-9223372036854775807LL - 1)"
        return f"{value}LL" if compute == "long long" else str(value)
    if math.isfinite(value):
        return repr(value) + ("f" if compute == "float" else "")
    if compute == "float":
        return f"__uint_as_float(0x{struct.unpack('<I', struct.pack('<f', value))[0]:08x}u)"
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    return f"__longlong_as_double(static_cast<long long>(0x{bits:016x}ull))"


EXPRESSIONS: dict[type[Operation], Expression] = {
    fusion.NegOp: _pointwise(**{FLOATING: "-{0}", INTEGER: "-{0}"}),
    fusion.AbsOp: _pointwise(**{FLOATING: "fabs{f}({0})", INTEGER: "({0} < 0 ? -{0} : {0})"}),
    fusion.ExpOp: _pointwise(**{FLOATING: "exp{f}({0})"}),
    fusion.LogOp: _pointwise(**{FLOATING: "log{f}({0})"}),
    fusion.SqrtOp: _pointwise(**{FLOATING: "sqrt{f}({0})"}),
    # `x < 0` is false for NaN and -0, which relu returns unchanged as torch does.
    fusion.ReluOp: _pointwise(**{FLOATING: "({0} < 0 ? 0 : {0})", INTEGER: "({0} < 0 ? 0 : {0})"}),
    fusion.TanhOp: _pointwise(**{FLOATING: "tanh{f}({0})"}),
    fusion.SigmoidOp: _pointwise(**{FLOATING: "1 / (1 + exp{f}(-{0}))"}),
    fusion.ErfOp: _pointwise(**{FLOATING: "erf{f}({0})"}),
    fusion.AddOp: _pointwise(
        **{FLOATING: "{0} + {1}", INTEGER: "{0} + {1}", BOOLEAN: "{0} || {1}"}
    ),
    fusion.SubOp: _pointwise(**{FLOATING: "{0} - {1}", INTEGER: "{0} - {1}"}),
    fusion.MulOp: _pointwise(
        **{FLOATING: "{0} * {1}", INTEGER: "{0} * {1}", BOOLEAN: "{0} && {1}"}
    ),
    fusion.DivOp: _pointwise(**{FLOATING: "{0} / {1}"}),
    # NaN-propagating, as torch.maximum/minimum: `{0} != {0}` is true only for NaN.
    fusion.MaximumOp: _pointwise(
        **{c: "({0} > {1} || {0} != {0}) ? {0} : {1}" for c in (FLOATING, INTEGER, BOOLEAN)}
    ),
    fusion.MinimumOp: _pointwise(
        **{c: "({0} < {1} || {0} != {0}) ? {0} : {1}" for c in (FLOATING, INTEGER, BOOLEAN)}
    ),
    fusion.PowOp: _pointwise(**{FLOATING: "pow{f}({0}, {1})", INTEGER: "hostir_powi({0}, {1})"}),
    fusion.CastOp: _cast,
    fusion.ConstantOp: _constant,
}
"""Fusion op class -> the C expression of its result, in the result's compute type."""

ALIASES = (fusion.BroadcastOp, fusion.SetOp)
"""Ops whose result is their operand in a kernel: the axis map says which element is read."""


# --------------------------------------------------------------------------- #
# The body: what a segment computes per element                                #
# --------------------------------------------------------------------------- #

AxisMap = tuple[int, ...]
"""For each axis of a value, the axis of the iteration space it walks."""


class Access(NamedTuple):
    """One buffer read or written per element: `ins[operand]` or `outs[operand]` through `axes`."""

    operand: int
    axes: AxisMap


def _operand_maps(op: Operation, result_map: AxisMap) -> list[AxisMap]:
    """The axis maps of `op`'s operands when its result is walked through `result_map`."""
    if isinstance(op, fusion.BroadcastOp):
        new_axes = fusion.normalize_axes(op.new_axes.get_values(), len(result_map), "broadcast")
        return [tuple(a for i, a in enumerate(result_map) if i not in new_axes)]
    # torch broadcasting: an operand's axes are the result's last ones.
    return [result_map[len(result_map) - fusion.tensor_type(v).rank :] for v in op.operands]


@dataclass(frozen=True)
class SegmentBody:
    """A segment as one device function of its loaded elements, and the accesses that feed it."""

    name: str
    rank: int
    """The rank of the iteration space: the largest rank of an output."""
    input_dtypes: tuple[torch.dtype, ...]
    output_dtypes: tuple[torch.dtype, ...]
    loads: tuple[Access, ...]
    stores: tuple[Access, ...]
    load_types: tuple[ElementType, ...]
    store_types: tuple[ElementType, ...]
    source: str
    """The `__device__` function, BODY_NAME(loaded elements..., stored elements&...)."""

    @classmethod
    def of(cls, segment: func.FuncOp) -> SegmentBody:
        """Analyses `segment`; raises HostirError for an op or a dtype a kernel cannot compute."""
        name = segment.sym_name.data
        ops = list(segment.body.block.ops)
        returned = ops.pop() if ops and isinstance(ops[-1], func.ReturnOp) else None
        if returned is None:
            raise HostirError.at(segment, f"segment @{name} does not end with func.return")
        for op in ops:
            if type(op) not in EXPRESSIONS and not isinstance(op, ALIASES):
                raise HostirError.at(
                    op,
                    f"'{op.name}' cannot be part of the fused pointwise kernel of segment @{name}",
                )
        for value in (*segment.args, *returned.arguments):
            if not isinstance(value.type, fusion.TensorType):
                raise HostirError.at(
                    segment,
                    f"segment @{name} has a value of type {value.type}, not a !fusion.tensor",
                )
        if not returned.arguments:
            raise HostirError.at(
                segment, f"segment @{name} returns nothing; a kernel needs an output"
            )
        rank = max(fusion.tensor_type(v).rank for v in returned.arguments)

        # Backwards: the axis maps each value is needed under, from the outputs' maps.
        maps: dict[SSAValue, dict[AxisMap, None]] = {}
        output_maps = [
            tuple(range(rank - fusion.tensor_type(v).rank, rank)) for v in returned.arguments
        ]
        for value, axes in zip(returned.arguments, output_maps):
            maps.setdefault(value, {})[axes] = None
        for op in reversed(ops):
            for axes in maps.get(op.results[0], ()):
                for operand, operand_axes in zip(op.operands, _operand_maps(op, axes)):
                    maps.setdefault(operand, {})[operand_axes] = None

        # Forwards: one variable per (value, axis map).
        variables: dict[tuple[SSAValue, AxisMap], str] = {}
        lines: list[str] = []

        def define(value: SSAValue, axes: AxisMap, expression: str) -> None:
            variables[value, axes] = f"v{len(lines)}"
            lines.append(
                f"  const {element_type(value).compute} {variables[value, axes]} = {expression};"
            )

        loads = [
            Access(i, axes) for i, arg in enumerate(segment.args) for axes in maps.get(arg, ())
        ]
        for k, load in enumerate(loads):
            arg = segment.args[load.operand]
            define(arg, load.axes, element_type(arg).load.format(f"a{k}"))
        for op in ops:
            for axes in maps.get(op.results[0], ()):
                operands = [variables[v, a] for v, a in zip(op.operands, _operand_maps(op, axes))]
                if isinstance(op, ALIASES):
                    variables[op.results[0], axes] = operands[0]
                else:
                    define(op.results[0], axes, EXPRESSIONS[type(op)](op, operands))
        stores = [Access(j, axes) for j, axes in enumerate(output_maps)]
        for j, (value, axes) in enumerate(zip(returned.arguments, output_maps)):
            lines.append(f"  r{j} = {element_type(value).store.format(variables[value, axes])};")

        load_types = tuple(element_type(segment.args[a.operand]) for a in loads)
        store_types = tuple(element_type(v) for v in returned.arguments)
        parameters = [f"const {t.storage} a{k}" for k, t in enumerate(load_types)]
        parameters += [f"{t.storage}& r{j}" for j, t in enumerate(store_types)]
        source = "\n".join(
            [
                f"__device__ __forceinline__ void {BODY_NAME}({', '.join(parameters)}) {{",
                *lines,
                "}",
            ]
        )
        return cls(
            name,
            rank,
            tuple(_torch_dtype(a) for a in segment.args),
            tuple(_torch_dtype(v) for v in returned.arguments),
            tuple(loads),
            tuple(stores),
            load_types,
            store_types,
            source,
        )


# --------------------------------------------------------------------------- #
# The layout: how the buffers of one launch are walked                         #
# --------------------------------------------------------------------------- #

Strides = tuple[int, ...]

LINEAR = None
"""The pattern of an access whose buffer element i is iteration element i."""


class LaunchLayout(NamedTuple):
    """What the kernel's source depends on besides the body: the launch's *broadcast pattern*."""

    rank: int
    """The rank of the iteration space after merging axes."""
    patterns: tuple[tuple[bool, ...] | None, ...]
    """Per load then store: LINEAR, or which axes have a nonzero stride."""
    vector: int
    """Elements per vector access; 1 for none (only when every access is linear)."""


def merge_axes(
    extents: Sequence[int], strides: Sequence[Strides]
) -> tuple[list[int], list[list[int]]]:
    """Drops extent-1 axes and merges neighbours that every access walks as one axis.

    Axis d merges into its outer neighbour when, for every access, the outer stride is
    the inner stride times the inner extent (as torch's TensorIterator coalesces).
    """
    kept = [d for d, e in enumerate(extents) if e != 1]
    merged_extents: list[int] = []
    merged_strides: list[list[int]] = [[] for _ in strides]
    for d in kept:
        if merged_extents and all(
            s[-1] == t[d] * extents[d] for s, t in zip(merged_strides, strides)
        ):
            merged_extents[-1] *= extents[d]
            for s, t in zip(merged_strides, strides):
                s[-1] = t[d]
            continue
        merged_extents.append(extents[d])
        for s, t in zip(merged_strides, strides):
            s.append(t[d])
    return merged_extents, merged_strides


def _contiguous_strides(extents: Sequence[int]) -> list[int]:
    strides = [1] * len(extents)
    for d in range(len(extents) - 2, -1, -1):
        strides[d] = strides[d + 1] * extents[d + 1]
    return strides


class Launch(NamedTuple):
    """One launch's layout and the runtime values the kernel takes besides pointers."""

    layout: LaunchLayout
    elements: int
    extents: list[int]
    """Of the merged iteration space."""
    strides: list[list[int]]
    """Per load then store, on the merged iteration space."""


# --------------------------------------------------------------------------- #
# The kernel source                                                            #
# --------------------------------------------------------------------------- #


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


# --------------------------------------------------------------------------- #
# Compilation and launch                                                       #
# --------------------------------------------------------------------------- #


def _dumps(what: str) -> bool:
    """Whether HOSTIR_DUMP (a comma-separated list, as NVFUSER_DUMP) asks for `what`."""
    return what in os.environ.get("HOSTIR_DUMP", "").split(",")


class KernelCache:
    """Compiled kernels by source, shared by every segment of the process."""

    def __init__(self) -> None:
        self.kernels: dict[str, object] = {}
        self.compilations = 0
        """Kernels compiled by this process (cache misses); tests check it stays put."""

    def kernel(self, source: str, segment: str):
        """The `cupy.RawKernel` of `source`, compiled on first request."""
        kernel = self.kernels.get(source)
        if kernel is None:
            if _dumps("cuda_kernel"):
                print(
                    f"======= CUDA kernel of segment @{segment} =======\n{source}",
                    file=sys.stdout,
                    flush=True,
                )
            kernel = cupy.RawKernel(source, KERNEL_NAME)
            kernel.compile()
            self.compilations += 1
            self.kernels[source] = kernel
        return kernel


CACHE = KernelCache()


class KernelFallbackWarning(UserWarning):
    """A fused segment ran as torch eager ops on the GPU because no kernel can compute it."""


def launchable(buffers: Sequence[torch.Tensor]) -> bool:
    """Whether a kernel can run on these buffers: CuPy imports and they are all CUDA tensors."""
    return cupy is not None and all(t.is_cuda for t in buffers)


@functools.cache
def _multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class PreparedLaunch(NamedTuple):
    """What launches on buffers of one signature share: all but the pointers."""

    kernel: object | None
    """The `cupy.RawKernel`; None when there are no elements to compute."""
    device: int
    blocks: int
    sizes: tuple
    """The kernel arguments after the pointers: elements, extents, strides."""


def _signature(tensor: torch.Tensor) -> tuple:
    """What a launch's preparation reads from a buffer: everything but its address's high bits."""
    return (
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        tensor.device,
        tensor.data_ptr() % VECTOR_BYTES,
    )


class SegmentKernel:
    """A pointwise segment run as one CUDA kernel per buffer layout.

    Built once per `hir.launch_kernel` while a program is prepared: analysing the
    segment there means an op a kernel cannot compute is reported before anything
    runs, on CPU and GPU alike. Launches are prepared once per buffer signature
    (shapes, strides, dtypes, device, alignment), so a step of a training loop pays
    for the pointers and the launch only.
    """

    def __init__(self, segment: func.FuncOp):
        self.body = SegmentBody.of(segment)
        self.kernels: dict[LaunchLayout, object] = {}
        self.launches: dict[tuple, PreparedLaunch] = {}

    def launch(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> bool:
        """Runs the segment on the current torch stream, writing `outs`; False if it cannot.

        It cannot without CuPy or on tensors that are not all CUDA tensors: the caller
        then evaluates the segment eagerly. Raises HostirError when the buffers do not
        fit the segment.
        """
        if not launchable((*ins, *outs)):
            return False
        signature = (tuple(map(_signature, ins)), tuple(map(_signature, outs)))
        prepared = self.launches.get(signature)
        if prepared is None:
            prepared = self.launches[signature] = self._prepare(ins, outs)
        if prepared.kernel is None:
            return True
        pointers = [cupy.uint64(ins[a.operand].data_ptr()) for a in self.body.loads]
        pointers += [cupy.uint64(outs[a.operand].data_ptr()) for a in self.body.stores]
        stream = cupy.cuda.Stream.from_external(torch.cuda.current_stream(prepared.device))
        with cupy.cuda.Device(prepared.device):
            prepared.kernel(
                (prepared.blocks,),
                (THREADS_PER_BLOCK,),
                (*pointers, *prepared.sizes),
                stream=stream,
            )
        return True

    def _prepare(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> PreparedLaunch:
        launch = self.plan(ins, outs)
        device = outs[0].device.index
        if launch.elements == 0:
            return PreparedLaunch(None, device, 0, ())
        layout = launch.layout
        kernel = self.kernels.get(layout)
        if kernel is None:
            with cupy.cuda.Device(device):
                kernel = CACHE.kernel(kernel_source(self.body, layout), self.body.name)
            self.kernels[layout] = kernel
        work = launch.elements // layout.vector
        blocks = min(-(-work // THREADS_PER_BLOCK), _multiprocessors(device) * BLOCKS_PER_SM)
        # In the order kernel_source declares the parameters after the pointers.
        sizes = [cupy.int64(launch.elements)]
        strided = [s for p, s in zip(layout.patterns, launch.strides) if p is not LINEAR]
        if strided:
            sizes += [cupy.int64(e) for e in launch.extents[1:]]
            sizes += [cupy.int64(step) for strides in strided for step in strides if step != 0]
        return PreparedLaunch(kernel, device, max(1, blocks), tuple(sizes))

    def source(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> str:
        """The CUDA C a launch on these buffers runs.

        Only their shapes, strides, dtypes and addresses count, so CPU tensors do.
        """
        return kernel_source(self.body, self.plan(ins, outs).layout)

    def plan(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> Launch:
        """The iteration space of a launch on these buffers, its layout and its runtime values."""
        self._check_buffers(ins, outs)
        buffers = [ins[a.operand] for a in self.body.loads]
        buffers += [outs[a.operand] for a in self.body.stores]
        maps = [a.axes for a in (*self.body.loads, *self.body.stores)]
        extents = [1] * self.body.rank
        for buffer, axes in zip(buffers, maps):
            for size, axis in zip(buffer.shape, axes):
                if size == 1:
                    continue
                if extents[axis] not in (1, size):
                    raise self._error(
                        f"buffers of extents {extents[axis]} and {size} meet on one axis; "
                        "they do not broadcast"
                    )
                extents[axis] = size
        for store in self.body.stores:
            shape = list(outs[store.operand].shape)
            if shape != [extents[axis] for axis in store.axes]:
                raise self._error(
                    f"output #{store.operand} has shape {shape} but the segment computes "
                    f"{[extents[axis] for axis in store.axes]}"
                )
        strides = [[0] * self.body.rank for _ in buffers]
        for buffer, axes, buffer_strides in zip(buffers, maps, strides):
            for size, axis, stride in zip(buffer.shape, axes, buffer.stride()):
                if size != 1:
                    buffer_strides[axis] = stride
        merged_extents, merged_strides = merge_axes(extents, strides)
        contiguous = _contiguous_strides(merged_extents)
        patterns = tuple(
            LINEAR if s == contiguous else tuple(stride != 0 for stride in s)
            for s in merged_strides
        )
        vector = 1
        if all(p is LINEAR for p in patterns):
            vector = VECTOR_BYTES // max(b.element_size() for b in buffers)
            while vector > 1 and any(b.data_ptr() % (vector * b.element_size()) for b in buffers):
                vector //= 2
        layout = LaunchLayout(len(merged_extents), patterns, vector)
        return Launch(layout, math.prod(extents), merged_extents, merged_strides)

    def _check_buffers(self, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        for what, buffers, dtypes in (
            ("input", ins, self.body.input_dtypes),
            ("output", outs, self.body.output_dtypes),
        ):
            if len(buffers) != len(dtypes):
                raise self._error(f"takes {len(dtypes)} {what}(s), got {len(buffers)}")
            for i, (buffer, dtype) in enumerate(zip(buffers, dtypes)):
                if buffer.dtype != dtype:
                    raise self._error(
                        f"{what} #{i} has dtype {buffer.dtype}, the segment declares {dtype}"
                    )
        devices = {t.device for t in (*ins, *outs)}
        if len(devices) > 1:
            raise self._error(f"buffers on several devices: {', '.join(sorted(map(str, devices)))}")
        for access, buffers, what in (
            (self.body.loads, ins, "input"),
            (self.body.stores, outs, "output"),
        ):
            for a in access:
                if buffers[a.operand].dim() != len(a.axes):
                    raise self._error(
                        f"{what} #{a.operand} has rank {buffers[a.operand].dim()}, the segment "
                        f"declares rank {len(a.axes)}"
                    )

    def _error(self, message: str) -> HostirError:
        return HostirError(f"kernel of segment @{self.body.name}: {message}")


def generated_source(
    segment: func.FuncOp, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]
) -> str:
    """The CUDA C that launching `segment` on these buffers compiles; needs no CuPy and no GPU."""
    return SegmentKernel(segment).source(ins, outs)
