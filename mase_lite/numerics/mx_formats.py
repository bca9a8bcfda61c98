"""The MX formats ``mxint`` and ``mxfp`` in the format registry; their numerics live in :mod:`.mx`.

Stored bits per element: element bits + 8 / block_size (MXINT8 with blocks of 32: 8.25).
A block holding NaN or Inf decodes to NaN (the OCP rule); see :mod:`mase_lite.numerics.mx`.

Example::

    quantize(x, "mxint", element_width=8)            # block_size 32, scale_rule "floor"
    quantize(x, "mxfp", element_format="e2m1", block_size=16)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor

from mase_lite.numerics.blocks import finite_amax, per_element, to_blocks
from mase_lite.numerics.exponents import mul_pow2
from mase_lite.numerics.mx import (
    MXFP_FORMATS,
    ElementFormat,
    mx_bits_per_element,
    mxfp,
    mxint,
    mxint_element,
    shared_exponents,
)
from mase_lite.numerics.registry import FormatParams, register_format

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


@register_format(
    "mxint",
    params=MXIntParams,
    bits=lambda p, shape: mx_bits_per_element(p.element_width, p.block_size),
    bounds=_mx_bounds(_mxint_element),
    group=lambda p, row: p.block_size,
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
)
def mxfp_format(x: Tensor, p: MXFPParams) -> Tensor:
    """MXFP: minifloat elements sharing an E8M0 scale per block."""
    return mxfp(x, element_format=p.element_format, block_size=p.block_size, scale_rule=p.scale_rule)
