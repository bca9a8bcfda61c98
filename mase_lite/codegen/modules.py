"""Leaf modules as constructor source: ``nn.Linear(128, 128)``, ``QuantizedLinear(..., config={...})``.

Each constructor is checked: built on the meta device from its own source, it must print like the
original and hold tensors of the same names and shapes, or :class:`CodegenError` names the node.

Example::

    >>> constructor_source(torch.nn.Linear(4, 2, bias=False))
    'nn.Linear(4, 2, bias=False)'
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from mase_lite.infra.errors import UserError

QUANTIZED_MODULE = "mase_lite.layers.quantized"
QUANTIZED_FUNCTION_MODULE = "mase_lite.layers.quant_functional"
_SKIPPED_ARGS = ("self", "device", "dtype")


class CodegenError(UserError):
    """The graph holds something the emitted code cannot express; the message names the node."""


def module_class(module: nn.Module) -> type:
    """The module's own class (a pruned layer's class, not torch's ``Parametrized...`` wrapper)."""
    return parametrize.type_before_parametrizations(module)


def _literal(value: Any) -> str | None:
    """Python source of a plain constructor argument, or None when it is not plain data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = [_literal(v) for v in value]
        if any(i is None for i in items):
            return None
        body = ", ".join(items) + ("," if isinstance(value, tuple) and len(items) == 1 else "")
        return f"({body})" if isinstance(value, tuple) else f"[{body}]"
    if isinstance(value, dict):
        items = {k: _literal(v) for k, v in value.items()}
        if any(i is None or not isinstance(k, str) for k, i in items.items()):
            return None
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in items.items()) + "}"
    return None


def _is_default(value: Any, default: Any) -> bool:
    """Whether an attribute holds the argument's default (``stride=(1, 1)`` is ``stride=1``, as torch stores it)."""
    if isinstance(value, tuple) and type(default) is int:
        return all(type(v) is int and v == default for v in value)
    return type(value) is type(default) and value == default


def torch_arguments(module: nn.Module, cls: type) -> list[str] | None:
    """Constructor arguments of a torch.nn module read back from its attributes; None if one is missing."""
    parts: list[str] = []
    keyword = False
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name in _SKIPPED_ARGS or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name == "bias" and "bias" in module._parameters:
            value: Any = module._parameters["bias"] is not None or parametrize.is_parametrized(module, "bias")
        elif hasattr(module, name):
            value = getattr(module, name)
        elif p.default is not p.empty:
            keyword = True
            continue
        else:
            return None
        source = _literal(value)
        if source is None:
            return None
        if p.default is not p.empty and _is_default(value, p.default):
            keyword = True
            continue
        keyword = keyword or p.default is not p.empty
        parts.append(f"{name}={source}" if keyword else source)
    return parts


def quant_config_literal(config) -> dict[str, dict[str, Any]]:
    """A parsed quantization config in its nested JSON form (format dict per operand, with its STE)."""
    out = {}
    for operand, spec in config.operands.items():
        fmt = spec.as_dict()
        if spec.ste != "identity":
            fmt["ste"] = spec.ste
        out[operand] = fmt
    return out


def constructor_source(module: nn.Module) -> str:
    """Source that builds a module like ``module`` (weights aside); raises CodegenError otherwise."""
    cls = module_class(module)
    if cls.__module__ == QUANTIZED_MODULE:
        float_cls = next(base for base in cls.__mro__ if base.__module__.startswith("torch.nn"))
        args = torch_arguments(module, float_cls)
        config = _literal(quant_config_literal(module.quant_config))
        if args is not None and config is not None:
            return f"{cls.__name__}({', '.join([*args, f'config={config}'])})"
    elif cls.__module__ == QUANTIZED_FUNCTION_MODULE:
        config = _literal(quant_config_literal(module.quant_config))
        if config is not None:
            return f"{cls.__name__}(config={config})"
    elif cls.__module__.startswith("torch.nn.modules") and getattr(nn, cls.__name__, None) is cls:
        args = torch_arguments(module, cls)
        if args is not None:
            return f"nn.{cls.__name__}({', '.join(args)})"
    raise CodegenError(f"{cls.__module__}.{cls.__name__}")


def import_line(module: nn.Module) -> str | None:
    """The import the emitted code needs for this module's constructor (None for torch.nn)."""
    cls = module_class(module)
    if cls.__module__ in (QUANTIZED_MODULE, QUANTIZED_FUNCTION_MODULE):
        return f"from {cls.__module__} import {cls.__name__}"
    return None


def check_constructor(module: nn.Module, source: str) -> str | None:
    """Why ``source`` does not rebuild ``module`` (None when it does): repr, tensor names and shapes."""
    namespace: dict[str, Any] = {"nn": nn, "torch": torch}
    line = import_line(module)
    if line is not None:
        exec(line, namespace)
    with torch.device("meta"):
        rebuilt = eval(source, namespace)
    original, copy = state_tensors(module), rebuilt.state_dict()
    if {k: tuple(v.shape) for k, v in original.items()} != {k: tuple(v.shape) for k, v in copy.items()}:
        return f"{source} holds tensors {sorted(copy)}, the graph's module {sorted(original)}"
    if type(module).__name__.startswith("Parametrized"):
        return None
    if repr(rebuilt) != repr(module):
        return f"{source} prints as {rebuilt!r}, the graph's module as {module!r}"
    return None


def state_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a module computes with, by state-dict name; a pruned weight is its masked value."""
    out = {}
    for name, value in module.state_dict().items():
        if ".parametrizations." in f".{name}":
            if not name.endswith(".original") or name.count(".") != 2:
                continue
            name = name.split(".")[1]
            value = getattr(module, name)
        out[name] = value.detach()
    return out
