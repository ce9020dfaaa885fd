"""How many chunks (the stream axis extent) and streams a pipelined GEMM + communication should use.

    problem = OverlapProblem(OverlapKind.ALLGATHER_MATMUL, m=8192, k=8192, n=3584, world=8)
    rates = Rates.from_times(problem, comm_s=0.45e-3, gemm_s=0.58e-3)   # or measure_rates(...)
    shape = choose_pipeline(problem, rates)          # PipelineShape(chunks=8, streams=3, ...)

The model is one rank's timeline. Cut into S chunks, the whole transfer (`comm_s`
alone) and the whole GEMM (`gemm_s` alone) become S transfers and S GEMMs, each
chunk's GEMM after its transfer (AG+GEMM) or its transfer after its GEMM (GEMM+RS,
GEMM+AR), and chunk i+1's transfer runs while chunk i's GEMM does:

    c(S) = comm_s / S + transfer_latency_s       one chunk's transfer
    g(S) = gemm_s / S + launch_overhead_s        one chunk's GEMM
    T(S) = c(S) + g(S) + (S - 1) * max(c(S), g(S))

The first stage of the first chunk and the second stage of the last are exposed,
(comm_s + gemm_s) / S together: more chunks hide more of them, and each chunk pays
the fixed latencies once more, so T has a minimum. Chunk GEMMs of few rows run
below the GPU's rate (too few tiles to fill the SMs, tiles cut short), which the
linear g(S) does not see, so chunks whose GEMMs have fewer than `min_chunk_rows`
rows are not considered; the chunks must also divide the rows each rank holds along
the stream axis. The model assumes the two stages do not slow each other down: NCCL's
kernels take SMs from the GEMM, so for NCCL the measured time sits above T(S), and the
copy-engine backend is what comes close to it.

Two streams are enough in the model: chunk i+2's transfer, on chunk i's stream,
needs chunk i's GEMM done, which happens by the time chunk i+1's transfer ends
(when transfers are the slower stage) or before chunk i+1's GEMM may start (when
GEMMs are). A third stream absorbs jitter in when each stage starts.

A copy-engine GEMM+RS over two devices lowered with its reduction in the GEMM
(`reduce-scatter-in-matmul`, `reduction_in_matmul=True`) has another timeline: each
chunk is two half GEMMs, the peer's rows and then the own rows added into what the peer
sent, in the order P0, P1, O0, P2, O1, ..., O(S-1). Chunk i's transfer starts when its
P(i) ends (on both devices at once, they being alike), runs on the copy engines one
after the other, and must end before O(i) starts; between the two runs one half GEMM.
Nothing follows the last GEMM, and the first stage is a GEMM, not a transfer: fewer
chunks lose less here than in T(S), so the model chooses fewer. `pipeline_time` follows
that order event by event, with half GEMMs of h(S) = gemm_s / (2 S) + launch_overhead_s
and transfers of c(S).

A copy-engine GEMM+AR over two devices with its sum in the GEMM (`allreduce-in-matmul`,
also `reduction_in_matmul=True`) runs pairs of chunks: in pair j each device multiplies
one chunk for its peer (P(j)), pulls the peer's product of the other chunk (X(j)), adds
its own product of that chunk into it (O(j)) and lets the peer pull the sum back
(Y(j)). The GEMMs are whole chunks, g(S), in the order P0, P1, O0, P2, O1, ...,
O(S/2 - 1); the transfers, c(S) each, run on the copy engines one after the other in the
order they are issued (X(j) after P(j), Y(j) after O(j)); O(j) starts once X(j) has
ended, and the run ends with the last Y. An odd last chunk then runs as in T(S), after
every pair: its GEMM, its transfer. The sum's copy into the output of the device that
made it (a memory-bound pass over a chunk per pair) is not modelled, as no reduction is.

A copy-engine GEMM+RS over more than two devices lowered as a ring of destinations
(`reduce-scatter-ring`, `destination_ring=True`) cuts each chunk into D GEMMs, one per
member's rows: at step t (1 to D - 1) the rows of the member t ahead, then their
transfer to it, and last the own rows. The transfers run on the copy engines one after
the other, each as soon as its GEMM has ended and the transfer before it too, so chunk i's
transfers hide behind its later GEMMs and those of chunk i + 1; the run ends with the
last transfer or the last GEMM. `pipeline_time` follows that order event by event, with
GEMMs of d(S) = gemm_s / (D S) + launch_overhead_s and transfers of one member's rows,
c(S) / (D - 1) (c(S) carries the (D - 1) / D of a chunk that a reduce-scatter moves). The
reduction of each chunk's D pieces at its end (a memory-bound pass) is not modelled.

The model takes each chunk's stages from `StageTimes`: `Rates` scales the whole GEMM and
the whole transfer linearly and assumes a GEMM and a transfer at once slow neither down,
which is what a model can say before anything runs. `MeasuredStages` are the stages
timed on the machine (`measure_stages`, `hostir.runtime.distributed.calibration`): for
each chunk count a chunk's GEMM alone, its collective alone, and a GEMM of one chunk
while the collective of another runs, which is the steady state of the pipeline:

    T(S) = c(S) + g(S) + (S - 1) * both(S)

NCCL's kernels take SMs from the GEMM and the GEMM takes memory bandwidth from the
transfer, so `both(S)` may come close to `c(S) + g(S)`, and then T(S) is more than
T(1), the GEMM then the collective: the model then chooses one chunk, which is no
pipeline, and `PipelineShape.why` says so with both times.

Every rank must lower the same program, so the inputs of `choose_pipeline` must be
equal on every rank: `measure_rates` and `measure_stages`, which measure a machine, take
the slowest rank's times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from hostir_dialect.text import HostirError

PIPELINE_STREAMS = 3
"""Streams of a pipeline of at least that many chunks: two keep both stages busy, one absorbs jitter."""

DEFAULT_MIN_CHUNK_ROWS = 1024
"""Fewest rows of a chunk GEMM: bf16 GEMMs on H100/H200 with K and N in the thousands lose
efficiency below about a thousand rows (fewer output tiles than twice the SMs)."""

DEFAULT_MAX_CHUNKS = 64
"""Most chunks considered: the host issues about ten ops per chunk."""


class OverlapKind(StrEnum):
    """Which communication a pipelined GEMM overlaps, in the layouts of benchmarks/overlap.py."""

    ALLGATHER_MATMUL = "allgather_matmul"
    """X row-sharded [M/D, K] per rank, W [K, N] replicated: Y = allgather(X) @ W, [M, N] on every rank."""
    MATMUL_REDUCE_SCATTER = "matmul_reduce_scatter"
    """X [M, K/D] and W [K/D, N] per rank: Y = reduce_scatter(X @ W), [M/D, N] per rank."""
    MATMUL_ALLREDUCE = "matmul_allreduce"
    """X [M, K/D] and W [K/D, N] per rank: Y = allreduce(X @ W), [M, N] on every rank."""


@dataclass(frozen=True)
class OverlapProblem:
    """Y[M, N] = X[M, K] @ W[K, N] over `world` ranks, with the communication of `kind`."""

    kind: OverlapKind
    m: int
    k: int
    n: int
    world: int
    element_size: int = 2
    reduction_in_matmul: bool = False
    """GEMM+RS or GEMM+AR on two devices with the sum in the GEMM's epilogue: GEMM+RS's
    (`reduce-scatter-in-matmul`) per chunk the peer's rows, their transfer, and the own rows
    added into them; GEMM+AR's (`allreduce-in-matmul`) per pair of chunks one chunk
    multiplied for the peer, the other added into the peer's product, the sum pulled back."""
    destination_ring: bool = False
    """GEMM+RS on more than two devices as a ring of destinations (`reduce-scatter-ring`): per
    chunk a GEMM of each member's rows, each peer's sent to it as soon as it is computed."""

    def __post_init__(self):
        if min(self.m, self.k, self.n, self.world, self.element_size) < 1:
            raise HostirError(f"an overlap problem needs positive extents, got {self}")
        summed_in_matmul = (OverlapKind.MATMUL_REDUCE_SCATTER, OverlapKind.MATMUL_ALLREDUCE)
        if self.reduction_in_matmul and (self.kind not in summed_in_matmul or self.world != 2):
            raise HostirError(
                f"the reduction in the GEMM is a form of {' and '.join(summed_in_matmul)} on 2 ranks, "
                f"not of {self.kind} on {self.world}"
            )
        if self.destination_ring and (self.kind != OverlapKind.MATMUL_REDUCE_SCATTER or self.world < 3):
            raise HostirError(
                f"the ring of destinations is a form of {OverlapKind.MATMUL_REDUCE_SCATTER} on 3 ranks or "
                f"more, not of {self.kind} on {self.world}"
            )
        sharded = {"M": self.m} if self.kind == OverlapKind.ALLGATHER_MATMUL else {"K": self.k}
        if self.kind == OverlapKind.MATMUL_REDUCE_SCATTER:
            sharded["M"] = self.m
        for name, extent in sharded.items():
            if extent % self.world:
                raise HostirError(
                    f"{self.kind}: {name} = {extent} is not divisible by the {self.world} ranks"
                )

    @property
    def chunked_rows(self) -> int:
        """The rows a rank holds along the stream axis, which the chunks divide."""
        return self.m if self.kind == OverlapKind.MATMUL_ALLREDUCE else self.m // self.world

    def cuts_into(self, chunks: int) -> bool:
        """Whether the rows a rank holds along the stream axis cut into `chunks` equal chunks:
        the chunk counts a pipeline of this problem can take."""
        return self.chunked_rows % chunks == 0

    def chunk_gemm_rows(self, chunks: int) -> int:
        """The rows of each GEMM when the rows a rank holds are cut into `chunks` chunks: a
        chunk of the product, or, with GEMM+RS's reduction in the GEMM or its ring of
        destinations, one device's rows of it."""
        return int(self.m * self.chunk_gemm_share(chunks))

    def chunk_gemm_share(self, chunks: int) -> float:
        """The share of the whole GEMM that each chunk GEMM is: 1 / `chunks`, or with GEMM+RS's
        reduction in the GEMM or its ring of destinations, one device's rows of a chunk."""
        per_device = self.destination_ring or (
            self.reduction_in_matmul and self.kind == OverlapKind.MATMUL_REDUCE_SCATTER
        )
        return 1 / (chunks * self.world) if per_device else 1 / chunks

    @property
    def gemm_flops(self) -> float:
        """The flops of one rank's GEMM: the whole product, or its K/D share."""
        k = self.k if self.kind == OverlapKind.ALLGATHER_MATMUL else self.k // self.world
        return 2.0 * self.m * k * self.n

    @property
    def comm_bytes(self) -> float:
        """The bytes one rank receives over its links in a ring (allreduce: twice a reduce-scatter's)."""
        gathered = self.m * (self.k if self.kind == OverlapKind.ALLGATHER_MATMUL else self.n)
        passes = 2 if self.kind == OverlapKind.MATMUL_ALLREDUCE else 1
        return passes * (self.world - 1) / self.world * gathered * self.element_size


