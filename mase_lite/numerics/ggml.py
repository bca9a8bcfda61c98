"""GGML's K-quants ``q2_k`` .. ``q6_k``, ``iq4_nl`` and the legacy types ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1`` and
``q8_0`` as number formats, bit for bit as llama.cpp stores them.

A row (the last dimension; all leading dimensions are rows) is cut into blocks: super-blocks of 256 weights
for the K-quants, blocks of 32 for ``iq4_nl`` and the legacy types; a row's length must be a multiple of the
block. Each block stores, as llama.cpp's ``ggml-common.h`` lays it out (``block_q2_K`` .. ``block_q6_K``,
``block_iq4_nl``, ``block_q4_0``, ``block_q4_1``, ``block_q5_0``, ``block_q5_1``, ``block_q8_0``):

- ``q2_k``: sub-blocks of 16, ``(d·sc)·q - dmin·m``, q 0..3, 4-bit sc and m; 84 bytes, 2.625 bits a weight;
- ``q3_k``: sub-blocks of 16, ``(d·sc)·q``, q -4..3, 6-bit signed sc (-32..31); 110 bytes, 3.4375 bits;
- ``q4_k``: sub-blocks of 32, ``(d·sc)·q - dmin·m``, q 0..15, 6-bit sc and m; 144 bytes, 4.5 bits;
- ``q5_k``: sub-blocks of 32, ``(d·sc)·q - dmin·m``, q 0..31, 6-bit sc and m; 176 bytes, 5.5 bits;
- ``q6_k``: sub-blocks of 16, ``(d·sc)·q``, q -32..31, int8 sc; 210 bytes, 6.5625 bits;
- ``iq4_nl``: blocks of 32, ``d·kvalues_iq4nl[i]``, i 0..15; 18 bytes, 4.5 bits;
- ``q4_0``: blocks of 32, ``d·q``, q -8..7 (stored q+8, low nibbles weights 0..15, high 16..31); 18 bytes, 4.5 bits;
- ``q4_1``: blocks of 32, ``d·q + m``, q 0..15 (nibbles as q4_0), float16 d and m; 20 bytes, 5 bits;
- ``q5_0``: blocks of 32, ``d·q``, q -16..15 (stored q+16: its low 4 bits as q4_0's nibbles, its 5th bit as bit j of
  the little-endian uint32 ``qh`` for weight j); 22 bytes, 5.5 bits;
- ``q5_1``: blocks of 32, ``d·q + m``, q 0..31 (``qh`` and nibbles as q5_0), float16 d and m; 24 bytes, 6 bits;
- ``q8_0``: blocks of 32, ``d·q``, q -128..127 (int8); 34 bytes, 8.5 bits;

``d``, ``dmin`` and ``m`` (q4_1, q5_1) are float16, one per block.

Every product, sum and difference is one float32 operation in that order, as ``gguf``'s dequantizers compute
them (``d·q + m`` for q4_1 and q5_1), so the fake-quantized values equal ``gguf.quants.dequantize`` of the block
bytes bit for bit (a zero weight of a sub-block whose scale is negative is ``-0.0``, as ggml decodes it).

Choosing the scales, per block: candidate scale sets are built — llama.cpp's reference quantizer
(``quantize_row_qX_K_ref``: ``make_qkx2_quants`` / ``make_q3_quants`` / ``make_qx_quants`` per sub-block, the
sub-block scales then quantized against ``max / 63`` etc.), its importance-path search (``make_qkx3_quants``
with ``make_qp_quants``, or ``make_qx_quants`` for the signed scales) and the reference's scales rounded against
the stored float16 ``d`` — each weight set to its nearest code under the stored scales and the candidate of
least squared error kept; each sub-block's integer scale (and min) is then moved to the best of its
least-squares refit and ±1 steps (``d`` fixed), and once more after ``d``/``dmin`` are refitted to those
sub-block scales. Every weight is finally the nearest code of its sub-block's grid, ``round((x + dmin·m) /
(d·sc))`` clamped (llama.cpp's last step too), so a block's error is never above that of llama.cpp's reference
quantizer (as transcribed here: the same up to the order of float32 sums). ``iq4_nl`` tries llama.cpp's scales
(its reference and its ``ntry = 7`` search, as ``llama-quantize`` runs it), least-squares ones and a
least-squares refit; weights go to the nearest table value (``best_index_int8``). ``q4_0``, ``q5_0`` and ``q8_0``
try llama.cpp's reference scales (``quantize_row_q4_0_ref``: ``max / -8``; ``quantize_row_q5_0_ref``: ``max /
-16``; ``quantize_row_q8_0_ref``: ``amax / 127``), ``make_qx_quants`` (``quantize_row_q4_0_impl``'s and
``quantize_row_q5_0_impl``'s importance path), least-squares fits of trial steps and a refit; ``q4_1`` and
``q5_1`` try the reference's ``d = (max - min) / qmax``, ``m = min`` (``quantize_row_q4_1_ref`` /
``quantize_row_q5_1_ref``), that step taken from the stored float16 min (or from the max down, ``d < 0``),
``make_qkx3_quants`` (``quantize_row_q4_1_impl`` / ``q5_1_impl``'s importance path), least-squares ``(d, m)`` fits
of trial codes clipping either end and least-squares refits; every weight at the exact nearest code under the
stored float16 ``d`` (and ``m``: the nearest of the float32 values ``d·q + m`` decode to), so no block's error is
above the reference's (which stores its codes under the same ``d`` and ``m``). A sub-block of non-negative
weights holding a zero keeps a zero min, so its zeros stay exact zeros; a block of zeros is zeros (``d = +0.0``,
where llama.cpp's q4_0 and q5_0 store ``0 / -8 = -0.0``, decoding to -0.0). NaN is refused (GGML has no NaN
code); ±Inf and magnitudes beyond a type's largest value saturate, and so does a float16 scale (at 65504, where
ggml would store Inf). The search runs on 2**18 weights at a time.

The codes (``codec``): per weight its unsigned code (q2_k 0..3; q3_k q+4; q4_k 0..15; q5_k 0..31; q6_k q+32;
iq4_nl the table index; q4_0 q+8; q4_1 q; q5_0 q+16; q5_1 q; q8_0 q+128), and the side ``d`` (float16 per
block), ``dmin`` (float16, q2_k/q4_k/q5_k), ``m`` (float16 per block, q4_1/q5_1), ``scales`` and ``mins`` (per
sub-block: uint8; int8 for q3_k and q6_k). :func:`to_ggml_blocks` packs codes and side into the GGUF tensor
bytes, :func:`from_ggml_blocks` reads them back.

GPTQ (``group``, ``group_quantizer``): a K-quant's sub-block grids all hang on the super-block's ``d``/``dmin``,
fixed from all 256 weights, so the group is the super-block (256; 32, one ``d`` (and ``m``), for iq4_nl and the
legacy types). The grid function the group quantizer returns (:class:`BlockGrid`) rounds values to the nearest
code of the grid the group's values fixed: a ``[rows, 256]`` block by position, or one column ``[rows]`` with its
position in the block given as ``column=`` (the sub-block it belongs to decides its scale and min; iq4_nl and the
legacy types need none). Its ``positional`` attribute tells a caller it wants the position.

>>> import torch
>>> from mase_lite.numerics import quantize, bits_per_element
>>> w = torch.randn(4, 512)
>>> y = quantize(w, "q4_k")
>>> [bits_per_element(name) for name in ("q4_k", "iq4_nl", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0")]
[4.5, 4.5, 4.5, 5.0, 5.5, 6.0, 8.5]
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from mase_lite.numerics.registry import (
    Codec, FormatError, FormatParams, Shape, Unfit, check_tiles, register_format, register_mapping,
)

QK_K = 256
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
GROUP_MAX_EPS = 1e-15  # llama.cpp's threshold below which a group is all zero
F16_MAX = 65504.0
F16_TINY = 2.0**-24  # the smallest float16 subnormal
CHUNK = 1 << 18  # weights quantized at a time (keeps the search's buffers in cache)
REFINE_ROUNDS = 2
PLAIN_TRIALS = 65  # q4_0, q5_0, q8_0: trial steps searched per block
AFFINE_STEPS = 13  # q4_1, q5_1: trial steps (range / (0.75·qmax) .. range / (1.35·qmax)) searched per block ...
AFFINE_PHASES = 5  # ... each shifted against the block's ends in as many proportions


@dataclass(frozen=True)
class GGMLType:
    """The layout of one GGML type: ``block`` weights per block of ``type_size`` bytes, ``sub`` weights per
    sub-block scale, codes of ``code_bits`` bits (``offset``: the code of the integer 0 for signed grids),
    integer scales up to ``scale_max`` (``scale_min`` below zero for signed ones), with a min (``has_min``: the
    K-quants' ``dmin·m`` per sub-block; for a type without integer scales, q4_1 and q5_1, a float16 ``m`` per
    block, ``value = d·q + m``)."""

    name: str
    ggml: str
    block: int
    sub: int
    type_size: int
    code_bits: int
    offset: int = 0
    has_min: bool = False
    scale_min: int = 0
    scale_max: int = 0

    @property
    def subs(self) -> int:
        return self.block // self.sub

    @property
    def scaled(self) -> bool:
        """Whether a block stores integer sub-block scales (the K-quants; not iq4_nl or the legacy types)."""
        return self.scale_max > 0

    @property
    def block_min(self) -> bool:
        """Whether a block stores its min as a float16 ``m`` (q4_1, q5_1: ``value = d·q + m``)."""
        return self.has_min and not self.scaled

    @property
    def qmax(self) -> int:
        return (1 << self.code_bits) - 1 - self.offset

    @property
    def qmin(self) -> int:
        return -self.offset

    @property
    def bits(self) -> float:
        return self.type_size * 8 / self.block


TYPES: dict[str, GGMLType] = {
    "q2_k": GGMLType("q2_k", "Q2_K", QK_K, 16, 84, 2, has_min=True, scale_max=15),
    "q3_k": GGMLType("q3_k", "Q3_K", QK_K, 16, 110, 3, offset=4, scale_min=-32, scale_max=31),
    "q4_k": GGMLType("q4_k", "Q4_K", QK_K, 32, 144, 4, has_min=True, scale_max=63),
    "q5_k": GGMLType("q5_k", "Q5_K", QK_K, 32, 176, 5, has_min=True, scale_max=63),
    "q6_k": GGMLType("q6_k", "Q6_K", QK_K, 16, 210, 6, offset=32, scale_min=-128, scale_max=127),
    "iq4_nl": GGMLType("iq4_nl", "IQ4_NL", 32, 32, 18, 4),
    "q4_0": GGMLType("q4_0", "Q4_0", 32, 32, 18, 4, offset=8),
    "q4_1": GGMLType("q4_1", "Q4_1", 32, 32, 20, 4, has_min=True),
    "q5_0": GGMLType("q5_0", "Q5_0", 32, 32, 22, 5, offset=16),
    "q5_1": GGMLType("q5_1", "Q5_1", 32, 32, 24, 5, has_min=True),
    "q8_0": GGMLType("q8_0", "Q8_0", 32, 32, 34, 8, offset=128),
}
GGML_TYPE_NAMES = {t.name: t.ggml for t in TYPES.values()}  # format name -> GGMLQuantizationType name


class GGMLParams(FormatParams):
    """A GGML type has no parameters: its layout is fixed by llama.cpp."""


# Float helpers ----------------------------------------------------------------------------------------

def _f16(x: Tensor) -> Tensor:
    """float32 -> float16 (round to nearest even, saturating at ±65504, as the type can hold no more)."""
    return x.clamp(-F16_MAX, F16_MAX).to(torch.float16)


def _f32(v: float) -> float:
    return float(np.float32(v))


def _over(numerator: float, x: Tensor) -> Tensor:
    """``numerator / x`` rounded once, as C divides (torch computes ``number / tensor`` as ``(1 / x) · number``)."""
    return torch.full_like(x, numerator).div_(x)


def _safe(x: Tensor, bad: Tensor) -> Tensor:
    return torch.where(bad, torch.ones_like(x), x)


def _signed_extreme(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per row: the largest magnitude and the (first) value of that magnitude, with its sign."""
    index = x.abs().argmax(-1, keepdim=True)
    extreme = x.gather(-1, index).squeeze(-1)
    return extreme.abs(), extreme


