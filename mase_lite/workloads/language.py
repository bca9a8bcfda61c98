"""Text for language models: a token stream cut into windows (causal LM), or source/target pairs (seq2seq).

Windows start every ``stride`` tokens and hold ``block_size`` tokens; a window after the first scores
only the tokens the one before did not (its first ``block_size - stride`` labels are ``-100``), so
every token after the stream's first is predicted exactly once and, with ``stride < block_size``,
with more context. The last window is padded (mask 0, labels -100).

Example::

    >>> w = windows(torch.arange(10), block_size=4, stride=2, pad_id=0)
    >>> w["input_ids"].tolist()
    [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    >>> w["labels"].tolist()
    [[0, 1, 2, 3], [-100, -100, 4, 5], [-100, -100, 6, 7], [-100, -100, 8, 9]]
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from mase_lite.infra.errors import UserError
from mase_lite.workloads.splits import SPLITS, SplitData, cached_tensors, differing_rows, digest, sample_rows
from mase_lite.workloads.tasks import IGNORE
from mase_lite.workloads.text_classification import tokenizer_description

logger = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask", "labels")


def window_count(tokens: int, block_size: int, stride: int) -> int:
    """How many windows cover a stream of ``tokens`` tokens.

    >>> window_count(10, 4, 2), window_count(10, 4, 4), window_count(4, 4, 4), window_count(5, 4, 4)
    (4, 3, 1, 2)
    """
    if tokens <= block_size:
        return 1
    return 1 + math.ceil((tokens - block_size) / stride)


def windows(stream: torch.Tensor, block_size: int, stride: int, pad_id: int, limit: int | None = None) -> dict[str, torch.Tensor]:
    """The windows of a 1-D token stream (the first ``limit`` of them) with their mask and labels."""
    n = window_count(len(stream), block_size, stride)
    if limit is not None:
        n = min(n, limit)
    ids = torch.full((n, block_size), pad_id, dtype=torch.long)
    mask = torch.zeros(n, block_size, dtype=torch.long)
    labels = torch.full((n, block_size), IGNORE, dtype=torch.long)
    for k in range(n):
        part = stream[k * stride : k * stride + block_size]
        ids[k, : len(part)] = part
        mask[k, : len(part)] = 1
        labels[k, : len(part)] = part
        if k > 0:
            labels[k, : block_size - stride] = IGNORE
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def token_stream(tokenizer: PreTrainedTokenizerBase, documents: list[str]) -> torch.Tensor:
    """The documents' tokens (no special tokens) joined by the tokenizer's end-of-text token, if it has one."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for i, encoded in enumerate(tokenizer(documents, add_special_tokens=False)["input_ids"]):
        if i and eos is not None:
            ids.append(eos)
        ids.extend(encoded)
    return torch.tensor(ids, dtype=torch.long)


def _check_texts(texts: list, split: str, field: str) -> None:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"{split} split, row {i + 1}: {field} holds {text!r}, not a string"[:300])


