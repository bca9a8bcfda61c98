"""The ``calibrate`` pass: what the activations of quantizable nodes look like over calibration batches.

For each selected node it records its input (``data_in``: the first float argument) and its output
(``data_out``): the smallest and largest value, the largest magnitude, a uniform sample of values
(``max_samples``, spread over the batches) for percentile and MSE choices, and the largest magnitude
of each input channel (the last dimension) for SmoothQuant. The results are the graph's
``calibration`` analysis (``mg.analyses["calibration"]``); ``quantize`` reads them to fill in
``"auto"`` format parameters of activations, ``smooth`` to migrate outliers. A transform drops them.

Example::

    mg, info = ml.passes.calibrate(mg, {"num_batches": 8})          # in a pipeline with data
    mg, info = ml.passes.quantize(mg, {"rules": {"linear": {"name": "integer", "width": 6, "frac_width": "auto"}}})
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from pydantic import Field

from mase_lite.passes.registry import PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes

QUANTIZABLE_OPS = ["linear", "hf_conv1d", "conv1d", "conv2d", "matmul", "bmm"]


class CalibrateParams(Selection):
    targets: list[str] = Field(default_factory=lambda: list(QUANTIZABLE_OPS), description="op types, node names or patterns")
    num_batches: int = Field(8, ge=1, description="calibration batches")
    batch_size: int = Field(8, ge=1, description="rows per batch")
    split: str = Field("train", description="data split to draw the batches from")
    max_samples: int = Field(65536, ge=16, description="values kept per tensor for percentile and MSE choices")


class TensorRecord:
    """Range, a uniform sample and per-channel magnitudes of one operand over the batches."""

    def __init__(self, per_batch: int, generator: torch.Generator):
        self.per_batch = per_batch
        self.generator = generator
        self.min, self.max = float("inf"), float("-inf")
        self.samples: list[torch.Tensor] = []
        self.channels: torch.Tensor | None = None

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        if not x.numel():
            return
        lo, hi = torch.aminmax(x)
        finite = bool(torch.isfinite(lo) & torch.isfinite(hi))  # one reduction tells whether every value is
        if not finite:
            kept = x[torch.isfinite(x)]
            lo, hi = torch.aminmax(kept) if kept.numel() else (lo.new_tensor(self.min), hi.new_tensor(self.max))
        self.min, self.max = min(self.min, lo.item()), max(self.max, hi.item())
        flat = x.reshape(-1)
        if flat.numel() > self.per_batch:  # a uniform draw of positions, not a permutation of all of them
            picks = torch.randint(flat.numel(), (self.per_batch,), generator=self.generator)
            flat = flat[picks.to(flat.device)]
        self.samples.append(flat.cpu())
        if x.dim() == 0:
            return
        rows = x.reshape(-1, x.shape[-1])
        if finite:
            low, high = torch.aminmax(rows, dim=0)
            channels = torch.maximum(low.abs(), high.abs())
        else:  # NaN and ±Inf count as nothing
            channels = torch.where(torch.isfinite(rows), rows.abs(), 0.0).amax(0)
        channels = channels.cpu()
        self.channels = channels if self.channels is None else torch.maximum(self.channels, channels)

    def result(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max, "absmax": max(abs(self.min), abs(self.max)),
                "samples": torch.cat(self.samples), "channel_absmax": self.channels}


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, records: dict[str, dict[str, TensorRecord]]):
        super().__init__(gm)
        self.records = records

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.records:
            first = next((self.env[a] for a in n.all_input_nodes if isinstance(self.env.get(a), torch.Tensor)
                          and self.env[a].is_floating_point()), None)
            if first is not None:
                self.records[n.name]["data_in"].update(first)
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                self.records[n.name]["data_out"].update(out)
        return out


def summary(record: dict[str, Any]) -> dict[str, float]:
    """The JSON part of a record: its range."""
    return {k: record[k] for k in ("min", "max", "absmax")}


@register_pass("calibrate", kind="analysis", params=CalibrateParams, requires=("data",), provides=("calibration",))
def calibrate_pass(mg, params: CalibrateParams, ctx):
    """Activation ranges, samples and channel magnitudes of the selected nodes over calibration batches."""
    nodes = select_nodes(mg, params.by, params.targets, params.allow_empty)
    gen = torch.Generator().manual_seed(0)
    per_batch = max(1, params.max_samples // params.num_batches)
    records = {n.name: {"data_in": TensorRecord(per_batch, gen), "data_out": TensorRecord(per_batch, gen)} for n in nodes}
    recorder = _Recorder(mg.model, records)
    device = next(iter(mg.model.parameters()), torch.empty(0)).device
    names = [n.target for n in mg.model.graph.nodes if n.op == "placeholder"]
    was_training = mg.model.training
    mg.model.eval()
    try:
        with torch.no_grad():
            for i, batch in enumerate(ctx.data.loader(params.split, params.batch_size, shuffle=False)):
                if i >= params.num_batches:
                    break
                recorder.run(*[batch[name].to(device) for name in names])
    finally:
        mg.model.train(was_training)
    results = {name: {op: r.result() for op, r in ops.items() if r.samples} for name, ops in records.items()}
    for n in nodes:
        n.meta["mase"]["calibration"] = {op: summary(r) for op, r in results[n.name].items()}
    mg.analyses["calibration"] = results
    return PassResult({"nodes": {name: {op: summary(r) for op, r in ops.items()} for name, ops in results.items()}})
