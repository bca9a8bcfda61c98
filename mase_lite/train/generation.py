"""Text generation with a causal LM's key/value cache: greedy or sampled, up to ``max_new_tokens``, stopping at the
end-of-text token or a stop string; timed as prefill (the prompt) and decode (one token at a time).

The model is a transformers causal LM, float, fake-quantized or packed: its own modules run, so every
quantized layer computes as in evaluation. A Llama-family model runs through :class:`mase_lite.nn.decoder.Decoder`
(its layers without transformers' per-token work, a cache of fixed size); any other through its own forward with
transformers' cache (``Generated.runner`` says which: ``native decoder`` where the decoder takes each token in one
native call, its Linears all with int8 activations). Greedy decoding picks the highest logit (the lowest id on a tie),
as transformers' ``generate`` does. Prompts are encoded without special tokens (a causal LM's documents carry none).

Example::

    out = generate(model, tokenizer, ["the cat"], max_new_tokens=8)
    out.completions[0]["text"], out.decode_tokens_per_second
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mase_lite.errors import UserError
from mase_lite.nn.decoder import Decoder


MIN_TEMPERATURE = 1e-6  # a lower temperature samples as this one does: the most likely token (logits / 1e-300 overflow)


@dataclass
class Sampling:
    """How the next token is chosen: ``do_sample`` false is greedy; else softmax(logits / temperature) restricted to
    the ``top_k`` most likely and the smallest set of ``top_p`` probability mass, drawn with a seeded generator."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


@dataclass
class Generated:
    """Completions and their timing."""

    completions: list[dict[str, Any]] = field(default_factory=list)
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0  # new tokens in all
    decode_steps: int = 0  # forward calls after the prefill (a completion's first token comes from its prefill)
    decode_seconds: float = 0.0
    runner: str = "model"

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens per second of the decoding steps; None where no completion took one (one-token completions)."""
        return self.decode_steps / self.decode_seconds if self.decode_steps and self.decode_seconds else None


def next_token(logits: Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The next token from one position's ``logits`` (1-D)."""
    if not sampling.do_sample:
        return int(torch.argmax(logits))
    scores = logits.float() / max(sampling.temperature, MIN_TEMPERATURE)
    if sampling.top_k is not None and sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        mass = torch.softmax(ordered, -1).cumsum(-1)
        drop = mass - torch.softmax(ordered, -1) >= sampling.top_p  # keep the smallest set reaching top_p
        drop[0] = False  # the most likely token stays, whatever top_p (one below float32's range compares as 0)
        scores[order[drop]] = float("-inf")
    return int(torch.multinomial(torch.softmax(scores, -1), 1, generator=generator))


@torch.no_grad()
def generate(model: torch.nn.Module, tokenizer: Any, prompts: list[str], max_new_tokens: int = 32,
             sampling: Sampling | None = None, stop: list[str] | None = None) -> Generated:
    """Each prompt completed by ``model`` (batch 1, the key/value cache kept between tokens)."""
    sampling = sampling or Sampling()
    generator = torch.Generator().manual_seed(sampling.seed)
    device = next(iter(model.parameters()), torch.empty(0)).device
    eos = tokenizer.eos_token_id
    encoded = [tokenizer(p, add_special_tokens=False, return_tensors="pt")["input_ids"].to(device) for p in prompts]
    for i, ids in enumerate(encoded):
        if ids.shape[1] == 0:
            raise UserError(f"the prompt {prompts[i]!r} encodes to no tokens; give text to complete",
                            location=("prompts", i))
    decoder = Decoder.of(model, max((ids.shape[1] for ids in encoded), default=0) + max_new_tokens)
    forward = _decoder_steps(decoder) if decoder is not None else _model_steps(model)
    result = Generated(runner="model" if decoder is None else "decoder" if decoder.step is None else "native decoder")
    was_training = model.training
    model.eval()
    try:
        for prompt, ids in zip(prompts, encoded):
            start = time.perf_counter()
            logits = forward(ids, True)
            result.prefill_seconds += time.perf_counter() - start
            result.prefill_tokens += ids.shape[1]
            new: list[int] = []
            reason = "length"
            start = time.perf_counter()
            for _ in range(max_new_tokens):
                token = next_token(logits, sampling, generator)
                new.append(token)
                if token == eos:
                    reason = "eos"
                    break
                text = tokenizer.decode(new, skip_special_tokens=True)
                if stop and any(s in text for s in stop):
                    reason = "stop"
                    break
                if len(new) == max_new_tokens:
                    break
                logits = forward(torch.tensor([[token]], device=device), False)
            result.decode_seconds += time.perf_counter() - start
            result.decode_tokens += len(new)
            result.decode_steps += len(new) - 1
            text = tokenizer.decode(new, skip_special_tokens=True)
            if reason == "stop":
                text = text[: min(text.find(s) for s in stop if s in text)]
            result.completions.append({"prompt": prompt, "completion": text, "tokens": new, "stopped": reason})
    finally:
        model.train(was_training)
    return result


def _decoder_steps(decoder: Decoder):
    """``(ids, first)``: the next token's logits; a prompt (``first``) starts a new sequence."""
    def forward(ids: Tensor, first: bool) -> Tensor:
        if first:
            decoder.reset()
        return decoder(ids)
    return forward


def _model_steps(model: torch.nn.Module):
    """The same through the model's own forward and transformers' cache."""
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    state: dict = {}

    def forward(ids: Tensor, first: bool) -> Tensor:
        extra = {} if first else {cache_arg: state["cache"]}
        out = model(input_ids=ids, use_cache=True, **extra)
        state["cache"] = getattr(out, "cache", None) or out.past_key_values
        return out.logits[0, -1]
    return forward
