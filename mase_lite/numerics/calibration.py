"""Choosing a format's range from observed values: the ``"auto"`` parameters of a format.

A format declares the parameter calibration may choose (``integer``'s ``frac_width``, ``scaled_integer``'s and
``scaled_float``'s static ``scale``, ``nvfp4``'s ``tensor_amax``: ``calibrated`` when it registers); given as
``"auto"``, calibration replaces it from a tensor (a weight) or a sample of activations:

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

from typing import Any, Literal

import torch
from torch import Tensor

from mase_lite.numerics.core import apply_format
from mase_lite.numerics.registry import FormatError, format_names, get_format

Method = Literal["minmax", "percentile", "mse"]
AUTO = "auto"
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


def choose(name: str, params: dict[str, Any], values: Tensor, method: Method = "minmax", percentile: float = 99.99,
           grid: int = 100) -> int | float:
    """The value of format ``name``'s calibrated parameter (``"auto"`` in ``params``) for ``values``."""
    calibrated = get_format(name).calibrated
    if calibrated is None:
        raise FormatError(f"format '{name}' has no parameter calibration can choose; 'auto' is for "
                          f"{', '.join(calibrated_formats())}")
    params = {k: v for k, v in params.items() if k != "name"}
    values = values.detach().to(torch.float32).reshape(-1)
    amax = _magnitude(values, method, percentile)
    if method != "mse" or amax == 0:
        return calibrated.from_amax(params, amax)
    candidates = calibrated.search_space(params, amax, grid)
    errors = [(_error(name, {**params, calibrated.key: c}, values), i, c) for i, c in enumerate(candidates)]
    return min(errors)[2]


def calibrated_formats() -> dict[str, str]:
    """Each registered format with a parameter calibration may choose, and that parameter's name.

    >>> calibrated_formats()["nvfp4"]
    'tensor_amax'
    """
    return {name: fmt.calibrated.key for name in format_names() if (fmt := get_format(name)).calibrated is not None}
