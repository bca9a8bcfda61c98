"""What an exporter sees of a model: each Linear-like layer with its weight's stored codes, its effective float
weight and bias, and its activation formats; and one error for a layer a target cannot hold.

>>> import torch
>>> from mase_lite.layers.quantized import quantize_module
>>> model = torch.nn.Sequential(quantize_module(torch.nn.Linear(64, 4), {"weight": {"name": "mxint"}}), torch.nn.Linear(4, 2))
>>> [(layer.name, layer.weight_format and layer.weight_format["name"]) for layer in linear_layers(model)]
[('0', 'mxint'), ('1', None)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from torch import Tensor

from mase_lite.deploy.errors import ExportError
from mase_lite.kernels.mxint8 import MXInt8Linear
from mase_lite.kernels.int8_activations.layers import FormatLayer
from mase_lite.layers.lora import LoRALinear
from mase_lite.layers.quantized import QuantizedLayer, QuantizedLinear
from mase_lite.numerics.codes import Encoded, decode


def unsupported(target: str, layer: str, what: str, nearest: str) -> ExportError:
    """The refusal of one layer: its name, what it holds, and the target's nearest scheme."""
    return ExportError(f"{target} cannot hold layer {layer!r}: {what}; nearest {target} scheme: {nearest}")


@dataclass
class Layer:
    """One Linear-like layer as an exporter needs it (weights ``[out, in]``)."""

    name: str
    module: nn.Module
    weight: Tensor
    bias: Tensor | None
    codes: Encoded | None
    data_in: dict[str, Any] | None = None
    data_out: dict[str, Any] | None = None

    @property
    def weight_format(self) -> dict[str, Any] | None:
        """The weight's format dict, None for a float weight."""
        if self.codes is not None:
            return self.codes.format
        quantizer = getattr(self.module, "weight_quantizer", None)
        return quantizer.spec.as_dict() if quantizer is not None else None


def linear_layers(model: nn.Module, skip: str | None = None) -> list[Layer]:
    """Every Linear, quantized Linear and packed (MXINT8, 4-bit, K-quant, Q8_0) Linear of ``model`` (module paths as
    names), with the values it computes with: the weight its quantizer gives (from stored codes where the format has
    them), the bias likewise. LoRA adapters are refused: merge them first. Modules under ``skip`` (a path) are left
    out."""
    layers = []
    for name, module in model.named_modules():
        if skip is not None and (name == skip or name.startswith(f"{skip}.")):
            continue
        if isinstance(module, LoRALinear):
            raise ExportError(f"layer {name!r} carries LoRA adapters; merge them into the weights first (lora_merge)")
        if isinstance(module, (MXInt8Linear, FormatLayer)):  # packed: MXINT8, or a format's bytes
            codes = module.encoded()
            layers.append(Layer(name, module, decode(codes), _detached(module.bias), codes))
        elif isinstance(module, QuantizedLinear):
            stored = module.encode_parameters()
            weight = decode(stored["weight"]) if "weight" in stored else module._operand("weight", module.weight).detach()
            bias = module._operand("bias", module.bias)
            formats = module.quant_formats()
            layers.append(Layer(name, module, weight, _detached(bias), stored.get("weight"),
                                formats.get("data_in"), formats.get("data_out")))
        elif type(module) is nn.Linear:
            layers.append(Layer(name, module, module.weight.detach(), _detached(module.bias), None))
    return layers


def other_quantized_layers(model: nn.Module) -> list[str]:
    """Names of quantized layers that are not Linear (convolutions, transformers' Conv1D)."""
    return [name for name, module in model.named_modules()
            if isinstance(module, QuantizedLayer) and not isinstance(module, QuantizedLinear)]


def _detached(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


def record_quantized(model: nn.Module) -> nn.Module:
    """``model`` with ``mase_transforms`` saying how its quantized layers came to be: one ``quantize`` by module
    name with each layer's formats, which a checkpoint's load replays before it decodes the stored codes."""
    rules = {name: module.quant_formats() for name, module in model.named_modules() if isinstance(module, QuantizedLayer)}
    model.mase_transforms = [{"pass": "quantize", "params": {"by": "name", "rules": rules},
                              "module": "mase_lite.passes.transforms.quantize"}] if rules else []
    return model
