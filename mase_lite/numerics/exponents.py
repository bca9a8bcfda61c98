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

from mase_lite.infra.errors import UserError

FLOAT32_MANTISSA_BITS = 23
FLOAT32_MAX_EXPONENT = 127
FLOAT32_MIN_EXPONENT = -149


def pow2(exponent: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Exact ``2.0 ** exponent`` for an integer tensor, built from exponent bits (subnormals included).

    Exponents below the dtype's smallest subnormal give 0, above its largest finite power give Inf.
    """
    if dtype == torch.float32 and exponent.numel() and int(exponent.min()) >= -126:
        # normal powers only (the common case): the exponent field alone, 2**128 and above give Inf
        return ((exponent.clamp(max=128).to(torch.int32) + 127) << 23).view(torch.float32)
    if dtype == torch.float64:
        mbits, bias, int_dtype = 52, 1023, torch.int64
    elif dtype == torch.float32:
        mbits, bias, int_dtype = 23, 127, torch.int32
    else:
        raise UserError(f"pow2 dtype={dtype} is not supported; allowed: [torch.float32, torch.float64]")
    e = exponent.to(torch.int64).clamp(-bias - mbits - 1, bias + 1)
    normal_bits = (e + bias).clamp(min=0) << mbits
    subnormal_bits = torch.ones_like(e) << (e + bias + mbits - 1).clamp(0, mbits - 1)
    bits = torch.where(e > -bias, normal_bits, subnormal_bits)
    bits = torch.where(e < -bias - mbits + 1, torch.zeros_like(bits), bits)
    return bits.to(int_dtype).view(dtype)


def floor_log2(x: Tensor) -> Tensor:
    """``floor(log2(|x|))`` (int32) read from the exponent bits; 0 gives -1, Inf/NaN an arbitrary value."""
    _, exponent = torch.frexp(x)
    return exponent - 1


def mul_pow2(x: Tensor, exponent: Tensor | int, out: Tensor | None = None) -> Tensor:
    """``x * 2**exponent``, exact whenever the result is a float32 value (``|exponent|`` up to 254).

    The factor is applied in two halves, so no intermediate power overflows. The result goes to
    ``out`` where given.
    """
    if not isinstance(exponent, Tensor):
        exponent = torch.tensor(exponent, dtype=torch.int32, device=x.device)
    half = torch.div(exponent, 2, rounding_mode="floor")
    return torch.mul(x, pow2(half), out=out).mul_(pow2(exponent - half))


def mul_pow2_(x: Tensor, exponent: Tensor | int) -> Tensor:
    """:func:`mul_pow2` in place: the same two multiplications, so the same bits."""
    if not isinstance(exponent, Tensor):
        exponent = torch.tensor(exponent, dtype=torch.int32, device=x.device)
    half = torch.div(exponent, 2, rounding_mode="floor")
    return x.mul_(pow2(half)).mul_(pow2(exponent - half))


def largest_float(mantissa_bits: int, max_exponent: Tensor | int) -> Tensor | float:
    """The largest value ``(2 - 2**-m) * 2**max_exponent`` of a float with ``m`` fraction bits."""
    significand = 2.0 - 2.0 ** -min(mantissa_bits, FLOAT32_MANTISSA_BITS)
    if isinstance(max_exponent, Tensor):
        return mul_pow2(torch.full(max_exponent.shape, significand, device=max_exponent.device), max_exponent)
    return math.ldexp(significand, max_exponent)


def round_to_float(
    x: Tensor, mantissa_bits: int, min_exponent: Tensor | int, max_exponent: Tensor | int,
    out: Tensor | None = None,
) -> Tensor:
    """Round ``x`` (float32) to a float with ``mantissa_bits`` fraction bits and an implicit leading one.

    Normal exponents span ``[min_exponent, max_exponent]``; below ``2**min_exponent`` values are
    subnormal (same quantum as the lowest binade). Ties round to even; magnitudes beyond the
    largest value saturate (Inf included); NaN stays NaN; the sign of zero is kept. Exponent
    arguments may be tensors broadcastable to ``x`` (per-block ranges). The result is a new tensor,
    or ``out`` (another tensor than ``x``) where given.

    >>> round_to_float(torch.tensor([1.3, -0.01, 1000.0]), 2, -2, 3).tolist()
    [1.25, -0.0, 14.0]
    """
    m = min(mantissa_bits, FLOAT32_MANTISSA_BITS)
    if magic_rounding_holds(m, min_exponent, max_exponent):
        y = round_by_magic_addition(x, m, min_exponent, max_exponent, out)
    else:
        exponent = torch.maximum(floor_log2(x), torch.as_tensor(min_exponent, dtype=torch.int32, device=x.device))
        quantum = exponent - m
        y = mul_pow2_(mul_pow2(x, -quantum, out).round_(), quantum)
    largest = largest_float(m, max_exponent)
    return clamp_(y, -largest, largest)


def fixed_point_rounding_holds(quantum: Tensor, largest_code: float) -> bool:
    """Whether :func:`round_fixed_point` is exact for steps ``2**quantum`` and codes up to ``largest_code``.

    Its constant ``1.5 * 2**(quantum + 23)`` must be a normal float32 and the codes at most ``2**22``.
    """
    if largest_code > 2**22:
        return False
    return not quantum.numel() or (int(quantum.min()) >= -149 and int(quantum.max()) <= 104)


def fixed_point_constants(quantum: Tensor, largest_code: float) -> tuple[Tensor, Tensor, Tensor]:
    """Arguments of :func:`round_fixed_point` for steps ``2**quantum`` (int tensor) and codes up to ``largest_code``."""
    magic = ((quantum.to(torch.int32) + (FLOAT32_MAX_EXPONENT + FLOAT32_MANTISSA_BITS)) << 23) | 0x400000
    limit = pow2(quantum) * largest_code  # exact: an integer below 2**23 times a power of two >= 2**-149
    return magic.view(torch.float32), -limit, limit


def round_fixed_point(x: Tensor, out: Tensor, magic: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """``x`` clamped to ``[low, high]`` and rounded (ties to even) to a multiple of its step ``q``, into ``out``.

    Adding ``magic = 1.5 * 2**23 * q`` puts the clamped ``x`` (at most ``2**22 * q``) in a binade whose
    float32 step is exactly ``q``, so float32's own round-half-to-even does the rounding; subtracting
    it is exact. Clamping first equals clamping the rounded value (the bounds are multiples of ``q``
    and rounding is monotonic). A zero result is +0.0. Arguments from :func:`fixed_point_constants`.

    >>> magic, low, high = fixed_point_constants(torch.tensor([-2]), 7.0)    # step 0.25, codes -7..7
    >>> round_fixed_point(torch.tensor([0.3, 0.375, -0.1, 9.0]), torch.empty(4), magic, low, high).tolist()
    [0.25, 0.5, 0.0, 1.75]
    """
    return clamp_(torch.maximum(x, low, out=out), None, high).add_(magic).sub_(magic)


def magic_rounding_kernel(m: int):
    """A chunk kernel ``(x, out, min_exponent, max_exponent, low, high)``: the steps of :func:`round_to_float`
    where :func:`magic_rounding_holds`, saturating at ``[low, high]`` (its largest values, or inside them)."""

    def kernel(x: Tensor, out: Tensor, min_exponent: Tensor, max_exponent: Tensor, low: Tensor, high: Tensor) -> None:
        clamp_(round_by_magic_addition(x, m, min_exponent, max_exponent, out), low, high)

    return kernel


def magic_rounding_holds(m: int, min_exponent: Tensor | int, max_exponent: Tensor | int) -> bool:
    """Whether :func:`round_by_magic_addition` is exact: normal float32 steps, no overflow of its constant."""
    lowest = int(min_exponent.min()) if isinstance(min_exponent, Tensor) else min_exponent
    highest = int(max_exponent.max()) if isinstance(max_exponent, Tensor) else max_exponent
    return m <= FLOAT32_MANTISSA_BITS - 2 and lowest >= -126 and highest + 2 + FLOAT32_MANTISSA_BITS - m <= 127


def round_by_magic_addition(x: Tensor, m: int, min_exponent: Tensor | int, max_exponent: Tensor | int,
                             out: Tensor | None = None) -> Tensor:
    """``round(x / q) * q`` with ``q = 2**(max(e, min_exponent) - m)``, ``e`` the binade of ``x``, in six passes.

    Adding ``C = 1.5 * 2**(max(e, min_exponent) + 23 - m)`` puts ``x + C`` in a binade whose float32
    step is exactly ``q``, so float32's own round-half-to-even does the rounding in one step;
    subtracting ``C`` is exact. ``C`` is built from the exponent bits of ``x``, its exponent
    clamped to ``[min_exponent, max_exponent + 1]`` (larger magnitudes saturate afterwards anyway,
    and Inf/NaN keep a finite ``C``). The sign of a zero result is restored from ``x``.
    """
    magic = torch.bitwise_and(x.view(torch.int32), 0x7F800000)
    low = _exponent_field(min_exponent, x.device)
    high = _exponent_field(max_exponent, x.device, plus=1)
    clamp_(magic, low, high).add_(((FLOAT32_MANTISSA_BITS - m) << 23) + 0x400000)
    magic = magic.view(torch.float32)
    return torch.add(x, magic, out=out).sub_(magic).copysign_(x)


def _exponent_field(exponent: Tensor | int, device: torch.device, plus: int = 0) -> Tensor | int:
    """The biased float32 exponent field of ``2**(exponent + plus)``, shifted into place (``<< 23``)."""
    if isinstance(exponent, Tensor):
        return (exponent.to(torch.int32) + (plus + FLOAT32_MAX_EXPONENT)) << 23
    return (exponent + plus + FLOAT32_MAX_EXPONENT) << 23


def clamp_(x: Tensor, low: Tensor | float | None, high: Tensor | float | None) -> Tensor:
    """``x.clamp_(low, high)``; tensor bounds as ``maximum`` and ``minimum`` (same values, NaN kept),
    which torch vectorises where its broadcasting ``clamp`` does not."""
    if not isinstance(low, Tensor) and not isinstance(high, Tensor):
        return x.clamp_(low, high)
    if low is not None:
        torch.maximum(x, torch.as_tensor(low, dtype=x.dtype, device=x.device), out=x)
    if high is not None:
        torch.minimum(x, torch.as_tensor(high, dtype=x.dtype, device=x.device), out=x)
    return x


def largest_float32_at_most(value: float) -> float:
    """The largest float32 that is not above ``value`` (for bounds such as 2**31 - 1)."""
    as_float32 = torch.tensor(value, dtype=torch.float64).to(torch.float32)
    if as_float32.item() > value:
        as_float32 = torch.nextafter(as_float32, torch.tensor(-math.inf))
    return as_float32.item()
