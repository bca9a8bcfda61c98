"""Quantized Linear, Conv1d, Conv2d and transformers' Conv1D: one generic layer per kind, driven by a per-operand config.

Each operand (``data_in``, ``weight``, ``bias``, ``data_out``) is fake-quantized with its own number
format (see :mod:`mase_lite.layers.quant_config` for the config forms); gradients are straight-through,
so the same module serves post-training quantization (evaluate) and quantization-aware training
(train it). ``from_float`` keeps the original module's Parameter objects (no copy), device and dtype.

Example::

    config = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4,
              "weight_width": 8, "weight_frac_width": 4}
    qlinear = QuantizedLinear.from_float(linear, config)
    y = qlinear(x)                     # = F.linear(q_in(x), q_w(linear.weight), linear.bias)
    layer = quantize_module(conv, {"weight": {"name": "minifloat_ieee", "width": 8, "exponent_width": 4}})
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils import parametrize

from mase_lite.layers.quant_config import LAYER_OPERANDS, OperandFormat, QuantConfig, QuantConfigError, parse_quant_config
from mase_lite.layers.quant_op import fake_quantize, format_key
from mase_lite.numerics import residual_level_means, residual_sign
from mase_lite.numerics.codes import Encoded, decode, encode

RESIDUAL_SIGN = "binary_residual_sign"


class OperandQuantizer(nn.Module):
    """Quantizes one operand. For ``binary_residual_sign`` it owns the learnable ``level_means``.

    Level means start from the tensor's own statistics: the weight's at construction, an
    activation's at the first forward call (``initialized`` records it, and is saved with the model).

    A parameter that already holds its quantized values (loaded from stored codes) is *held*
    (:meth:`hold`): while that tensor is unchanged (same storage, same version: no optimizer step, no
    copy into it), the quantizer passes it through instead of quantizing it again, so the layer computes
    with exactly the stored values (a format whose scale is a float recomputed from the values, as
    asymmetric scaled integers, binary_scaling or a thresholded ternary, could otherwise move them by an
    ulp or more); the gradient is the identity, as the straight-through estimator's. Once the tensor
    changes (training), it is quantized as usual.
    """

    def __init__(self, spec: OperandFormat, init_from: Tensor | None = None,
                 device: torch.device | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.spec = spec
        if spec.format.name == RESIDUAL_SIGN:
            self.level_means = nn.Parameter(torch.zeros(spec.params.levels, device=device, dtype=dtype))
            self.register_buffer("initialized", torch.tensor(False, device=device))
            if init_from is not None:
                self._initialize(init_from)
        else:
            self.level_means = None
        self._key = format_key(spec.as_dict())
        self._held: tuple | None = None  # (identity of the held tensor, the shared values of its codes)
        self._memo: tuple | None = None  # (identity of the tensor, its quantized values) inside quantized_once

    @torch.no_grad()
    def _initialize(self, x: Tensor) -> None:
        self.level_means.copy_(residual_level_means(x.detach().float(), self.spec.params.levels))
        self.initialized.fill_(True)

    def hold(self, value: Tensor, side: Mapping[str, Tensor]) -> None:
        """``value`` holds this format's values already, with ``side`` the shared values of its codes."""
        self._held = (_identity(value), {k: v.detach().clone() for k, v in side.items()})

    def held(self, x: Tensor) -> Mapping[str, Tensor] | None:
        """The shared values of ``x``'s codes when ``x`` is the held tensor, unchanged; else None."""
        if self._held is None or torch.compiler.is_compiling():
            return None
        return self._held[1] if _identity(x) == self._held[0] else None

    def encode(self, x: Tensor) -> Encoded | None:
        """``x`` (a parameter) as the codes of its quantized values; None where the format stores no codes
        for it (no codec, a random draw, values its codes cannot hold)."""
        if self.spec.format.codec is None:
            return None
        side = self.held(x)
        values = x if side is not None else None
        if self.level_means is not None:
            side = {"means": self.level_means.detach().float().clone()}  # a copy: the file holds each tensor once
            values = self(x).detach()
        return encode(x.detach(), self.spec.as_dict(), side, values)

    def forward(self, x: Tensor) -> Tensor:
        if self._held is not None and self.held(x) is not None:
            return x
        if self._memo is not None and not torch.is_grad_enabled():
            identity = _identity(x)
            if identity is not None and self._memo[0] == identity:
                return self._memo[1]
            self._memo = (identity, y := self._quantize(x))
            return y
        return self._quantize(x)

    def _quantize(self, x: Tensor) -> Tensor:
        if self.level_means is None:  # one opaque operator: export and compile see no quantizer internals
            return fake_quantize(x, self._key, self.spec.ste)
        if not bool(self.initialized):
            self._initialize(x)
        return residual_sign(x, self.level_means, self.spec.ste)

    def extra_repr(self) -> str:
        fmt = self.spec.as_dict()
        params = ", ".join(f"{k}={v}" for k, v in fmt.items() if k != "name" and v is not None)
        ste = "" if self.spec.ste == "identity" else f", ste={self.spec.ste}"
        return f"{fmt['name']}({params}){ste}"


