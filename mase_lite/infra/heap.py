"""Hand the C heap's free memory back to the operating system.

glibc keeps freed allocations below its mapping threshold in its heap for reuse; buffers of many sizes (a
decoder block's activations, Hessians and sweeps, a layer's float weight replaced by its codes) fragment it, so
the resident size grows step after step though the live tensors do not. ``malloc_trim`` returns the free pages.

    >>> isinstance(return_free_memory(), bool)
    True
"""

from __future__ import annotations

import ctypes
import functools


def return_free_memory() -> bool:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim``); False where there is none."""
    trim = _malloc_trim()
    return trim is not None and bool(trim(0))


@functools.cache
def _malloc_trim():
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
