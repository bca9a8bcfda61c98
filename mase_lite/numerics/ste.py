"""Straight-through estimators: the forward pass gives the quantized value, the backward pass the input's gradient.

``"identity"`` passes the gradient everywhere; ``"clipped"`` zeroes it where the input saturated
(lay outside the format's smallest..largest value).

>>> import torch
>>> x = torch.tensor([0.2, 3.0], requires_grad=True)
>>> saturated = x.detach() > 1.0
>>> y = straight_through(x, x.detach().round().clamp(max=1.0), keep=~saturated)
>>> y.detach().tolist()
[0.0, 1.0]
>>> y.sum().backward()
>>> x.grad.tolist()                 # dy/dx = 1, but 0 where saturated (without keep: 1 everywhere)
[1.0, 0.0]
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

SteKind = Literal["identity", "clipped"]
STE_KINDS: tuple[str, ...] = ("identity", "clipped")


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, value: Tensor, keep: Tensor | None) -> Tensor:
        ctx.save_for_backward(keep)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        if keep is not None:
            grad = torch.where(keep, grad, torch.zeros_like(grad))
        return grad, None, None


def straight_through(x: Tensor, value: Tensor, keep: Tensor | None = None) -> Tensor:
    """``value`` in the forward pass; the gradient of ``x`` (masked by ``keep``) in the backward pass."""
    return _StraightThrough.apply(x, value, keep)