def _identity(x: Tensor) -> tuple | None:
    """What makes ``x`` the same tensor with the same values: storage, version, layout; None for a traced one."""
    try:
        return x.data_ptr(), x._version, tuple(x.shape), x.stride(), x.dtype, x.device
    except RuntimeError:  # a fake or functional tensor (export, tracing) has no storage to compare
        return None


@contextmanager
def quantized_once(module: nn.Module) -> Iterator[None]:
    """Within it, each weight and bias quantizer of ``module`` quantizes an unchanged tensor once (without
    gradients): a calibration loop over many batches pays one quantization per weight. The remembered
    values are dropped on leaving (they are as large as the weights).

    >>> layer = quantize_module(nn.Linear(4, 2), {"weight": {"name": "mxint", "element_width": 4}})
    >>> with torch.no_grad(), quantized_once(layer):
    ...     first = layer.weight_quantizer(layer.weight)
    ...     first is layer.weight_quantizer(layer.weight)
    True
    """
    quantizers = [m for name, m in module.named_modules()
                  if isinstance(m, OperandQuantizer) and name.rsplit(".", 1)[-1] in ("weight_quantizer", "bias_quantizer")]
    for quantizer in quantizers:
        quantizer._memo = (None, None)
    try:
        yield
    finally:
        for quantizer in quantizers:
            quantizer._memo = None


class QuantizedLayer:
    """Mixin of the quantized layers: one optional quantizer per operand, named ``<operand>_quantizer``."""

    weight: nn.Parameter
    bias: nn.Parameter | None

    def _set_quantizers(self, config: QuantConfig) -> None:
        self.quant_config = config
        for operand in LAYER_OPERANDS:
            spec = config.get(operand)
            if operand == "bias" and self.bias is None:
                spec = None
            quantizer = None
            if spec is not None:
                init_from = self.weight if operand == "weight" else None
                quantizer = OperandQuantizer(spec, init_from, device=self.weight.device, dtype=self.weight.dtype)
            setattr(self, f"{operand}_quantizer", quantizer)

    def _adopt(self, source: nn.Module) -> None:
        """Take over ``source``'s parameters, buffers, parametrisations (pruning masks) and mode."""
        for name, param in source._parameters.items():
            self._parameters[name] = param
        for name, buf in source._buffers.items():
            self._buffers[name] = buf
        if parametrize.is_parametrized(source):
            for name, chain in source.parametrizations.items():
                self._parameters[name] = chain.original
                for parametrization in chain:
                    parametrize.register_parametrization(self, name, parametrization, unsafe=True)
        self.train(source.training)

    def _operand(self, operand: str, x: Tensor | None) -> Tensor | None:
        quantizer = getattr(self, f"{operand}_quantizer")
        return x if quantizer is None or x is None else quantizer(x)

    def _stored_view(self, operand: str, x: Tensor) -> Tensor:
        """The parameter as its quantizer sees it (transformers' ``Conv1D`` stores its weight transposed)."""
        return x

    def encode_parameters(self) -> dict[str, Encoded]:
        """``{operand: codes}`` of the quantized weight and bias that store as codes (plain parameters: a
        pruning parametrisation's weight is computed, and stays float)."""
        stored = {}
        for operand in ("weight", "bias"):
            quantizer, param = getattr(self, f"{operand}_quantizer", None), self._parameters.get(operand)
            if quantizer is not None and param is not None:
                encoded = quantizer.encode(self._stored_view(operand, param))
                if encoded is not None:
                    stored[operand] = encoded
        return stored

    @torch.no_grad()
    def restore_parameter(self, operand: str, encoded: Encoded, values: torch.Tensor | None = None) -> None:
        """Write the values ``encoded`` stores into the parameter and hold them (see :class:`OperandQuantizer`);
        ``values``: those values already decoded (as :func:`~mase_lite.numerics.codes.encode` checked them)."""
        quantizer, param = getattr(self, f"{operand}_quantizer", None), self._parameters.get(operand)
        if quantizer is None or param is None:
            raise QuantConfigError(f"{type(self).__name__} has no quantized parameter {operand!r} to restore")
        view = self._stored_view(operand, param)
        if tuple(view.shape) != encoded.shape or view.dtype != encoded.dtype:
            raise QuantConfigError(f"stored codes of {operand} are {list(encoded.shape)} {encoded.dtype}, the layer's "
                                   f"{operand} is {list(view.shape)} {view.dtype}")
        view.copy_(decode(encoded) if values is None else values)
        quantizer.hold(self._stored_view(operand, param), encoded.side)

    def quant_formats(self) -> dict[str, dict[str, Any]]:
        """``{operand: format dict}`` of the operands this layer quantizes."""
        return {
            operand: getattr(self, f"{operand}_quantizer").spec.as_dict()
            for operand in LAYER_OPERANDS
            if getattr(self, f"{operand}_quantizer") is not None
        }


