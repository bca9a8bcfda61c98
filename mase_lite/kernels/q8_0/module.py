"""``Q8_0Linear``: a Linear layer whose weight is held as GGUF's Q8_0, int8 codes with a float16 scale ``d`` per
block of 32 (8.5 bits a weight instead of 32, GGUF's own), bit for bit the weight of the fake-quantized layer it
packs; the bias stays a float parameter.

With ``activations="int8"`` (inference, as llama.cpp multiplies Q8_0) the input is quantized to int8 per block of 32
and each block's products are exact integer sums on the CPU kernel library (``int8_linear.c``, the codes' kernel of
MXINT8 with float16 scales: the same bits at every vector level and thread count), the codes tiled in place for
decoding steps; with ``"float"`` the weight is decoded and multiplied in ``x``'s dtype.

>>> import torch
>>> packed = Q8_0Linear.from_linear(torch.nn.Linear(64, 8), activations="int8")
>>> with torch.no_grad():
...     y = packed(torch.randn(3, 64))
>>> sorted(packed.state_dict()), packed.codes.dtype, packed.scales.dtype, y.shape
(['bias', 'codes', 'scales'], torch.int8, torch.float16, torch.Size([3, 8]))
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mase_lite.infra.errors import UserError
from mase_lite.infra.heap import return_free_memory
from mase_lite.kernels.int8_activations import cpu_kernel as int8_kernel
from mase_lite.kernels.int8_activations.layers import (FormatLayer, Int8Weights, TiledWeights, check_activations,
                                                       check_input, fused)
from mase_lite.kernels.packed4.module import packed_kind
from mase_lite.numerics.codes import encode
from mase_lite.numerics.ggml import ggml_values

BLOCK = 32
FORMAT = {"name": "q8_0"}
OFFSET = 128  # the format's stored code of 0 (mase_lite.numerics.ggml: q8_0's code is q + 128)


class Q8_0Linear(TiledWeights, FormatLayer, nn.Module):
    """``y = x @ W.T + b`` with W held as int8 ``codes`` (``[out, in]``, -128..127) and float16 ``scales``
    (``[out, in / 32]``: each block's ``d``); ``in`` a multiple of 32."""

    mase_op = "linear"
    _tiled_names = ("codes", "scales")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype = torch.float32,
                 activations: str = "float") -> None:
        super().__init__()
        check_activations("Q8_0Linear", activations)
        if in_features < 1 or out_features < 1 or in_features % BLOCK:
            raise UserError(f"Q8_0Linear needs in_features a positive multiple of {BLOCK} and out_features >= 1, "
                            f"got in_features={in_features}, out_features={out_features}")
        self.in_features, self.out_features, self.fmt = in_features, out_features, dict(FORMAT)
        self.activations = activations
        self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.zeros(out_features, in_features // BLOCK, dtype=torch.float16))
        self._float_bias(bias, out_features, dtype)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activations: str = "float") -> Q8_0Linear:
        """Pack a float Linear's weight in Q8_0: what :meth:`from_quantized` gives for the Linear fake-quantized in
        ``q8_0``."""
        return cls._from_float(linear, FORMAT, activations)

    @classmethod
    def _from_encoded(cls, fmt: dict, encoded, expected: Tensor | None, bias: Tensor | None,
                      activations: str) -> Q8_0Linear:
        out_features, in_features = encoded.shape
        module = cls(in_features, out_features, bias=bias is not None,
                     dtype=torch.float32 if bias is None else bias.dtype, activations=activations)
        module.codes = (encoded.unpacked().reshape(out_features, in_features) - OFFSET).to(torch.int8)
        module.scales = encoded.side["d"].reshape(out_features, -1).to(torch.float16).contiguous()
        return module._checked(expected, bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.activations == "int8":
            check_input(x, self.in_features, self.bias, "q8_0_linear", "a Q8_0Linear")
            native = int8_kernel.linear_codes(x, self.codes, self.scales, self.bias, tiled=self._tile())
            return native if native is not None else int8_kernel.reference_codes(x, *self.rows(), self.bias)
        self._untile()  # activations set to float after int8 calls
        return F.linear(x, self.dequantized_weight().to(x.dtype), self.bias)

    @staticmethod
    def fused(layers: list[nn.Module]) -> Callable[[Tensor], list[Tensor]] | None:
        """One call computing each of ``layers`` on the same input (Q8_0Linears with int8 activations, at most 8):
        the input quantized once, their rows split over the threads together. None where they cannot be fused."""
        return fused(layers, Q8_0Linear, lambda x, tiled: int8_kernel.linear_codes_many(
            x, [(m.codes, m.scales, m.bias) for m in layers], tiled))

    def int8_weights(self) -> Int8Weights | None:
        """The weights as the int8 kernels read them (None with float activations)."""
        if self.activations != "int8":
            return None
        tiled = self._tile()
        return Int8Weights(False, self.codes, self.scales, self.bias, None, 1.0, tiled)

    @staticmethod
    def _check(fmt: dict | None, others: bool, in_features: int) -> None:
        if packed_kind(fmt) != "packed8" or others or in_features % BLOCK:  # the format's packed mapping: Q8_0
            raise UserError(f"a packed Q8_0 weight takes q8_0 over inputs a multiple of {BLOCK}, on the weight "
                            f"alone; this layer has {fmt} over {in_features} inputs"[:400])

    def encoded(self):
        """The weight as stored codes of ``q8_0``: what an export writes."""
        codes, scales = self.rows()
        values = _values(codes, scales)
        return encode(values, self.fmt, side={"d": scales}, values=values)

    def dequantized_weight(self) -> Tensor:
        return _values(*self.rows())


def _values(codes: Tensor, scales: Tensor) -> Tensor:
    """The weights ``codes`` (int8, in rows) and their block ``scales`` stand for, float32."""
    return ggml_values(codes.to(torch.int64) + OFFSET, {"d": scales}, "q8_0")


def pack_linears(model: nn.Module, skip: tuple[str, ...] = (), activations: str = "float") -> int:
    """Replace every ``nn.Linear`` of ``model`` whose inputs are a multiple of 32 and whose name does not start with
    one of ``skip`` by a :class:`Q8_0Linear`, one layer at a time, each float weight released before the next is
    packed; returns how many were packed.

    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    >>> pack_linears(model, skip=("2",)), type(model[0]).__name__, type(model[2]).__name__
    (1, 'Q8_0Linear', 'Linear')
    """
    names = [name for name, module in model.named_modules() if type(module) is nn.Linear
             and module.in_features % BLOCK == 0 and not name.startswith(tuple(skip))]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Q8_0Linear.from_linear(getattr(parent, child), activations))
    return_free_memory()
    return len(names)
