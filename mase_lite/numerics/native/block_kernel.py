"""The native kernel (``blocks.c``) behind the block-scaled formats: mxint, mxfp, block_fp,
block_minifloat and block_log.

It computes the same function as their torch implementations, bit for bit (the tests compare the
two on a corpus of edge cases), in one pass over the tensor instead of several. Where it does not
apply (:func:`~mase_lite.numerics.native.launch.applies`, or no compiled kernel) :func:`fake_quantize`
returns None and the caller runs its torch implementation. A format is described by a
:class:`BlockGrid` (see ``blocks.c`` for the meaning of each field).

>>> import torch
>>> mxint8 = BlockGrid(integer_grid=True, rule="floor", mbits=6, emax=0, max_value=127 / 64)
>>> y = fake_quantize(torch.tensor([[1.0, 0.3, -2.5]]), mxint8, block_size=32)
>>> y is None or y.tolist() == [[1.0, 0.3125, -2.5]]
True
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from torch import Tensor

from mase_lite.numerics.native import library
from mase_lite.numerics.native.launch import applies, run_rows

RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3, "nearest": 4}


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


def fake_quantize(x: Tensor, grid: BlockGrid, block_size: int) -> Tensor | None:
    """``x`` fake-quantized by the native kernel to ``grid`` in blocks of ``block_size``, or None
    where the kernel does not apply."""
    if not applies(x) or _kernel() is None:
        return None
    return run_rows(_kernel(), x, lambda length: (length, block_size, *grid.arguments()))
