"""The ``awq`` pass (AWQ, Lin et al., 2023): per-input-channel scales that protect the salient weights.

Run ``quantize`` first (a weight format per Linear). For each group of Linears reading one input (q/k/v,
gate/up; down, whose input is ``act(gate) * up``), the input's mean magnitude per channel ``m_j`` over
calibration data gives candidate scales ``s = m**α`` (normalised to a geometric mean of 1) for ``α`` on a
grid in ``[0, 1)``, and with ``duo`` also ``m**α / w**(1-α)`` (``w_j``: the mean over the group's rows of
``|W[:, j]|`` relative to its quantization group's largest, as AutoAWQ's duo scaling); each candidate is
judged by the group's output error ``Σ ||X Wᵀ - (X/s) Q(W·s)ᵀ||²`` on the calibration rows with each
layer's own weight format ``Q`` (from ``XᵀX``, formed once; each family's grid coarse to fine), and the best is
folded like SmoothQuant's (:mod:`mase_lite.passes.folding`): the input divided by ``s`` where it is made (a
norm's weight, a preceding Linear's rows: up's for down), the weight columns multiplied by ``s``. ``α = 0`` (no
scaling) is a candidate, so no group gets worse on these rows. The float model computes the same function; the
weights' salient columns are now larger, so rounding costs them less. Then (``clip``) each row's group of weights
(the format's group: 128 columns, a whole row per channel) is clipped to the fraction of its largest magnitude,
from 1 down to 0.55, whose rounding gives the least output error on the calibration rows: a few large weights no
longer stretch the group's scale. Groups are handled one repeated block at a time
(:mod:`mase_lite.passes.layerwise`), each on the inputs the blocks before it give after their own scaling. Follow
it with ``gptq`` or just let the quantized layers round.

Example::

    {"pass": "quantize", "params": {"by": "type", "rules": {"head": null, "linear": {"weight": {"name":
        "scaled_integer", "width": 4, "granularity": "group", "group_size": 128}}}}},
    {"pass": "awq", "params": {"num_batches": 16}}
"""

from __future__ import annotations

import torch
import torch.nn as nn
from pydantic import Field

from mase_lite.infra.cores import steady_threads
from mase_lite.numerics import parse_format, quantize
from mase_lite.numerics.native.threads import torch_threads
from mase_lite.passes.folding import fold_target, input_groups, linear_weight
from mase_lite.passes.layerwise import Enough, calibration_batches, each_block
from mase_lite.passes.registry import PassError, PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes


class AWQParams(Selection):
    targets: list[str] = Field(default_factory=lambda: ["linear"], description="Linears to scale (those with a weight format)")
    num_batches: int = Field(16, ge=1, description="calibration batches")
    batch_size: int = Field(8, ge=1, description="rows per calibration batch")
    split: str = Field("train", description="data split of the calibration batches")
    grid: int = Field(20, ge=1, description="exponents searched: 0, 1/grid, ..., (grid - 1)/grid (every fourth, then "
                                           "two and one steps beside the best)")
    duo: bool = Field(True, description="also try scales x̄**α / w̄**(1-α) (w̄: each input's mean weight magnitude "
                      "relative to its group's largest), as AutoAWQ and llm-compressor do; reported as scales 'duo'")
    max_rows: int = Field(4096, ge=1, description="calibration rows (tokens) per group the search judges on")
    clip: bool = Field(True, description="then clip each row's weight group to the range (1, 0.95, ..., 0.55 of "
                       "its largest magnitude) that makes its output error on the calibration rows least")
    clip_rows: int = Field(512, ge=1, description="calibration rows the clipping search judges on")


def _inputs(leaders: dict[str, nn.Module], run, max_rows: int) -> dict[str, torch.Tensor]:
    """Up to ``max_rows`` rows of each leader's input over ``run()``, in float32; the run stops
    (:class:`~mase_lite.passes.layerwise.Enough`) once every leader has them."""
    kept: dict[str, list[torch.Tensor]] = {name: [] for name in leaders}
    counts = dict.fromkeys(leaders, 0)

    def hook(name):
        def record(module, args):
            if counts[name] < max_rows:
                kept[name].append(args[0].detach().reshape(-1, args[0].shape[-1])[: max_rows - counts[name]].float())
                counts[name] += kept[name][-1].shape[0]
                if min(counts.values()) >= max_rows:
                    raise Enough
        return record

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in leaders.items()]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    for name, rows in kept.items():
        if not rows:
            raise PassError(f"awq: layer {name!r} was not called on the calibration data; select only layers the model runs")
    return {name: torch.cat(rows) for name, rows in kept.items()}


def _group_size(fmt: dict, columns: int) -> int | None:
    """Columns per quantization group of ``fmt`` in a row of ``columns`` (the row for a format without groups);
    None where the groups do not divide the row."""
    number_format, params = parse_format(fmt)
    size = number_format.group(params, columns) if number_format.group is not None else columns
    return None if columns % size else size


