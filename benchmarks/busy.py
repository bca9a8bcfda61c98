"""Busy processes beside a benchmark: ``while True: pass`` in as many Python processes, killed on leaving.

    with busy_processes(2):
        ...  # timed beside two cores' worth of other work
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator


@contextlib.contextmanager
def busy_processes(count: int, settle: float = 2.0) -> Iterator[None]:
    """``count`` busy processes for the duration of the block (given ``settle`` seconds to start first)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(settle)
        yield
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
