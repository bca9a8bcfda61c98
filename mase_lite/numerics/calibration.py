"""Choosing a format's range from observed values: the ``"auto"`` parameters of a format.

``integer``'s ``frac_width``, ``scaled_integer``'s static ``scale`` and ``nvfp4``'s ``tensor_amax`` may be
``"auto"``; calibration replaces them from a tensor (a weight) or a sample of activations:

* ``minmax``: the range covers the largest magnitude seen;
* ``percentile``: the range covers that percentile of the magnitudes (the rest saturates);
* ``mse``: the candidate (every fraction width, or ``grid`` clipping ratios of the largest magnitude)
  whose quantization of the values has the smallest mean squared error.

>>> import torch
>>> choose("integer", {"width": 8, "frac_width": "auto"}, torch.tensor([3.2, -1.0]))   # 127 / 2**5 = 3.97 >= 3.2
5
>>> choose("nvfp4", {"tensor_amax": "auto"}, torch.tensor([0.5, -2.0]))
2.0
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from mase_lite.numerics.core import apply_format
from mase_lite.numerics.registry import FormatError, get_format

Method = Literal["minmax", "percentile", "mse"]
AUTO = "auto"
CALIBRATED = {"integer": "frac_width", "scaled_integer": "scale", "nvfp4": "tensor_amax"}
_QUANTILE_LIMIT = 1 << 24  # torch.quantile's input limit


def auto_keys(fmt: dict[str, Any]) -> list[str]:
    """The parameters of a format dict that are ``"auto"``.

    >>> auto_keys({"name": "integer", "width": 8, "frac_width": "auto"})
    ['frac_width']
    """
    return [k for k, v in fmt.items() if v == AUTO]


def _magnitude(values: Tensor, method: Method, percentile: float) -> float:
    magnitudes = values.detach().reshape(-1).abs().to(torch.float64)
    magnitudes = magnitudes[torch.isfinite(magnitudes)]
    if magnitudes.numel() == 0:
        return 0.0
    if method == "percentile":
        if magnitudes.numel() > _QUANTILE_LIMIT:
            magnitudes = magnitudes[torch.linspace(0, magnitudes.numel() - 1, _QUANTILE_LIMIT).long()]
        return float(torch.quantile(magnitudes, percentile / 100))
    return float(magnitudes.max())


def _error(fmt_name: str, params: dict[str, Any], values: Tensor) -> float:
    fmt = get_format(fmt_name)
    q = apply_format(values, fmt, fmt.validate(params))
    return float((q.double() - values.double()).square().mean())


def _candidates(name: str, params: dict[str, Any], amax: float, grid: int) -> list:
    if name == "integer":
        return list(range(params["width"] + 1))
    ratios = [(k + 1) / grid for k in range(grid)]
    if name == "scaled_integer":
        return [r * amax / _largest_step(params) for r in ratios]
    return [r * amax for r in ratios]


def _from_magnitude(name: str, params: dict[str, Any], amax: float):
    if name == "integer":
        width, signed = params["width"], params.get("signed", True)
        largest = 2.0 ** (width - 1) - 1 if signed else 2.0**width - 1
        if amax == 0:
            return width
        return max(0, min(width, math.floor(math.log2(largest / amax))))
    if name == "scaled_integer":
        return amax * params.get("clip", 1.0) / _largest_step(params) if amax > 0 else 1.0
    return amax


def _largest_step(params: dict[str, Any]) -> float:
    """The code the amax maps to: ``2**(width-1) - 1``, half a code more on the full two's complement range."""
    return 2.0 ** (params["width"] - 1) - 1 + (0.5 if params.get("full_range") else 0.0)


def choose(name: str, params: dict[str, Any], values: Tensor, method: Method = "minmax", percentile: float = 99.99,
           grid: int = 100) -> int | float:
    """The value of format ``name``'s calibrated parameter (``"auto"`` in ``params``) for ``values``."""
    if name not in CALIBRATED:
        raise FormatError(f"format '{name}' has no parameter calibration can choose; 'auto' is for {', '.join(CALIBRATED)}")
    key = CALIBRATED[name]
    params = {k: v for k, v in params.items() if k != "name"}
    values = values.detach().to(torch.float32).reshape(-1)
    amax = _magnitude(values, method, percentile)
    if method != "mse" or amax == 0:
        return _from_magnitude(name, params, amax)
    errors = [(_error(name, {**params, key: c}, values), i, c) for i, c in enumerate(_candidates(name, params, amax, grid))]
    return min(errors)[2]
