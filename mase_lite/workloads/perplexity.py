"""A causal language model's perplexity over a token stream by the protocols papers and llama.cpp report.

- ``sliding`` (transformers' "perplexity of fixed-length models"): windows of ``context`` tokens starting every
  ``stride`` tokens; each window scores the tokens no earlier window scored (its last ``end - previous end``), each
  from the tokens of its window before it. A stride below the context scores every token after the first once, with
  at least ``context - stride`` tokens before it; a stride equal to the context is the plain split into windows (a
  window's first token, which has nothing before it, is not scored).
- ``chunks`` (llama.cpp's ``llama-perplexity``): the stream cut into whole chunks of ``context`` tokens (the rest
  dropped), the first token of each replaced by the beginning-of-text token where ``bos`` is given; in each chunk the
  tokens after position ``context / 2`` are scored (``context / 2 - 1`` a chunk), each from the chunk's tokens before it.

Both return the mean negative log-likelihood per scored token (``loss``, nats, summed in float64), ``perplexity`` =
``exp(loss)`` and ``tokens``, the count scored.

>>> import torch
>>> uniform = lambda ids: torch.zeros(*ids.shape, 10)     # every next token equally likely among 10
>>> round(sliding(uniform, torch.arange(12) % 10, context=4, stride=2)["perplexity"], 6)
10.0
>>> chunks(uniform, torch.arange(12) % 10, context=4)["tokens"]      # 3 chunks, 1 token each
3
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

Logits = Callable[[Tensor], Tensor]
"""The model as a function: token ids ``[rows, length]`` to next-token logits ``[rows, length, vocabulary]``."""


def _scored(logits: Tensor, ids: Tensor, first: int) -> tuple[float, int]:
    """The summed negative log-likelihood of ``ids[:, first + 1:]`` predicted at positions ``first ..`` (float64)."""
    log_probs = torch.log_softmax(logits[:, first:-1].double(), dim=-1)
    targets = ids[:, first + 1:]
    return float(-log_probs.gather(-1, targets.unsqueeze(-1)).sum()), targets.numel()


def _result(nll: float, tokens: int) -> dict:
    loss = nll / tokens
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": tokens}


def sliding(model: Logits, ids: Tensor, context: int, stride: int) -> dict:
    """The sliding-window perplexity of the 1-D ``ids`` (see the module)."""
    if not 1 <= stride <= context or context < 2 or ids.numel() < 2:
        raise ValueError(f"sliding: need 1 <= stride ({stride}) <= context ({context}), context >= 2 and 2 tokens")
    nll, tokens, previous_end = 0.0, 0, 0
    for begin in range(0, ids.numel(), stride):
        end = min(begin + context, ids.numel())
        window = ids[begin:end].unsqueeze(0)
        first = max(previous_end - begin - 1, 0)  # predictions of the tokens this window scores start here
        part, count = _scored(model(window), window, first)
        nll, tokens, previous_end = nll + part, tokens + count, end
        if end == ids.numel():
            break
    return _result(nll, tokens)


def chunks(model: Logits, ids: Tensor, context: int, bos: int | None = None, batch: int = 8) -> dict:
    """llama.cpp's chunked perplexity of the 1-D ``ids`` (see the module); ``batch`` chunks a forward."""
    count = ids.numel() // context
    if context < 4 or context % 2 or count < 1:
        raise ValueError(f"chunks: need an even context of at least 4 ({context}) and one whole chunk "
                         f"({ids.numel()} tokens)")
    rows = ids[: count * context].reshape(count, context).clone()
    if bos is not None:
        rows[:, 0] = bos
    nll, tokens = 0.0, 0
    for start in range(0, count, batch):
        part, scored = _scored(model(rows[start:start + batch]), rows[start:start + batch], context // 2)
        nll, tokens = nll + part, tokens + scored
    return _result(nll, tokens)
