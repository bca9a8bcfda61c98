"""Blocks of the last dimension: each row is zero-padded on its own, so a block never spans two rows.

Example::

    blocks = to_blocks(x, 16)           # (*x.shape[:-1], ceil(n / 16), 16); a 0-D x is one row
    y = from_blocks(blocks * 2, x.shape)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def to_blocks(x: Tensor, block_size: int) -> Tensor:
    """``x`` as ``(*rows, n_blocks, block_size)``, each row zero-padded to a multiple of ``block_size`` (a view of
    ``x`` where its rows tile: not to be written to)."""
    rows = x.reshape(x.shape if x.dim() else (1,))
    pad = -rows.shape[-1] % block_size
    padded = F.pad(rows, (0, pad)) if pad else rows  # rows that tile need no copy
    return padded.reshape(*padded.shape[:-1], padded.shape[-1] // block_size, block_size)


def from_blocks(blocks: Tensor, shape: torch.Size) -> Tensor:
    """The inverse of :func:`to_blocks`: drop the padding and restore ``shape``."""
    row_length = shape[-1] if len(shape) else 1
    rows = blocks.reshape(*blocks.shape[:-2], -1)[..., :row_length]
    return rows.reshape(shape)


def finite_amax(blocks: Tensor) -> Tensor:
    """The largest finite magnitude of each block, keeping the block dimension (NaN/Inf ignored; +0.0 for a
    block of zeros). Two reductions when every block is finite (the maximum and minimum propagate NaN and
    Inf), the masked one only otherwise.

    >>> finite_amax(torch.tensor([[1.0, -3.0], [-0.0, 0.0], [float("nan"), -2.0]])).tolist()
    [[3.0], [0.0], [2.0]]
    """
    if blocks.numel() and blocks.shape[-1]:
        amax = torch.maximum(blocks.amax(dim=-1, keepdim=True), blocks.amin(dim=-1, keepdim=True).neg_()).abs_()
        if bool(torch.isfinite(amax).all()):
            return amax
    magnitudes = torch.where(torch.isfinite(blocks), blocks.abs(), torch.zeros_like(blocks))
    return magnitudes.amax(dim=-1, keepdim=True)


def amax_and_non_finite(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Per block (keeping the block dimension): the largest magnitude, and whether it holds NaN or Inf.

    Two reductions that read ``blocks`` once each and allocate nothing of its size; the maximum of
    a non-finite block is not meaningful.
    """
    high, low = blocks.amax(dim=-1, keepdim=True), blocks.amin(dim=-1, keepdim=True)
    non_finite = ~(torch.isfinite(high) & torch.isfinite(low))
    return torch.maximum(high, low.neg_()), non_finite


def per_element(per_block: Tensor, blocks: Tensor, shape: torch.Size) -> Tensor:
    """A per-block value (``(..., n_blocks, 1)``) repeated for every element of ``shape``."""
    return from_blocks(per_block.expand(blocks.shape), shape)