class LanguageModelData(SplitData):
    """Windows of a token stream per split, for causal language models (labels = the inputs)."""

    task = "causal-lm"

    def __init__(
        self,
        documents: dict[str, list[str]],
        tokenizer: PreTrainedTokenizerBase,
        block_size: int,
        stride: int,
        limits: dict[str, int | None] | None = None,
        seed: int = 0,
        trained_tokenizer: bool = False,
        cache_dir: Path | None = None,
        reference: Any = None,
    ):
        for split in SPLITS:
            _check_texts(documents[split], split, "data.text_column")
        self.documents = documents
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.stride = stride
        self.limits = limits or {}
        self.seed = seed
        self.trained_tokenizer = trained_tokenizer
        self.reference = reference
        self._bounds: dict[str, dict[str, float]] = {}
        self.fingerprint = digest(
            "causal-lm", *(d for s in SPLITS for d in [len(documents[s]), *documents[s]]),
            tokenizer_description(tokenizer), block_size, stride, sorted(self.limits.items()),
        )
        self.tensors = cached_tensors(cache_dir, self.fingerprint, INPUT_NAMES, self._cache_problem) or {
            s: self._windows(s) for s in SPLITS}

    def _cache_problem(self, tensors: dict) -> str | None:
        """What a cached entry gets wrong: its windows' shape, labels that are not their tokens, the count past
        the limit, or a first window that is not the first tokens of the documents, tokenized again."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for split in SPLITS:
            cached = tensors[split]
            ids, labels = cached["input_ids"], cached["labels"]
            limit = self.limits.get(split)
            if ids.dim() != 2 or ids.shape[1] != self.block_size or (limit is not None and ids.shape[0] > limit):
                return f"its {split} windows have shape {list(ids.shape)}"
            kept = labels != IGNORE
            if not torch.equal(labels[kept], ids[kept]) or bool(((ids < 0) | (ids >= len(self.tokenizer))).any()):
                return f"its {split} labels or token ids are not a language model's windows"
            count, stream = 1, token_stream(self.tokenizer, self.documents[split][:1])
            while len(stream) < self.block_size and count < len(self.documents[split]):
                count = min(2 * count, len(self.documents[split]))
                stream = token_stream(self.tokenizer, self.documents[split][:count])
            problem = differing_rows(cached, windows(stream, self.block_size, self.stride, pad, 1), [0])
            if problem:
                return f"{split}: {problem}"
        return None

    def _windows(self, split: str) -> dict[str, torch.Tensor]:
        stream = token_stream(self.tokenizer, self.documents[split])
        if len(stream) < 2:
            raise UserError(f"the {split} split has {len(stream)} token(s); a language model needs at least 2")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return windows(stream, self.block_size, self.stride, pad, self.limits.get(split))

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def sequence_length(self) -> int:
        return self.block_size

    def with_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> "LanguageModelData":
        return LanguageModelData(self.documents, tokenizer, self.block_size, self.stride, self.limits, self.seed,
                                 reference=self.reference)

    def reference_metrics(self, split) -> dict[str, float]:
        """``perplexity_bound``: the best reachable perplexity on exactly the windows and tokens scored
        (the data's generator predicting from the same context), and ``perplexity_entropy_rate``: the
        exponential of the generator's entropy per token; when the data came from a known generator
        and the tokenizer keeps each of its words whole."""
        if self.reference is None:
            return {}
        if split not in self._bounds:
            self._bounds[split] = self._reference_bound(split)
        return dict(self._bounds[split])

    def _reference_bound(self, split: str) -> dict[str, float]:
        grammar = self.reference
        ids = {}
        for word in grammar.lexicon:
            if self.tokenizer.tokenize(word) != [word]:
                logger.info("no perplexity bound: the tokenizer splits the corpus's word %r", word)
                return {}
            ids[self.tokenizer.convert_tokens_to_ids(word)] = grammar.word_ids([word])[0]
        table = torch.full((max(self.vocab_size, max(ids) + 1),), -2, dtype=torch.long)
        table[list(ids)] = torch.tensor(list(ids.values()))
        t = self.tensors[split]
        words = torch.where(t["attention_mask"].bool(), table[t["input_ids"]], torch.tensor(-1))
        if (words == -2).any():
            logger.info("no perplexity bound: the %s split holds tokens that are not the corpus's words", split)
            return {}
        scored = t["labels"] != IGNORE
        scored[:, 0] = False  # the first token of a window is never predicted
        total, count = grammar.window_loss(words, scored)
        return {"perplexity_bound": math.exp(total / count), "perplexity_entropy_rate": math.exp(grammar.entropy_rate())}


class Seq2SeqData(SplitData):
    """Source texts (encoder inputs) and target texts (labels, ended by the end-of-text token) per split."""

    task = "seq2seq-lm"

    def __init__(
        self,
        pairs: dict[str, tuple[list[str], list[str]]],
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        max_target_length: int,
        seed: int = 0,
        trained_tokenizer: bool = False,
        cache_dir: Path | None = None,
    ):
        for split in SPLITS:
            sources, targets = pairs[split]
            if not sources:
                raise UserError(f"the {split} split has no rows")
            _check_texts(sources, split, "data.source_column")
            _check_texts(targets, split, "data.target_column")
        self.pairs = pairs
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.max_target_length = max_target_length
        self.seed = seed
        self.trained_tokenizer = trained_tokenizer
        self.fingerprint = digest(
            "seq2seq-lm", *(t for s in SPLITS for part in pairs[s] for t in [len(part), *part]),
            tokenizer_description(tokenizer), max_length, max_target_length,
        )
        self.tensors = cached_tensors(cache_dir, self.fingerprint, INPUT_NAMES, self._cache_problem) or {
            s: self._tokenize(*self.pairs[s]) for s in SPLITS}

    def _cache_problem(self, tensors: dict) -> str | None:
        """What a cached entry gets wrong: its shapes, or a few pairs tokenized again."""
        for split in SPLITS:
            sources, targets = self.pairs[split]
            cached = tensors[split]
            if tuple(cached["labels"].shape) != (len(targets), self.max_target_length):
                return f"its {split} labels have shape {list(cached['labels'].shape)}"
            rows = sample_rows(len(sources))
            problem = differing_rows(cached, self._tokenize([sources[i] for i in rows], [targets[i] for i in rows]), rows)
            if problem:
                return f"{split}: {problem}"
        return None

    def _tokenize(self, sources: list[str], targets: list[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(sources, padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt")
        eos = self.tokenizer.eos_token_id
        room = self.max_target_length - (eos is not None)
        labels = torch.full((len(targets), self.max_target_length), IGNORE, dtype=torch.long)
        for i, ids in enumerate(self.tokenizer(targets, add_special_tokens=False)["input_ids"]):
            ids = ids[:room] + ([eos] if eos is not None else [])
            labels[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def sequence_length(self) -> int:
        return max(self.max_length, self.max_target_length)

    def size(self, split) -> int:
        return len(self.pairs[self._check_split(split)][0])

    def with_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> "Seq2SeqData":
        return Seq2SeqData(self.pairs, tokenizer, self.max_length, self.max_target_length, self.seed)
