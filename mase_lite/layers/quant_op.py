"""Fake quantization as one torch operator, ``mase_lite::fake_quantize``: opaque to ``torch.export`` and
``torch.compile`` (a quantizer's data-dependent branches and native kernels stay out of traced code), with
the straight-through gradient registered for autograd.

>>> import torch
>>> torch.ops.mase_lite.fake_quantize(torch.tensor([0.3, 9.0]), '{"name": "integer", "width": 8, "frac_width": 4}', "identity").tolist()
[0.3125, 7.9375]
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from mase_lite.numerics import NumberFormat, apply_format, parse_format


@lru_cache(maxsize=256)
def _parsed(fmt: str) -> tuple[NumberFormat, Any]:
    return parse_format(json.loads(fmt))


def format_key(fmt: dict[str, Any]) -> str:
    """The operator's spelling of a format dict (canonical JSON)."""
    return json.dumps(fmt, sort_keys=True)


@torch.library.custom_op("mase_lite::fake_quantize", mutates_args=())
def fake_quantize(x: Tensor, fmt: str, ste: str) -> Tensor:
    """``x`` quantized to the format ``fmt`` (JSON); ``ste`` names the gradient (identity or clipped)."""
    number_format, params = _parsed(fmt)
    return apply_format(x.detach(), number_format, params)


@fake_quantize.register_fake
def _fake(x: Tensor, fmt: str, ste: str) -> Tensor:
    return torch.empty_like(x)


def _setup(ctx, inputs: tuple, output: Tensor) -> None:
    x, fmt, ste = inputs
    ctx.fmt, ctx.ste = fmt, ste
    ctx.save_for_backward(x if ste == "clipped" else None)


def _backward(ctx, grad: Tensor):
    (x,) = ctx.saved_tensors
    if ctx.ste == "clipped":
        number_format, params = _parsed(ctx.fmt)
        x32 = x.detach().to(torch.float32)
        lo, hi = number_format.bounds(x32, params)
        grad = torch.where((x32 >= lo) & (x32 <= hi), grad, torch.zeros_like(grad))
    return grad, None, None


fake_quantize.register_autograd(_backward, setup_context=_setup)
