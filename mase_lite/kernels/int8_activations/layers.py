"""What the Linear layers with int8 activations share (packed 4-bit and MXINT8): the setting, the inference-only
check of an input, one call for layers that take the same input, and the weights as the kernels read them."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from mase_lite.infra.errors import UserError
from mase_lite.kernels.int8_activations.cpu_kernel import MAX_LAYERS

ACTIVATIONS = ("float", "int8")


def check_activations(layer: str, activations: str) -> None:
    """A ``UserError`` naming the setting where ``activations`` is not one of :data:`ACTIVATIONS`."""
    if activations not in ACTIVATIONS:
        raise UserError(f"{layer} activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")


def check_input(x: Tensor, in_features: int, bias: Tensor | None, what: str, layer: str) -> None:
    """A ``UserError`` where ``x`` does not fit ``in_features`` inputs (named ``what``), or where autograd would
    need a gradient through the rounding of ``layer`` (an inference-only layer)."""
    if x.shape[-1] != in_features or not x.dtype.is_floating_point:
        raise UserError(f"{what} input of shape {tuple(x.shape)} and dtype {x.dtype} does not fit a weight "
                        f"with in_features={in_features}")
    if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
        raise UserError(f"{layer} with int8 activations runs inference only (its rounding has no gradient); "
                        "use activations='float' to train through it")


def fused(layers: list[nn.Module], cls: type, run: Callable[[Tensor], list[Tensor] | None]
          ) -> Callable[[Tensor], list[Tensor]] | None:
    """``x -> run(x)`` for ``layers`` that are all ``cls`` with int8 activations over the same inputs (at most
    :data:`MAX_LAYERS`); each layer called in turn where ``run`` does not apply (autograd, no kernel). None where
    they are not such layers."""
    if (not 1 <= len(layers) <= MAX_LAYERS or len({getattr(m, "in_features", None) for m in layers}) != 1
            or any(type(m) is not cls or m.activations != "int8" for m in layers)):
        return None

    def forward(x: Tensor) -> list[Tensor]:
        out = None if torch.is_grad_enabled() else run(x)
        return out if out is not None else [m(x) for m in layers]
    return forward


class Int8Weights(NamedTuple):
    """What the int8 kernels read of a layer: ``data`` (4-bit ``nibbles`` ``[out, in / 2]`` with float32 or float16
    ``scales``, or MXINT8 codes ``[out, in]`` with E8M0 ``scales``), the bias, and for nibbles the table's 16
    integers and the power of two ``unit`` they stand for (MXINT8: 2**-6)."""

    nibbles: bool
    data: Tensor
    scales: Tensor
    bias: Tensor | None
    itable: Tensor | None
    unit: float
