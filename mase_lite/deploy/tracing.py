"""Tracing a quantized model for a runtime: its quantized weights as plain values for the duration, in eval mode,
called with its inputs by name and returning its tensors, with batch and sequence dimensions free."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.deploy.layers import ExportError
from mase_lite.kernels.mxint8 import MXInt8Linear
from mase_lite.nn.quantized import QuantizedLayer


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode (a deployed model does not train), its modules' modes as they were after."""
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


class Outputs(nn.Module):
    """The model called with its inputs by name, returning its tensors (a model output's fields, in order; one
    tensor alone)."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *args: Tensor):
        out = self.model(**dict(zip(self.names, args)))
        if isinstance(out, Tensor):
            return out
        values = out.values() if hasattr(out, "values") else out
        tensors = tuple(v for v in values if isinstance(v, Tensor))
        return tensors[0] if len(tensors) == 1 else tensors

    @staticmethod
    def names_of(out) -> list[str]:
        """The output names: a model output's field names (``logits``), else ``output_<i>``."""
        if isinstance(out, Tensor):
            return ["output"]
        if hasattr(out, "items"):
            return [k for k, v in out.items() if isinstance(v, Tensor)]
        return [f"output_{i}" for i, v in enumerate(out) if isinstance(v, Tensor)]


def example_inputs(mg) -> dict[str, Tensor]:
    """The tensors the model was captured with (module mode: its example inputs), by name."""
    inputs = {k: v for k, v in (getattr(mg, "example_inputs", None) or {}).items() if isinstance(v, Tensor)}
    if not inputs:
        raise ExportError("the model has no example inputs to trace it with (module mode: give example_inputs)")
    return inputs


def dynamic(t: Tensor) -> dict[int, Any]:
    """Batch and sequence dimensions free; the others (features, channels, image sizes) as given."""
    free = range(min(t.dim(), 2)) if not t.is_floating_point() else range(min(t.dim(), 1))
    return {d: torch.export.Dim.AUTO for d in free}


@contextlib.contextmanager
def quantized_values(model: nn.Module, unpack: bool = True) -> Iterator[None]:
    """Within the block, each quantized weight and bias is a plain parameter holding its quantized values (the
    quantizer set aside) and, with ``unpack``, each packed MXINT8 layer a Linear with its decoded weight; restored
    after."""
    restore = []
    try:
        for name, module in list(model.named_modules()):
            if isinstance(module, QuantizedLayer):
                for operand in ("weight", "bias"):
                    quantizer = getattr(module, f"{operand}_quantizer", None)
                    param = module._parameters.get(operand)
                    if quantizer is None or param is None:
                        continue
                    values = module._operand(operand, param).detach()
                    restore.append((module, operand, param, quantizer))
                    module._parameters[operand] = nn.Parameter(values, requires_grad=False)
                    setattr(module, f"{operand}_quantizer", None)
            elif unpack and isinstance(module, MXInt8Linear):
                parent_name, _, child = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
                linear.weight = nn.Parameter(module.dequantized_weight(), requires_grad=False)
                linear.bias = None if module.bias is None else nn.Parameter(module.bias.detach(), requires_grad=False)
                setattr(parent, child, linear)
                restore.append((parent, child, module, None))
        yield
    finally:
        for owner, key, original, quantizer in reversed(restore):
            if quantizer is None:
                setattr(owner, key, original)
            else:
                owner._parameters[key] = original
                setattr(owner, f"{key}_quantizer", quantizer)
