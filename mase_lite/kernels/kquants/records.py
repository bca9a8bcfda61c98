"""GGML's K-quants Q2_K .. Q6_K as the CPU kernels read them (``kquant_dot.h``): each row its super-blocks of 256
weights, one record each, holding exactly the format's stored values (:mod:`mase_lite.numerics.ggml`'s codes and side:
``d``, ``dmin``, ``scales``, ``mins``), so a record costs the format's own bits (4.625 bits a weight for Q4_K: GGUF's
144 bytes with the blocks' 6-bit scales and mins unpacked to bytes; 5.625 for Q5_K, GGUF's 176 so unpacked; 6.5625
for Q6_K, GGUF's 210 bytes; 3.5625 for Q3_K, GGUF's 110 with its 6-bit scales unpacked; 2.625 for Q2_K, GGUF's 84).

A super-block's 8 blocks of 32 codes lie across each vector of 32 bytes: byte-vector t (0..7) holds, in its lane i
(bytes 4i..4i+3), codes 4t..4t+3 of block i; a vector of nibbles holds byte-vector v in its low nibbles and v + 4 in
its high ones.

- Q4_K (148 bytes): ``d``, ``dmin`` (float16), the 8 blocks' scales, their 8 mins (uint8), 4 vectors of nibbles;
- Q5_K (180 bytes): Q4_K's record of the codes' low 4 bits, then a vector of their fifth bits (byte-vector t's in bit
  t);
- Q3_K (114 bytes): ``d``, the halves' scales as Q6_K's, 2 vectors of the codes' low 2 bits (as Q6_K's high ones), a
  vector of their third bits (as Q5_K's fifth);
- Q2_K (84 bytes): ``d``, ``dmin``, each half's scale (low 4 bits) and min (high 4 bits) in Q6_K's order of halves, 2
  vectors of the 2-bit codes (as Q6_K's high ones);
- Q6_K (210 bytes): ``d`` (float16), the scales of the 8 blocks' first 16 codes, then of their last 16 (int8), 4 vectors
  of the codes' low 4 bits, 2 vectors of their high 2 bits (byte-vector t's in vector t % 2 from bit 2(t / 2) up).

A tiled layer holds its records paired (:func:`paired`): rows 2p and 2p + 1 with their records interleaved, so
that a decoding step reads two rows in one stream.

>>> import torch
>>> from mase_lite.numerics.ggml import ggml_quantize
>>> codes, side = ggml_quantize(torch.randn(2, 512), "q6_k")
>>> data = to_records("q6_k", codes, side)
>>> data.shape
torch.Size([2, 420])
>>> back, back_side = from_records("q6_k", data)
>>> torch.equal(back, codes) and all(torch.equal(back_side[k], side[k]) for k in side)
True
>>> torch.equal(in_rows("q6_k", paired("q6_k", data)), data)
True
"""

from __future__ import annotations

import torch
from torch import Tensor

from mase_lite.kernels.int8_activations.cpu_kernel import KQUANT_KINDS, SUPER

BLOCK = 32


def record_bytes(name: str) -> int:
    """The bytes of one record of format ``name`` (``q2_k`` .. ``q6_k``)."""
    return KQUANT_KINDS[name][1]


def _half_bytes(h: Tensor) -> Tensor:
    return h.contiguous().view(torch.uint8).reshape(*h.shape, 2)


def _byte_vectors(codes: Tensor) -> Tensor:
    """``[rows, nsb, 256]`` codes as the 8 byte-vectors of each super-block, ``[rows, nsb, 8, 32]``."""
    rows, nsb = codes.shape[:2]
    return codes.reshape(rows, nsb, 8, 8, 4).transpose(2, 3).reshape(rows, nsb, 8, BLOCK)


def _codes(vectors: Tensor) -> Tensor:
    """The inverse of :func:`_byte_vectors`."""
    rows, nsb = vectors.shape[:2]
    return vectors.reshape(rows, nsb, 8, 8, 4).transpose(2, 3).reshape(rows, nsb, SUPER)


