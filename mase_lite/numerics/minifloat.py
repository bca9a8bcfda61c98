"""Minifloats: ``minifloat_ieee`` (implicit leading one) and ``minifloat_denorm`` (no implicit one).

Both have a sign bit, ``exponent_width`` exponent bits with bias ``exponent_bias`` (default
``2**(e-1) - 1``) and ``m = width - 1 - exponent_width`` mantissa bits, and no Inf/NaN codes: every
exponent code holds numbers. Rounding is half to even; magnitudes beyond the largest value and ±Inf
saturate; NaN stays NaN; zero stays zero. Stored bits per element: ``width``.

``minifloat_ieee``: code E = 0 is subnormal, ``0.M * 2**(1-bias)``; E >= 1 is ``1.M * 2**(E-bias)``;
largest ``(2 - 2**-m) * 2**(2**e - 1 - bias)``.
``minifloat_denorm``: every code is ``0.M * 2**(E-bias)`` (needs m >= 1), so powers of two inside
the range are exact (1.0 = 0.1b * 2**1); largest ``(1 - 2**-m) * 2**(2**e - 1 - bias)``.

>>> import torch
>>> from mase_lite.numerics import quantize
>>> quantize(torch.tensor([1.0, 0.3, 1000.0]), "minifloat_ieee", width=8, exponent_width=4).tolist()
[1.0, 0.3125, 480.0]

(1000 saturates to the largest finite value, 1.875 * 2**8.)
"""

from __future__ import annotations

from pydantic import Field, model_validator
from torch import Tensor

from mase_lite.numerics.chunks import map_elements
from mase_lite.numerics.exponents import (
    FLOAT32_MANTISSA_BITS,
    FLOAT32_MAX_EXPONENT,
    FLOAT32_MIN_EXPONENT,
    largest_float,
    round_to_float,
)
from mase_lite.numerics.native import element_kernel
from mase_lite.numerics.codes import float_grid_codes, float_grid_values
from mase_lite.numerics.registry import Codec, FormatParams, register_format


class MinifloatParams(FormatParams):
    width: int = Field(ge=2, le=32, description="total bits: sign + exponent + mantissa")
    exponent_width: int = Field(ge=1, le=8, description="exponent bits (less than width)")
    exponent_bias: int | None = Field(None, description="exponent bias; default 2**(exponent_width-1) - 1")

    @property
    def bias(self) -> int:
        return self.exponent_bias if self.exponent_bias is not None else 2 ** (self.exponent_width - 1) - 1

    @property
    def mantissa_bits(self) -> int:
        return self.width - 1 - self.exponent_width

    @model_validator(mode="after")
    def _fits(self) -> "MinifloatParams":
        check_exponent_fits(self.exponent_width, self.width)
        return self


def check_exponent_fits(exponent_width: int, width: int) -> None:
    """An element of ``width`` bits keeps one bit for the sign: ``exponent_width < width``."""
    if exponent_width >= width:
        raise ValueError(
            f"exponent_width={exponent_width} must be < width={width} (allowed: 1..{width - 1}; one bit is the sign)"
        )


def check_exponent_range(min_exponent: int, max_exponent: int, what: str) -> None:
    """Refuse exponent ranges whose smallest exponent float32 (the compute type) cannot hold.

    A largest exponent above float32's 127 is accepted: those binades lie beyond every float32
    input, so magnitudes saturate at the largest format value float32 holds (see
    :func:`float32_max_exponent`).
    """
    if not FLOAT32_MIN_EXPONENT <= min_exponent <= FLOAT32_MAX_EXPONENT:
        raise ValueError(
            f"{what} gives exponents {min_exponent}..{max_exponent}; the smallest must lie in float32's "
            f"{FLOAT32_MIN_EXPONENT}..{FLOAT32_MAX_EXPONENT}: change exponent_bias"
        )


def float32_max_exponent(max_exponent: int) -> int:
    """A format's largest exponent as float32 holds it: at most 127 (higher binades are out of reach)."""
    return min(max_exponent, FLOAT32_MAX_EXPONENT)


def ieee_layout(p: MinifloatParams) -> tuple[int, int, int]:
    """(mantissa bits, min normal exponent, max exponent) of an IEEE-style minifloat."""
    return p.mantissa_bits, 1 - p.bias, float32_max_exponent(2**p.exponent_width - 1 - p.bias)


