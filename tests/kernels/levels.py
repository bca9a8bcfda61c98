"""Every vector level of the CPU kernels and every thread count a bit-exactness test runs at."""

import torch

from mase_lite.kernels import cpu


def every_level_and_thread_count(monkeypatch, threads=(1, 2, 3)):
    """Yield ``(level, count)`` with the kernels' level and torch's thread count set to each in turn; torch's thread
    count is restored after, also where the caller's check fails."""
    previous = torch.get_num_threads()
    try:
        for level in cpu.available_levels():
            monkeypatch.setenv(cpu.LEVEL_ENV, level)
            for count in threads:
                torch.set_num_threads(count)
                yield level, count
    finally:
        torch.set_num_threads(previous)
