"""``MXInt8Linear``: a Linear layer whose weight is stored packed as MXINT8 codes and scales.

Example::

    >>> import torch
    >>> packed = MXInt8Linear.from_linear(torch.nn.Linear(64, 8))
    >>> sorted(packed.state_dict())
    ['bias', 'codes', 'scales']
    >>> packed(torch.randn(3, 64)).shape
    torch.Size([3, 8])
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

import mase_lite.kernels.int8_activations.cpu_kernel as int8_kernel
from mase_lite.kernels.int8_activations.layers import (Int8Weights, TiledWeights, check_activations, check_input,
                                                       fused)
from mase_lite.infra.errors import UserError
from mase_lite.kernels.mxint8.codec import DEFAULT_BLOCK_SIZE, quantize
from mase_lite.kernels.mxint8.ops import dequantize, mxint8_linear
from mase_lite.numerics.codes import Encoded, offset_codes, pack_bits


class MXInt8Linear(TiledWeights, nn.Module):
    """``y = x @ W.T + b`` with W held as int8 ``codes`` and uint8 E8M0 ``scales`` buffers.

    The bias stays a float parameter. 1 + 1/32 bytes per weight instead of 4: 74.2 % less. ``activations``:
    ``float`` (the exact weights times the float input) or ``int8`` (inference: the input quantized to int8 per
    block of 32 and integer dot products, :mod:`mase_lite.kernels.int8_activations`, as llama.cpp multiplies its
    Q8_0 weights; blocks of 32 over inputs a multiple of 32).
    The state dict holds only tensors (``codes``, ``scales``, ``bias``), so it saves as safetensors.
    In a graph its op is ``linear``; its metadata shows the packed weight in the MXINT8 format.
    """

    _tiled_names = ("codes", "scales")

    mase_op = "linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 block_size: int = DEFAULT_BLOCK_SIZE, scale_rule: str = "floor",
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                 activations: str = "float") -> None:
        super().__init__()
        if in_features < 1 or out_features < 1 or block_size < 1:
            raise UserError(f"MXInt8Linear needs positive sizes, got in_features={in_features}, "
                            f"out_features={out_features}, block_size={block_size}")
        check_activations("MXInt8Linear", activations)
        self.check_packable({"name": "mxint", "element_width": 8, "block_size": block_size}, in_features, activations)
        self.activations = activations
        self.in_features = in_features
        self.out_features = out_features
        self.block_size = block_size
        self.scale_rule = scale_rule
        blocks = -(-in_features // block_size)
        self.register_buffer("codes", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scales", torch.zeros(out_features, blocks, dtype=torch.uint8, device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)

    @classmethod
    def check_packable(cls, fmt: dict, in_features: int, activations: str = "float") -> None:
        """A ``UserError`` where this layer cannot hold a weight of ``fmt`` over ``in_features`` inputs."""
        block_size = fmt.get("block_size") or DEFAULT_BLOCK_SIZE
        if activations == "int8" and (block_size != 32 or in_features % 32):
            raise UserError(f"MXInt8Linear with int8 activations needs blocks of 32 over inputs a multiple of 32, got "
                            f"block_size={block_size}, in_features={in_features}")

    @classmethod
    def from_linear(cls, linear: nn.Linear, block_size: int = DEFAULT_BLOCK_SIZE,
                    scale_rule: str = "floor", activations: str = "float") -> MXInt8Linear:
        """Pack ``linear``'s weight on its own device; the bias is copied with its dtype."""
        weight = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                     block_size=block_size, scale_rule=scale_rule, device="meta", dtype=weight.dtype,
                     activations=activations)
        module.codes, module.scales = quantize(weight, block_size, scale_rule)  # the encoder's tensors, no copy
        if linear.bias is not None:
            module.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=linear.bias.requires_grad)
        return module

    def forward(self, x: Tensor) -> Tensor:
        if self.activations == "int8":
            if self._tile():
                check_input(x, self.in_features, self.bias, "MXInt8Linear", "an MXInt8Linear")
                native = int8_kernel.linear_codes(x, self.codes, self.scales, self.bias, tiled=True)
                if native is not None:
                    return native
            return _linear_int8(x, *self.rows(), self.bias)
        self._untile()  # activations set to float after int8 calls
        return mxint8_linear(x, self.codes, self.scales, self.bias, self.block_size)

    @staticmethod
    def fused(layers: list[nn.Module]) -> Callable[[Tensor], list[Tensor]] | None:
        """One call computing each of ``layers`` on the same input (a block's query, key and value projections),
        where they are MXInt8Linears with int8 activations over the same inputs (at most 8): the input is quantized
        once and their rows split over the threads together, each output the same bits as the layer's own. None
        where they cannot be fused."""
        return fused(layers, MXInt8Linear, lambda x, tiled: int8_kernel.linear_codes_many(
            x, [(m.codes, m.scales, m.bias) for m in layers], tiled))

    def int8_weights(self) -> Int8Weights | None:
        """The weights as the int8 kernels read them (None with float activations)."""
        if self.activations != "int8":
            return None
        tiled = self._tile()
        return Int8Weights(False, self.codes, self.scales, self.bias, None, 2.0**-6, tiled)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight these codes stand for, ``[out_features, in_features]`` in ``dtype``."""
        return dequantize(*self.rows(), self.block_size, dtype)

    def encoded(self) -> Encoded:
        """The int8 codes and E8M0 scales as stored codes of the ``mxint`` format: what an export writes."""
        rows, scales = self.rows()
        codes = offset_codes(rows.to(torch.int64), 8)
        return Encoded(self._format(), 8, pack_bits(codes, 8), {"scale": scales}, tuple(rows.shape), torch.float32,
                       codes)

    def mase_weight_meta(self) -> dict:
        """The packed weight as graph metadata: its logical shape and its MXINT8 format."""
        return {"shape": [self.out_features, self.in_features], "dtype": "int8", "format": self._format(),
                "trainable": False}

    def _format(self) -> dict:
        return {"name": "mxint", "element_width": 8, "block_size": self.block_size, "scale_rule": self.scale_rule}

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, block_size={self.block_size}, scale_rule={self.scale_rule!r}"
                + (f", activations={self.activations}" if self.activations != "float" else ""))


def _linear_int8(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ W.T + bias`` with ``x`` quantized to int8 per block of 32; inference only."""
    check_input(x, codes.shape[1], bias, "MXInt8Linear", "an MXInt8Linear")
    native = int8_kernel.linear_codes(x, codes, scales, bias)
    return native if native is not None else int8_kernel.reference_codes(x, codes, scales, bias)