# llama.cpp's searches, vectorized over groups (rows of ``x``) ---------------------------------------

def _qkx(x: Tensor, w: Tensor, nmax: int, rmin: float, rdelta: float, nstep: int, mad: bool) -> tuple[Tensor, Tensor]:
    """``make_qkx2_quants`` / ``make_qkx3_quants``: per group, a scale and a min (``value = scale·l - min``,
    ``l`` 0..nmax, min ≥ 0) fitted by weighted least squares on the codes of ``nstep + 1`` trial scales, each
    trial taken from the best min so far (as llama.cpp's loop does)."""
    low = x.amin(-1).clamp(max=0.0)
    high = x.amax(-1)
    flat = high <= low
    sum_w = w.sum(-1)
    sum_x = (w * x).sum(-1)

    def error(scale: Tensor, offset: Tensor, l: Tensor) -> Tensor:
        diff = scale[:, None] * l + offset[:, None] - x
        return (w * (diff.abs() if mad else diff.square())).sum(-1)

    def codes(factor: float, offset: Tensor) -> Tensor:
        span = high - offset
        iscale = torch.where(span > 0, _over(factor, _safe(span, span <= 0)), torch.zeros_like(span))
        return (iscale[:, None] * (x - offset[:, None])).round_().clamp_(0, nmax)

    span = _safe(high - low, flat)
    best_scale = _over(1, _over(nmax, span))
    best_min = low
    best = error(best_scale, best_min, codes(float(nmax), low))
    for step in range(nstep + 1):
        l = codes(_f32(np.float32(rmin) + np.float32(rdelta) * np.float32(step) + np.float32(nmax)), best_min)
        wl = w * l
        sum_l, sum_l2, sum_xl = wl.sum(-1), (wl * l).sum(-1), (wl * x).sum(-1)
        det = sum_w * sum_l2 - sum_l * sum_l
        live = det > 0
        det = _safe(det, ~live)
        scale = (sum_w * sum_xl - sum_x * sum_l) / det
        offset = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = offset > 0
        offset = torch.where(positive, torch.zeros_like(offset), offset)
        scale = torch.where(positive, sum_xl / _safe(sum_l2, sum_l2 == 0), scale)
        current = error(scale, offset, l)
        better = live & (current < best)
        best = torch.where(better, current, best)
        best_scale = torch.where(better, scale, best_scale)
        best_min = torch.where(better, offset, best_min)
    zero = torch.zeros_like(best_scale)
    return torch.where(flat, zero, best_scale), -torch.where(flat, low, best_min)


