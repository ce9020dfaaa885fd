"""The fusions of nvFuser's reference host programs (`../shared/reference/*.txt`), built in Python.

One function per nvFuser test, named after it; each returns the verified module of
one `func.func`. The multi-device ones take the mesh size: the mesh is devices
`0 .. num_devices - 1` (nvFuser's `DeviceMesh::createForNumDevices`). Extents that
nvFuser leaves symbolic are dynamic (`?`) here, except those that the mesh size
fixes: a `didx` axis, or an axis that becomes `didx` in a later tensor. Pass and
runtime tests reuse these fusions; each docstring gives nvFuser's shapes.
"""

from __future__ import annotations

import math

from xdsl.dialects.builtin import ModuleOp

from hostir_dialect.builder import DType, FusionBuilder, Tensor


def _mesh_input(
    fb: FusionBuilder,
    num_devices: int,
    shape: list[int | None],
    dtype: DType,
    didx_axis: int | None = None,
) -> Tensor:
    """An input on devices `0 .. num_devices - 1`, sharded along `didx_axis` if given."""
    axes = ["didx" if i == didx_axis else "_" for i in range(len(shape))]
    return fb.input(shape, dtype, mesh=range(num_devices), axes=axes)


# --------------------------------------------------------------------------- #
# pr3736: AG+GEMM overlap of a stream-parallel linear                          #
# --------------------------------------------------------------------------- #


def ag_linear(num_devices: int = 8, dtype: DType = "bf16") -> ModuleOp:
    """pr3736, the linear whose input is allgathered chunk by chunk (AG+GEMM overlap).

    in [S, DIDx(D), M/(S*D), K], weight [N, K], bias [N] -> out [Stream(S), D, M/(S*D), N].
    """
    fb = FusionBuilder("ag_linear")
    x = _mesh_input(fb, num_devices, [None, num_devices, None, None], dtype, didx_axis=1)
    weight = _mesh_input(fb, num_devices, [None, None], dtype)
    bias = _mesh_input(fb, num_devices, [None], dtype)
    out = fb.linear(x, weight, bias)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


# --------------------------------------------------------------------------- #
# pr4387: collective pipelines (MultiDeviceStreamParallelTypeTest.*)          #
# --------------------------------------------------------------------------- #


