"""MXINT8 weights: codec, torch custom ops with CPU/CUDA/fake kernels, a packed Linear, and in-place packing.

Example::

    >>> import torch
    >>> from mase_lite.kernels.mxint8 import MXInt8Linear, dequantize, quantize
    >>> codes, scales = quantize(torch.randn(16, 100))      # int8 [16, 100], uint8 [16, 4]
    >>> w_hat = dequantize(codes, scales)                  # float32 [16, 100]
    >>> layer = MXInt8Linear.from_linear(torch.nn.Linear(100, 16))
"""

from mase_lite.kernels.mxint8.codec import DEFAULT_BLOCK_SIZE, dequantize_reference, quantize
from mase_lite.kernels.mxint8.cuda_build import cuda_extension
from mase_lite.kernels.mxint8.module import MXInt8Linear
from mase_lite.kernels.mxint8.ops import GEMV_MAX_ROWS, dequantize, mxint8_linear
from mase_lite.kernels.mxint8.packing import pack_linears

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "GEMV_MAX_ROWS",
    "MXInt8Linear",
    "cuda_extension",
    "dequantize",
    "dequantize_reference",
    "mxint8_linear",
    "pack_linears",
    "quantize",
]
