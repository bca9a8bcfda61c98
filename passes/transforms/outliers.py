"""The ``outliers`` pass: give a trained pre-norm transformer a real LLM's activation outliers, its function unchanged.

Large language models have a few hidden channels whose activations at the Linears' inputs are 20–100×
the others' (Dettmers et al., 2022): what makes per-tensor activation quantization and low-bit weight
rounding hard, and what SmoothQuant, AWQ and GPTQ are for. A small model trained here has none, so those
methods have nothing to show on it. For every group of Linears reading one norm's output (q/k/v, gate/up),
this pass multiplies the same few channels of the norm by factors drawn log-uniformly in ``factors`` and
divides the group's weight columns by them (:mod:`mase_lite.passes.folding`): with power-of-two factors
(the default) the float model computes the same values bit for bit; its activations now have outliers.

Example::

    {"pass": "train"}, {"pass": "outliers", "params": {"channels": 4, "factors": [20, 100]}},
    {"pass": "quantize", ...}
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, model_validator

from mase_lite.passes.folding import fold_target, input_groups, linear_weight
from mase_lite.passes.registry import PassError, PassResult, Seed, register_pass
from mase_lite.passes.select import Selection, select_nodes


class OutliersParams(Selection):
    targets: list[str] = Field(default_factory=lambda: ["linear"], description="Linears whose inputs get outliers")
    channels: int = Field(4, ge=1, description="outlier channels (the same ones in every group)")
    factors: tuple[float, float] = Field((20.0, 100.0), description="range of the factors, drawn log-uniformly")
    power_of_two: bool = Field(True, description="round each factor to a power of two (the float model stays bit-exact)")
    seed: Seed = Field(0, description="seed of the channels and factors")

    @model_validator(mode="after")
    def _range(self) -> "OutliersParams":
        low, high = self.factors
        if not 1 <= low <= high:
            raise ValueError(f"factors must be [low, high] with 1 <= low <= high, got [{low:g}, {high:g}]")
        return self


@register_pass("outliers", kind="transform", params=OutliersParams, replay=False)
def outliers_pass(mg, params: OutliersParams):
    """Scale a few channels of each norm feeding a group of Linears up, and those Linears' columns down."""
    modules = mg.modules
    nodes = [n for n in select_nodes(mg, params.by, params.targets, params.allow_empty, modules_only=True)
             if hasattr(modules[n.target], "weight")]
    scaled, skipped = {}, {}
    generator = torch.Generator().manual_seed(params.seed)
    chosen, factors = None, None
    with torch.no_grad():
        for producer, group in input_groups(nodes).items():
            names = ", ".join(n.name for n in group)
            divide, where = fold_target(mg, producer, group, modules)
            if divide is None or where.startswith("Linear"):  # outliers arise at the norms, not between Linears
                skipped[names] = where if divide is None else f"its input comes from a Linear ({where})"
                continue
            weights = [linear_weight(modules[n.target]) for n in group]
            width = weights[0].shape[1]
            if chosen is None:
                if params.channels > width:
                    raise PassError(f"channels = {params.channels}: the Linears' inputs have only {width} channels",
                                    location=("channels",))
                chosen = torch.randperm(width, generator=generator)[: params.channels]
                low, high = (math.log2(f) for f in params.factors)
                exponents = low + (high - low) * torch.rand(params.channels, generator=generator, dtype=torch.float64)
                factors = torch.exp2(exponents.round() if params.power_of_two else exponents)
            s = torch.ones(width, dtype=torch.float64)
            s[chosen[chosen < width]] = factors[chosen < width]
            divide((1 / s).to(weights[0].dtype))
            for w in weights:
                w.div_(s.to(w.dtype))
            scaled[names] = {"into": where}
    if not scaled:
        raise PassError("no group of Linears reads a norm's output: outliers needs a pre-norm transformer "
                        f"({len(skipped)} groups skipped)")
    return PassResult({"channels": chosen.tolist(), "factors": factors.tolist(), "scaled": scaled, "skipped": skipped})
