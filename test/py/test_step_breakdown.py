"""benchmarks/step_breakdown.py: the split of a profiled step's time, on traces written by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from step_breakdown import LONGEST_GAPS, STEP, Breakdown, kind_of, minus, table, union  # noqa: E402


def event(name: str, start: float, duration: float, cat: str = "kernel", tid: int = 7) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": start, "dur": duration, "pid": 0, "tid": tid}


def test_intervals_merge_and_subtract():
    assert union([(5, 8), (0, 2), (1, 3), (8, 9)]) == [(0, 3), (5, 9)]
    assert minus([(0, 10), (20, 30)], [(5, 25)]) == pytest.approx(10)
    assert minus([(0, 10)], []) == pytest.approx(10)


@pytest.mark.parametrize(
    "name, cat, kind",
    [
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "kernel", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "kernel", "gemm"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "kernel", "attention"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", "communication"),
        ("Memcpy PtoP (Device -> Device)", "gpu_memcpy", "communication"),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "other"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "kernel", "other"),
        ("hostir_segment", "kernel", "other"),
        ("aten::addmm", "cpu_op", "gemm"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "cpu_op", "attention"),
        ("c10d::_allgather_base_", "cpu_op", "communication"),
        ("aten::mul", "cpu_op", "other"),
    ],
)
def test_kernels_are_classified_by_name(name, cat, kind):
    assert kind_of(name, cat) == kind


def test_a_gpu_step_splits_into_compute_hidden_and_exposed_communication_and_host_time():
    """A GEMM on one stream while NCCL runs on another for half of it, then NCCL alone, a gap,
    then two small kernels; the host started the step 20 us before the first kernel."""
    events = [
        event(STEP, 80, 30, cat="user_annotation"),
        event("sm90_xmma_gemm_bf16", 100, 100),
        event("ncclDevKernel_AllGather_RING_LL", 150, 100, tid=8),
        event("hostir_segment", 300, 10),
        event("hostir_segment", 320, 10),
        event("cudaLaunchKernel", 85, 5, cat="cuda_runtime"),
    ]
    b = Breakdown.of_trace(events, "cuda")
    assert b.gemm_ms == pytest.approx(0.1)
    assert b.communication_ms == pytest.approx(0.1)
    assert b.exposed_communication_ms == pytest.approx(0.05)
    assert (b.other_kernels, b.other_ms) == (2, pytest.approx(0.02))
    assert b.host_before_first_kernel_ms == pytest.approx(0.02)
    # Busy 100..250 and 300..310, 320..330: idle 250..300 and 310..320.
    assert b.idle_gaps_ms == pytest.approx(0.06)
    assert b.step_ms == pytest.approx(0.25)
    assert b.top_other == [("hostir_segment", 2, pytest.approx(0.02))]
    # Named by the kernel that ran last before each (NCCL's, which ends after the GEMM) and
    # the one after it, the longest first.
    assert b.longest_gaps == [
        (pytest.approx(0.05), "ncclDevKernel_AllGather_RING_LL", "hostir_segment"),
        (pytest.approx(0.01), "hostir_segment", "hostir_segment"),
    ]


def test_the_longest_idle_gaps_are_named_a_few_only_longest_first():
    """A host that reads a value back (a copy to the host) and then waits: the gap after the
    copy comes first; only `LONGEST_GAPS` are kept."""
    kernels = [event("k", 0, 10), event("Memcpy DtoH (Device -> Pinned)", 12, 1, cat="gpu_memcpy")]
    kernels += [event("multi_tensor_apply_kernel", 300, 5)]
    kernels += [event("k", 305 + 3 * i, 1) for i in range(4)]  # gaps of 2 us
    b = Breakdown.of_trace([event(STEP, 0, 400, cat="user_annotation"), *kernels], "cuda")
    assert len(b.longest_gaps) == LONGEST_GAPS == 3
    assert b.longest_gaps[0] == (pytest.approx(0.287), "Memcpy DtoH (Device -> Pinned)", "multi_tensor_apply_kernel")
    assert b.longest_gaps[1][0] == pytest.approx(0.002)


def test_cpu_ranks_count_the_outermost_aten_calls_and_collectives():
    """aten::linear holds an addmm (one GEMM, not two); a wrapper that is no ATen call (dynamo's
    region, DTensor's redistribution) counts as host time, not as a kernel."""
    events = [
        event(STEP, 0, 1000, cat="user_annotation"),
        event("Torch-Compiled Region: 0/0", 10, 900, cat="cpu_op"),
        event("aten::linear", 100, 200, cat="cpu_op"),
        event("aten::addmm", 110, 180, cat="cpu_op"),
        event("c10d::_allgather_base_", 400, 100, cat="cpu_op"),
        event("aten::mul", 600, 50, cat="cpu_op"),
        event("aten::mul", 700, 50, cat="cpu_op", tid=9),
    ]
    b = Breakdown.of_trace(events, "cpu")
    assert b.gemm_ms == pytest.approx(0.2)
    assert b.exposed_communication_ms == pytest.approx(0.1)
    assert (b.other_kernels, b.other_ms) == (2, pytest.approx(0.1))
    assert b.host_before_first_kernel_ms == pytest.approx(0.1)


def test_a_trace_without_the_step_range_is_refused():
    with pytest.raises(ValueError, match="no 'benchmark step' range"):
        Breakdown.of_trace([event("aten::mul", 0, 1, cat="cpu_op")], "cpu")


def test_the_table_has_a_row_per_breakdown_with_the_count_of_other_kernels():
    b = Breakdown.of_trace([event(STEP, 0, 10, cat="user_annotation"), event("k", 2, 3)], "cuda")
    text = table([("hostir (cuda), 0", b, 0.25), ("hostir (nccl), 0", b, None)])
    assert text.splitlines()[0].startswith("| contender, rank | step | GEMM |")
    assert text.splitlines()[0].endswith("| 30 ms hold saves, unprofiled |")
    assert "| hostir (cuda), 0 | 0.010 | 0.000 | 0.000 | 0.000 | 0.003 (1) | 0.002 | 0.000 | 0.250 |" in text
    assert "| hostir (nccl), 0 | 0.010 | 0.000 | 0.000 | 0.000 | 0.003 (1) | 0.002 | 0.000 |  |" in text
