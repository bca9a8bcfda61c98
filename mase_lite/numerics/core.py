"""The entry points: :func:`quantize` (any format, any float tensor) and :func:`bits_per_element`.

Float16 and bfloat16 tensors are quantized in float32 and cast back with one round-to-nearest-even.
The result is therefore exact whenever the format's values are values of the input dtype — e.g.
``integer`` up to width 12 (float16) / 9 (bfloat16), minifloats whose mantissa and exponent range
fit the dtype, every ``log``, binary and ternary value in range. A value that the format rounds past
the dtype's largest finite value saturates there instead of becoming Inf. An empty tensor is
returned unchanged.

Example::

    import torch
    from mase_lite.numerics import quantize, bits_per_element

    y = quantize(torch.randn(4, 8), "integer", width=8, frac_width=4)
    y = quantize(x, {"name": "minifloat_ieee", "width": 8, "exponent_width": 4}, ste="clipped")
    bits_per_element({"name": "block_fp", "width": 8, "exponent_width": 8, "block_size": 16})  # 8.5
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from mase_lite.numerics.registry import FormatError, FormatParams, NumberFormat, Shape, parse_format
from mase_lite.numerics.ste import STE_KINDS, straight_through

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def quantize(x: Tensor, format: Mapping[str, Any] | str, *, ste: str = "identity", **params: Any) -> Tensor:
    """``x`` quantized to ``format`` (a name plus keyword params, or a format dict).

    Same shape, dtype and device as ``x``. The gradient is straight-through (``ste="identity"``)
    or zero where ``x`` saturated (``ste="clipped"``).

    >>> quantize(torch.tensor([0.3, 100.0]), "integer", width=8, frac_width=4).tolist()
    [0.3125, 7.9375]
    """
    fmt, validated = parse_format(format, **params)
    return apply_format(x, fmt, validated, ste)


def apply_format(x: Tensor, fmt: NumberFormat, params: FormatParams, ste: str = "identity") -> Tensor:
    """``x`` quantized with an already validated format (what quantized modules call on every step)."""
    _check_tensor(x, fmt.name)
    if ste not in STE_KINDS:
        raise FormatError(f"ste={ste!r} is unknown; allowed: {', '.join(STE_KINDS)}")
    if x.numel() == 0:
        return x.clone()
    with torch.no_grad():
        x32 = x.detach().to(torch.float32)
        value = _cast_back(fmt.quantize(x32, params), x.dtype)
        keep = None
        if ste == "clipped":
            lo, hi = fmt.bounds(x32, params)
            keep = (x32 >= lo) & (x32 <= hi)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return value
    return straight_through(x, value, keep)


def bits_per_element(fmt: Mapping[str, Any] | str, shape: Shape | list[int] | None = None) -> float:
    """Stored bits per element of a format dict, shared scales included; dtype names give their width.

    ``shape`` (the tensor's shape) adds per-row or per-tensor scales of the binary and ternary
    formats; without it they count their element bits only.

    >>> bits_per_element({"name": "integer", "width": 8, "frac_width": 4})
    8.0
    >>> bits_per_element({"name": "mxint", "element_width": 8})
    8.25
    >>> bits_per_element("bfloat16")
    16.0
    """
    if isinstance(fmt, str):
        dtype = getattr(torch, fmt, None)
        if isinstance(dtype, torch.dtype):
            return float(dtype.itemsize * 8)
    number_format, params = parse_format(fmt)
    known_shape = tuple(int(d) for d in shape) if shape is not None else None
    return float(number_format.bits(params, known_shape))


def format_dict(fmt: Mapping[str, Any] | str, **params: Any) -> dict[str, Any]:
    """The canonical, fully spelled format dict (defaults filled in) of a format.

    >>> format_dict("log", width=4)
    {'name': 'log', 'width': 4, 'exponent_bias': None}
    """
    number_format, validated = parse_format(fmt, **params)
    return number_format.as_dict(validated)


def _check_tensor(x: Any, name: str) -> None:
    if not isinstance(x, Tensor):
        raise FormatError(f"format '{name}': expected a tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        dtype = str(x.dtype).removeprefix("torch.")
        raise FormatError(f"format '{name}': dtype {dtype} is not supported; allowed: {allowed}")


def _cast_back(value: Tensor, dtype: torch.dtype) -> Tensor:
    if dtype == torch.float32:
        return value
    cast = value.to(dtype)
    largest = torch.finfo(dtype).max
    saturated = torch.where(value > 0, largest, -largest).to(dtype)
    return torch.where(torch.isinf(cast) & torch.isfinite(value), saturated, cast)

