"""``report_trainable``: trainable and total parameters per module, and for the whole model.

Each module is credited with the parameters it owns directly, so the rows add up to the totals
(a parameter shared by two modules is counted once, at its first owner).

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> _ = mg.modules["fc1"].requires_grad_(False)
>>> mg, info = ml.passes.report_trainable(mg)
>>> info["trainable"], info["total"], info["fraction"]
(34, 178, 0.19101123595505617)
>>> info["modules"]["fc1"]
{'trainable': 0, 'total': 144}
"""

from __future__ import annotations

import logging

from mase_lite.passes.registry import NoParams, PassResult, register_pass

logger = logging.getLogger(__name__)


@register_pass("report_trainable", kind="analysis", params=NoParams, needs_graph=False)
def report_trainable(mg, params: NoParams):
    """Count trainable and total parameters per module that owns parameters."""
    seen: set[int] = set()
    modules: dict[str, dict[str, int]] = {}
    for name, module in mg.model.named_modules():
        trainable = total = 0
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
            trainable += p.numel() if p.requires_grad else 0
        if total:
            modules[name or "<root>"] = {"trainable": trainable, "total": total}
    trainable = sum(m["trainable"] for m in modules.values())
    total = sum(m["total"] for m in modules.values())
    logger.info("trainable parameters: %d of %d (%.2f%%)", trainable, total, 100.0 * trainable / max(total, 1))
    return PassResult({"modules": modules, "trainable": trainable, "total": total, "fraction": trainable / total if total else 0.0})
