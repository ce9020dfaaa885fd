"""cat-to-rotate-half: a `cat` of the two halves of a tensor's last axis, swapped and one of
them negated, as a `fusion.rotate_half`.

Rotary position embeddings (Llama's `rotate_half`) reach hostir as ATen calls: the forward's
`cat([-x[..., h:], x[..., :h]], -1)`, its halves cut by `split`, and the backward's
`cat([g[..., h:], -g[..., :h]], -1)`, cut by `slice`, which is `-rotate_half(g)`. As ATen
calls they are a kernel of the negation, a `cat` that copies both halves, and the copy read
again by the multiply-add that follows; as `fusion.rotate_half` they join that
multiply-add's kernel, which reads its operand at the other half (docs/kernels.md).

    %lo, %hi = fusion.aten "aten.split.Tensor"(%x, 64, -1) : ...
    %n = fusion.neg %hi : ...
    %r = fusion.aten "aten.cat.default"([%n, %lo], -1) : ...
becomes
    %r = fusion.rotate_half %x : ...

and `cat([%hi, fusion.neg %lo])` becomes `fusion.neg (fusion.rotate_half %x)`. The halves and
the negation go where nothing else reads them. A rotation of a cast is the cast of the
rotation (`fusion.rotate_half (fusion.cast %x)` becomes `fusion.cast (fusion.rotate_half %x)`,
the same values): a kernel's rotation reads its operand from memory, and so reads %x there
(a bf16 product that rotary embeddings read in f32, as torchtitan's and the complex pairs'
do), where a rotation of the cast would have the cast's own kernel write it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, OpResult, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from hostir_dialect import fusion
from hostir_dialect.aten_syntax import decode_call


def _arguments(op: fusion.AtenOp, names: tuple[str, ...]) -> dict[str, object]:
    """The call's arguments by the names of its ATen schema's first parameters (`names`),
    each operand as its value."""

    def decoded(argument: object) -> object:
        if isinstance(argument, dict) and set(argument) == {"operand"}:
            return op.inputs[argument["operand"]]
        if isinstance(argument, list):
            return [decoded(a) for a in argument]
        return argument

    args, kwargs = decode_call(op.call.data)
    return {name: decoded(value) for name, value in (*zip(names, args), *kwargs.items())}


def _is_last_axis(dim: object, value: SSAValue) -> bool:
    """Whether an ATen call's `dim` names the last axis of `value`'s local piece (a varying
    tensor's device axis is not passed to the call)."""
    rank = fusion.tensor_type(value).piece_rank
    return isinstance(dim, int) and rank > 0 and -rank <= dim < rank and dim % rank == rank - 1


def half_of(value: SSAValue) -> tuple[SSAValue, int] | None:
    """(x, 0) where `value` is the first half of the last axis of x, (x, 1) where it is the
    second, as `split` or `slice` cut it; None otherwise."""
    if not isinstance(value, OpResult) or not isinstance(op := value.op, fusion.AtenOp):
        return None
    if op.target.data == "aten.split.Tensor" and len(op.outputs) == 2:
        call = _arguments(op, ("self", "split_size", "dim"))
    elif op.target.data == "aten.slice.Tensor":
        call = _arguments(op, ("self", "dim", "start", "end", "step"))
    else:
        return None
    x = call.get("self")
    if not isinstance(x, SSAValue) or not _is_last_axis(call.get("dim", 0), x):
        return None
    whole = fusion.tensor_type(x).get_shape()
    if whole[-1] < 0 or whole[-1] % 2 or fusion.tensor_type(value).get_shape()[:-1] != whole[:-1]:
        return None
    half = whole[-1] // 2
    if op.target.data == "aten.split.Tensor":
        return (x, value.index) if call.get("split_size") == half else None
    start, end = call.get("start") or 0, call.get("end")
    if call.get("step", 1) != 1:
        return None
    if (start, end) == (0, half):
        return x, 0
    if start == half and (end is None or end >= whole[-1]):
        return x, 1
    return None


def negated(value: SSAValue) -> SSAValue | None:
    """The operand of the `fusion.neg` that computes `value`, if one does."""
    if isinstance(value, OpResult) and isinstance(value.op, fusion.NegOp):
        return value.op.input
    return None


class CatOfHalvesToRotateHalf(RewritePattern):
    """`cat([-hi, lo], -1)` -> `rotate_half x`; `cat([hi, -lo], -1)` -> `neg (rotate_half x)`,
    where lo and hi are the halves of x's last axis. The negation and the halves go where
    nothing else reads them."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.AtenOp, rewriter: PatternRewriter, /) -> None:
        if op.target.data != "aten.cat.default" or len(op.outputs) != 1:
            return
        call = _arguments(op, ("tensors", "dim"))
        tensors = call.get("tensors")
        if not isinstance(tensors, list) or len(tensors) != 2 or not _is_last_axis(call.get("dim", 0), op.outputs[0]):
            return
        first, second = tensors
        for negated_first in (True, False):
            hi, lo = (negated(first), second) if negated_first else (first, negated(second))
            halves = [half_of(v) if v is not None else None for v in (hi, lo)]
            if None in halves:
                continue
            (x, hi_index), (y, lo_index) = halves
            if x is not y or (hi_index, lo_index) != (1, 0) or x.type != op.outputs[0].type:
                continue
            rotated = fusion.RotateHalfOp(x)
            new_ops: list[Operation] = [rotated] if negated_first else [rotated, fusion.NegOp(rotated.result)]
            read = [first.owner, second.owner, hi.owner, lo.owner]
            rewriter.replace(op, new_ops, [new_ops[-1].results[0]])
            for owner in dict.fromkeys(read):  # the negation before the halves it reads
                if owner.parent is not None and not any(result.uses for result in owner.results):
                    rewriter.erase(owner)
            return


class RotationOfACastToCastOfTheRotation(RewritePattern):
    """`rotate_half (cast x)` -> `cast (rotate_half x)`; the cast stays where something else
    reads it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: fusion.RotateHalfOp, rewriter: PatternRewriter, /) -> None:
        cast = op.input.owner
        if not isinstance(cast, fusion.CastOp):
            return
        rotated = fusion.RotateHalfOp(cast.input)
        rewriter.replace(op, [rotated, fusion.CastOp(rotated.result, fusion.tensor_type(op.result))])
        if not cast.result.uses:
            rewriter.erase(cast)


@dataclass(frozen=True)
class CatToRotateHalf(ModulePass):
    """Rewrites the rotations of rotary embeddings, written as a `cat` of negated halves, as
    `fusion.rotate_half`, each rotating the values a cast reads rather than the cast."""

    name = "cat-to-rotate-half"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(CatOfHalvesToRotateHalf(), apply_recursively=False).rewrite_module(op)
        PatternRewriteWalker(RotationOfACastToCastOfTheRotation(), apply_recursively=False).rewrite_module(op)