def _qx(x: Tensor, nmax: int, w: Tensor) -> tuple[Tensor, Tensor]:
    """``make_qx_quants`` (rmse_type 1): per group a signed scale and the codes ``l`` (-nmax..nmax-1) of the best
    of 19 trial scales around ``-nmax / max`` by weighted least squares."""
    amax, extreme = _signed_extreme(x)
    zero = amax < GROUP_MAX_EPS
    extreme = _safe(extreme, zero)

    def fit(iscale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        l = (iscale[:, None] * x).round_().clamp_(-nmax, nmax - 1)
        wl = w * l
        return l, (wl * x).sum(-1), (wl * l).sum(-1)

    levels, sumlx, suml2 = fit(_over(-nmax, extreme))
    scale = torch.where(suml2 != 0, sumlx / _safe(suml2, suml2 == 0), torch.zeros_like(sumlx))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        l, sumlx, suml2 = fit(_over(-_f32(np.float32(nmax) + np.float32(0.1) * np.float32(step)), extreme))
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        levels = torch.where(better[:, None], l, levels)
        scale = torch.where(better, sumlx / _safe(suml2, suml2 == 0), scale)
        best = torch.where(better, scale * sumlx, best)
    levels = torch.where(zero[:, None], torch.zeros_like(levels), levels)
    return torch.where(zero, torch.zeros_like(scale), scale), levels


def _q3(x: Tensor, nmax: int) -> Tensor:
    """``make_q3_quants`` (do_rmse): per group a signed scale, from codes -nmax..nmax-1 improved one at a time
    (five passes) under the ``x²``-weighted least-squares error."""
    amax, extreme = _signed_extreme(x)
    zero = amax < GROUP_MAX_EPS
    levels = (_over(-nmax, _safe(extreme, zero))[:, None] * x).round_().clamp_(-nmax, nmax - 1)
    w = x * x
    wx = w * x
    sumlx = (wx * levels).sum(-1)
    suml2 = (w * levels * levels).sum(-1)
    for _ in range(5):
        for i in range(x.shape[1]):
            xi, wi, wxi, li = x[:, i], w[:, i], wx[:, i], levels[:, i]
            slx = sumlx - wxi * li
            ok = slx > 0
            sl2 = suml2 - wi * li * li
            new = (xi * sl2 / _safe(slx, ~ok)).round_().clamp_(-nmax, nmax - 1)
            slx = slx + wxi * new
            sl2 = sl2 + wi * new * new
            accept = ok & (new != li) & (sl2 > 0) & (slx * slx * suml2 > sumlx * sumlx * sl2)
            levels[:, i] = torch.where(accept, new, li)
            sumlx = torch.where(accept, slx, sumlx)
            suml2 = torch.where(accept, sl2, suml2)
    scale = torch.where(suml2 > 0, sumlx / _safe(suml2, suml2 <= 0), torch.zeros_like(sumlx))
    return torch.where(zero, torch.zeros_like(scale), scale)


def _qp(x: Tensor, nmax: int, w: Tensor) -> tuple[Tensor, Tensor]:
    """``make_qp_quants``: per group of non-negative values (sub-block scales) a scale and codes 0..nmax,
    from 9 trial scales and five passes of one-at-a-time improvement under the ``w``-weighted error."""
    high = x.amax(-1).clamp(min=0.0)
    zero = high < GROUP_MAX_EPS
    high = _safe(high, zero)
    iscale = _over(nmax, high)
    levels = (iscale[:, None] * x).round_().clamp_(min=0)
    best = (w * (x - _over(1, iscale)[:, None] * levels).square()).sum(-1)
    for step in range(-4, 5):
        if step == 0:
            continue
        trial = _over(_f32(np.float32(0.1) * np.float32(step) + np.float32(nmax)), high)
        l = (trial[:, None] * x).round_().clamp_(0, nmax)
        mse = (w * (x - _over(1, trial)[:, None] * l).square()).sum(-1)
        better = mse < best
        best = torch.where(better, mse, best)
        iscale = torch.where(better, trial, iscale)
    levels = (iscale[:, None] * x).round_().clamp_(0, nmax)
    wx = w * x
    sumlx = (wx * levels).sum(-1)
    suml2 = (w * levels * levels).sum(-1)
    for _ in range(5):
        for i in range(x.shape[1]):
            xi, wi, wxi, li = x[:, i], w[:, i], wx[:, i], levels[:, i]
            slx = sumlx - wxi * li
            sl2 = suml2 - wi * li * li
            ok = (slx > 0) & (sl2 > 0)
            new = (xi * sl2 / _safe(slx, ~ok)).round_().clamp_(0, nmax)
            slx = slx + wxi * new
            sl2 = sl2 + wi * new * new
            accept = ok & (new != li) & (slx * slx * suml2 > sumlx * sumlx * sl2)
            levels[:, i] = torch.where(accept, new, li)
            sumlx = torch.where(accept, slx, sumlx)
            suml2 = torch.where(accept, sl2, suml2)
    scale = torch.where(suml2 > 0, sumlx / _safe(suml2, suml2 <= 0), torch.zeros_like(sumlx))
    levels = torch.where(zero[:, None], torch.zeros_like(levels), levels)
    return torch.where(zero, torch.zeros_like(scale), scale), levels


# The grid: stored scales -> per-sub-block float32 step and offset; nearest codes; values ------------

@dataclass
class _Grid:
    """Per block the stored side as integers/floats: ``d``/``dmin`` (float32 values of the float16 ones,
    ``[B]``), ``sc``/``m`` (integer scales and mins as float32, ``[B, subs]``)."""

    d: Tensor
    sc: Tensor
    dmin: Tensor | None = None
    m: Tensor | None = None

    def steps(self) -> tuple[Tensor, Tensor | None]:
        """Per sub-block (``[B, subs, 1]``): ``d·sc`` and ``dmin·m`` as float32 products (ggml's order)."""
        d1 = (self.d[:, None] * self.sc).unsqueeze(-1)
        m1 = (self.dmin[:, None] * self.m).unsqueeze(-1) if self.m is not None else None
        return d1, m1

    def select(self, other: "_Grid", take: Tensor) -> "_Grid":
        """Block by block: ``other`` where ``take`` (``[B]``), this grid elsewhere."""
        pick = lambda a, b: None if a is None else torch.where(take.reshape(-1, *([1] * (a.dim() - 1))), b, a)
        return _Grid(pick(self.d, other.d), pick(self.sc, other.sc), pick(self.dmin, other.dmin), pick(self.m, other.m))


def _grid_of(t: GGMLType, qb: _Quantized) -> _Grid:
    """The grid of stored blocks (not iq4_nl's); the legacy types have one sub-block of integer scale 1 (q4_1 and
    q5_1: of integer min 1 under ``dmin = -m``: ``d·q - (-m)``, which IEEE computes as ``d·q + m``)."""
    if t.block_min:
        ones = torch.ones(qb.d.shape[0], 1)
        return _Grid(qb.d.float(), ones, -qb.m.float(), ones)
    sc = qb.scales.float() if t.scaled else torch.ones(qb.d.shape[0], 1)
    return _Grid(qb.d.float(), sc, qb.dmin.float() if t.has_min else None, qb.mins.float() if t.has_min else None)


def _nearest(t: GGMLType, x: Tensor, d1: Tensor, m1: Tensor | None) -> Tensor:
    """The integer ``q`` (float32) of each weight of ``x`` (``[B, subs, sub]``) nearest on its sub-block's grid:
    ``round((x + m1) / d1)`` (``round(x / d1)`` without a min), clamped to the codes; 0 where ``d1`` is 0."""
    live = d1 != 0
    if t.scaled:
        shifted = x + m1 if m1 is not None else x
        q = (shifted / _safe(d1, ~live)).round_()
    elif m1 is None:  # q4_0, q5_0, q8_0: ``x / d`` in float64 is exact enough (a midpoint ``d·(q + ½)`` is a float32)
        q = (x.double() / _safe(d1, ~live).double()).round_().float()
    else:  # q4_1, q5_1
        q = _nearest_affine(t, x, d1, m1, live)
    q = q.clamp_(t.qmin, t.qmax).add_(0.0)  # +0.0, as a code decodes (not -0.0)
    return q.masked_fill_(~live.expand_as(q), 0.0) if not bool(live.all()) else q


def _nearest_affine(t: GGMLType, x: Tensor, d1: Tensor, m1: Tensor, live: Tensor) -> Tensor:
    """q4_1, q5_1: the code whose float32 value ``d·q + m`` (one rounding: not an exact grid) is nearest each weight.
    ``round((x - m) / d)`` in float64 is the nearest on the exact grid; the rounding of ``d·q + m`` moves a value by
    at most half a unit in its last place, so where the step ``d`` is above that unit only a weight that close to a
    midpoint between two codes may be nearer the neighbour (compared in float64); sub-blocks whose step is not above
    it compare all codes."""
    qmax = max(-t.qmin, t.qmax)
    step = _safe(d1, ~live).abs()
    slack = (m1.abs() + step * qmax) * 2.0**-22 / step  # two values' rounding, twice over, in steps
    exact = (x.double() + m1.double()) / _safe(d1, ~live).double()
    q = exact.round().clamp_(t.qmin, t.qmax)
    near = ((exact - q).abs_() - 0.5).abs_() <= slack
    q = q.float()
    coarse = live & (slack >= 0.25)  # [B, subs, 1]
    near &= ~coarse
    if bool(near.any()):  # the nearer of the code and its neighbours, in float64
        where = near.nonzero(as_tuple=True)
        xs, ds, ms, qs = x[where].double(), d1.expand_as(x)[where], m1.expand_as(x)[where], q[where]

        def distance(code: Tensor) -> Tensor:
            return (xs - _values(code, ds, ms).double()).abs_()

        gap = distance(qs)
        for shift in (1.0, -1.0):
            other = (qs + shift).clamp_(t.qmin, t.qmax)
            other_gap = distance(other)
            closer = other_gap < gap
            qs = torch.where(closer, other, qs)
            gap = torch.where(closer, other_gap, gap)
        q[where] = qs
    if bool(coarse.any()):  # all codes of these sub-blocks
        where = coarse.squeeze(-1).nonzero(as_tuple=True)
        codes = torch.arange(t.qmin, t.qmax + 1, dtype=torch.float32)
        d, m = d1[where][:, :, None], m1[where][:, :, None]  # [n, 1, 1]
        gaps = (x[where].double()[:, :, None] - _values(codes, d, m).double()).abs_()  # [n, sub, codes]
        q[where] = codes[gaps.argmin(-1)]
    return q


def _values(q: Tensor, d1: Tensor, m1: Tensor | None) -> Tensor:
    v = d1 * q
    return v - m1 if m1 is not None else v


_IQ4_VALUES = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32)
_IQ4_MIDPOINTS = torch.tensor([KVALUES_IQ4NL[j - 1] + KVALUES_IQ4NL[j] for j in range(1, 16)], dtype=torch.float32)
_IQ4_ZERO = 8  # the index decoded for a block whose scale is zero: kvalue 1, so +0.0


_IQ4_LOW, _IQ4_HIGH = int(_IQ4_MIDPOINTS[0]) - 1, int(_IQ4_MIDPOINTS[-1])
_IQ4_TABLE = torch.searchsorted(_IQ4_MIDPOINTS, torch.arange(_IQ4_LOW, _IQ4_HIGH + 1, dtype=torch.float32), right=True)


def _iq4_index(scaled: Tensor) -> Tensor:
    """``best_index_int8``: the index of the table value nearest ``scaled`` (a midpoint goes up). The midpoints
    ``2·scaled`` is compared with are integers, so ``floor(2·scaled)`` decides: a look-up."""
    twice = (scaled + scaled).floor_().clamp_(_IQ4_LOW, _IQ4_HIGH).sub_(_IQ4_LOW)
    return _IQ4_TABLE[twice.to(torch.int64)]


def _iq4_nearest(x: Tensor, d: Tensor) -> Tensor:
    """Per weight of ``x`` (``[B, 32]``) the index nearest ``x / d`` (``d``: float32 of the float16 scale, ``[B]``)."""
    live = d != 0
    index = _iq4_index(x / _safe(d, ~live)[:, None])
    return index.masked_fill_(~live[:, None], _IQ4_ZERO)


# Candidate scales of each K-quant ---------------------------------------------------------------------

def _quantize_scales(t: GGMLType, scales: Tensor, top: Tensor, levels: int) -> tuple[Tensor, Tensor]:
    """The reference's quantization of non-negative sub-block scales (``[B, subs]``): ``d = top / levels`` in
    float16 and ``sc = round(levels / top · scale)`` clamped to ``0..levels``."""
    inverse = torch.where(top > 0, _over(levels, _safe(top, top <= 0)), torch.zeros_like(top))
    codes = (inverse[:, None] * scales).round_().clamp_(0, levels)
    return _f16(top / levels).float(), codes


def _against_stored(scales: Tensor, d: Tensor, top: Tensor, low: int, high: int) -> tuple[Tensor, Tensor]:
    """Sub-block ``scales`` rounded against the stored ``d`` itself (raised to float16's smallest subnormal
    where the reference's ``d`` underflowed to zero)."""
    d = torch.where((d == 0) & (top != 0), torch.full_like(d, F16_TINY) * torch.sign(top), d)
    ratio = scales / _safe(d, d == 0)[:, None]
    codes = ratio.round().copysign_(ratio)  # a non-zero scale keeps a non-zero code: at least ±1
    codes = torch.where((ratio != 0) & (codes == 0), torch.sign(ratio), codes).clamp_(low, high)
    return d, codes.masked_fill_((d == 0)[:, None], 0.0)


def _min_candidates(t: GGMLType, x: Tensor, ew: Tensor, importance: bool) -> list[_Grid]:
    """q2_k, q4_k, q5_k: llama.cpp's reference scales, its importance-path scales and the reference's scales
    rounded against the stored ``d``/``dmin``."""
    blocks = x.shape[0]
    sub = x.reshape(-1, t.sub)
    nmax = t.qmax
    levels = t.scale_max
    if t.name == "q2_k":
        ref_scale, ref_min = _qkx(sub, sub.abs(), nmax, -0.5, 0.1, 15, True)
    else:
        average = sub.square().mean(-1, keepdim=True).sqrt_()
        rmin, nstep = (-1.0, 20) if t.name == "q4_k" else (-0.5, 15)
        ref_scale, ref_min = _qkx(sub, average + sub.abs(), nmax, rmin, 0.1, nstep, False)
    ref_scale, ref_min = ref_scale.reshape(blocks, t.subs), ref_min.reshape(blocks, t.subs)
    top_scale = ref_scale.amax(-1).clamp(min=0.0)
    top_min = ref_min.amax(-1).clamp(min=0.0)
    d, sc = _quantize_scales(t, ref_scale, top_scale, levels)
    dmin, m = _quantize_scales(t, ref_min, top_min, levels)
    reference = _Grid(d, sc, dmin, m)
    d2, sc2 = _against_stored(ref_scale, d, top_scale, 0, levels)
    dmin2, m2 = _against_stored(ref_min, dmin, top_min, 0, levels)
    stored = _Grid(d2, sc2, dmin2, m2)
    # the importance path (quantize_row_qX_K_impl), its importance ``ew`` (1 without one)
    sigma2 = x.reshape(blocks, -1).square().sum(-1) * (1.0 if t.name == "q2_k" else 2.0) / t.block
    flat = x.reshape(blocks, -1)
    if t.name != "q2_k" and not importance:  # llama.cpp's weights where it has no importance matrix
        weight = sigma2.sqrt()[:, None] + flat.abs()
    else:  # q2_k has no such path: an importance of ones
        weight = ew.reshape(blocks, -1) * (sigma2[:, None] + flat.square()).sqrt()
    weight = weight.reshape(-1, t.sub)
    imp_scale, imp_min = _qkx(sub, weight, nmax, -0.9, 0.05, 36, False)
    sw = weight.sum(-1).reshape(blocks, t.subs)
    d_block, sc3 = _qp(imp_scale.reshape(blocks, t.subs), levels, sw)
    m_block, m3 = _qp(imp_min.reshape(blocks, t.subs), levels, sw)
    important = _Grid(_f16(d_block).float(), sc3, _f16(m_block).float(), m3)
    return [reference, stored, important]


