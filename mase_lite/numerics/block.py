"""Block formats: ``block_fp``, ``block_minifloat``, ``block_log`` — a shared exponent or bias per block.

A block is ``block_size`` consecutive elements of the last dimension; rows are zero-padded on their
own. The shared value is chosen from the block's largest magnitude. A block holding a NaN or an
Inf decodes to NaN, every element of it (the MX rule, ``notes/mx.md``: its shared scale would be
the NaN code); an all-zero block stays zero. Rounding is half to even; elements saturate at the
block's largest value.

``block_fp``: a shared exponent ``E = floor(log2(amax))`` (``exponent_width`` bits, bias
``exponent_bias``, so E is clamped to ``[-bias, 2**e - 1 - bias]``) and sign-magnitude integer
mantissas of ``width`` bits (sign included): element = ``q * 2**(E - (width - 2))``,
``|q| <= 2**(width-1) - 1``. Bits per element: ``width + exponent_width / block_size``.

``block_minifloat``: elements are minifloats (IEEE style, ``exponent_width`` exponent bits,
``width - 1 - exponent_width`` mantissa bits) whose exponent bias is shared per block, stored as
a signed ``exponent_bias_width``-bit integer. The bias puts the block's top binade on its largest
magnitude (``bias = 2**e - 1 - floor(log2(amax))``, clamped to the bias range), so blocks of small
values keep their precision. Bits per element: ``width + exponent_bias_width / block_size``.

``block_log``: elements are ``log`` values (sign + ``width - 1``-bit exponent code, code 0 = zero)
with a shared signed ``exponent_bias_width``-bit bias that puts the top code on the power of two
nearest the block's largest magnitude. Bits per element: ``width + exponent_bias_width / block_size``.

Example::

    quantize(torch.tensor([[0.01, 0.003, -0.0071, 0.0]]), "block_minifloat",
             width=8, exponent_width=4, block_size=4)   # small blocks keep their values
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from torch import Tensor

from mase_lite.numerics.blocks import finite_amax, from_blocks, per_element, to_blocks
from mase_lite.numerics.codes import exact_integers, float_grid_codes, float_grid_values
from mase_lite.numerics.chunks import map_blocks
from mase_lite.numerics.exponents import (
    FLOAT32_MANTISSA_BITS,
    fixed_point_constants,
    fixed_point_rounding_holds,
    floor_log2,
    largest_float,
    largest_float32_at_most,
    magic_rounding_holds,
    magic_rounding_kernel,
    mul_pow2,
    mul_pow2_,
    pow2,
    round_fixed_point,
    round_to_float,
)
from mase_lite.numerics.minifloat import check_exponent_fits
from mase_lite.numerics.native.block_kernel import BlockGrid
from mase_lite.numerics.registry import Codec, FormatParams, register_format


class BlockFPParams(FormatParams):
    width: int = Field(ge=2, le=32, description="mantissa bits per element, sign included")
    exponent_width: int = Field(8, ge=1, le=8, description="bits of the shared exponent")
    exponent_bias: int | None = Field(None, ge=-127, le=127, description="shared-exponent bias; default 2**(e-1) - 1")
    block_size: int = Field(16, ge=1, description="elements of the last dimension per shared exponent")

    @property
    def bias(self) -> int:
        return self.exponent_bias if self.exponent_bias is not None else 2 ** (self.exponent_width - 1) - 1

    @property
    def shared_bits(self) -> int:
        return self.exponent_width


class BlockMinifloatParams(FormatParams):
    width: int = Field(ge=2, le=32, description="bits per element: sign + exponent + mantissa")
    exponent_width: int = Field(ge=1, le=7, description="exponent bits per element (less than width)")
    exponent_bias_width: int = Field(8, ge=1, le=8, description="bits of the shared, signed exponent bias")
    block_size: int = Field(16, ge=1, description="elements of the last dimension per shared bias")

    @property
    def shared_bits(self) -> int:
        return self.exponent_bias_width

    @model_validator(mode="after")
    def _fits(self) -> "BlockMinifloatParams":
        check_exponent_fits(self.exponent_width, self.width)
        return self


class BlockLogParams(FormatParams):
    width: int = Field(ge=2, le=8, description="bits per element: sign + exponent code")
    exponent_bias_width: int = Field(8, ge=1, le=8, description="bits of the shared, signed exponent bias")
    block_size: int = Field(16, ge=1, description="elements of the last dimension per shared bias")

    @property
    def shared_bits(self) -> int:
        return self.exponent_bias_width


def _block_bits(p: BlockFPParams | BlockMinifloatParams | BlockLogParams) -> float:
    """Element bits plus the block's shared exponent (or bias) spread over its elements."""
    return p.width + p.shared_bits / p.block_size


