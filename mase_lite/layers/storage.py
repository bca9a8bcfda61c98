"""A model's quantized parameters as stored codes: what a checkpoint writes instead of their float values.

:func:`stored_codes` finds, in any module tree, every quantized layer's weight and bias that a codec can
store (:mod:`mase_lite.numerics.codes`) and that belongs to that layer alone (a tied weight is read by
another module in float, so it stays float); :func:`restore_codes` writes the stored values back into a
model of the same structure and holds them. :func:`flatten` and :func:`unflatten` turn codes into named
tensors (``<parameter>.codes``, ``<parameter>.<side>``) and a JSON manifest, and back.

>>> import torch
>>> from mase_lite.layers.quantized import quantize_module
>>> layer = quantize_module(torch.nn.Linear(64, 4), {"weight": {"name": "mxint", "element_width": 4}})
>>> stored = stored_codes(torch.nn.Sequential(layer))
>>> sorted(stored), stored["0.weight"].bits
(['0.weight'], 4)
>>> tensors, manifest = flatten(stored)
>>> sorted(tensors), manifest["0.weight"]["side"]
(['0.weight.codes', '0.weight.scale'], ['scale'])
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.infra.errors import UserError
from mase_lite.layers.quantized import QuantizedLayer
from mase_lite.numerics.codes import Encoded

CODES = "codes"


def stored_codes(model: nn.Module, held_only: bool = False) -> dict[str, Encoded]:
    """``{parameter name: codes}`` of the model's quantized parameters that store as codes; with
    ``held_only``, only those already holding stored values (they have no float master to keep)."""
    shared = _shared_parameters(model)
    stored = {}
    for prefix, module in model.named_modules():
        if not isinstance(module, QuantizedLayer):
            continue
        for operand, encoded in module.encode_parameters().items():
            name = f"{prefix}.{operand}" if prefix else operand
            quantizer = getattr(module, f"{operand}_quantizer")
            if id(module._parameters[operand]) in shared:
                continue
            if held_only and quantizer.held(module._stored_view(operand, module._parameters[operand])) is None:
                continue
            stored[name] = encoded
    return stored


def quantized_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters a quantized layer quantizes (its weight and bias with a format)."""
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, QuantizedLayer):
            for operand in ("weight", "bias"):
                if getattr(module, f"{operand}_quantizer", None) is not None and getattr(module, operand, None) is not None:
                    names.append(f"{prefix}.{operand}" if prefix else operand)
    return names


def _shared_parameters(model: nn.Module) -> set[int]:
    """Ids of the parameters reachable under more than one name (tied weights)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def check_stored_names(model: nn.Module, names: list[str]) -> None:
    """Each name must be a quantized parameter of ``model``; a :class:`UserError` naming the first that is not."""
    modules = dict(model.named_modules())
    for name in names:
        prefix, _, operand = name.rpartition(".")
        module = modules.get(prefix)
        if not isinstance(module, QuantizedLayer):
            found = type(module).__name__ if module is not None else "nothing"
            raise UserError(f"stored codes {name!r}: the model has {found} at {prefix!r}, not a quantized layer")
        if operand not in ("weight", "bias") or getattr(module, f"{operand}_quantizer", None) is None:
            raise UserError(f"stored codes {name!r}: {prefix!r} quantizes no {operand!r}")


def restore_codes(model: nn.Module, stored: Mapping[str, Encoded]) -> None:
    """Write each stored parameter's values into ``model`` and hold them; a name the model has no quantized
    parameter for is a :class:`UserError`."""
    check_stored_names(model, list(stored))
    modules = dict(model.named_modules())
    for name, encoded in stored.items():
        prefix, _, operand = name.rpartition(".")
        module = modules[prefix]
        try:
            module.restore_parameter(operand, encoded)
        except ValueError as err:
            raise UserError(f"stored codes {name!r}: {err}") from None


def flatten(stored: Mapping[str, Encoded]) -> tuple[dict[str, Tensor], dict[str, dict[str, Any]]]:
    """Named tensors and the JSON manifest that :func:`unflatten` reads back."""
    tensors, manifest = {}, {}
    for name, encoded in stored.items():
        tensors[f"{name}.{CODES}"] = encoded.packed
        for key, value in encoded.side.items():
            tensors[f"{name}.{key}"] = value.contiguous()
        manifest[name] = {"format": encoded.format, "bits": encoded.bits, "shape": list(encoded.shape),
                          "dtype": str(encoded.dtype).removeprefix("torch."), "side": sorted(encoded.side)}
    return tensors, manifest


def unflatten(tensors: Mapping[str, Tensor], manifest: Mapping[str, Mapping[str, Any]], where: str) -> dict[str, Encoded]:
    """The codes a manifest names, read from ``tensors``; a missing or malformed tensor is a :class:`UserError`
    naming it (``where``: the file)."""
    stored = {}
    for name, entry in manifest.items():
        keys = [CODES, *entry["side"]]
        missing = [f"{name}.{k}" for k in keys if f"{name}.{k}" not in tensors]
        if missing:
            raise UserError(f"{where}: stored codes {name!r} lack tensor {missing[0]!r}")
        dtype = getattr(torch, entry["dtype"], None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise UserError(f"{where}: stored codes {name!r} have dtype {entry['dtype']!r}, not a float dtype")
        shape = tuple(entry["shape"])
        numel = 1
        for size in shape:
            numel *= size
        packed = tensors[f"{name}.{CODES}"]
        if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() * 8 < numel * entry["bits"]:
            raise UserError(f"{where}: stored codes {name!r}: {name}.{CODES} is not {numel} packed "
                            f"{entry['bits']}-bit codes (got {packed.dtype} of shape {list(packed.shape)})")
        side = {k: tensors[f"{name}.{k}"] for k in entry["side"]}
        stored[name] = Encoded(dict(entry["format"]), int(entry["bits"]), packed, side, shape, dtype)
    return stored
