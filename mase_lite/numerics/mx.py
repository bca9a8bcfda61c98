"""OCP Microscaling (MX) formats as pure tensor functions.

A block is ``block_size`` consecutive elements of the last dimension sharing one E8M0 scale
``X = 2**(E - 127)``; rows are zero-padded independently, so a block never spans two rows.
Elements are rounded to nearest (ties to even) and clamped to the element format's range; an
MXINT element that rounds to zero is +0.0 (its code 0 carries no sign), so fake quantization and
encode → decode agree bit for bit.
A block holding a NaN or an Inf gets scale code 0xFF and decodes to NaN; an all-zero block gets
scale code 0x00 and decodes to zeros. The shared exponent comes from the float's exponent bits
(``torch.frexp``), never from a float ``log2``.

Example::

    >>> import torch
    >>> from mase_lite.numerics.mx import mxint, mxfp, mxint_encode, mxint_decode
    >>> mxint(torch.tensor([1.0, 0.3, -2.5]), element_width=8).tolist()
    [1.0, 0.3125, -2.5]
    >>> mxfp(torch.tensor([1000.0, 1.0]), element_format="e2m1").tolist()
    [768.0, 0.0]
    >>> codes, scales = mxint_encode(torch.tensor([[1.0, -0.5]]))
    >>> codes.tolist(), scales.tolist()
    ([[64, -32]], [[127]])
    >>> mxint_decode(codes, scales).tolist()
    [[1.0, -0.5]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mase_lite.infra.errors import UserError
from mase_lite.numerics.blocks import amax_and_non_finite
from mase_lite.numerics.chunks import map_blocks
from mase_lite.numerics.exponents import (
    clamp_,
    fixed_point_constants,
    fixed_point_rounding_holds,
    largest_float,
    magic_rounding_holds,
    magic_rounding_kernel,
    pow2,
    round_fixed_point,
    round_to_float,
)
from mase_lite.numerics.native.block_kernel import BlockGrid

SCALE_RULES = ("floor", "ceil", "even", "rceil")
MXINT_ELEMENT_WIDTHS = (8, 6, 4)
E8M0_BIAS = 127
E8M0_NAN = 0xFF
SHARED_EXPONENT_MIN = -127
SHARED_EXPONENT_MAX = 127


@dataclass(frozen=True)
class ElementFormat:
    """An MX element type: its bit layout and the facts the shared-exponent rules need.

    ``emax`` is the exponent of the largest power of two the element can hold, ``emin`` that of
    its smallest normal binade (subnormals share its step), ``mbits`` the number of fraction bits
    below the leading one (MXINT: width - 2).
    """

    name: str
    bits: int
    mbits: int
    emax: int
    max_value: float
    emin: int = 0


MXFP_FORMATS: dict[str, ElementFormat] = {
    "e4m3": ElementFormat("e4m3", bits=8, mbits=3, emax=8, max_value=448.0, emin=-6),
    "e5m2": ElementFormat("e5m2", bits=8, mbits=2, emax=15, max_value=57344.0, emin=-14),
    "e3m2": ElementFormat("e3m2", bits=6, mbits=2, emax=4, max_value=28.0, emin=-2),
    "e2m3": ElementFormat("e2m3", bits=6, mbits=3, emax=2, max_value=7.5, emin=0),
    "e2m1": ElementFormat("e2m1", bits=4, mbits=1, emax=2, max_value=6.0, emin=0),
}


def mxint_element(width: int) -> ElementFormat:
    """The MXINT element of ``width`` bits: two's complement with an implicit scale 2**-(width-2)."""
    if isinstance(width, bool) or width not in MXINT_ELEMENT_WIDTHS:
        raise UserError(f"element_width={width!r} is not an MXINT width; allowed: {list(MXINT_ELEMENT_WIDTHS)}")
    largest_code = 2 ** (width - 1) - 1
    return ElementFormat(f"int{width}", bits=width, mbits=width - 2, emax=0,
                         max_value=largest_code * 2.0 ** -(width - 2))


def mx_bits_per_element(element_bits: int, block_size: int = 32) -> float:
    """Stored bits per element, the shared 8-bit scale included: ``mx_bits_per_element(8, 32) == 8.25``."""
    _check_block_size(block_size)
    return element_bits + 8 / block_size


