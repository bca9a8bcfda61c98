"""Integers with a real scale: ``scaled_integer`` (per tensor, row or group) and NVIDIA's ``nvfp4``.

``scaled_integer``: a ``width``-bit integer code times a floating-point scale shared by a group of
the last dimension — the whole tensor, each row (``channel``: a weight's output channel, an
activation's token) or ``group_size`` consecutive elements of a row (the last group of a row may be
short; groups never span rows). Symmetric: codes ``-qmax..qmax`` (``qmax = 2**(width-1) - 1``),
``scale = clip * amax / qmax``; with ``full_range``, the two's complement codes ``-qmax-1..qmax`` and
``scale = clip * amax / (qmax + 1/2)`` (the grid of compressed-tensors, vLLM and llm-compressor: a 4-bit
amax/7.5, codes -8..7). Asymmetric: codes ``0..2**width - 1`` with a zero point,
``scale = clip * (max(x, 0) - min(x, 0)) / (2**width - 1)``, ``zero_point = round(-min / scale)``.
The scale is stored as float32, float16 or bfloat16 (rounded to nearest even; a float16 scale past
65504 saturates) or as a power of two (the next one up, so nothing clips). ``scale`` fixes a static
per-tensor scale (calibrated) instead of the one each tensor gives. ``x / scale`` is rounded half to
even and clamped; the amax is taken over finite values: NaN stays NaN, ±Inf saturate; a group of
zeros (or a scale that underflows to zero) gives zeros; a zero code gives +0.0.
Stored bits per element: ``width`` plus the group's scale (and zero point: ``width`` bits) shared
over its elements, counted exactly for a given shape.

``nvfp4`` (NVIDIA Blackwell): E2M1 elements, one E4M3 scale per 16 elements of the last dimension
and one float32 scale per tensor: ``tensor_scale = amax / (448 * 6)``; a block's scale
``amax_block / 6 / tensor_scale`` is clamped to ``[2**-6, 448]`` and rounded to E4M3; elements are
``x * ((1 / tensor_scale) / block_scale)`` (NVIDIA's kernels multiply by the reciprocal) rounded to
E2M1 (ties to even, saturating at 6) and decode as ``element * (tensor_scale * block_scale)``; bit for
bit torchao 0.18's emulation. With ``per_tensor="global_scale"`` the per-tensor scale is NVIDIA
ModelOpt's, compressed-tensors' and vLLM's: ``global_scale = (1 / amax) * (448 * 6)`` divides instead,
``block_scale = (amax_block / 6) * global_scale`` rounded to E4M3 (subnormal scales too; a zero one is 1/8,
as compressed-tensors has it), elements ``x / (block_scale / global_scale)`` and values ``element *
(block_scale / global_scale)``, bit for bit compressed-tensors' (llm-compressor's) NVFP4. The two
conventions differ by a rounding of the scale in most tensors; only this one exports to compressed-tensors
exactly. ``tensor_amax`` fixes the per-tensor amax (calibrated). Bits per element: 4 + 8/16 + 32 per tensor.

On CPU, float32 tensors outside autograd and tracing run through the native kernel
(:mod:`~mase_lite.numerics.native.scaled_kernel`), the same bits in one pass over the groups (a
scale shared by the tensor needs one more, to find the tensor's range); the torch code below is
the reference and runs everywhere else.

>>> import torch
>>> x = torch.tensor([[3.5, -7.0, 1.2, 0.0]])
>>> scaled_integer(x, ScaledIntegerParams(width=4)).tolist()      # scale 7 / 7: codes 4 (a tie: even), -7, 1, 0
[[4.0, -7.0, 1.0, 0.0]]
>>> nvfp4(torch.tensor([[6.0, 3.1, -0.2, 0.0]]), NVFP4Params()).tolist()
[[6.0, 3.0, -0.0, 0.0]]
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from mase_lite.numerics.blocks import finite_amax, from_blocks, per_element, to_blocks
from mase_lite.numerics.codes import exact_integers, float_grid_codes, float_grid_values, offset_values, pack_bits
from mase_lite.numerics.exponents import round_to_float
from mase_lite.numerics.native import scaled_kernel
from mase_lite.numerics.registry import (
    Calibrated, Codec, FormatParams, Shape, Unfit, check_tiles, register_format, register_mapping,
)

SCALE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16, "pow2": 8}
E4M3_MAX, E4M3_TINY, E2M1_MAX = 448.0, 2.0**-6, 6.0


class ScaledIntegerParams(FormatParams):
    width: int = Field(8, ge=2, le=16, description="bits per code, sign included")
    symmetric: bool = Field(True, description="codes around zero; false: unsigned codes with a zero point")
    granularity: Literal["tensor", "channel", "group"] = Field(
        "channel", description="one scale per tensor, per row of the last dimension, or per group of it"
    )
    group_size: int = Field(128, ge=1, description="elements of the last dimension per scale (granularity group)")
    clip: float = Field(1.0, gt=0, le=1, description="scale from this fraction of the range (clipping the outliers)")
    full_range: bool = Field(False, description="symmetric codes -2**(width-1)..2**(width-1)-1 with scale "
                             "amax / (2**(width-1) - 1/2), as compressed-tensors and vLLM quantize; false: ±(2**(width-1)-1)")
    scale_dtype: Literal["float32", "float16", "bfloat16", "pow2"] = Field("float32", description="how a scale is stored")
    scale: float | Literal["auto"] | None = Field(
        None, description="a static per-tensor scale (auto: chosen by calibration); null: from each tensor"
    )

    @model_validator(mode="after")
    def _static_scale(self) -> "ScaledIntegerParams":
        if self.scale is not None and (self.granularity != "tensor" or not self.symmetric):
            raise ValueError("a static scale is one per tensor: give granularity 'tensor' and symmetric true with it")
        if self.full_range and not self.symmetric:
            raise ValueError("full_range is a symmetric grid; an asymmetric one (symmetric false) uses every code already")
        if isinstance(self.scale, float) and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale={self.scale} must be a positive finite number")
        return self


def _groups(x: Tensor, p: ScaledIntegerParams) -> Tensor:
    if p.granularity == "tensor":
        return x.reshape(1, 1, -1)
    size = p.group_size if p.granularity == "group" else max(x.shape[-1] if x.dim() else 1, 1)
    return to_blocks(x, size)


def _ungroup(groups: Tensor, x: Tensor, p: ScaledIntegerParams) -> Tensor:
    return groups.reshape(x.shape) if p.granularity == "tensor" else from_blocks(groups, x.shape)


def stored_scale(scale: Tensor, scale_dtype: str) -> Tensor:
    """``scale`` (float32, positive or zero) as it is stored: rounded to ``scale_dtype`` or up to a power of two."""
    if scale_dtype == "pow2":
        mantissa, exponent = torch.frexp(scale)
        exponent = exponent - (mantissa == 0.5).to(exponent.dtype)  # an exact power of two stays
        return torch.where(scale > 0, torch.ldexp(torch.ones_like(scale), exponent), scale)
    if scale_dtype == "float32":
        return scale
    dtype = getattr(torch, scale_dtype)
    return scale.clamp(max=torch.finfo(dtype).max).to(dtype).to(torch.float32)


def _scale_and_zero(groups: Tensor, p: ScaledIntegerParams) -> tuple[Tensor, Tensor, float, float]:
    """Per group: the stored scale and the zero point, and the code range."""
    if p.symmetric:
        qmax = 2.0 ** (p.width - 1) - 1
        if p.scale is not None:
            scale = torch.full(groups.shape[:-1] + (1,), float(p.scale), device=groups.device)
        else:
            scale = finite_amax(groups) * p.clip / (qmax + 0.5 if p.full_range else qmax)
        return stored_scale(scale, p.scale_dtype), torch.zeros_like(scale), -qmax - p.full_range, qmax
    qmax = 2.0**p.width - 1
    finite = torch.isfinite(groups)
    high = torch.where(finite, groups, torch.zeros_like(groups)).amax(-1, keepdim=True).clamp(min=0) * p.clip
    low = torch.where(finite, groups, torch.zeros_like(groups)).amin(-1, keepdim=True).clamp(max=0) * p.clip
    scale = stored_scale((high - low) / qmax, p.scale_dtype)
    zero = torch.where(scale > 0, (-low / scale).round(), torch.zeros_like(scale)).clamp(0, qmax)
    return scale, zero, 0.0, qmax


def _each_element(per_group: Tensor, groups: Tensor, x: Tensor, p: ScaledIntegerParams) -> Tensor:
    if p.granularity == "tensor":
        return per_group.expand(groups.shape).reshape(x.shape)
    return per_element(per_group, groups, x.shape)


def _scaled_bounds(x: Tensor, p: ScaledIntegerParams) -> tuple[Tensor, Tensor]:
    groups = _groups(x, p)
    scale, zero, lo, hi = _scale_and_zero(groups, p)
    return _each_element((lo - zero) * scale, groups, x, p), _each_element((hi - zero) * scale, groups, x, p)


def _scaled_bits(p: ScaledIntegerParams, shape: Shape | None) -> float:
    per_scale = SCALE_BITS[p.scale_dtype] + (0 if p.symmetric else p.width)
    if p.scale is not None:
        per_scale = 0 if shape is None else 32  # a static scale: one float32 per tensor
    if shape is None:
        return p.width + (per_scale / p.group_size if p.granularity == "group" else 0.0)
    numel = math.prod(shape) if shape else 1
    if numel == 0:
        return float(p.width)
    row = shape[-1] if shape else 1
    rows = numel // max(row, 1)
    scales = {"tensor": 1, "channel": rows, "group": rows * math.ceil(row / p.group_size)}[p.granularity]
    if p.scale is not None:
        scales = 1
    return p.width + scales * per_scale / numel


def _scaled_side(x: Tensor, p: ScaledIntegerParams) -> dict[str, Tensor]:
    """Per group: the stored scale (in ``scale_dtype``; a power of two as its int8 exponent) and, asymmetric,
    the zero point (uint8; int32 from 9 bits)."""
    if p.scale == "auto":
        raise ValueError("scaled_integer scale='auto' is chosen by calibration")
    scale, zero, _, _ = _scale_and_zero(_groups(x, p), p)
    return _stored_side(scale, zero, p)


def _stored_side(scale: Tensor, zero: Tensor, p: ScaledIntegerParams) -> dict[str, Tensor]:
    scale, zero = (scale.reshape(1), zero.reshape(1)) if p.granularity == "tensor" else (scale.squeeze(-1), zero.squeeze(-1))
    if p.scale_dtype == "pow2":
        stored = {"scale_exponent": (torch.frexp(scale)[1] - 1).masked_fill(scale == 0, -128).to(torch.int8)}
    else:
        stored = {"scale": scale.to(getattr(torch, p.scale_dtype))}
    if not p.symmetric:
        stored["zero_point"] = zero.to(torch.uint8 if p.width <= 8 else torch.int32)
    return stored


def stored_scales(side: dict[str, Tensor]) -> Tensor:
    """The float32 scale of each group of a ``scaled_integer`` tensor's stored side (a power of two from its
    exponent, zero for a group of zeros)."""
    if "scale_exponent" in side:
        exponent = side["scale_exponent"].to(torch.int64)
        return torch.where(exponent == -128, 0.0, torch.ldexp(torch.ones_like(exponent, dtype=torch.float64),
                                                              exponent.double())).float()
    return side["scale"].float()


def _scales_of(side: dict[str, Tensor], p: ScaledIntegerParams) -> tuple[Tensor, Tensor]:
    """Per group (``(..., 1)``): the float32 scale and the zero point."""
    scale = stored_scales(side)
    zero = side["zero_point"].float() if "zero_point" in side else torch.zeros_like(scale)
    return scale.unsqueeze(-1), zero.unsqueeze(-1)


def _scaled_codes(values: Tensor, side: dict[str, Tensor], p: ScaledIntegerParams) -> Tensor:
    scale, zero = _scales_of(side, p)
    # a value is float32(code × scale): in float32, value / scale is within |code| · 2**-22 of the code, so up
    # to 16 bits it rounds back to it exactly (float64 beyond)
    dtype = torch.float32 if p.width <= 16 else torch.float64
    groups = _groups(values, p).to(dtype)
    live = scale > 0
    steps = torch.div(groups, torch.where(live, scale, 1.0).to(dtype)).masked_fill_(~live, 0.0).round_()
    codes = exact_integers(steps.add_(zero.to(dtype)), torch.int32 if p.width <= 16 else torch.int64)
    return _ungroup(codes.add_(1 << (p.width - 1)) if p.symmetric else codes, values, p)  # offset binary


def _scaled_values(codes: Tensor, side: dict[str, Tensor], p: ScaledIntegerParams) -> Tensor:
    scale, zero = _scales_of(side, p)
    groups = _groups(codes, p)
    values = groups.float()  # codes of up to 16 bits (32 in float64 before here) are exact in float32
    if p.symmetric:
        values.sub_(1 << (p.width - 1))
    return _ungroup(values.sub_(zero).mul_(scale).add_(0.0), codes, p)


def _scaled_group_quantizer(p: ScaledIntegerParams, values: Tensor):
    """The scale (and zero point) a group of ``values`` per row fixes — one for the tensor with granularity
    tensor — and its integer grid for other values of these rows: the steps of :func:`scaled_integer`."""
    scale, zero, lo, hi = _scale_and_zero(_groups(values, p), p)
    side = _stored_side(scale, zero, p)
    scale, zero = scale.reshape(-1), zero.reshape(-1)
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))

    def quantize(x: Tensor) -> Tensor:
        codes = torch.div(x, divisor).round_()
        if not p.symmetric:
            return codes.add_(zero).clamp_(lo, hi).sub_(zero).mul_(scale).add_(0.0)
        return codes.clamp_(lo, hi).mul_(scale).add_(0.0)

    return side, quantize


SCALED_INTEGER_CODEC = Codec(bits=lambda p: p.width, side=_scaled_side, codes=_scaled_codes, decode=_scaled_values)


def _largest_step(params: dict) -> float:
    """The code the amax maps to: ``2**(width-1) - 1``, half a code more on the full two's complement range."""
    return 2.0 ** (params["width"] - 1) - 1 + (0.5 if params.get("full_range") else 0.0)


