"""The CUDA C of each element type and each pointwise fusion op: how a value is stored, how
it is computed on, and the expression of each op's result in its compute type.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from hostir_dialect import fusion
from hostir_dialect.builder import constant_value
from hostir_dialect.text import HostirError

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
// Round to nearest even, as torch's c10::BFloat16; a NaN stays a quiet NaN. One instruction
// from sm_80 on (as cuda_bf16.h's __float2bfloat16), where the integer arithmetic before it
// bound the kernels of bf16 values by their instructions rather than their bytes.
__device__ __forceinline__ unsigned short hostir_f32_to_bf16(float value) {
#if __CUDA_ARCH__ >= 800
  unsigned short rounded;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(rounded) : "f"(value));
  return rounded;
#else
  const unsigned int bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<unsigned short>((bits >> 16) | 0x40u);
  }
  return static_cast<unsigned short>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
#endif
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
    "hostir_warp_reduce": """\
// The sum, or the maximum (NaN first, as torch.amax), of a value of each of a warp's 32
// lanes, in every lane: the lanes exchange partial results in halving strides.
template <bool Max, typename T>
__device__ __forceinline__ T hostir_warp_reduce(T value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const T other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = Max ? ((value > other || value != value) ? value : other) : value + other;
  }
  return value;
}""",
    "hostir_block_reduce": """\
// The same over a block of whole warps, in every thread: each warp's result goes through
// `partials` (one slot per warp), which every warp then reduces.
template <bool Max, typename T>
__device__ __forceinline__ T hostir_block_reduce(T value, T* partials, T identity) {
  value = hostir_warp_reduce<Max>(value);
  __syncthreads();  // every warp has read the partials of the reduction before
  if (threadIdx.x % 32 == 0) partials[threadIdx.x / 32] = value;
  __syncthreads();
  const unsigned int lane = threadIdx.x % 32;
  return hostir_warp_reduce<Max>(lane < blockDim.x / 32 ? partials[lane] : identity);
}""",
    "hostir_vector": """\
template <typename T, int N>
struct alignas(sizeof(T) * N) hostir_vector {
  T v[N];
};""",
    "hostir_load": """\
// N consecutive elements from an address aligned to them, in one load instruction.
template <int N, typename T>
__device__ __forceinline__ hostir_vector<T, N> hostir_load(const T* address) {
  return *reinterpret_cast<const hostir_vector<T, N>*>(address);
}""",
    "hostir_store": """\
// N consecutive elements to an address aligned to them, in one store instruction.
template <int N, typename T>
__device__ __forceinline__ void hostir_store(T* address, const hostir_vector<T, N>& value) {
  *reinterpret_cast<hostir_vector<T, N>*>(address) = value;
}""",
}
"""Device code the generated source includes when it names it."""


def element_type(value: SSAValue) -> ElementType:
    return ELEMENT_TYPES[fusion.element_type_name(fusion.tensor_type(value).element_type)]


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


def float_literal(value: float, compute: str) -> str:
    """The C of `value` in the compute type `compute` (`float` or `double`): infinities and
    NaN by their bits, which C has no literal for."""
    if math.isfinite(value):
        return repr(value) + ("f" if compute == "float" else "")
    if compute == "float":
        return f"__uint_as_float(0x{struct.unpack('<I', struct.pack('<f', value))[0]:08x}u)"
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    return f"__longlong_as_double(static_cast<long long>(0x{bits:016x}ull))"


def _constant(op: fusion.ConstantOp, operands: Sequence[str]) -> str:
    value = constant_value(op)
    compute = element_type(op.result).compute
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value == -(2**63):
            return "(-9223372036854775807LL - 1)"
        return f"{value}LL" if compute == "long long" else str(value)
    return float_literal(value, compute)


def _pow(op: fusion.PowOp, operands: Sequence[str]) -> str:
    """`x`, `x * x` and `x * x * x` for a constant exponent of 1, 2 and 3, as ATen computes
    them (and inductor): libm's pow costs tens of instructions an
    element, which made RMSNorm's row kernel compute-bound (its backward raises the row's
    scale to 3, and the input to 1)."""
    exponent = op.operands[1].owner
    if isinstance(exponent, fusion.ConstantOp):
        x = operands[0]
        products = {1: x, 2: f"({x} * {x})", 3: f"({x} * {x} * {x})"}
        if (product := products.get(constant_value(exponent))) is not None:
            return product
    return _general_pow(op, operands)


_general_pow = _pointwise(**{FLOATING: "pow{f}({0}, {1})", INTEGER: "hostir_powi({0}, {1})"})

EXPRESSIONS: dict[type[Operation], Expression] = {
    fusion.NegOp: _pointwise(**{FLOATING: "-{0}", INTEGER: "-{0}"}),
    fusion.AbsOp: _pointwise(**{FLOATING: "fabs{f}({0})", INTEGER: "({0} < 0 ? -{0} : {0})"}),
    fusion.ExpOp: _pointwise(**{FLOATING: "exp{f}({0})"}),
    fusion.LogOp: _pointwise(**{FLOATING: "log{f}({0})"}),
    fusion.SqrtOp: _pointwise(**{FLOATING: "sqrt{f}({0})"}),
    fusion.RsqrtOp: _pointwise(**{FLOATING: "rsqrt{f}({0})"}),
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
    fusion.PowOp: _pow,
    fusion.CastOp: _cast,
    fusion.ConstantOp: _constant,
}
"""Fusion op class -> the C expression of its result, in the result's compute type."""

ALIASES = (fusion.BroadcastOp, fusion.ExpandOp, fusion.SetOp)
"""Ops whose result is their operand in a kernel: the axis map says which element is read."""
