"""The native kernel (``elements.c``) behind the elementwise formats: integer, minifloat_ieee,
minifloat_denorm and log.

Each function computes the same values as the format's torch implementation, bit for bit (the
tests compare the two on a corpus of edge cases), in one pass; where the kernel does not apply
(:func:`~mase_lite.numerics.native.launch.applies`, or no compiled kernel) it returns None and the
caller runs its torch implementation.

>>> import torch
>>> y = float_grid(torch.tensor([1.3, -1000.0]), mantissa_bits=2, min_exponent=-2, max_exponent=3, max_value=14.0)
>>> y is None or y.tolist() == [1.25, -14.0]
True
"""

from __future__ import annotations

import ctypes
import functools

from torch import Tensor

from mase_lite.numerics.native import library
from mase_lite.numerics.native.launch import ROW_ARGS, applies, run_rows


@functools.cache
def _kernels() -> dict | None:
    lib = library("elements")
    if lib is None:
        return None
    integer_fn, grid_fn = lib.fake_quantize_integer, lib.fake_quantize_float_grid
    integer_fn.argtypes = [*ROW_ARGS, *[ctypes.c_float] * 4, ctypes.c_int]
    grid_fn.argtypes = [*ROW_ARGS, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double]
    integer_fn.restype = grid_fn.restype = None
    return {"integer": integer_fn, "float_grid": grid_fn}


def integer(x: Tensor, frac_width: int, lo: float, hi: float, floor: bool) -> Tensor | None:
    """``round(x * 2**frac_width)`` (half to even, or floor) clamped to ``[lo, hi]``, times ``2**-frac_width``."""
    if not applies(x) or _kernels() is None:
        return None
    args = (2.0**frac_width, 2.0**-frac_width, lo, hi, int(floor))
    return run_rows(_kernels()["integer"], x, lambda length: (length, *args))


def float_grid(x: Tensor, mantissa_bits: int, min_exponent: int, max_exponent: int, max_value: float) -> Tensor | None:
    """``x`` rounded to a float with ``mantissa_bits`` (at most 23), subnormals below ``2**min_exponent``,
    saturating at ``max_value`` (the grid's largest value, at most ``2**(max_exponent + 1)``)."""
    if not applies(x) or _kernels() is None:
        return None
    args = (mantissa_bits, min_exponent, max_exponent, float(max_value))
    return run_rows(_kernels()["float_grid"], x, lambda length: (length, *args))