SCALED_INTEGER_CALIBRATED = Calibrated(
    "scale", lambda params, amax: amax * params.get("clip", 1.0) / _largest_step(params) if amax > 0 else 1.0,
    lambda params, amax, grid: [(k + 1) / grid * amax / _largest_step(params) for k in range(grid)])


@register_format("scaled_integer", params=ScaledIntegerParams, bits=_scaled_bits, bounds=_scaled_bounds,
                 group=lambda p, row: p.group_size if p.granularity == "group" else row, codec=SCALED_INTEGER_CODEC,
                 group_quantizer=_scaled_group_quantizer, calibrated=SCALED_INTEGER_CALIBRATED)
def scaled_integer(x: Tensor, p: ScaledIntegerParams) -> Tensor:
    """Integer codes times a float scale per tensor, row or group (symmetric, or with a zero point)."""
    if p.scale == "auto":
        raise ValueError("scaled_integer scale='auto' is chosen by calibration: run the calibrate pass, then quantize")
    native = _native_scaled_integer(x, p)
    if native is not None:
        return native
    groups = _groups(x, p)
    scale, zero, lo, hi = _scale_and_zero(groups, p)
    live = scale > 0
    codes = torch.where(live, groups / torch.where(live, scale, torch.ones_like(scale)), torch.zeros_like(groups))
    codes = (codes.round() + zero).clamp(lo, hi)
    values = (codes - zero) * scale + 0.0  # a zero code is +0.0
    values = torch.where(torch.isnan(groups), groups, values)
    return _ungroup(values, x, p)