@dataclass(frozen=True)
class Rates:
    """What the machine does per second, and what each chunk costs on top."""

    link_bytes_per_s: float
    gemm_flops_per_s: float
    transfer_latency_s: float = 20e-6
    """Fixed cost of one chunk's transfer: an NCCL collective's latency on NVLink, a few copies' issue."""
    launch_overhead_s: float = 10e-6
    """Fixed cost of one chunk's GEMM on the GPU: the gap between kernels, the tail of the last wave."""

    def __post_init__(self):
        if not (self.link_bytes_per_s > 0 and self.gemm_flops_per_s > 0):
            raise HostirError(f"rates must be positive, got {self}")
        if min(self.transfer_latency_s, self.launch_overhead_s) < 0:
            raise HostirError(f"per-chunk costs cannot be negative, got {self}")

    @classmethod
    def from_times(cls, problem: OverlapProblem, comm_s: float, gemm_s: float, **per_chunk: float) -> Rates:
        """The rates at which `problem`'s whole communication took `comm_s` and its whole GEMM `gemm_s`."""
        if not (comm_s > 0 and gemm_s > 0):
            raise HostirError(f"measured times must be positive, got comm {comm_s} s, GEMM {gemm_s} s")
        return cls(problem.comm_bytes / comm_s, problem.gemm_flops / gemm_s, **per_chunk)

    def comm_s(self, problem: OverlapProblem) -> float:
        return problem.comm_bytes / self.link_bytes_per_s

    def gemm_s(self, problem: OverlapProblem) -> float:
        return problem.gemm_flops / self.gemm_flops_per_s

    def stages(self, problem: OverlapProblem, chunks: int) -> Stages:
        """A chunk's stages scaled from the whole problem's, the GEMM of `chunk_gemm_rows`
        rows (half a chunk for GEMM+RS with its reduction in the GEMM); at once, neither slows."""
        gemm = self.gemm_s(problem) * problem.chunk_gemm_share(chunks) + self.launch_overhead_s
        transfer = self.comm_s(problem) / chunks + self.transfer_latency_s
        return Stages(gemm, transfer, max(gemm, transfer))

    def covers(self, problem: OverlapProblem, chunks: int) -> bool:
        return True


