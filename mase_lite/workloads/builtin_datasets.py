"""The datasets mase_lite ships, registered like a plug-in's: each task's synthetic set and the local formats.

* ``synthetic-sentiment`` (sequence-classification): movie-review sentences, 4000 train / 1000 test;
* ``synthetic-grammar`` (causal-lm): text from a probabilistic grammar of known entropy, 2000 / 200 windows;
* ``synthetic-reversal`` (seq2seq-lm): a grammar clause and its words reversed, 4000 / 500 pairs;
* ``synthetic-shapes`` (image-classification): ten classes of drawn shapes and textures, 5000 / 1000 images;
* ``json``, ``csv``, ``txt`` (text tasks) and ``image-folder``, ``npz`` (images), read from ``data.path``.
"""

from __future__ import annotations

import random
from pathlib import Path

from mase_lite.infra.limits import check_fits
from mase_lite.workloads.datasets import RawData, register_dataset
from mase_lite.workloads.grammar import default_grammar
from mase_lite.workloads.images import image_folder_tables, npz_tables
from mase_lite.workloads.shapes import CLASSES, draw_shapes
from mase_lite.workloads.sources import local_tables, synthetic_splits

SIZES = {
    "synthetic-sentiment": (4000, 1000),
    "synthetic-grammar": (2000, 200),
    "synthetic-reversal": (4000, 500),
    "synthetic-shapes": (5000, 1000),
}
MAX_CLAUSE_WORDS = 12
_BYTES_PER_TEXT = 400  # a generated sentence, its label and list slots, as Python objects
_BYTES_PER_WORD = 150  # a sampled word in the list, the joined text, and its token in the tokenizer's encodings
TEXT_TASKS = ("sequence-classification", "causal-lm", "seq2seq-lm")


def _sizes(spec, name: str, row_bytes: int, what: str) -> tuple[int, int]:
    """``(n_train, n_test)`` after checking that generating them fits in memory."""
    train, test = SIZES[name]
    n_train, n_test = spec.n_train or train, spec.n_test or test
    rows = n_train + n_test
    check_fits("data.n_train + data.n_test", rows * row_bytes, f"{rows} synthetic {what}")
    return n_train, n_test


def sentiment(spec, seed: int) -> RawData:
    n_train, n_test = _sizes(spec, "synthetic-sentiment", _BYTES_PER_TEXT, "rows")
    train, test = synthetic_splits(n_train, n_test, seed)
    return RawData({s: {"text": part.texts, "label": part.labels} for s, part in (("train", train), ("test", test))})


def grammar_corpus(spec, seed: int) -> RawData:
    """One document per split, exactly long enough for its windows (every grammar word is one token)."""
    grammar = default_grammar(seed)
    block, stride = spec.resolved_block_size(), spec.resolved_stride()
    rng = random.Random(seed)
    splits = {}
    for split, n in zip(("train", "test"), _sizes(spec, "synthetic-grammar", block * _BYTES_PER_WORD, f"windows of {block} tokens")):
        splits[split] = {"text": [" ".join(grammar.sample(block + (n - 1) * stride, rng))]}
    return RawData(splits, reference=grammar, lexicon=tuple(grammar.lexicon))


def _clauses(grammar, n: int, rng: random.Random) -> list[list[str]]:
    """``n`` clauses of at most ``MAX_CLAUSE_WORDS`` words: the grammar's text cut at periods and conjunctions."""
    clauses, current = [], []
    while len(clauses) < n:
        for word in grammar.sample(4096, rng):
            if word in (".", "and", "but"):
                if 2 <= len(current) <= MAX_CLAUSE_WORDS and len(clauses) < n:
                    clauses.append(current)
                current = []
            else:
                current.append(word)
    return clauses


def reversal(spec, seed: int) -> RawData:
    grammar = default_grammar(seed)
    rng = random.Random(seed)
    splits = {}
    for split, n in zip(("train", "test"), _sizes(spec, "synthetic-reversal", 2 * _BYTES_PER_TEXT, "pairs")):
        clauses = _clauses(grammar, n, rng)
        splits[split] = {"source": [" ".join(c) + " ." for c in clauses],
                         "target": [" ".join(reversed(c)) + " ." for c in clauses]}
    return RawData(splits, lexicon=tuple(grammar.lexicon))


def shapes(spec, seed: int) -> RawData:
    size = spec.image_size or 32
    n_train, n_test = _sizes(spec, "synthetic-shapes", 30 * 4 * size * size, f"images of {size}x{size}")
    images, labels = draw_shapes(n_train + n_test, size=size, seed=seed)
    splits = {"train": {"image": list(images[:n_train]), "label": labels[:n_train].tolist()},
              "test": {"image": list(images[n_train:]), "label": labels[n_train:].tolist()}}
    return RawData(splits, classes=CLASSES)


def _local(fmt: str):
    def load(spec, seed: int) -> RawData:
        tables = local_tables(fmt, Path(spec.path), spec.train_split, spec.test_split)
        return RawData({s: rows for s, (_, rows) in tables.items()}, sources={s: src for s, (src, _) in tables.items()})

    load.__name__ = f"read_{fmt}"
    return load


def image_folder(spec, seed: int) -> RawData:
    tables, classes = image_folder_tables(Path(spec.path), spec.train_split, spec.test_split)
    return RawData({s: t for s, (_, t) in tables.items()}, classes=classes, sources={s: src for s, (src, _) in tables.items()})


def npz(spec, seed: int) -> RawData:
    tables = npz_tables(Path(spec.path))
    return RawData({s: t for s, (_, t) in tables.items()}, sources={s: src for s, (src, _) in tables.items()})


register_dataset("synthetic-sentiment", sentiment, ("sequence-classification",), description="labelled review sentences")
register_dataset("synthetic-grammar", grammar_corpus, ("causal-lm",), description="text of known entropy per token")
register_dataset("synthetic-reversal", reversal, ("seq2seq-lm",), description="clauses and their words reversed")
register_dataset("synthetic-shapes", shapes, ("image-classification",), description="drawn shapes and textures")
for _fmt in ("json", "csv"):
    register_dataset(_fmt, _local(_fmt), TEXT_TASKS, needs_path=True, description=f"local .{_fmt} files")
register_dataset("txt", _local("txt"), ("causal-lm",), needs_path=True, description="local text files, a row per line")
register_dataset("image-folder", image_folder, ("image-classification",), needs_path=True, description="a folder per class")
register_dataset("npz", npz, ("image-classification",), needs_path=True, description="image and label arrays")