def _signed_range(bits: int) -> tuple[int, int]:
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _block_fp_layout(amax: Tensor, p: BlockFPParams) -> tuple[Tensor, Tensor]:
    """Per block, from its largest magnitude: the quantum exponent and the largest value."""
    shared = floor_log2(amax).clamp(-p.bias, 2**p.exponent_width - 1 - p.bias)
    quantum = shared - (p.width - 2)
    largest_code = largest_float32_at_most(2.0 ** (p.width - 1) - 1)
    largest = mul_pow2(torch.full_like(amax, largest_code), quantum)
    return quantum, largest


def _bounds_from(layout):
    def bounds(x: Tensor, p) -> tuple[Tensor, Tensor]:
        blocks = to_blocks(x, p.block_size)
        largest = per_element(layout(finite_amax(blocks), p)[-1], blocks, x.shape)
        return -largest, largest

    return bounds


def _shared_bias_grid(p: BlockMinifloatParams | BlockLogParams, rule: str, mantissa_bits: int, top: int) -> BlockGrid:
    """A float element grid whose exponent range is ``[1, top]`` below a shared scale ``2**-bias``
    (at most float32's 23 fraction bits, as :func:`round_to_float` rounds)."""
    lo, hi = _signed_range(p.exponent_bias_width)
    return BlockGrid(integer_grid=False, rule=rule, mbits=min(mantissa_bits, FLOAT32_MANTISSA_BITS), emax=top,
                     emin=1, max_value=largest_float(mantissa_bits, top), shared_min=-hi, shared_max=-lo)


def _block_rounding(layout, mantissa_bits: int, x: Tensor, p, grid: BlockGrid) -> Tensor:
    """``x`` rounded per block to a float with ``mantissa_bits`` and the block's exponent range from ``layout``."""

    def kernel(blocks: Tensor, out: Tensor, low: Tensor, high: Tensor) -> None:
        round_to_float(blocks, mantissa_bits, low, high, out)

    def prepare(amax: Tensor) -> tuple:
        min_exponent, max_exponent, largest = layout(amax, p)
        if magic_rounding_holds(mantissa_bits, min_exponent, max_exponent):
            # round_to_float's own steps, with the checks and bounds done once per group of rows
            return magic_rounding_kernel(mantissa_bits), min_exponent, max_exponent, -largest, largest
        return kernel, min_exponent, max_exponent

    return map_blocks(x, p.block_size, prepare, grid)


def _shared_codec(layout, shared_key, element_codes, element_values, stored_dtype) -> Codec:
    """Codes of a block format: per block, ``shared_key`` (an integer the block's largest finite magnitude
    gives through ``layout``, as the format takes it; ``stored_dtype``), and per element
    ``element_codes(values_in_blocks, shared, p)`` / ``element_values(codes_in_blocks, shared, p)``."""

    def side(x: Tensor, p) -> dict[str, Tensor]:
        blocks = to_blocks(x, p.block_size)
        return {shared_key: shared_from_layout(layout(finite_amax(blocks), p), p).squeeze(-1).to(stored_dtype)}

    def codes(values: Tensor, side: dict[str, Tensor], p) -> Tensor:
        shared = side[shared_key].to(torch.int64).unsqueeze(-1)
        return from_blocks(element_codes(to_blocks(values, p.block_size), shared, p), values.shape)

    def decode(codes: Tensor, side: dict[str, Tensor], p) -> Tensor:
        shared = side[shared_key].to(torch.int64).unsqueeze(-1)
        blocks = to_blocks(codes, p.block_size)
        return from_blocks(element_values(blocks, shared, p), codes.shape)

    shared_from_layout = {"exponent": lambda lay, p: lay[0] + (p.width - 2) + p.bias,   # stored E + bias >= 0
                          "bias": lambda lay, p: 1 - lay[0]}[shared_key]
    return Codec(bits=lambda p: p.width, side=side, codes=codes, decode=decode)


def _fp_codes(blocks: Tensor, shared: Tensor, p: BlockFPParams) -> Tensor:
    """Sign and magnitude of the integer mantissa ``value * 2**-quantum``."""
    quantum = shared - p.bias - (p.width - 2)
    mantissa = exact_integers(torch.ldexp(blocks.double().abs(), (-quantum).double()))
    if mantissa.numel() and int(mantissa.max()) >= 1 << (p.width - 1):
        raise ValueError("mantissas beyond the format's codes")
    return mantissa | (torch.signbit(blocks).to(torch.int64) << (p.width - 1))


def _fp_values(codes: Tensor, shared: Tensor, p: BlockFPParams) -> Tensor:
    quantum = shared - p.bias - (p.width - 2)
    magnitude = torch.ldexp((codes & ((1 << (p.width - 1)) - 1)).double(), quantum.double()).float()
    return torch.where(((codes >> (p.width - 1)) & 1).bool(), -magnitude, magnitude)