def _config(config: Mapping[str, Any] | QuantConfig) -> QuantConfig:
    parsed = parse_quant_config(config, LAYER_OPERANDS)
    if parsed is None:
        raise QuantConfigError("this config quantizes nothing ({'name': null}); keep the float module instead", location=("config",))
    if parsed.storage != "fake":
        raise QuantConfigError(f"{parsed.storage!r} makes a packed module; use quantize_module", location=("config", "storage"))
    return parsed


class QuantizedLinear(QuantizedLayer, nn.Linear):
    """``F.linear`` on quantized input, weight and bias, with a quantized output."""

    mase_op = "linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 config: Mapping[str, Any] | QuantConfig):
        nn.Linear.__init__(self, in_features, out_features, bias, device=device, dtype=dtype)
        self._set_quantizers(_config(config))

    @classmethod
    def from_float(cls, linear: nn.Linear, config: Mapping[str, Any] | QuantConfig) -> "QuantizedLinear":
        """A quantized Linear sharing ``linear``'s weight and bias."""
        parsed = _config(config)
        layer = cls.__new__(cls)
        nn.Linear.__init__(layer, linear.in_features, linear.out_features, linear.bias is not None,
                           device="meta", dtype=linear.weight.dtype)
        layer._adopt(linear)
        layer._set_quantizers(parsed)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self._operand("weight", self.weight), self._operand("bias", self.bias)
        y = F.linear(self._operand("data_in", x), weight, bias)
        return self._operand("data_out", y)


class _QuantizedConv(QuantizedLayer):
    """Shared ``from_float`` and ``forward`` of the quantized convolutions."""

    float_class: type[nn.Module]

    @classmethod
    def from_float(cls, conv: nn.Module, config: Mapping[str, Any] | QuantConfig):
        """A quantized convolution sharing ``conv``'s weight and bias, with its geometry."""
        parsed = _config(config)
        layer = cls.__new__(cls)
        cls.float_class.__init__(
            layer, conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
            padding=conv.padding, dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
            padding_mode=conv.padding_mode, device="meta", dtype=conv.weight.dtype,
        )
        layer._adopt(conv)
        layer._set_quantizers(parsed)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        weight = self._operand("weight", self.weight)
        y = self._conv_forward(self._operand("data_in", x), weight, self._operand("bias", self.bias))
        return self._operand("data_out", y)


class QuantizedConv1d(_QuantizedConv, nn.Conv1d):
    """``Conv1d`` on quantized input, weight and bias, with a quantized output."""

    mase_op = "conv1d"
    float_class = nn.Conv1d

    def __init__(self, *args, config: Mapping[str, Any] | QuantConfig, **kwargs):
        nn.Conv1d.__init__(self, *args, **kwargs)
        self._set_quantizers(_config(config))


class QuantizedConv2d(_QuantizedConv, nn.Conv2d):
    """``Conv2d`` on quantized input, weight and bias, with a quantized output."""

    mase_op = "conv2d"
    float_class = nn.Conv2d

    def __init__(self, *args, config: Mapping[str, Any] | QuantConfig, **kwargs):
        nn.Conv2d.__init__(self, *args, **kwargs)
        self._set_quantizers(_config(config))