def shared_exponents(amax: Tensor, element: ElementFormat, scale_rule: str = "floor") -> Tensor:
    """Unbiased shared exponents E (int32, clamped to [-127, 127]) for finite block maxima ``amax``.

    Rules, with ``floor_log2`` read from the exponent bits:
    ``floor``: floor(log2(amax)) - emax; ``ceil``: ceil(log2(amax)) - emax;
    ``even``: floor rule applied to amax rounded (ties to even) to the element's ``mbits``
    fraction bits, so a maximum that would round up past the top binade moves to the next scale;
    ``rceil``: ceil(log2(amax / max_value)), the smallest scale at which nothing saturates.
    A zero maximum gives the smallest scale, -127.
    """
    _check_scale_rule(scale_rule)
    mantissa, exponent = torch.frexp(amax)
    floor_log2 = exponent - 1
    if scale_rule == "floor":
        shared = floor_log2 - element.emax
    elif scale_rule == "ceil":
        shared = floor_log2 + (mantissa != 0.5).to(torch.int32) - element.emax
    elif scale_rule == "even":
        steps = 2.0 ** (element.mbits + 1)
        rounds_up = torch.round(mantissa * steps) == steps
        shared = floor_log2 + rounds_up.to(torch.int32) - element.emax
    else:
        max_mantissa, max_exponent = math.frexp(element.max_value)
        shared = exponent - max_exponent + (mantissa > max_mantissa).to(torch.int32)
    shared = torch.where(amax == 0, SHARED_EXPONENT_MIN, shared)
    return shared.clamp(SHARED_EXPONENT_MIN, SHARED_EXPONENT_MAX).to(torch.int32)