def _native_scaled_integer(x: Tensor, p: ScaledIntegerParams) -> Tensor | None:
    """The native kernel's result, or None where it does not apply. A scale shared by the tensor is
    derived here, by the torch steps above, from the tensor's finite range: a group holding just its
    minimum and maximum has the same scale and zero point."""
    if not scaled_kernel.available(x):
        return None
    qmax = 2.0 ** (p.width - 1) - 1 if p.symmetric else 2.0**p.width - 1
    fixed = None
    if p.granularity == "tensor":
        low_high = scaled_kernel.finite_range(x) if p.scale is None else (0.0, 0.0)
        scale, zero, _, _ = _scale_and_zero(torch.tensor(low_high).reshape(1, 1, 2), p)
        fixed = float(scale), float(zero)
    size = p.group_size if p.granularity == "group" else max(x.shape[-1] if x.dim() else 1, 1)
    return scaled_kernel.scaled_integer(x, size, p.symmetric, p.clip, qmax, p.scale_dtype, fixed, p.full_range)


class NVFP4Params(FormatParams):
    block_size: Literal[16] = Field(16, description="elements per E4M3 scale (16, as NVIDIA defines it)")
    tensor_amax: float | Literal["auto"] | None = Field(
        None, description="a static per-tensor amax (auto: chosen by calibration); null: each tensor's own"
    )
    per_tensor: Literal["torchao", "global_scale"] = Field(
        "torchao", description="torchao: multiply by amax / (448 * 6); global_scale: divide by (448 * 6) / amax "
        "(NVIDIA ModelOpt, compressed-tensors, vLLM)"
    )


