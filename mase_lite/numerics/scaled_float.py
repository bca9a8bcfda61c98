"""FP8 with a real scale: ``scaled_float``, the FP8 of vLLM, compressed-tensors, torchao and ModelOpt.

Elements are OCP FP8 — ``e4m3`` (``float8_e4m3fn``: largest 448, no Inf) or ``e5m2`` (largest 57344) —
times a float32 scale shared by the whole tensor, each row (``channel``: a weight's output channel, an
activation's token) or ``group_size`` consecutive elements of a row (the last group may be short):
``scale = amax / largest`` over the group's finite values, elements ``x / scale`` clamped to
``±largest`` and rounded to FP8 (half to even, subnormals included), values ``element * scale``, bit for
bit compressed-tensors' FP8 (``float-quantized``). ``scale`` fixes a static per-tensor scale
(calibrated). NaN stays NaN, ±Inf saturate, a group of zeros gives zeros, a zero element +0.0. Stored bits per element: 8 plus
the group's float32 scale.

>>> import torch
>>> scaled_float(torch.tensor([[448.0, 1.0, -3.3, 0.0]]), ScaledFloatParams()).tolist()   # scale 1
[[448.0, 1.0, -3.25, 0.0]]
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from mase_lite.numerics.blocks import finite_amax, from_blocks, per_element, to_blocks
from mase_lite.numerics.registry import Calibrated, Codec, FormatParams, Shape, check_tiles, register_format, register_mapping

ELEMENTS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


class ScaledFloatParams(FormatParams):
    element: Literal["e4m3", "e5m2"] = Field("e4m3", description="the FP8 element: e4m3 (largest 448) or e5m2 (57344)")
    granularity: Literal["tensor", "channel", "group"] = Field(
        "channel", description="one scale per tensor, per row of the last dimension, or per group of it"
    )
    group_size: int = Field(128, ge=1, description="elements of the last dimension per scale (granularity group)")
    scale: float | Literal["auto"] | None = Field(
        None, description="a static per-tensor scale (auto: chosen by calibration); null: from each tensor"
    )

    @model_validator(mode="after")
    def _static_scale(self) -> "ScaledFloatParams":
        if self.scale is not None and self.granularity != "tensor":
            raise ValueError("a static scale is one per tensor: give granularity 'tensor' with it")
        if isinstance(self.scale, float) and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale={self.scale} must be a positive finite number")
        return self

    @property
    def largest(self) -> float:
        return float(torch.finfo(ELEMENTS[self.element]).max)


def _groups(x: Tensor, p: ScaledFloatParams) -> Tensor:
    if p.granularity == "tensor":
        return x.reshape(1, 1, -1)
    return to_blocks(x, p.group_size if p.granularity == "group" else max(x.shape[-1] if x.dim() else 1, 1))


def _ungroup(groups: Tensor, x: Tensor, p: ScaledFloatParams) -> Tensor:
    return groups.reshape(x.shape) if p.granularity == "tensor" else from_blocks(groups, x.shape)


def _scales(groups: Tensor, p: ScaledFloatParams) -> Tensor:
    if p.scale == "auto":
        raise ValueError("scaled_float scale='auto' is chosen by calibration: run the calibrate pass, then quantize")
    if p.scale is not None:
        return torch.full(groups.shape[:-1] + (1,), float(p.scale), device=groups.device)
    return finite_amax(groups) / p.largest


def _elements(groups: Tensor, scale: Tensor, p: ScaledFloatParams) -> Tensor:
    """``groups / scale`` saturated and rounded to the FP8 element, as float32 (zero where the scale is)."""
    live = scale > 0
    ratio = torch.where(live, groups / torch.where(live, scale, torch.ones_like(scale)), torch.zeros_like(groups))
    ratio = torch.where(torch.isnan(groups), groups, ratio.clamp(-p.largest, p.largest))
    return ratio.to(ELEMENTS[p.element]).to(torch.float32)


@register_format("scaled_float", params=ScaledFloatParams,
                 bits=lambda p, shape: 8 + 32 / _group_elements(p, shape),
                 bounds=lambda x, p: _bounds(x, p),
                 group=lambda p, row: p.group_size if p.granularity == "group" else row,
                 codec=Codec(bits=lambda p: 8, side=lambda x, p: _side(x, p), codes=lambda v, s, p: _codes(v, s, p),
                             decode=lambda c, s, p: _values(c, s, p)),
                 group_quantizer=lambda p, values: _group_quantizer(p, values),
                 calibrated=Calibrated("scale", lambda params, amax: amax / ScaledFloatParams(
                     element=params.get("element", "e4m3")).largest if amax > 0 else 1.0))
def scaled_float(x: Tensor, p: ScaledFloatParams) -> Tensor:
    """FP8 elements (e4m3 or e5m2) times a float32 scale per tensor, row or group."""
    groups = _groups(x, p)
    scale = _scales(groups, p)
    return _ungroup(_elements(groups, scale, p) * scale + 0.0, x, p)


def _group_elements(p: ScaledFloatParams, shape: Shape | None) -> float:
    numel = math.prod(shape) if shape else 0
    if p.granularity == "tensor":
        return float(numel) if numel else math.inf
    row = shape[-1] if shape else 0
    if p.granularity == "channel" or not row:
        return float(row) if row else math.inf
    return numel / (math.ceil(row / p.group_size) * (numel // row))


def _bounds(x: Tensor, p: ScaledFloatParams) -> tuple[Tensor, Tensor]:
    groups = _groups(x, p)
    largest = _scales(groups, p) * p.largest
    high = largest.expand(groups.shape).reshape(x.shape) if p.granularity == "tensor" else per_element(largest, groups, x.shape)
    return -high, high


def _side(x: Tensor, p: ScaledFloatParams) -> dict[str, Tensor] | None:
    """The float32 scale of each group: ``(1,)`` per tensor, else the groups' shape (``(rows, 1)`` per row)."""
    scale = _scales(_groups(x, p), p).squeeze(-1)
    return {"scale": scale.reshape(1) if p.granularity == "tensor" else scale}


