"""A Llama-family causal LM's forward for generation, without transformers' per-module work: the model's own
layers (float, fake-quantized or packed) called directly, a key/value cache of fixed size written in place, the
rotary tables computed once, and grouped-query attention by
``scaled_dot_product_attention``. Per token, transformers spends several milliseconds outside the Linears
(cache objects, masks, rotary embedding, module calls): at batch 1 that is as long as the packed Linears.

It applies to ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and ``MistralForCausalLM`` whose layers are transformers'
own (RMSNorm, rotary attention without query/key norms, a gated SiLU MLP; the Linears and the embedding may be
anything: quantized, packed, with adapters) and whose sliding window, if any, covers the whole context;
where every Linear of its layers takes int8 activations, one token runs in one native call
(:class:`~mase_lite.runtime.decoder_step.DecoderStep`);
:meth:`Decoder.of` returns None for any other model (or one whose attention or MLP a pass replaced), which then runs
as it is.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2, vocab_size=100)).eval()
    >>> decoder = Decoder.of(model, max_length=16)
    >>> ids = torch.tensor([[5, 7, 9]])
    >>> with torch.no_grad():
    ...     ours, theirs = decoder(ids), model(ids).logits[0, -1]
    >>> torch.allclose(ours, theirs, atol=1e-5), decoder(torch.tensor([[3]])).shape, decoder.length
    (True, torch.Size([100]), 4)
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mase_lite.infra.errors import UserError
from mase_lite.runtime.decoder_step import DecoderStep
from mase_lite.numerics.native.threads import spare_threads

MODEL_TYPES = ("llama", "qwen2", "mistral")
QUERY_RUN = 64  # a prompt's positions attended at a time


def _call(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """The module's forward, without ``nn.Module.__call__``'s work where no hook would run."""
    hooked = (module._forward_hooks or module._forward_pre_hooks or nn.modules.module._global_forward_hooks
              or nn.modules.module._global_forward_pre_hooks)
    return module if hooked else module.forward


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """As transformers' RMSNorm computes it: in float32, then back to ``x``'s dtype before the weight (float32:
    torch's fused ``rms_norm``, the same bits)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


def _fused(modules: list[nn.Module]) -> Callable[[Tensor], list[Tensor]]:
    """One call for modules that take the same input: the layers' own ``fused`` where their class offers one (and no
    hook would be skipped), else each called in turn."""
    fuse = getattr(type(modules[0]), "fused", None)
    together = fuse(modules) if fuse is not None and all(_call(m) == m.forward for m in modules) else None
    if together is not None:
        return together
    calls = [_call(m) for m in modules]
    return lambda x: [call(x) for call in calls]


class _Layer:
    def __init__(self, layer: nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv, self.o = _fused([attn.q_proj, attn.k_proj, attn.v_proj]), _call(attn.o_proj)
        self.gate_up, self.down = _fused([mlp.gate_proj, mlp.up_proj]), _call(mlp.down_proj)
        self.norms = [(norm.weight, norm.variance_epsilon) for norm in (layer.input_layernorm, layer.post_attention_layernorm)]


class Decoder:
    """Logits of the next token after the ids given so far (``__call__``: a ``[1, n]`` prompt first, then one
    token at a time), with a key/value cache of ``max_length`` positions; :meth:`reset` starts again."""

    def __init__(self, model: nn.Module, max_length: int) -> None:
        config, body = model.config, model.model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = body.layers[0].self_attn.scaling
        self.max_length = max_length
        self.embed, self.head = _call(body.embed_tokens), _call(model.lm_head)
        self.norm = (body.norm.weight, body.norm.variance_epsilon)
        self.layers = [_Layer(layer) for layer in body.layers]
        weight = body.norm.weight
        dummy = torch.zeros(1, 1, self.head_dim, dtype=weight.dtype, device=weight.device)
        cos, sin = body.rotary_emb(dummy, torch.arange(max_length, device=weight.device)[None])
        half = self.head_dim // 2
        sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)]).to(sin)
        self.cos, self.sin = cos[0], sin[0] * sign  # [positions, head_dim]; sin negated where rotate_half negates
        shape = (len(self.layers), self.kv_heads, max_length, self.head_dim)
        self.keys = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.values = torch.zeros_like(self.keys)
        self.length = 0
        linears = [model.lm_head] + [m for layer in body.layers for m in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
            layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
        hooked = any(_call(m) != m.forward for m in linears)
        self.step = None if hooked else DecoderStep.of(model, self.keys, self.values, self.cos, self.sin, self.scaling)

    @classmethod
    def of(cls, model: nn.Module, max_length: int) -> Decoder | None:
        """A decoder for ``model`` where it is of the family this module runs; else None."""
        config = getattr(model, "config", None)
        if getattr(config, "model_type", None) not in MODEL_TYPES or not hasattr(model, "lm_head"):
            return None
        window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
        if window is not None and window < max_length:
            return None
        if getattr(config, "hidden_act", None) not in ("silu", "swish"):
            return None
        body = getattr(model, "model", None)
        try:
            layers = list(body.layers)
            parts = [body.embed_tokens, model.lm_head]  # any module: float, quantized, packed, with adapters
            own = [body, body.norm, body.rotary_emb]  # transformers' own classes: their computation is the one here
            for layer in layers:
                attn, mlp = layer.self_attn, layer.mlp
                parts += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
                own += [layer, attn, mlp, layer.input_layernorm, layer.post_attention_layernorm]
                if any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
                    return None
        except AttributeError:
            return None
        if (not layers or any(not isinstance(p, nn.Module) for p in parts)
                or any(not type(m).__module__.startswith("transformers.models.") for m in own)
                or any(not hasattr(m, "variance_epsilon") for m in own if type(m).__name__.endswith("Norm"))):
            return None
        return cls(model, max_length)

    def reset(self) -> None:
        self.length = 0

    def __call__(self, ids: Tensor) -> Tensor:
        """Logits (``[vocab]``) after the ``[1, n]`` ids, appended to those given since the last reset; on no more
        threads than the cores other processes leave (:func:`~mase_lite.numerics.native.threads.spare_threads`)."""
        n, start = ids.shape[-1], self.length
        if ids.dim() != 2 or ids.shape[0] != 1 or n < 1:
            raise UserError(f"Decoder takes token ids of shape [1, n], got {tuple(ids.shape)}")
        if start + n > self.max_length:
            raise UserError(f"Decoder: {start + n} positions exceed its max_length {self.max_length}")
        with spare_threads():
            return self._forward(ids, n, start)

    def _forward(self, ids: Tensor, n: int, start: int) -> Tensor:
        stop = start + n
        cos, sin = self.cos[start:stop], self.sin[start:stop]
        x = self.embed(ids)[0]  # [n, hidden]
        if n == 1 and self.step is not None and not x.requires_grad:
            out = self.step(x[0], start)
            if out is not None:
                self.length = stop
                return out if self.step.head else self.head(out[None])[0]
        runs = self._runs(start, stop, ids.device)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(_rms_norm(x, *layer.norms[0]))
            q = self._rotate(q.view(n, self.heads, self.head_dim).transpose(0, 1), cos, sin)
            self.keys[i, :, start:stop] = self._rotate(k.view(n, self.kv_heads, self.head_dim).transpose(0, 1), cos, sin)
            self.values[i, :, start:stop] = v.view(n, self.kv_heads, self.head_dim).transpose(0, 1)
            x = x + layer.o(self._attend(q, i, start, runs))
            gate, up = layer.gate_up(_rms_norm(x, *layer.norms[1]))
            x = x + layer.down(F.silu(gate) * up)
        self.length = stop
        return self.head(_rms_norm(x[-1:], *self.norm))[0]

    @staticmethod
    def _runs(start: int, stop: int, device: torch.device) -> list[tuple[int, int, Tensor | None]]:
        """A prompt's runs of ``QUERY_RUN`` positions from ``start``: each one's first and last and the mask by which
        each of its positions sees the keys up to itself (None for a single position)."""
        runs = []
        for first in range(start, stop, QUERY_RUN):
            last = min(first + QUERY_RUN, stop)
            mask = None if last - first == 1 else (
                torch.arange(last, device=device) <= torch.arange(first, last, device=device)[:, None])
            runs.append((first, last, mask))
        return runs

    def _attend(self, q: Tensor, layer: int, start: int, runs: list[tuple[int, int, Tensor | None]]) -> Tensor:
        """Layer ``layer``'s attention of the queries ``q`` (``[heads, n, head_dim]``, positions ``start`` on) over
        the cache, ``[n, heads * head_dim]``: a prompt by its runs (:meth:`_runs`), each over the keys up to its last,
        so the keys past a run, which the causal mask would drop, are never multiplied (a 512-token prompt: 10 ms a
        layer against 14 as one causal call, one thread)."""
        n = q.shape[1]
        out = torch.empty(n, self.heads, self.head_dim, dtype=q.dtype, device=q.device)
        for first, last, mask in runs:
            out[first - start:last - start] = F.scaled_dot_product_attention(
                q[None, :, first - start:last - start], self.keys[layer, None, :, :last],
                self.values[layer, None, :, :last], attn_mask=mask, scale=self.scaling,
                enable_gqa=self.heads != self.kv_heads)[0].transpose(0, 1)
        return out.view(n, -1)

    @staticmethod
    def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``x cos + rotate_half(x) sin``: rotate_half is a roll by half the head with the first half negated,
        the sign folded into ``sin``."""
        return x * cos + x.roll(x.shape[-1] // 2, -1) * sin
