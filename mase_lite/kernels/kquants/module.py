"""``KQuantLinear``: a Linear layer whose weight is held as one of GGML's K-quants Q2_K .. Q6_K at the format's own
bits (its records, :mod:`mase_lite.kernels.kquants.records`: 2.625 to 6.5625 bits a weight instead of 32), bit for bit
the weight of the fake-quantized layer it packs; the bias stays a float parameter.

With ``activations="int8"`` (inference, as llama.cpp multiplies its K-quants) the input is quantized to int8 per
super-block of 256 (llama.cpp's Q8_K) and each super-block's products are exact integer sums, on the CPU kernel
library (``kquant_dot.h``: the same bits at every vector level and thread count); the weight then never exists in
float. With ``"float"`` the weight is decoded and multiplied in ``x``'s dtype.

>>> import torch
>>> packed = KQuantLinear.from_linear(torch.nn.Linear(256, 8), {"name": "q4_k"}, activations="int8")
>>> with torch.no_grad():
...     y = packed(torch.randn(3, 256))
>>> sorted(packed.state_dict()), packed.blocks.shape, y.shape
(['bias', 'blocks'], torch.Size([8, 148]), torch.Size([3, 8]))
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mase_lite.infra.errors import UserError
from mase_lite.kernels.int8_activations import cpu_kernel as int8_kernel
from mase_lite.kernels.int8_activations.cpu_kernel import KQUANT_KINDS, SUPER
from mase_lite.kernels.int8_activations.layers import (FormatLayer, Int8Weights, TiledWeights, check_activations,
                                                       check_input, fused)
from mase_lite.kernels.kquants.records import from_records, in_rows, paired, record_bytes, to_records
from mase_lite.numerics.codes import encode
from mase_lite.numerics.ggml import ggml_values

_ALLOWED = " or ".join([", ".join(list(KQUANT_KINDS)[:-1]), list(KQUANT_KINDS)[-1]])  # q2_k, ..., q5_k or q6_k


def reference_int8(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The product with int8 activations in torch, within float32 accumulation of the kernel: ``x``'s int8 codes
    times their super-block scales against the decoded ``weight``, summed in float64; in ``x``'s dtype."""
    rows = x.numel() // weight.shape[1]
    codes, xs = int8_kernel.quantize_activations(x.reshape(rows, weight.shape[1]).to(torch.float32), SUPER)
    x_hat = (codes.double().reshape(rows, -1, SUPER) * xs.double().unsqueeze(-1)).reshape(rows, -1)
    out = x_hat @ weight.double().T + (0 if bias is None else bias.double())
    return out.to(x.dtype).view(*x.shape[:-1], weight.shape[0])


class KQuantLinear(TiledWeights, FormatLayer, nn.Module):
    """``y = x @ W.T + b`` with W held as ``blocks`` (uint8 ``[out, in / 256 * bytes]``: the records of
    ``fmt`` (``q2_k`` .. ``q6_k``), each row's super-blocks in order; tiled in place for the kernel from its first
    int8 call where ``out`` is even, :class:`TiledWeights`: paired, :func:`~mase_lite.kernels.kquants.records.paired`).
    ``in`` is a multiple of 256."""

    mase_op = "linear"
    _tiled_names = ("blocks",)
    _tile_rows = 2

    def __init__(self, in_features: int, out_features: int, fmt: dict[str, Any], bias: bool = True,
                 dtype: torch.dtype = torch.float32, activations: str = "float") -> None:
        super().__init__()
        check_activations("KQuantLinear", activations)
        if fmt.get("name") not in KQUANT_KINDS:
            raise UserError(f"KQuantLinear holds {_ALLOWED}, not {fmt.get('name')!r}")
        if in_features < 1 or out_features < 1 or in_features % SUPER:
            raise UserError(f"KQuantLinear needs in_features a positive multiple of {SUPER} and out_features >= 1, "
                            f"got in_features={in_features}, out_features={out_features}")
        self.in_features, self.out_features, self.fmt = in_features, out_features, dict(fmt)
        self.activations = activations
        self.register_buffer("blocks", torch.zeros(out_features, in_features // SUPER * record_bytes(fmt["name"]),
                                                   dtype=torch.uint8))
        self._float_bias(bias, out_features, dtype)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: dict[str, Any], activations: str = "float") -> KQuantLinear:
        """Pack a float Linear's weight in ``fmt`` (``q2_k`` .. ``q6_k``): what :meth:`from_quantized` gives
        for the Linear fake-quantized in ``fmt``."""
        return cls._from_float(linear, fmt, activations)

    @classmethod
    def _from_encoded(cls, fmt: dict[str, Any], encoded, expected: Tensor | None, bias: Tensor | None,
                      activations: str) -> KQuantLinear:
        out_features, in_features = encoded.shape
        module = cls(in_features, out_features, fmt, bias=bias is not None,
                     dtype=torch.float32 if bias is None else bias.dtype, activations=activations)
        module.blocks = to_records(fmt["name"], encoded.unpacked().reshape(out_features, in_features), encoded.side)
        return module._checked(expected, bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.activations == "int8":
            check_input(x, self.in_features, self.bias, "kquant_linear", "a KQuantLinear")
            native = int8_kernel.linear_kquants_many(x, [(self.blocks, self.fmt["name"], self.bias)], self._tile())
            return native[0] if native is not None else reference_int8(x, self.dequantized_weight(), self.bias)
        self._untile()  # activations set to float after int8 calls
        return F.linear(x, self.dequantized_weight().to(x.dtype), self.bias)

    def _tiled_order(self, blocks: Tensor) -> tuple[Tensor]:
        return (paired(self.fmt["name"], blocks),)

    def _row_order(self, blocks: Tensor) -> tuple[Tensor]:
        return (in_rows(self.fmt["name"], blocks),)

    @staticmethod
    def fused(layers: list[nn.Module]) -> Callable[[Tensor], list[Tensor]] | None:
        """One call computing each of ``layers`` on the same input (the K-quants alike, int8 activations, at most 8):
        the input quantized once, their rows split over the threads together. None where they cannot be fused."""
        return fused(layers, KQuantLinear, lambda x, tiled: int8_kernel.linear_kquants_many(
            x, [(m.blocks, m.fmt["name"], m.bias) for m in layers], tiled))

    def int8_weights(self) -> Int8Weights | None:
        """The weights as the int8 kernels read them (None with float activations)."""
        if self.activations != "int8":
            return None
        tiled = self._tile()
        return Int8Weights(False, self.blocks, self.blocks, self.bias, None, 1.0, tiled, self.fmt["name"])

    def codes(self) -> tuple[Tensor, dict[str, Tensor]]:
        """The weight's GGML codes and side (:mod:`mase_lite.numerics.ggml`)."""
        return from_records(self.fmt["name"], *self.rows())

    def encoded(self):
        """The weight as stored codes of its format: what an export writes."""
        codes, side = self.codes()
        values = ggml_values(codes, side, self.fmt["name"])
        return encode(values, self.fmt, side=side, values=values)

    def dequantized_weight(self) -> Tensor:
        return ggml_values(*self.codes(), self.fmt["name"])

    @staticmethod
    def _check(fmt: dict[str, Any] | None, others: bool, in_features: int) -> None:
        if fmt is None or fmt.get("name") not in KQUANT_KINDS or others or in_features % SUPER:
            raise UserError(f"a packed K-quant weight takes {_ALLOWED} over inputs a multiple of {SUPER}, "
                            f"on the weight alone; this layer has {fmt} over {in_features} inputs"[:400])
