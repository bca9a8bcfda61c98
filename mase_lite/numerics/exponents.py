"""Exact power-of-two arithmetic on float32 tensors, shared by the float-like formats.

Example::

    floor_log2(torch.tensor([0.75, 1.0, 6.0]))        # tensor([-1, 0, 2], dtype=torch.int32)
    mul_pow2(torch.tensor([3.0]), torch.tensor([-140]))  # 3 * 2**-140, exactly
    round_to_float(torch.tensor([1.3]), mantissa_bits=2, min_exponent=-6, max_exponent=7)  # 1.25
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mase_lite.numerics.mx import pow2

FLOAT32_MANTISSA_BITS = 23
FLOAT32_MAX_EXPONENT = 127
FLOAT32_MIN_EXPONENT = -149


def floor_log2(x: Tensor) -> Tensor:
    """``floor(log2(|x|))`` (int32) read from the exponent bits; 0 gives -1, Inf/NaN an arbitrary value."""
    _, exponent = torch.frexp(x)
    return exponent - 1


def mul_pow2(x: Tensor, exponent: Tensor | int) -> Tensor:
    """``x * 2**exponent``, exact whenever the result is a float32 value (``|exponent|`` up to 254).

    The factor is applied in two halves, so no intermediate power overflows.
    """
    if not isinstance(exponent, Tensor):
        exponent = torch.tensor(exponent, dtype=torch.int32, device=x.device)
    half = torch.div(exponent, 2, rounding_mode="floor")
    return x * pow2(half) * pow2(exponent - half)


def largest_float(mantissa_bits: int, max_exponent: Tensor | int) -> Tensor | float:
    """The largest value ``(2 - 2**-m) * 2**max_exponent`` of a float with ``m`` fraction bits."""
    significand = 2.0 - 2.0 ** -min(mantissa_bits, FLOAT32_MANTISSA_BITS)
    if isinstance(max_exponent, Tensor):
        return mul_pow2(torch.full(max_exponent.shape, significand, device=max_exponent.device), max_exponent)
    return math.ldexp(significand, max_exponent)


def round_to_float(
    x: Tensor, mantissa_bits: int, min_exponent: Tensor | int, max_exponent: Tensor | int
) -> Tensor:
    """Round ``x`` (float32) to a float with ``mantissa_bits`` fraction bits and an implicit leading one.

    Normal exponents span ``[min_exponent, max_exponent]``; below ``2**min_exponent`` values are
    subnormal (same quantum as the lowest binade). Ties round to even; magnitudes beyond the
    largest value saturate (Inf included); NaN stays NaN; the sign of zero is kept. Exponent
    arguments may be tensors broadcastable to ``x`` (per-block ranges).
    """
    m = min(mantissa_bits, FLOAT32_MANTISSA_BITS)
    exponent = floor_log2(x)
    exponent = torch.maximum(exponent, torch.as_tensor(min_exponent, dtype=exponent.dtype, device=x.device))
    quantum = exponent - m
    y = mul_pow2(torch.round(mul_pow2(x, -quantum)), quantum)
    largest = largest_float(m, max_exponent)
    if isinstance(largest, Tensor):
        return torch.minimum(torch.maximum(y, -largest), largest)
    return y.clamp(-largest, largest)


def largest_float32_at_most(value: float) -> float:
    """The largest float32 that is not above ``value`` (for bounds such as 2**31 - 1)."""
    as_float32 = torch.tensor(value, dtype=torch.float64).to(torch.float32)
    if as_float32.item() > value:
        as_float32 = torch.nextafter(as_float32, torch.tensor(-math.inf))
    return as_float32.item()
