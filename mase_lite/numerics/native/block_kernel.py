"""The native kernel (``blocks.c``) behind the block-scaled formats: mxint, mxfp, block_fp,
block_minifloat and block_log.

It computes the same function as their torch implementations, bit for bit (the tests compare the
two on a corpus of edge cases), in one pass over the tensor instead of several. It applies to a
plain float32 CPU tensor outside autograd, torch.compile, export and torch function/dispatch
modes; :func:`fake_quantize` returns None elsewhere and the caller runs its torch implementation.
Rows are split over ``torch.get_num_threads()`` threads for large tensors. A format is described
by a :class:`BlockGrid` (see ``blocks.c`` for the meaning of each field).

>>> import torch
>>> mxint8 = BlockGrid(integer_grid=True, rule="floor", mbits=6, emax=0, max_value=127 / 64)
>>> y = fake_quantize(torch.tensor([[1.0, 0.3, -2.5]]), mxint8, block_size=32)
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
from dataclasses import dataclass

import torch
from torch import Tensor

from mase_lite.numerics.memory import empty_like_advised
from mase_lite.numerics.native import library

RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3, "nearest": 4}
PARALLEL_FROM_ELEMENTS = 1 << 20
"""Smaller tensors run in the calling thread (a hand-off costs more than it saves)."""


@dataclass(frozen=True)
class BlockGrid:
    """A block-scaled format for the kernel: the shared exponent's rule and range, the element grid."""

    integer_grid: bool
    rule: str
    mbits: int
    emax: int
    max_value: float
    emin: int = 0
    shared_min: int = -127
    shared_max: int = 127
    zero_is_positive: bool = False

    def arguments(self) -> tuple:
        """The kernel's arguments after the block size, in ``blocks.c``'s order."""
        return (int(self.integer_grid), RULES[self.rule], self.mbits, self.emax, self.emin, self.shared_min,
                self.shared_max, int(self.zero_is_positive), float(self.max_value))


@functools.cache
def _kernel():
    lib = library("blocks")
    if lib is None:
        return None
    fn = lib.fake_quantize_blocks
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   *[ctypes.c_int] * 8, ctypes.c_double]
    fn.restype = None
    return fn


def applies(x: Tensor) -> bool:
    """Whether the native kernel may compute ``x``'s result (see the module text)."""
    return (type(x) is Tensor and x.dtype == torch.float32 and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and x.requires_grad)
            and not torch.compiler.is_compiling() and not torch._C._len_torch_function_stack()
            and not torch._C._len_torch_dispatch_stack() and _kernel() is not None)


def fake_quantize(x: Tensor, grid: BlockGrid, block_size: int) -> Tensor | None:
    """``x`` fake-quantized by the native kernel to ``grid`` in blocks of ``block_size``, or None
    where the kernel does not apply."""
    if not applies(x):
        return None
    src = x.contiguous()
    out = empty_like_advised(src)
    length = src.shape[-1] if src.dim() else 1
    rows = math.prod(src.shape[:-1]) if src.dim() else 1
    if not src.numel():
        return out
    args = (block_size, *grid.arguments())
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
            _executor = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="mase-lite-blocks"))
        return _executor[2]
