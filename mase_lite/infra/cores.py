"""How many threads a command computes with when the user does not say: the cores this process may use, less the
other processes running on them now.

torch's default is one thread per core. On a machine other work keeps busy, threads that wait for each other on
oversubscribed cores make a run several times slower than one thread (``mase-lite run pipelines/tasks/llm.json``
beside two busy processes on two cores: 450 s on two threads, 156 s on one; benchmarks/RESULTS.md). So, unless
``--threads``, ``MASE_LITE_THREADS`` or ``OMP_NUM_THREADS`` says otherwise, a command starts on the cores it may use
less the threads other processes are running (Linux's count of runnable tasks less this process's own, the median
of a few looks), at least one; the native kernels keep to the same count as the load changes
(:mod:`mase_lite.numerics.native.threads`). :data:`REASON` says which rule chose; a run's report records it.

>>> spare_cores(cores=2, others=2), spare_cores(cores=8, others=1), spare_cores(cores=2, others=0)
(1, 7, 2)
"""

from __future__ import annotations

import os
import statistics
import time

REASON = "torch's default"
"""What chose the thread count: ``--threads``, an environment variable, the load, or torch's default."""
_ASKED: list[int | None] = [None]  # the count --threads or MASE_LITE_THREADS asked for


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def spare_cores(cores: int, others: int) -> int:
    """The cores left when ``others`` processes run on ``cores``, at least one."""
    return max(1, min(cores, cores - others))


def running_elsewhere(proc: str = "/proc") -> int | None:
    """Threads running now outside this process: Linux's count of runnable tasks (``/proc/loadavg``) less this
    process's own (its threads in state R, the caller at least); None where the system does not say."""
    try:
        with open(f"{proc}/loadavg") as f:
            runnable = int(f.read().split()[3].split("/")[0])
        own = 0
        for task in os.listdir(f"{proc}/self/task"):
            try:
                with open(f"{proc}/self/task/{task}/stat") as f:
                    stat = f.read()
            except OSError:  # the thread ended
                continue
            own += stat[stat.rindex(")") + 2] == "R"
    except (OSError, IndexError, ValueError):
        return None
    return max(0, runnable - max(own, 1))


def running_others(looks: int = 5, interval: float = 0.01) -> int | None:
    """Threads running now outside this process, the median of ``looks``; None where the system does not say."""
    counts = []
    for _ in range(looks):
        count = running_elsewhere()
        if count is None:
            return None
        counts.append(count)
        time.sleep(interval)
    return round(statistics.median(counts))


def choose_threads(requested: int | None, source: str) -> int | None:
    """The thread count to set (None: leave torch's), and :data:`REASON` set to why."""
    global REASON
    _ASKED[0] = requested
    if requested is not None:
        REASON = source
        return requested
    if os.environ.get("OMP_NUM_THREADS"):
        REASON = "OMP_NUM_THREADS"
        return None
    others = running_others()
    if others is None:
        REASON = "torch's default"
        return None
    cores = usable_cores()
    REASON = f"the load: {others} other running process{'es' * (others != 1)} on {cores} cores"
    return spare_cores(cores, others)


def steady_threads() -> int:
    """The thread count a result may depend on, whatever the load: the one asked for (``--threads``,
    ``MASE_LITE_THREADS``, ``OMP_NUM_THREADS``), else the usable cores. LAPACK's factorisations give other bits on
    other thread counts, so the calibration passes run theirs on this count, not on the count the load leaves
    (GPTQ on a 576-wide Llama: other weights at one thread than at two before, the same bits after).

    >>> steady_threads() >= 1
    True
    """
    if _ASKED[0] is not None:
        return _ASKED[0]
    omp = os.environ.get("OMP_NUM_THREADS", "")
    return int(omp) if omp.isdigit() and int(omp) > 0 else usable_cores()
