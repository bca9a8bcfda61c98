"""The CPU kernel library: one native library for every packed format (``common.h``: levels, reductions, the
split of rows over threads; ``mxint8.c``, ``packed4.c``, ``int8_linear.c`` with ``int8_dot.h``, ``decoder.c``), built
once on first use by :mod:`mase_lite.numerics.native` (its cache, and its fallback where there is no compiler), one
ctypes binding (:func:`library`) and one level variable.

The vector level is the best this CPU runs (``c``, ``avx2``, ``avx512``; the int8 dot products of ``avx512`` take VNNI
where the CPU has it); ``MASE_LITE_CPU_KERNELS`` forces one of them, or ``torch`` for the torch reference everywhere.
Every kernel gives the same bits at every level and thread count (each file says how).

>>> level() in (*available_levels(), None)
True
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

from mase_lite.infra.errors import UserError
from mase_lite.numerics.native import library as build

LEVELS = ("c", "avx2", "avx512")
"""The vector levels, lowest first (``common.h``)."""
LEVEL_ENV = "MASE_LITE_CPU_KERNELS"
SOURCES = ("levels.c", "mxint8.c", "packed4.c", "int8_linear.c", "decoder.c")

_i64, _ptr, _int, _float = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SIGNATURES = {  # function: (argument types, result type)
    "mxint8_linear_rows": ([_ptr, _i64, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _i64, _i64, _int, _int], None),
    "mxint8_dequantize_rows": ([_ptr, _ptr, _i64, _i64, _i64, _ptr, _int, _int, _int], None),
    "mxint8_quantize_rows": ([_ptr, _i64, _i64, _i64, _ptr, _ptr], None),
    "mxint8_gemm": ([_ptr, _i64, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _i64, _ptr, _ptr, _int], _int),
    "mxint8_gemm_buffer": ([_i64, _i64], _i64),
    "packed4_linear": ([_ptr, _i64, _i64, _ptr, _ptr, _int, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int, _int, _ptr], None),
    "packed4_dequantize": ([_ptr, _ptr, _int, _ptr, _i64, _i64, _ptr, _int, _int], None),
    "int8_linear_nibbles": ([_ptr, _i64, _i64, _int, _ptr, _ptr, _int, _ptr, _ptr, _ptr, _ptr, _float, _int, _int, _int,
                             _ptr], _int),
    "int8_linear_codes": ([_ptr, _i64, _i64, _int, _ptr, _ptr, _int, _ptr, _ptr, _ptr, _int, _int, _int, _ptr], _int),
    "int8_linear_kquants": ([_ptr, _i64, _i64, _int, _ptr, _ptr, _ptr, _ptr, _ptr, _int, _int, _int, _ptr], _int),
    "int8_scratch_bytes": ([_i64, _i64, _int], ctypes.c_size_t),
    "int8_decoder_scratch": ([_ptr], ctypes.c_size_t),  # the model structure by reference (decoder_step.py)
    "int8_decoder_step": ([_ptr, _ptr, _i64, _ptr, _int, _ptr], _int),
    "cpu_kernels_levels": ([], _int),
    "cpu_kernels_vnni": ([], _int),
    "cpu_kernels_openmp": ([], _int),
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The library with its functions' types declared and what it runs here, asked once (a hot path reads them):
    ``levels``, the names of its vector levels on this CPU lowest first; ``openmp``, whether it runs its threads on
    OpenMP (torch's own team); ``vnni``, whether its ``avx512`` int8 dot products take VNNI. None where it could not
    be built."""
    return _declared(build("cpu_kernels", Path(__file__).parent, openmp=True, sources=SOURCES))


def _declared(lib: ctypes.CDLL | None) -> ctypes.CDLL | None:
    if lib is None:
        return None
    for name, (arguments, result) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = arguments, result
    mask = lib.cpu_kernels_levels()
    lib.levels = tuple(name for bit, name in enumerate(LEVELS) if mask >> bit & 1)
    lib.openmp, lib.vnni = bool(lib.cpu_kernels_openmp()), bool(lib.cpu_kernels_vnni())
    return lib


def available_levels() -> tuple[str, ...]:
    """The vector levels this CPU runs, lowest first (empty where the library could not be built)."""
    lib = library()
    return () if lib is None else lib.levels


def level() -> str | None:
    """The level calls take now: ``MASE_LITE_CPU_KERNELS`` if set (``torch``: None, the reference), else the best
    available; None where none is."""
    forced = os.environ.get(LEVEL_ENV, "")
    if forced == "torch":
        return None
    available = available_levels()
    if not forced:
        return available[-1] if available else None
    if forced not in LEVELS:
        raise UserError(f"{LEVEL_ENV}={forced!r} is unknown; allowed: {', '.join((*LEVELS, 'torch'))}")
    if forced not in available:
        raise UserError(f"{LEVEL_ENV}={forced!r}: not available here (available: {', '.join(available) or 'none'})")
    return forced


_indices: dict[str, int | None] = {}


def level_index() -> int | None:
    """:func:`level` as the kernels' level number, remembered per value of the variable (a call costs microseconds)."""
    forced = os.environ.get(LEVEL_ENV, "")
    if forced not in _indices:
        chosen = level()
        _indices[forced] = None if chosen is None else LEVELS.index(chosen)
    return _indices[forced]
