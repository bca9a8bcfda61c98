"""Sizes a user types are checked against the memory the machine has before anything is allocated.

>>> check_fits("data.max_length", 10**15, "the tokenized data")
Traceback (most recent call last):
...
mase_lite.errors.UserError: data.max_length: the tokenized data would need about 1000000.0 GB, more than the ... GB of memory this machine has
>>> check_fits("data.max_length", 1024, "the tokenized data")   # fits: no error
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from mase_lite.errors import UserError


def memory_bytes() -> int:
    """Memory this process may use: the cgroup limit or the machine's RAM, whichever is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def check_fits(field: str, estimate: float, what: str) -> None:
    """Raise a ``UserError`` naming ``field`` when ``estimate`` bytes exceed the machine's memory."""
    available = memory_bytes()
    if estimate > available:
        raise UserError(f"{field}: {what} would need about {_gb(estimate)}, more than the {_gb(available)} of memory this machine has")


def model_bytes(build: Callable[[], object], field: str) -> int:
    """Bytes of the parameters and buffers ``build()`` makes, measured on the meta device (nothing allocated).

    A build that fails on the values it was given (negative or zero sizes) raises a ``UserError`` naming ``field``.
    """
    import torch

    try:
        with torch.device("meta"):
            model = build()
    except UserError:
        raise
    except Exception as err:  # the model's own constructor rejects the values: report it as the user's input
        raise UserError(f"{field}: the model cannot be built from these values ({type(err).__name__}: {err})") from None
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)