@dataclass(frozen=True)
class Stages:
    """What one chunk of a pipeline costs: its GEMM alone (of `chunk_gemm_rows` rows), its
    transfer alone, and the GEMM of one chunk with the transfer of another at once."""

    gemm_s: float
    transfer_s: float
    together_s: float

    def __post_init__(self):
        if min(self.gemm_s, self.transfer_s, self.together_s) < 0:
            raise HostirError(f"a stage cannot take negative time, got {self}")


class StageTimes(Protocol):
    """Where the model takes a chunk's stages from: `Rates` or `MeasuredStages`."""

    def stages(self, problem: OverlapProblem, chunks: int) -> Stages: ...

    def covers(self, problem: OverlapProblem, chunks: int) -> bool:
        """Whether `stages` knows `problem` in `chunks` chunks."""
        ...


@dataclass(frozen=True)
class MeasuredStages:
    """The stages of `problem` timed on the machine, for each chunk count measured
    (`measure_stages`, `hostir.runtime.distributed.calibration`)."""

    problem: OverlapProblem
    by_chunks: Mapping[int, Stages]

    def covers(self, problem: OverlapProblem, chunks: int) -> bool:
        return problem == self.problem and chunks in self.by_chunks

    def stages(self, problem: OverlapProblem, chunks: int) -> Stages:
        if not self.covers(problem, chunks):
            raise HostirError(
                f"no stages were measured for {problem} in {chunks} chunks; measured: {self.problem} "
                f"in {sorted(self.by_chunks)}"
            )
        return self.by_chunks[chunks]


