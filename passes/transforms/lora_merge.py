"""``lora_merge``: fold LoRA adapters back into plain Linears (weight ``W + alpha/rank * B @ A``).

What ``lora`` froze trains again: a merged Linear's parameters as before they were wrapped, and the
rest of the model (``freeze: "all"``) once no adapter left in it keeps them frozen, so merging every
adapter gives back the model's trainability before LoRA. A pruned Linear keeps its weight mask.

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> mg, _ = ml.passes.lora(mg, {"rank": 2})               # every Linear; the rest frozen
>>> mg, info = ml.passes.lora_merge(mg, {"by": "name", "targets": ["fc2"]})
>>> info, type(mg.modules["fc2"]).__name__, mg.modules["fc2"].weight.requires_grad
({'merged': ['fc2']}, 'Linear', True)
>>> mg, info = ml.passes.lora_merge(mg)                    # every adapter left
>>> info, all(p.requires_grad for p in mg.model.parameters())
({'merged': ['fc1']}, True)
"""

from __future__ import annotations

from pydantic import Field

from mase_lite.layers.lora import LoRALinear, freeze_records, frozen_by_lora
from mase_lite.passes.registry import PassError, PassResult, register_pass
from mase_lite.passes.select import Selection, select_modules


class LoRAMergeParams(Selection):
    """Which LoRA modules to merge (all by default)."""

    targets: list[str] = Field(default_factory=lambda: [LoRALinear.mase_op], description="ops, node names or patterns")


@register_pass("lora_merge", kind="transform", params=LoRAMergeParams, needs_graph=False)
def lora_merge(mg, params: LoRAMergeParams):
    """Replace each selected ``LoRALinear`` with the equivalent ``nn.Linear``."""
    modules = mg.modules
    merged = select_modules(mg, params)
    for target, name in merged.items():
        if not isinstance(modules[target], LoRALinear):
            raise PassError(f"lora_merge: node {name!r} is a {type(modules[target]).__name__}, not a LoRALinear")
    before = freeze_records(mg.model)
    for target in merged:
        mg.replace_module(target, modules[target].merged())
    still_frozen = frozen_by_lora(mg.model)
    for record in before.values():
        for p in record.params:
            if id(p) not in still_frozen:
                p.requires_grad_(True)
    return PassResult({"merged": list(merged.values())})