def _grid_codec(layout, mantissa_bits) -> Codec:
    """A shared-bias block format: elements on a float grid whose lowest normal exponent is ``1 - bias``."""
    return _shared_codec(
        layout, "bias",
        lambda blocks, bias, p: float_grid_codes(blocks, p.width, mantissa_bits(p), 1 - bias),
        lambda codes, bias, p: float_grid_values(codes, p.width, mantissa_bits(p), 1 - bias),
        torch.int8,
    )


@register_format(
    "block_fp", params=BlockFPParams, bits=lambda p, shape: _block_bits(p), bounds=_bounds_from(_block_fp_layout),
    group=lambda p, row: p.block_size, codec=_shared_codec(_block_fp_layout, "exponent", _fp_codes, _fp_values, torch.uint8),
)
def block_fp(x: Tensor, p: BlockFPParams) -> Tensor:
    """Block floating point: integer mantissas sharing one exponent per block."""
    largest_code = largest_float32_at_most(2.0 ** (p.width - 1) - 1)

    def fast_kernel(blocks: Tensor, out: Tensor, *constants: Tensor) -> None:
        round_fixed_point(blocks, out, *constants).copysign_(blocks)  # the sign of a zero is kept

    def exact_kernel(blocks: Tensor, out: Tensor, quantum: Tensor) -> None:
        # clamping the codes equals clamping the values: scaling by a power of two is monotonic
        if -127 <= int(quantum.min()) and int(quantum.max()) <= 127:
            # both powers are float32 values: one exact multiplication each way
            torch.mul(blocks, pow2(-quantum), out=out).round_().clamp_(-largest_code, largest_code)
            out.mul_(pow2(quantum))
        else:
            mul_pow2(blocks, -quantum, out).round_().clamp_(-largest_code, largest_code)
            mul_pow2_(out, quantum)

    def prepare(amax: Tensor) -> tuple:
        quantum, _ = _block_fp_layout(amax, p)
        if fixed_point_rounding_holds(quantum, largest_code):
            return fast_kernel, *fixed_point_constants(quantum, largest_code)
        return exact_kernel, quantum

    grid = BlockGrid(integer_grid=True, rule="floor", mbits=p.width - 2, emax=0,
                     max_value=largest_code * 2.0 ** -(p.width - 2), shared_min=-p.bias,
                     shared_max=2**p.exponent_width - 1 - p.bias)
    return map_blocks(x, p.block_size, prepare, grid)


def _block_minifloat_layout(amax: Tensor, p: BlockMinifloatParams) -> tuple[Tensor, Tensor, Tensor]:
    """Per block, from its largest magnitude: min normal exponent, max exponent and largest value."""
    lo, hi = _signed_range(p.exponent_bias_width)
    top = 2**p.exponent_width - 1
    bias = (top - floor_log2(amax)).clamp(lo, hi)
    mantissa = p.width - 1 - p.exponent_width
    return 1 - bias, top - bias, largest_float(mantissa, top - bias)


@register_format(
    "block_minifloat",
    params=BlockMinifloatParams,
    bits=lambda p, shape: _block_bits(p),
    bounds=_bounds_from(_block_minifloat_layout),
    group=lambda p, row: p.block_size,
    codec=_grid_codec(_block_minifloat_layout, lambda p: p.width - 1 - p.exponent_width),
)
def block_minifloat(x: Tensor, p: BlockMinifloatParams) -> Tensor:
    """Minifloat elements with a per-block exponent bias aligned to the block's largest magnitude."""
    mantissa = p.width - 1 - p.exponent_width
    grid = _shared_bias_grid(p, "floor", mantissa, 2**p.exponent_width - 1)
    return _block_rounding(_block_minifloat_layout, mantissa, x, p, grid)


def _nearest_power_exponent(amax: Tensor) -> Tensor:
    """The exponent of the power of two nearest ``amax`` by value (ties up), at most 127."""
    mantissa, exponent = torch.frexp(amax)
    return (exponent - 1 + (mantissa >= 0.75).to(exponent.dtype)).clamp(max=127)


def _block_log_layout(amax: Tensor, p: BlockLogParams) -> tuple[Tensor, Tensor, Tensor]:
    """Per block, from its largest magnitude: smallest and largest nonzero exponent, and the largest value."""
    lo, hi = _signed_range(p.exponent_bias_width)
    top = 2 ** (p.width - 1) - 1
    bias = (top - _nearest_power_exponent(amax)).clamp(lo, hi)
    return 1 - bias, top - bias, largest_float(0, top - bias)


@register_format(
    "block_log", params=BlockLogParams, bits=lambda p, shape: _block_bits(p), bounds=_bounds_from(_block_log_layout),
    group=lambda p, row: p.block_size, codec=_grid_codec(_block_log_layout, lambda p: 0),
)
def block_log(x: Tensor, p: BlockLogParams) -> Tensor:
    """Powers of two with a per-block exponent bias aligned to the block's largest magnitude."""
    return _block_rounding(_block_log_layout, 0, x, p, _shared_bias_grid(p, "nearest", 0, 2 ** (p.width - 1) - 1))