def _clip(x: torch.Tensor, weight: torch.Tensor, fmt: dict, steps: int = 10) -> tuple[torch.Tensor, float, float]:
    """``weight`` (``[out, in]``) with each row's groups clipped to the fraction ``1 - i/20`` (``i < steps``) of their
    largest magnitude that makes ``||x_g (w_g - Q(clip(w))_g)ᵀ||²`` least per row and group ``g``; and the
    summed output error before and after. Groups narrower than ``x``'s rows are judged by their inputs' Gram
    matrices ``x_gᵀ x_g`` (formed once), wider ones on ``x`` itself."""
    rows, columns = weight.shape
    size = _group_size(fmt, columns)
    if size is None:
        return weight, 0.0, 0.0
    groups = columns // size
    xg = x.reshape(x.shape[0], groups, size)
    gram = torch.einsum("ngk,ngl->gkl", xg, xg) if size < x.shape[0] else None

    def errors(diff: torch.Tensor) -> torch.Tensor:  # [rows, groups]
        if gram is None:
            return torch.einsum("ngk,rgk->rgn", xg, diff).square().sum(-1)
        return (torch.einsum("rgk,gkl->rgl", diff, gram) * diff).sum(-1)

    w = weight.detach().float()
    top = w.reshape(rows, groups, size).abs().amax(-1, keepdim=True)
    best_error, best = None, w
    for i in range(steps):
        bound = (top * (1 - i / 20)).expand(rows, groups, size).reshape(rows, columns)
        clipped = torch.maximum(torch.minimum(w, bound), -bound)
        error = errors((w - quantize(clipped, fmt)).reshape(rows, groups, size))
        if best_error is None:
            first, best_error, best = error, error, clipped
            continue
        better = (error < best_error).unsqueeze(-1).expand(rows, groups, size).reshape(rows, columns)
        best = torch.where(better, clipped, best)
        best_error = torch.minimum(error, best_error)
    return best, float(first.sum()), float(best_error.sum())


def _weight_magnitude(weights: list[torch.Tensor], formats: list[dict]) -> torch.Tensor:
    """Per input channel: the mean over the group's rows of ``|w|`` relative to its quantization group's largest."""
    shares = []
    for w, fmt in zip(weights, formats):
        groups = w.abs().reshape(w.shape[0], -1, _group_size(fmt, w.shape[1]) or w.shape[1])
        shares.append((groups / groups.amax(-1, keepdim=True).clamp(min=1e-12)).reshape(w.shape))
    return torch.cat(shares).mean(0)


CANDIDATE_ELEMENTS = 1 << 23  # weight differences judged in one product (32 MB of float32)
COARSE = 4  # the scale search's first steps along each family's grid (then 2, then 1 beside the best)
FACTOR_BLOCKS = 8  # column blocks of the triangular product: (8 + 1) / 16 of a full one's work


