"""The ``gptq`` pass: GPTQ error compensation for the weights of quantized layers, one block at a time.

Run ``quantize`` first: each selected layer keeps its weight format, and GPTQ (:mod:`mase_lite.nn.gptq`)
chooses the weight values that make the layer's outputs on calibration data closest to the float
layer's. When the model repeats blocks (a transformer's decoder layers), the inputs of the first block
are captured once and the blocks are processed in order: a block's layers collect their Hessians over
those inputs, are quantized, and the block runs again to give the next block its inputs, now from the
quantized model; peak memory is the model plus one block's Hessians and the calibration activations.
Layers outside the blocks (an output head) are handled last, over whole-model runs.

Example::

    {"pass": "quantize", "params": {"by": "type", "rules": {"head": null,
        "linear": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 128}}}}},
    {"pass": "gptq", "params": {"num_batches": 16, "act_order": true}}
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import torch
import torch.nn as nn
from pydantic import Field
from torch.nn.utils import parametrize

from mase_lite.ir.capture import caches_off
from mase_lite.nn.gptq import gptq
from mase_lite.passes.registry import PassError, PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes
from mase_lite.train.batches import model_inputs

logger = logging.getLogger(__name__)


class GPTQParams(Selection):
    targets: list[str] = Field(
        default_factory=lambda: ["linear", "hf_conv1d"],
        description="layers to compensate (those with a weight format; the others are skipped and listed)",
    )
    num_batches: int = Field(16, ge=1, description="calibration batches")
    batch_size: int = Field(8, ge=1, description="rows per calibration batch")
    split: str = Field("train", description="data split of the calibration batches")
    damp: float = Field(0.01, gt=0, description="added to the Hessian's diagonal, as a fraction of its mean")
    block_size: int = Field(128, ge=1, description="columns per lazy batch update")
    act_order: bool = Field(False, description="quantize columns in order of decreasing Hessian diagonal")
    precision: Literal["float32", "float64"] = Field(
        "float32", description="dtype of the Hessians and the updates (float64: twice the memory, for small models)"
    )


class _Stop(Exception):
    """Raised by the hook that captures the first block's inputs: the rest of the model need not run."""


class _Hessians:
    """Forward pre-hooks accumulating ``2 X Xᵀ / n`` of each layer's (quantized) input."""

    def __init__(self, layers: dict[str, nn.Module], dtype: torch.dtype):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.dtype = dtype
        self.handles = [layer.register_forward_pre_hook(self._hook(name)) for name, layer in layers.items()]

    def _hook(self, name: str):
        def hook(layer: nn.Module, args: tuple) -> None:
            x = args[0]
            if getattr(layer, "data_in_quantizer", None) is not None:
                x = layer.data_in_quantizer(x)
            x = x.detach().reshape(-1, x.shape[-1]).to(self.dtype)
            n = self.counts.get(name, 0)
            total = n + x.shape[0]
            h = self.sums.get(name)
            if h is None:
                h = self.sums[name] = torch.zeros(x.shape[1], x.shape[1], dtype=self.dtype, device=x.device)
            else:
                h.mul_(n / total)  # in place: a 5632-wide Hessian is 254 MB in float64
            h.addmm_(x.t(), x, alpha=2 / total)
            self.counts[name] = total

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _weight_format(name: str, layer: nn.Module) -> dict[str, Any]:
    quantizer = getattr(layer, "weight_quantizer", None)
    if quantizer is None:
        raise PassError(f"layer {name!r} has no weight format to quantize to: run quantize (with a weight format) before gptq")
    if parametrize.is_parametrized(layer, "weight"):
        raise PassError(f"layer {name!r} is pruned (its weight is masked): run gptq before prune")
    return quantizer.spec.as_dict()


def _compensate(name: str, layer: nn.Module, hessian: torch.Tensor, params: GPTQParams) -> dict[str, float]:
    transposed = getattr(layer, "mase_op", None) == "hf_conv1d"  # transformers' Conv1D keeps [in, out]
    weight = layer.weight.t() if transposed else layer.weight
    result = gptq(weight, hessian, _weight_format(name, layer), block_size=params.block_size, act_order=params.act_order,
                  damp=params.damp, dtype=getattr(torch, params.precision))
    with torch.no_grad():
        layer.weight.copy_(result.weight.t() if transposed else result.weight)
    return {"error": result.error, "rtn_error": result.rtn_error}