def _signed_candidates(t: GGMLType, x: Tensor, ew: Tensor, importance: bool) -> list[_Grid]:
    """q3_k, q6_k: llama.cpp's reference scales, the ``make_qx_quants`` quantization of the sub-block scales
    (its importance path) and the reference's scales rounded against the stored ``d``."""
    blocks = x.shape[0]
    sub = x.reshape(-1, t.sub)
    half = -t.scale_min  # 32 or 128
    if t.name == "q3_k":
        scales = _q3(sub, -t.qmin)
    else:
        scales, _ = _qx(sub, -t.qmin, sub * sub)
    scales = scales.reshape(blocks, t.subs)
    amax, extreme = _signed_extreme(scales)
    zero = amax < GROUP_MAX_EPS if t.name == "q6_k" else amax == 0  # as each reference tests it
    extreme = _safe(extreme, zero)
    iscale = _over(-half, extreme)
    d = _f16(_over(1, iscale)).float().masked_fill_(zero, 0.0)
    sc = (iscale[:, None] * scales).round_().clamp_(t.scale_min, t.scale_max).masked_fill_(zero[:, None], 0.0)
    reference = _Grid(d, sc)
    d2, sc2 = _against_stored(scales, d, -extreme.masked_fill(zero, 0.0), t.scale_min, t.scale_max)
    stored = _Grid(d2, sc2)
    # the importance path (quantize_row_qX_K_impl): make_qx_quants of the sub-block scales, weighted by each
    # sub-block's Σ w (w = x² without an importance; with one, q3_k's ew·sqrt(σ² + x²), q6_k's ew)
    if not importance:
        weight = sub * sub
    elif t.name == "q3_k":
        sigma2 = x.reshape(blocks, -1).square().sum(-1) * 2.0 / t.block
        weight = ew.reshape(blocks, -1) * (sigma2[:, None] + x.reshape(blocks, -1).square()).sqrt()
        weight = weight.reshape(-1, t.sub)
    else:
        weight = ew.reshape(-1, t.sub)
    imp_scales = scales if t.name == "q6_k" and not importance else _qx(sub, -t.qmin, weight)[0].reshape(blocks, t.subs)
    d_block, levels = _qx(imp_scales, half, weight.sum(-1).reshape(blocks, t.subs))
    important = _Grid(_f16(d_block).float(), levels)
    return [reference, stored, important]


def _errors(t: GGMLType, x: Tensor, ew: Tensor, grid: _Grid) -> Tensor:
    """Per sub-block (``[B, subs]``) the ``ew``-weighted squared error of the nearest codes under ``grid``."""
    d1, m1 = grid.steps()
    v = _values(_nearest(t, x, d1, m1), d1, m1)
    return (ew * (x - v).square_()).sum(-1)


def _refine(t: GGMLType, x: Tensor, ew: Tensor, grid: _Grid, error: Tensor) -> _Grid:
    """With ``d``/``dmin`` fixed, each sub-block's integer scale (and min) moved to the best of: its weighted
    least-squares refit on its current codes, and ±1 steps."""
    keep_zero = x.amin(-1) == 0  # [B, subs]: non-negative with a zero: its min stays 0, so its zeros stay zeros
    for _ in range(REFINE_ROUNDS):
        d1, m1 = grid.steps()
        q = _nearest(t, x, d1, m1)
        sw, sq, sq2 = ew.sum(-1), (ew * q).sum(-1), (ew * q * q).sum(-1)
        sx, sqx = (ew * x).sum(-1), (ew * q * x).sum(-1)
        d = grid.d[:, None]
        live_d = d != 0
        candidates: list[tuple[Tensor, Tensor | None]] = []
        if t.has_min:
            det = sw * sq2 - sq * sq
            ok = det > 0
            det = _safe(det, ~ok)
            scale = (sw * sqx - sq * sx) / det
            offset = (sq * sqx - sq2 * sx) / det
            clamp0 = offset < 0
            offset = torch.where(clamp0, torch.zeros_like(offset), offset)
            scale = torch.where(clamp0, sqx / _safe(sq2, sq2 == 0), scale)
            dmin = grid.dmin[:, None]
            live_m = dmin != 0
            fit_sc = torch.where(ok & live_d, (scale / _safe(d, ~live_d)).round(), grid.sc)
            fit_m = torch.where(ok & live_m, (offset / _safe(dmin, ~live_m)).round(), grid.m)
            candidates += [(fit_sc, fit_m), (grid.sc + 1, grid.m), (grid.sc - 1, grid.m),
                           (grid.sc, grid.m + 1), (grid.sc, grid.m - 1)]
        else:
            ok = sq2 > 0
            scale = sqx / _safe(sq2, ~ok)
            fit_sc = torch.where(ok & live_d, (scale / _safe(d, ~live_d)).round(), grid.sc)
            candidates += [(fit_sc, None), (grid.sc + 1, None), (grid.sc - 1, None)]
        for sc, m in candidates:
            sc = sc.clamp(t.scale_min, t.scale_max)
            if m is not None:
                m = m.clamp(0, t.scale_max).masked_fill_(keep_zero | (grid.dmin[:, None] == 0), 0.0)
            trial = _Grid(grid.d, sc, grid.dmin, m)
            trial_error = _errors(t, x, ew, trial)
            better = trial_error < error
            error = torch.where(better, trial_error, error)
            grid = _Grid(grid.d, torch.where(better, sc, grid.sc), grid.dmin,
                         torch.where(better, m, grid.m) if m is not None else None)
    return grid


def _refit(t: GGMLType, x: Tensor, ew: Tensor, grid: _Grid) -> _Grid:
    """New ``d``/``dmin`` and integer scales from the least-squares scale (and min) of each sub-block's current
    codes, quantized as llama.cpp quantizes sub-block scales with an importance (``make_qp_quants``, weighted by
    how much each sub-block's error grows with its scale; ``make_qx_quants`` for signed scales)."""
    d1, m1 = grid.steps()
    q = _nearest(t, x, d1, m1)
    sw, sq, sq2 = ew.sum(-1), (ew * q).sum(-1), (ew * q * q).sum(-1)
    sx, sqx = (ew * x).sum(-1), (ew * q * x).sum(-1)
    if not t.has_min:
        d, levels = _qx(sqx / _safe(sq2, sq2 <= 0), -t.scale_min, sq2)
        return _Grid(_f16(d).float(), levels)
    det = sw * sq2 - sq * sq
    ok = det > 0
    det = _safe(det, ~ok)
    zero = torch.zeros_like(det)
    scale = torch.where(ok, (sw * sqx - sq * sx) / det, zero).clamp_(min=0.0)
    offset = torch.where(ok, (sq * sqx - sq2 * sx) / det, zero).clamp_(min=0.0)
    d, sc = _qp(scale, t.scale_max, sq2)
    dmin, m = _qp(offset, t.scale_max, sw)
    return _Grid(_f16(d).float(), sc, _f16(dmin).float(), m)


def _search_k(t: GGMLType, blocks: Tensor, ew: Tensor | None) -> _Grid:
    """The stored scales of each K-quant block (``[B, 256]`` float32, finite, saturated)."""
    x = blocks.reshape(-1, t.subs, t.sub)
    importance = ew is not None
    ew = torch.ones_like(x) if ew is None else ew.reshape(x.shape)
    keep_zero = x.amin(-1) == 0  # a sub-block of non-negative weights holding a zero keeps it: min 0
    best, best_error = None, None

    def consider(grid: _Grid) -> None:
        nonlocal best, best_error
        if t.has_min:
            grid.m = grid.m.masked_fill(keep_zero, 0.0)
        error = _errors(t, x, ew, grid)
        if best is None:
            best, best_error = grid, error
            return
        take = error.sum(-1) < best_error.sum(-1)
        best = best.select(grid, take)
        best_error = torch.where(take[:, None], error, best_error)

    for grid in (_min_candidates if t.has_min else _signed_candidates)(t, x, ew, importance):
        consider(grid)
    best = _refine(t, x, ew, best, best_error)
    best_error = _errors(t, x, ew, best)
    refit = _refit(t, x, ew, best)
    if t.has_min:
        refit.m = refit.m.masked_fill(keep_zero, 0.0)
    consider(_refine(t, x, ew, refit, _errors(t, x, ew, refit)))
    return best


