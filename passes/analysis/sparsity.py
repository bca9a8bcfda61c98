"""``sparsity``: achieved weight and activation sparsity of each selected node.

Weight sparsity is the fraction of exact zeros in the weight the module computes with (masks
applied). Activation sparsity is the fraction of zeros in the inputs that a module's
activation-pruning hook has passed on since it was attached (None for modules without one, or
before the first forward call).

>>> from collections import OrderedDict
>>> import torch, torch.nn as nn, mase_lite as ml
>>> model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 2)))
>>> mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})
>>> mg, _ = ml.passes.prune(mg, {"by": "name", "targets": ["fc1"], "weight": {"sparsity": 0.5}})
>>> mg, info = ml.passes.sparsity(mg)
>>> [info["nodes"]["fc1"][key] for key in ("weight_zeros", "weight_total", "weight_sparsity", "activation_sparsity")]
[64, 128, 0.5, None]
>>> info["weight_sparsity"]        # over every selected weight together: 64 of 160
0.4
>>> info["metrics"]                # report.json's metrics: sparsity.weights (and .activations once measured)
{'weights': 0.4}
"""

from __future__ import annotations

import torch
from pydantic import Field

from mase_lite.layers.pruning import activation_pruner_of, weight_mask_of
from mase_lite.passes.registry import PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes
from mase_lite.passes.transforms.prune import PRUNABLE_OPS


class SparsityParams(Selection):
    """Which nodes to report on."""

    targets: list[str] = Field(default_factory=lambda: list(PRUNABLE_OPS), description="ops, node names or patterns")


@register_pass("sparsity", kind="analysis", params=SparsityParams, metrics=("weights", "activations"),
               needs_graph=False)
def sparsity(mg, params: SparsityParams):
    """Report achieved weight and activation sparsity per node, and over all selected weights."""
    nodes = select_nodes(mg, params.by, params.targets, params.allow_empty, modules_only=True)
    modules = mg.modules
    report, zeros, total = {}, 0, 0
    for node in nodes:
        module = modules[node.target]
        entry: dict = {"masked": weight_mask_of(module) is not None}
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            with torch.no_grad():
                n_zero = int((weight == 0).sum())
            entry.update(weight_zeros=n_zero, weight_total=weight.numel(), weight_sparsity=n_zero / max(weight.numel(), 1))
            zeros, total = zeros + n_zero, total + weight.numel()
        pruner = activation_pruner_of(module)
        entry["activation_sparsity"] = pruner.achieved if pruner is not None else None
        if pruner is not None:
            entry["activation_target"] = pruner.sparsity
        report[node.name] = entry
    achieved = [e["activation_sparsity"] for e in report.values() if e["activation_sparsity"] is not None]
    metrics = {"weights": zeros / total} if total else {}
    if achieved:
        metrics["activations"] = sum(achieved) / len(achieved)
    return PassResult({"nodes": report, "weight_sparsity": zeros / total if total else None}, metrics=metrics)
