"""Text generation with a causal LM's key/value cache: greedy or sampled, up to ``max_new_tokens``, stopping at the
end-of-text token or a stop string; timed as prefill (the prompt) and decode (one token at a time).

The model is a transformers causal LM, float, fake-quantized or packed: its own modules run, so every
quantized layer computes as in evaluation. A Llama-family model runs through :class:`mase_lite.runtime.decoder.Decoder`
(its layers without transformers' per-token work, a cache of fixed size); any other through its own forward with
transformers' cache (``Generated.runner`` says which: ``native decoder`` where the decoder takes each token in one
native call, its Linears all with int8 activations). Greedy decoding picks the highest logit (the lowest id on a tie),
as transformers' ``generate`` does. Prompts are encoded without special tokens (a causal LM's documents carry none),
or with ``chat`` as a user's message in the tokenizer's chat template (:func:`chat_ids`).

A completion ends at an end token (:func:`end_tokens`), at a stop string (:func:`stop_at`: the completion is the
text before it) or after ``max_new_tokens``; its ``tokens`` keep the token that ended it, as transformers' do.

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
from transformers import StoppingCriteria, StoppingCriteriaList

from mase_lite.infra.errors import UserError
from mase_lite.runtime.decoder import Decoder


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


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    """``prompt`` as a user's message in the tokenizer's chat template, the assistant's turn opened
    (``apply_chat_template(..., add_generation_prompt=True)``); a tokenizer without a template is refused."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template (a pretrained model's tokenizer or a GGUF's "
                        "tokenizer.chat_template gives one); leave chat false to complete the prompts as text",
                        location=("chat",))
    try:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))
    except Exception as err:  # the template is the file's code: its own errors (jinja's, its expressions')
        raise UserError(f"the tokenizer's chat template fails on the prompt {prompt!r}: {err}",
                        location=("chat",)) from None


_PROBE = "mase-lite-turn-probe"  # an assistant's message, to find what the template writes after one


