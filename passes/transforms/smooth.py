"""The ``smooth`` pass (SmoothQuant, Xiao et al., 2022): move activation outliers into the weights.

For the Linears reading one input (a pre-norm transformer's q/k/v, or gate/up), each input channel ``j``
gets ``s_j = max|X_j|**alpha / max|W_:,j|**(1 - alpha)`` (the activation magnitudes from the ``calibrate``
pass, the weight magnitudes over every Linear of the group); the input is divided by ``s`` — folded into
what produces it: a LayerNorm's weight and bias, an RMSNorm's weight (the ``mul`` by a parameter that
ends it), or a preceding Linear's rows — and each weight's column ``j`` multiplied by ``s_j``. The float
model computes the same function (with ``power_of_two``, the same values bit for bit); activations are
then easier to quantize. A group whose input has readers outside it (a post-norm residual) or that no
such producer makes is left alone and listed with the reason. Weights change, the graph does not.

Example::

    {"pass": "calibrate"}, {"pass": "smooth", "params": {"alpha": 0.5}}, {"pass": "calibrate"},
    {"pass": "quantize", "params": {"rules": {"linear": {"data_in": {"name": "scaled_integer", "granularity": "tensor",
                                                                      "scale": "auto"}, "weight": {...}}}}}
"""

from __future__ import annotations

import torch
import torch.fx as fx
from pydantic import Field

from mase_lite.passes.folding import fold_target, input_groups, linear_weight
from mase_lite.passes.registry import PassError, PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes


class SmoothParams(Selection):
    targets: list[str] = Field(default_factory=lambda: ["linear"], description="Linears whose inputs to smooth")
    alpha: float = Field(0.5, ge=0, le=1, description="how much of the difficulty moves to the weights (0: none)")
    power_of_two: bool = Field(False, description="round each factor to a power of two (the float model stays bit-exact)")


@register_pass("smooth", kind="transform", params=SmoothParams, requires=("calibration",), replay=False)
def smooth_pass(mg, params: SmoothParams):
    """Migrate activation outliers into the weights per input channel, folded into norms or Linears (SmoothQuant)."""
    modules = mg.modules
    nodes = [n for n in select_nodes(mg, params.by, params.targets, params.allow_empty, modules_only=True)
             if hasattr(modules[n.target], "weight") and isinstance(n.args[0], fx.Node)]
    calibration = mg.analyses["calibration"]
    smoothed, skipped = {}, {}
    with torch.no_grad():
        for producer, group in input_groups(nodes).items():
            names = [n.name for n in group]
            missing = [n for n in names if "channel_absmax" not in calibration.get(n, {}).get("data_in", {})]
            if missing:
                raise PassError(f"node {missing[0]!r} has no calibration record of its input: calibrate it before smooth")
            weights = [linear_weight(modules[n.target]) for n in group]
            divide, where = fold_target(mg, producer, group, modules)
            if divide is None:
                skipped[", ".join(names)] = where
                continue
            x_max = calibration[group[0].name]["data_in"]["channel_absmax"].to(weights[0].device, torch.float32)
            w_max = torch.stack([w.detach().abs().amax(0) for w in weights]).amax(0).float()
            s = (x_max.pow(params.alpha) / w_max.pow(1 - params.alpha)).clamp(min=1e-5)
            s = torch.where((x_max > 0) & (w_max > 0) & torch.isfinite(s), s, torch.ones_like(s))
            if params.power_of_two:
                s = torch.exp2(torch.log2(s).round())
            divide(s.to(weights[0].dtype))
            for w in weights:
                w.mul_(s.to(w.dtype))
            smoothed[", ".join(names)] = {"into": where, "max_factor": float(s.max()), "min_factor": float(s.min())}
    return PassResult({"smoothed": smoothed, "skipped": skipped})
