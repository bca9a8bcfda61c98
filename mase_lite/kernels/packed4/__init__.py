"""Packed 4-bit Linear layers (Q4_0-style integers, MXINT4, MXFP4) and their native CPU kernel."""

from mase_lite.kernels.packed4.module import Packed4Linear, packable, packed4_linear
from mase_lite.kernels.packed4.packing import pack_linears

__all__ = ["Packed4Linear", "pack_linears", "packable", "packed4_linear"]