def _squared_norms(diff: torch.Tensor, gram: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    """Each row ``d`` of ``diff``'s ``d XᵀX dᵀ``: ``||d L||²`` with ``L`` the lower Cholesky factor of ``XᵀX`` (its
    product by column blocks skips the zeros above the diagonal), or ``(d XᵀX) · d`` where ``XᵀX`` has none."""
    if factor is None:
        return torch.linalg.vecdot(diff @ gram, diff)
    width = -(-factor.shape[0] // FACTOR_BLOCKS)
    total = torch.zeros(diff.shape[0], dtype=diff.dtype, device=diff.device)
    for start in range(0, factor.shape[0], width):
        product = diff[:, start:] @ factor[start:, start:start + width]
        total += torch.linalg.vecdot(product, product)
    return total


def _factor(gram: torch.Tensor) -> torch.Tensor | None:
    """The lower Cholesky factor of ``XᵀX``; None where it is singular (an input that never fires). On the steady
    thread count (:func:`~mase_lite.infra.cores.steady_threads`): LAPACK's bits follow its thread count."""
    with torch_threads(steady_threads()):
        factor, singular = torch.linalg.cholesky_ex(gram)
    return None if int(singular) else factor


def _output_errors(gram: torch.Tensor, factor: torch.Tensor | None, weights: list[torch.Tensor], formats: list[dict],
                   scales: list[torch.Tensor]) -> list[float]:
    """Each candidate ``s``'s ``Σ_W ||X Wᵀ - X (Q(W·s)/s)ᵀ||²`` from the inputs' Gram matrix ``XᵀX`` and its
    :func:`_factor` (:func:`_squared_norms` of ``D = W - Q(W·s)/s``): a product of the weights' size by the inputs'
    width instead of by the calibration rows; the group's weights and several candidates' ``D`` stacked into one
    product."""
    rows = sum(w.shape[0] for w in weights)
    chunk = max(1, CANDIDATE_ELEMENTS // (rows * gram.shape[0]))
    errors: list[float] = []
    for start in range(0, len(scales), chunk):
        diff = torch.cat([w - quantize(w * s, fmt) / s for s in scales[start:start + chunk]
                          for w, fmt in zip(weights, formats)])
        errors += _squared_norms(diff, gram, factor).double().view(-1, rows).sum(1).tolist()
    return errors


def _best_scales(x: torch.Tensor, weights: list[torch.Tensor], formats: list[dict], grid: int, duo: bool
                 ) -> tuple[torch.Tensor, float, float, float, str]:
    """``(s, α, error, error at α = 0, family)`` minimising the group's output error over ``x``: scales ``x̄**α``
    ("activation"), and with ``duo`` also ``x̄**α / w̄**(1-α)`` ("duo"), each judged by :func:`_output_errors`. Each
    family's grid is searched coarse to fine: every ``COARSE``-th step, then the two half as far from the best, down
    to its neighbours (the grid's best wherever the error falls and rises once along it); of equal errors the first
    in grid order is kept."""
    magnitude = x.abs().mean(0)
    floats = [w.detach().float() for w in weights]
    gram = x.t() @ x
    factor = _factor(gram)
    families = [("activation", None)] + ([("duo", _weight_magnitude(floats, formats))] if duo else [])
    first = {"activation": 0, "duo": 1}  # duo's step 0 is 1 / w̄: the weights' own spread, not the activations'

    def scale(w_magnitude, alpha):
        s = magnitude.pow(alpha) if w_magnitude is None else magnitude.pow(alpha) / (w_magnitude.pow(1 - alpha) + 1e-4)
        s = s.clamp(min=1e-4)
        return s / (s.max() * s.min()).sqrt()

    found: dict[tuple[int, int], tuple[float, torch.Tensor]] = {}  # (family, step) -> (error, s)

    def judge(steps: list[tuple[int, int]]) -> None:
        steps = [(f, k) for f, k in steps if (f, k) not in found and first[families[f][0]] <= k < grid]
        scales = [scale(families[f][1], k / grid) for f, k in steps]
        for key, s, error in zip(steps, scales, _output_errors(gram, factor, floats, formats, scales)):
            found[key] = (error, s)

    def best(f: int) -> int:
        return min((k for g, k in found if g == f), key=lambda k: (found[(f, k)][0], k))

    judge([(f, k) for f in range(len(families)) for k in range(0, grid, COARSE)])
    stride = COARSE // 2
    while stride:
        judge([(f, best(f) + d) for f in range(len(families)) for d in (-stride, stride)])
        stride //= 2
    f, k = min(found, key=lambda key: (found[key][0], key))
    return found[(f, k)][1], k / grid, found[(f, k)][0], found[(0, 0)][0], families[f][0]


@register_pass("awq", kind="transform", params=AWQParams, requires=("data",), replay=False)
def awq_pass(mg, params: AWQParams, ctx):
    """Activation-aware per-channel weight scales, searched on calibration data and folded into the input's producer."""
    modules = mg.modules
    nodes = select_nodes(mg, params.by, params.targets, params.allow_empty, modules_only=True)
    quantized = [n for n in nodes if getattr(modules[n.target], "weight_quantizer", None) is not None]
    skipped = {n.name: "no weight format (run quantize with one first)" for n in nodes if n not in quantized}
    if not quantized:
        if params.allow_empty:
            return PassResult({"groups": {}, "skipped": skipped})
        raise PassError("awq: no selected Linear has a weight format: run quantize (with a weight format) before awq")
    groups = {}
    for producer, group in input_groups(quantized).items():
        divide, where = fold_target(mg, producer, group, modules)
        if divide is None:
            skipped[", ".join(n.name for n in group)] = where
        else:
            groups[group[0].target] = (group, divide, where)
    report: dict[str, dict] = {}

    def handle(inside: dict[str, nn.Module], run) -> None:
        leaders = {target: module for target, module in inside.items() if target in groups}
        if not leaders:
            return
        inputs = _inputs(leaders, run, params.max_rows)
        with torch.no_grad():
            for target, x in inputs.items():
                group, divide, where = groups[target]
                weights = [linear_weight(modules[n.target]) for n in group]
                formats = [modules[n.target].weight_quantizer.spec.as_dict() for n in group]
                s, alpha, error, unscaled, family = _best_scales(x, weights, formats, params.grid, params.duo)
                divide(s.to(weights[0].dtype))
                for w in weights:
                    w.mul_(s.to(w.dtype))
                entry = {"alpha": alpha, "scales": family, "error": error, "unscaled_error": unscaled, "into": where}
                if params.clip:
                    rows = x[: params.clip_rows] / s
                    before = after = 0.0
                    for w, fmt in zip(weights, formats):
                        clipped, b, a = _clip(rows, w, fmt)
                        w.copy_(clipped.to(w.dtype))
                        before, after = before + b, after + a
                    entry.update(clip_error_before=before, clip_error=after)
                report[", ".join(n.name for n in group)] = entry

    leaders = {target: modules[target] for target in groups}
    each_block(mg.source_model, leaders, calibration_batches(mg, ctx.data, params.split, params.batch_size, params.num_batches),
               handle)
    return PassResult({"groups": report, "skipped": skipped,
                       "error": sum(g["error"] for g in report.values()),
                       "unscaled_error": sum(g["unscaled_error"] for g in report.values())})
