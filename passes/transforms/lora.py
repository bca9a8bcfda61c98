"""``lora``: wrap the selected Linears in LoRA adapters (bias kept, B = 0, base frozen).

Accepts MASE's keys as well: ``r`` for ``rank``, ``lora_alpha`` for ``alpha``, ``lora_dropout`` for ``dropout``.

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> mg, info = ml.passes.lora(mg, {"by": "name", "targets": ["fc1"], "r": 4, "lora_alpha": 8})
>>> info                                   # A: 4 x 8, B: 16 x 4; everything else is frozen
{'adapted': ['fc1'], 'trainable': 96, 'total': 274}

On BERT, the course's call: ``{"by": "regex", "targets": [".*attention_self_(query|value)"], "r": 8}``.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn as nn
from pydantic import AliasChoices, Field

from mase_lite.infra.limits import check_fits
from mase_lite.layers.lora import FrozenParameters, LoRALinear, freeze_records, frozen_by_lora
from mase_lite.passes.registry import PassError, PassResult, Seed, register_pass
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
    seed: Seed = Field(0, description="seed of A's initialisation")


def freeze_all_but_adapters(model: nn.Module) -> FrozenParameters:
    """Freeze every parameter but the LoRA ``lora_A`` / ``lora_B``.

    The record lists what this call keeps frozen: the parameters it froze, and those that earlier
    adapters still in the model keep frozen (the wrapped Linears record their own).
    """
    adapters = {id(p) for m in model.modules() if isinstance(m, LoRALinear) for p in (m.lora_A, m.lora_B)}
    earlier = frozen_by_lora(model)
    frozen = [p for p in model.parameters() if (p.requires_grad or id(p) in earlier) and id(p) not in adapters]
    for p in frozen:
        p.requires_grad_(False)
    return FrozenParameters(frozen)


def _release(linear: nn.Module, model: nn.Module) -> None:
    """Make ``linear``'s parameters trainable again if an earlier ``lora`` froze them, and drop them from its record.

    The adapter about to wrap ``linear`` then records them as trainable, and its merge restores them.
    """
    own = {id(p) for p in linear.parameters()}
    for record in freeze_records(model).values():
        for p in record.params:
            if id(p) in own:
                p.requires_grad_(True)
        record.params = [p for p in record.params if id(p) not in own]


@register_pass("lora", kind="transform", params=LoRAParams, needs_graph=False)
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
    adapter_elements = sum(params.rank * (modules[t].in_features + modules[t].out_features) for t in targets)
    check_fits("lora.rank", adapter_elements * 4, f"{len(targets)} adapters of rank {params.rank}")
    generator = torch.Generator().manual_seed(params.seed)
    alpha = float(params.rank) if params.alpha is None else params.alpha
    adapters = []
    for target in targets:
        _release(modules[target], mg.model)
        adapters.append(LoRALinear(modules[target], params.rank, alpha, params.dropout, generator))
        mg.replace_module(target, adapters[-1])
    if params.freeze == "all":
        record = freeze_all_but_adapters(mg.model)
        for adapter in adapters:
            adapter.frozen_with = record
    trainable = sum(p.numel() for p in mg.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in mg.model.parameters())
    logger.info("LoRA on %d Linears; %d of %d parameters trainable", len(targets), trainable, total)
    return PassResult({"adapted": list(targets.values()), "trainable": trainable, "total": total})
