"""GGUF's Q8_0 held packed for the CPU kernels: :class:`Q8_0Linear`."""

from mase_lite.kernels.q8_0.module import Q8_0Linear, pack_linears

__all__ = ["Q8_0Linear", "pack_linears"]
