"""Where a run computes: ``auto`` (CUDA when torch sees it, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.

``cuda`` is the first device torch sees: run one search worker per GPU with ``CUDA_VISIBLE_DEVICES=N``.

>>> resolve_device("cpu")
device(type='cpu')
"""

from __future__ import annotations

import torch

from mase_lite.infra.errors import UserError

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"


def resolve_device(name: str, field: str = "device") -> torch.device:
    """The torch device ``name`` stands for; a ``UserError`` naming ``field`` when it is not there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(
                f"{field} = {name!r}: torch sees no CUDA device on this machine (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}); use 'cpu' or 'auto'"
            )
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"{field} = {name!r}: torch sees {torch.cuda.device_count()} CUDA device(s) (0..{torch.cuda.device_count() - 1})")
    return torch.device(name)
