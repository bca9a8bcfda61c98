"""One call that makes a run repeatable: python's, numpy's and torch's generators seeded together.

Example::

    seed_everything(0)
"""

from __future__ import annotations

import random

import torch


def seed_everything(seed: int) -> None:
    """Seed python ``random``, numpy (when installed) and torch (every device)."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)
