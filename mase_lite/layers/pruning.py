"""Pruning building blocks: weight masks as parametrisations, activation pruning as removable hooks.

Weight masks are boolean buffers inside a ``torch.nn.utils.parametrize`` parametrisation, so they are
part of the state dict (and survive save/load) and the module keeps its class and its Parameter.
Activation pruning is a forward pre-hook that zeroes part of the module's first input on every call.

>>> import torch, torch.nn as nn
>>> fc = nn.Linear(4, 2)
>>> with torch.no_grad():
...     _ = fc.weight.copy_(torch.tensor([[1., -2., 3., -4.], [0.5, 6., -7., 8.]]))
>>> masks = weight_masks({"fc": fc.weight}, sparsity=0.5, method="l1-norm", granularity="unstructured")
>>> masks["fc"]                                # the 4 smallest magnitudes go
tensor([[False, False, False,  True],
        [False,  True,  True,  True]])
>>> _ = attach_weight_mask(fc, masks["fc"])    # fc.weight now reads the masked weight
>>> fc.weight.detach()
tensor([[ 0.,  0.,  0., -4.],
        [ 0.,  6., -7.,  8.]])
>>> bake_weight_mask(fc)                       # the zeros are written into fc.weight, mask removed
True
>>> pruner = attach_activation_pruner(fc, ActivationPruner(sparsity=0.25, method="l1-norm"))
>>> pruner.prune(torch.tensor([[1., -2., 3., 0.1]]))
tensor([[ 1., -2.,  3.,  0.]])
>>> _ = fc(torch.randn(3, 4))
>>> pruner.achieved, detach_activation_pruner(fc)
(0.25, True)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from mase_lite.infra.errors import UserError

logger = logging.getLogger(__name__)

PruneMethod = Literal["random", "l1-norm"]
Granularity = Literal["unstructured", "row", "channel"]
PRUNER_ATTR = "_mase_activation_pruner"


def prune_count(n: int, sparsity: float) -> int:
    """How many of ``n`` elements a ``sparsity`` prunes: ``round(sparsity * n)``, ties to even."""
    if not 0.0 <= sparsity <= 1.0:
        raise UserError(f"{sparsity!r} is outside the allowed range [0, 1]", location=("sparsity",))
    return min(n, round(sparsity * n))


def _score_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class Sparsity:
    """The weights SparseGPT zeroes: a ``fraction`` of the weight (unstructured), or ``n`` of every ``m``
    consecutive inputs of each row (``n=2, m=4``: the 2:4 pattern sparse tensor cores run)."""

    fraction: float = 0.0
    n: int = 0
    m: int = 0

    def __post_init__(self):
        if self.m and not 0 < self.n < self.m:
            raise UserError(f"sparsity {self.n}:{self.m}: n must be between 1 and m - 1")
        if not self.m and not 0.0 <= self.fraction <= 1.0:
            raise UserError(f"sparsity {self.fraction!r} is outside the allowed range [0, 1]")


def lowest_mask(scores: torch.Tensor, sparsity: Sparsity, per_row: bool = False) -> torch.Tensor:
    """The keep-mask (``[out, in]``) pruning the lowest ``scores`` in ``sparsity``'s pattern: the ``n`` lowest of
    every ``m`` consecutive inputs of a row, or ``round(fraction · numel)`` of the whole weight (``per_row``:
    ``round(fraction · in)`` of each row); ties go to the earlier element.

    >>> lowest_mask(torch.tensor([[1., -3., 2., 0.5], [4., 1., 1., -2.]]).abs(), Sparsity(n=2, m=4)).int().tolist()
    [[0, 1, 1, 0], [1, 0, 0, 1]]
    """
    if sparsity.m:
        groups = scores.reshape(scores.shape[0], -1, sparsity.m)
        lowest = groups.argsort(dim=-1, stable=True)[..., : sparsity.n]
        return torch.ones_like(groups, dtype=torch.bool).scatter_(-1, lowest, False).reshape(scores.shape)
    if per_row:
        lowest = scores.argsort(dim=1, stable=True)[:, : prune_count(scores.shape[1], sparsity.fraction)]
        return torch.ones_like(scores, dtype=torch.bool).scatter_(1, lowest, False)
    keep = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    keep[scores.flatten().argsort(stable=True)[: prune_count(scores.numel(), sparsity.fraction)]] = False
    return keep.reshape(scores.shape)


def check_n_of_m(name: str, weight: torch.Tensor, pattern: Sparsity) -> None:
    """A UserError naming the weight when its rows do not divide into groups of ``m`` inputs."""
    if weight.dim() < 2 or weight.shape[1] % pattern.m:
        raise UserError(f"{pattern.n}:{pattern.m} sparsity needs weights whose inputs are a multiple of {pattern.m}; "
                        f"{name!r} has shape {tuple(weight.shape)}")


def wanda_mask(weight: torch.Tensor, input_norms: torch.Tensor, sparsity: Sparsity) -> torch.Tensor:
    """Wanda (Sun et al., 2023): the keep-mask pruning the weights of least ``|w_ij| · ‖x_j‖`` (``input_norms``:
    the ``L2`` norm of each input over the calibration data), compared within each row (or each ``m`` group).

    >>> wanda_mask(torch.tensor([[1., -3., 2., 0.5]]), torch.tensor([4., 1., 1., 8.]), Sparsity(0.5)).int().tolist()
    [[1, 0, 0, 1]]
    """
    scores = weight.detach().abs().to(_score_dtype(weight.dtype)) * input_norms.to(_score_dtype(weight.dtype))
    return lowest_mask(scores, sparsity, per_row=True)


def weight_scores(
    weight: torch.Tensor, method: PruneMethod, granularity: Granularity, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One score per prunable unit (element, or output row/channel = slice along dim 0); low scores go first.

    ``l1-norm`` scores an element by ``|w|`` and a row by its mean ``|w|`` (mean, not sum, so rows of
    layers with different fan-in compare fairly in global scope); NaN counts as the largest magnitude.
    ``random`` draws uniform scores from ``generator``.
    """
    if granularity == "unstructured" or weight.dim() <= 1:
        shape = weight.shape
    else:
        shape = weight.shape[:1]
    if method == "random":
        return torch.rand(shape, generator=generator, dtype=torch.float64).to(weight.device)
    magnitude = weight.detach().abs().to(_score_dtype(weight.dtype))
    if granularity == "unstructured" or weight.dim() <= 1:
        return magnitude
    return magnitude.flatten(1).mean(dim=1)