class QuantizedHFConv1D(QuantizedLayer, nn.Module):
    """transformers' ``Conv1D`` (GPT-2's Linear with a transposed ``[in, out]`` weight), quantized like a
    Linear: the weight's formats see it as ``[out, in]``, so blocks, groups and rows run along the inputs."""

    mase_op = "hf_conv1d"

    @classmethod
    def from_float(cls, conv: nn.Module, config: Mapping[str, Any] | QuantConfig) -> "QuantizedHFConv1D":
        """A quantized ``Conv1D`` sharing ``conv``'s weight and bias."""
        parsed = _config(config)
        layer = cls()
        layer.nf, layer.nx = conv.nf, conv.nx
        layer._adopt(conv)
        layer._set_quantizers(parsed)
        return layer

    def _operand(self, operand: str, x: Tensor | None) -> Tensor | None:
        if operand == "weight" and x is not None and self.weight_quantizer is not None:
            return self.weight_quantizer(x.t()).t()
        return super()._operand(operand, x)

    def _stored_view(self, operand: str, x: Tensor) -> Tensor:
        return x.t() if operand == "weight" else x

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self._operand("weight", self.weight), self._operand("bias", self.bias)
        x = self._operand("data_in", x)
        y = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], self.nf)
        return self._operand("data_out", y)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}"


QUANTIZED_LAYERS: tuple[tuple[type[nn.Module], type[nn.Module]], ...] = (
    (nn.Linear, QuantizedLinear),
    (nn.Conv1d, QuantizedConv1d),
    (nn.Conv2d, QuantizedConv2d),
)


def is_quantizable_layer(module: nn.Module) -> bool:
    """Whether ``module`` has a quantized version: Linear, Conv1d, Conv2d, or transformers' ``Conv1D``."""
    return isinstance(module, tuple(cls for cls, _ in QUANTIZED_LAYERS)) or _is_hf_conv1d(module)


def _is_hf_conv1d(module: nn.Module) -> bool:
    return any(c.__name__ == "Conv1D" and c.__module__.startswith("transformers") for c in type(module).__mro__)


def quantized_like(layer: nn.Module, new: nn.Module) -> nn.Module:
    """``new`` fake-quantized with ``layer``'s config when ``layer`` is a quantized layer, else ``new`` itself."""
    return quantize_module(new, layer.quant_config) if isinstance(layer, QuantizedLayer) else new


def packed_class(fmt: dict[str, Any]) -> type[nn.Module]:
    """The packed Linear that holds a weight of ``fmt`` (``storage: packed``): the layer of its format's ``packed``
    mapping (4-bit codes, a K-quant, GGUF's Q8_0), else MXINT8's."""
    from mase_lite.kernels.kquants import KQuantLinear
    from mase_lite.kernels.mxint8 import MXInt8Linear
    from mase_lite.kernels.packed4 import Packed4Linear
    from mase_lite.kernels.packed4.module import packed_kind
    from mase_lite.kernels.q8_0 import Q8_0Linear

    kind = packed_kind(fmt)
    return {"packed4": Packed4Linear, "kquant": KQuantLinear, "packed8": Q8_0Linear}.get(kind, MXInt8Linear)


def quantize_module(module: nn.Module, config: Mapping[str, Any] | QuantConfig) -> nn.Module:
    """The quantized replacement of a Linear, Conv1d or Conv2d (a packed MXINT8 or 4-bit Linear for ``storage: packed``).

    Fake-quantized layers share the module's parameters; the packed layer holds int8 codes and scales.
    """
    parsed = parse_quant_config(config, LAYER_OPERANDS)
    if parsed is None:
        raise QuantConfigError("this config quantizes nothing ({'name': null})", location=("config",))
    if parsed.storage == "packed":
        if not isinstance(module, nn.Linear):
            raise QuantConfigError(f"storage 'packed' is available for Linear only, not {type(module).__name__}")
        from mase_lite.kernels.mxint8 import MXInt8Linear

        weight = parsed.get("weight")
        fmt = weight.format.as_dict(weight.params)
        layer = packed_class(fmt)
        if layer is not MXInt8Linear:  # a 4-bit weight, a K-quant or Q8_0: packed from its codes
            return layer.from_quantized(QuantizedLinear.from_float(
                module, parse_quant_config({"weight": fmt}, LAYER_OPERANDS)), activations=parsed.activations)
        return layer.from_linear(module, block_size=weight.params.block_size, scale_rule=weight.params.scale_rule,
                                 activations=parsed.activations)
    for float_cls, quantized_cls in QUANTIZED_LAYERS:
        if isinstance(module, float_cls):
            return quantized_cls.from_float(module, parsed)
    if _is_hf_conv1d(module):
        return QuantizedHFConv1D.from_float(module, parsed)
    quantizable = ", ".join(cls.__name__ for cls, _ in QUANTIZED_LAYERS) + ", transformers' Conv1D"
    raise QuantConfigError(f"no quantized version of {type(module).__name__}; quantizable modules: {quantizable}")