def allgather(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.Allgather: [S, DIDx(D)] -> set -> [Stream(S), D]."""
    fb = FusionBuilder("allgather")
    x = _mesh_input(fb, num_devices, [None, num_devices], dtype, didx_axis=1)
    out = fb.set(x)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def allreduce(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.Allreduce: [S, DIDx(D), M] -> sum(1) -> [Stream(S), M]."""
    fb = FusionBuilder("allreduce")
    x = _mesh_input(fb, num_devices, [None, num_devices, None], dtype, didx_axis=1)
    out = fb.sum(x, [1])
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def reduce_scatter(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.ReduceScatter.

    [S, DIDx(D), D, M] -> sum(1) -> [Stream(S), DIDx(D), M].
    """
    fb = FusionBuilder("reduce_scatter")
    x = _mesh_input(fb, num_devices, [None, num_devices, num_devices, None], dtype, didx_axis=1)
    out = fb.sum(x, [1])
    fb.parallelize(out, 0, "stream")
    fb.parallelize(out, 1, "didx")
    fb.output(out)
    return fb.build()


def ag_matmul(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.AG_matmul.

    A [S, DIDx(D), M, K] @ B [K, N] -> [Stream(S), D, M, N]; A is allgathered chunk by chunk.
    """
    fb = FusionBuilder("ag_matmul")
    a = _mesh_input(fb, num_devices, [None, num_devices, None, None], dtype, didx_axis=1)
    b = _mesh_input(fb, num_devices, [None, None], dtype)
    out = fb.matmul(a, b)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def matmul_ar(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.matmul_AR: a K-sharded matmul, then an allreduce.

    A [S, DIDx(D), M, K/D] @ B [DIDx(D), K/D, N] -> [Stream(S), DIDx(D), M, N]
    -> sum(1) -> [Stream(S), M, N].
    """
    fb = FusionBuilder("matmul_ar")
    a = _mesh_input(fb, num_devices, [None, num_devices, None, None], dtype, didx_axis=1)
    b = _mesh_input(fb, num_devices, [num_devices, None, None], dtype, didx_axis=0)
    partial = fb.matmul(a, b)
    fb.parallelize(partial, 0, "stream")
    fb.parallelize(partial, 1, "didx")
    out = fb.sum(partial, [1])
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def matmul_rs_through_bcast(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.matmul_RS_through_bcast: a matmul, then a reduce-scatter.

    B [DIDx(D), K/D, N] -> broadcast([0, 2]) -> [1, DIDx(D), 1, K/D, N];
    A [S, DIDx(D), D, M, K/D] @ that -> [Stream(S), DIDx(D), D, M, N]
    -> sum(1) -> [Stream(S), DIDx(D), M, N].
    """
    fb = FusionBuilder("matmul_rs_through_bcast")
    a = _mesh_input(
        fb, num_devices, [None, num_devices, num_devices, None, None], dtype, didx_axis=1
    )
    b = _mesh_input(fb, num_devices, [num_devices, None, None], dtype, didx_axis=0)
    b_broadcast = fb.broadcast(b, [0, 2])
    fb.parallelize(b_broadcast, 1, "didx")
    partial = fb.matmul(a, b_broadcast)
    fb.parallelize(partial, 0, "stream")
    fb.parallelize(partial, 1, "didx")
    out = fb.sum(partial, [1])
    fb.parallelize(out, 0, "stream")
    fb.parallelize(out, 1, "didx")
    fb.output(out)
    return fb.build()


def tp_mlp(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """nvFuser's tensor-parallel MLP with sequence parallelism, every tensor of the chain
    stream-parallel: allgather -> matmul -> bias + tanh-GELU -> matmul -> reduce-scatter.

    x [S, DIDx(D), M, E] -> set -> [Stream(S), D, M, E] -> broadcast [1] -> [S, 1, D, M, E];
    w1 [DIDx(D), E, H/D] -> broadcast [0, 2]; h = x @ w1 + b1 [DIDx(D), H/D] (broadcast
    [0, 2, 3]) -> [Stream(S), DIDx(D), D, M, H/D]; GELU (tanh); @ w2 [DIDx(D), H/D, E]
    (broadcast [0, 2], between the two matmuls) -> [Stream(S), DIDx(D), D, M, E] -> sum(1)
    -> [Stream(S), DIDx(D), M, E].
    """
    fb = FusionBuilder("tp_mlp")
    d = num_devices

    def streamed(tensor: Tensor) -> Tensor:
        fb.parallelize(tensor, 0, "stream")
        fb.parallelize(tensor, 1, "didx")
        return tensor

    def weight(tensor: Tensor, new_axes: list[int]) -> Tensor:
        broadcast = fb.broadcast(tensor, new_axes)
        fb.parallelize(broadcast, 1, "didx")
        return broadcast

    x = _mesh_input(fb, d, [None, d, None, None], dtype, didx_axis=1)
    w1 = _mesh_input(fb, d, [d, None, None], dtype, didx_axis=0)
    b1 = _mesh_input(fb, d, [d, None], dtype, didx_axis=0)
    w2 = _mesh_input(fb, d, [d, None, None], dtype, didx_axis=0)
    gathered = fb.set(x)
    fb.parallelize(gathered, 0, "stream")
    rows = fb.broadcast(gathered, [1])
    fb.parallelize(rows, 0, "stream")
    h = streamed(fb.matmul(rows, weight(w1, [0, 2])))
    h = streamed(fb.add(h, weight(b1, [0, 2, 3])))
    # gelu(h) = h / 2 * (1 + tanh(sqrt(2 / pi) * (h + 0.044715 * h^3)))
    cube = streamed(fb.mul(streamed(fb.mul(h, h)), h))
    inner = streamed(fb.mul(streamed(fb.add(h, streamed(fb.mul(cube, 0.044715)))), math.sqrt(2 / math.pi)))
    gelu = streamed(fb.mul(streamed(fb.mul(h, 0.5)), streamed(fb.add(streamed(fb.tanh(inner)), 1.0))))
    partial = streamed(fb.matmul(gelu, weight(w2, [0, 2])))
    out = streamed(fb.sum(partial, [1]))
    fb.output(out)
    return fb.build()


# --------------------------------------------------------------------------- #
# pr4515: allgather through point-to-point transfers                           #
# --------------------------------------------------------------------------- #


def allgather_p2p(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.AllgatherP2p: [DIDx(D), M] -> set -> [Stream(D), M]."""
    fb = FusionBuilder("allgather_p2p")
    x = _mesh_input(fb, num_devices, [num_devices, None], dtype, didx_axis=0)
    out = fb.set(x)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def ag_matmul_p2p(num_devices: int = 8, dtype: DType = "f32") -> ModuleOp:
    """MultiDeviceStreamParallelTypeTest.AG_matmul_P2p.

    A [DIDx(D), M, K] @ B [K, N] -> [Stream(D), M, N].
    """
    fb = FusionBuilder("ag_matmul_p2p")
    a = _mesh_input(fb, num_devices, [num_devices, None, None], dtype, didx_axis=0)
    b = _mesh_input(fb, num_devices, [None, None], dtype)
    out = fb.matmul(a, b)
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


# --------------------------------------------------------------------------- #
# pr4147: single-device stream lowering (MultiDeviceExecutorLowerStreamTest.*) #
# --------------------------------------------------------------------------- #


def _single_device_sets(name: str, streamed: list[bool], dtype: DType) -> ModuleOp:
    """A chain of sets from a [?, ?] input; set i is stream-parallel on axis 0 if `streamed[i]`."""
    fb = FusionBuilder(name)
    tensor = fb.input([None, None], dtype)
    for is_streamed in streamed:
        tensor = fb.set(tensor)
        if is_streamed:
            fb.parallelize(tensor, 0, "stream")
    fb.output(tensor)
    return fb.build()


def single_set(stream_axis: int = 0, dtype: DType = "f32") -> ModuleOp:
    """SingleSetOp (stream_axis=0) and SingleSetOpNonOutermost (stream_axis=1).

    [i0, i1] -> set -> [Stream(i0), i1], or [i0, Stream(i1)].
    """
    fb = FusionBuilder("single_set")
    out = fb.set(fb.input([None, None], dtype))
    fb.parallelize(out, stream_axis, "stream")
    fb.output(out)
    return fb.build()


def two_sets(dtype: DType = "f32") -> ModuleOp:
    """TwoSetOps: two stream-parallel sets in a row, whose loops merge."""
    return _single_device_sets("two_sets", [True, True], dtype)


def three_sets(dtype: DType = "f32") -> ModuleOp:
    """ThreeSetOpsWithDisjointsForLoops: the serial middle set splits the loop in two."""
    return _single_device_sets("three_sets", [True, False, True], dtype)


def reduction(dtype: DType = "f32") -> ModuleOp:
    """Reduction: [i0, i1, i2] -> sum(2) -> [Stream(i0), i1]."""
    fb = FusionBuilder("reduction")
    out = fb.sum(fb.input([None, None, None], dtype), [2])
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def single_binary(dtype: DType = "f32") -> ModuleOp:
    """SingleBinaryOp: [i0, i1] + [i0, i1] -> [Stream(i0), i1]."""
    fb = FusionBuilder("single_binary")
    out = fb.add(fb.input([None, None], dtype), fb.input([None, None], dtype))
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


def matmul(stream_axis: int = 0, dtype: DType = "f32") -> ModuleOp:
    """Matmul_M (stream_axis=0) and Matmul_N (stream_axis=1): [M, K] @ [K, N] -> [M, N]."""
    fb = FusionBuilder("matmul")
    out = fb.matmul(fb.input([None, None], dtype), fb.input([None, None], dtype))
    fb.parallelize(out, stream_axis, "stream")
    fb.output(out)
    return fb.build()


def linear(dtype: DType = "f32") -> ModuleOp:
    """A single-device linear: in [S, M, K], weight [N, K], bias [N] -> [Stream(S), M, N]."""
    fb = FusionBuilder("linear")
    out = fb.linear(
        fb.input([None, None, None], dtype), fb.input([None, None], dtype), fb.input([None], dtype)
    )
    fb.parallelize(out, 0, "stream")
    fb.output(out)
    return fb.build()


REFERENCE_FUSIONS = {
    f.__name__: f
    for f in (
        ag_linear,
        allgather,
        allreduce,
        reduce_scatter,
        ag_matmul,
        matmul_ar,
        matmul_rs_through_bcast,
        tp_mlp,
        allgather_p2p,
        ag_matmul_p2p,
        single_set,
        two_sets,
        three_sets,
        reduction,
        single_binary,
        matmul,
        linear,
    )
}
"""Every reference fusion by name; the multi-device ones take `num_devices`."""
