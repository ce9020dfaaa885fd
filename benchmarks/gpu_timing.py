"""GPU time of a callable on the current device, as the one-process benchmarks measure it."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from hostir.runtime.distributed.streams import hold_current_stream


def gpu_median_ms(run: Callable[[], object], repeats: int, hold_ms: float, warmup: int = 3) -> float:
    """Median GPU time of `run` over `repeats` runs after `warmup` untimed ones.

    CUDA events on the current stream around each run; before each, the stream is held
    for `hold_ms` (longer than the host takes to issue one run), so that the whole run
    is queued before its start event fires and Python's launch time stays out.
    """
    device = torch.device("cuda", torch.cuda.current_device())
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        hold_current_stream(device, hold_ms)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