def turn_end(tokenizer: Any) -> int | None:
    """The token the chat template writes right after an assistant's message (ChatML's ``<|im_end|>``, Llama 3's
    ``<|eot_id|>``, Gemma's ``<end_of_turn>``) where it is an added token of the tokenizer; else None."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # a template that takes no such conversation names no end of turn
        return None
    after = text.partition(_PROBE)[2].lstrip()
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    return ids[0] if ids and ids[0] in tokenizer.added_tokens_decoder else None


def end_tokens(model: torch.nn.Module, tokenizer: Any, chat: bool = False) -> set[int]:
    """The ids that end a completion: the tokenizer's eos, the model's ``generation_config.eos_token_id`` (an id or
    a list: transformers' ``generate`` stops at them) and, with ``chat``, the template's end of turn
    (:func:`turn_end`)."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [tokenizer.eos_token_id, *(configured if isinstance(configured, list) else [configured])]
    return {i for i in (*ids, turn_end(tokenizer) if chat else None) if i is not None}


def stop_at(text: str, stop: list[str]) -> int | None:
    """Where the completion ``text`` ends by a stop string (it keeps the text before): the first occurrence of one
    after the completion's first non-whitespace character, so a stop string at its start (a first ".") ends nothing
    and the completion goes on to text; None where none occurs."""
    first = len(text) - len(text.lstrip())
    hits = [i for i in (text.find(s, first + 1) for s in stop) if i >= 0]
    return min(hits, default=None)


def encode(tokenizer: Any, prompts: list[str], chat: bool = False, special_tokens: bool = False) -> list[list[int]]:
    """Each prompt's ids: its text (with the tokenizer's special tokens where ``special_tokens``), or with ``chat``
    :func:`chat_ids`; a prompt of no tokens is refused."""
    encoded = [chat_ids(tokenizer, p) if chat else tokenizer(p, add_special_tokens=special_tokens)["input_ids"]
               for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise UserError(f"the prompt {prompts[i]!r} encodes to no tokens; give text to complete",
                            location=("prompts", i))
    return encoded


@torch.no_grad()
def generate(model: torch.nn.Module, tokenizer: Any, prompts: list[str], max_new_tokens: int = 32,
             sampling: Sampling | None = None, stop: list[str] | None = None, chat: bool = False) -> Generated:
    """Each prompt completed by ``model`` (batch 1, the key/value cache kept between tokens)."""
    sampling = sampling or Sampling()
    stop = stop or []
    generator = torch.Generator().manual_seed(sampling.seed)
    device = next(iter(model.parameters()), torch.empty(0)).device
    encoded = [torch.tensor([ids], device=device) for ids in encode(tokenizer, prompts, chat)]
    ends = end_tokens(model, tokenizer, chat)
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
                if token in ends:
                    reason = "eos"
                    break
                if stop and stop_at(tokenizer.decode(new, skip_special_tokens=True), stop) is not None:
                    reason = "stop"
                    break
                if len(new) == max_new_tokens:
                    break
                logits = forward(torch.tensor([[token]], device=device), False)
            result.decode_seconds += time.perf_counter() - start
            result.decode_tokens += len(new)
            result.decode_steps += len(new) - 1
            result.completions.append(_completion(tokenizer, prompt, new, reason, stop))
    finally:
        model.train(was_training)
    return result


@torch.no_grad()
def generate_seq2seq(model: torch.nn.Module, tokenizer: Any, prompts: list[str], max_new_tokens: int = 32,
                     sampling: Sampling | None = None, stop: list[str] | None = None,
                     chat: bool = False) -> Generated:
    """An encoder-decoder's completions by transformers' own ``generate`` (its cache), timed as a whole; the same
    end tokens and stop strings as :func:`generate`. Prompts are encoded with the tokenizer's special tokens."""
    sampling = sampling or Sampling()
    stop = stop or []
    ends = sorted(end_tokens(model, tokenizer, chat))
    result = Generated(runner="transformers generate")
    torch.manual_seed(sampling.seed)
    for prompt, ids in zip(prompts, encode(tokenizer, prompts, chat, special_tokens=True)):
        start = time.perf_counter()
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=max_new_tokens,
                             do_sample=sampling.do_sample, temperature=max(sampling.temperature, MIN_TEMPERATURE),
                             top_k=sampling.top_k, top_p=sampling.top_p, eos_token_id=ends or None,
                             stopping_criteria=StoppingCriteriaList([_StopStrings(tokenizer, stop)] if stop else []))
        result.decode_seconds += time.perf_counter() - start
        new = out[0].tolist()[1:]  # after the decoder's start token
        result.decode_tokens += len(new)
        result.decode_steps += len(new)  # each new token is one step of the decoder
        text = tokenizer.decode(new, skip_special_tokens=True)
        reason = "stop" if stop_at(text, stop) is not None else "eos" if new and new[-1] in ends else "length"
        result.completions.append(_completion(tokenizer, prompt, new, reason, stop))
    return result


class _StopStrings(StoppingCriteria):
    """transformers' stopping criterion of :func:`stop_at` on the decoder's new tokens (after its start token)."""

    def __init__(self, tokenizer: Any, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs) -> Tensor:
        done = [stop_at(self.tokenizer.decode(row[1:], skip_special_tokens=True), self.stop) is not None
                for row in input_ids.tolist()]
        return torch.tensor(done, device=input_ids.device)


def _completion(tokenizer: Any, prompt: str, new: list[int], reason: str, stop: list[str]) -> dict[str, Any]:
    """A completion's record: its text (cut at the stop string that ended it), its tokens and why it ended."""
    text = tokenizer.decode(new, skip_special_tokens=True)
    if reason == "stop":
        text = text[: stop_at(text, stop)]
    return {"prompt": prompt, "completion": text, "tokens": new, "stopped": reason}


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
