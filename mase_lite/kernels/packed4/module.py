"""``Packed4Linear``: a Linear layer whose weight is stored as 4-bit codes, two per byte, with a scale per block of 32
inputs (float16 where the format rounds its scales to float16, as GGUF's Q4_0 does; float32 otherwise) and the table
of the 16 values a code stands for, run by ``mase_lite::packed4_linear``.

It packs a fake-quantized Linear of one of three formats, bit for bit its weight:

- ``scaled_integer`` of 4 bits, symmetric, in groups of 32 (GGUF's Q4_0 with a float16 scale and
  ``full_range``; any scale dtype): codes -8..7 times the group's scale;
- ``mxint`` with ``element_width`` 4 in blocks of 32: codes ±7 of a quarter, times the block's power of two;
- ``mxfp`` E2M1 in blocks of 32 (MXFP4): E2M1 values times the block's power of two.

0.5625 bytes per weight with float16 scales (GGUF's Q4_0 layout), 0.625 with float32 ones, instead of 4 (86 % or
84 % less). With ``activations="int8"`` (an inference mode, as llama.cpp
multiplies Q4_0 weights) the input is quantized to int8 per block of 32 and the products are integer dot products
(VNNI where the CPU has it): faster at batch 1, no longer the float product with the exact weights
(:mod:`mase_lite.kernels.int8_activations`).

Example::

    >>> import torch
    >>> from mase_lite.layers.quantized import quantize_module
    >>> fake = quantize_module(torch.nn.Linear(64, 8), {"weight": {"name": "mxfp", "element_format": "e2m1"}})
    >>> packed = Packed4Linear.from_quantized(fake)
    >>> sorted(packed.state_dict()), packed(torch.randn(3, 64)).shape
    (['bias', 'nibbles', 'scales', 'table'], torch.Size([3, 8]))
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import mase_lite.kernels.int8_activations.cpu_kernel as int8_kernel
from mase_lite.kernels.int8_activations.layers import (FormatLayer, Int8Weights, TiledWeights, check_activations,
                                                       check_input, fused)
import mase_lite.kernels.packed4.cpu_kernel as cpu_kernel
from mase_lite.infra.errors import UserError
from mase_lite.numerics.codes import decode as decode_codes
from mase_lite.numerics.codes import encode
from mase_lite.numerics.registry import target_mapping

BLOCK = 32


def packed_kind(fmt: dict[str, Any] | None, activations: str = "float") -> str | None:
    """The packed layer a weight format packs to (``"packed4"``, ``"mxint8"``, ``"kquant"``, ``"packed8"``: GGUF's
    Q8_0), by the format's ``packed`` mapping (``scheme(fmt, activations)``: the kind or None; ``tensors(encoded)``:
    the 16 values a code stands for and each block's scale; ``side(scales, fmt)``: the stored side of such scales);
    None where it packs to none."""
    mapping = target_mapping(fmt["name"], "packed") if fmt else None
    return mapping.scheme(fmt, activations) if mapping is not None else None


def packable(fmt: dict[str, Any] | None) -> bool:
    """Whether a weight format packs into 4-bit codes with a scale per block of 32 and a table."""
    return packed_kind(fmt) == "packed4"


def reference_linear(x: Tensor, nibbles: Tensor, scales: Tensor, table: Tensor, bias: Tensor | None) -> Tensor:
    """The torch reference: the weight decoded (exactly), then ``F.linear`` in ``x``'s dtype."""
    return F.linear(x, decode(nibbles, scales, table).to(x.dtype), bias)


def decode(nibbles: Tensor, scales: Tensor, table: Tensor) -> Tensor:
    """``table[nibble] * scale`` in float32 (the low nibble is the even element)."""
    values = int8_kernel.unpacked(nibbles, table)
    return (values.reshape(scales.shape[0], -1, BLOCK) * scales.to(torch.float32).unsqueeze(-1)).reshape(values.shape)


@torch.library.custom_op("mase_lite::packed4_linear", mutates_args=(), device_types="cpu")
def _linear_op(x: Tensor, nibbles: Tensor, scales: Tensor, table: Tensor, bias: Tensor | None) -> Tensor:
    native = cpu_kernel.linear(x, nibbles, scales, table, bias)
    return reference_linear(x, nibbles, scales, table, bias) if native is None else native


@_linear_op.register_fake
def _linear_fake(x: Tensor, nibbles: Tensor, scales: Tensor, table: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], scales.shape[0]))