def keep_mask_from_scores(scores: torch.Tensor, n_prune: int) -> torch.Tensor:
    """Boolean mask (True = keep) pruning exactly the ``n_prune`` lowest scores; ties go to the earlier index."""
    flat = scores.reshape(-1)
    order = torch.argsort(flat, stable=True)
    keep = torch.ones(flat.numel(), dtype=torch.bool, device=scores.device)
    keep[order[:n_prune]] = False
    return keep.reshape(scores.shape)


def _expand_to_weight(unit_mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if unit_mask.shape == weight.shape:
        return unit_mask
    return unit_mask.reshape(-1, *([1] * (weight.dim() - 1))).expand_as(weight).contiguous()


def weight_masks(
    weights: dict[str, torch.Tensor],
    sparsity: float,
    method: PruneMethod = "l1-norm",
    granularity: Granularity = "unstructured",
    scope: Literal["local", "global"] = "local",
    seed: int = 0,
    pattern: Sparsity | None = None,
) -> dict[str, torch.Tensor]:
    """Keep-masks (bool, weight-shaped) pruning ``sparsity`` of the units of each weight or of all of them.

    ``local``: each weight loses ``round(sparsity * units)`` units. ``global``: the units of all
    weights are ranked together and ``round(sparsity * total units)`` are pruned, wherever they are.
    A unit is an element (``unstructured``) or an output row / output channel (``row``, ``channel``).
    An ``n:m`` ``pattern`` instead prunes the ``n`` lowest elements of every ``m`` consecutive inputs of each
    row (``sparsity``, ``granularity`` and ``scope`` then say nothing).
    """
    generator = torch.Generator().manual_seed(seed)
    if pattern is not None and pattern.m:
        masks = {}
        for name, w in weights.items():
            check_n_of_m(name, w, pattern)
            masks[name] = lowest_mask(weight_scores(w, method, "unstructured", generator).flatten(1), pattern).reshape(w.shape)
        return masks
    scores = {name: weight_scores(w, method, granularity, generator) for name, w in weights.items()}
    if scope == "local":
        unit_masks = {name: keep_mask_from_scores(s, prune_count(s.numel(), sparsity)) for name, s in scores.items()}
    else:
        flat = torch.cat([s.reshape(-1).to("cpu", torch.float64) for s in scores.values()])
        keep = keep_mask_from_scores(flat, prune_count(flat.numel(), sparsity))
        unit_masks, start = {}, 0
        for name, s in scores.items():
            unit_masks[name] = keep[start : start + s.numel()].reshape(s.shape).to(s.device)
            start += s.numel()
    return {name: _expand_to_weight(unit_masks[name], weights[name]) for name in weights}


class WeightMask(nn.Module):
    """Parametrisation ``w -> where(mask, w, 0)``; ``mask`` is a bool buffer, so it is saved with the model.

    A pruned NaN or Inf weight reads as exactly 0; gradients reach the kept weights only.
    """

    def __init__(self, mask: torch.Tensor):
        super().__init__()
        self.register_buffer("mask", mask.to(torch.bool))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.where(self.mask, weight, torch.zeros((), dtype=weight.dtype, device=weight.device))


def weight_mask_of(module: nn.Module, name: str = "weight") -> WeightMask | None:
    """The ``WeightMask`` on ``module.<name>``, or None when that tensor is not masked."""
    if not parametrize.is_parametrized(module, name):
        return None
    found = [p for p in module.parametrizations[name] if isinstance(p, WeightMask)]
    return found[0] if found else None


def attach_weight_mask(module: nn.Module, keep: torch.Tensor, name: str = "weight") -> WeightMask:
    """Mask ``module.<name>`` with ``keep``; an existing mask is narrowed (old AND new), not stacked."""
    tensor = getattr(module, name)
    if tuple(keep.shape) != tuple(tensor.shape):
        raise UserError(f"mask shape {tuple(keep.shape)} does not match {name} shape {tuple(tensor.shape)}")
    existing = weight_mask_of(module, name)
    if existing is not None:
        existing.mask.copy_(existing.mask & keep.to(existing.mask.device))
        return existing
    mask = WeightMask(keep.to(tensor.device))
    parametrize.register_parametrization(module, name, mask)
    return mask


def bake_weight_mask(module: nn.Module, name: str = "weight") -> bool:
    """Write the masked values into ``module.<name>`` (same Parameter object) and drop the mask.

    Returns whether there was a mask. Fails when the tensor also carries a parametrisation
    that is not a ``WeightMask``, since removing only the mask is not possible then.
    """
    if weight_mask_of(module, name) is None:
        return False
    others = [type(p).__name__ for p in module.parametrizations[name] if not isinstance(p, WeightMask)]
    if others:
        raise UserError(f"{name} also has parametrisations {others}; remove them before baking the mask")
    parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    return True


class ActivationPruner:
    """Forward pre-hook zeroing ``sparsity`` of each sample's input activation (dim 0 = samples).

    ``l1-norm`` zeroes the smallest magnitudes of each sample, ``random`` a random subset drawn from a
    generator seeded with ``seed``. Inputs of rank 0 or 1 count as a single sample. Counts of zeros and
    elements seen after pruning are kept, so the achieved sparsity can be reported.
    """

    def __init__(self, sparsity: float, method: PruneMethod = "l1-norm", seed: int = 0):
        prune_count(1, sparsity)
        self.sparsity = sparsity
        self.method = method
        self.seed = seed
        self.zeros = 0
        self.total = 0
        self.handle = None
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def prune(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with ``sparsity`` of every sample's elements set to zero."""
        rows = x.reshape(1, -1) if x.dim() <= 1 else x.reshape(x.shape[0], -1)
        n_prune = prune_count(rows.shape[1], self.sparsity)
        if n_prune == 0:
            return x
        if self.method == "random":
            scores = torch.rand(rows.shape, generator=self._generator(x.device), device=x.device)
        else:
            scores = rows.detach().abs()
        pruned = torch.argsort(scores, dim=1, stable=True)[:, :n_prune]
        keep = torch.ones(rows.shape, dtype=torch.bool, device=x.device).scatter_(1, pruned, False)
        return torch.where(keep, rows, torch.zeros((), dtype=x.dtype, device=x.device)).reshape(x.shape)

    def __call__(self, module: nn.Module, args: tuple) -> tuple | None:
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        out = self.prune(args[0])
        self.zeros += int((out == 0).sum())
        self.total += out.numel()
        return (out, *args[1:])

    @property
    def achieved(self) -> float | None:
        """Fraction of zeros among the activations pruned so far, or None before the first call."""
        return self.zeros / self.total if self.total else None

    def reset(self) -> None:
        """Forget the counts (the next ``achieved`` reflects only later calls)."""
        self.zeros = 0
        self.total = 0


def activation_pruner_of(module: nn.Module) -> ActivationPruner | None:
    """The pruner hooked on ``module``, or None."""
    return getattr(module, PRUNER_ATTR, None)


def attach_activation_pruner(module: nn.Module, pruner: ActivationPruner) -> ActivationPruner:
    """Hook ``pruner`` on ``module``'s input, replacing a pruner attached before."""
    detach_activation_pruner(module)
    pruner.handle = module.register_forward_pre_hook(pruner)
    setattr(module, PRUNER_ATTR, pruner)
    return pruner


def share_activation_pruner(source: nn.Module, target: nn.Module) -> None:
    """Hook ``source``'s activation pruner, if it has one, on ``target`` as well (for a module replacing it)."""
    pruner = activation_pruner_of(source)
    if pruner is not None:
        attach_activation_pruner(target, pruner)


def detach_activation_pruner(module: nn.Module) -> bool:
    """Remove the activation-pruning hook of ``module``; returns whether there was one."""
    pruner = activation_pruner_of(module)
    if pruner is None:
        return False
    module._forward_pre_hooks.pop(pruner.handle.id, None)
    pruner.handle = None
    delattr(module, PRUNER_ATTR)
    return True
