"""``prune``: weight pruning through saved masks, activation pruning through removable hooks.

Example (the course's config shape)::

    mg, info = ml.passes.prune(mg, {
        "weight": {"sparsity": 0.5, "method": "l1-norm", "scope": "local"},
        "activation": {"sparsity": 0.3, "method": "random"},
    })
    info["nodes"]["bert_encoder_layer_0_attention_self_query"]["weight_sparsity"]   # 0.5

For LLMs, two methods look at calibration data (the pipeline's ``data``), one repeated block at a time
(:mod:`mase_lite.passes.layerwise`): ``wanda`` prunes the weights of least ``|w| · ‖x‖`` in each row, and
``sparsegpt`` chooses by ``w² / [H⁻¹]ᵢᵢ²`` and moves the kept weights to make up for the pruned ones (the GPTQ
sweep, :mod:`mase_lite.algorithms.gptq`); a layer given a weight format by ``quantize`` is quantized in the same
sweep, its codes holding the zeros. Both take ``granularity: "2:4"`` (``n`` of every ``m`` consecutive
inputs of a row pruned, the pattern sparse tensor cores run)::

    {"pass": "prune", "params": {"targets": ["linear"], "ignore": ["lm_head"],
                                 "weight": {"method": "sparsegpt", "granularity": "2:4"}}}
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Literal, get_args

import torch
import torch.nn as nn
from pydantic import Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mase_lite.algorithms.gptq import gptq
from mase_lite.layers.pruning import (ActivationPruner, Sparsity, attach_activation_pruner, attach_weight_mask, check_n_of_m,
                                  wanda_mask, weight_masks)
from mase_lite.passes.layerwise import calibration_batches, collect, each_block, store_weight, weight_of
from mase_lite.passes.registry import PassError, PassParams, PassResult, Seed, register_pass
from mase_lite.passes.select import Selection, select_modules

logger = logging.getLogger(__name__)

PRUNABLE_OPS = ("linear", "conv1d", "conv2d", "conv3d")


CALIBRATED = ("wanda", "sparsegpt")
NofM = Annotated[str, StringConstraints(pattern=r"^[0-9]+:[0-9]+$")]
Granularity = Literal["unstructured", "elementwise", "row", "channel"]
GRANULARITIES = get_args(Granularity)


class WeightPruning(PassParams):
    """How much of the selected weights to prune, and how."""

    sparsity: float = Field(0.5, ge=0.0, le=1.0, description="fraction of units pruned, rounded half to even "
                            "(with an n:m granularity: n/m)")
    method: Literal["random", "l1-norm", "wanda", "sparsegpt"] = Field(
        "l1-norm", description="rank units by magnitude or at random; wanda and sparsegpt: by their effect on "
        "calibration data (Linear layers, local scope)")
    scope: Literal["local", "global"] = Field("local", description="rank within each weight, or across all selected")
    granularity: Granularity | NofM = Field(
        "unstructured", description="prune elements, whole output rows (Linear) / output channels (Conv), or 'n:m': "
        "n of every m consecutive inputs of each row (2:4)"
    )
    seed: Seed = Field(0, description="seed of the random method")
    num_batches: int = Field(16, ge=1, description="calibration batches (wanda, sparsegpt)")
    batch_size: int = Field(8, ge=1, description="rows per calibration batch (wanda, sparsegpt)")
    split: str = Field("train", description="data split of the calibration batches (wanda, sparsegpt)")
    damp: float = Field(0.01, gt=0, description="sparsegpt: added to the Hessian's diagonal, as a fraction of its mean")
    block_size: int = Field(128, ge=1, description="sparsegpt: columns per lazy batch update and mask choice")

    @field_validator("granularity", mode="before")
    @classmethod
    def _one_message(cls, value):
        if isinstance(value, str) and (value in GRANULARITIES or re.fullmatch(r"[0-9]+:[0-9]+", value)):
            return value
        raise PydanticCustomError("granularity", "should be {allowed} or 'n:m' (e.g. '2:4')",
                                  {"allowed": ", ".join(map(repr, GRANULARITIES))})

    @model_validator(mode="after")
    def _pattern(self) -> "WeightPruning":
        n_of_m = self.n_of_m
        if n_of_m is not None:
            n, m = n_of_m
            if not 0 < n < m:
                raise ValueError(f"granularity {self.granularity!r}: n of n:m must be between 1 and m - 1")
            if "sparsity" in self.model_fields_set and self.sparsity != n / m:
                raise ValueError(f"granularity {self.granularity!r} prunes {n / m:g} of the weights; sparsity is "
                                 f"{self.sparsity:g} (leave it out)")
            if self.scope != "local":
                raise ValueError(f"granularity {self.granularity!r} prunes within each row: scope must be local")
        if self.method in CALIBRATED:
            if self.scope != "local":
                raise ValueError(f"method {self.method!r} prunes each layer on its own: scope must be local")
            if self.granularity in ("row", "channel"):
                raise ValueError(f"method {self.method!r} prunes weights, unstructured or n:m, not {self.granularity}s")
        return self

    @property
    def n_of_m(self) -> tuple[int, int] | None:
        """``(n, m)`` of an ``n:m`` granularity, else None."""
        match = re.fullmatch(r"([0-9]+):([0-9]+)", self.granularity)
        return (int(match[1]), int(match[2])) if match else None

    @property
    def pattern(self) -> Sparsity:
        n_of_m = self.n_of_m
        return Sparsity(n=n_of_m[0], m=n_of_m[1]) if n_of_m else Sparsity(self.sparsity)


class ActivationPruning(PassParams):
    """How much of each sample's input activation the selected modules zero on every call."""

    sparsity: float = Field(0.5, ge=0.0, le=1.0, description="fraction of each sample's elements zeroed")
    method: Literal["random", "l1-norm"] = Field("l1-norm", description="zero the smallest magnitudes, or at random")
    scope: Literal["local"] = Field("local", description="activations are pruned per sample of each module")
    granularity: Literal["unstructured", "elementwise"] = Field("unstructured", description="elements are pruned")
    seed: Seed = Field(0, description="seed of the random method")


