"""Stored codes: a quantized tensor as its integer codes (bit-packed) plus the scales its format shares.

A format's :class:`~mase_lite.numerics.registry.Codec` says how: ``side(x, params)`` derives, from the
tensor the format quantizes, the values it shares (scales, zero points, shared exponents) exactly as the
format does; ``codes(values, side, params)`` gives the unsigned code of each quantized value under
them; ``decode(codes, side, params)`` gives the float32 values back. :func:`encode` checks the round trip
bit for bit before it returns anything, so a stored tensor always loads as the value the format gave
(NaN positions are kept in a one-bit mask, present only when the tensor has a NaN).

>>> import torch
>>> x = torch.tensor([[0.3, -1.2, 0.0, 5.0]])
>>> stored = encode(x, {"name": "integer", "width": 4, "frac_width": 1})
>>> stored.bits, stored.packed.dtype, stored.packed.numel()     # four 4-bit codes in two bytes
(4, torch.uint8, 2)
>>> decode(stored).tolist()
[[0.5, -1.0, 0.0, 3.5]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import Tensor

from mase_lite.numerics.core import _cast_back
from mase_lite.numerics.registry import FormatError, NumberFormat, parse_format

NAN_MASK = "nan"


@dataclass
class Encoded:
    """One tensor as its format stores it: ``bits``-bit codes packed into ``packed`` (uint8, little-endian
    bit order: code ``i`` occupies bits ``i*bits .. (i+1)*bits - 1`` of the stream), the ``side`` tensors
    of the format (scales, zero points, shared exponents; ``"nan"``: a packed NaN mask), the tensor's
    ``shape`` and ``dtype``, and its canonical ``format`` dict."""

    format: dict[str, Any]
    bits: int
    packed: Tensor
    side: dict[str, Tensor]
    shape: tuple[int, ...]
    dtype: torch.dtype
    codes: Tensor | None = field(default=None, repr=False)  # the unpacked codes (int64), kept from encoding

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def unpacked(self) -> Tensor:
        """The codes as an int64 tensor of ``shape``."""
        if self.codes is None:
            self.codes = unpack_bits(self.packed, self.bits, self.numel).reshape(self.shape)
        return self.codes

    def nbytes(self) -> int:
        """Bytes of the packed codes and the side tensors."""
        return self.packed.numel() + sum(t.numel() * t.element_size() for t in self.side.values())


def codec_of(fmt: Mapping[str, Any] | str) -> tuple[NumberFormat, Any]:
    """The format and its validated params, for a format that has a codec; a :class:`FormatError` otherwise."""
    number_format, params = parse_format(fmt)
    if number_format.codec is None:
        raise FormatError(f"format '{number_format.name}' has no stored codes (no codec is registered for it)")
    return number_format, params


def encode(x: Tensor, fmt: Mapping[str, Any] | str, side: Mapping[str, Tensor] | None = None,
           values: Tensor | None = None) -> Encoded | None:
    """``x`` quantized to ``fmt`` as stored codes; None where the format cannot store these values exactly.

    ``side``: shared values to use instead of deriving them from ``x`` (a layer whose weight was loaded from
    codes keeps its scales). ``values``: the quantized values to encode (default: ``fmt`` applied to ``x``;
    in ``x``'s dtype). The result decodes to ``values`` bit for bit, or None is returned (the caller keeps
    the float tensor): a format whose params say it draws at random, or values its codes cannot hold.
    """
    number_format, params = codec_of(fmt)
    codec = number_format.codec
    x32 = x.detach().to(torch.float32)
    if values is None:  # codes of the format's float32 values: a cast to x's dtype comes after decoding
        v32 = number_format.quantize(x32, params)
        values = _cast_back(v32, x.dtype)
    else:
        if values.shape != x.shape or values.dtype != x.dtype:
            raise FormatError(f"encode: values of shape {tuple(values.shape)} and {values.dtype} do not match "
                              f"the tensor's {tuple(x.shape)} and {x.dtype}")
        v32 = values.detach().to(torch.float32)
    derived = codec.side(x32, params) if side is None else {k: v for k, v in side.items() if k != NAN_MASK}
    if derived is None:
        return None
    nan = torch.isnan(v32)
    try:  # a NaN takes any code (its mask restores it): codecs read it as zero
        codes = codec.codes(v32, derived, params)
    except ValueError:
        return None
    bits = codec.bits(params)
    if codes.shape != v32.shape or (codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 1 << bits)):
        return None
    stored = dict(derived)
    if bool(nan.any()):
        stored[NAN_MASK] = pack_bits(nan.reshape(-1).to(torch.int64), 1)
    encoded = Encoded(number_format.as_dict(params), bits, pack_bits(codes.reshape(-1), bits), stored,
                      tuple(x.shape), x.dtype, codes)
    return encoded if same_bits(decode(encoded), values) else None


def decode(encoded: Encoded) -> Tensor:
    """The values ``encoded`` stores, in its dtype."""
    number_format, params = codec_of(encoded.format)
    if number_format.codec.bits(params) != encoded.bits:
        raise FormatError(f"format '{number_format.name}' stores {number_format.codec.bits(params)}-bit codes, "
                          f"not {encoded.bits}-bit ones")
    side = {k: v for k, v in encoded.side.items() if k != NAN_MASK}
    _check_side(number_format, params, encoded, side)
    codes = encoded.unpacked()
    values = number_format.codec.decode(codes, side, params)
    if NAN_MASK in encoded.side:
        nan = unpack_bits(encoded.side[NAN_MASK], 1, encoded.numel).reshape(encoded.shape).bool()
        values = torch.where(nan, torch.full_like(values, math.nan), values)
    return _cast_back(values, encoded.dtype)


def _check_side(number_format: NumberFormat, params: Any, encoded: Encoded, side: dict[str, Tensor]) -> None:
    """The side tensors a tensor of this shape has in this format, with their shapes and dtypes (codes read
    from a file are data: a scale of the wrong shape would broadcast into wrong values)."""
    expected = number_format.codec.side(torch.zeros(encoded.shape), params) or {}
    if set(side) != set(expected):
        raise FormatError(f"format '{number_format.name}' stores {sorted(expected) or 'no side tensors'}, "
                          f"got {sorted(side) or 'none'}")
    for key, value in side.items():
        if value.shape != expected[key].shape or value.dtype != expected[key].dtype:
            raise FormatError(f"{key} of format '{number_format.name}' is {list(expected[key].shape)} "
                              f"{expected[key].dtype} for a tensor of shape {list(encoded.shape)}, got "
                              f"{list(value.shape)} {value.dtype}")
    mask = encoded.side.get(NAN_MASK)
    if mask is not None and (mask.dtype != torch.uint8 or mask.dim() != 1 or mask.numel() * 8 < encoded.numel):
        raise FormatError(f"the NaN mask is not {encoded.numel} packed bits")


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal shapes, dtypes and bits, NaN where the other has NaN (of any payload)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.masked_fill(nan, 0).view(ints), b.masked_fill(nan, 0).view(ints))


# Bit packing -------------------------------------------------------------------------------------------

def pack_bits(codes: Tensor, bits: int) -> Tensor:
    """Unsigned ``codes`` (any integer dtype, values below ``2**bits``) as a little-endian bit stream of bytes.

    >>> pack_bits(torch.tensor([1, 2, 3]), 4).tolist()        # 0x21, then 0x03 (the last nibble padded)
    [33, 3]
    >>> unpack_bits(pack_bits(torch.tensor([5, 0, 7, 1]), 3), 3, 4).tolist()
    [5, 0, 7, 1]
    """
    if not 1 <= bits <= 32:
        raise FormatError(f"codes of {bits} bits cannot be packed (1 to 32 bits)")
    if bits < 8 and 8 % bits == 0:  # in bytes: codes below 2**bits shifted within a byte (int64 would take 8 times the memory)
        per_byte = 8 // bits
        padded = torch.nn.functional.pad(codes.reshape(-1).to(torch.uint8), (0, -codes.numel() % per_byte)).reshape(-1, per_byte)
        packed = padded[:, 0].clone()
        for i in range(1, per_byte):
            packed |= padded[:, i] << (i * bits)
        return packed
    flat = codes.reshape(-1).to(torch.int64)
    if bits in (8, 16, 32):
        return flat.to({8: torch.uint8, 16: torch.int16, 32: torch.int32}[bits]).view(torch.uint8).clone() \
            if bits != 8 else flat.to(torch.uint8)
    out = []
    for start in range(0, flat.numel(), 1 << 20):  # 8 codes per chunk boundary keep bytes whole
        chunk = flat[start : start + (1 << 20)]
        stream = ((chunk[:, None] >> torch.arange(bits, dtype=torch.int64)) & 1).reshape(-1)
        stream = torch.nn.functional.pad(stream, (0, -stream.numel() % 8)).reshape(-1, 8)
        out.append((stream << torch.arange(8, dtype=torch.int64)).sum(1).to(torch.uint8))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.uint8)


def unpack_bits(packed: Tensor, bits: int, count: int) -> Tensor:
    """The first ``count`` codes (int64) of a stream written by :func:`pack_bits`."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise FormatError(f"packed codes must be a 1-D uint8 tensor, got {packed.dtype} of shape {tuple(packed.shape)}")
    if packed.numel() * 8 < count * bits:
        raise FormatError(f"{packed.numel()} bytes hold fewer than {count} codes of {bits} bits")
    if bits in (8, 16, 32):
        width = bits // 8
        raw = packed[: count * width]
        if bits == 8:
            return raw.to(torch.int64)
        signed = raw.view({16: torch.int16, 32: torch.int32}[bits]).to(torch.int64)
        return signed & ((1 << bits) - 1)
    if 8 % bits == 0:
        per_byte = 8 // bits
        shifts = torch.arange(per_byte, dtype=torch.uint8) * bits
        return ((packed[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count].to(torch.int64)
    out = []
    per_chunk = 1 << 20  # codes per chunk: a multiple of 8, so each chunk starts on a byte
    for start in range(0, count, per_chunk):
        n = min(per_chunk, count - start)
        first = start * bits // 8
        chunk = packed[first : first + -(-n * bits // 8)].to(torch.int64)
        stream = ((chunk[:, None] >> torch.arange(8, dtype=torch.int64)) & 1).reshape(-1)[: n * bits]
        out.append((stream.reshape(n, bits) << torch.arange(bits, dtype=torch.int64)).sum(1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


# Codes of the float-like grids -------------------------------------------------------------------------

def float_grid_codes(values: Tensor, bits: int, mantissa_bits: int, min_exponent: int | Tensor) -> Tensor:
    """Unsigned ``bits``-bit codes (the sign in the top bit, -0 included) of values on a float grid with
    ``mantissa_bits`` fraction bits, normal exponents from ``min_exponent`` (broadcastable: per block) and
    subnormals below. The magnitude code counts the grid's values from zero, as an IEEE float's bits do
    (exponent field ``E - min_exponent + 1``, 0 for subnormals). A value off the grid, or beyond the codes,
    raises ``ValueError``.

    >>> float_grid_codes(torch.tensor([0.0, 0.5, 1.5, -6.0, -0.0]), 4, 1, 0).tolist()      # E2M1
    [0, 1, 3, 15, 8]
    """
    v = values.to(torch.float64).nan_to_num(0.0, posinf=math.inf, neginf=-math.inf)
    magnitude = v.abs()
    _, exponent = torch.frexp(magnitude)
    low = torch.as_tensor(min_exponent, dtype=torch.int64, device=v.device)
    normal = (exponent.to(torch.int64) - 1 >= low) & (magnitude > 0)
    binade = torch.where(normal, exponent.to(torch.int64) - 1, low)  # subnormals share the lowest binade's step
    steps = torch.ldexp(magnitude, (mantissa_bits - binade).to(torch.float64))  # [2**m, 2**(m+1)) when normal
    code = exact_integers(torch.where(normal, steps + (binade - low) * 2.0**mantissa_bits, steps))
    if code.numel() and int(code.max()) >= 1 << (bits - 1):
        raise ValueError("magnitudes beyond the format's codes")
    return code | (torch.signbit(v).to(torch.int64) << (bits - 1))


def float_grid_values(codes: Tensor, bits: int, mantissa_bits: int, min_exponent: int | Tensor) -> Tensor:
    """The float32 values of unsigned sign-magnitude ``codes`` on the grid of :func:`float_grid_codes`.

    >>> float_grid_values(torch.tensor([0, 1, 3, 15]), 4, 1, 0).tolist()
    [0.0, 0.5, 1.5, -6.0]
    """
    negative = (codes >> (bits - 1)) & 1
    magnitude = codes & ((1 << (bits - 1)) - 1)
    low = torch.as_tensor(min_exponent, dtype=torch.int64, device=codes.device)
    field = magnitude >> mantissa_bits
    fraction = magnitude & ((1 << mantissa_bits) - 1)
    significand = torch.where(field > 0, fraction + (1 << mantissa_bits), fraction).to(torch.float64)
    exponent = torch.where(field > 0, field - 1 + low, low) - mantissa_bits
    value = torch.ldexp(significand, exponent.to(torch.float64)).to(torch.float32)
    return torch.where(negative.bool(), -value, value)


def offset_codes(signed: Tensor, bits: int) -> Tensor:
    """Two's complement integers of ``bits`` bits as unsigned codes (offset binary: ``code + 2**(bits-1)``)."""
    return signed + (1 << (bits - 1))


def offset_values(codes: Tensor, bits: int) -> Tensor:
    """The signed integers of :func:`offset_codes`."""
    return codes - (1 << (bits - 1))


def exact_integers(values: Tensor, dtype: torch.dtype = torch.int64) -> Tensor:
    """``values`` (float) as integers of ``dtype`` (wide enough for them), NaN as 0; ``ValueError`` where one is not
    an integer."""
    nan = torch.isnan(values)
    integers = values.to(dtype).masked_fill_(nan, 0)  # an Inf, a fraction or a value out of range does not convert back
    if not bool(integers.to(values.dtype).eq_(values).logical_or_(nan).all()):
        raise ValueError("values off the format's grid")
    return integers
