"""What the Linear layers with int8 activations share (packed 4-bit, MXINT8, Q8_0 and the K-quants): the setting, the
inference-only check of an input, one call for layers that take the same input, and the weights as the kernels read
them."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from mase_lite.infra.errors import UserError
from mase_lite.kernels.cpu import level_index
from mase_lite.kernels.int8_activations.cpu_kernel import MAX_LAYERS, TILE_ROWS, tile, untile
from mase_lite.numerics.codes import encode

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


def fused(layers: list[nn.Module], cls: type, run: Callable[[Tensor, bool], list[Tensor] | None]
          ) -> Callable[[Tensor], list[Tensor]] | None:
    """``x -> run(x, tiled)`` for ``layers`` that are all ``cls`` with int8 activations over the same inputs (at most
    :data:`MAX_LAYERS`), ``tiled`` whether their weights are (:class:`TiledWeights`); each layer called in turn where
    ``run`` does not apply (autograd, no kernel, some tiled and some not). None where they are not such layers."""
    if (not 1 <= len(layers) <= MAX_LAYERS or len({getattr(m, "in_features", None) for m in layers}) != 1
            or any(type(m) is not cls or m.activations != "int8" for m in layers)):
        return None

    def forward(x: Tensor) -> list[Tensor]:
        tiled = None if torch.is_grad_enabled() else {m._tile() for m in layers}
        out = run(x, tiled.pop()) if tiled is not None and len(tiled) == 1 else None
        return out if out is not None else [m(x) for m in layers]
    return forward


class Int8Weights(NamedTuple):
    """What the int8 kernels read of a layer: ``data`` (4-bit ``nibbles`` ``[out, in / 2]`` with float32 or float16
    ``scales``, or 8-bit codes ``[out, in]`` with E8M0 ``scales`` (MXINT8) or float16 ones (Q8_0); ``tiled``: both in
    the kernel's tiled order), the bias, and for nibbles the table's 16 integers and the power of two ``unit`` they
    stand for (MXINT8: 2**-6; Q8_0: 1);
    ``kind``: a K-quant's format name (``data``: its records, ``kernels/kquants``, whose scales are inside them:
    ``scales`` is the same tensor, unread), None for nibbles and codes."""

    nibbles: bool
    data: Tensor
    scales: Tensor
    bias: Tensor | None
    itable: Tensor | None
    unit: float
    tiled: bool = False
    kind: str | None = None


class TiledWeights:
    """The weights of a layer with int8 activations held in the kernel's tiled order (:func:`cpu_kernel.tile`: a
    decoding step reads each tile of 8 rows in one stream, and no sum crosses a vector's lanes) from its first int8
    call that the native kernel runs, where its rows make whole tiles; the same tensors, their bytes reordered in
    place. Everything else sees rows: :meth:`rows`, the state dict, a load (which tiles again what was tiled). A
    layer names its tiled buffers and may give its own order (:meth:`_tiled_order`, :meth:`_row_order`)."""

    _tiled_names: tuple[str, ...]  # the buffers tiled: ("nibbles", "scales"), ("codes", "scales"), ...
    _tile_rows = TILE_ROWS
    _tiled = False

    def _tiled_order(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        return tile(*tensors)

    def _row_order(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        return untile(*tensors)

    def _tile(self) -> bool:
        """Tile the weights where the native kernel will run them; whether they are tiled."""
        if self._tiled:
            return True
        buffers = [getattr(self, name) for name in self._tiled_names]
        if (self.activations != "int8" or buffers[0].device.type != "cpu" or buffers[0].shape[0] % self._tile_rows
                or buffers[0].is_meta or level_index() is None):
            return False
        with torch.no_grad():
            for buffer, tiled in zip(buffers, self._tiled_order(*buffers)):
                buffer.copy_(tiled)
        self._tiled = True
        return True

    def _untile(self) -> None:
        if self._tiled:
            with torch.no_grad():
                for name, rows in zip(self._tiled_names, self.rows()):
                    getattr(self, name).copy_(rows)
            self._tiled = False

    def rows(self) -> tuple[Tensor, ...]:
        """The tiled buffers in rows (a copy where they are tiled)."""
        buffers = tuple(getattr(self, name) for name in self._tiled_names)
        return self._row_order(*buffers) if self._tiled else buffers

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._tiled:
            destination.update({prefix + name: rows for name, rows in zip(self._tiled_names, self.rows())})

    def _load_from_state_dict(self, *args, **kwargs):
        was = self._tiled
        self._untile()
        super()._load_from_state_dict(*args, **kwargs)
        if was:  # a decoding step may hold these tensors, tiled
            self._tile()


class FormatLayer:
    """The graph metadata and the repr of a packed Linear whose weight is bytes of its format ``fmt``, its float bias,
    and how it is made from a fake-quantized Linear or a float one where its class gives ``_check`` (a ``UserError``
    where the format, other quantized operands or the inputs do not fit) and ``_from_encoded`` (the layer from the
    weight's stored codes, checked against the fake-quantized weight where one is given)."""

    def _float_bias(self, bias: bool, out_features: int, dtype: torch.dtype) -> None:
        """A float bias parameter of zeros, or none."""
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype))
        else:
            self.register_parameter("bias", None)

    @classmethod
    def check_packable(cls, fmt: dict, in_features: int, activations: str = "float") -> None:
        """A ``UserError`` where this layer cannot hold a weight of ``fmt`` over ``in_features`` inputs."""
        cls._check(fmt, False, in_features)

    @classmethod
    def from_quantized(cls, layer: nn.Module, activations: str = "float") -> nn.Module:
        """Pack a Linear fake-quantized to this layer's format (its weight alone), bit for bit its quantized weight."""
        formats = layer.quant_formats()
        cls._check(formats.get("weight"), set(formats) != {"weight"}, layer.in_features)
        bias = None if layer.bias is None else layer._operand("bias", layer.bias).detach().clone()
        return cls._from_encoded(formats["weight"], layer.encode_parameters()["weight"],
                                 layer._operand("weight", layer.weight).detach(), bias, activations)

    @classmethod
    def _from_float(cls, linear: nn.Linear, fmt: dict, activations: str) -> nn.Module:
        """A float Linear's weight packed in ``fmt``: what :meth:`from_quantized` gives for the Linear fake-quantized
        in ``fmt``."""
        cls._check(fmt, False, linear.in_features)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls._from_encoded(fmt, encode(linear.weight.detach(), fmt), None, bias, activations)

    def _checked(self, expected: Tensor | None, bias: Tensor | None) -> nn.Module:
        """This layer, just made from stored codes, with ``bias``: a ``UserError`` where its weight is not
        ``expected`` bit for bit."""
        if expected is not None and not torch.equal(self.dequantized_weight(), expected.float()):
            raise UserError(f"packing this {self.fmt['name']} weight would change it; it stays fake-quantized")
        if bias is not None:
            self.bias = nn.Parameter(bias)
        return self

    def mase_weight_meta(self) -> dict:
        return {"shape": [self.out_features, self.in_features], "dtype": "uint8", "format": dict(self.fmt),
                "trainable": False}

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.fmt['name']}"
                + (f", activations={self.activations}" if self.activations != "float" else ""))
