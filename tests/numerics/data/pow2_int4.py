"""A number format in one file, outside the package: 4-bit integers -8..7 in groups of 16 with a power-of-two scale
per group, no larger than 2**max_exponent (chosen by calibration with "auto"), held by compressed-tensors as its
int4 groups."""

import math
from typing import Literal

import torch
from pydantic import Field

from mase_lite.numerics import FormatParams, register_format
from mase_lite.numerics.registry import Calibrated, Codec, check_tiles, register_mapping


class Pow2Int4Params(FormatParams):
    group_size: int = Field(16, ge=1)
    max_exponent: int | Literal["auto"] = 0


def _groups(x, p):
    return x.reshape(*x.shape[:-1], -1, p.group_size)


def _exponents(x, p):
    amax = _groups(x, p).abs().amax(-1)
    wanted = torch.ceil(torch.log2(torch.where(amax > 0, amax / 7, 1.0)))
    return wanted.clamp(max=p.max_exponent).to(torch.int8)


def _values(codes, side, p):
    scale = torch.ldexp(torch.ones(()), side["exponent"].float()).unsqueeze(-1)
    return ((_groups(codes, p).float() - 8) * scale).reshape(codes.shape)


def _codes(values, side, p):
    scale = torch.ldexp(torch.ones(()), side["exponent"].float()).unsqueeze(-1)
    return (_groups(values, p) / scale + 8).round().to(torch.int64).reshape(values.shape)


CODEC = Codec(bits=lambda p: 4, side=lambda x, p: {"exponent": _exponents(x, p)}, codes=_codes, decode=_values)


@register_format("pow2_int4", params=Pow2Int4Params, bits=lambda p, shape: 4 + 8 / p.group_size,
                 bounds=lambda x, p: (-8.0, 7.0 * 2.0 ** 15), group=lambda p, row: p.group_size, codec=CODEC,
                 calibrated=Calibrated("max_exponent", lambda params, amax: math.ceil(math.log2(amax / 7)) if amax > 0 else 0))
def pow2_int4(x, p):
    """4-bit integers times a power of two per group of 16."""
    side = {"exponent": _exponents(x, p)}
    return _values(_codes(x, side, p).clamp(0, 15), side, p)


def _compressed_tensors(fmt, shape):
    check_tiles(shape[-1], fmt["group_size"], "groups", "a group_size that divides the row")
    return {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": fmt["group_size"],
            "dynamic": False}


register_mapping("pow2_int4", "compressed-tensors", _compressed_tensors,
                 lambda codes, args: {"weight_scale": torch.ldexp(torch.ones(()), codes.side["exponent"].float())})
