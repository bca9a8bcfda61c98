"""``prune``: weight pruning through saved masks, activation pruning through removable hooks.

Example (the course's config shape)::

    mg, info = ml.passes.prune(mg, {
        "weight": {"sparsity": 0.5, "method": "l1-norm", "scope": "local"},
        "activation": {"sparsity": 0.3, "method": "random"},
    })
    info["nodes"]["bert_encoder_layer_0_attention_self_query"]["weight_sparsity"]   # 0.5
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from pydantic import Field

from mase_lite.nn.pruning import ActivationPruner, attach_activation_pruner, attach_weight_mask, weight_masks
from mase_lite.passes.registry import PassError, PassParams, PassResult, register_pass
from mase_lite.passes.select import Selection, select_modules

logger = logging.getLogger(__name__)

PRUNABLE_OPS = ("linear", "conv1d", "conv2d", "conv3d")


class WeightPruning(PassParams):
    """How much of the selected weights to prune, and how."""

    sparsity: float = Field(0.5, ge=0.0, le=1.0, description="fraction of units pruned, rounded half to even")
    method: Literal["random", "l1-norm"] = Field("l1-norm", description="rank units by magnitude or at random")
    scope: Literal["local", "global"] = Field("local", description="rank within each weight, or across all selected")
    granularity: Literal["unstructured", "elementwise", "row", "channel"] = Field(
        "unstructured", description="prune elements, or whole output rows (Linear) / output channels (Conv)"
    )
    seed: int = Field(0, description="seed of the random method")


class ActivationPruning(PassParams):
    """How much of each sample's input activation the selected modules zero on every call."""

    sparsity: float = Field(0.5, ge=0.0, le=1.0, description="fraction of each sample's elements zeroed")
    method: Literal["random", "l1-norm"] = Field("l1-norm", description="zero the smallest magnitudes, or at random")
    scope: Literal["local"] = Field("local", description="activations are pruned per sample of each module")
    granularity: Literal["unstructured", "elementwise"] = Field("unstructured", description="elements are pruned")
    seed: int = Field(0, description="seed of the random method")


class PruneParams(Selection):
    """Selection plus the course's ``{"weight": {...}, "activation": {...}}`` config (either may be null)."""

    targets: list[str] = Field(default_factory=lambda: list(PRUNABLE_OPS), description="ops, node names or patterns")
    weight: WeightPruning | None = Field(default_factory=WeightPruning, description="weight pruning, or null")
    activation: ActivationPruning | None = Field(None, description="activation pruning, or null")


def _granularity(name: str) -> str:
    return "unstructured" if name == "elementwise" else name


@register_pass("prune", kind="transform", params=PruneParams, needs_graph=False)
def prune(mg, params: PruneParams):
    """Prune weights (masks saved with the model) and/or input activations (hooks) of the selected modules."""
    modules = mg.modules
    by_target = select_modules(mg, params)
    report: dict[str, dict] = {name: {} for name in by_target.values()}

    if params.weight is not None and by_target:
        w = params.weight
        weights = {}
        for target, name in by_target.items():
            weight = getattr(modules[target], "weight", None)
            if not isinstance(weight, torch.Tensor):
                raise PassError(
                    f"prune: node {name!r} ({type(modules[target]).__name__}) has no weight to prune; select "
                    f"Linear/Conv nodes, or set weight to null to prune activations only"
                )
            weights[target] = weight
        masks = weight_masks(weights, w.sparsity, w.method, _granularity(w.granularity), w.scope, w.seed)
        for target, name in by_target.items():
            with torch.no_grad():
                attach_weight_mask(modules[target], masks[target])
            pruned = int((~masks[target]).sum())
            report[name].update(
                weight_pruned=pruned, weight_total=masks[target].numel(), weight_sparsity=pruned / masks[target].numel()
            )

    if params.activation is not None:
        a = params.activation
        for index, (target, name) in enumerate(by_target.items()):
            attach_activation_pruner(modules[target], ActivationPruner(a.sparsity, a.method, seed=a.seed + index))
            report[name]["activation_sparsity"] = a.sparsity

    logger.info("pruned %d modules", len(by_target))
    return PassResult({"nodes": report})
