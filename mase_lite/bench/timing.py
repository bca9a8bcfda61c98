"""Honest timing: warm-up excluded, calls interleaved, medians; CUDA timed with events and synchronisation.

Example::

    >>> import torch
    >>> a, b = torch.randn(64, 64), torch.randn(64, 64)
    >>> times = paired_seconds([lambda: a @ b, lambda: a + b], torch.device("cpu"), warmup=1, repeats=3)
    >>> [len(t) for t in times]
    [3, 3]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call takes: CUDA events on the current stream on a GPU, wall time on CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    start_time = time.perf_counter()
    fn()
    return time.perf_counter() - start_time


def paired_seconds(fns: Sequence[Callable[[], object]], device: torch.device, warmup: int,
                   repeats: int) -> list[list[float]]:
    """Per-call seconds of each function, their calls interleaved so all see the same machine load."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    synchronize(device)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            out.append(timed_call(fn, device))
    return times


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn`` after ``warmup`` untimed calls."""
    return statistics.median(paired_seconds([fn], device, warmup, repeats)[0])


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median of the per-pair ratios (robust to load drifting during the run)."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))
