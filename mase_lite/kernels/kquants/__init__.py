"""GGML's K-quants held packed for the CPU kernels: :class:`KQuantLinear` and its records."""

from mase_lite.kernels.kquants.module import KQuantLinear
from mase_lite.kernels.kquants.packing import pack_linears

__all__ = ["KQuantLinear", "pack_linears"]
