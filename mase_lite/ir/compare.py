"""Graph against model: both run on the same inputs (in train mode under one seed), outputs compared bit for bit.

>>> first_difference(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")])) is None
True
>>> first_difference(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
'output 0 differs (max abs difference 0.5)'
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn as nn

from mase_lite.ir.export import caches_off


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def first_difference(expected: Any, got: Any) -> str | None:
    """Where two outputs differ (bit for bit, NaN equal to NaN); ``None`` when identical."""
    a, b = _tensors(expected), _tensors(got)
    if len(a) != len(b):
        return f"{len(b)} output tensors instead of {len(a)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {i}: {tuple(y.shape)} {y.dtype} instead of {tuple(x.shape)} {x.dtype}"
        if not torch.equal(x, y) and not bool(((x == y) | (x.isnan() & y.isnan())).all()):
            diff = (x.double() - y.double()).abs().nan_to_num(nan=float("inf")).max().item()
            return f"output {i} differs (max abs difference {diff:.3g})"
    return None


@contextlib.contextmanager
def _kept_state(*modules: nn.Module) -> Iterator[None]:
    """Modes, buffers (running statistics) and the RNG state, restored afterwards."""
    modes = {m: m.training for root in modules for m in root.modules()}
    buffers = {id(b): (b, b.detach().clone()) for root in modules for b in root.buffers()}
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode
        with torch.no_grad():
            for b, saved in buffers.values():
                b.copy_(saved)
        torch.set_rng_state(rng)


def _seed() -> None:
    """Seed the generators a forward can draw from (``torch.manual_seed`` also wakes every backend: slower)."""
    torch.default_generator.manual_seed(0)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(0)


def compare_with_model(gm: nn.Module, model: nn.Module, inputs: dict[str, Any], train: bool = False) -> str | None:
    """Run graph and model on ``inputs`` (in train mode under one seed) and say how they differ."""
    with _kept_state(gm, model), torch.no_grad(), caches_off(model):
        gm.train(train)
        model.train(train)
        _seed()
        expected = model(**inputs)
        _seed()
        got = gm(**inputs)
        return first_difference(expected, got)