def _nvfp4_amax(blocks: Tensor, p: NVFP4Params) -> Tensor:
    return (finite_amax(blocks.reshape(1, -1)).reshape(()) if p.tensor_amax is None
            else torch.tensor(float(p.tensor_amax), device=blocks.device))


def _nvfp4_scales(blocks: Tensor, p: NVFP4Params) -> tuple[Tensor, Tensor | None]:
    """Per block: the decoding scale and, under torchao's convention, the encoding multiplier
    ``(1 / tensor_scale) / block_scale`` (NVIDIA's kernels multiply by it instead of dividing; None under
    ``global_scale``, whose elements are ``x / scale``), with the E4M3 block scale rounded as NVIDIA rounds
    it; both zero for a tensor of zeros."""
    amax, block_amax = _nvfp4_amax(blocks, p), finite_amax(blocks)
    zero = torch.zeros_like(block_amax)
    if p.per_tensor == "global_scale":
        global_scale = nvfp4_global_scale(amax)
        block_scale = _global_block_scale(block_amax, global_scale).float()
        return torch.where(torch.isfinite(global_scale), block_scale / global_scale, zero), None
    tensor_scale = _nvfp4_tensor_scale(amax)
    block_scale = _e4m3(block_amax / E2M1_MAX / tensor_scale)
    live = tensor_scale > 0
    return torch.where(live, tensor_scale * block_scale, zero), torch.where(live, (1.0 / tensor_scale) / block_scale, zero)


