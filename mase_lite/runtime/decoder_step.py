"""A Llama-family model's decoding step in one native call (``decoder.c`` of the CPU kernel library) where every
Linear of its layers takes int8 activations (packed MXINT8, 4-bit or K-quant layers with ``activations="int8"``):
norms, projections, rotary embedding, the key/value cache and attention run in one parallel region, the threads
meeting at barriers instead of returning to Python between layers. :class:`mase_lite.runtime.decoder.Decoder` uses it
for one token at a time; a prompt runs through the layers as before. Each projection's outputs are the bits of the
layer's own call; the norms, attention and SiLU are float32 in the kernel's fixed order (the same bits at every thread
count, within float32 rounding of torch's).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor, nn

from mase_lite.kernels.cpu import level_index as _level
from mase_lite.kernels.cpu import library as _library
from mase_lite.kernels.int8_activations.cpu_kernel import KQUANT_KINDS
from mase_lite.kernels.int8_activations.layers import Int8Weights
from mase_lite.numerics.native import threads

_ptr, _i64, _float, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
GROUP_LAYERS = 3
MAX_HEAD_DIM = 512


class _Group(ctypes.Structure):
    _fields_ = [("nibbles", _int), ("half", _int), ("count", _int), ("tiled", _int), ("kinds", _int * GROUP_LAYERS),
                ("itable", _ptr), ("unit", _float), ("k", _i64),
                ("n", _i64 * GROUP_LAYERS), ("q", _ptr * GROUP_LAYERS), ("scales", _ptr * GROUP_LAYERS),
                ("bias", _ptr * GROUP_LAYERS)]


class _Layer(ctypes.Structure):
    _fields_ = [("norm", _ptr * 2), ("eps", _float * 2), ("qkv", _Group), ("o", _Group), ("gate_up", _Group),
                ("down", _Group), ("keys", _ptr), ("values", _ptr)]


class _Model(ctypes.Structure):
    _fields_ = [("layers", _i64), ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64),
                ("inter", _i64), ("max_length", _i64), ("scaling", _float), ("cos", _ptr), ("sin", _ptr),
                ("layer", ctypes.POINTER(_Layer)), ("norm", _ptr), ("eps", _float), ("head", _Group), ("level", _int)]


def _float32(t: Tensor | None) -> bool:
    return t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous())


def _formats(layers: ctypes.Array, head: _Group) -> tuple:
    """The weights' formats as the kernels meet them (each group's nibbles, float16 scales, tiling and K-quant kinds):
    with the sizes, what sets a step's cost, so that steps of other formats are timed apart (a step of Q8_0 weights
    gains less from a second thread than one of Q4_K's)."""
    groups = [g for layer in layers for g in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [head]
    return tuple(sorted({(g.nibbles, g.half, g.tiled, tuple(g.kinds[:g.count])) for g in groups}))


class DecoderStep:
    """Logits (or, with a head the kernel does not run, the normed hidden state) of one token from its embedding,
    its keys and values written into the cache at its position. Holds the tensors it points to: the weights as they
    were when it was made."""

    def __init__(self, model: _Model, layers: ctypes.Array, tensors: list[Tensor], head: bool, out: int) -> None:
        self._model, self._layers, self._tensors = model, layers, tensors
        self.head, self._out = head, out  # out: the size of what a call returns
        lib = _library()
        self._scratch = torch.empty(lib.int8_decoder_scratch(ctypes.byref(model)), dtype=torch.uint8)
        self._key = ("int8_decoder", model.layers, model.hidden, model.inter, out, _formats(layers, model.head))

    @classmethod
    def of(cls, model: nn.Module, keys: Tensor, values: Tensor, cos: Tensor, sin: Tensor,
           scaling: float) -> DecoderStep | None:
        """The step of ``model`` (a Llama-family causal LM as :class:`mase_lite.runtime.decoder.Decoder` checks it, no
        hooks on its Linears) over ``keys``/``values`` (``[layers, kv_heads, max_length, head_dim]``) and the rotary
        tables ``cos``/``sin`` (``[max_length, head_dim]``, sin signed), or None where it does not apply: a layer
        without int8 activations, layers sharing an input of different kinds or tables, non-float32 norms, caches
        or biases, no compiled kernel."""
        if _library() is None or not all(_float32(t) for t in (keys, values, cos, sin)):
            return None
        config, body = model.config, model.model
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = keys.shape[-1]
        if head_dim > MAX_HEAD_DIM or head_dim % 2 or heads % kv_heads:
            return None
        hidden = config.hidden_size
        tensors: list[Tensor] = [keys, values, cos, sin]
        layers = (_Layer * len(body.layers))()
        for target, layer in zip(layers, body.layers):
            attn, mlp = layer.self_attn, layer.mlp
            groups = [_group([attn.q_proj, attn.k_proj, attn.v_proj], tensors), _group([attn.o_proj], tensors),
                      _group([mlp.gate_proj, mlp.up_proj], tensors), _group([mlp.down_proj], tensors)]
            norms = [layer.input_layernorm, layer.post_attention_layernorm]
            if (any(g is None for g in groups) or not all(_float32(n.weight.data) for n in norms)
                    or not _shapes_fit(attn, mlp, hidden, heads * head_dim, kv_heads * head_dim)):
                return None
            target.qkv, target.o, target.gate_up, target.down = groups
            target.norm[:] = [n.weight.data_ptr() for n in norms]
            target.eps[:] = [n.variance_epsilon for n in norms]
            tensors += [n.weight for n in norms]
        for i, target in enumerate(layers):
            target.keys, target.values = keys[i].data_ptr(), values[i].data_ptr()
        head = _group([model.lm_head], tensors)
        if not _float32(body.norm.weight.data) or (head is not None and model.lm_head.in_features != hidden):
            return None
        tensors.append(body.norm.weight)
        inter = max(layer.mlp.gate_proj.out_features for layer in body.layers)
        sizes = dict(layers=len(body.layers), hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     inter=inter, max_length=keys.shape[2])
        described = _Model(**sizes, scaling=scaling, cos=cos.data_ptr(), sin=sin.data_ptr(), layer=layers,
                           norm=body.norm.weight.data_ptr(), eps=body.norm.variance_epsilon,
                           head=head if head is not None else _Group(), level=0)
        out = model.lm_head.out_features if head is not None else hidden
        return cls(described, layers, tensors, head is not None, out)

    def __call__(self, embedded: Tensor, position: int) -> Tensor | None:
        """``[vocab]`` logits (``[hidden]`` normed state where :attr:`head` is False) of the token whose embedding is
        ``embedded`` (``[hidden]`` float32) at ``position``; None where the int8 kernels are set to torch
        (``MASE_LITE_CPU_KERNELS``), for the caller to run the layers itself."""
        lvl = _level()
        if lvl is None:
            return None
        self._model.level = lvl
        lib = _library()
        x = embedded.to(torch.float32).contiguous()
        out = torch.empty(self._out)
        workers, probe = threads.begin(self._key + (lvl,), torch.get_num_threads())
        status = lib.int8_decoder_step(ctypes.byref(self._model), x.data_ptr(), position, out.data_ptr(),
                                       workers if lib.openmp else 1, self._scratch.data_ptr())
        threads.end(probe)
        if status:  # the caller checks the position against its cache
            raise RuntimeError(f"int8_decoder_step refused position {position} of {self._model.max_length}")
        return out


def _shapes_fit(attn: nn.Module, mlp: nn.Module, hidden: int, queries: int, kv: int) -> bool:
    """Whether a layer's Linears have the sizes the step's buffers are laid out for (a pass may have changed them:
    structured pruning narrows an MLP)."""
    sizes = [(m.in_features, m.out_features) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                                       mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
    inter = sizes[4][1]
    return sizes == [(hidden, queries), (hidden, kv), (hidden, kv), (queries, hidden), (hidden, inter),
                     (hidden, inter), (inter, hidden)]


def _group(modules: list[nn.Module], tensors: list[Tensor]) -> _Group | None:
    """The kernel's description of Linears that take the same input, or None where they cannot run in it."""
    weights: list[Int8Weights | None] = [m.int8_weights() if hasattr(m, "int8_weights") else None for m in modules]
    first = weights[0]
    if any(w is None for w in weights) or len({m.in_features for m in modules}) != 1:
        return None
    if any(w.nibbles != first.nibbles or w.unit != first.unit or w.scales.dtype != first.scales.dtype
           or w.tiled != first.tiled or (w.kind is None) != (first.kind is None)
           or (w.nibbles and not torch.equal(w.itable, first.itable)) for w in weights):
        return None
    if not all(w.data.is_contiguous() and w.scales.is_contiguous() and (w.bias is None or _float32(w.bias.data))
               for w in weights):
        return None
    group = _Group(nibbles=int(first.nibbles), half=int(first.scales.dtype == torch.float16), count=len(modules),
                   tiled=int(first.tiled), unit=first.unit, k=modules[0].in_features)
    if first.nibbles:
        group.itable = first.itable.data_ptr()
        tensors.append(first.itable)
    for i, w in enumerate(weights):
        group.n[i], group.q[i], group.scales[i] = w.data.shape[0], w.data.data_ptr(), w.scales.data_ptr()
        group.kinds[i] = 0 if w.kind is None else KQUANT_KINDS[w.kind][0]
        group.bias[i] = None if w.bias is None else w.bias.data_ptr()
        tensors += [w.data, w.scales] + ([] if w.bias is None else [w.bias])
    return group