def _nibbles(vectors: Tensor) -> Tensor:
    """Byte-vectors of values 0..15 as 4 vectors of nibbles (v low, v + 4 high), ``[rows, nsb, 128]``."""
    return (vectors[:, :, :4] | (vectors[:, :, 4:] << 4)).flatten(2)


def _unnibbled(nibbles: Tensor) -> Tensor:
    rows, nsb = nibbles.shape[:2]
    v = nibbles.reshape(rows, nsb, 4, BLOCK)
    return torch.cat([v & 15, v >> 4], 2)


def _crumbs(values: Tensor) -> Tensor:
    """Byte-vectors of values 0..3 as 2 vectors of crumbs (byte-vector t's in vector t % 2, bits 2(t / 2) up)."""
    rows, nsb = values.shape[:2]
    v = values.reshape(rows, nsb, 4, 2, BLOCK)
    return (v[:, :, 0] | (v[:, :, 1] << 2) | (v[:, :, 2] << 4) | (v[:, :, 3] << 6)).reshape(rows, nsb, 64)


def _uncrumbed(crumbs: Tensor) -> Tensor:
    rows, nsb = crumbs.shape[:2]
    v = crumbs.reshape(rows, nsb, 1, 2, BLOCK)
    return torch.cat([(v >> shift) & 3 for shift in (0, 2, 4, 6)], 2).reshape(rows, nsb, 8, BLOCK)


_BIT = torch.arange(8, dtype=torch.uint8)[:, None]


def _bits(values: Tensor) -> Tensor:
    """Byte-vectors of values 0..1 as one vector (byte-vector t's in bit t)."""
    return (values << _BIT).sum(2, dtype=torch.uint8)


def _unbits(vector: Tensor) -> Tensor:
    return (vector[..., None, :] >> _BIT) & 1


def _halves_scales(scales: Tensor, rows: int, nsb: int) -> Tensor:
    """A side's per-16 values ``[rows, nsb * 16]`` in the records' order: the blocks' first halves, then their
    second."""
    return scales.contiguous().reshape(rows, nsb, 8, 2).transpose(2, 3).reshape(rows, nsb, 16)


def _side_order(values: Tensor) -> Tensor:
    """The inverse of :func:`_halves_scales`, ``[rows, nsb * 16]``."""
    rows, nsb = values.shape[:2]
    return values.reshape(rows, nsb, 2, 8).transpose(2, 3).reshape(rows, nsb * 16)


def _q4_k_parts(vectors: Tensor, side: dict[str, Tensor]) -> list[Tensor]:
    rows, nsb = vectors.shape[:2]
    return [_half_bytes(side["d"]), _half_bytes(side["dmin"]), side["scales"].reshape(rows, nsb, 8),
            side["mins"].reshape(rows, nsb, 8), _nibbles(vectors)]


