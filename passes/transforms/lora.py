"""``lora``: wrap the selected Linears in LoRA adapters (bias kept, B = 0, base frozen).

Accepts MASE's keys as well: ``r`` for ``rank``, ``lora_alpha`` for ``alpha``, ``lora_dropout`` for ``dropout``.

Example::

    mg, info = ml.passes.lora(mg, {"by": "regex", "targets": [".*attention_self_(query|value)"],
                                   "rank": 8, "lora_alpha": 16, "lora_dropout": 0.1})
    info["adapted"], info["trainable"]
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn as nn
from pydantic import AliasChoices, Field

from mase_lite.nn.lora import LoRALinear
from mase_lite.passes.registry import PassError, register_pass
from mase_lite.passes.select import Selection, select_modules

logger = logging.getLogger(__name__)


class LoRAParams(Selection):
    """Which Linears get adapters, and the adapters' shape."""

    rank: int = Field(8, ge=1, validation_alias=AliasChoices("rank", "r"), description="rank of A and B (alias: r)")
    alpha: float | None = Field(
        None, validation_alias=AliasChoices("alpha", "lora_alpha"), description="scale numerator; default = rank"
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, validation_alias=AliasChoices("dropout", "lora_dropout"), description="dropout on the adapter input"
    )
    freeze: Literal["all", "adapted"] = Field(
        "all", description="'all': only adapter parameters stay trainable; 'adapted': freeze just the wrapped Linears"
    )
    seed: int = Field(0, description="seed of A's initialisation")


def freeze_all_but_adapters(model: nn.Module) -> None:
    """Set ``requires_grad`` so that only LoRA ``lora_A`` / ``lora_B`` parameters train."""
    adapters = {id(p) for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)}
    for p in model.parameters():
        p.requires_grad_(id(p) in adapters)


@register_pass("lora", kind="transform", params=LoRAParams)
def lora(mg, params: LoRAParams):
    """Replace each selected ``nn.Linear`` with a ``LoRALinear`` wrapping it."""
    modules = mg.modules
    targets = {}
    for target, name in select_modules(mg, params).items():
        module = modules[target]
        if isinstance(module, LoRALinear):
            continue
        if not isinstance(module, nn.Linear):
            raise PassError(f"lora: node {name!r} is a {type(module).__name__}; LoRA adapts nn.Linear modules only")
        targets[target] = name
    generator = torch.Generator().manual_seed(params.seed)
    alpha = float(params.rank) if params.alpha is None else params.alpha
    for target in targets:
        mg.replace_module(target, LoRALinear(modules[target], params.rank, alpha, params.dropout, generator))
    if params.freeze == "all":
        freeze_all_but_adapters(mg.model)
    mg.refresh_metadata()
    trainable = sum(p.numel() for p in mg.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in mg.model.parameters())
    logger.info("LoRA on %d Linears; %d of %d parameters trainable", len(targets), trainable, total)
    return mg, {"adapted": list(targets.values()), "trainable": trainable, "total": total}
