"""The pipeline cost model: the problem's bytes and flops, T(S), the choice of chunks and streams,
and the measured rates on a world of CPU ranks."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from hostir_dialect.text import HostirError
from hostir.passes.analysis.cost_model import (
    DEFAULT_MIN_CHUNK_ROWS,
    OverlapKind,
    OverlapProblem,
    MeasuredStages,
    PipelineShape,
    Rates,
    Stages,
    candidate_chunks,
    choose_pipeline,
    pipeline_streams,
    pipeline_time,
)
from hostir.runtime.distributed.calibration import MeasuredChunks, measure_rates, measure_stages
from hostir.runtime.distributed.communicator import Communicator
from hostir.runtime.launch import run_on_local_ranks
from test_communicator import LAUNCH_TIMEOUT_S, needs_ranks

AG, RS, AR = OverlapKind.ALLGATHER_MATMUL, OverlapKind.MATMUL_REDUCE_SCATTER, OverlapKind.MATMUL_ALLREDUCE


def problem(
    kind: OverlapKind = AG, m: int = 8192, k: int = 8192, n: int = 3584, world: int = 8
) -> OverlapProblem:
    return OverlapProblem(kind, m, k, n, world)


def test_bytes_and_flops_of_each_kind():
    ag, rs, ar = problem(AG), problem(RS), problem(AR)
    # AG: every rank receives the other 7/8 of X [M, K] and multiplies the whole of it.
    assert ag.comm_bytes == 7 / 8 * 8192 * 8192 * 2
    assert ag.gemm_flops == 2 * 8192 * 8192 * 3584
    # RS: a rank multiplies its K/8 share, then receives 7/8 of the partial sums [M, N].
    assert rs.comm_bytes == 7 / 8 * 8192 * 3584 * 2
    assert rs.gemm_flops == 2 * 8192 * 1024 * 3584
    # AR: a reduce-scatter and an allgather of [M, N].
    assert ar.comm_bytes == 2 * rs.comm_bytes
    assert ar.gemm_flops == rs.gemm_flops
    assert (ag.chunked_rows, rs.chunked_rows, ar.chunked_rows) == (1024, 1024, 8192)
    assert problem(AG, world=1).comm_bytes == 0


@pytest.mark.parametrize(
    "kind, m, k, message",
    [(AG, 100, 64, "M = 100"), (RS, 64, 100, "K = 100"), (RS, 100, 64, "M = 100"), (AR, 64, 100, "K = 100")],
)
def test_extents_the_ranks_do_not_divide_are_refused(kind, m, k, message):
    with pytest.raises(HostirError, match=f"{message} is not divisible by the 8 ranks"):
        OverlapProblem(kind, m, k, 64, 8)


def test_bad_numbers_are_refused():
    with pytest.raises(HostirError, match="positive extents"):
        OverlapProblem(AG, 0, 8, 8, 8)
    with pytest.raises(HostirError, match="rates must be positive"):
        Rates(0.0, 1e12)
    with pytest.raises(HostirError, match="cannot be negative"):
        Rates(1e9, 1e12, transfer_latency_s=-1.0)
    with pytest.raises(HostirError, match="measured times must be positive"):
        Rates.from_times(problem(), comm_s=0.0, gemm_s=1e-3)
    with pytest.raises(HostirError, match="at least one chunk"):
        pipeline_time(problem(), Rates(1e9, 1e12), 0)


def test_rates_from_times_give_the_times_back():
    p = problem()
    rates = Rates.from_times(p, comm_s=0.45e-3, gemm_s=0.58e-3)
    assert rates.comm_s(p) == pytest.approx(0.45e-3)
    assert rates.gemm_s(p) == pytest.approx(0.58e-3)
    # The same rates predict a problem twice as large to take twice as long.
    large = problem(m=16384)
    assert rates.comm_s(large) == pytest.approx(0.90e-3)
    assert rates.gemm_s(large) == pytest.approx(1.16e-3)


def test_pipeline_time_is_the_formula():
    p = problem()
    rates = Rates.from_times(p, comm_s=4e-3, gemm_s=2e-3, transfer_latency_s=1e-4, launch_overhead_s=5e-5)
    # One chunk: the two steps in sequence, with one of each latency.
    assert pipeline_time(p, rates, 1) == pytest.approx(4e-3 + 1e-4 + 2e-3 + 5e-5)
    # Four chunks: transfers of 1.1 ms bound the pipeline; the last GEMM (0.55 ms) is exposed.
    assert pipeline_time(p, rates, 4) == pytest.approx(1.1e-3 + 0.55e-3 + 3 * 1.1e-3)


def test_without_latencies_the_pipeline_tends_to_the_limit():
    p = problem()
    rates = Rates.from_times(p, comm_s=1e-3, gemm_s=3e-3, transfer_latency_s=0.0, launch_overhead_s=0.0)
    times = [pipeline_time(p, rates, chunks) for chunks in (1, 2, 4, 8, 64)]
    assert times == sorted(times, reverse=True)
    assert times[0] == pytest.approx(4e-3)
    assert times[-1] == pytest.approx(3e-3 + 1e-3 / 64)


def brute_force_best(p: OverlapProblem, rates: Rates, min_rows: int, max_chunks: int) -> int:
    # With GEMM+RS's reduction in the GEMM, each of a chunk's two GEMMs has one device's rows.
    gemms_per_chunk = p.world if p.destination_ring or (p.reduction_in_matmul and p.kind == RS) else 1
    valid = [
        s
        for s in range(1, max_chunks + 1)
        if s == 1 or (p.chunked_rows % s == 0 and p.m // (s * gemms_per_chunk) >= min_rows)
    ]
    return min(valid, key=lambda s: (pipeline_time(p, rates, s), s))


SIZES = [(8192, 8192, 3584), (16384, 8192, 3584), (32768, 8192, 1024), (8192, 8192, 8192)]


@pytest.mark.parametrize(
    "kind, world, form",
    [
        *((kind, 8, {}) for kind in OverlapKind),
        (RS, 2, {}),
        (RS, 2, {"reduction_in_matmul": True}),
        (AR, 2, {"reduction_in_matmul": True}),
        (RS, 4, {"destination_ring": True}),
    ],
)
@pytest.mark.parametrize("m, k, n", SIZES)
@pytest.mark.parametrize("latency", [1e-6, 20e-6, 200e-6])
def test_the_choice_is_the_best_valid_chunk_count(kind, world, form, m, k, n, latency):
    p = OverlapProblem(kind, m, k, n, world, **form)
    rates = Rates(link_bytes_per_s=150e9, gemm_flops_per_s=700e12, transfer_latency_s=latency)
    shape = choose_pipeline(p, rates)
    assert p.chunked_rows % shape.chunks == 0
    assert p.chunk_gemm_rows(shape.chunks) >= DEFAULT_MIN_CHUNK_ROWS or shape.chunks == 1
    assert shape.chunks == brute_force_best(p, rates, DEFAULT_MIN_CHUNK_ROWS, 64)
    assert shape == PipelineShape(
        shape.chunks, pipeline_streams(shape.chunks), pipeline_time(p, rates, shape.chunks)
    )


def test_more_latency_means_fewer_chunks():
    p = problem(m=65536)
    chunks = [
        choose_pipeline(
            p, Rates.from_times(p, 1e-3, 1e-3, transfer_latency_s=latency), min_chunk_rows=1
        ).chunks
        for latency in (1e-6, 1e-5, 1e-4, 1e-3)
    ]
    assert chunks == sorted(chunks, reverse=True)
    assert chunks[0] > chunks[-1] == 1


def test_chunks_keep_the_minimum_rows_and_divide_the_rows_of_a_rank():
    p = problem(m=8192 * 3, world=8)  # 3072 rows per rank
    rates = Rates.from_times(p, 1e-3, 1e-3, transfer_latency_s=0.0, launch_overhead_s=0.0)
    # Without latencies more chunks are always better: the most that keep 2048 rows each.
    assert choose_pipeline(p, rates, min_chunk_rows=2048).chunks == 12
    assert choose_pipeline(p, rates, min_chunk_rows=1, max_chunks=10).chunks == 8
    assert choose_pipeline(p, rates, min_chunk_rows=10_000).chunks == 2
    # Not even the whole product has 30 000 rows: one chunk, the steps in sequence.
    assert choose_pipeline(p, rates, min_chunk_rows=30_000).chunks == 1


def in_matmul(m: int = 8192, k: int = 8192, n: int = 3584) -> OverlapProblem:
    return OverlapProblem(RS, m, k, n, 2, reduction_in_matmul=True)


def test_the_time_with_the_reduction_in_the_gemm_follows_its_order():
    p = in_matmul()
    rates = Rates.from_times(p, comm_s=4e-3, gemm_s=2e-3, transfer_latency_s=1e-4, launch_overhead_s=5e-5)
    # One chunk: the peer's rows (1.05 ms), their transfer (4.1 ms), the own rows.
    assert pipeline_time(p, rates, 1) == pytest.approx(1.05e-3 + 4.1e-3 + 1.05e-3)
    # Two chunks, transfers (2.1 ms) longer than half GEMMs (0.55 ms): the first half GEMM,
    # the two transfers one after the other on the copy engines, the last half GEMM.
    assert pipeline_time(p, rates, 2) == pytest.approx(0.55e-3 + 2 * 2.1e-3 + 0.55e-3)
    # Transfers shorter than half GEMMs all hide: the whole GEMM, nothing exposed, where
    # the pipeline of a separate reduction leaves its first transfer or GEMM exposed.
    rates = Rates.from_times(p, comm_s=1e-3, gemm_s=4e-3, transfer_latency_s=0.0, launch_overhead_s=0.0)
    assert pipeline_time(p, rates, 4) == pytest.approx(4e-3)
    assert pipeline_time(problem(RS, world=2), rates, 4) == pytest.approx(4e-3 + 0.25e-3)


@pytest.mark.parametrize(
    "size, gemm_ms, reduce_scatter_ms",
    list(zip(SIZES, [0.313, 0.624, 0.358, 0.730], [0.149, 0.269, 0.166, 0.306])),
)
def test_with_the_reduction_in_the_gemm_the_model_chooses_fewer_chunks(size, gemm_ms, reduce_scatter_ms):
    # The GEMM and the reduce-scatter alone on 2 H200 (docs/benchmarks.md, commit dd2e147),
    # where a prototype of the schedule took less time with 2 chunks than with 4.
    separate, summed = OverlapProblem(RS, *size, 2), in_matmul(*size)
    rates = Rates.from_times(separate, reduce_scatter_ms * 1e-3, gemm_ms * 1e-3)
    assert choose_pipeline(separate, rates).chunks == 4
    assert choose_pipeline(summed, rates).chunks == 2


def ring(m: int = 8192, k: int = 8192, n: int = 3584, world: int = 4) -> OverlapProblem:
    return OverlapProblem(RS, m, k, n, world, destination_ring=True)


@pytest.mark.parametrize(
    ("form", "refused", "world", "chunks", "rows"),
    [
        ("reduction_in_matmul", [(AG, 2), (AR, 4), (RS, 4)], 2, 4, (1024, 2048)),
        ("destination_ring", [(AG, 4), (AR, 4), (RS, 2)], 4, 2, (1024, 4096)),
    ],
    ids=["in the GEMM on two ranks", "ring on three or more"],
)
def test_a_lowered_form_of_gemm_rs_keeps_its_bytes_and_flops(form, refused, world, chunks, rows):
    """The reduction in the GEMM is a form of GEMM+RS on two ranks, the ring of destinations
    on three or more: the same bytes and flops as without, in GEMMs of one member's rows of
    a chunk; any other problem in either form is refused."""
    for kind, other_world in refused:
        with pytest.raises(HostirError, match=f"not of {kind} on {other_world}"):
            OverlapProblem(kind, 64, 64, 64, other_world, **{form: True})
    lowered, separate = OverlapProblem(RS, 8192, 8192, 3584, world, **{form: True}), problem(RS, world=world)
    assert (lowered.comm_bytes, lowered.gemm_flops) == (separate.comm_bytes, separate.gemm_flops)
    assert (lowered.chunk_gemm_rows(chunks), separate.chunk_gemm_rows(chunks)) == rows


def test_the_time_of_the_ring_of_destinations_follows_its_order():
    p = ring()
    # One chunk of four members: GEMMs of a member's rows d = 1 ms + 0.05 ms, a chunk's
    # reduce-scatter 3 ms + 0.3 ms, so one member's rows travel in 1.1 ms.
    rates = Rates.from_times(p, comm_s=3e-3, gemm_s=4e-3, transfer_latency_s=3e-4, launch_overhead_s=5e-5)
    d, c = 1.05e-3, 1.1e-3
    # Transfers longer than GEMMs run one after the other from the end of the first GEMM;
    # the own rows' GEMM hides behind them.
    assert pipeline_time(p, rates, 1) == pytest.approx(d + 3 * c)
    # Two chunks: the first chunk's transfers end (at 0.55 + 3 x 0.6 ms) before the second
    # chunk's first GEMM does (the fifth GEMM, after the first chunk's own rows), whose
    # transfers then follow one after the other.
    d2, c2 = 0.55e-3, 1.8e-3 / 3
    assert pipeline_time(p, rates, 2) == pytest.approx(5 * d2 + 3 * c2)
    # Transfers shorter than GEMMs hide, but the last one, after the last peer's GEMM,
    # which the own rows' GEMM hides in turn: the GEMMs alone.
    rates = Rates.from_times(p, comm_s=1e-3, gemm_s=4e-3, transfer_latency_s=0.0, launch_overhead_s=0.0)
    assert pipeline_time(p, rates, 1) == pytest.approx(4e-3)
    assert pipeline_time(p, rates, 2) == pytest.approx(4e-3)


def test_the_ring_of_destinations_hides_what_a_chunk_of_the_collective_form_cannot():
    # The GEMM and the reduce-scatter alone on 4 H100 (docs/benchmarks.md, commit 7f855cf):
    # unchunked, the ring hides all but its first GEMM and its transfers' latencies, where
    # the collective form leaves the GEMM or the whole reduce-scatter exposed.
    separate, ringed = problem(RS, world=4), ring()
    rates = Rates.from_times(separate, comm_s=0.173e-3, gemm_s=0.165e-3)
    in_sequence = pipeline_time(separate, rates, 1)
    assert pipeline_time(ringed, rates, 1) < 0.75 * in_sequence
    assert choose_pipeline(ringed, rates).predicted_s < choose_pipeline(separate, rates).predicted_s


def ar_in_matmul(m: int = 8192, k: int = 8192, n: int = 3584) -> OverlapProblem:
    return OverlapProblem(AR, m, k, n, 2, reduction_in_matmul=True)


def test_gemm_ar_with_its_sum_in_the_gemm_has_whole_chunk_gemms():
    summed, separate = ar_in_matmul(), problem(AR, world=2)
    assert (summed.comm_bytes, summed.gemm_flops) == (separate.comm_bytes, separate.gemm_flops)
    assert summed.chunk_gemm_rows(4) == separate.chunk_gemm_rows(4) == 2048


def test_the_time_with_the_sum_in_the_gemm_follows_its_order():
    p = ar_in_matmul()
    # In four chunks: GEMMs g = 0.55 ms, transfers c = 0.35 ms, shorter than a GEMM.
    rates = Rates.from_times(p, comm_s=1e-3, gemm_s=2e-3, transfer_latency_s=1e-4, launch_overhead_s=5e-5)
    g, c = 0.55e-3, 0.35e-3
    # One chunk: its GEMM and its allreduce. One pair: P, its pull, O, the pull of the sum.
    assert pipeline_time(p, rates, 1) == pytest.approx(2e-3 + 5e-5 + 1e-3 + 1e-4)
    assert pipeline_time(p, rates, 2) == pytest.approx(2 * (1.05e-3 + 0.6e-3))
    # Two pairs: each pull hides behind the GEMM after it; the last sum's pull is the tail.
    assert pipeline_time(p, rates, 4) == pytest.approx(4 * g + c)
    # An odd last chunk runs after the pair, once the pair's sums are back: GEMM, transfer.
    three = (2 * 1e-3 / 3 + 5e-5, 1e-3 / 3 + 1e-4)
    assert pipeline_time(p, rates, 3) == pytest.approx(3 * sum(three))
    # Transfers longer than GEMMs run back to back on the copy engines after the first GEMM.
    rates = Rates.from_times(p, comm_s=4e-3, gemm_s=2e-3, transfer_latency_s=0.0, launch_overhead_s=0.0)
    assert pipeline_time(p, rates, 4) == pytest.approx(0.5e-3 + 4 * 1e-3)


@pytest.mark.parametrize(
    "size, gemm_ms, allreduce_ms, chunks",
    list(zip(SIZES, [0.313, 0.623, 0.358, 0.729], [0.221, 0.407, 0.248, 0.467], [4, 8, 4, 8])),
)
def test_with_the_sum_in_the_gemm_the_model_chooses_two_pairs_or_more(size, gemm_ms, allreduce_ms, chunks):
    # The GEMM and the allreduce alone on 2 H200 (docs/benchmarks.md, commit dd2e147). One
    # pair runs its two GEMMs and two pulls one after the other: at least two pairs win.
    rates = Rates.from_times(OverlapProblem(AR, *size, 2), allreduce_ms * 1e-3, gemm_ms * 1e-3)
    assert choose_pipeline(ar_in_matmul(*size), rates).chunks == chunks


def test_streams():
    assert [pipeline_streams(chunks) for chunks in (1, 2, 3, 4, 64)] == [1, 2, 3, 3, 3]


def measured_on_a_rank(extent: int) -> Rates:
    return measure_rates(Communicator.from_env(), torch.float32, extent=extent, repeats=2)


@needs_ranks(2)
def test_measured_rates_are_positive_and_the_same_on_every_rank():
    rates = run_on_local_ranks(measured_on_a_rank, 2, 64, timeout_s=LAUNCH_TIMEOUT_S)
    assert rates[0] == rates[1]
    assert math.isfinite(rates[0].link_bytes_per_s) and rates[0].link_bytes_per_s > 0
    assert rates[0].gemm_flops_per_s > 0 and rates[0].transfer_latency_s > 0
    p = OverlapProblem(AG, 64, 64, 64, 2, element_size=4)
    assert choose_pipeline(p, rates[0], min_chunk_rows=8).chunks == brute_force_best(p, rates[0], 8, 64)


def test_a_world_of_one_has_free_transfers():
    rates = measure_rates(Communicator.single(torch.device("cpu")), torch.float32, extent=32, repeats=1)
    assert rates.link_bytes_per_s == math.inf and rates.transfer_latency_s == 0.0
    assert rates.comm_s(problem(world=1)) == 0.0


def test_rates_give_stages_that_slow_neither_down():
    p = problem(RS, world=2)
    rates = Rates.from_times(p, comm_s=4e-3, gemm_s=2e-3, transfer_latency_s=1e-4, launch_overhead_s=5e-5)
    assert rates.stages(p, 4) == Stages(0.55e-3, 1.1e-3, 1.1e-3)
    # With the reduction in the GEMM, a chunk's GEMM is one device's half of its rows.
    halves = OverlapProblem(RS, 8192, 8192, 3584, 2, reduction_in_matmul=True)
    assert rates.stages(halves, 4).gemm_s == pytest.approx(2e-3 / 8 + 5e-5)


def measured(p: OverlapProblem, together: float) -> MeasuredStages:
    """Stages of 1 ms of GEMM and 1 ms of transfer in all, split evenly, each chunk 10 us
    more, with a GEMM and a transfer at once taking `together` of their sum."""
    return MeasuredStages(
        p,
        {s: Stages(1e-3 / s + 1e-5, 1e-3 / s + 1e-5, together * 2 * (1e-3 / s + 1e-5)) for s in (1, 2, 4, 8)},
    )


def test_measured_stages_pipeline_where_the_stages_overlap_and_decline_where_they_do_not():
    p = problem(RS, m=65536, world=2)
    # At once as fast as the slower alone: the pipeline of 8 chunks hides most of the transfer.
    hidden = choose_pipeline(p, measured(p, 0.5), min_chunk_rows=1)
    assert hidden.chunks == 8
    assert hidden.predicted_s == pytest.approx(2 * (1e-3 / 8 + 1e-5) + 7 * (1e-3 / 8 + 1e-5))
    assert "in 8 chunks against 2.02 ms for the GEMM then the collective" in hidden.why
    # At once as slow as one after the other: every pipeline pays the chunks' costs for
    # nothing, and the model keeps the GEMM then the collective.
    serial = choose_pipeline(p, measured(p, 1.0), min_chunk_rows=1)
    assert serial.chunks == 1 and serial.predicted_s == pytest.approx(2.02e-3)
    assert "2.02 ms for the GEMM then the collective" in serial.why
    assert pipeline_time(p, measured(p, 1.0), 2) > serial.predicted_s


def test_measured_stages_are_the_problem_s_and_chosen_among_the_counts_measured():
    p = problem(RS, m=65536, world=2)
    stages = measured(p, 0.5)
    assert choose_pipeline(p, stages, min_chunk_rows=1, max_chunks=64).chunks == 8  # 16 was not measured
    with pytest.raises(HostirError, match="no stages were measured .* in 16 chunks"):
        pipeline_time(p, stages, 16)
    with pytest.raises(HostirError, match="no stages were measured"):
        pipeline_time(problem(AR, m=65536, world=2), stages, 2)


def test_one_chunk_is_always_weighed():
    assert candidate_chunks(problem(RS, m=1024, world=8), min_chunk_rows=1024) == [1]
    assert candidate_chunks(problem(RS, m=8192, world=2), min_chunk_rows=1024) == [1, 2, 4, 8]
    reason = choose_pipeline(problem(RS, m=1024, world=8), Rates(1e9, 1e12)).why
    assert reason == "no chunk count of at least 1024 rows divides the 128 rows a rank holds"


def stages_on_a_rank(kind: OverlapKind) -> MeasuredStages:
    p = OverlapProblem(kind, 64, 32, 16, 2, element_size=4)
    return measure_stages(p, Communicator.from_env(), [1, 2, 4], repeats=2)


@needs_ranks(2)
@pytest.mark.parametrize("kind", list(OverlapKind))
def test_measured_stages_are_the_same_on_every_rank(kind):
    stages = run_on_local_ranks(stages_on_a_rank, 2, kind, timeout_s=LAUNCH_TIMEOUT_S)
    assert stages[0] == stages[1]
    assert sorted(stages[0].by_chunks) == [1, 2, 4]
    for measured_stages in stages[0].by_chunks.values():
        assert min(measured_stages.gemm_s, measured_stages.transfer_s, measured_stages.together_s) > 0


def chunks_measured_on_a_rank() -> tuple[int, PipelineShape, int, int]:
    import torch.distributed as dist
    from unittest import mock

    from hostir.runtime.distributed import calibration

    p = OverlapProblem(RS, 4096, 64, 64, 2, element_size=4)
    chooser = MeasuredChunks(Communicator.from_env().device)
    with mock.patch.object(calibration, "measure_stages", wraps=calibration.measure_stages) as measuring:
        chunks = chooser(p, dist.group.WORLD)
        again = chooser(p, dist.group.WORLD)  # measured once per problem and group in a process
        shape = chooser.choice(p, dist.group.WORLD)
        # With the form its lowering gives it, the problem is measured and weighed in that form.
        summed = MeasuredChunks(chooser.device, lambda problem, communicator: replace(problem, reduction_in_matmul=True))
        summed(p, dist.group.WORLD)
        forms = [call.args[0] for call in measuring.call_args_list]
    assert forms == [p, replace(p, reduction_in_matmul=True)], forms
    return chunks, shape, again, measuring.call_count - 1


@needs_ranks(2)
def test_the_backend_s_chooser_measures_once_and_every_rank_chooses_alike():
    results = run_on_local_ranks(chunks_measured_on_a_rank, 2, timeout_s=LAUNCH_TIMEOUT_S)
    (chunks, shape, again, measured), other = results[0], results[1]
    assert other == results[0] and again == chunks == shape.chunks and measured == 1
    assert shape.chunks in candidate_chunks(OverlapProblem(RS, 4096, 64, 64, 2, element_size=4))
    assert "ms for the GEMM then the collective" in shape.why
