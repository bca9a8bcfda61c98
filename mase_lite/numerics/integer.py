"""Fixed point: ``integer`` — a ``width``-bit integer code times ``2**-frac_width``.

Signed codes are two's complement, ``[-2**(width-1), 2**(width-1) - 1]``; unsigned codes
``[0, 2**width - 1]``. Rounding is half to even (``floor=True``: toward -inf); out-of-range
values and ±Inf saturate to the end codes; NaN stays NaN; code 0 is +0.0 (a two's complement code
has no sign of zero, so fake quantization and stored codes agree bit for bit). Stored bits per
element: ``width``.

Example::

    quantize(torch.tensor([0.3, 100.0, -9.0]), "integer", width=8, frac_width=4)
    # tensor([0.3125, 7.9375, -8.0])
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from mase_lite.numerics.codes import exact_integers, offset_codes, offset_values
from mase_lite.numerics.exponents import largest_float32_at_most
from mase_lite.numerics.memory import empty_like_advised
from mase_lite.numerics.native import element_kernel
from mase_lite.numerics.registry import Calibrated, Codec, FormatParams, Unfit, register_format, register_mapping


class IntegerParams(FormatParams):
    width: int = Field(ge=1, le=32, description="total bits, sign included when signed")
    frac_width: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        description="bits after the binary point (at most width); auto: chosen by calibration from the values"
    )
    signed: bool = Field(True, description="two's complement codes; false: unsigned codes")
    floor: bool = Field(False, description="round toward -inf instead of half to even")

    @model_validator(mode="after")
    def _frac_fits(self) -> "IntegerParams":
        if self.frac_width != "auto" and self.frac_width > self.width:
            raise ValueError(f"frac_width={self.frac_width} must be <= width={self.width} (allowed: 0..{self.width})")
        return self


def integer_codes(p: IntegerParams) -> tuple[float, float]:
    """The smallest and largest integer code (the largest is rounded down to a float32 value)."""
    if p.signed:
        return -(2.0 ** (p.width - 1)), largest_float32_at_most(2.0 ** (p.width - 1) - 1)
    return 0.0, largest_float32_at_most(2.0**p.width - 1)


def _resolved(p: IntegerParams) -> None:
    if p.frac_width == "auto":
        raise ValueError("integer frac_width='auto' is chosen by calibration: quantize (with the calibrate pass for activations)")


def integer_bounds(x: Tensor, p: IntegerParams) -> tuple[float, float]:
    _resolved(p)
    lo, hi = integer_codes(p)
    return lo * 2.0**-p.frac_width, hi * 2.0**-p.frac_width


def _integer_codes(values: Tensor, side: dict, p: IntegerParams) -> Tensor:
    codes = exact_integers(torch.ldexp(values.double(), torch.tensor(float(p.frac_width), dtype=torch.float64)))
    return offset_codes(codes, p.width) if p.signed else codes


def _integer_values(codes: Tensor, side: dict, p: IntegerParams) -> Tensor:
    signed = offset_values(codes, p.width) if p.signed else codes
    return torch.ldexp(signed.double(), torch.tensor(-float(p.frac_width), dtype=torch.float64)).float() + 0.0


INTEGER_CODEC = Codec(bits=lambda p: p.width, side=lambda x, p: _resolved(p) or {}, codes=_integer_codes,
                      decode=_integer_values)


def _frac_width_for(params: dict, amax: float) -> int:
    """The most fraction bits whose largest code still covers ``amax``."""
    width, signed = params["width"], params.get("signed", True)
    largest = 2.0 ** (width - 1) - 1 if signed else 2.0**width - 1
    if amax == 0:
        return width
    return max(0, min(width, math.floor(math.log2(largest / amax))))


INTEGER_CALIBRATED = Calibrated("frac_width", _frac_width_for, lambda params, amax, grid: list(range(params["width"] + 1)))


@register_format("integer", params=IntegerParams, bits=lambda p, shape: float(p.width), bounds=integer_bounds,
                 group=lambda p, row: 1, codec=INTEGER_CODEC, calibrated=INTEGER_CALIBRATED)
def integer(x: Tensor, p: IntegerParams) -> Tensor:
    """Fixed point with ``width`` bits of which ``frac_width`` are fractional."""
    _resolved(p)
    lo, hi = integer_codes(p)
    native = element_kernel.integer(x, p.frac_width, lo, hi, p.floor)
    if native is not None:
        return native
    codes = torch.mul(x, 2.0**p.frac_width, out=empty_like_advised(x))
    codes = codes.floor_() if p.floor else codes.round_()
    return codes.clamp_(lo, hi).mul_(2.0**-p.frac_width).add_(0.0)  # + 0.0: code 0 is +0.0


# Targets (each target's module says what its mapping takes and gives) --------------------------------------

def _ct_weight(fmt: dict, shape) -> dict:
    if fmt["width"] > 8:
        raise Unfit(f"{fmt['width']}-bit integer", "at most 8 bits")
    return {"num_bits": fmt["width"], "type": "int", "symmetric": fmt["signed"], "strategy": "tensor",
            "group_size": None, "dynamic": False}


def _ct_weight_tensors(codes, args: dict) -> dict[str, Tensor]:
    out = {"weight_scale": torch.tensor([2.0 ** -codes.format["frac_width"]])}
    if not codes.format["signed"]:  # unsigned codes: a zero point of -2**(w-1) in compressed-tensors' signed codes
        out["zero_point"] = torch.full((1,), -(1 << (codes.bits - 1)), dtype=torch.int64)
    return out


def _onnx_weight(codes) -> dict | None:
    fmt = codes.format
    if fmt["width"] > 8:
        return None
    values = offset_values(codes.unpacked(), fmt["width"]) if fmt["signed"] else codes.unpacked()
    return {"values": values, "scale": torch.tensor(2.0 ** -fmt["frac_width"]), "zero": None, "axis": None,
            "block": None, "bits": fmt["width"], "signed": fmt["signed"]}


def _onnx_input(fmt: dict) -> tuple[float, int, bool] | None:
    return (2.0 ** -fmt["frac_width"], 0, fmt["signed"]) if fmt["width"] == 8 and not fmt["floor"] else None


register_mapping("integer", "compressed-tensors", _ct_weight, _ct_weight_tensors)
register_mapping("integer", "onnx", None, _onnx_weight)
register_mapping("integer", "onnx/input", _onnx_input)