def _search_iq4(blocks: Tensor, ew: Tensor | None) -> Tensor:
    """The float32 value of the float16 scale of each iq4_nl block (``[B, 32]``).

    Candidates: llama.cpp's reference scale (the ``x²``-weighted least-squares scale of the codes of
    ``-127 / max``), ``llama-quantize``'s (``ntry = 7``: from the codes of ``127 / max``, the best of the trials
    ``(itry - 127) / max`` by its weighted criterion), and the ``ew``-weighted least-squares scales of the codes
    of the trials ``(itry - 127) / max`` and ``(itry + 113) / max``; each with the nearest codes under its float16
    value, the least error kept."""
    x = blocks
    ew = torch.ones_like(x) if ew is None else ew
    amax, extreme = _signed_extreme(x)
    zero = amax < GROUP_MAX_EPS
    extreme = _safe(extreme, zero)
    table = _IQ4_VALUES
    weight = x * x  # llama.cpp's weights without an importance matrix

    def trial(inverse: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The codes of ``x · inverse``: llama.cpp's sums (weighted by ``x²``), its scale, and the
        ``ew``-weighted least-squares scale with the error it removes, ``(Σ ew q x)² / Σ ew q²``."""
        q = table[_iq4_index(inverse[:, None] * x)]
        wq, eq = weight * q, ew * q
        sumqx, sumq2 = (wq * x).sum(-1), (wq * q).sum(-1)
        eqx, eq2 = (eq * x).sum(-1), (eq * q).sum(-1)
        plain = eqx / _safe(eq2, eq2 <= 0)
        return sumqx, sumq2, sumqx / _safe(sumq2, sumq2 <= 0), plain, plain * eqx

    tiny = torch.full_like(extreme, F16_TINY)
    candidates: list[Tensor] = [tiny, -tiny]  # for blocks whose scale would underflow float16
    sumqx, sumq2, llama_d, _, _ = trial(_over(-KVALUES_IQ4NL[0], extreme))  # llama-quantize's first codes: 127 / max
    llama_best = llama_d * sumqx
    plain_d, plain_best = None, None  # the least-squares scale of the trial codes that fit best
    for itry in range(-7, 8):
        for end in (KVALUES_IQ4NL[0], KVALUES_IQ4NL[-1]):
            sumqx, sumq2, d, plain, fit = trial(_over(itry + end, extreme))
            if plain_d is None:
                plain_d, plain_best = plain, fit
            else:
                better = fit > plain_best
                plain_d = torch.where(better, plain, plain_d)
                plain_best = torch.where(better, fit, plain_best)
            if end > 0:
                continue
            if itry == 0:
                candidates.append(d)  # llama.cpp's reference (quantize_row_iq4_nl_ref)
            better = (sumq2 > 0) & (sumqx * sumqx > llama_best * sumq2)
            llama_d = torch.where(better, d, llama_d)
            llama_best = torch.where(better, d * sumqx, llama_best)
    candidates += [llama_d, plain_d]
    best_scale, best_error = None, None
    for d in candidates:
        d = _f16(torch.where(zero, torch.zeros_like(d), d)).float()
        error = (ew * (x - d[:, None] * table[_iq4_nearest(x, d)]).square()).sum(-1)
        if best_scale is None:
            best_scale, best_error = d, error
            continue
        better = error < best_error
        best_scale = torch.where(better, d, best_scale)
        best_error = torch.where(better, error, best_error)
    for _ in range(REFINE_ROUNDS):  # the least-squares scale of the nearest codes under the best one
        q = table[_iq4_nearest(x, best_scale)]
        eq = ew * q
        eq2 = (eq * q).sum(-1)
        d = _f16(torch.where(zero | (eq2 <= 0), best_scale, (eq * x).sum(-1) / _safe(eq2, eq2 <= 0))).float()
        error = (ew * (x - d[:, None] * table[_iq4_nearest(x, d)]).square()).sum(-1)
        better = error < best_error
        best_scale = torch.where(better, d, best_scale)
        best_error = torch.where(better, error, best_error)
    return best_scale


def _search_plain(t: GGMLType, blocks: Tensor, ew: Tensor | None) -> _Grid:
    """The stored step ``d`` (and min ``m``) of each block of a legacy type (``[B, 32]``), as a grid of one sub-block
    of scale 1 (q4_1, q5_1: and of min 1 under ``dmin = -m``).

    Candidates of q4_0, q5_0, q8_0: llama.cpp's reference scales (q4_0's ``max / -8`` and q5_0's ``max / -16``, the
    signed extreme on the lowest code; q8_0's ``amax / 127``) and the signed extreme on the top code (``max /
    qmax``); the scales of ``make_qx_quants`` (nmax 8 for q4_0 and 16 for q5_0, as their importance paths
    ``quantize_row_q4_0_impl`` / ``q5_0_impl`` run it; 128 for q8_0) weighted by ``x²`` and by ``ew·sqrt(σ² + x²)``
    (σ²: the block's mean square, where llama.cpp takes the row's); the ``ew``-weighted least-squares scales of the
    codes of ``PLAIN_TRIALS`` trial steps ``max / (qmin·r)``, r 0.7 .. 1.1; float16's smallest steps.

    Candidates of q4_1, q5_1: llama.cpp's reference (``d = (max - min) / qmax``, ``m = min``), the step from the
    stored float16 min (``(max - m) / qmax``) and from the stored max down (``m = max``, ``d = (min - m) / qmax <
    0``), float16's smallest step from either end; ``make_qkx3_quants`` (as ``quantize_row_q4_1_impl`` /
    ``q5_1_impl`` run it: nmax 15 / 31, rmin -0.9, rdelta 0.05, 36 steps, weighted by ``ew·sqrt(σ² + x²)``, and by
    ``ew``); the ``ew``-weighted least-squares ``(d, m)`` of the codes of ``AFFINE_STEPS`` trial steps ``(max -
    min) / (qmax·s)``, s 0.75 .. 1.35 (s > 1 clips the ends, s < 1 leaves codes unused: with 32 weights a coarser
    step may meet them better), each shifted in ``AFFINE_PHASES`` proportions from the bottom on code 0 to the top
    on code qmax. A block of non-negative weights holding a zero keeps ``m = 0`` (its zeros stay zeros; the
    reference's ``m = min`` is 0 too).

    Each is taken as float16 with the nearest codes under it (the exact nearest: ties to even on an exact grid, the
    nearest float32 value ``d·q + m`` with a min) and the least ``ew``-weighted error (summed in float64) kept;
    then, ``REFINE_ROUNDS`` times, the least-squares scale (and min) of the kept codes where it lowers the error.
    llama.cpp's reference stores its codes under the same float16 ``d`` (and ``m``), so no block's error is above
    the reference's."""
    x = blocks[:, None]  # [B, 1, 32]: one sub-block
    ew = torch.ones_like(x) if ew is None else ew.reshape(x.shape)
    amax, extreme = _signed_extreme(blocks)
    zero = amax == 0
    ones = torch.ones_like(amax)[:, None]
    keep_zero = blocks.amin(-1) == 0  # with a min: non-negative weights holding a zero keep m = 0
    sigma2 = blocks.square().mean(-1, keepdim=True)
    importance = ew[:, 0] * (sigma2 + blocks.square()).sqrt()  # llama.cpp's weights of its importance paths

    def stored(d: Tensor, m: Tensor | None = None) -> _Grid:
        """The grid of ``d`` (and ``m``) rounded to float16."""
        d = _f16(d.masked_fill(zero, 0.0)).float()
        if not t.has_min:
            return _Grid(d, ones)
        m = _f16(m.masked_fill(zero | keep_zero, 0.0)).float()
        return _Grid(d, ones, -m, ones)

    def codes(grid: _Grid) -> Tensor:
        d1, m1 = grid.steps()
        return _nearest(t, x, d1, m1)

    def error(grid: _Grid) -> Tensor:
        d1, m1 = grid.steps()
        v = _values(_nearest(t, x, d1, m1), d1, m1)
        return (ew.double() * (x.double() - v.double()).square()).sum((-2, -1))

    if t.has_min:
        def fit(q: Tensor) -> _Grid:
            """The ``ew``-weighted least-squares ``d`` and ``m`` of codes ``q`` (``[B, 1, 32]``; m 0 where kept)."""
            w, q, xx = ew.double(), q.double(), x.double()
            sw, sq, sq2 = w.sum((-2, -1)), (w * q).sum((-2, -1)), (w * q * q).sum((-2, -1))
            sx, sqx = (w * xx).sum((-2, -1)), (w * q * xx).sum((-2, -1))
            det = sw * sq2 - sq * sq
            ok = det > sw * sq2 * 1e-12
            det = _safe(det, ~ok)
            d = torch.where(ok, (sw * sqx - sq * sx) / det, torch.zeros_like(det))
            m = torch.where(ok, (sq2 * sx - sq * sqx) / det, sx / _safe(sw, sw <= 0))
            through_zero = torch.where(sq2 > 0, sqx / _safe(sq2, sq2 <= 0), torch.zeros_like(sq2))
            return stored(torch.where(keep_zero, through_zero, d), m)

        least_squares = lambda grid: fit(codes(grid))  # noqa: E731
        low, high = blocks.amin(-1), blocks.amax(-1)
        span = high - low
        tiny = torch.full_like(span, F16_TINY)  # for blocks whose step would underflow float16
        candidates = [stored(span / t.qmax, low),  # llama.cpp's reference
                      stored((high - _f16(low).float()) / t.qmax, low),
                      stored((low - _f16(high).float()) / t.qmax, high), stored(tiny, low), stored(-tiny, high)]
        for weight in (importance, ew[:, 0]):
            scale, negative_min = _qkx(blocks, weight, t.qmax, -0.9, 0.05, 36, False)
            candidates.append(stored(scale, -negative_min))
        inverse = torch.where(span > 0, _over(t.qmax, _safe(span, span <= 0)), torch.zeros_like(span))
        position = (blocks - low[:, None])[:, None]  # [B, 1, 32]
        for i in range(AFFINE_STEPS):
            stretch = 0.75 + 0.6 * i / (AFFINE_STEPS - 1)
            scaled = position * (inverse * stretch)[:, None, None]
            for j in range(AFFINE_PHASES):  # from the bottom on code 0 to the top on code qmax
                shift = (stretch - 1) * t.qmax * j / (AFFINE_PHASES - 1)
                candidates.append(fit((scaled - shift).round_().clamp_(0, t.qmax)))
    else:
        def least_squares_d(d: Tensor) -> Tensor:
            q = codes(stored(d))
            eq = ew * q
            eq2 = (eq * q).sum((-2, -1))
            return torch.where(eq2 > 0, (eq * x).sum((-2, -1)) / _safe(eq2, eq2 <= 0), torch.zeros_like(eq2))

        least_squares = lambda grid: stored(least_squares_d(grid.d))  # noqa: E731
        nmax = -t.qmin
        tiny = torch.full_like(extreme, F16_TINY)
        steps = [extreme / t.qmin, amax / t.qmax, extreme / t.qmax, tiny, -tiny, _qx(blocks, nmax, blocks.square())[0],
                 _qx(blocks, nmax, importance)[0]]
        safe = _safe(extreme, zero)
        steps += [least_squares_d(safe / (t.qmin * (0.7 + 0.4 * k / (PLAIN_TRIALS - 1)))) for k in range(PLAIN_TRIALS)]
        candidates = [stored(d) for d in steps]
    best, best_error = None, None
    for i in range(len(candidates) + REFINE_ROUNDS):
        grid = candidates[i] if i < len(candidates) else least_squares(best)
        grid_error = error(grid)
        if best is None:
            best, best_error = grid, grid_error
            continue
        better = grid_error < best_error
        best = best.select(grid, better)
        best_error = torch.where(better, grid_error, best_error)
    return best


# The format: checks, chunks, values, codes --------------------------------------------------------

def _largest(t: GGMLType) -> float:
    """A magnitude no value of the type exceeds (weights beyond it saturate)."""
    if t.name == "iq4_nl":
        return F16_MAX * 127
    if t.block_min:  # |d·q + m| ≤ 65504·qmax + 65504 (d < 0 reaches as far down)
        return F16_MAX * (t.qmax + 1)
    return F16_MAX * (max(abs(t.scale_min), t.scale_max) if t.scaled else 1) * max(abs(t.qmin), t.qmax)


def _checked_rows(x: Tensor, t: GGMLType) -> Tensor:
    """``x`` (float32) as ``[blocks, block]``: its rows cut in blocks; a FormatError for rows that are not a
    multiple of the block or NaN; ±Inf and huge magnitudes saturated."""
    if x.dim() == 0 or x.shape[-1] % t.block:
        got = f"rows of {x.shape[-1]}" if x.dim() else "a 0-d tensor"
        raise FormatError(f"format '{t.name}' ({t.ggml}) quantizes rows (the last dimension) of a multiple of "
                          f"{t.block} weights; got {got}")
    if bool(torch.isnan(x).any()):
        raise FormatError(f"format '{t.name}': the tensor holds NaN, which {t.ggml} cannot store")
    limit = _largest(t)
    x = x.clamp(-limit, limit)
    return x.reshape(-1, t.block)


@dataclass
class _Quantized:
    """A tensor's blocks as the type stores them: codes (int64 ``[B, block]``) and the side per block."""

    codes: Tensor
    d: Tensor  # float16 [B]
    dmin: Tensor | None = None  # float16 [B]
    scales: Tensor | None = None  # [B, subs] uint8 / int8
    mins: Tensor | None = None  # [B, subs] uint8
    m: Tensor | None = None  # float16 [B]: q4_1's and q5_1's min


def _quantize_blocks(t: GGMLType, blocks: Tensor, ew: Tensor | None = None) -> _Quantized:
    """Search and codes of ``[B, block]`` float32 blocks, ``CHUNK`` blocks at a time."""
    parts: list[_Quantized] = []
    step = max(CHUNK // t.block, 1)
    for start in range(0, blocks.shape[0], step):
        chunk = blocks[start : start + step]
        weights = ew[start : start + step] if ew is not None else None
        if not bool(chunk.any()):  # zeros: zero scales, the codes of +0.0
            parts.append(_empty(t, chunk.shape[0]))
            continue
        if t.name == "iq4_nl":
            d = _search_iq4(chunk, weights)
            parts.append(_Quantized(_iq4_nearest(chunk, d), d.to(torch.float16)))
            continue
        grid = _search_k(t, chunk, weights) if t.scaled else _search_plain(t, chunk, weights)
        x = chunk.reshape(-1, t.subs, t.sub)
        d1, m1 = grid.steps()
        q = _nearest(t, x, d1, m1)
        codes = (q + t.offset).to(torch.int64).reshape(chunk.shape)
        int_dtype = torch.int8 if t.scale_min < 0 else torch.uint8
        if t.block_min:  # the grid's dmin is -m
            parts.append(_Quantized(codes, grid.d.to(torch.float16), m=grid.dmin.neg().to(torch.float16)))
            continue
        parts.append(_Quantized(codes, grid.d.to(torch.float16), grid.dmin.to(torch.float16) if t.has_min else None,
                                grid.sc.to(int_dtype) if t.scaled else None,
                                grid.m.to(torch.uint8) if t.has_min else None))
    if not parts:
        return _empty(t, 0)
    cat = lambda name: None if getattr(parts[0], name) is None else torch.cat([getattr(p, name) for p in parts])
    return _Quantized(cat("codes"), cat("d"), cat("dmin"), cat("scales"), cat("mins"), cat("m"))


def _empty(t: GGMLType, blocks: int) -> _Quantized:
    """``blocks`` blocks of zeros: zero scales and the code of +0.0 (the integer 0; iq4_nl's table value 1)."""
    int_dtype = torch.int8 if t.scale_min < 0 else torch.uint8
    zero_code = _IQ4_ZERO if t.name == "iq4_nl" else t.offset
    return _Quantized(torch.full((blocks, t.block), zero_code, dtype=torch.int64), torch.zeros(blocks, dtype=torch.float16),
                      torch.zeros(blocks, dtype=torch.float16) if t.has_min and t.scaled else None,
                      torch.zeros(blocks, t.subs, dtype=int_dtype) if t.scaled else None,
                      torch.zeros(blocks, t.subs, dtype=torch.uint8) if t.has_min and t.scaled else None,
                      torch.zeros(blocks, dtype=torch.float16) if t.block_min else None)


def _decode_blocks(t: GGMLType, qb: _Quantized) -> Tensor:
    """The float32 values (``[B, block]``) of blocks, in ``gguf``'s float32 order of operations."""
    d = qb.d.float()
    if t.name == "iq4_nl":
        return d[:, None] * _IQ4_VALUES[qb.codes]
    d1, m1 = _grid_of(t, qb).steps()
    q = (qb.codes - t.offset).float().reshape(-1, t.subs, t.sub)
    return _values(q, d1, m1).reshape(qb.codes.shape)


def _side_of(t: GGMLType, qb: _Quantized, shape: torch.Size) -> dict[str, Tensor]:
    """The side tensors shaped by the tensor's rows: ``d``/``dmin``/``m`` ``[*rows, n_blocks]``, ``scales``/``mins``
    ``[*rows, n_blocks * subs]`` (a rank-1 tensor is one row: ``[n_blocks]``)."""
    lead = tuple(shape[:-1])
    per_row = shape[-1] // t.block
    side = {"d": qb.d.reshape(*lead, per_row)}
    if t.block_min:
        side["m"] = qb.m.reshape(*lead, per_row)
        return side
    if t.has_min:
        side["dmin"] = qb.dmin.reshape(*lead, per_row)
    if t.scaled:
        side["scales"] = qb.scales.reshape(*lead, per_row * t.subs)
    if t.has_min:
        side["mins"] = qb.mins.reshape(*lead, per_row * t.subs)
    return side


def _side_keys(t: GGMLType) -> tuple[str, ...]:
    if t.block_min:
        return ("d", "m")
    minimum = ("dmin",) if t.has_min else ()
    return ("d", *minimum) + (("scales",) if t.scaled else ()) + (("mins",) if t.has_min else ())


def _from_side(t: GGMLType, codes: Tensor | None, side: dict[str, Tensor]) -> _Quantized:
    missing = [key for key in _side_keys(t) if key not in side]
    if missing:
        held = ", ".join(side) or "nothing"
        raise FormatError(f"format '{t.name}': the side lacks {', '.join(missing)} (it holds {held})")
    blocks = side["d"].numel()
    get = lambda key, *tail: side[key].reshape(blocks, *tail) if key in side else None
    return _Quantized(codes.reshape(blocks, t.block) if codes is not None else None, get("d"), get("dmin"),
                      get("scales", t.subs), get("mins", t.subs), get("m"))


_LAST: list[Any] = [None]  # the last search: (tensor ref, version, name, codes as uint8, side)


def _remembered(x: Tensor, name: str) -> tuple[Tensor, dict[str, Tensor]] | None:
    """The last result, where ``x`` is the very tensor it was searched for, unchanged since (a format's values
    and its codec's side are asked for the same tensor one after the other)."""
    last = _LAST[0]
    if last is None or last[0]() is not x or last[1] != x._version or last[2] != name:
        return None
    return last[3].to(torch.int64), dict(last[4])


def ggml_quantize(x: Tensor, name: str, importance: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """``x`` (float tensor, rows a multiple of the block) in GGML type ``name``: its codes (int64, ``x``'s shape)
    and side tensors. ``importance``: a weight per column (``[x.shape[-1]]``) for the error the scales are
    chosen by (llama.cpp's importance matrix); None: plain squared error."""
    t = _type(name)
    if importance is None and (known := _remembered(x, name)) is not None:
        return known
    x32 = x.detach().to(torch.float32)
    blocks = _checked_rows(x32, t)
    ew = None
    if importance is not None:
        if importance.shape != (x.shape[-1],) or not bool(torch.isfinite(importance).all()) or bool((importance < 0).any()):
            raise FormatError(f"format '{name}': importance must be {x.shape[-1]} finite non-negative weights")
        ew = importance.to(torch.float32).expand(x32.shape).reshape(blocks.shape)
    qb = _quantize_blocks(t, blocks, ew)
    codes, side = qb.codes.reshape(x.shape), _side_of(t, qb, x.shape)
    if importance is None and not x.requires_grad:
        _LAST[0] = (weakref.ref(x), x._version, name, codes.to(torch.uint8), dict(side))
    return codes, side


def ggml_values(codes: Tensor, side: dict[str, Tensor], name: str) -> Tensor:
    """The float32 values of codes and side (as :func:`ggml_quantize` or :func:`from_ggml_blocks` give them)."""
    t = _type(name)
    qb = _from_side(t, codes, side)
    return _decode_blocks(t, qb).reshape(codes.shape)


def _type(name: str) -> GGMLType:
    if name not in TYPES:
        raise FormatError(f"unknown GGML type {name!r}; known: {', '.join(TYPES)}")
    return TYPES[name]


# Codec -------------------------------------------------------------------------------------------------

def _codec(t: GGMLType) -> Codec:
    def side(x32: Tensor, p: GGMLParams) -> dict[str, Tensor]:
        return ggml_quantize(x32, t.name)[1]

    def codes(values: Tensor, side: dict[str, Tensor], p: GGMLParams) -> Tensor:
        """The code of each value: the integer nearest its position on its sub-block's grid, or a neighbour of
        it where two codes round to one float32 value (any code decoding to the value will do)."""
        qb = _from_side(t, None, side)
        v = _checked_rows(values.nan_to_num(0.0).to(torch.float32), t)
        if t.name == "iq4_nl":
            d = qb.d.float()
            code = _iq4_nearest(v, d)
            return code.reshape(values.shape)
        d1, m1 = _grid_of(t, qb).steps()
        x = v.reshape(-1, t.subs, t.sub)
        q = _nearest(t, x, d1, m1)
        for shift in (1.0, -1.0):  # float32 rounding of ``(v + m1) / d1``: try the neighbours where it missed
            wrong = _values(q, d1, m1) != x
            if not bool(wrong.any()):
                break
            other = (q + shift).clamp(t.qmin, t.qmax)
            q = torch.where(wrong & (_values(other, d1, m1) == x), other, q)
        return (q + t.offset).to(torch.int64).reshape(values.shape)

    def decode(codes: Tensor, side: dict[str, Tensor], p: GGMLParams) -> Tensor:
        return ggml_values(codes, side, t.name)

    return Codec(bits=lambda p: t.code_bits, side=side, codes=codes, decode=decode)


def _bounds(t: GGMLType) -> Callable[[Tensor, GGMLParams], tuple[Tensor, Tensor]]:
    def bounds(x: Tensor, p: GGMLParams) -> tuple[Tensor, Tensor]:
        codes, side = ggml_quantize(x, t.name)
        low = ggml_values(torch.full_like(codes, 0), side, t.name)
        high = ggml_values(torch.full_like(codes, (1 << t.code_bits) - 1), side, t.name)
        return torch.minimum(low, high), torch.maximum(low, high)

    return bounds


# GPTQ's grid ---------------------------------------------------------------------------------------------

class BlockGrid:
    """The grid one block of every row fixes (``side``: as the codec stores it, ``[rows, 1]`` / ``[rows, subs]``):
    ``grid(values)`` rounds ``[rows, block]`` values by position, ``grid(column_values, column=j)`` one column
    (``[rows]``) at position ``j`` of the block to the nearest code of its sub-block, clamped."""

    positional = True  # a column's grid depends on its position in the block

    def __init__(self, t: GGMLType, qb: _Quantized):
        self.t = t
        self.qb = qb
        if t.name == "iq4_nl":
            self.d = qb.d.float()
        else:
            self.d1, self.m1 = _grid_of(t, qb).steps()  # [rows, subs, 1]

    def __call__(self, x: Tensor, column: int | None = None) -> Tensor:
        t = self.t
        if x.dim() == 2:
            if x.shape[-1] != t.block:
                raise FormatError(f"format '{t.name}': a block is {t.block} columns, got {x.shape[-1]}")
            return self._round(x.to(torch.float32)).to(x.dtype)
        if t.name == "iq4_nl":  # one scale for the whole block: any column
            return self._round(x.to(torch.float32)[:, None])[:, 0].to(x.dtype)
        if column is None and t.subs > 1:
            raise FormatError(f"format '{t.name}': a column's grid depends on its sub-block of {t.sub}: "
                              f"give its position in the block of {t.block} (column=)")
        if column is not None and not 0 <= column < t.block:
            raise FormatError(f"format '{t.name}': column {column} is outside the block of {t.block}")
        j = (column or 0) // t.sub
        d1 = self.d1[:, j]
        m1 = self.m1[:, j] if self.m1 is not None else None
        q = _nearest(t, x.to(torch.float32)[:, None, None], d1[:, :, None], m1[:, :, None] if m1 is not None else None)
        return _values(q, d1[:, :, None], m1[:, :, None] if m1 is not None else None).reshape(x.shape).to(x.dtype)

    def _round(self, x: Tensor) -> Tensor:
        """Rows of whole blocks (``[rows, block]``) on the grid, by position."""
        t = self.t
        x = x.nan_to_num(0.0)
        if t.name == "iq4_nl":
            return self.d[:, None] * _IQ4_VALUES[_iq4_nearest(x, self.d)]
        blocks = x.reshape(-1, t.subs, t.sub)
        q = _nearest(t, blocks, self.d1, self.m1)
        return _values(q, self.d1, self.m1).reshape(x.shape)


def _group_quantizer(t: GGMLType):
    def group_quantizer(p: GGMLParams, values: Tensor, importance: Tensor | None = None):
        """The stored scales one block of ``values`` (``[rows, block]``) fixes, as llama.cpp would choose them
        for these weights (``importance``: a weight per column, e.g. GPTQ's Hessian diagonal, as llama.cpp's
        importance matrix weighs the error), and the grid they give (:class:`BlockGrid`)."""
        if values.dim() != 2 or values.shape[-1] != t.block:
            raise FormatError(f"format '{t.name}': the group quantizer takes one block of {t.block} columns per row")
        blocks = _checked_rows(values.to(torch.float32), t)
        ew = importance.to(torch.float32).expand(values.shape).reshape(blocks.shape) if importance is not None else None
        qb = _quantize_blocks(t, blocks, ew)
        return _side_of(t, qb, values.shape), BlockGrid(t, qb)

    return group_quantizer


# GGUF block bytes ----------------------------------------------------------------------------------------

def _u8(x: Tensor) -> Tensor:
    return x.to(torch.uint8)


def _f16_bytes(h: Tensor) -> Tensor:
    return h.to(torch.float16).contiguous().view(torch.uint8).reshape(-1, 2)


def _pack_crumbs(codes: Tensor) -> Tensor:
    """2-bit values ``[B, 256]`` as ggml's ``qs``: per half of 128, byte ``l`` holds weights ``l, l+32, l+64, l+96``."""
    c = codes.reshape(-1, 2, 4, 32)
    out = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    return _u8(out.reshape(-1, 64))


def _unpack_crumbs(qs: Tensor) -> Tensor:
    q = qs.to(torch.int64).reshape(-1, 2, 1, 32)
    return ((q >> torch.tensor([0, 2, 4, 6]).reshape(1, 1, 4, 1)) & 3).reshape(-1, 256)


def _pack_nibbles(codes: Tensor) -> Tensor:
    """4-bit values ``[B, 256]`` as ggml's K-quant ``qs``: per 64, byte ``l`` holds weights ``l`` (low) and ``l+32``."""
    c = codes.reshape(-1, 4, 2, 32)
    return _u8((c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128))


def _unpack_nibbles(qs: Tensor) -> Tensor:
    q = qs.to(torch.int64).reshape(-1, 4, 1, 32)
    return ((q >> torch.tensor([0, 4]).reshape(1, 1, 2, 1)) & 15).reshape(-1, 256)


def _pack_k4_scales(sc: Tensor, m: Tensor) -> Tensor:
    """Eight 6-bit scales and mins as the 12 bytes ``get_scale_min_k4`` reads."""
    sc, m = sc.to(torch.int64), m.to(torch.int64)
    out = torch.zeros(sc.shape[0], 12, dtype=torch.int64)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return _u8(out)


def _unpack_k4_scales(raw: Tensor) -> tuple[Tensor, Tensor]:
    r = raw.to(torch.int64)
    sc = torch.cat([r[:, 0:4] & 63, (r[:, 8:12] & 15) | ((r[:, 0:4] >> 6) << 4)], 1)
    m = torch.cat([r[:, 4:8] & 63, (r[:, 8:12] >> 4) | ((r[:, 4:8] >> 6) << 4)], 1)
    return sc, m


def _pack_q3_scales(sc: Tensor) -> Tensor:
    """Sixteen signed 6-bit scales (stored ``+ 32``) as block_q3_K's 12 bytes."""
    l = sc.to(torch.int64) + 32
    out = torch.zeros(l.shape[0], 12, dtype=torch.int64)
    out[:, 0:8] = (l[:, 0:8] & 15) | ((l[:, 8:16] & 15) << 4)
    high = (l >> 4).reshape(-1, 4, 4)  # [B, j // 4, j % 4]
    out[:, 8:12] = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
    return _u8(out)


def _unpack_q3_scales(raw: Tensor) -> Tensor:
    r = raw.to(torch.int64)
    low = torch.cat([r[:, 0:8] & 15, r[:, 0:8] >> 4], 1)
    high = ((r[:, 8:12].reshape(-1, 1, 4) >> torch.tensor([0, 2, 4, 6]).reshape(1, 4, 1)) & 3).reshape(-1, 16)
    return (low | (high << 4)) - 32


def to_ggml_blocks(name: str, codes: Any, side: dict[str, Tensor] | None = None) -> np.ndarray:
    """The GGUF tensor data (``uint8 [rows, n_blocks * type_size]``; a rank-1 tensor is one row) of codes and side
    (as :func:`ggml_quantize` or the format's codec give them) or of an :class:`~mase_lite.numerics.codes.Encoded`
    tensor of the format: each block laid out as llama.cpp's ``block_<type>``."""
    t = _type(name)
    if side is None:  # an Encoded tensor
        codes, side = codes.unpacked(), {k: v for k, v in codes.side.items() if k != "nan"}
    if codes.dim() == 0 or codes.shape[-1] % t.block:
        raise FormatError(f"format '{name}': codes of shape {tuple(codes.shape)} are not rows of whole blocks of {t.block}")
    rows = max(math.prod(codes.shape[:-1]), 1)
    qb = _from_side(t, codes.to(torch.int64), side)
    if qb.d.shape[0] != qb.codes.shape[0]:
        raise FormatError(f"format '{name}': the side holds {qb.d.shape[0]} blocks, the codes {qb.codes.shape[0]}")
    c = qb.codes
    if bool((c < 0).any()) or bool((c >= 1 << t.code_bits).any()):
        raise FormatError(f"format '{name}': codes must lie in 0..{(1 << t.code_bits) - 1}")
    d = _f16_bytes(qb.d)
    if t.block == 32 and t.code_bits in (4, 5):  # iq4_nl, q4_0, q4_1, q5_0, q5_1
        parts = [d, _f16_bytes(qb.m)] if t.block_min else [d]
        if t.code_bits == 5:  # qh: weight j's 5th bit is bit j of a little-endian uint32
            parts.append(_u8((((c >> 4) & 1).reshape(-1, 4, 8) << torch.arange(8)).sum(-1)))
        parts.append(_u8((c[:, :16] & 15) | ((c[:, 16:] & 15) << 4)))  # low nibbles: weights 0..15, high: 16..31
    elif t.name == "q8_0":
        parts = [d, _u8(c ^ 128)]  # the int8 q (code - 128) as its byte
    elif t.name == "q2_k":
        scales = _u8(qb.scales.to(torch.int64) | (qb.mins.to(torch.int64) << 4))
        parts = [scales, _pack_crumbs(c), d, _f16_bytes(qb.dmin)]
    elif t.name == "q3_k":
        hmask = ((c >> 2) & 1).reshape(-1, 8, 32)  # weight j -> bit j // 32 of byte j % 32
        hbytes = (hmask << torch.arange(8).reshape(1, 8, 1)).sum(1)
        parts = [_u8(hbytes), _pack_crumbs(c & 3), _pack_q3_scales(qb.scales), d]
    elif t.name in ("q4_k", "q5_k"):
        parts = [d, _f16_bytes(qb.dmin), _pack_k4_scales(qb.scales, qb.mins)]
        if t.name == "q5_k":
            high = ((c >> 4) & 1).reshape(-1, 8, 32)  # weight j -> bit j // 32 of byte j % 32
            parts.append(_u8((high << torch.arange(8).reshape(1, 8, 1)).sum(1)))
        parts.append(_pack_nibbles(c & 15))
    else:  # q6_k
        low = (c & 15).reshape(-1, 2, 4, 32)  # [B, half, quarter, l]
        ql = torch.cat([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], 2).reshape(-1, 128)
        high = (c >> 4).reshape(-1, 2, 4, 32)
        qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(-1, 64)
        parts = [_u8(ql), _u8(qh), qb.scales.to(torch.int8).view(torch.uint8).reshape(-1, 16), d]
    raw = torch.cat(parts, 1)
    assert raw.shape[1] == t.type_size
    return raw.reshape(rows, -1).numpy()


def from_ggml_blocks(name: str, raw: np.ndarray, shape: Shape | torch.Size) -> tuple[Tensor, dict[str, Tensor]]:
    """The codes (int64, ``shape``) and side tensors of GGUF tensor data (``uint8``, ``[..., n_blocks *
    type_size]`` or flat), the inverse of :func:`to_ggml_blocks`."""
    t = _type(name)
    shape = torch.Size(shape)
    if len(shape) == 0 or shape[-1] % t.block:
        raise FormatError(f"format '{name}': shape {tuple(shape)} is not rows of whole blocks of {t.block}")
    blocks = math.prod(shape) // t.block
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if data.size != blocks * t.type_size:
        raise FormatError(f"format '{name}': a tensor of shape {tuple(shape)} is {blocks * t.type_size} bytes of "
                          f"{t.ggml}, got {data.size}")
    r = torch.from_numpy(data.copy()).reshape(blocks, t.type_size)
    half = lambda b: b.contiguous().view(torch.float16).reshape(-1)
    dmin = scales = mins = m = None
    if t.block == 32 and t.code_bits in (4, 5):  # iq4_nl, q4_0, q4_1, q5_0, q5_1
        d = half(r[:, 0:2])
        at = 2
        if t.block_min:
            m, at = half(r[:, 2:4]), 4
        high = 0
        if t.code_bits == 5:
            high = ((r[:, at : at + 4].to(torch.int64).reshape(-1, 4, 1) >> torch.arange(8)) & 1).reshape(-1, 32) << 4
            at += 4
        q = r[:, at : at + 16].to(torch.int64)
        codes = torch.cat([q & 15, q >> 4], 1) | high
    elif t.name == "q8_0":
        d = half(r[:, 0:2])
        codes = r[:, 2:34].to(torch.int64) ^ 128
    elif t.name == "q2_k":
        packed = r[:, 0:16].to(torch.int64)
        scales, mins = _u8(packed & 15), _u8(packed >> 4)
        codes = _unpack_crumbs(r[:, 16:80])
        d, dmin = half(r[:, 80:82]), half(r[:, 82:84])
    elif t.name == "q3_k":
        hbits = ((r[:, 0:32].to(torch.int64).reshape(-1, 1, 32) >> torch.arange(8).reshape(1, 8, 1)) & 1).reshape(-1, 256)
        codes = _unpack_crumbs(r[:, 32:96]) | (hbits << 2)
        scales = _unpack_q3_scales(r[:, 96:108]).to(torch.int8)
        d = half(r[:, 108:110])
    elif t.name in ("q4_k", "q5_k"):
        d, dmin = half(r[:, 0:2]), half(r[:, 2:4])
        sc, m = _unpack_k4_scales(r[:, 4:16])
        scales, mins = _u8(sc), _u8(m)
        if t.name == "q4_k":
            codes = _unpack_nibbles(r[:, 16:144])
        else:
            hbits = ((r[:, 16:48].to(torch.int64).reshape(-1, 1, 32) >> torch.arange(8).reshape(1, 8, 1)) & 1)
            codes = _unpack_nibbles(r[:, 48:176]) | (hbits.reshape(-1, 256) << 4)
    else:  # q6_k
        ql = r[:, 0:128].to(torch.int64).reshape(-1, 2, 2, 32)  # [B, half, (l, l+32), l]
        qh = r[:, 128:192].to(torch.int64).reshape(-1, 2, 1, 32)
        low = torch.stack([ql[:, :, 0] & 15, ql[:, :, 1] & 15, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], 2)
        high = (qh >> torch.tensor([0, 2, 4, 6]).reshape(1, 1, 4, 1)) & 3
        codes = (low | (high << 4)).reshape(-1, 256)
        scales = r[:, 192:208].contiguous().view(torch.int8)
        d = half(r[:, 208:210])
    qb = _Quantized(codes, d, dmin, scales, mins, m)
    return codes.reshape(shape), _side_of(t, qb, shape)


# Registration ----------------------------------------------------------------------------------------

def _register(t: GGMLType) -> Callable[[Tensor, GGMLParams], Tensor]:
    def quantize(x: Tensor, p: GGMLParams) -> Tensor:
        codes, side = ggml_quantize(x, t.name)
        return ggml_values(codes, side, t.name)

    quantize.__name__ = t.name
    quantize.__doc__ = (f"GGML's {t.ggml}: blocks of {t.block} weights"
                        + (f", a scale{' and a min' if t.has_min else ''} per {t.sub}" if t.block != t.sub else
                           f", a float16 scale{' and min' if t.has_min else ''} per block")
                        + f"; {t.bits:g} bits per weight, bit for bit as llama.cpp stores them.")
    registered = register_format(t.name, params=GGMLParams, bits=lambda p, shape: t.bits, bounds=_bounds(t),
                                 group=lambda p, row: t.block, codec=_codec(t),
                                 group_quantizer=_group_quantizer(t))(quantize)
    register_mapping(t.name, "gguf", _gguf_type(t), lambda codes, gguf_type: to_ggml_blocks(t.name, codes))
    if t.code_bits == 4 and t.block == 32 and not t.scaled and not t.has_min:  # 16 values times d: the packed layer
        register_mapping(t.name, "packed", lambda fmt, activations: "packed4", _packed_table(t),
                         lambda scales, fmt: {"d": scales.to(torch.float16)})
    elif t.name.endswith("_k"):  # the K-quants' own records (mase_lite.kernels.kquants)
        register_mapping(t.name, "packed", lambda fmt, activations: "kquant")
    elif t.name == "q8_0":  # int8 codes and float16 scales (mase_lite.kernels.q8_0)
        register_mapping(t.name, "packed", lambda fmt, activations: "packed8")
    return registered


def _gguf_type(t: GGMLType) -> Callable[[dict, Shape], str]:
    def scheme(fmt: dict, shape: Shape) -> str:
        check_tiles(shape[-1], t.block, "blocks", "leave this layer float (a null rule for it)")
        return t.ggml

    return scheme


def _packed_table(t: GGMLType) -> Callable[[Any], tuple[Tensor, Tensor]]:
    """The 16 values a code stands for (under ``d = 1``) and each block's ``d``, as the packed layer holds them."""

    def table(codes) -> tuple[Tensor, Tensor]:
        unit = ggml_values(torch.arange(32) % 16, {"d": torch.ones(1, dtype=torch.float16)}, t.name)
        return unit[:16].contiguous(), codes.side["d"].float()

    return table


def integer_blocks(codes: Tensor, scale: Tensor, gguf_type: str) -> Tensor:
    """GGUF ``Q8_0`` or ``Q4_0`` blocks of another format's integer codes (offset binary: ``q + 128`` / ``q + 8``,
    ``[rows, columns]``) under float32 scales per block of 32 (``[rows, columns / 32]``), which must be float16
    values (:class:`Unfit` naming the first that is not); a block of zero codes stores ``d = 0``."""
    t = _type(gguf_type.lower())
    half = scale.half()
    codes_zero = (codes.reshape(*scale.shape, t.block) == t.offset).all(-1)
    inexact = (half.float() != scale) & ~codes_zero
    if bool(inexact.any()):
        row, block = (int(i) for i in inexact.nonzero()[0])
        raise Unfit(f"the scale {float(scale[row, block]):.6g} of block {block} of row {row} is not a float16 value",
                    "scale_dtype float16 (and weights within float16's range)")
    d = torch.where(codes_zero, torch.zeros((), dtype=torch.float16), half)
    return torch.from_numpy(to_ggml_blocks(t.name, codes.to(torch.int64), {"d": d}))


q2_k = _register(TYPES["q2_k"])
q3_k = _register(TYPES["q3_k"])
q4_k = _register(TYPES["q4_k"])
q5_k = _register(TYPES["q5_k"])
q6_k = _register(TYPES["q6_k"])
iq4_nl = _register(TYPES["iq4_nl"])
q4_0 = _register(TYPES["q4_0"])
q4_1 = _register(TYPES["q4_1"])
q5_0 = _register(TYPES["q5_0"])
q5_1 = _register(TYPES["q5_1"])
q8_0 = _register(TYPES["q8_0"])
