"""Registered module constructors that the ``replace`` pass can swap in for a selected module.

A constructor is ``fn(old: nn.Module, **params) -> nn.Module``: it sees the module it replaces (to
read sizes or weights) and returns the new one. The result is moved to the old module's device and
floating dtype by ``build_replacement``.

Example::

    @register_replacement("scaled_identity")
    def scaled_identity(old, scale: float = 1.0):
        return ScaledIdentity(scale)

    new = build_replacement("low_rank_linear", old_linear, {"rank": 4})
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch
import torch.nn as nn

from mase_lite.infra.errors import UserError

ReplacementFactory = Callable[..., nn.Module]

_REPLACEMENTS: dict[str, ReplacementFactory] = {}


def register_replacement(name: str) -> Callable[[ReplacementFactory], ReplacementFactory]:
    """Register ``fn(old, **params) -> nn.Module`` under ``name`` for ``replace``'s ``with.module``."""

    def decorate(fn: ReplacementFactory) -> ReplacementFactory:
        if name in _REPLACEMENTS and _REPLACEMENTS[name] is not fn:
            raise UserError(f"a replacement named '{name}' is already registered")
        _REPLACEMENTS[name] = fn
        return fn

    return decorate


def replacement_names() -> list[str]:
    """Names of every registered replacement constructor."""
    return sorted(_REPLACEMENTS)


def _params_of(fn: ReplacementFactory) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "old"]


def _place_like(new: nn.Module, old: nn.Module) -> nn.Module:
    reference = next(iter(old.parameters()), None)
    if reference is None:
        reference = next(iter(old.buffers()), None)
    if reference is None:
        return new
    if reference.is_floating_point():
        return new.to(device=reference.device, dtype=reference.dtype)
    return new.to(device=reference.device)


def build_replacement(name: str, old: nn.Module, params: dict | None = None) -> nn.Module:
    """Build replacement ``name`` for ``old`` with ``params``; clear errors for unknown names or keys."""
    if name not in _REPLACEMENTS:
        raise UserError(f"unknown replacement '{name}'; registered: {', '.join(replacement_names())}", location=("with", "module"))
    fn = _REPLACEMENTS[name]
    params = dict(params or {})
    try:
        inspect.signature(fn).bind(old, **params)
    except TypeError as err:
        raise UserError(
            f"with.params for '{name}': {err}; allowed keys: {', '.join(_params_of(fn)) or '(none)'}"
        ) from None
    return _place_like(fn(old, **params), old)


def _features(old: nn.Module, name: str, attr: str) -> int:
    value = getattr(old, attr, None)
    if not isinstance(value, int):
        raise UserError(f"replacement '{name}' needs a module with {attr}, got {type(old).__name__}")
    return value


@register_replacement("identity")
def identity(old: nn.Module) -> nn.Module:
    """``nn.Identity``: the module's output becomes its input."""
    return nn.Identity()


@register_replacement("linear")
def linear(old: nn.Module, out_features: int | None = None, bias: bool | None = None) -> nn.Module:
    """A freshly initialised Linear with the old module's ``in_features`` (and by default its width and bias)."""
    in_features = _features(old, "linear", "in_features")
    out = out_features if out_features is not None else _features(old, "linear", "out_features")
    if out < 1:
        raise UserError(f"{out!r} must be a positive integer", location=("with", "params", "out_features"))
    has_bias = bias if bias is not None else getattr(old, "bias", None) is not None
    return nn.Linear(in_features, out, bias=has_bias)


@register_replacement("low_rank_linear")
def low_rank_linear(old: nn.Module, rank: int) -> nn.Module:
    """Two Linears ``in -> rank -> out`` holding the best rank-``rank`` approximation (truncated SVD) of a Linear."""
    if not isinstance(old, nn.Linear):
        raise UserError(f"replacement 'low_rank_linear' needs an nn.Linear, got {type(old).__name__}")
    full_rank = min(old.in_features, old.out_features)
    if not 1 <= rank <= full_rank:
        raise UserError(f"{rank!r} must be in [1, {full_rank}] for a {old.out_features}x{old.in_features} Linear", location=("with", "params", "rank"))
    with torch.no_grad():
        u, s, vh = torch.linalg.svd(old.weight.detach().to(torch.float64), full_matrices=False)
        root = s[:rank].sqrt()
        down = nn.Linear(old.in_features, rank, bias=False)
        up = nn.Linear(rank, old.out_features, bias=old.bias is not None)
        down.weight.copy_(root[:, None] * vh[:rank])
        up.weight.copy_(u[:, :rank] * root[None, :])
        if old.bias is not None:
            up.bias.copy_(old.bias)
    return nn.Sequential(down, up)


_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "identity": nn.Identity,
}


@register_replacement("activation")
def activation(old: nn.Module, name: str) -> nn.Module:
    """An elementwise activation by name (relu, gelu, silu, tanh, sigmoid, identity)."""
    if name not in _ACTIVATIONS:
        raise UserError(f"unknown activation {name!r}; allowed: {', '.join(sorted(_ACTIVATIONS))}", location=("with", "params", "name"))
    return _ACTIVATIONS[name]()
