"""MXINT8 weight codec: the bit-exact torch reference that the CPU and CUDA paths must match.

Both directions reuse :mod:`mase_lite.numerics.mx`, the one implementation of the shared exponent.

Example::

    >>> import torch
    >>> codes, scales = quantize(torch.tensor([[0.5, -1.0, 3.0]]))
    >>> codes.tolist(), scales.tolist()
    ([[16, -32, 96]], [[128]])
    >>> dequantize_reference(codes, scales).tolist()
    [[0.5, -1.0, 3.0]]
"""

from __future__ import annotations

import torch
from torch import Tensor

import mase_lite.kernels.mxint8.cpu_kernel as cpu_kernel
from mase_lite.numerics.mx import mxint_decode, mxint_encode

ELEMENT_WIDTH = 8
DEFAULT_BLOCK_SIZE = 32


def quantize(w: Tensor, block_size: int = DEFAULT_BLOCK_SIZE, scale_rule: str = "floor") -> tuple[Tensor, Tensor]:
    """MXINT8 codes (int8, shape of ``w``) and E8M0 scales (uint8, ``(*w.shape[:-1], ceil(K / block_size))``).

    Blocks run along the last dimension; each row is padded on its own. A float32 CPU tensor with the
    ``floor`` rule is encoded by the native kernel (same bits, one pass), anything else in torch.
    """
    native = cpu_kernel.quantize(w, block_size, scale_rule)
    return mxint_encode(w, ELEMENT_WIDTH, block_size, scale_rule) if native is None else native


def dequantize_reference(codes: Tensor, scales: Tensor, block_size: int = DEFAULT_BLOCK_SIZE,
                         dtype: torch.dtype = torch.float32) -> Tensor:
    """Decode MXINT8 in plain torch: ``code * 2**-6 * 2**(scale - 127)``, rounded once to ``dtype``."""
    return mxint_decode(codes, scales, ELEMENT_WIDTH, block_size, dtype)
