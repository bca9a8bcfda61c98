"""Honest timing, the one harness of ``mase-lite bench`` and ``benchmarks/``: ``torch.utils.benchmark``
timers (the device synchronised around each timed call, the torch threads of the run), warm-up
excluded, calls interleaved, medians.

Example::

    >>> import torch
    >>> a, b = torch.randn(64, 64), torch.randn(64, 64)
    >>> times = paired_seconds([lambda: a @ b, lambda: a + b], torch.device("cpu"), warmup=1, repeats=3)
    >>> [len(t) for t in times]
    [3, 3]
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
from torch.utils import benchmark


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timer(fn: Callable[[], object]) -> benchmark.Timer:
    """A ``torch.utils.benchmark`` timer of ``fn()`` with the run's torch threads (its default is one)."""
    return benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())


def paired_seconds(fns: Sequence[Callable[[], object]], device: torch.device, warmup: int,
                   repeats: int) -> list[list[float]]:
    """Per-call seconds of each function, their calls interleaved so all see the same machine load."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    synchronize(device)
    timers = [timer(fn) for fn in fns]
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for t, out in zip(timers, times):
            out.append(t.timeit(1).median)
    return times


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn`` after ``warmup`` untimed calls."""
    return statistics.median(paired_seconds([fn], device, warmup, repeats)[0])


def column_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The ratio of the two medians, so a table's ratio is the one its own columns give.

    >>> column_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 1.0])
    4.0
    """
    return statistics.median(numerator) / statistics.median(denominator)
