"""Logarithmic: ``log`` — a sign bit and a ``width - 1``-bit exponent code E: ``±2**(E - exponent_bias)``.

Zero: the exponent code E = 0 (with either sign bit) means zero, so codes 1 .. 2**(width-1) - 1
hold the powers of two ``2**(1 - bias)`` .. ``2**(2**(width-1) - 1 - bias)``. Default bias
``2**(width-2) - 1``.

This is a minifloat with ``width - 1`` exponent bits and no mantissa: a value is rounded to the
nearest power of two by value (not by log distance); a tie ``1.5 * 2**k`` goes to ``2**(k+1)``
(half to even on the significand). Below the smallest power ``2**(1-bias)``, magnitudes up to half
of it (inclusive) become zero. Magnitudes above the largest power and ±Inf saturate; NaN stays NaN.
Powers above 2**127 (width 9 with the default bias 127 reaches 2**128) lie beyond float32, so
magnitudes saturate at 2**127 there.
Stored bits per element: ``width``.

>>> import torch
>>> from mase_lite.numerics import quantize
>>> quantize(torch.tensor([0.7, 1.5, -3.0, 0.0]), "log", width=4).tolist()   # bias 3
[0.5, 2.0, -4.0, 0.0]
"""

from __future__ import annotations

from pydantic import Field, model_validator
from torch import Tensor

from mase_lite.numerics.exponents import largest_float
from mase_lite.numerics.minifloat import check_exponent_range, float32_max_exponent, float_grid_codec, round_elements
from mase_lite.numerics.registry import FormatParams, register_format


class LogParams(FormatParams):
    width: int = Field(ge=2, le=9, description="sign bit + exponent-code bits")
    exponent_bias: int | None = Field(None, description="exponent bias; default 2**(width-2) - 1")

    @property
    def bias(self) -> int:
        return self.exponent_bias if self.exponent_bias is not None else 2 ** (self.width - 2) - 1

    @model_validator(mode="after")
    def _in_float32(self) -> "LogParams":
        lo, hi = 1 - self.bias, 2 ** (self.width - 1) - 1 - self.bias
        check_exponent_range(lo, hi, f"width={self.width} with exponent_bias={self.bias}")
        return self


def log_exponents(p: LogParams) -> tuple[int, int]:
    """The exponents of the smallest and largest nonzero magnitude that float32 holds."""
    return 1 - p.bias, float32_max_exponent(2 ** (p.width - 1) - 1 - p.bias)


def log_bounds(x: Tensor, p: LogParams) -> tuple[float, float]:
    largest = largest_float(0, log_exponents(p)[1])
    return -largest, largest


@register_format("log", params=LogParams, bits=lambda p, shape: float(p.width), bounds=log_bounds, group=lambda p, row: 1,
                 codec=float_grid_codec(lambda p: (0, *log_exponents(p))))
def log(x: Tensor, p: LogParams) -> Tensor:
    """Sign and power of two; exponent code 0 is zero."""
    return round_elements(x, 0, *log_exponents(p))
