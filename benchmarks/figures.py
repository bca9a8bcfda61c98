"""What the side-by-side benchmarks print beside their tables: the CPU they ran on and a figure's spread.

>>> spread([3.0, 1.0, 2.0])
'2.00 (1.00–3.00)'
"""

from __future__ import annotations

import platform
import statistics
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what Python knows of the processor."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def spread(values: list[float], digits: int = 2) -> str:
    """The median and the range of ``values``."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"
