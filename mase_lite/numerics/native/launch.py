"""Calling a native kernel on a tensor: when it may, into what, and over how many threads.

A kernel takes ``(src, out, rows, *args)`` — raw pointers to contiguous float32 rows and their
count — and writes ``out``. It may run where :func:`applies`: a plain float32 CPU tensor outside
autograd, torch.compile, export and torch function/dispatch modes (a kernel sees memory, not
tensors: none of them would see it). Large tensors are split into runs of rows over up to
``torch.get_num_threads()`` threads (as many as :mod:`~mase_lite.numerics.native.threads` finds faster); ctypes
lets go of the GIL during each call, so the parts run at once. The result comes from :func:`~mase_lite.numerics.memory.empty_like_advised`.

>>> import ctypes, torch
>>> copy = lambda src, out, rows, length: ctypes.memmove(out, src, rows * length * 4)
>>> run_rows(copy, torch.arange(6.0).reshape(2, 3), lambda length: (length,)).tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch
from torch import Tensor

from mase_lite.numerics.memory import empty_like_advised
from mase_lite.numerics.native import threads

PARALLEL_FROM_ELEMENTS = 1 << 20
"""Smaller tensors run in the calling thread (a hand-off costs more than it saves)."""


def applies(x: Tensor) -> bool:
    """Whether a native kernel may compute ``x``'s result (see the module text)."""
    return (type(x) is Tensor and x.dtype == torch.float32 and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and x.requires_grad)
            and not torch.compiler.is_compiling() and not torch._C._len_torch_function_stack()
            and not torch._C._len_torch_dispatch_stack())


def plain_cpu(x: Tensor) -> bool:
    """Whether a kernel of packed weights may compute on ``x``: a plain CPU tensor (not a fake or traced one),
    outside torch.compile tracing and torch function/dispatch modes (they would not see the kernel's work)."""
    return (type(x) is Tensor and x.device.type == "cpu" and not torch.compiler.is_compiling()
            and not torch._C._len_torch_function_stack() and not torch._C._len_torch_dispatch_stack())


# ctypes argtypes every row kernel starts with: source, output, rows, row length (what run_rows passes)
ROW_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]


def run_rows(kernel: Callable, x: Tensor, arguments: Callable[[int], tuple]) -> Tensor:
    """A new tensor shaped like ``x``, written by ``kernel(src, out, rows, *arguments(row_length))``
    on runs of whole rows (the last dimension; a 0-D tensor is one row of one)."""
    src = x.contiguous()
    out = empty_like_advised(src)
    length = src.shape[-1] if src.dim() else 1
    rows = math.prod(src.shape[:-1]) if src.dim() else 1
    if not src.numel():
        return out
    args, row_bytes = arguments(length), length * src.element_size()

    def run(first: int, last: int) -> None:
        kernel(src.data_ptr() + first * row_bytes, out.data_ptr() + first * row_bytes, last - first, *args)

    most = torch.get_num_threads() if src.numel() >= PARALLEL_FROM_ELEMENTS else 1
    workers, probe = threads.begin(("rows", id(kernel), rows, length), most)
    run_split(run, rows, workers)
    threads.end(probe)
    return out


def run_split(run: Callable[[int, int], None], rows: int, workers: int, align: int = 1) -> None:
    """``run(first, last)`` on ``rows`` cut into at most ``workers`` runs whose bounds are multiples of
    ``align``; the last run goes in the calling thread, the others in the worker threads."""
    units = -(-rows // align)
    workers = max(1, min(workers, units))
    bounds = [min(rows, units * i // workers * align) for i in range(workers + 1)]
    futures = [_pool(workers).submit(run, a, b) for a, b in zip(bounds[:-2], bounds[1:-1])]
    try:
        run(bounds[-2], bounds[-1])
    finally:
        for future in futures:
            future.result()


_lock = threading.Lock()
_executor: tuple[int, int, ThreadPoolExecutor] | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """Worker threads, made again after a fork (threads do not survive one) or a new thread count."""
    global _executor
    with _lock:
        if _executor is None or _executor[:2] != (os.getpid(), workers):
            _executor = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="mase-lite-native"))
        return _executor[2]


_local = threading.local()


def scratch(nbytes: int) -> Tensor:
    """This thread's scratch bytes for one kernel call, at least ``nbytes`` long: kept between calls, so their pages
    are not faulted in again on every call, and shared by the kernels (a call never runs inside another).

    >>> scratch(16).numel(), scratch(8).data_ptr() == scratch(16).data_ptr()
    (16, True)
    """
    buffer = getattr(_local, "buffer", None)
    if buffer is None or buffer.numel() < nbytes:
        buffer = _local.buffer = torch.empty(nbytes, dtype=torch.uint8)
    return buffer[:nbytes]