def _blocks(model: nn.Module, layers: dict[str, nn.Module]) -> tuple[str, nn.ModuleList] | None:
    """The ``ModuleList`` of repeated blocks holding the most selected layers (a transformer's layers)."""
    best, count = None, 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            inside = sum(layer.startswith(f"{name}.") for layer in layers) if name else 0
            if inside > count:
                best, count = (name, module), inside
    return best


def _first_block_inputs(model: nn.Module, block: nn.Module, batches: list[dict]) -> list[tuple[tuple, dict]]:
    captured = []

    def hook(module, args, kwargs):
        captured.append((args, kwargs))
        raise _Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch in batches:
            try:
                model(**batch)
            except _Stop:
                pass
    finally:
        handle.remove()
    return captured


def _run_block(block: nn.Module, inputs: list[tuple[tuple, dict]]) -> list[tuple[tuple, dict]]:
    """The block on each input, and the next block's inputs (its output in place of the hidden states)."""
    nxt = []
    for args, kwargs in inputs:
        out = block(*args, **kwargs)
        hidden = out[0] if isinstance(out, (tuple, list)) else out
        if args:
            nxt.append(((hidden, *args[1:]), kwargs))
        else:
            nxt.append(((), {**kwargs, "hidden_states": hidden}))
    return nxt


def _compensate_all(layers: dict[str, nn.Module], run, params: GPTQParams, report: dict) -> None:
    hessians = _Hessians(layers, getattr(torch, params.precision))
    try:
        run()
    finally:
        hessians.remove()
    for name, layer in layers.items():
        if name not in hessians.sums:
            raise PassError(f"layer {name!r} was not called on the calibration data; select only layers the model runs")
        report[name] = _compensate(name, layer, hessians.sums.pop(name), params)


@register_pass("gptq", kind="transform", params=GPTQParams, requires=("data",), replay=False,  # a checkpoint keeps its weights
               needs_graph=False)
def gptq_pass(mg, params: GPTQParams, ctx):
    """GPTQ error compensation of quantized layers' weights over calibration batches, block by block."""
    t0 = time.perf_counter()
    modules = mg.modules
    names = list(dict.fromkeys(n.target for n in select_nodes(mg, params.by, params.targets, params.allow_empty,
                                                                 modules_only=True)))
    layers = {name: modules[name] for name in names if getattr(modules[name], "weight_quantizer", None) is not None}
    skipped = [name for name in names if name not in layers]
    if not names and params.allow_empty:  # a search chose no layer for GPTQ
        return PassResult({"layers": {}, "skipped": [], "error": 0.0, "rtn_error": 0.0, "seconds": 0.0, "calibration_rows": 0})
    if not layers:
        raise PassError(f"no selected layer has a weight format to quantize to ({', '.join(skipped[:5]) or 'none selected'}): "
                        "run quantize (with a weight format) before gptq")
    for name, layer in layers.items():
        _weight_format(name, layer)
    model = mg.source_model
    device = next(iter(model.parameters()), torch.empty(0)).device
    loader = ctx.data.loader(params.split, params.batch_size, shuffle=False)
    batches = [model_inputs(b, mg.input_names, device) for _, b in zip(range(params.num_batches), loader)]
    report: dict[str, dict[str, float]] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), caches_off(model):
            found = _blocks(model, layers)
            rest = dict(layers)
            if found is not None:
                prefix, blocks = found
                inputs = _first_block_inputs(model, blocks[0], batches)
                for i, block in enumerate(blocks):
                    inside = {n: m for n, m in layers.items() if n.startswith(f"{prefix}.{i}.")}
                    rest = {n: m for n, m in rest.items() if n not in inside}
                    if inside:
                        _compensate_all(inside, lambda: _run_block(block, inputs), params, report)
                    inputs = _run_block(block, inputs)
                    logger.info("gptq: block %d of %d done", i + 1, len(blocks))
            if rest:
                _compensate_all(rest, lambda: [model(**batch) for batch in batches], params, report)
    finally:
        model.train(was_training)
    error, rtn = sum(r["error"] for r in report.values()), sum(r["rtn_error"] for r in report.values())
    return PassResult({"layers": report, "skipped": skipped, "error": error, "rtn_error": rtn,
                       "seconds": time.perf_counter() - t0,
                       "calibration_rows": sum(len(next(iter(b.values()))) for b in batches)})
