"""The ``profile`` pass: statistics of weights and activations over batches of the run's data.

Mean and variance are merged across batches exactly (Chan/Welford in float64); quantiles are
exact while a node's values fit in ``max_samples``, else estimated from a uniform sample.
Results land in ``node.meta["mase"]["profile"]`` as ``{"weight": {...}, "data_out": {...}}``.

Example::

    mg, info = ml.passes.profile(mg, {"num_batches": 4, "by": "type", "targets": ["linear"]})
    mg.nodes[7].meta["mase"]["profile"]["data_out"]["max"]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from pydantic import Field

from mase_lite.passes.registry import PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes


class ProfileParams(Selection):
    targets: list[str] = Field(
        default_factory=lambda: ["linear", "hf_conv1d", "conv1d", "conv2d", "matmul", "bmm", "sdpa"],
        description="op types, node names or patterns to profile",
    )
    num_batches: int = Field(4, ge=1, description="batches of data to run")
    batch_size: int = Field(8, ge=1, description="batch size")
    split: str = Field("train", description="data split to draw batches from")
    quantiles: list[float] = Field(default_factory=lambda: [0.01, 0.99], description="quantiles to report")
    max_samples: int = Field(200_000, ge=1, description="values kept per node for quantiles")
    weights: bool = Field(True, description="profile module weights")
    activations: bool = Field(True, description="profile node outputs over the data")


class RunningStats:
    """Exact streaming min/max/mean/variance/abs-mean plus a bounded sample for quantiles."""

    def __init__(self, max_samples: int, generator: torch.Generator):
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.abs_sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.samples: list[torch.Tensor] = []
        self.kept = 0
        self.max_samples = max_samples
        self.generator = generator

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().flatten()
        n = x.numel()
        if n == 0:
            return
        lo, hi = torch.aminmax(x)
        wide = x.to(torch.float64)
        var_b, mean_b = torch.var_mean(wide, correction=0)
        mean_b, m2_b = mean_b.item(), var_b.item() * n
        total = self.count + n
        delta = mean_b - self.mean
        self.mean += delta * n / total
        self.m2 += m2_b + delta * delta * self.count * n / total
        self.count = total
        self.abs_sum += wide.abs().sum().item()
        self.min = min(self.min, lo.item())
        self.max = max(self.max, hi.item())
        room = self.max_samples - self.kept
        if room > 0:
            if n > room:
                x = x[torch.randperm(n, generator=self.generator)[:room].to(x.device)]
            self.samples.append(x.to("cpu", torch.float64))
            self.kept += x.numel()

    def result(self, quantiles: list[float]) -> dict[str, Any]:
        values = torch.cat(self.samples) if self.samples else torch.zeros(0, dtype=torch.float64)
        q = torch.quantile(values, torch.tensor(quantiles, dtype=torch.float64)) if values.numel() else None
        return {
            "count": self.count,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "variance": self.m2 / self.count if self.count else float("nan"),
            "abs_mean": self.abs_sum / self.count if self.count else float("nan"),
            "quantiles": {str(p): (q[i].item() if q is not None else None) for i, p in enumerate(quantiles)},
            "exact_quantiles": self.kept == self.count,
        }


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, stats: dict[str, RunningStats]):
        super().__init__(gm)
        self.stats = stats

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.stats and isinstance(out, torch.Tensor) and out.is_floating_point():
            self.stats[n.name].update(out)
        return out


def _batches(mg, params: ProfileParams, data):
    device = next(iter(mg.model.parameters())).device
    names = [n.target for n in mg.model.graph.nodes if n.op == "placeholder"]
    loader = data.loader(params.split, batch_size=params.batch_size, shuffle=False)
    for i, batch in enumerate(loader):
        if i >= params.num_batches:
            break
        yield [batch[name].to(device) for name in names]


@register_pass("profile", kind="analysis", params=ProfileParams, requires=("data",), provides=("profile",))
def profile_pass(mg, params: ProfileParams, ctx):
    """Statistics (min/max/mean/variance/abs-mean/quantiles) of weights and activations of selected nodes."""
    nodes = select_nodes(mg, params.by, params.targets, params.allow_empty)
    gen = torch.Generator().manual_seed(0)
    results: dict[str, dict[str, Any]] = {n.name: {} for n in nodes}
    if params.activations:
        stats = {n.name: RunningStats(params.max_samples, gen) for n in nodes}
        recorder = _Recorder(mg.model, stats)
        with torch.no_grad():
            for inputs in _batches(mg, params, ctx.data):
                recorder.run(*inputs)
        for name, s in stats.items():
            if s.count:
                results[name]["data_out"] = s.result(params.quantiles)
    if params.weights:
        modules = mg.modules
        for n in nodes:
            weight = getattr(modules.get(n.target), "weight", None) if n.op == "call_module" else None
            if isinstance(weight, torch.Tensor) and weight.is_floating_point():
                s = RunningStats(params.max_samples, gen)
                s.update(weight)
                results[n.name]["weight"] = s.result(params.quantiles)
    for n in nodes:
        n.meta["mase"]["profile"] = results[n.name]
    mg.analyses["profile"] = results
    return PassResult({"nodes": results})
