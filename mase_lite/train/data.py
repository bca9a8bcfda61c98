"""The ``data`` section of a pipeline spec and the tokenized data a run trains and evaluates on.

Example::

    spec = DataSpec()                                   # synthetic sentiment, 4000 train / 1000 test
    data = build_data(spec, seed=0)
    for batch in data.loader("train", batch_size=16, shuffle=True, seed=0):
        out = model(**batch)                            # input_ids, attention_mask, labels
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from mase_lite.errors import UserError
from mase_lite.files import staged_directory, staged_file
from mase_lite.limits import check_fits
from mase_lite.train.hub import hub_cache_dir
from mase_lite.train.sources import TextSplit, read_hub, read_local, synthetic_splits
from mase_lite.train.tokenizer import load_tokenizer, train_wordpiece
from mase_lite.train.validation import validate_section

logger = logging.getLogger(__name__)

Split = Literal["train", "test"]
SYNTHETIC = "synthetic-sentiment"
LOCAL_FORMATS = ("json", "csv")
SYNTHETIC_SIZES = (4000, 1000)
DEFAULT_MAX_LENGTH = {SYNTHETIC: 32}
OTHER_MAX_LENGTH = 128
INPUT_NAMES = ["input_ids", "attention_mask", "labels"]
TOKENIZER_DIR = "tokenizer"
CACHE_DIR = "data_cache"
_BYTES_PER_TEXT = 400  # a generated sentence, its label and list slots, as Python objects
_BYTES_PER_TOKEN = 100  # a token in the tokenizer's encodings (id, mask, offsets, string) and the tensors


class DataSpec(BaseModel):
    """Which labelled texts to use and how to tokenize them.

    ``{"dataset": "synthetic-sentiment"}`` (default), ``{"dataset": "imdb"}`` (any hub dataset), or
    ``{"dataset": "json" | "csv", "path": "file-or-directory"}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(SYNTHETIC, description="'synthetic-sentiment', 'json', 'csv', or a hub dataset name")
    path: str | None = Field(None, description="json/csv: one file (split by test_fraction) or a directory with train/test files")
    config: str | None = Field(None, description="hub dataset configuration name")
    train_split: str = Field("train", description="split (hub) or file stem (directory) to train on")
    test_split: str = Field("test", description="split (hub) or file stem (directory) to evaluate on")
    text_column: str = "text"
    label_column: str = "label"
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of a single file's rows held out for testing")
    n_train: int | None = Field(None, ge=1, description="train rows (synthetic default 4000; others: a seeded subset, default all)")
    n_test: int | None = Field(None, ge=1, description="test rows (synthetic default 1000; others: a seeded subset, default all)")
    max_length: int | None = Field(None, ge=4, description="tokens per row, padded and truncated (default 32 synthetic, 128 otherwise)")
    vocab_size: int = Field(2000, ge=16, description="vocabulary size of a trained tokenizer")
    tokenizer: str | None = Field(None, description="directory (e.g. a checkpoint's) or hub name of a tokenizer to use instead of training one")
    cache_dir: str | None = Field(None, description="hub download cache (default: <run dir>/hf_cache)")
    seed: int | None = Field(None, description="seed for generation, splitting and subsets (default: the pipeline's seed)")

    @model_validator(mode="after")
    def _path_matches_dataset(self) -> "DataSpec":
        if self.dataset in LOCAL_FORMATS and self.path is None:
            raise ValueError(f"dataset {self.dataset!r} needs 'path' (a file or a directory of split files)")
        if self.dataset not in LOCAL_FORMATS and self.path is not None:
            raise ValueError(f"'path' is only for the local datasets {', '.join(LOCAL_FORMATS)}, not {self.dataset!r}")
        if self.dataset != SYNTHETIC and not self.dataset.strip():
            raise ValueError("dataset must be a non-empty name")
        return self

    def resolved_max_length(self) -> int:
        return self.max_length or DEFAULT_MAX_LENGTH.get(self.dataset, OTHER_MAX_LENGTH)