@dataclass(frozen=True)
class PipelineShape:
    """A pipeline's chunks (the stream axis extent) and streams, and the time the model predicts."""

    chunks: int
    streams: int
    predicted_s: float
    why: str = field(default="", compare=False)
    """The model's reason, in words (`choose_pipeline`): its choice's time against one chunk's."""


def pipeline_time(problem: OverlapProblem, costs: StageTimes, chunks: int) -> float:
    """T(S) of the module docstring: the modelled time of `problem` cut into `chunks` chunks."""
    if chunks < 1:
        raise HostirError(f"a pipeline needs at least one chunk, got {chunks}")
    stages = costs.stages(problem, chunks)
    if problem.destination_ring:
        return _destination_ring_time(chunks, problem.world, stages.transfer_s / (problem.world - 1), stages.gemm_s)
    if problem.reduction_in_matmul and problem.kind == OverlapKind.MATMUL_REDUCE_SCATTER:
        return _reduction_in_matmul_time(chunks, stages.transfer_s, stages.gemm_s)
    if problem.reduction_in_matmul:
        return _allreduce_in_matmul_time(chunks, stages.transfer_s, stages.gemm_s)
    return stages.transfer_s + stages.gemm_s + (chunks - 1) * stages.together_s


def _reduction_in_matmul_time(chunks: int, transfer: float, half_gemm: float) -> float:
    """The end of the last GEMM of P0, P1, O0, ..., P(S-1), O(S-2), O(S-1) (the module
    docstring), chunk i's transfer after P(i) and the transfer before it, O(i) after both."""
    gemms_end = copies_end = 0.0
    transfers_end = []
    for chunk in range(chunks):
        gemms_end += half_gemm  # P(chunk)
        copies_end = max(copies_end, gemms_end) + transfer
        transfers_end.append(copies_end)
        if chunk:
            gemms_end = max(gemms_end, transfers_end[chunk - 1]) + half_gemm  # O(chunk - 1)
    return max(gemms_end, transfers_end[-1]) + half_gemm  # O(chunks - 1)


def _destination_ring_time(chunks: int, members: int, transfer: float, gemm: float) -> float:
    """The end of the last GEMM or transfer of the chunks' rings (the module docstring): per
    chunk a GEMM and a transfer for each of the `members - 1` peers, each transfer after its
    GEMM and the transfer before it, then the GEMM of the own rows."""
    gemms_end = copies_end = 0.0
    for _ in range(chunks):
        for _ in range(members - 1):
            gemms_end += gemm
            copies_end = max(copies_end, gemms_end) + transfer
        gemms_end += gemm
    return max(gemms_end, copies_end)


