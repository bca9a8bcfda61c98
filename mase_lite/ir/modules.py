"""Small modules that capture inserts where export baked a training-mode constant into a function call."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledDotProductAttention(nn.Module):
    """``F.scaled_dot_product_attention`` whose dropout follows the module's train/eval mode.

    >>> import torch
    >>> q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    >>> attn = ScaledDotProductAttention(dropout_p=0.1).eval()
    >>> out = attn(q, k, v, scale=0.5)        # no dropout in eval mode
    >>> torch.allclose(out, torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1) @ v, atol=1e-6)
    True
    """

    def __init__(self, dropout_p: float = 0.0):
        super().__init__()
        self.dropout_p = dropout_p

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    def extra_repr(self) -> str:
        return f"dropout_p={self.dropout_p}"
