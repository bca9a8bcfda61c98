"""The native kernel (``scaled.c``) behind the formats with a real scale: scaled_integer and nvfp4.

Each function computes the same values as the format's torch implementation
(:mod:`mase_lite.numerics.scaled`), bit for bit (the tests compare the two on a corpus of edge
cases and random bit patterns), in one pass; where the kernel does not apply
(:func:`~mase_lite.numerics.native.launch.applies`, or no compiled kernel) it returns None and the
caller runs its torch implementation. A scale shared by the whole tensor (per-tensor or static) is
derived by the caller, from :func:`finite_range` where it depends on the values, and passed in.

>>> import torch
>>> y = scaled_integer(torch.tensor([[3.5, -7.0, 1.2, 0.0]]), group_size=4, symmetric=True, clip=1.0,
...                    qmax=7.0, scale_dtype="float32")
>>> y is None or y.tolist() == [[4.0, -7.0, 1.0, 0.0]]
True
"""

from __future__ import annotations

import ctypes
import functools

from torch import Tensor

from mase_lite.numerics.native import library
from mase_lite.numerics.native.launch import ROW_ARGS, applies, run_rows

SCALE_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "pow2": 3}


@functools.cache
def _kernels() -> dict | None:
    lib = library("scaled")
    if lib is None:
        return None
    integer_fn, nvfp4_fn, range_fn = lib.fake_quantize_scaled_integer, lib.fake_quantize_nvfp4, lib.finite_range
    integer_fn.argtypes = [*ROW_ARGS, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_int,
                           ctypes.c_int, ctypes.c_float, ctypes.c_float, ctypes.c_int]
    nvfp4_fn.argtypes = [*ROW_ARGS, ctypes.c_float]
    range_fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    integer_fn.restype = nvfp4_fn.restype = range_fn.restype = None
    return {"scaled_integer": integer_fn, "nvfp4": nvfp4_fn, "finite_range": range_fn}


def available(x: Tensor) -> bool:
    """Whether the kernel will compute ``x``'s result."""
    return applies(x) and _kernels() is not None


def finite_range(x: Tensor) -> tuple[float, float]:
    """``min(0, finite values of x)`` and ``max(0, finite values of x)`` (for ``x`` where :func:`available`)."""
    src, low_high = x.contiguous(), (ctypes.c_float * 2)()
    _kernels()["finite_range"](src.data_ptr(), src.numel(), low_high)
    return low_high[0], low_high[1]


def scaled_integer(x: Tensor, group_size: int, symmetric: bool, clip: float, qmax: float, scale_dtype: str,
                   fixed: tuple[float, float] | None = None, full_range: bool = False) -> Tensor | None:
    """``x`` in integer codes up to ``qmax`` (``-qmax..qmax``; ``-qmax-1..qmax`` with ``full_range``, the largest
    magnitude on ``qmax + 1/2``; or ``0..qmax`` with a zero point) times a scale per ``group_size`` elements of
    each row stored as ``scale_dtype``, or the ``fixed`` stored scale and zero point for every element."""
    if not available(x):
        return None
    fixed_args = (1, *fixed) if fixed is not None else (0, 0.0, 0.0)
    args = (int(symmetric), clip, qmax, SCALE_DTYPES[scale_dtype], *fixed_args, int(full_range))
    return run_rows(_kernels()["scaled_integer"], x,
                    lambda length: (length, group_size if fixed is None else max(length, 1), *args))


def nvfp4(x: Tensor, tensor_scale: float) -> Tensor | None:
    """``x`` in NVFP4: E2M1 elements, an E4M3 scale per 16 elements of each row, under ``tensor_scale``."""
    if not available(x):
        return None
    return run_rows(_kernels()["nvfp4"], x, lambda length: (length, tensor_scale))