def _codes(values: Tensor, side: dict[str, Tensor], p: ScaledFloatParams) -> Tensor:
    """The FP8 bit pattern of each ``value / scale`` (which must be an FP8 value: checked by the decode)."""
    groups = _groups(values, p)
    scale = side["scale"].reshape(groups.shape[:-1] + (1,)) if p.granularity != "tensor" else side["scale"].reshape(1, 1, 1)
    live = scale > 0
    ratio = torch.where(live, groups.double() / torch.where(live, scale, torch.ones_like(scale)).double(),
                        groups.double() * 0.0)
    codes = ratio.nan_to_num(0.0).clamp(-p.largest, p.largest).to(ELEMENTS[p.element]).view(torch.uint8)
    return _ungroup(codes.to(torch.int64), values, p)


def _values(codes: Tensor, side: dict[str, Tensor], p: ScaledFloatParams) -> Tensor:
    groups = _groups(codes, p)
    scale = side["scale"].reshape(groups.shape[:-1] + (1,)) if p.granularity != "tensor" else side["scale"].reshape(1, 1, 1)
    elements = groups.to(torch.uint8).view(ELEMENTS[p.element]).to(torch.float32)
    return _ungroup(elements * scale + 0.0, codes, p)


def _group_quantizer(p: ScaledFloatParams, values: Tensor):
    """The scales a group of ``values`` per row fixes (one for the tensor with granularity tensor) and the FP8
    grid under them for values whose last dimension runs over these rows (a column, or a block of columns
    transposed): the steps of :func:`scaled_float`."""
    scale = _scales(_groups(values, p), p)
    side = {"scale": scale.squeeze(-1).reshape(1) if p.granularity == "tensor" else scale.squeeze(-1)}
    flat = scale.reshape(-1)
    live = flat > 0
    divisor = torch.where(live, flat, torch.ones_like(flat))
    dtype = ELEMENTS[p.element]

    def quantize(x: Tensor) -> Tensor:
        ratio = torch.where(live, x / divisor, torch.zeros_like(x)).clamp_(-p.largest, p.largest)
        return ratio.to(dtype).to(x.dtype).mul_(flat).add_(0.0)

    return side, quantize


# Targets (each target's module says what its mapping takes and gives) --------------------------------------

def _ct_weight(fmt: dict, shape: Shape) -> dict | None:
    if fmt["element"] != "e4m3" or fmt["scale"] is not None:
        return None
    group = fmt["group_size"] if fmt["granularity"] == "group" else None
    if group is not None:
        check_tiles(shape[-1], group, "groups")
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": fmt["granularity"], "group_size": group,
            "dynamic": False, "format": "float-quantized"}


def _ct_weight_tensors(codes, args: dict) -> dict[str, Tensor]:
    scale = codes.side["scale"]
    return {"weight": codes.unpacked().to(torch.uint8).view(torch.float8_e4m3fn).contiguous(),
            "weight_scale": scale.reshape(codes.shape[0], 1) if args["strategy"] == "channel" else scale.contiguous()}


def _ct_input(fmt: dict, weight: dict | None) -> dict | None:
    if fmt["element"] != "e4m3" or fmt["granularity"] not in ("tensor", "channel") \
            or (fmt["granularity"] == "channel" and fmt["scale"] is not None):
        return None
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor" if fmt["granularity"] == "tensor"
            else "token", "group_size": None, "dynamic": fmt["scale"] is None, "scale": fmt["scale"]}


register_mapping("scaled_float", "compressed-tensors", _ct_weight, _ct_weight_tensors)
register_mapping("scaled_float", "compressed-tensors/input", _ct_input)