class BatchLoader:
    """Batches of rows as dicts of tensors; shuffled by a seeded ``torch.Generator`` when asked."""

    def __init__(self, tensors: dict[str, torch.Tensor], batch_size: int, shuffle: bool, seed: int):
        if batch_size < 1:
            raise UserError(f"batch_size must be a positive integer, got {batch_size}")
        self.tensors = tensors
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rows = len(next(iter(tensors.values())))

    def _bounds(self) -> list[tuple[int, int]]:
        return [(s, min(s + self.batch_size, self.rows)) for s in range(0, self.rows, self.batch_size)]

    def __len__(self) -> int:
        return len(self._bounds())

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.shuffle:
            order = torch.randperm(self.rows, generator=torch.Generator().manual_seed(self.seed))
        else:
            order = torch.arange(self.rows)
        for start, stop in self._bounds():
            index = order[start:stop]
            yield {name: t[index] for name, t in self.tensors.items()}


def _fingerprint(train: TextSplit, test: TextSplit, tokenizer: PreTrainedTokenizerBase, max_length: int) -> str:
    """A digest of everything the tokenized tensors depend on."""
    digest = hashlib.sha256()
    for split in (train, test):
        digest.update(json.dumps([split.texts, split.labels]).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    described = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    digest.update(described.encode())
    digest.update(f"{type(tokenizer).__name__}:{max_length}".encode())
    return digest.hexdigest()[:20]


def _check_labels(split: TextSplit, name: str, num_labels: int | None) -> None:
    """Every label is a class index: at least 0, and below ``num_labels`` when that is known."""
    for row, label in enumerate(split.labels, start=1):
        if label < 0 or (num_labels is not None and label >= num_labels):
            if num_labels is None:
                raise UserError(f"{name} split, row {row}: label {label} is outside the allowed labels (allowed: 0, 1, ...)")
            raise UserError(
                f"{name} split, row {row}: label {label} is outside num_labels = {num_labels} (allowed: 0..{num_labels - 1})"
            )


class DataModule:
    """Tokenized train and test splits with their tokenizer.

    ``input_names`` are the keys of every batch; ``labels`` is among them so a captured model
    computes its loss in the graph.
    """

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
        self.fingerprint = _fingerprint(train, test, tokenizer, max_length)
        cached = cache_dir / f"{self.fingerprint}.safetensors" if cache_dir else None
        if cached is not None and cached.is_file():
            logger.info("tokenized data from the cache %s", cached)
            flat = load_file(str(cached))
            self.tensors = {s: {n: flat[f"{s}.{n}"] for n in INPUT_NAMES} for s in ("train", "test")}
        else:
            self.tensors = {s: self._tokenize(self.texts[s]) for s in ("train", "test")}

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
    def input_names(self) -> list[str]:
        return list(INPUT_NAMES)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def size(self, split: Split) -> int:
        return len(self.texts[self._check_split(split)])

    def _check_split(self, split: str) -> str:
        if split not in self.tensors:
            raise UserError(f"split must be one of: train, test; got {split!r}")
        return split

    def loader(self, split: Split, batch_size: int, shuffle: bool = False, seed: int = 0) -> BatchLoader:
        """Batches of ``split`` keyed by ``input_names``; the same order for the same ``seed``."""
        return BatchLoader(self.tensors[self._check_split(split)], batch_size, shuffle, seed)

    def example_batch(self, batch_size: int = 2) -> dict[str, torch.Tensor]:
        """The first ``batch_size`` training rows, e.g. to capture a graph."""
        return {name: t[:batch_size] for name, t in self.tensors["train"].items()}

    def with_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> "DataModule":
        """The same rows tokenized by another tokenizer (e.g. the one saved with a checkpoint)."""
        return DataModule(
            self.texts["train"], self.texts["test"], tokenizer, self.max_length, self.num_labels, self.seed
        )

    def save_tokenizer(self, directory: Path) -> Path:
        """Write the tokenizer to ``directory`` whole or not at all."""
        directory = Path(directory)
        with staged_directory(directory) as staging:
            self.tokenizer.save_pretrained(str(staging))
        return directory

    def persist(self, run_dir: Path) -> None:
        """Save what the run derived from its data: the trained tokenizer and the tokenized tensors."""
        run_dir = Path(run_dir)
        if self.trained_tokenizer:
            self.save_tokenizer(run_dir / TOKENIZER_DIR)
        target = run_dir / CACHE_DIR / f"{self.fingerprint}.safetensors"
        if target.is_file():
            return
        flat = {f"{s}.{n}": t.contiguous() for s, named in self.tensors.items() for n, t in named.items()}
        with staged_file(target) as staging:
            save_file(flat, str(staging), metadata={"max_length": str(self.max_length)})


def _subset(split: TextSplit, n: int | None, seed: int) -> TextSplit:
    """A seeded random ``n`` rows of ``split`` in their original order (all rows when ``n`` is None)."""
    if n is None or n >= len(split):
        return split
    return split.take(sorted(random.Random(seed).sample(range(len(split)), n)))


def read_splits(spec: DataSpec, seed: int, run_dir: Path | None = None) -> tuple[TextSplit, TextSplit]:
    """The raw train and test texts that ``spec`` names."""
    if spec.dataset == SYNTHETIC:
        return synthetic_splits(spec.n_train or SYNTHETIC_SIZES[0], spec.n_test or SYNTHETIC_SIZES[1], seed)
    if spec.dataset in LOCAL_FORMATS:
        train, test = read_local(
            spec.dataset, Path(spec.path), spec.text_column, spec.label_column, spec.test_fraction, seed,
            spec.train_split, spec.test_split,
        )
    else:
        cache = hub_cache_dir(spec.cache_dir, run_dir)
        train, test = read_hub(
            spec.dataset, spec.config, spec.text_column, spec.label_column, spec.train_split, spec.test_split, cache
        )
    return _subset(train, spec.n_train, seed), _subset(test, spec.n_test, seed + 1)


def build_data(
    spec: DataSpec | dict | None = None,
    *,
    seed: int = 0,
    run_dir: Path | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    num_labels: int | None = None,
) -> DataModule:
    """Read, check and tokenize the data ``spec`` names; writes nothing (see ``DataModule.persist``).

    The tokenizer is ``tokenizer`` when given (a pretrained model's), else ``spec.tokenizer``,
    else a WordPiece tokenizer trained on the train split.
    """
    spec = validate_section(DataSpec, spec, "data")
    seed = spec.seed if spec.seed is not None else seed
    if spec.dataset == SYNTHETIC:
        rows = (spec.n_train or SYNTHETIC_SIZES[0]) + (spec.n_test or SYNTHETIC_SIZES[1])
        check_fits("data.n_train + data.n_test", rows * _BYTES_PER_TEXT, f"{rows} synthetic rows")
    train, test = read_splits(spec, seed, run_dir)
    rows, length = len(train) + len(test), spec.resolved_max_length()
    check_fits("data.max_length", rows * length * _BYTES_PER_TOKEN, f"{rows} rows of {length} tokens while tokenizing")
    trained = False
    if tokenizer is None and spec.tokenizer is not None:
        tokenizer = load_tokenizer(spec.tokenizer, hub_cache_dir(spec.cache_dir, run_dir))
    if tokenizer is None:
        tokenizer = train_wordpiece(train.texts, spec.vocab_size)
        trained = True
    return DataModule(
        train,
        test,
        tokenizer,
        spec.resolved_max_length(),
        num_labels=num_labels,
        seed=seed,
        trained_tokenizer=trained,
        cache_dir=run_dir / CACHE_DIR if run_dir is not None else None,
    )