def _allreduce_in_matmul_time(chunks: int, transfer: float, gemm: float) -> float:
    """The end of the last transfer of P0, P1, O0, ..., O(S/2 - 1) (the module docstring),
    each transfer after the one issued before it and after its GEMM, O(j) after X(j), and
    an odd last chunk's GEMM and transfer after all of them."""
    gemms_end = copies_end = 0.0
    exchanged = []

    def issue() -> float:
        """A transfer issued after the GEMM that ended the caller's stream so far."""
        nonlocal copies_end
        copies_end = max(copies_end, gemms_end) + transfer
        return copies_end

    pairs = chunks // 2
    for pair in range(pairs + 1):
        if pair < pairs:
            gemms_end += gemm  # P(pair)
            exchanged.append(issue())  # X(pair)
        if pair:
            gemms_end = max(gemms_end, exchanged[pair - 1]) + gemm  # O(pair - 1)
            issue()  # Y(pair - 1)
    if chunks % 2:
        gemms_end = max(gemms_end, copies_end) + gemm
        issue()
    return max(gemms_end, copies_end)


def pipeline_streams(chunks: int) -> int:
    """The streams a pipeline of `chunks` chunks uses (the module docstring says why)."""
    return min(chunks, PIPELINE_STREAMS)


def candidate_chunks(
    problem: OverlapProblem, min_chunk_rows: int = DEFAULT_MIN_CHUNK_ROWS, max_chunks: int = DEFAULT_MAX_CHUNKS
) -> list[int]:
    """The chunk counts the model weighs: one (no pipeline), and those that divide the rows a
    rank holds and leave each chunk GEMM at least `min_chunk_rows` rows."""
    return [
        chunks
        for chunks in range(1, min(max_chunks, problem.chunked_rows) + 1)
        if chunks == 1 or (problem.cuts_into(chunks) and problem.chunk_gemm_rows(chunks) >= min_chunk_rows)
    ]


def choose_pipeline(
    problem: OverlapProblem,
    costs: StageTimes,
    min_chunk_rows: int = DEFAULT_MIN_CHUNK_ROWS,
    max_chunks: int = DEFAULT_MAX_CHUNKS,
) -> PipelineShape:
    """The chunk count of `candidate_chunks` with the least modelled time, the fewest chunks
    among equals: one chunk, no pipeline, where the model predicts the pipelines slower."""
    candidates = [c for c in candidate_chunks(problem, min_chunk_rows, max_chunks) if costs.covers(problem, c)] or [1]
    times = {chunks: pipeline_time(problem, costs, chunks) for chunks in candidates}
    best = min(candidates, key=lambda chunks: (times[chunks], chunks))
    pipelined = min((c for c in candidates if c > 1), key=lambda chunks: (times[chunks], chunks), default=None)
    if pipelined is None:
        why = f"no chunk count of at least {min_chunk_rows} rows divides the {problem.chunked_rows} rows a rank holds"
    else:
        in_chunks = f"{times[pipelined] * 1e3:.3g} ms in {pipelined} chunks"
        in_one = f"{times[1] * 1e3:.3g} ms for the GEMM then the collective"
        why = f"the model predicts {in_chunks} against {in_one}"
    return PipelineShape(best, pipeline_streams(best), times[best], why)


ChunksOf = Callable[[OverlapProblem, Any], int]
"""`chunks_of(problem, group)`: how many chunks to cut a GEMM+reduce-scatter or
GEMM+allreduce into, the problem in the cost model's terms (global extents) and `group`
the process group its collective runs over (None for none), where a chooser that
measures the machine measures it: `one_chunk`, the model's choice on stages measured on
the machine (`MeasuredChunks`, `hostir.runtime.distributed.calibration`) or the user's
number."""


def one_chunk(problem: OverlapProblem, group: Any = None) -> int:
    return 1


NOMINAL_GPU_RATES = Rates(link_bytes_per_s=300e9, gemm_flops_per_s=600e12)
"""What the cost model can say of a GPU it has not measured: an H100's NVLink as NCCL uses
it, and its bf16 GEMMs at large sizes (`hostir.explain` quotes it for a graph run on the CPU)."""
