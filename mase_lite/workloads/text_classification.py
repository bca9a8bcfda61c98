"""Labelled texts, tokenized for sequence classification.

Example::

    data = DataModule(train, test, train_wordpiece(train.texts), max_length=32)
    for batch in data.loader("train", batch_size=16, shuffle=True, seed=0):
        out = model(**batch)                            # input_ids, attention_mask, labels
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from mase_lite.infra.errors import UserError
from mase_lite.workloads.sources import TextSplit
from mase_lite.workloads.splits import SplitData, cached_tensors, differing_rows, digest, sample_rows

INPUT_NAMES = ("input_ids", "attention_mask", "labels")


def tokenizer_description(tokenizer: PreTrainedTokenizerBase) -> str:
    """Everything a tokenizer's output depends on, as text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    described = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return f"{type(tokenizer).__name__}:{described}"


def _check_labels(split: TextSplit, name: str, num_labels: int | None) -> None:
    """Every label is a class index: at least 0, and below ``num_labels`` when that is known."""
    for row, label in enumerate(split.labels, start=1):
        if label < 0 or (num_labels is not None and label >= num_labels):
            if num_labels is None:
                raise UserError(f"{name} split, row {row}: label {label} is outside the allowed labels (allowed: 0, 1, ...)")
            raise UserError(
                f"{name} split, row {row}: label {label} is outside num_labels = {num_labels} (allowed: 0..{num_labels - 1})"
            )


class DataModule(SplitData):
    """Tokenized train and test splits of labelled texts with their tokenizer.

    ``input_names`` are the keys of every batch; ``labels`` is among them so a captured model
    computes its loss in the graph.
    """

    task = "sequence-classification"

    def __init__(
        self,
        train: TextSplit,
        test: TextSplit,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        num_labels: int | None = None,
        seed: int = 0,
        trained_tokenizer: bool = False,
        cache_dir: Path | None = None,
    ):
        for split, name in ((train, "train"), (test, "test")):
            if len(split) == 0:
                raise UserError(f"the {name} split has no rows")
            _check_labels(split, name, num_labels)
        self.texts = {"train": train, "test": test}
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.num_labels = num_labels if num_labels is not None else max(2, max(train.labels + test.labels) + 1)
        self.seed = seed
        self.trained_tokenizer = trained_tokenizer
        self.fingerprint = digest(
            json.dumps([[s.texts, s.labels] for s in (train, test)]), tokenizer_description(tokenizer), max_length
        )
        self.tensors = cached_tensors(cache_dir, self.fingerprint, INPUT_NAMES, self._cache_problem) or {
            s: self._tokenize(self.texts[s]) for s in ("train", "test")
        }

    def _cache_problem(self, tensors: dict) -> str | None:
        """What a cached entry gets wrong: the labels (all of them), the shape, or a few rows tokenized again."""
        for name, split in self.texts.items():
            cached = tensors[name]
            if not torch.equal(cached["labels"], torch.tensor(split.labels, dtype=torch.long)):
                return f"its {name} labels are not the data's"
            if tuple(cached["input_ids"].shape) != (len(split), self.max_length):
                return f"its {name} input_ids have shape {list(cached['input_ids'].shape)}"
            rows = sample_rows(len(split))
            fresh = self._tokenize(TextSplit([split.texts[i] for i in rows], [split.labels[i] for i in rows]))
            problem = differing_rows(cached, fresh, rows)
            if problem:
                return f"{name}: {problem}"
        return None

    def _tokenize(self, split: TextSplit) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            split.texts, padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "labels": torch.tensor(split.labels, dtype=torch.long),
        }

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def sequence_length(self) -> int:
        return self.max_length

    def size(self, split) -> int:
        return len(self.texts[self._check_split(split)])

    def with_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> "DataModule":
        """The same rows tokenized by another tokenizer (e.g. the one saved with a checkpoint)."""
        return DataModule(
            self.texts["train"], self.texts["test"], tokenizer, self.max_length, self.num_labels, self.seed
        )
