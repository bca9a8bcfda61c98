"""Binary formats: ``binary``, ``binary_scaling``, ``binary_residual_sign``.

``binary``: ``bipolar=True`` gives ±1 (``x >= 0`` -> +1, so zero maps to +1: there is no zero
code); ``bipolar=False`` gives {0, 1} (``x > 0`` -> 1, so zero stays zero). ``stochastic=True``
draws +1 (resp. 1) with probability ``clamp((x + 1) / 2, 0, 1)`` from torch's global generator.
Stored bits per element: 1.

``binary_scaling``: ``±alpha`` with ``alpha = mean(|x|)`` over each output row (dim 0; the whole
tensor for ranks 0 and 1); ``x >= 0`` -> +alpha. Stored bits: 1 per element plus one float32 alpha
per row (``1 + 32 / row_length`` when the shape is known). Usable for weights only.

``binary_residual_sign``: ``levels`` rounds of residual binarization (ReBNet-style):
``r_0 = x``, ``b_i = sign(r_i)`` (+1 at zero), ``r_{i+1} = r_i - mean_i * b_i``, value
``sum_i mean_i * b_i``. As a pure format the level means are ``mean(|r_i|)`` of the tensor; in a
quantized module they are learnable parameters (:func:`residual_sign`). Stored bits: ``levels``
per element plus ``levels`` float32 means per tensor.

Statistics (alpha, means) use finite elements only; NaN stays NaN; ±Inf takes the sign's level.

Example::

    quantize(torch.tensor([[0.5, -1.5], [2.0, 0.0]]), "binary_scaling")
    # tensor([[1.0, -1.0], [1.0, 1.0]])
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from mase_lite.numerics.registry import Codec, FormatParams, Shape, register_format


class BinaryParams(FormatParams):
    stochastic: bool = Field(False, description="draw the sign with probability (x + 1) / 2")
    bipolar: bool = Field(True, description="levels ±1; false: levels {0, 1}")


class BinaryScalingParams(FormatParams):
    pass


class ResidualSignParams(FormatParams):
    levels: int = Field(2, ge=1, le=8, description="binarization rounds, each with its own level mean")


def finite_mean_abs(x: Tensor, dims: tuple[int, ...] | None = None) -> Tensor:
    """Mean of ``|x|`` over ``dims`` (all when None) counting finite elements only; 0 when there are none."""
    finite = torch.isfinite(x)
    magnitudes = torch.where(finite, x.abs(), torch.zeros_like(x))
    if dims is None:
        return magnitudes.sum() / finite.sum().clamp(min=1)
    return magnitudes.sum(dim=dims, keepdim=True) / finite.sum(dim=dims, keepdim=True).clamp(min=1)


def sign_with_zero_positive(x: Tensor) -> Tensor:
    """+1 where ``x >= 0`` (or NaN), -1 elsewhere."""
    return torch.where(x < 0, -torch.ones_like(x), torch.ones_like(x))


def _keep_nan(x: Tensor, y: Tensor) -> Tensor:
    return torch.where(torch.isnan(x), x, y)


def _binary_bounds(x: Tensor, p: BinaryParams) -> tuple[float, float]:
    return -1.0, 1.0


def _binary_codes(values: Tensor, side: dict, p: BinaryParams) -> Tensor:
    upper = values == 1.0
    if not bool((upper | (values == (-1.0 if p.bipolar else 0.0)) | values.isnan()).all()):
        raise ValueError("values off the format's levels")
    return upper.to(torch.int64)


def _binary_values(codes: Tensor, side: dict, p: BinaryParams) -> Tensor:
    return torch.where(codes.bool(), 1.0, -1.0 if p.bipolar else 0.0)


BINARY_CODEC = Codec(bits=lambda p: 1, side=lambda x, p: None if p.stochastic else {}, codes=_binary_codes,
                     decode=_binary_values)


@register_format("binary", params=BinaryParams, bits=lambda p, shape: 1.0, bounds=_binary_bounds, codec=BINARY_CODEC)
def binary(x: Tensor, p: BinaryParams) -> Tensor:
    """±1 or {0, 1}, deterministic or stochastic."""
    if p.stochastic:
        upper = torch.rand_like(x) < ((x + 1) / 2).clamp(0, 1)
    else:
        upper = x >= 0 if p.bipolar else x > 0
    lower = -1.0 if p.bipolar else 0.0
    return _keep_nan(x, torch.where(upper, torch.ones_like(x), torch.full_like(x, lower)))


def _row_dims(x: Tensor) -> tuple[int, ...] | None:
    return tuple(range(1, x.dim())) if x.dim() >= 2 else None


def row_scales(x: Tensor) -> Tensor:
    """``alpha``: mean finite ``|x|`` per output row (dim 0), one value for ranks 0 and 1."""
    return finite_mean_abs(x, _row_dims(x))


def _row_length(shape: Shape) -> int:
    return math.prod(shape[1:]) if len(shape) >= 2 else max(math.prod(shape), 1)


def _scaling_bits(p: BinaryScalingParams, shape: Shape | None) -> float:
    return 1.0 if shape is None else 1.0 + 32 / _row_length(shape)


def _scaling_bounds(x: Tensor, p: BinaryScalingParams) -> tuple[Tensor, Tensor]:
    alpha = row_scales(x)
    return -alpha, alpha


def _signs_of(values: Tensor, alpha: Tensor) -> Tensor:
    """1 where a value is ``+alpha``, 0 where it is ``-alpha``; ``ValueError`` for any other value."""
    positive = ~torch.signbit(values)
    if not bool(((values.abs() == alpha.expand_as(values)) | values.isnan()).all()):
        raise ValueError("values off the format's levels")
    return positive.to(torch.int64)


def _plus_minus(codes: Tensor, alpha: Tensor) -> Tensor:
    alpha = alpha.expand(codes.shape)
    return torch.where(codes.bool(), alpha, alpha.neg())


SCALING_CODEC = Codec(
    bits=lambda p: 1,
    side=lambda x, p: {"alpha": row_scales(x)},
    codes=lambda values, side, p: _signs_of(values, side["alpha"]),
    decode=lambda codes, side, p: _plus_minus(codes, side["alpha"].float()),
)


@register_format(
    "binary_scaling", params=BinaryScalingParams, bits=_scaling_bits, bounds=_scaling_bounds, operands=("weight",),
    codec=SCALING_CODEC,
)
def binary_scaling(x: Tensor, p: BinaryScalingParams) -> Tensor:
    """±alpha with alpha the mean magnitude of each output row."""
    alpha = row_scales(x)
    return _keep_nan(x, sign_with_zero_positive(x) * alpha)


def residual_level_means(x: Tensor, levels: int) -> Tensor:
    """The data-derived level means ``mean(|r_i|)`` of residual binarization (shape ``(levels,)``)."""
    residual = x
    means = []
    for _ in range(levels):
        mean = finite_mean_abs(residual)
        means.append(mean)
        residual = residual - mean * sign_with_zero_positive(residual)
    return torch.stack(means)


def residual_binarize(x: Tensor, means: Tensor) -> tuple[Tensor, Tensor]:
    """The residual-binarized value of ``x`` and the signs of each level (``(levels, *x.shape)``)."""
    residual = x
    value = torch.zeros_like(x)
    signs = []
    for mean in means:
        sign = sign_with_zero_positive(residual)
        signs.append(sign)
        value = value + mean * sign
        residual = residual - mean * sign
    return _keep_nan(x, value), torch.stack(signs)


def _residual_bits(p: ResidualSignParams, shape: Shape | None) -> float:
    if shape is None:
        return float(p.levels)
    return p.levels + 32 * p.levels / max(math.prod(shape), 1)


def _residual_bounds(x: Tensor, p: ResidualSignParams) -> tuple[Tensor, Tensor]:
    reach = residual_level_means(x, p.levels).sum()
    return -reach, reach


def _residual_codes(values: Tensor, side: dict, p: ResidualSignParams) -> Tensor:
    """Bit i: the sign of level i (1 for +): the code whose sum (:func:`_residual_values`) is the value."""
    table = _residual_values(torch.arange(1 << p.levels, dtype=torch.int64), side, p)
    order = torch.argsort(table, stable=True)
    flat = values.reshape(-1).nan_to_num(float(table[0]), posinf=math.inf, neginf=-math.inf)
    position = torch.searchsorted(table[order], flat).clamp(max=len(table) - 1)
    codes = order[position]
    if not torch.equal(table[codes], flat):
        raise ValueError("values off the format's levels")
    return codes.reshape(values.shape)


def _residual_values(codes: Tensor, side: dict, p: ResidualSignParams) -> Tensor:
    value = torch.zeros(codes.shape)
    for i, mean in enumerate(side["means"].float()):  # in residual_binarize's order: the same sums
        value = value + mean * torch.where((codes >> i) & 1 == 1, 1.0, -1.0)
    return value


RESIDUAL_CODEC = Codec(bits=lambda p: p.levels, side=lambda x, p: {"means": residual_level_means(x, p.levels)},
                       codes=_residual_codes, decode=_residual_values)


@register_format(
    "binary_residual_sign", params=ResidualSignParams, bits=_residual_bits, bounds=_residual_bounds,
    codec=RESIDUAL_CODEC,
)
def binary_residual_sign(x: Tensor, p: ResidualSignParams) -> Tensor:
    """Multi-level residual binarization with level means taken from the tensor."""
    return residual_binarize(x, residual_level_means(x, p.levels))[0]


class _ResidualSign(torch.autograd.Function):
    """Residual binarization with learnable means: straight-through to ``x``, ``sum(g * b_i)`` to mean i."""

    @staticmethod
    def forward(ctx, x: Tensor, means: Tensor, clipped: bool) -> Tensor:
        x32, means32 = x.float(), means.float()
        value, signs = residual_binarize(x32, means32)
        keep = None
        if clipped:
            reach = means32.abs().sum()
            keep = (x32 >= -reach) & (x32 <= reach)
        ctx.save_for_backward(signs, keep)
        ctx.means_dtype = means.dtype
        return value.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        signs, keep = ctx.saved_tensors
        grad_means = (grad.float().unsqueeze(0) * signs).flatten(1).sum(dim=1).to(ctx.means_dtype)
        grad_x = grad if keep is None else torch.where(keep, grad, torch.zeros_like(grad))
        return grad_x, grad_means, None


def residual_sign(x: Tensor, means: Tensor, ste: str = "identity") -> Tensor:
    """Residual binarization of ``x`` with given (learnable) level ``means``; differentiable in both.

    >>> means = torch.nn.Parameter(torch.tensor([1.0, 0.5]))
    >>> residual_sign(torch.tensor([0.8, -2.0]), means).tolist()
    [0.5, -1.5]
    """
    return _ResidualSign.apply(x, means, ste == "clipped")