class PruneParams(Selection):
    """Selection plus the course's ``{"weight": {...}, "activation": {...}}`` config (either may be null)."""

    targets: list[str] = Field(default_factory=lambda: list(PRUNABLE_OPS), description="ops, node names or patterns")
    weight: WeightPruning | None = Field(default_factory=WeightPruning, description="weight pruning, or null")
    activation: ActivationPruning | None = Field(None, description="activation pruning, or null")


def _granularity(name: str) -> str:
    return "unstructured" if name == "elementwise" else name


def _needs(params: PruneParams) -> tuple[str, ...]:
    return ("data",) if params.weight is not None and params.weight.method in CALIBRATED else ()


def _calibrated(mg, layers: dict[str, nn.Module], w: WeightPruning, ctx, report: dict[str, dict]) -> None:
    """Wanda or SparseGPT on each layer, one repeated block at a time; the layers are masked as they go, so later
    blocks see the pruned ones."""
    for target, layer in layers.items():
        if not isinstance(getattr(layer, "weight", None), torch.Tensor) or layer.weight.dim() != 2:
            raise PassError(f"prune: method {w.method!r} prunes Linear layers; {target!r} is a {type(layer).__name__}")
    pattern = w.pattern
    if pattern.m:  # before any block runs
        for target, layer in layers.items():
            check_n_of_m(target, weight_of(layer), pattern)

    def handle(inside: dict[str, nn.Module], run) -> None:
        statistics = collect(inside, run, torch.float32, diagonal=w.method == "wanda", who=f"prune ({w.method})")
        for target, layer in inside.items():
            weight = weight_of(layer)
            stats = statistics.sums.pop(target)
            fmt = layer.weight_quantizer.spec.as_dict() if getattr(layer, "weight_quantizer", None) is not None else None
            if w.method == "wanda":
                keep, entry = wanda_mask(weight, stats.sqrt(), pattern), {}
            else:
                result = gptq(weight, stats, fmt, sparsity=pattern, block_size=w.block_size, damp=w.damp,
                              dtype=torch.float32)
                store_weight(layer, result.weight, result.side, fmt)
                keep, entry = result.mask, {"error": result.error, "magnitude_error": result.rtn_error}
            if fmt is None or w.method == "wanda":  # a quantized layer's codes hold SparseGPT's zeros themselves
                with torch.no_grad():
                    attach_weight_mask(layer, keep if layer.weight.shape == keep.shape else keep.t())
            pruned = int((~keep).sum())
            report[target].update(weight_pruned=pruned, weight_total=keep.numel(), weight_sparsity=pruned / keep.numel(),
                                  **entry)

    each_block(mg.source_model, layers, calibration_batches(mg, ctx.data, w.split, w.batch_size, w.num_batches), handle)


@register_pass("prune", kind="transform", params=PruneParams, requires=_needs, needs_graph=False)
def prune(mg, params: PruneParams, ctx):
    """Prune weights (masks saved with the model) and/or input activations (hooks) of the selected modules."""
    modules = mg.modules
    by_target = select_modules(mg, params)
    report: dict[str, dict] = {name: {} for name in by_target.values()}
    replay = None

    if params.weight is not None and by_target:
        w = params.weight
        if w.method in CALIBRATED:
            _calibrated(mg, {target: modules[target] for target in by_target}, w, ctx,
                        {target: report[name] for target, name in by_target.items()})
            # a load rebuilds the masks' structure only; the checkpoint holds the masks and weights
            replay = params.model_copy(update={"weight": w.model_copy(update={"method": "l1-norm"})}).model_dump(mode="json")
        else:
            weights = {}
            for target, name in by_target.items():
                weight = getattr(modules[target], "weight", None)
                if not isinstance(weight, torch.Tensor):
                    raise PassError(
                        f"prune: node {name!r} ({type(modules[target]).__name__}) has no weight to prune; select "
                        f"Linear/Conv nodes, or set weight to null to prune activations only"
                    )
                weights[target] = weight
            masks = weight_masks(weights, w.sparsity, w.method, _granularity(w.granularity), w.scope, w.seed,
                                 pattern=w.pattern if w.n_of_m else None)
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
    return PassResult({"nodes": report}, replay_params=replay)