def e8m0_decode(scales: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Scale values ``2**(code - 127)`` of uint8 E8M0 codes; code 0xFF decodes to NaN."""
    if scales.dtype != torch.uint8:
        raise UserError(f"E8M0 scales must be torch.uint8, got {scales.dtype}")
    values = pow2(scales.to(torch.int32) - E8M0_BIAS, dtype)
    return torch.where(scales == E8M0_NAN, torch.full_like(values, math.nan), values)


def mxint_encode(x: Tensor, element_width: int = 8, block_size: int = 32,
                 scale_rule: str = "floor") -> tuple[Tensor, Tensor]:
    """Encode ``x`` to MXINT: int8 element codes (shape of ``x``) and uint8 E8M0 scales.

    ``scales`` has shape ``(*x.shape[:-1], ceil(x.shape[-1] / block_size))`` (``(1,)`` for a 0-D
    ``x``). Codes use the symmetric range ±(2**(width-1) - 1); a non-finite block gets codes 0 and
    scale 0xFF.

    >>> mxint_encode(torch.tensor([15.999999, 1.0]))[1].item() - 127
    3
    """
    element = mxint_element(element_width)
    codes, shared, non_finite = _mxint_blocks(x, element, block_size, scale_rule)
    codes = torch.where(non_finite, 0.0, codes).to(torch.int8)
    scales = torch.where(non_finite, E8M0_NAN, shared + E8M0_BIAS).to(torch.uint8)
    return _unblock(codes, x.shape), scales.reshape(scales_shape(x.shape, block_size))


def mxint_decode(codes: Tensor, scales: Tensor, element_width: int = 8, block_size: int = 32,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """Values ``code * 2**-(width-2) * 2**(scale - 127)`` in ``dtype``.

    Computed exactly in float32 (float64 for a float64 ``dtype``), then rounded once to ``dtype``.
    Accepts the asymmetric code -2**(width-1) (for int8, -128 decodes to -2·X).
    """
    element = mxint_element(element_width)
    check_decode_args(codes, scales, block_size, dtype)
    compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    step = e8m0_decode(scales, compute_dtype) * 2.0 ** -element.mbits  # exact: a power of two or NaN
    values = _as_blocks(codes.to(compute_dtype), block_size).mul_(step.unsqueeze(-1))
    return _unblock(values, codes.shape).to(dtype)


def mxint(x: Tensor, element_width: int = 8, block_size: int = 32, scale_rule: str = "floor") -> Tensor:
    """Fake-quantize ``x`` to MXINT ``element_width`` (8, 6 or 4); same shape, dtype and device.

    >>> mxint(torch.tensor([3.0, 0.2]), element_width=4).tolist()
    [3.0, 0.0]
    """
    element = mxint_element(element_width)
    largest_code = 2 ** (element.bits - 1) - 1

    def exact_kernel(blocks: Tensor, out: Tensor, shared: Tensor) -> None:
        _mxint_codes(blocks, shared, element, out).mul_(pow2(shared - element.mbits, out.dtype))

    def prepare(amax: Tensor) -> tuple:
        shared = shared_exponents(amax, element, scale_rule)
        quantum = shared - element.mbits
        if amax.dtype == torch.float32 and fixed_point_rounding_holds(quantum, largest_code):
            # a code 0 comes out as +0.0, as the sign rule wants
            return round_fixed_point, *fixed_point_constants(quantum, largest_code)
        return exact_kernel, shared

    return _map_blocks(x, block_size, scale_rule, prepare, element)


def mxfp(x: Tensor, element_format: str = "e4m3", block_size: int = 32, scale_rule: str = "floor") -> Tensor:
    """Fake-quantize ``x`` to MXFP with element ``e4m3``, ``e5m2``, ``e3m2``, ``e2m3`` or ``e2m1``.

    Elements saturate at the format's largest finite value (also for e5m2, which has an Inf).

    >>> mxfp(torch.tensor([448.0, 500.0, 1.0]), element_format="e4m3").tolist()
    [448.0, 448.0, 1.0]
    """
    if element_format not in MXFP_FORMATS:
        raise UserError(f"element_format={element_format!r} is not an MXFP element; allowed: {list(MXFP_FORMATS)}")
    element = MXFP_FORMATS[element_format]
    clamps = element.max_value < largest_float(element.mbits, element.emax)  # e4m3 has no top mantissa code

    def grid_kernel(blocks: Tensor, out: Tensor, low: Tensor, high: Tensor, limit: Tensor) -> None:
        y = round_to_float(blocks, element.mbits, low, high, out)
        if clamps:
            clamp_(y, -limit, limit)

    def scaled_kernel(blocks: Tensor, out: Tensor, shared: Tensor) -> None:
        _round_elements(blocks * pow2(-shared, blocks.dtype), element, out)
        out.clamp_(-element.max_value, element.max_value).mul_(pow2(shared, blocks.dtype))

    def prepare(amax: Tensor) -> tuple:
        shared = shared_exponents(amax, element, scale_rule)
        if amax.dtype != torch.float32:
            return scaled_kernel, shared
        # x rounded on the block's grid of element values times 2**E directly: scaling by a power
        # of two is exact, so this is the element rounding of x * 2**-E, saturating at max_value * 2**E
        low, high, limit = shared + element.emin, shared + element.emax, pow2(shared) * element.max_value
        if magic_rounding_holds(element.mbits, low, high):
            # round_to_float's own steps, saturating at once at max_value * 2**E (at most its largest value)
            return magic_rounding_kernel(element.mbits), low, high, -limit, limit
        return grid_kernel, low, high, limit

    return _map_blocks(x, block_size, scale_rule, prepare, element)


def under_exponents(x: Tensor, shared: Tensor, element: ElementFormat) -> Tensor:
    """``x`` (float32) on the element grid times ``2**shared`` (int32, broadcastable to ``x``): what a block with
    shared exponents ``shared`` makes of its elements, bit for bit (a new tensor).

    >>> E = torch.tensor(2, dtype=torch.int32)          # MXINT4: codes ±7 of 2**(E - 2) = 1, saturating at ±7
    >>> under_exponents(torch.tensor([3.0, 0.2, -9.0]), E, mxint_element(4)).tolist()
    [3.0, 0.0, -7.0]
    """
    if element.name.startswith("int"):
        return _mxint_codes(x, shared, element, torch.empty_like(x)).mul_(pow2(shared - element.mbits, x.dtype))
    limit = pow2(shared, x.dtype) * element.max_value
    y = round_to_float(x, element.mbits, shared + element.emin, shared + element.emax)
    return torch.maximum(torch.minimum(y, limit), -limit)


def _round_elements(scaled: Tensor, element: ElementFormat, out: Tensor) -> Tensor:
    """``scaled`` (float64) rounded (ties to even) to the element's ``mbits`` fraction bits, subnormals
    below ``2**emin``, written to ``out``."""
    _, exponent = torch.frexp(scaled)
    quantum = (exponent - 1).clamp(min=element.emin) - element.mbits
    return torch.mul(scaled, pow2(-quantum, scaled.dtype), out=out).round_().mul_(pow2(quantum, scaled.dtype))


def _mxint_codes(blocks: Tensor, shared: Tensor, element: ElementFormat, out: Tensor) -> Tensor:
    """Integer-valued float codes of ``blocks`` with shared exponents ``shared``, written to ``out``."""
    if blocks.dtype == torch.float32 and (not shared.numel() or int(shared.min()) >= element.mbits - 127):
        # one multiplication by 2**(mbits - E): exact whenever the two-step product is, and
        # otherwise both are far below half a code step
        torch.mul(blocks, pow2(element.mbits - shared), out=out)
    else:
        torch.mul(blocks, pow2(-shared, blocks.dtype), out=out).mul_(2.0**element.mbits)
    largest_code = 2 ** (element.bits - 1) - 1
    # + 0.0 turns the -0.0 of negative values that round to zero into the +0.0 that code 0 decodes to
    return out.round_().clamp_(-largest_code, largest_code).add_(0.0)


def _mxint_blocks(x: Tensor, element: ElementFormat, block_size: int,
                  scale_rule: str) -> tuple[Tensor, Tensor, Tensor]:
    """Integer-valued float codes (blocks), shared exponents (``(..., n_blocks, 1)``) and non-finite flags."""
    blocks = _blocks(x, block_size)
    amax, non_finite = amax_and_non_finite(blocks)
    shared = shared_exponents(amax, element, scale_rule)
    return _mxint_codes(blocks, shared, element, torch.empty_like(blocks)), shared, non_finite


def _map_blocks(x: Tensor, block_size: int, scale_rule: str, prepare, element: ElementFormat) -> Tensor:
    """:func:`~mase_lite.numerics.chunks.map_blocks` (the native kernel where it applies) on ``x`` in
    its compute dtype, cast back to ``x``'s dtype."""
    _check_input(x)
    _check_block_size(block_size)
    _check_scale_rule(scale_rule)
    integer = element.name.startswith("int")
    grid = BlockGrid(integer_grid=integer, rule=scale_rule, mbits=element.mbits, emax=element.emax,
                     emin=element.emin, max_value=element.max_value, zero_is_positive=integer)
    return map_blocks(x.to(_compute_dtype(x)), block_size, prepare, grid).to(x.dtype)


def _blocks(x: Tensor, block_size: int) -> Tensor:
    """``x`` in its compute dtype as ``(*rows, n_blocks, block_size)`` (zero-padded per row)."""
    _check_input(x)
    _check_block_size(block_size)
    return _as_blocks(x.to(_compute_dtype(x)), block_size)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _as_blocks(t: Tensor, block_size: int) -> Tensor:
    """``t`` as ``(*rows, n_blocks, block_size)``, each row zero-padded to whole blocks (0-D: one row)."""
    rows = t.reshape(t.shape if t.dim() else (1,))
    padding = -rows.shape[-1] % block_size
    if padding:
        rows = torch.nn.functional.pad(rows, (0, padding))
    return rows.reshape(*rows.shape[:-1], -1, block_size)


def _unblock(blocks: Tensor, shape: torch.Size) -> Tensor:
    row_length = shape[-1] if len(shape) else 1
    rows = blocks.reshape(*blocks.shape[:-2], -1)[..., :row_length]
    return rows.reshape(shape)


def scales_shape(shape: torch.Size | tuple[int, ...], block_size: int) -> tuple[int, ...]:
    """Shape of the E8M0 scales for elements of ``shape``: ``(*shape[:-1], ceil(shape[-1] / block_size))``."""
    if not len(shape):
        return (1,)
    return (*shape[:-1], -(-shape[-1] // block_size))


def _check_input(x: Tensor) -> None:
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        found = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise UserError(f"MX quantization needs a floating-point tensor, got {found}")


def check_decode_args(codes: Tensor, scales: Tensor, block_size: int, dtype: torch.dtype) -> None:
    """Raise a ``UserError`` unless int8 ``codes`` and uint8 ``scales`` fit together and ``dtype`` is a float."""
    _check_block_size(block_size)
    if codes.dtype != torch.int8 or scales.dtype != torch.uint8:
        raise UserError(f"MX codes must be torch.int8 and scales torch.uint8, got {codes.dtype} and {scales.dtype}")
    expected = scales_shape(codes.shape, block_size)
    if tuple(scales.shape) != expected:
        raise UserError(f"scales shape {tuple(scales.shape)} does not match codes shape {tuple(codes.shape)} "
                        f"with block_size={block_size}; expected {expected}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise UserError(f"dtype={dtype!r} is not a floating-point dtype; allowed: torch.float32, "
                        "torch.float16, torch.bfloat16, torch.float64")


def _check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise UserError(f"block_size={block_size!r} must be a positive integer (the MX spec uses 32)")


def _check_scale_rule(scale_rule: str) -> None:
    if scale_rule not in SCALE_RULES:
        raise UserError(f"scale_rule={scale_rule!r} is unknown; allowed: {list(SCALE_RULES)}")
