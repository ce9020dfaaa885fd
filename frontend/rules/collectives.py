"""The importer's rules for torch's functional collectives, and the chunks of the pipelines
they end.

`all_gather_into_tensor` is a `fusion.set` from varying to replicated (an allgather),
`reduce_scatter_tensor` and `all_reduce` are `fusion.sum`s over the device axis (a
reduce-scatter, an allreduce), `wait_tensor` is nothing (the host program waits). A GEMM
whose product a reduce-scatter or a sum all-reduce reads is computed in the chunks of its
pipeline (`pipeline_chunks`), which the importer's `chunks_of` chooses.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx

from hostir_dialect import fusion
from hostir_dialect.aten_call import CARRIERS
from hostir.frontend.importer import Importer, UnsupportedGraph, Value, aten, c10d, name_of, result_of, rule
from hostir.frontend.rules.pointwise import no_alpha
from hostir.frontend.rules.reshapes import RESHAPES, concatenated_split, split_pieces
from hostir.passes.analysis.cost_model import OverlapKind, OverlapProblem


def pipeline_chunks(importer: Importer, node: torch.fx.Node, lhs: Value, rhs: Value) -> tuple[int, ...]:
    """The chunks of the rows of a matmul whose one reader is a reduce-scatter over the
    mesh (the destination devices, then the pipeline's chunks of each) or an
    all-reduce (the pipeline's chunks), as `chunks_of` chooses them."""
    collective = collective_reader(node)
    if collective is None:
        return ()
    rows, devices = node.meta["val"].shape[0], importer.devices
    kind = (
        OverlapKind.MATMUL_REDUCE_SCATTER
        if collective.target is c10d.reduce_scatter_tensor.default
        else OverlapKind.MATMUL_ALLREDUCE
    )
    if collective not in importer.collective_chunks:
        # The GEMMs whose sum a collective reads are cut alike; the first one met
        # stands for them in the cost model.
        problem = OverlapProblem(kind, rows, lhs.shape[-1] * devices, rhs.shape[-1], devices, lhs.dtype.itemsize)
        importer.collective_chunks[collective] = (problem, importer.chunks_of(problem, importer.group))
    problem, chunks = importer.collective_chunks[collective]
    if kind is OverlapKind.MATMUL_ALLREDUCE:
        return (chunks,) if chunks > 1 and problem.cuts_into(chunks) else ()
    if rows % devices:
        return ()
    if chunks <= 1 or not problem.cuts_into(chunks):
        return (devices,)
    return (devices, chunks)


def regrouped_reader(node: torch.fx.Node) -> tuple[tuple[int, ...], int, int] | None:
    """`(shape, size, dim)` where the one reader of the product `node`, through reshapes to
    `shape` (the rows in its leading axes) and sums of tensors of its shape (a gradient's
    GEMMs), is `cat(split(., size, dim), 0)` of several sequences, which a reduce-scatter
    reads: the rows regrouped by destination."""
    current = node
    while len(current.users) == 1:
        (reader,) = current.users
        if _keeps_the_rows(reader):
            current = reader
            continue
        if reader.target is not aten.split.Tensor:
            return None
        cats = {user for piece in reader.users for user in piece.users}
        if len(cats) != 1:
            return None
        (cat,) = cats
        split = split_pieces(cat)
        cat_dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
        collective = collective_reader(cat)
        if split is None or split[0] is not current or cat_dim != 0 or concatenated_split(cat) is not None:
            return None
        if collective is None or collective.target is not c10d.reduce_scatter_tensor.default:
            return None
        shape = tuple(current.meta["val"].shape)
        if math.prod(shape[:-1]) != node.meta["val"].shape[0] or split[2] == len(shape) - 1:
            return None
        return shape, split[1], split[2]
    return None


def _keeps_the_rows(node: torch.fx.Node) -> bool:
    """Whether `node` passes its input's rows on to a reduction as they are: a reshape, or a sum
    of tensors of its shape (a gradient's GEMMs added up)."""
    if node.target in RESHAPES:
        return True
    if node.target is not aten.add.Tensor or not no_alpha(node):
        return False
    shape = result_of(node).shape
    return all(isinstance(a, torch.fx.Node) and a.meta["val"].shape == shape for a in node.args)


def collective_reader(node: torch.fx.Node) -> torch.fx.Node | None:
    """The reduce-scatter or sum all-reduce that is the one reader of `node` through
    reshapes and sums of tensors of its shape (a gradient's GEMMs), if any."""
    while len(node.users) == 1:
        (reader,) = node.users
        if reader.target is c10d.reduce_scatter_tensor.default or (
            reader.target is c10d.all_reduce.default and reader.args[1] == "sum"
        ):
            return reader
        if _keeps_the_rows(reader):
            node = reader
        elif reader.target is aten.split.Tensor and all(p.target is operator.getitem for p in reader.users):
            cats = {user for piece in reader.users for user in piece.users}
            if len(cats) != 1 or concatenated_split(next(iter(cats))) is not reader.args[0]:
                return None
            node = next(iter(cats))
        else:
            return None
    return None


@rule(c10d.wait_tensor.default)
def _wait(importer: Importer, node: torch.fx.Node) -> Value:
    return importer.arg(node.args[0])


@rule(c10d.all_gather_into_tensor.default)
def _all_gather(importer: Importer, node: torch.fx.Node) -> Value:
    value = importer.arg(node.args[0])
    if not importer.varies(value):
        return value
    if value.order is not None:
        value = importer.flat(value)
    local = (importer.devices, *value.local_shape)
    op = importer.emit(fusion.SetOp(value.ssa, importer.tensor_type(local, value.dtype, False)))
    op.results[0].name_hint = name_of(node)
    return Value(op.results[0], tuple(result_of(node).shape), value.dtype, False, local)


REDUCE_OPS = {"sum": fusion.SumOp, "max": fusion.MaxOp}


def _reduce_over_devices(importer: Importer, node: torch.fx.Node, value: Value, scatter: bool) -> Value | None:
    reduce_op = node.args[1]
    if reduce_op not in REDUCE_OPS:
        raise UnsupportedGraph(
            f"{node.format_node()}: the reduction {reduce_op!r} is not supported "
            f"(hostir reduces with {', '.join(REDUCE_OPS)})"
        )
    if not importer.varies(value):
        return value
    if value.dtype in CARRIERS:
        raise UnsupportedGraph(f"{node.format_node()}: a reduction of {value.dtype} tensors is not supported")
    devices = importer.devices
    if scatter and (value.order is not None or value.local_shape[:1] != (devices,)):
        value = importer.rechunked(importer.flat(value), (devices,))
    # Each device receives the rows of its position: the piece's axes after the first.
    local = value.local_shape[1:] if scatter else value.local_shape
    result_type = importer.tensor_type(local, value.dtype, scatter)
    op = importer.emit(REDUCE_OPS[reduce_op](value.ssa, [0], False, result_type))
    op.results[0].name_hint = name_of(node)
    return Value(op.results[0], tuple(result_of(node).shape), value.dtype, scatter, local, value.order)


@rule(c10d.reduce_scatter_tensor.default)
def _reduce_scatter(importer: Importer, node: torch.fx.Node) -> Value | None:
    return _reduce_over_devices(importer, node, importer.arg(node.args[0]), scatter=True)


@rule(c10d.all_reduce.default)
def _all_reduce(importer: Importer, node: torch.fx.Node) -> Value | None:
    return _reduce_over_devices(importer, node, importer.arg(node.args[0]), scatter=False)
