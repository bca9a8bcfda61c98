"""Number formats as pure tensor functions with straight-through gradients.

One entry point, :func:`quantize`, for every registered format: integer, minifloat_ieee,
minifloat_denorm, log, block_fp, block_minifloat, block_log, binary, binary_scaling,
binary_residual_sign, ternary, mxint, mxfp, scaled_integer, nvfp4, scaled_float. A format dict such as
``{"name": "integer", "width": 8, "frac_width": 4}`` is the canonical spelling in configs and metadata.

>>> import torch
>>> from mase_lite.numerics import quantize, bits_per_element, format_names
>>> quantize(torch.tensor([1.0, 0.3, 20.0]), "minifloat_denorm", width=8, exponent_width=4).tolist()
[1.0, 0.3125, 20.0]
>>> bits_per_element({"name": "mxint", "element_width": 8})   # 8 bits + one 8-bit scale per 32
8.25
>>> "minifloat_ieee" in format_names()
True
"""

# Importing a family module registers its formats.
from mase_lite.numerics import binary, block, integer, log, minifloat, mx_formats, scaled, scaled_float, ternary  # noqa: F401
from mase_lite.numerics import ggml  # noqa: F401  (GGML K-quants and IQ4_NL)
from mase_lite.numerics.binary import residual_level_means, residual_sign
from mase_lite.numerics.core import SUPPORTED_DTYPES, apply_format, bits_per_element, format_dict, quantize
from mase_lite.numerics.registry import (
    FormatError,
    FormatParams,
    NumberFormat,
    format_names,
    get_format,
    parse_format,
    register_format,
)
from mase_lite.numerics.ste import STE_KINDS, straight_through

__all__ = [
    "FormatError",
    "FormatParams",
    "NumberFormat",
    "STE_KINDS",
    "SUPPORTED_DTYPES",
    "apply_format",
    "bits_per_element",
    "format_dict",
    "format_names",
    "get_format",
    "parse_format",
    "quantize",
    "register_format",
    "residual_level_means",
    "residual_sign",
    "straight_through",
]
