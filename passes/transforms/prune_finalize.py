"""``prune_finalize``: bake weight masks into the weights; optionally remove activation-pruning hooks.

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5}, "activation": {"sparsity": 0.25}})
>>> mg, info = ml.passes.prune_finalize(mg, {"activations": "remove"})
>>> info["baked"]                   # modules whose zeros are now plain weight values
['fc1', 'fc2']
>>> type(mg.modules["fc1"]).__name__, int((mg.modules["fc1"].weight == 0).sum())
('Linear', 64)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mase_lite.layers.pruning import bake_weight_mask, detach_activation_pruner
from mase_lite.passes.registry import PassParams, PassResult, register_pass


class PruneFinalizeParams(PassParams):
    """What happens to activation pruning (weights are always baked)."""

    activations: Literal["keep", "remove"] = Field("keep", description="keep or remove activation-pruning hooks")


@register_pass("prune_finalize", kind="transform", params=PruneFinalizeParams, needs_graph=False)
def prune_finalize(mg, params: PruneFinalizeParams):
    """Write every weight mask into its weight (same Parameter objects) and drop the masks."""
    baked, unhooked = [], []
    for name, module in mg.modules.items():
        if bake_weight_mask(module):
            baked.append(name)
        if params.activations == "remove" and detach_activation_pruner(module):
            unhooked.append(name)
    return PassResult({"baked": baked, "activation_hooks_removed": unhooked})