def denorm_layout(p: MinifloatParams) -> tuple[int, int, int]:
    """The denormalised minifloat as an IEEE-style layout with one fraction bit less.

    ``0.M * 2**(E-bias)`` with an m-bit M has the values of a float with m-1 fraction bits,
    exponents ``-bias-1 .. 2**e - 2 - bias`` and subnormals below.
    """
    return p.mantissa_bits - 1, -p.bias - 1, float32_max_exponent(2**p.exponent_width - 2 - p.bias)


class MinifloatIeeeParams(MinifloatParams):
    @model_validator(mode="after")
    def _in_float32(self) -> "MinifloatIeeeParams":
        lo, hi = 1 - self.bias, 2**self.exponent_width - 1 - self.bias
        check_exponent_range(lo, hi, f"exponent_width={self.exponent_width} with exponent_bias={self.bias}")
        return self


class MinifloatDenormParams(MinifloatParams):
    @model_validator(mode="after")
    def _has_mantissa_in_float32(self) -> "MinifloatDenormParams":
        if self.mantissa_bits < 1:
            raise ValueError(
                f"exponent_width={self.exponent_width} leaves no mantissa bit in width={self.width}; "
                f"minifloat_denorm needs exponent_width <= width - 2 = {self.width - 2}"
            )
        lo, hi = -self.bias - 1, 2**self.exponent_width - 2 - self.bias
        check_exponent_range(lo, hi, f"exponent_width={self.exponent_width} with exponent_bias={self.bias}")
        return self


def round_elements(x: Tensor, mantissa_bits: int, min_exponent: int, max_exponent: int) -> Tensor:
    """:func:`round_to_float` of every element: the native kernel where it applies, else chunk by chunk."""
    m = min(mantissa_bits, FLOAT32_MANTISSA_BITS)
    if max_exponent <= FLOAT32_MAX_EXPONENT:
        native = element_kernel.float_grid(x, m, min_exponent, max_exponent, largest_float(m, max_exponent))
        if native is not None:
            return native
    return map_elements(x, rounding_kernel(mantissa_bits, min_exponent, max_exponent))


def rounding_kernel(mantissa_bits: int, min_exponent: int, max_exponent: int):
    """A :func:`~mase_lite.numerics.chunks.map_elements` kernel: :func:`round_to_float` into ``out``."""

    def kernel(chunk: Tensor, out: Tensor) -> None:
        round_to_float(chunk, mantissa_bits, min_exponent, max_exponent, out)

    return kernel


def _bounds(layout):
    def bounds(x: Tensor, p: MinifloatParams) -> tuple[float, float]:
        m, _, hi = layout(p)
        largest = largest_float(m, hi)
        return -largest, largest

    return bounds


def float_grid_codec(layout) -> Codec:
    """Codes of an element format whose values are the float grid ``layout(params)`` gives (mantissa bits,
    min normal exponent, max exponent): sign and the grid's magnitude code, ``width`` bits."""
    return Codec(
        bits=lambda p: p.width,
        side=lambda x, p: {},
        codes=lambda values, side, p: float_grid_codes(values, p.width, *layout(p)[:2]),
        decode=lambda codes, side, p: float_grid_values(codes, p.width, *layout(p)[:2]),
    )


@register_format(
    "minifloat_ieee", params=MinifloatIeeeParams, bits=lambda p, shape: float(p.width), bounds=_bounds(ieee_layout),
    group=lambda p, row: 1, codec=float_grid_codec(ieee_layout),
)
def minifloat_ieee(x: Tensor, p: MinifloatParams) -> Tensor:
    """IEEE-style minifloat with subnormals and no Inf/NaN codes."""
    return round_elements(x, *ieee_layout(p))


@register_format(
    "minifloat_denorm",
    params=MinifloatDenormParams,
    bits=lambda p, shape: float(p.width),
    bounds=_bounds(denorm_layout),
    group=lambda p, row: 1,
    codec=float_grid_codec(denorm_layout),
)
def minifloat_denorm(x: Tensor, p: MinifloatParams) -> Tensor:
    """Minifloat without an implicit leading one: every code is ``0.M * 2**(E - bias)``."""
    return round_elements(x, *denorm_layout(p))