def _q4_k_side(r: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    rows, nsb = r.shape[:2]
    side = {"d": _half(r, 0), "dmin": _half(r, 2), "scales": r[..., 4:12].reshape(rows, nsb * 8).clone(),
            "mins": r[..., 12:20].reshape(rows, nsb * 8).clone()}
    return _unnibbled(r[..., 20:148]), side


def _q5_k_parts(vectors: Tensor, side: dict[str, Tensor]) -> list[Tensor]:
    return _q4_k_parts(vectors & 15, side) + [_bits(vectors >> 4)]


def _q5_k_side(r: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    low, side = _q4_k_side(r)
    return low | (_unbits(r[..., 148:]) << 4), side


def _q6_k_parts(vectors: Tensor, side: dict[str, Tensor]) -> list[Tensor]:
    rows, nsb = vectors.shape[:2]
    scales = _halves_scales(side["scales"].view(torch.uint8), rows, nsb)
    return [_half_bytes(side["d"]), scales, _nibbles(vectors & 15), _crumbs(vectors >> 4)]


def _q6_k_side(r: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    codes = _unnibbled(r[..., 18:146]) | (_uncrumbed(r[..., 146:]) << 4)
    return codes, {"d": _half(r, 0), "scales": _side_order(r[..., 2:18]).view(torch.int8)}


def _q3_k_parts(vectors: Tensor, side: dict[str, Tensor]) -> list[Tensor]:
    rows, nsb = vectors.shape[:2]
    scales = _halves_scales(side["scales"].view(torch.uint8), rows, nsb)
    return [_half_bytes(side["d"]), scales, _crumbs(vectors & 3), _bits(vectors >> 2)]


def _q3_k_side(r: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    codes = _uncrumbed(r[..., 18:82]) | (_unbits(r[..., 82:]) << 2)
    return codes, {"d": _half(r, 0), "scales": _side_order(r[..., 2:18]).view(torch.int8)}


def _q2_k_parts(vectors: Tensor, side: dict[str, Tensor]) -> list[Tensor]:
    rows, nsb = vectors.shape[:2]
    both = _halves_scales(side["scales"] | (side["mins"] << 4), rows, nsb)
    return [_half_bytes(side["d"]), _half_bytes(side["dmin"]), both, _crumbs(vectors)]


def _q2_k_side(r: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    both = _side_order(r[..., 4:20])
    return _uncrumbed(r[..., 20:]), {"d": _half(r, 0), "dmin": _half(r, 2), "scales": both & 15, "mins": both >> 4}


def _half(r: Tensor, at: int) -> Tensor:
    """The float16 at bytes ``at``, ``at + 1`` of each record."""
    return r[..., at:at + 2].contiguous().view(torch.float16).reshape(r.shape[:2])


LAYOUTS = {"q2_k": (_q2_k_parts, _q2_k_side), "q3_k": (_q3_k_parts, _q3_k_side), "q4_k": (_q4_k_parts, _q4_k_side),
           "q5_k": (_q5_k_parts, _q5_k_side), "q6_k": (_q6_k_parts, _q6_k_side)}
"""Each K-quant's record: its parts from the byte-vectors and the side, and the byte-vectors and side from it."""


def to_records(name: str, codes: Tensor, side: dict[str, Tensor]) -> Tensor:
    """The records (uint8 ``[rows, in / 256 * bytes]``) of a ``[rows, in]`` weight's GGML codes and side."""
    rows, k = codes.shape
    nsb = k // SUPER
    vectors = _byte_vectors(codes.to(torch.uint8).reshape(rows, nsb, SUPER))
    return torch.cat(LAYOUTS[name][0](vectors, side), -1).reshape(rows, nsb * record_bytes(name)).contiguous()


def from_records(name: str, data: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The GGML codes (int64 ``[rows, in]``) and side that :func:`to_records` took."""
    rows = data.shape[0]
    vectors, side = LAYOUTS[name][1](data.reshape(rows, -1, record_bytes(name)))
    return _codes(vectors).reshape(rows, -1).to(torch.int64), side


def paired(name: str, data: Tensor) -> Tensor:
    """Records in rows (``[rows, in / 256 * bytes]``, ``rows`` even) paired: super-block s of row 2p + h at record
    2s + h of pair p; the same shape.

    >>> data = torch.arange(4, dtype=torch.uint8).repeat_interleave(84).view(2, 168)  # rows 0, 1: records 0 1, 2 3
    >>> paired("q2_k", data)[:, ::84].tolist()
    [[0, 2], [1, 3]]
    """
    rows, width = data.shape
    nsb, size = width // record_bytes(name), record_bytes(name)
    return data.reshape(rows // 2, 2, nsb, size).transpose(1, 2).contiguous().view(rows, width)


def in_rows(name: str, data: Tensor) -> Tensor:
    """The inverse of :func:`paired`."""
    rows, width = data.shape
    nsb, size = width // record_bytes(name), record_bytes(name)
    return data.reshape(rows // 2, nsb, 2, size).transpose(1, 2).contiguous().view(rows, width)