def packed4_linear(x: Tensor, nibbles: Tensor, scales: Tensor, table: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ W.T + bias``; an eager call outside autograd runs the CPU kernel without the dispatcher."""
    if x.shape[-1] != nibbles.shape[1] * 2 or not x.dtype.is_floating_point:
        raise UserError(f"packed4_linear input of shape {tuple(x.shape)} and dtype {x.dtype} does not fit a weight "
                        f"with in_features={nibbles.shape[1] * 2}")
    if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
        return reference_linear(x, nibbles, scales, table, bias)  # differentiable in x and the bias
    native = cpu_kernel.linear(x, nibbles, scales, table, bias)
    return native if native is not None else torch.ops.mase_lite.packed4_linear(x, nibbles, scales, table, bias)


def packed4_linear_int8(x: Tensor, nibbles: Tensor, scales: Tensor, integer: tuple[Tensor, float],
                        bias: Tensor | None = None) -> Tensor:
    """``x @ W.T + bias`` with ``x`` quantized to int8 per block of 32 (``integer``: the table as int8 values and
    their unit, :func:`int8_kernel.integer_table`); inference only."""
    check_input(x, nibbles.shape[1] * 2, bias, "packed4_linear", "a Packed4Linear")
    native = int8_kernel.linear_nibbles(x, nibbles, scales, *integer, bias)
    return native if native is not None else int8_kernel.reference_nibbles(x, nibbles, scales, *integer, bias)


class Packed4Linear(TiledWeights, FormatLayer, nn.Module):
    """``y = x @ W.T + b`` with W held as ``nibbles`` (uint8, ``[out, in / 2]``), ``scales`` (``[out, in / 32]``:
    float16 where the format's scales are float16, as GGUF's Q4_0 holds them; else float32) and ``table`` (16
    float32 values); the bias stays a float parameter. ``fmt``: the weight's format, for graph metadata and
    reports. With int8 activations the nibbles and scales are tiled in place for the kernel (:class:`TiledWeights`:
    :meth:`rows` gives them in rows)."""

    mase_op = "linear"
    _tiled_names = ("nibbles", "scales")

    def __init__(self, in_features: int, out_features: int, fmt: dict[str, Any], bias: bool = True,
                 dtype: torch.dtype = torch.float32, activations: str = "float") -> None:
        super().__init__()
        check_activations("Packed4Linear", activations)
        self.activations = activations
        self._integer: tuple | None = None  # (the table's identity, its integer form)
        if in_features < 1 or out_features < 1 or in_features % BLOCK:
            raise UserError(f"Packed4Linear needs in_features a positive multiple of {BLOCK} and out_features >= 1, "
                            f"got in_features={in_features}, out_features={out_features}")
        self.in_features, self.out_features, self.fmt = in_features, out_features, dict(fmt)
        self.register_buffer("nibbles", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.zeros(out_features, in_features // BLOCK, dtype=scale_dtype(fmt)))
        self.register_buffer("table", torch.zeros(16))
        self._float_bias(bias, out_features, dtype)

    @classmethod
    def check_packable(cls, fmt: dict[str, Any], in_features: int, activations: str = "float") -> None:
        """A ``UserError`` where this layer cannot hold a weight of ``fmt`` over ``in_features`` inputs."""
        _check_packable(fmt, False, in_features, {"weight": fmt})

    @classmethod
    def from_quantized(cls, layer: nn.Module, activations: str = "float") -> Packed4Linear:
        """Pack a fake-quantized Linear's weight (formats: see the module docstring), bit for bit its quantized
        weight; a ``UserError`` naming the format otherwise. Its input and output stay float."""
        formats = layer.quant_formats()
        _check_packable(formats.get("weight"), set(formats) != {"weight"}, layer.in_features, formats)
        bias = None if layer.bias is None else layer._operand("bias", layer.bias).detach().clone()
        return cls._from_codes(formats["weight"], layer.encode_parameters()["weight"],
                               layer._operand("weight", layer.weight).detach(), bias, activations)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: dict[str, Any], activations: str = "float") -> Packed4Linear:
        """Pack a float Linear's weight in ``fmt``: what :meth:`from_quantized` gives for the Linear fake-quantized
        in ``fmt`` (the weight alone), without making that layer first.

        >>> linear = torch.nn.Linear(64, 8)
        >>> fmt = {"name": "mxfp", "element_format": "e2m1"}
        >>> from mase_lite.layers.quantized import quantize_module
        >>> torch.equal(Packed4Linear.from_linear(linear, fmt).nibbles,
        ...             Packed4Linear.from_quantized(quantize_module(linear, {"weight": fmt})).nibbles)
        True
        """
        _check_packable(fmt, False, linear.in_features, {"weight": fmt})
        encoded = encode(linear.weight.detach(), fmt)
        if encoded is None:
            raise UserError(f"a {fmt['name']} weight has no stored codes; it cannot be packed")
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls._from_codes(fmt, encoded, decode_codes(encoded), bias, activations)

    @classmethod
    def _from_codes(cls, fmt: dict[str, Any], encoded, expected: Tensor, bias: Tensor | None, activations: str
                    ) -> Packed4Linear:
        """The layer holding ``encoded``'s codes of ``fmt``, checked to decode to ``expected`` bit for bit."""
        out_features, in_features = encoded.shape
        table, scales = _table_and_scales(encoded)
        codes = encoded.unpacked().reshape(out_features, in_features).to(torch.uint8)
        module = cls(in_features, out_features, fmt, bias=bias is not None, dtype=expected.dtype, activations=activations)
        module.nibbles = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
        module.scales, module.table = scales.to(scale_dtype(fmt)).contiguous(), table  # float16: exact
        if not _same_bits(decode(module.nibbles, module.scales, module.table), expected.float()):
            raise UserError(f"packing this {fmt['name']} weight in 4 bits would change it; it stays fake-quantized")
        if bias is not None:
            module.bias = nn.Parameter(bias)
        if activations == "int8":
            module.integer_table()  # a table without an int8 form is named now, not at the first call
        return module

    def forward(self, x: Tensor) -> Tensor:
        if self.activations == "int8":
            if self._tile():
                check_input(x, self.in_features, self.bias, "packed4_linear", "a Packed4Linear")
                native = int8_kernel.linear_nibbles(x, self.nibbles, self.scales, *self.integer_table(), self.bias,
                                                    tiled=True)
                if native is not None:
                    return native
            return packed4_linear_int8(x, *self.rows(), self.integer_table(), self.bias)
        self._untile()  # activations set to float after int8 calls
        return packed4_linear(x, self.nibbles, self.scales, self.table, self.bias)

    @staticmethod
    def fused(layers: list[nn.Module]) -> Callable[[Tensor], list[Tensor]] | None:
        """One call computing each of ``layers`` on the same input (a block's query, key and value projections),
        where they are Packed4Linears with int8 activations over the same inputs and with the same table (at most
        8): the input is quantized once and their rows split over the threads together, each output the same bits
        as the layer's own. None where they cannot be fused."""
        together = fused(layers, Packed4Linear, lambda x, tiled: int8_kernel.linear_nibbles_many(
            x, [(m.nibbles, m.scales, m.bias) for m in layers], *layers[0].integer_table(), tiled))
        return together if together is not None and all(torch.equal(m.table, layers[0].table) for m in layers) else None

    def int8_weights(self) -> Int8Weights | None:
        """The weights as the int8 kernels read them (None with float activations)."""
        if self.activations != "int8":
            return None
        tiled = self._tile()
        return Int8Weights(True, self.nibbles, self.scales, self.bias, *self.integer_table(), tiled)

    def integer_table(self) -> tuple[Tensor, float]:
        """The table as int8 integers and their power-of-two unit (computed once per table)."""
        identity = (self.table.data_ptr(), self.table._version)
        if self._integer is None or self._integer[0] != identity:
            integer = int8_kernel.integer_table(self.table)
            if integer is None:
                raise UserError(f"this {self.fmt['name']} table has no int8 form: its activations must stay float")
            self._integer = (identity, integer)
        return self._integer[1]

    def encoded(self):
        """The weight as stored codes of its own format (an ``Encoded``, as the fake-quantized layer it was packed
        from stores it): what an export writes. A ``UserError`` where its scales have no stored form."""
        values = self.dequantized_weight()
        side = target_mapping(self.fmt["name"], "packed").side(self.rows()[1], self.fmt)  # the inverse of _table_and_scales
        encoded = encode(values, self.fmt, side=side, values=values)
        if encoded is None:
            raise UserError(f"this packed {self.fmt['name']} weight has no stored codes of its format")
        return encoded

    def dequantized_weight(self) -> Tensor:
        nibbles, scales = self.rows()
        native = cpu_kernel.dequantize(nibbles, scales, self.table)
        return decode(nibbles, scales, self.table) if native is None else native


def _check_packable(fmt: dict[str, Any] | None, others: bool, in_features: int, formats: dict) -> None:
    if not packable(fmt) or others or in_features % BLOCK:
        raise UserError(f"a packed 4-bit weight takes scaled_integer (4 bits, symmetric, groups of 32), mxint "
                        f"(element_width 4) or mxfp e2m1 in blocks of 32 over inputs a multiple of 32, on the "
                        f"weight alone; this layer has {formats} over {in_features} inputs"[:400])


def _table_and_scales(encoded) -> tuple[Tensor, Tensor]:
    """The 16 values a stored code stands for and the scale of each block of 32 (float32, exact)."""
    table, scales = target_mapping(encoded.format["name"], "packed").tensors(encoded)
    return table, scales.reshape(-1, side_blocks(encoded))


def scale_dtype(fmt: dict[str, Any]) -> torch.dtype:
    """The dtype a packed format's scales are held in: float16 where the format rounds its scales to float16 (Q4_0),
    float32 otherwise (E8M0 scales span 2**-127..2**127).

    >>> scale_dtype({"name": "scaled_integer", "scale_dtype": "float16"}), scale_dtype({"name": "mxfp"})
    (torch.float16, torch.float32)
    """
    return torch.float16 if fmt.get("scale_dtype") == "float16" else torch.float32


def side_blocks(encoded) -> int:
    return encoded.shape[-1] // BLOCK


def _same_bits(a: Tensor, b: Tensor) -> bool:
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32)))
