"""The MX formats ``mxint`` and ``mxfp`` in the format registry; their numerics live in :mod:`.mx`.

Stored bits per element: element bits + 8 / block_size (MXINT8 with blocks of 32: 8.25).
A block holding NaN or Inf decodes to NaN (the OCP rule); see :mod:`mase_lite.numerics.mx`.

Example::

    quantize(x, "mxint", element_width=8)            # block_size 32, scale_rule "floor"
    quantize(x, "mxfp", element_format="e2m1", block_size=16)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from mase_lite.numerics.blocks import amax_and_non_finite, finite_amax, from_blocks, per_element, to_blocks
from mase_lite.numerics.codes import (
    exact_integers, float_grid_codes, float_grid_values, offset_codes, offset_values, pack_bits,
)
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
from mase_lite.numerics.registry import Codec, FormatParams, Unfit, check_tiles, register_format, register_mapping

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


# Targets (each target's module says what its mapping takes and gives) --------------------------------------

def _finite_scales(codes) -> Tensor:
    """The E8M0 scale codes of a weight; :class:`Unfit` where a block holds NaN or Inf."""
    scale = codes.side["scale"]
    if bool((scale == E8M0_NAN).any()):
        raise Unfit("an MX block holding NaN or Inf", "finite weights")
    return scale


def _integer_steps(codes) -> Tensor:
    """The float64 step of each mxint block's integer codes: ``2**(E - mbits)``."""
    element = mxint_element(codes.format["element_width"])
    return torch.pow(2.0, _finite_scales(codes).to(torch.float64) - E8M0_BIAS - element.mbits)


def _mxint_ct(fmt: dict, shape) -> dict:
    check_tiles(shape[-1], fmt["block_size"], "mxint blocks", "blocks that tile a row")
    return {"num_bits": fmt["element_width"], "type": "int", "symmetric": True, "strategy": "group",
            "group_size": fmt["block_size"], "dynamic": False}


def _mxint_onnx(codes) -> dict | None:
    if bool((codes.side["scale"] == E8M0_NAN).any()):
        return None
    scale = _integer_steps(codes).float()
    if bool((scale == 0).any()):  # a step below float32's range: the float values are written
        return None
    width = codes.format["element_width"]
    return {"values": offset_values(codes.unpacked(), width), "scale": scale, "zero": None, "axis": 1,
            "block": codes.format["block_size"], "bits": width, "signed": True}


def _mxint_gguf(fmt: dict, shape) -> str | None:
    if fmt["block_size"] != 32 or fmt["element_width"] not in (8, 4):
        return None
    check_tiles(shape[-1], 32, "blocks", "leave this layer float (a null rule for it)")
    return "Q8_0" if fmt["element_width"] == 8 else "Q4_0"


def _mxint_gguf_blocks(codes, gguf_type: str):
    from mase_lite.numerics.ggml import integer_blocks

    return integer_blocks(codes.unpacked(), _integer_steps(codes).float(), gguf_type)


def _mx_table(element_of, element_values):
    """The 16 values a 4-bit element code stands for (under the scale 2**0) and each block's scale."""

    def table(codes) -> tuple[Tensor, Tensor]:
        values = element_values(torch.arange(16), element_of(SimpleNamespace(**codes.format)))
        scale = codes.side["scale"].to(torch.int64)
        scales = torch.where(scale == E8M0_NAN, float("nan"), torch.ldexp(torch.ones_like(scale, dtype=torch.float64),
                                                                          (scale - E8M0_BIAS).double()))
        return values.float(), scales.float()

    return table


def _mx_side(scales: Tensor, fmt: dict) -> dict[str, Tensor]:
    """The inverse of :func:`_mx_table`'s scales: E8M0 codes ``log2(scale) + 127``, 255 for NaN."""
    scales = scales.float()
    return {"scale": torch.where(scales.isnan(), 255.0, torch.log2(scales) + E8M0_BIAS).round().to(torch.uint8)}


def _mxint_packed(fmt: dict, activations: str) -> str | None:
    if fmt.get("element_width") == 8:
        if activations == "int8" and fmt.get("block_size", 32) != 32:
            raise Unfit(f"activations 'int8' takes MXINT8 in blocks of 32, not {fmt['block_size']}",
                        "block_size 32", field="activations")
        return "mxint8"
    return "packed4" if fmt.get("element_width") == 4 and fmt.get("block_size", 32) == 32 else None


def _e2m1_blocks_of_32(fmt: dict) -> bool:
    return fmt.get("element_format") == "e2m1" and fmt.get("block_size", 32) == 32


def _mxfp_ct(fmt: dict, shape) -> dict | None:
    if not _e2m1_blocks_of_32(fmt):
        return None
    check_tiles(shape[-1], 32, "blocks", "a row of whole blocks of 32")
    return {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
            "dynamic": False, "scale_dtype": "torch.uint8", "format": "mxfp4-pack-quantized"}


def _mxfp_ct_tensors(codes, args: dict) -> dict[str, Tensor]:
    scale = _finite_scales(codes)
    rows, columns = codes.shape
    return {"weight_packed": pack_bits(codes.unpacked(), 4).reshape(rows, columns // 2), "weight_scale": scale.contiguous()}


def _mxfp_gguf(fmt: dict, shape) -> str | None:
    if not _e2m1_blocks_of_32(fmt):
        return None
    check_tiles(shape[-1], 32, "blocks", "leave this layer float (a null rule for it)")
    return "MXFP4"


def _mxfp_gguf_blocks(codes, gguf_type: str) -> Tensor:
    """GGUF's MXFP4 blocks: the E8M0 scale, then E2M1 codes (low nibbles elements 0-15, high nibbles 16-31)."""
    scale = _finite_scales(codes)
    nibbles = codes.unpacked().reshape(*scale.shape, 32).to(torch.uint8)
    qs = nibbles[..., :16] | (nibbles[..., 16:] << 4)
    return torch.cat([scale.unsqueeze(-1), qs], -1).reshape(codes.shape[0], -1)


def _mxfp_packed(fmt: dict, activations: str) -> str | None:
    return "packed4" if _e2m1_blocks_of_32(fmt) else None


register_mapping("mxint", "compressed-tensors", _mxint_ct, lambda codes, args: {"weight_scale": _integer_steps(codes).float()})
register_mapping("mxint", "onnx", None, _mxint_onnx)
register_mapping("mxint", "gguf", _mxint_gguf, _mxint_gguf_blocks)
register_mapping("mxint", "packed", _mxint_packed, _mx_table(_mxint_element, _int_element_values), _mx_side)
register_mapping("mxfp", "compressed-tensors", _mxfp_ct, _mxfp_ct_tensors)
register_mapping("mxfp", "gguf", _mxfp_gguf, _mxfp_gguf_blocks)
register_mapping("mxfp", "packed", _mxfp_packed, _mx_table(_mxfp_element, _fp_element_values), _mx_side)
