"""The MX formats ``mxint`` and ``mxfp`` in the format registry; their numerics live in :mod:`.mx`.

Stored bits per element: element bits + 8 / block_size (MXINT8 with blocks of 32: 8.25).
A block holding NaN or Inf decodes to NaN (the OCP rule); see :mod:`mase_lite.numerics.mx`.

Example::

    quantize(x, "mxint", element_width=8)            # block_size 32, scale_rule "floor"
    quantize(x, "mxfp", element_format="e2m1", block_size=16)
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from mase_lite.numerics.blocks import amax_and_non_finite, finite_amax, from_blocks, per_element, to_blocks
from mase_lite.numerics.codes import exact_integers, float_grid_codes, float_grid_values, offset_codes, offset_values
from mase_lite.numerics.exponents import mul_pow2
from mase_lite.numerics.mx import (
    E8M0_BIAS,
    E8M0_NAN,
    MXFP_FORMATS,
    ElementFormat,
    mx_bits_per_element,
    mxfp,
    mxint,
    mxint_element,
    shared_exponents,
    under_exponents,
)
from mase_lite.numerics.registry import Codec, FormatParams, register_format

ScaleRule = Literal["floor", "ceil", "even", "rceil"]


class MXIntParams(FormatParams):
    element_width: Literal[8, 6, 4] = Field(8, description="bits of each two's-complement element")
    block_size: int = Field(32, ge=1, description="elements of the last dimension per shared E8M0 scale")
    scale_rule: ScaleRule = Field("floor", description="how the shared exponent follows the block maximum")


class MXFPParams(FormatParams):
    element_format: Literal["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"] = Field("e4m3", description="element float type")
    block_size: int = Field(32, ge=1, description="elements of the last dimension per shared E8M0 scale")
    scale_rule: ScaleRule = Field("floor", description="how the shared exponent follows the block maximum")


def _mx_bounds(element_of):
    def bounds(x: Tensor, p) -> tuple[Tensor, Tensor]:
        element: ElementFormat = element_of(p)
        blocks = to_blocks(x, p.block_size)
        shared = shared_exponents(finite_amax(blocks), element, p.scale_rule)
        largest = per_element(mul_pow2(blocks.new_full(shared.shape, element.max_value), shared), blocks, x.shape)
        return -largest, largest

    return bounds


def _mxint_element(p: MXIntParams) -> ElementFormat:
    return mxint_element(p.element_width)


def _mxfp_element(p: MXFPParams) -> ElementFormat:
    return MXFP_FORMATS[p.element_format]


def _mx_codec(element_of, element_codes, element_values) -> Codec:
    """Codes of an MX format: per block the E8M0 scale code ``scale`` (uint8, 0xFF for a block holding NaN or
    Inf), per element the element's code of ``value * 2**-E``."""

    def side(x: Tensor, p) -> dict[str, Tensor]:
        amax, non_finite = amax_and_non_finite(to_blocks(x, p.block_size))
        shared = shared_exponents(amax, element_of(p), p.scale_rule)
        return {"scale": torch.where(non_finite, E8M0_NAN, shared + E8M0_BIAS).squeeze(-1).to(torch.uint8)}

    def exponents(side: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        scale = side["scale"].to(torch.int64).unsqueeze(-1)
        return scale - E8M0_BIAS, scale == E8M0_NAN

    def codes(values: Tensor, side: dict[str, Tensor], p) -> Tensor:
        shared, nan = exponents(side)
        scaled = torch.ldexp(to_blocks(values, p.block_size).double(), (-shared).double()).masked_fill(nan, 0.0)
        return from_blocks(element_codes(scaled, element_of(p)), values.shape)

    def decode(codes: Tensor, side: dict[str, Tensor], p) -> Tensor:
        shared, nan = exponents(side)
        elements = element_values(to_blocks(codes, p.block_size), element_of(p)).double()
        values = torch.ldexp(elements, shared.double()).float().masked_fill(nan, float("nan"))
        return from_blocks(values, codes.shape)

    return Codec(bits=lambda p: element_of(p).bits, side=side, codes=codes, decode=decode)


def _mx_group_quantizer(element_of, codec: Codec):
    """The shared exponent a block of ``values`` (one per row) fixes, and its element grid for other values."""

    def group_quantizer(p, values: Tensor):
        element = element_of(p)
        amax, non_finite = amax_and_non_finite(to_blocks(values, p.block_size))
        shared = shared_exponents(amax, element, p.scale_rule).reshape(-1)
        nan = non_finite.reshape(-1)

        def quantize(x: Tensor) -> Tensor:
            return under_exponents(x, shared, element).masked_fill_(nan, float("nan"))

        return codec.side(values, p), quantize

    return group_quantizer


def _int_element_codes(scaled: Tensor, element: ElementFormat) -> Tensor:
    return offset_codes(exact_integers(torch.ldexp(scaled, torch.tensor(float(element.mbits), dtype=torch.float64))),
                        element.bits)


def _int_element_values(codes: Tensor, element: ElementFormat) -> Tensor:
    return torch.ldexp(offset_values(codes, element.bits).double(), torch.tensor(-float(element.mbits), dtype=torch.float64))


def _fp_element_codes(scaled: Tensor, element: ElementFormat) -> Tensor:
    return float_grid_codes(scaled, element.bits, element.mbits, element.emin)


def _fp_element_values(codes: Tensor, element: ElementFormat) -> Tensor:
    return float_grid_values(codes, element.bits, element.mbits, element.emin)


MXINT_CODEC = _mx_codec(_mxint_element, _int_element_codes, _int_element_values)
MXFP_CODEC = _mx_codec(_mxfp_element, _fp_element_codes, _fp_element_values)


@register_format(
    "mxint",
    params=MXIntParams,
    bits=lambda p, shape: mx_bits_per_element(p.element_width, p.block_size),
    bounds=_mx_bounds(_mxint_element),
    group=lambda p, row: p.block_size,
    codec=MXINT_CODEC,
    group_quantizer=_mx_group_quantizer(_mxint_element, MXINT_CODEC),
)
def mxint_format(x: Tensor, p: MXIntParams) -> Tensor:
    """MXINT: integer elements sharing an E8M0 scale per block."""
    return mxint(x, element_width=p.element_width, block_size=p.block_size, scale_rule=p.scale_rule)


@register_format(
    "mxfp",
    params=MXFPParams,
    bits=lambda p, shape: mx_bits_per_element(MXFP_FORMATS[p.element_format].bits, p.block_size),
    bounds=_mx_bounds(_mxfp_element),
    group=lambda p, row: p.block_size,
    codec=MXFP_CODEC,
    group_quantizer=_mx_group_quantizer(_mxfp_element, MXFP_CODEC),
)
def mxfp_format(x: Tensor, p: MXFPParams) -> Tensor:
    """MXFP: minifloat elements sharing an E8M0 scale per block."""
    return mxfp(x, element_format=p.element_format, block_size=p.block_size, scale_rule=p.scale_rule)
