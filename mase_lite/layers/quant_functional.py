"""Quantized matmul, bmm, add and mul: as functions, and as small modules the ``quantize`` pass puts in a graph.

Operands are ``data_in_0``, ``data_in_1`` (``data_in`` names both, ``weight`` the second) and
``data_out``; see :mod:`mase_lite.layers.quant_config`. Non-tensor operands (``x * 0.125``) pass through.

Example::

    cfg = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4}
    y = quantized_matmul(a, b, cfg)          # torch.matmul(q(a), q(b))
    node_module = QuantizedMatmul(cfg)       # module form, used as a call_module node
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.layers.quant_config import FUNCTION_OPERANDS, QuantConfig, QuantConfigError, parse_quant_config
from mase_lite.layers.quantized import OperandQuantizer


def _parsed(config: Mapping[str, Any] | QuantConfig) -> QuantConfig:
    parsed = parse_quant_config(config, FUNCTION_OPERANDS)
    if parsed is None:
        raise QuantConfigError("this config quantizes nothing ({'name': null})", location=("config",))
    return parsed


def _quantized_call(fn: Callable, config: Mapping[str, Any] | QuantConfig, a: Any, b: Any, **kwargs: Any) -> Tensor:
    parsed = _parsed(config)

    def apply(operand: str, x: Any) -> Any:
        spec = parsed.get(operand)
        return spec(x) if spec is not None and isinstance(x, Tensor) else x

    return apply("data_out", fn(apply("data_in_0", a), apply("data_in_1", b), **kwargs))


def quantized_matmul(a: Tensor, b: Tensor, config: Mapping[str, Any] | QuantConfig) -> Tensor:
    """``torch.matmul`` of quantized operands, quantized output."""
    return _quantized_call(torch.matmul, config, a, b)


def quantized_bmm(a: Tensor, b: Tensor, config: Mapping[str, Any] | QuantConfig) -> Tensor:
    """``torch.bmm`` of quantized operands, quantized output."""
    return _quantized_call(torch.bmm, config, a, b)


def quantized_add(a: Tensor, b: Any, config: Mapping[str, Any] | QuantConfig, alpha: Any = 1) -> Tensor:
    """``torch.add(a, b, alpha=alpha)`` of quantized operands, quantized output."""
    return _quantized_call(torch.add, config, a, b, alpha=alpha)


def quantized_mul(a: Tensor, b: Any, config: Mapping[str, Any] | QuantConfig) -> Tensor:
    """``torch.mul`` of quantized operands, quantized output."""
    return _quantized_call(torch.mul, config, a, b)


class QuantizedFunction(nn.Module):
    """A binary op with one optional quantizer per operand (``<operand>_quantizer``).

    ``device`` and ``dtype`` place learnable level means (``binary_residual_sign``) by the op's output.
    """

    def __init__(self, config: Mapping[str, Any] | QuantConfig, device: torch.device | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.quant_config = _parsed(config)
        for operand in FUNCTION_OPERANDS:
            spec = self.quant_config.get(operand)
            quantizer = OperandQuantizer(spec, device=device, dtype=dtype) if spec is not None else None
            setattr(self, f"{operand}_quantizer", quantizer)

    def _operand(self, operand: str, x: Any) -> Any:
        quantizer = getattr(self, f"{operand}_quantizer")
        return quantizer(x) if quantizer is not None and isinstance(x, Tensor) else x

    def compute(self, a: Any, b: Any, **kwargs: Any) -> Tensor:
        raise NotImplementedError

    def forward(self, a: Any, b: Any, **kwargs: Any) -> Tensor:
        y = self.compute(self._operand("data_in_0", a), self._operand("data_in_1", b), **kwargs)
        return self._operand("data_out", y)

    def quant_formats(self) -> dict[str, dict[str, Any]]:
        """``{operand: format dict}`` of the operands this op quantizes."""
        return self.quant_config.formats()


class QuantizedMatmul(QuantizedFunction):
    mase_op = "matmul"

    def compute(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.matmul(a, b)


class QuantizedBmm(QuantizedFunction):
    mase_op = "bmm"

    def compute(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.bmm(a, b)


class QuantizedAdd(QuantizedFunction):
    mase_op = "add"

    def compute(self, a: Any, b: Any, alpha: Any = 1) -> Tensor:
        return torch.add(a, b, alpha=alpha)


class QuantizedMul(QuantizedFunction):
    mase_op = "mul"

    def compute(self, a: Any, b: Any) -> Tensor:
        return torch.mul(a, b)


QUANTIZED_FUNCTIONS: dict[str, type[QuantizedFunction]] = {
    "matmul": QuantizedMatmul,
    "bmm": QuantizedBmm,
    "add": QuantizedAdd,
    "mul": QuantizedMul,
}
