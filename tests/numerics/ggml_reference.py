"""What the tests of llama.cpp's block-of-32 types (q4_0, q8_0, q4_1, q5_0, q5_1) compare with: llama.cpp's reference
quantizer as gguf transcribes it, per-block errors, and a layer with correlated inputs for GPTQ."""

import math

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from mase_lite.numerics.ggml import GGML_TYPE_NAMES


def gguf_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[GGML_TYPE_NAMES[name]]


def reference(name, x):
    """llama.cpp's reference quantizer, as gguf transcribes it: the block bytes and their float32 values."""
    with np.errstate(over="ignore", invalid="ignore"):  # q4_1's and q5_1's min beyond float16: Inf, NaN values
        raw = quants.quantize(np.ascontiguousarray(x, dtype=np.float32), gguf_type(name))
        return raw, quants.dequantize(raw, gguf_type(name)).astype(np.float32)


def bits_of(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def block_errors(x, v):
    diff = np.asarray(x, dtype=np.float64) - np.asarray(v, dtype=np.float64)
    return (diff * diff).reshape(-1, 32).sum(-1)


def correlated(n_in=256, n_out=8, rows=1024, seed=2, offset=0.0):
    """A weight (``offset`` added) and the Hessian of inputs with correlated columns of growing scale."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(n_in, n_in, generator=g) / math.sqrt(n_in) + torch.eye(n_in)
    x = torch.randn(rows, n_in, generator=g) @ mix * torch.linspace(0.2, 3, n_in)
    w = torch.randn(n_out, n_in, generator=g) * 0.1 + offset
    return w, 2 * x.double().t() @ x.double() / rows, x
