"""How many threads a native kernel call runs on: no more than the cores other processes leave, then chosen by timing,
per kind of call.

``torch.get_num_threads()`` is the most a call uses. On a busy machine, a thread that waits at a join for one the
scheduler preempted makes more threads slower than one (measured: a 4096 x 4096 MXINT8 layer at batch 1 took 2.9x
longer on two threads than on one beside two busy processes on two cores, and 2x faster on a quiet machine). So a
call first takes no more threads than the cores this process may use less the threads running elsewhere
(:func:`mase_lite.infra.cores.running_elsewhere`, looked at every :data:`LOOK_EVERY` seconds, the median of the latest
:data:`LOOKS`): what the CLI chooses at its start, kept up to date as the load changes. Where that leaves more than
one, each kind of call (its ``key``: the kernel, sizes and weight formats that set its cost) is timed on the most
threads, then on one, on its first :data:`PROBE_CALLS` calls and again on that many in every :data:`PROBE_EVERY`, and
runs on whichever count's mean time over its latest probe was lower (one timing alone is the scheduler's noise on a
busy machine). The kernels split rows, never a sum, so the count changes no result.
``MASE_LITE_ADAPTIVE_THREADS=0`` (or :data:`ADAPTIVE` set false) runs every call on the most.

>>> threads, probe = begin(("doc", 64), 1)
>>> threads, probe
(1, None)
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from mase_lite.infra import cores

LOOK_EVERY = 0.1
"""Seconds between looks at the threads running elsewhere (at least)."""
LOOKS = 5
"""Looks whose median sets the cores a call may use."""
PROBE_EVERY = 128
"""Calls from the start of one probe of a kind of call to the start of the next."""
PROBE_CALLS = 6
"""Calls of a probe: the most threads and one, alternately."""
ADAPTIVE = os.environ.get("MASE_LITE_ADAPTIVE_THREADS", "1") != "0"


@dataclass
class _Kind:
    most: int
    calls: int = 0
    seconds: dict[int, list[float]] = field(default_factory=dict)  # threads -> the current probe's timings
    best: int | None = None

    def decide(self) -> None:
        """At the end of a probe: the count with the lower mean time (a thread the scheduler preempted stalls a
        call now and then: the mean counts those stalls, which throughput pays; a median hides them)."""
        one, most = self.seconds.get(1, []), self.seconds.get(self.most, [])
        if len(one) + len(most) < PROBE_CALLS or not one or not most:
            return
        self.best = 1 if statistics.fmean(one) <= statistics.fmean(most) else self.most
        self.seconds = {}


@dataclass
class Probe:
    """One timed call: the kind of call, the thread count it ran on and when it started."""

    kind: _Kind
    threads: int
    started: float


_kinds: dict[tuple, _Kind] = {}
_lock = threading.Lock()
_looks: collections.deque[int] = collections.deque(maxlen=LOOKS)
_cap: int | None = None  # the cores the latest looks leave (None before one): set at a look, read by every call
_next_look = -math.inf  # time.monotonic() from which a call looks again


def _spare(most: int) -> int:
    """``most``, or fewer: the cores this process may use less the threads running elsewhere (held: _lock). A look
    reads a file per thread of this process; the next waits :data:`LOOK_EVERY` seconds, or 100 times as long as
    this one took where that is longer (at most 1 % of the time, however many threads)."""
    global _cap, _next_look
    started = time.monotonic()
    if started >= _next_look:
        count = cores.running_elsewhere()
        if count is not None:
            _looks.append(count)
            _cap = cores.spare_cores(cores.usable_cores(), round(statistics.median(_looks)))
        _next_look = started + max(LOOK_EVERY, 100 * (time.monotonic() - started))
    return most if _cap is None else min(most, _cap)


def available(most: int) -> int:
    """The threads a call may take now: ``most``, or fewer where the threads running elsewhere take the cores
    (``most`` itself where :data:`ADAPTIVE` is false)."""
    if most <= 1 or not ADAPTIVE:
        return max(most, 1)
    with _lock:
        return _spare(most)


def begin(key: tuple, most: int) -> tuple[int, Probe | None]:
    """The threads this call runs on (at most ``most``), and the probe to :func:`end` when it is timed."""
    if most <= 1 or not ADAPTIVE:
        return max(most, 1), None
    with _lock:
        most = _spare(most)
        if most == 1:
            return 1, None
        kind = _kinds.setdefault((*key, most), _Kind(most))
        phase = kind.calls % PROBE_EVERY
        kind.calls += 1
        if kind.best is not None and phase >= PROBE_CALLS:
            return kind.best, None
        threads = most if phase < PROBE_CALLS // 2 else 1  # a probe: the most, then one (not alternating: threads
        # still spinning after a call on many slow the next call on one)
    return threads, Probe(kind, threads, time.perf_counter())


def end(probe: Probe | None) -> None:
    """Record a timed call's duration."""
    if probe is None:
        return
    seconds = time.perf_counter() - probe.started
    with _lock:
        probe.kind.seconds.setdefault(probe.threads, []).append(seconds)
        probe.kind.decide()


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run torch's own kernels (a GEMM a native kernel hands its panels to) on ``count`` threads, then restore.

    >>> with torch_threads(1):
    ...     torch.get_num_threads()
    1
    """
    previous = torch.get_num_threads()
    if count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def spare_threads() -> Iterator[None]:
    """Run torch's own ops on the threads :func:`available` leaves of torch's count, then restore (a loop of small ops,
    e.g. a decoder's token: on a busy machine their joins make two threads slower than one, as the kernels').

    >>> count = torch.get_num_threads()
    >>> with spare_threads():
    ...     1 <= torch.get_num_threads() <= count
    True
    """
    with torch_threads(available(torch.get_num_threads())):
        yield


def forget() -> None:
    """Drop every timing and look (a test, or a machine whose load changed for good)."""
    global _cap, _next_look
    with _lock:
        _kinds.clear()
        _looks.clear()
        _cap, _next_look = None, -math.inf