def _e4m3(scale: Tensor) -> Tensor:
    return scale.clamp(E4M3_TINY, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def _global_block_scale(block_amax: Tensor, global_scale: Tensor) -> Tensor:
    """E4M3 block scales as compressed-tensors rounds them: no lower clamp (subnormal scales), and a scale
    that rounds to zero becomes E4M3's epsilon, 1/8."""
    scale = (block_amax / E2M1_MAX * global_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    return torch.where(scale.float() == 0, torch.tensor(0.125, dtype=torch.float8_e4m3fn), scale)


def _nvfp4_tensor_scale(amax: Tensor) -> Tensor:
    return amax / (E4M3_MAX * E2M1_MAX)


def nvfp4_global_scale(amax: Tensor) -> Tensor:
    """``(448 * 6) / amax`` as compressed-tensors computes it in float32, ``(1 / amax) * 2688`` (torch's division
    of a number by a tensor); infinite for a tensor of zeros (whose values are all zero)."""
    return torch.reciprocal(amax.float()) * (E4M3_MAX * E2M1_MAX)


def _nvfp4_bounds(x: Tensor, p: NVFP4Params) -> tuple[Tensor, Tensor]:
    blocks = to_blocks(x, p.block_size)
    largest = per_element(_nvfp4_scales(blocks, p)[0] * E2M1_MAX, blocks, x.shape)
    return -largest, largest


def _nvfp4_bits(p: NVFP4Params, shape: Shape | None) -> float:
    numel = math.prod(shape) if shape else 0
    return 4 + 8 / p.block_size + (32 / numel if numel else 0.0)


def _nvfp4_side(x: Tensor, p: NVFP4Params) -> dict[str, Tensor]:
    """The float32 tensor scale (``global_scale``: the global scale) and, per block of 16, the E4M3 block
    scale (float8_e4m3fn)."""
    if p.tensor_amax == "auto":
        raise ValueError("nvfp4 tensor_amax='auto' is chosen by calibration")
    blocks = to_blocks(x, p.block_size)
    amax, block_amax = _nvfp4_amax(blocks, p), finite_amax(blocks)
    if p.per_tensor == "global_scale":
        global_scale = nvfp4_global_scale(amax)
        block_scale = _global_block_scale(block_amax, global_scale)
        return {"global_scale": global_scale.reshape(1), "block_scale": block_scale.squeeze(-1)}
    tensor_scale = _nvfp4_tensor_scale(amax)
    block_scale = (block_amax / E2M1_MAX / tensor_scale).clamp(E4M3_TINY, E4M3_MAX)
    return {"tensor_scale": tensor_scale.reshape(1).float(), "block_scale": block_scale.squeeze(-1).to(torch.float8_e4m3fn)}


def _nvfp4_scale(side: dict[str, Tensor]) -> Tensor:
    """Per block: the decoding scale ``tensor_scale * block_scale`` or ``block_scale / global_scale``
    (float32, zero for a tensor of zeros)."""
    block_scale = side["block_scale"].float().unsqueeze(-1)
    if "global_scale" in side:
        global_scale = side["global_scale"].reshape(())
        return torch.where(torch.isfinite(global_scale), block_scale / global_scale, torch.zeros_like(block_scale))
    tensor_scale = side["tensor_scale"].reshape(())
    return torch.where(tensor_scale > 0, tensor_scale * block_scale, torch.zeros_like(block_scale))


def _nvfp4_codes(values: Tensor, side: dict[str, Tensor], p: NVFP4Params) -> Tensor:
    """E2M1 codes of ``value / scale``, rounded to the nearest E2M1 value (a value is an element times its
    block's scale, rounded once to float32)."""
    scale = _nvfp4_scale(side).double()
    blocks = to_blocks(values, p.block_size).double()
    elements = torch.where(scale > 0, blocks / torch.where(scale > 0, scale, 1.0), blocks.sign() * 0.0)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    nearest = grid[(elements.nan_to_num(0.0).abs().clamp(max=E2M1_MAX).unsqueeze(-1) - grid).abs().argmin(-1)]
    return from_blocks(float_grid_codes(nearest.copysign(blocks), 4, 1, 0), values.shape)


def _nvfp4_values(codes: Tensor, side: dict[str, Tensor], p: NVFP4Params) -> Tensor:
    elements = float_grid_values(to_blocks(codes, p.block_size), 4, 1, 0)
    return from_blocks(elements * _nvfp4_scale(side), codes.shape)


NVFP4_CODEC = Codec(bits=lambda p: 4, side=_nvfp4_side, codes=_nvfp4_codes, decode=_nvfp4_values)


@register_format("nvfp4", params=NVFP4Params, bits=_nvfp4_bits, bounds=_nvfp4_bounds,  # its per-tensor scale spans the rows
                 codec=NVFP4_CODEC, calibrated=Calibrated("tensor_amax", lambda params, amax: amax))
def nvfp4(x: Tensor, p: NVFP4Params) -> Tensor:
    """NVIDIA's FP4: E2M1 elements, an E4M3 scale per 16 and a float32 scale per tensor."""
    if p.tensor_amax == "auto":
        raise ValueError("nvfp4 tensor_amax='auto' is chosen by calibration: run the calibrate pass, then quantize")
    if p.per_tensor == "torchao" and scaled_kernel.available(x):  # the tensor scale by the torch step
        if p.tensor_amax is None:
            low, high = scaled_kernel.finite_range(x)
            amax = torch.tensor(max(high, -low))
        else:
            amax = torch.tensor(float(p.tensor_amax))
        return scaled_kernel.nvfp4(x, float(_nvfp4_tensor_scale(amax)))
    blocks = to_blocks(x, p.block_size)
    scale, multiplier = _nvfp4_scales(blocks, p)
    ratio = blocks * multiplier if multiplier is not None else torch.where(scale > 0, blocks / scale, blocks * 0.0)
    elements = round_to_float(ratio.clamp(-E2M1_MAX, E2M1_MAX), 1, 0, 2)
    values = torch.where(torch.isnan(blocks), blocks, elements * scale)
    return from_blocks(values, x.shape)


# Targets (each target's module says what its mapping takes and gives) --------------------------------------

def _ct_weight(fmt: dict, shape: Shape) -> dict:
    if fmt["width"] > 8:
        raise Unfit(f"{fmt['width']}-bit scaled_integer", "at most 8 bits")
    group = fmt["group_size"] if fmt["granularity"] == "group" else None
    if group is not None:
        check_tiles(shape[-1], group, "groups")
    return {"num_bits": fmt["width"], "type": "int", "symmetric": fmt["symmetric"], "strategy": fmt["granularity"],
            "group_size": group, "dynamic": False}


def _ct_weight_tensors(codes, args: dict) -> dict[str, Tensor]:
    out = {"weight_scale": stored_scales(codes.side).contiguous()}
    if not codes.format["symmetric"]:  # the zero point as a signed code, as compressed-tensors has it
        out["zero_point"] = codes.side["zero_point"].to(torch.int64) - (1 << (codes.bits - 1))
    return out


def _exact_int8_activations(fmt: dict) -> bool:
    return (fmt["width"] == 8 and fmt["symmetric"] and fmt["full_range"] and fmt["clip"] == 1.0
            and fmt["scale_dtype"] == "float32" and fmt["granularity"] in ("tensor", "channel")
            and not (fmt["granularity"] == "channel" and fmt["scale"] is not None))


def _ct_input(fmt: dict, weight: dict | None) -> dict | None:
    if not _exact_int8_activations(fmt):
        return None
    return {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor" if fmt["granularity"] == "tensor"
            else "token", "group_size": None, "dynamic": fmt["scale"] is None, "scale": fmt["scale"]}


def _onnx_weight(codes) -> dict | None:
    fmt = codes.format
    if fmt["width"] > 8:
        return None
    values = codes.unpacked()
    zero = None if fmt["symmetric"] else codes.side["zero_point"].to(torch.int64)
    values = offset_values(values, fmt["width"]) if fmt["symmetric"] else values
    axis, block = {"tensor": (None, None), "channel": (0, None), "group": (1, fmt["group_size"])}[fmt["granularity"]]
    scale = stored_scales(codes.side)
    scale = scale.reshape(()) if axis is None else scale.reshape(codes.shape[0]) if axis == 0 else scale
    return {"values": values, "scale": scale, "zero": None if zero is None else zero.reshape(scale.shape), "axis": axis,
            "block": block, "bits": fmt["width"], "signed": fmt["symmetric"]}


def _onnx_input(fmt: dict) -> tuple[float, int, bool] | None:
    if fmt["width"] == 8 and fmt["symmetric"] and fmt["full_range"] and fmt["granularity"] == "tensor" \
            and isinstance(fmt["scale"], float):
        return float(stored_scale(torch.tensor([fmt["scale"]]), fmt["scale_dtype"])), 0, True
    return None


def _gguf_type(fmt: dict, shape: Shape) -> str | None:
    if not (fmt["symmetric"] and fmt["width"] in (8, 4) and fmt["granularity"] == "group" and fmt["group_size"] == 32):
        return None
    check_tiles(shape[-1], 32, "groups", "leave this layer float (a null rule for it)")
    return "Q8_0" if fmt["width"] == 8 else "Q4_0"


def _gguf_blocks(codes, gguf_type: str):
    from mase_lite.numerics.ggml import integer_blocks

    return integer_blocks(codes.unpacked(), stored_scales(codes.side), gguf_type)


def _packed(fmt: dict, activations: str) -> str | None:
    """The 4-bit packed layer holds symmetric 4-bit codes in groups of 32 (-8..7 times the group's scale)."""
    fits = (fmt.get("width") == 4 and fmt.get("symmetric", True) and fmt.get("granularity") == "group"
            and fmt.get("group_size") == 32)
    return "packed4" if fits else None


def _packed_table(codes) -> tuple[Tensor, Tensor]:
    return torch.arange(16, dtype=torch.float32) - 8, stored_scales(codes.side)


def _packed_side(scales: Tensor, fmt: dict) -> dict[str, Tensor]:
    """The inverse of :func:`_packed_table`'s scales: as the format stores them."""
    if fmt.get("scale_dtype") == "pow2":
        return {"scale_exponent": torch.log2(scales.float()).round().to(torch.int8)}
    return {"scale": scales.clone()}


register_mapping("scaled_integer", "compressed-tensors", _ct_weight, _ct_weight_tensors)
register_mapping("scaled_integer", "compressed-tensors/input", _ct_input)
register_mapping("scaled_integer", "onnx", None, _onnx_weight)
register_mapping("scaled_integer", "onnx/input", _onnx_input)
register_mapping("scaled_integer", "gguf", _gguf_type, _gguf_blocks)
register_mapping("scaled_integer", "packed", _packed, _packed_table, _packed_side)

NVFP4_ARGS = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16,
              "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}


def written_global_scale(scale: Tensor) -> Tensor:
    """An NVFP4 global scale as compressed-tensors writes it: 1 where it is infinite (a tensor of zeros, whose codes
    are all zero under any scale)."""
    return torch.where(torch.isfinite(scale), scale, torch.ones_like(scale)).float()


def _nvfp4_ct_weight(fmt: dict, shape: Shape) -> dict | None:
    if fmt["per_tensor"] != "global_scale":
        return None
    check_tiles(shape[-1], 16, "blocks", "a row of whole blocks of 16")
    return {**NVFP4_ARGS, "format": "nvfp4-pack-quantized"}


def _nvfp4_ct_tensors(codes, args: dict) -> dict[str, Tensor]:
    rows, columns = codes.shape
    return {"weight_packed": pack_bits(codes.unpacked(), 4).reshape(rows, columns // 2),
            "weight_scale": codes.side["block_scale"].contiguous(),
            "weight_global_scale": written_global_scale(codes.side["global_scale"].reshape(1))}


def _nvfp4_ct_input(fmt: dict, weight: dict | None) -> dict | None:
    if fmt["per_tensor"] != "global_scale" or not isinstance(fmt["tensor_amax"], float):
        return None
    if weight is None or weight["name"] != "nvfp4":
        raise Unfit("NVFP4 activations beside a weight that is not NVFP4", "NVFP4 weights")
    global_scale = written_global_scale(nvfp4_global_scale(torch.tensor(fmt["tensor_amax"], dtype=torch.float32)))
    return {**NVFP4_ARGS, "dynamic": "local", "global_scale": global_scale.reshape(1)}


register_mapping("nvfp4", "compressed-tensors", _nvfp4_ct_weight, _nvfp4_ct_tensors)
register_mapping("nvfp4", "compressed-tensors/input", _nvfp4_ct_input)
