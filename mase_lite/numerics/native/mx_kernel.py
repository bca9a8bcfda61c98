"""The native MX kernel (``mx.c``) behind :func:`~mase_lite.numerics.mx.mxint` and ``mxfp``.

It computes the same function as their torch implementation, bit for bit (the tests compare the
two on a corpus of edge cases), in one pass over the tensor instead of several. It applies to a
plain float32 CPU tensor outside autograd, torch.compile, export and torch function/dispatch
modes; :func:`fake_quantize` returns None elsewhere and the caller runs its torch implementation.
Rows are split over ``torch.get_num_threads()`` threads for large tensors.

>>> import torch
>>> y = fake_quantize(torch.tensor([[1.0, 0.3, -2.5]]), is_int=True, mbits=6, emax=0, emin=0,
...                   max_value=127 / 64, block_size=32, scale_rule="floor")
>>> y is None or y.tolist() == [[1.0, 0.3125, -2.5]]
True
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from mase_lite.numerics.memory import empty_like_advised
from mase_lite.numerics.native import library

RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
PARALLEL_FROM_ELEMENTS = 1 << 20
"""Smaller tensors run in the calling thread (a hand-off costs more than it saves)."""


@functools.cache
def _kernel():
    lib = library("mx")
    if lib is None:
        return None
    fn = lib.mx_fake_quantize
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double]
    fn.restype = None
    return fn


def applies(x: Tensor) -> bool:
    """Whether the native kernel may compute ``x``'s result (see the module text)."""
    return (type(x) is Tensor and x.dtype == torch.float32 and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and x.requires_grad)
            and not torch.compiler.is_compiling() and not torch._C._len_torch_function_stack()
            and not torch._C._len_torch_dispatch_stack() and _kernel() is not None)


def fake_quantize(x: Tensor, *, is_int: bool, mbits: int, emax: int, emin: int, max_value: float,
                  block_size: int, scale_rule: str) -> Tensor | None:
    """``x`` fake-quantized to MX by the native kernel, or None where it does not apply."""
    if not applies(x):
        return None
    src = x.contiguous()
    out = empty_like_advised(src)
    length = src.shape[-1] if src.dim() else 1
    rows = math.prod(src.shape[:-1]) if src.dim() else 1
    if not src.numel():
        return out
    args = (block_size, int(is_int), RULES[scale_rule], mbits, emax, emin, float(max_value))
    kernel, row_bytes = _kernel(), length * src.element_size()

    def run(first: int, last: int) -> None:
        kernel(src.data_ptr() + first * row_bytes, out.data_ptr() + first * row_bytes, last - first, length, *args)

    workers = min(torch.get_num_threads(), rows) if src.numel() >= PARALLEL_FROM_ELEMENTS else 1
    bounds = [rows * i // workers for i in range(workers + 1)]
    if workers == 1:
        run(0, rows)
    else:  # ctypes lets go of the GIL during each call: the parts run at once
        futures = [_pool(workers).submit(run, a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        for future in futures:
            future.result()
    return out


_lock = threading.Lock()
_executor: tuple[int, int, ThreadPoolExecutor] | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """Worker threads, made again after a fork (threads do not survive one) or a new thread count."""
    global _executor
    with _lock:
        if _executor is None or _executor[:2] != (os.getpid(), workers):
            _executor = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="mase-lite-mx"))
        return _executor[2]
