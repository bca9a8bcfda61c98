"""LoRA: a frozen Linear plus a trainable low-rank update ``(alpha / rank) * B @ A``.

B starts at zero, so wrapping a Linear leaves its output unchanged; the bias is kept; only
``lora_A`` and ``lora_B`` are trainable. ``merged()`` folds the update back into a plain Linear.
A pruned base (weight mask) keeps its sparsity: the update is masked too, and so is the merged Linear.

>>> import torch, torch.nn as nn
>>> from mase_lite.layers.lora import LoRALinear
>>> base = nn.Linear(16, 8)
>>> lora = LoRALinear(base, rank=4, alpha=8, dropout=0.1)
>>> x = torch.randn(2, 16)
>>> torch.equal(lora.eval()(x), base(x))     # until lora_B is trained
True
>>> [name for name, p in lora.named_parameters() if p.requires_grad]
['lora_A', 'lora_B']
>>> _ = nn.init.normal_(lora.lora_B)          # as if trained
>>> plain = lora.merged()                     # nn.Linear with weight W + (alpha / rank) * B @ A
>>> torch.allclose(plain(x), lora(x), atol=1e-6), plain.weight.requires_grad
(True, True)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mase_lite.infra.errors import UserError
from mase_lite.layers.pruning import attach_weight_mask, share_activation_pruner, weight_mask_of
from mase_lite.layers.quantized import quantized_like


class LoRALinear(nn.Module):
    """``y = base(x) + scaling * dropout(x) @ A^T @ B^T`` with ``A: rank x in``, ``B: out x rank``."""

    mase_op = "lora_linear"

    def __init__(
        self,
        base: nn.Linear,
        rank: int = 8,
        alpha: float = 8.0,
        dropout: float = 0.0,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise UserError(f"LoRA wraps nn.Linear modules, got {type(base).__name__}")
        if rank < 1:
            raise UserError(f"{rank!r} must be a positive integer", location=("rank",))
        if not 0.0 <= dropout < 1.0:
            raise UserError(f"{dropout!r} must be in [0, 1)", location=("dropout",))
        self.base = base
        self.base_trainable = {name: p.requires_grad for name, p in _own_parameters(base).items()}
        self.base.requires_grad_(False)
        self.frozen_with: FrozenParameters | None = None
        self.rank = rank
        self.alpha = alpha
        self.scaling = alpha / rank
        weight = base.weight
        factory = {"device": weight.device, "dtype": weight.dtype}
        a = torch.empty(rank, base.in_features, dtype=torch.float32)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        self.lora_A = nn.Parameter(a.to(**factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        self.dropout = nn.Dropout(dropout)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> torch.Tensor:
        """The update ``scaling * B @ A``, shaped like the base weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = weight_mask_of(self.base)
        if mask is None:
            update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scaling
        else:
            update = F.linear(self.dropout(x), mask(self.delta_weight()))
        return self.base(x) + update

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A Linear computing the same function (in eval mode): weight ``W + scaling * B @ A``, same bias.

        The new parameters copy the base's device and dtype, and the ``requires_grad`` the base had before
        it was wrapped. A pruned base gives a Linear with the same weight mask (pruned weights stay zero
        in later training). A quantized base gives a layer quantized with the same config, applied to the
        merged weight (so equal up to quantization); the base's activation pruner is kept.
        """
        weight = self.base.weight
        mask = weight_mask_of(self.base)
        wide = torch.promote_types(weight.dtype, torch.float32)
        merged_weight = (weight.to(wide) + self.delta_weight().to(wide)).to(weight.dtype)
        plain = nn.Linear(
            self.in_features, self.out_features, bias=self.base.bias is not None, device=weight.device, dtype=weight.dtype
        )
        plain.weight.copy_(merged_weight if mask is None else mask(merged_weight))
        if self.base.bias is not None:
            plain.bias.copy_(self.base.bias)
        for name, p in plain.named_parameters():
            p.requires_grad_(self.base_trainable[name])
        if mask is not None:
            attach_weight_mask(plain, mask.mask.clone())
        share_activation_pruner(self.base, plain)
        return quantized_like(self.base, plain)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, dropout={self.dropout.p}"


class FrozenParameters:
    """The parameters that one ``lora`` pass with ``freeze: "all"`` keeps frozen outside the Linears it wraps.

    Every adapter of that call points to the same record (``LoRALinear.frozen_with``). A parameter
    trains again once no adapter left in the model has a record that lists it, so merging every
    adapter gives back the trainability the model had before LoRA.
    """

    def __init__(self, params: list[nn.Parameter]):
        self.params = list(params)


def freeze_records(model: nn.Module) -> dict[int, FrozenParameters]:
    """The records of the adapters in ``model``, by ``id``."""
    return {id(m.frozen_with): m.frozen_with for m in model.modules() if isinstance(m, LoRALinear) and m.frozen_with}


def frozen_by_lora(model: nn.Module) -> set[int]:
    """The ``id`` of every parameter that an adapter in ``model`` keeps frozen."""
    return {id(p) for record in freeze_records(model).values() for p in record.params}


def _own_parameters(linear: nn.Module) -> dict[str, nn.Parameter]:
    """``{"weight": ..., "bias": ...}``: the Linear's own Parameters (a masked weight's unmasked original)."""
    params = {}
    chains = getattr(linear, "parametrizations", {})
    for name in ("weight", "bias"):
        param = chains[name].original if name in chains else getattr(linear, name)
        if param is not None:
            params[name] = param
    return params
