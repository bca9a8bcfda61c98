"""Ternary: ``ternary`` — {-alpha, 0, +alpha} per tensor.

``|x| > threshold`` -> ``sign(x) * alpha``, otherwise 0 (a value equal to the threshold becomes 0,
so zero stays zero even at threshold 0). ``threshold`` is a number, or ``None`` for
``0.75 * mean(|x|)``. ``scaling=True`` sets ``alpha`` to the mean ``|x|`` of the elements above the
threshold (0 when there are none); ``scaling=False`` uses ``alpha = 1``. Statistics use finite
elements only; NaN stays NaN; ±Inf becomes ±alpha. Stored bits: 2 per element (a 2-bit code),
plus one float32 alpha per tensor when scaling (``2 + 32 / numel`` when the shape is known).

>>> import torch
>>> from mase_lite.numerics import quantize
>>> quantize(torch.tensor([0.1, -0.9, 0.5, 0.0]), "ternary", threshold=0.3)
tensor([ 0.0000, -0.7000,  0.7000,  0.0000])
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from mase_lite.numerics.binary import finite_mean_abs
from mase_lite.numerics.registry import Codec, FormatParams, Shape, register_format

AUTO_THRESHOLD_FACTOR = 0.75


class TernaryParams(FormatParams):
    threshold: float | None = Field(None, ge=0, description="zero band half-width; None: 0.75 * mean(|x|)")
    scaling: bool = Field(True, description="alpha = mean |x| above the threshold; false: alpha = 1")


def ternary_layout(x: Tensor, p: TernaryParams) -> tuple[Tensor, Tensor]:
    """Where ``x`` is nonzero after ternarization, and ``alpha``."""
    if p.threshold is None:
        threshold = AUTO_THRESHOLD_FACTOR * finite_mean_abs(x)
    else:
        threshold = torch.tensor(p.threshold, dtype=x.dtype, device=x.device)
    nonzero = x.abs() > threshold
    if not p.scaling:
        return nonzero, torch.ones((), dtype=x.dtype, device=x.device)
    counted = nonzero & torch.isfinite(x)
    alpha = torch.where(counted, x.abs(), torch.zeros_like(x)).sum() / counted.sum().clamp(min=1)
    return nonzero, alpha


def _ternary_bounds(x: Tensor, p: TernaryParams) -> tuple[Tensor, Tensor]:
    alpha = ternary_layout(x, p)[1]
    return -alpha, alpha


def _ternary_bits(p: TernaryParams, shape: Shape | None) -> float:
    if shape is None or not p.scaling:
        return 2.0
    return 2.0 + 32 / max(math.prod(shape), 1)


def _ternary_codes(values: Tensor, side: dict, p: TernaryParams) -> Tensor:
    """0: zero (+0.0), 1: +alpha, 2: -alpha."""
    alpha = side["alpha"].reshape(())
    zero = (values == 0) & ~torch.signbit(values)
    plus, minus = (values == alpha) & ~zero, (values == -alpha) & ~zero
    if not bool((zero | plus | minus | values.isnan()).all()):
        raise ValueError("values off the format's levels")
    return plus.to(torch.int64) + 2 * minus.to(torch.int64)


def _ternary_values(codes: Tensor, side: dict, p: TernaryParams) -> Tensor:
    alpha = side["alpha"].reshape(()).float()
    return torch.where(codes == 1, alpha, torch.where(codes == 2, -alpha, torch.zeros((), dtype=torch.float32)))


TERNARY_CODEC = Codec(bits=lambda p: 2, side=lambda x, p: {"alpha": ternary_layout(x, p)[1].reshape(1).float()},
                      codes=_ternary_codes, decode=_ternary_values)


@register_format("ternary", params=TernaryParams, bits=_ternary_bits, bounds=_ternary_bounds, codec=TERNARY_CODEC)
def ternary(x: Tensor, p: TernaryParams) -> Tensor:
    """{-alpha, 0, alpha} with a fixed or data-derived threshold."""
    nonzero, alpha = ternary_layout(x, p)
    values = torch.where(nonzero, torch.sign(x) * alpha, torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, values)
