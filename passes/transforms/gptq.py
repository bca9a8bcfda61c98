"""The ``gptq`` pass: GPTQ error compensation for the weights of quantized layers, one block at a time.

Run ``quantize`` first: each selected layer keeps its weight format, and GPTQ (:mod:`mase_lite.algorithms.gptq`)
chooses the weight values that make the layer's outputs on calibration data closest to the float
layer's. The layers are handled one
repeated block at a time (:mod:`mase_lite.passes.layerwise`): a block's layers collect their Hessians over
the block's inputs from the already quantized blocks before it, and are quantized.

Layers called on the same input (the query, key and value projections; gate and up) share one Hessian and,
with the same row-wise weight format, are compensated as one weight, their rows side by side (``together``
in the report). A compensated weight keeps the scales GPTQ fixed for its groups: the layer holds it and
computes with exactly these values, and a checkpoint or an export stores these scales.

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

from mase_lite.infra.heap import return_free_memory
from mase_lite.runtime.disk_weights import streamed
from mase_lite.algorithms.gptq import gptq
from mase_lite.layers.quant_op import format_key
from mase_lite.numerics import parse_format
from mase_lite.passes.layerwise import calibration_batches, collect, each_block, store_weight, weight_of
from mase_lite.passes.registry import PassError, PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes
from mase_lite.infra.progress import Ticker

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
    rounding_error: bool = Field(False, description="also report each layer's output error under plain rounding "
                                 "(rtn_error: one more product as large as the column updates)")


def _weight_format(name: str, layer: nn.Module) -> dict[str, Any]:
    quantizer = getattr(layer, "weight_quantizer", None)
    if quantizer is None:
        raise PassError(f"layer {name!r} has no weight format to quantize to: run quantize (with a weight format) before gptq")
    if parametrize.is_parametrized(layer, "weight"):
        raise PassError(f"layer {name!r} is pruned (its weight is masked): run gptq before prune")
    return quantizer.spec.as_dict()


def _row_wise(fmt: dict[str, Any], columns: int) -> bool:
    """Whether a row's values depend on that row alone (its groups), so layers sharing a Hessian can be
    compensated as one weight, their rows side by side (not with a scale shared by the whole tensor)."""
    number_format, params = parse_format(fmt)
    if number_format.group(params, columns) == 1:
        return True
    if number_format.codec is None:
        return False
    side = number_format.codec.side(torch.ones(2, columns), params)
    return side is not None and all(t.dim() > 0 and t.shape[0] == 2 for t in side.values())


def _compensate_all(layers: dict[str, nn.Module], run, params: GPTQParams, report: dict, together: list) -> None:
    """Collect the layers' Hessians over ``run()`` and compensate each; layers with the same inputs and the same
    row-wise format are compensated as one weight (one factorisation, one column sweep), listed in ``together``."""
    hessians = collect(layers, run, getattr(torch, params.precision), who="gptq")
    return_free_memory()  # the calibration run's activations: the sweeps' buffers come next
    sets: dict[tuple, list[str]] = {}
    formats = {name: _weight_format(name, layer) for name, layer in layers.items()}
    for name, layer in layers.items():
        fused = _row_wise(formats[name], weight_of(layer).shape[1])
        sets.setdefault((tuple(hessians.history[name]), format_key(formats[name]), name if not fused else ""), []).append(name)
    ticker = Ticker("gptq", len(layers), "layer")
    # the widest Hessians first: each is freed as its weight is done, so the largest is not held through the others
    for names in sorted(sets.values(), key=lambda names: -hessians.sums[names[0]].shape[0]):
        if len(names) > 1:
            together.append(names)
        h = hessians.sums[names[0]]
        for name in names:
            hessians.sums.pop(name)
        # handed over to gptq, which reuses its memory, unless layers of another format still need it (same inputs)
        handed = h if any(other is h for other in hessians.sums.values()) else [h]
        fmt = formats[names[0]]
        weights = [weight_of(layers[name]) for name in names]
        result = gptq(weights if len(weights) > 1 else weights[0], handed, fmt, block_size=params.block_size,
                      act_order=params.act_order, damp=params.damp, dtype=getattr(torch, params.precision),
                      baseline=params.rounding_error, into=weights)  # the result in the weights' own memory
        row = 0
        for name, weight in zip(names, weights):
            rows = slice(row, row + weight.shape[0])
            side = result.side if result.side is None or len(names) == 1 else {k: v[rows] for k, v in result.side.items()}
            store_weight(layers[name], weight, side, fmt)
            report[name] = {"error": float(result.row_error[rows].sum())}
            if params.rounding_error:
                report[name]["rtn_error"] = float(result.row_rtn_error[rows].sum())
            row += weight.shape[0]
        del result, weights
        return_free_memory()  # the sweep's buffers and this Hessian: the next sweep's, of other sizes, would not reuse them
        ticker.tick(len(names), last=names[-1])


@register_pass("gptq", kind="transform", params=GPTQParams, requires=("data",), replay=False,  # a checkpoint keeps its weights
               needs_graph=False, streams=True)
def gptq_pass(mg, params: GPTQParams, ctx):
    """GPTQ error compensation of quantized layers' weights over calibration batches, block by block."""
    t0 = time.perf_counter()
    modules = mg.modules
    names = list(dict.fromkeys(n.target for n in select_nodes(mg, params.by, params.targets, params.allow_empty,
                                                                 modules_only=True)))
    layers = {name: modules[name] for name in names if getattr(modules[name], "weight_quantizer", None) is not None}
    skipped = [name for name in names if name not in layers]
    if not names and params.allow_empty:  # a search chose no layer for GPTQ
        return PassResult({"layers": {}, "skipped": [], "together": [], "error": 0.0, "seconds": 0.0, "calibration_rows": 0,
                           **({"rtn_error": 0.0} if params.rounding_error else {})})
    if not layers:
        raise PassError(f"no selected layer has a weight format to quantize to ({', '.join(skipped[:5]) or 'none selected'}): "
                        "run quantize (with a weight format) before gptq")
    for name, layer in layers.items():
        _weight_format(name, layer)
    batches = calibration_batches(mg, ctx.data, params.split, params.batch_size, params.num_batches)
    report: dict[str, dict[str, float]] = {}
    together: list[list[str]] = []
    each_block(mg.source_model, layers, batches, lambda inside, run: _compensate_all(inside, run, params, report, together),
               lambda i, n: logger.info("gptq: block %d of %d done", i, n))
    totals = {"error": sum(r["error"] for r in report.values())}
    disk = streamed(mg.source_model)
    if disk is not None:
        totals["streamed_peak_bytes"] = disk.peak_bytes
    if params.rounding_error:
        totals["rtn_error"] = sum(r["rtn_error"] for r in report.values())
    return PassResult({"layers": report, "skipped": skipped, "together": together, **totals,
                       "seconds": time.perf_counter() - t0,
                       "calibration_rows": sum(len(next(iter(b.values()))) for b in batches)})
