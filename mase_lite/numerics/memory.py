"""Result tensors that do not pay a page fault per 4 KiB.

A large CPU tensor is fresh memory from the kernel (glibc maps every allocation above 32 MiB
anew), and the first write to each 4 KiB page faults: for a 64 MiB result that is 16384 faults,
about as long as the quantizer's own work. :func:`empty_like_advised` allocates the result like
``torch.empty_like`` and, on Linux where transparent huge pages are enabled for advised memory
(``/sys/kernel/mm/transparent_hugepage/enabled``: ``madvise`` or ``always``), advises its whole
2 MiB pages as huge pages before anything touches them: 32 faults instead. Elsewhere, and for
tensors too small to hold a huge page, it is ``torch.empty_like``; the values are never affected.

>>> import torch
>>> y = empty_like_advised(torch.zeros(3, 5))
>>> y.shape, y.dtype, y.is_contiguous()
(torch.Size([3, 5]), torch.float32, True)
"""

from __future__ import annotations

import ctypes
import functools
import mmap

import torch
from torch import Tensor

HUGE_PAGE_BYTES = 2 << 20
ADVISE_FROM_BYTES = 4 * HUGE_PAGE_BYTES
"""Smaller results mostly come from memory glibc keeps (no faults), and hold at most a huge page or two."""


@functools.cache
def _madvise():
    """libc's ``madvise`` and the huge-page advice, or None where neither exists (not Linux)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise, advice


def empty_like_advised(like: Tensor) -> Tensor:
    """A contiguous uninitialised tensor shaped like ``like``, in huge pages where the system allows."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    nbytes = out.numel() * out.element_size()
    found = _madvise()
    if found is None or out.device.type != "cpu" or nbytes < ADVISE_FROM_BYTES:
        return out
    madvise, advice = found
    start = -(-out.data_ptr() // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (out.data_ptr() + nbytes) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    madvise(start, end - start, advice)  # advice only: a refusal (EINVAL, ENOMEM) leaves 4 KiB pages
    return out
