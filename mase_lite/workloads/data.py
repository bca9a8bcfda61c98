"""The ``data`` section of a pipeline spec and the data a run trains and evaluates on, for every task.

One section shape serves every task; the fields a task does not use are refused when set:

* sequence-classification: labelled texts (``text_column``, ``label_column``), ``max_length`` tokens;
* causal-lm: a corpus (``text_column``) cut into windows of ``block_size`` tokens every ``stride``;
* seq2seq-lm: ``source_column`` → ``target_column`` pairs, ``max_length``/``max_target_length`` tokens;
* image-classification: images (``image_column``) and labels, resized to ``image_size``.

``dataset`` names a registered dataset (the tasks' synthetic defaults, the local formats ``json``,
``csv``, ``txt``, ``image-folder``, ``npz``, or a plug-in's, see :mod:`mase_lite.data`), else a
dataset of the Hugging Face hub (or a local directory ``datasets`` can read).

Example::

    spec = DataSpec()                                   # the task's synthetic set
    data = build_data(spec, task="causal-lm", seed=0)   # the grammar corpus in windows of 64 tokens
    for batch in data.loader("train", batch_size=16, shuffle=True, seed=0):
        out = model(**batch)                            # input_ids, attention_mask, labels
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers import PreTrainedTokenizerBase

from mase_lite.infra.errors import UserError
from mase_lite.infra.limits import check_fits
from mase_lite.workloads.datasets import RawData, as_raw, columns_of, dataset_names, get_dataset
from mase_lite.workloads.hub import hub_cache_dir
from mase_lite.workloads.image_classification import ImageData
from mase_lite.workloads.images import to_chw
from mase_lite.workloads.language import LanguageModelData, Seq2SeqData
from mase_lite.workloads.loader import BatchLoader
from mase_lite.workloads.sources import TextSplit, divide, hub_tables, rows_to_split
from mase_lite.workloads.splits import CACHE_DIR, SPLITS, TOKENIZER_DIR, Split, SplitData
from mase_lite.workloads.tasks import get_task, task_names
from mase_lite.workloads.text_classification import DataModule
from mase_lite.workloads.tokenizer import load_tokenizer, train_wordpiece
from mase_lite.workloads.validation import validate_section

__all__ = [
    "BatchLoader", "CACHE_DIR", "DataModule", "DataSpec", "ImageData", "LanguageModelData", "Seq2SeqData",
    "Split", "SplitData", "TOKENIZER_DIR", "build_data",
]

DEFAULT_MAX_LENGTH = {"synthetic-sentiment": 32, "synthetic-reversal": 24}
DEFAULT_BLOCK_SIZE = {"synthetic-grammar": 64}
OTHER_LENGTH = 128
DEFAULT_IMAGE_SIZE = 32
# peak memory per token while tokenizing: encodings (ids, mask, offsets, strings), lists, tensors (~300 measured)
_BYTES_PER_TOKEN = 320


class DataSpec(BaseModel):
    """Which data to use and how to shape it for the model's task.

    ``{}`` is the task's synthetic set; ``{"dataset": "csv", "path": "reviews.csv"}``, a local
    file or directory; ``{"dataset": "wikitext", "config": "wikitext-2-raw-v1"}``, a hub dataset.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str | None = Field(
        None, description="a registered dataset (the task's synthetic one by default; json, csv, txt, image-folder, npz "
        "with path; a plug-in's) or a hub dataset name"
    )
    path: str | None = Field(None, description="local datasets: a file, or a directory with train/test files or class folders")
    config: str | None = Field(None, description="hub dataset configuration name")
    train_split: str = Field("train", description="split (hub) or file stem / folder (directory) to train on")
    test_split: str = Field("test", description="split (hub) or file stem / folder (directory) to evaluate on")
    text_column: str = Field("text", description="classification and causal-lm: the text column")
    label_column: str = Field("label", description="classification: the integer label column")
    image_column: str = Field("image", description="image-classification: the image column")
    source_column: str = Field("source", description="seq2seq-lm: the input text column")
    target_column: str = Field("target", description="seq2seq-lm: the output text column")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of a single file's rows held out for testing")
    n_train: int | None = Field(
        None, ge=1, description="train rows (causal-lm: windows); synthetic sets have defaults, others a seeded subset, default all"
    )
    n_test: int | None = Field(None, ge=1, description="test rows (causal-lm: windows), as n_train")
    max_length: int | None = Field(None, ge=4, description="tokens per text, padded and truncated (default 32 synthetic, 128 otherwise)")
    max_target_length: int | None = Field(None, ge=2, description="seq2seq-lm: tokens per target (default max_length)")
    block_size: int | None = Field(None, ge=2, description="causal-lm: tokens per window (default 64 synthetic, 128 otherwise)")
    stride: int | None = Field(None, ge=1, description="causal-lm: tokens between window starts (default block_size)")
    vocab_size: int = Field(2000, ge=16, description="vocabulary size of a trained tokenizer")
    tokenizer: str | None = Field(None, description="directory (e.g. a checkpoint's) or hub name of a tokenizer to use instead of training one")
    image_size: int | None = Field(None, ge=4, le=4096, description="image-classification: side of the square images the model sees "
                                   "(default: the model config's image_size, else 32)")
    cache_dir: str | None = Field(None, description="hub download cache (default: <run dir>/hf_cache)")
    seed: int | None = Field(None, ge=0, lt=2**63, description="seed for generation, splitting and subsets (default: the pipeline's seed)")

    @model_validator(mode="after")
    def _consistent(self) -> "DataSpec":
        if self.dataset is not None and not self.dataset.strip():
            raise ValueError("dataset must be a non-empty name")
        entry = get_dataset(self.dataset) if self.dataset is not None else None
        if entry is not None and entry.needs_path and self.path is None:
            raise ValueError(f"dataset {self.dataset!r} needs 'path' (a file or a directory of split files)")
        if (entry is None or not entry.needs_path) and self.path is not None:
            local = ", ".join(n for n in dataset_names() if get_dataset(n).needs_path)
            shown = repr(self.dataset) if self.dataset is not None else "the task's synthetic dataset"
            raise ValueError(f"'path' is only for the local datasets {local}, not {shown}")
        if self.block_size is not None and self.stride is not None and self.stride > self.block_size:
            raise ValueError(f"stride ({self.stride}) must be at most block_size ({self.block_size}): tokens between windows would never be seen")
        return self

    def resolved_dataset(self, task: str = "sequence-classification") -> str:
        return self.dataset or get_task(task).default_dataset

    def resolved_max_length(self, task: str = "sequence-classification") -> int:
        return self.max_length or DEFAULT_MAX_LENGTH.get(self.resolved_dataset(task), OTHER_LENGTH)

    def resolved_block_size(self) -> int:
        return self.block_size or DEFAULT_BLOCK_SIZE.get(self.resolved_dataset("causal-lm"), OTHER_LENGTH)

    def resolved_stride(self) -> int:
        return self.stride or self.resolved_block_size()


def check_task_fields(spec: DataSpec, task: str) -> None:
    """Refuse fields the task does not use (set to other than their defaults) and a dataset of another task."""
    own = get_task(task).data_fields
    for other in task_names():
        for field in get_task(other).data_fields:
            if field not in own and getattr(spec, field) != DataSpec.model_fields[field].default:
                users = ", ".join(t for t in task_names() if field in get_task(t).data_fields)
                raise UserError(f"not used by {task} data (it is for {users}); remove it", location=("data", field))
    name = spec.resolved_dataset(task)
    entry = get_dataset(name)
    if entry is not None and task not in entry.tasks:
        known = ", ".join(dataset_names(task))
        raise UserError(
            f"data.dataset = {name!r} is {' / '.join(entry.tasks)} data, not {task} data; for {task}: {known}, or a hub dataset"
        )


Columns = dict[str, list]  # a split as equal-length columns, already checked


def _take(columns: Columns, index: list[int]) -> Columns:
    return {k: [v[i] for i in index] for k, v in columns.items()}


def _subset(columns: Columns, n: int | None, seed: int) -> Columns:
    """A seeded random ``n`` of the rows in their original order (all when ``n`` is None)."""
    rows = len(next(iter(columns.values())))
    if n is None or n >= rows:
        return columns
    return _take(columns, sorted(random.Random(seed).sample(range(rows), n)))


def read_raw(spec: DataSpec, task: str, seed: int, run_dir: Path | None) -> RawData:
    """The dataset's tables: a registered loader's, else the hub's (``sources`` name each split's origin).

    Its splits are ``train`` and ``test``, or one table the run divides by ``data.test_fraction``.
    """
    name = spec.resolved_dataset(task)
    entry = get_dataset(name)
    if entry is None:
        found = hub_tables(name, spec.config, spec.train_split, spec.test_split, hub_cache_dir(spec.cache_dir, run_dir))
        return RawData(splits={s: table for s, (_, table) in found.items()}, sources={s: src for s, (src, _) in found.items()})
    raw = as_raw(entry.loader(spec, seed), name)
    if not set(SPLITS) <= set(raw.splits) and len(raw.splits) != 1:
        raise UserError(
            f"data.dataset = {name!r}: its loader gave the splits {', '.join(raw.splits) or 'none'}; "
            "it must give train and test, or one table to divide"
        )
    for split in raw.splits:
        raw.sources.setdefault(split, f"dataset {name!r}, split {split!r}")
    return raw


def _splits(spec: DataSpec, raw: RawData, seed: int, check: Callable[[Any, str], Columns], ordered: bool = False,
            subset: bool = True) -> dict[str, Columns]:
    """Each split's table checked into columns by ``check(table, source)``; one table is divided by
    ``test_fraction`` (its tail when ``ordered``) after the check, so errors name the rows of the file;
    then ``n_train``/``n_test`` subsets when ``subset``."""
    if set(SPLITS) <= set(raw.splits):
        parts = {s: check(raw.splits[s], raw.sources[s]) for s in SPLITS}
    else:
        (name, table), = raw.splits.items()
        whole = check(table, raw.sources[name])
        train, test = divide(len(next(iter(whole.values()))), spec.test_fraction, seed, raw.sources[name], ordered)
        parts = {"train": _take(whole, train), "test": _take(whole, test)}
    if subset:
        parts = {s: _subset(parts[s], spec.n_train if s == "train" else spec.n_test, seed + i) for i, s in enumerate(SPLITS)}
    for s in SPLITS:
        if not next(iter(parts[s].values())):
            raise UserError(f"the {s} split has no rows")
    return parts


def _tokenizer_for(spec: DataSpec, texts: list[str], lexicon: tuple[str, ...], given: PreTrainedTokenizerBase | None,
                   run_dir: Path | None) -> tuple[PreTrainedTokenizerBase, bool]:
    """The tokenizer to use and whether it was trained in this run."""
    if given is not None:
        return given, False
    if spec.tokenizer is not None:
        return load_tokenizer(spec.tokenizer, hub_cache_dir(spec.cache_dir, run_dir)), False
    return train_wordpiece(list(texts) + ([" ".join(lexicon)] if lexicon else []), spec.vocab_size), True


def _texts(values: list, source: str, field: str) -> list:
    for i, text in enumerate(values):
        if not isinstance(text, str):
            raise UserError(f"{source}, row {i + 1}: {field} holds {text!r}, not a string"[:300])
    return list(values)


def _cache(run_dir: Path | None) -> Path | None:
    return run_dir / CACHE_DIR if run_dir is not None else None


def classification_data(spec, raw, seed, run_dir, tokenizer, num_labels, hints) -> DataModule:
    """Texts and integer labels, tokenized to ``max_length``."""
    def check(table, source) -> Columns:
        if not isinstance(table, (list, tuple)):  # columns: checked here, then as rows
            cols = columns_of(table, {"text_column": spec.text_column, "label_column": spec.label_column}, source)
            table = [{spec.text_column: t, spec.label_column: y} for t, y in zip(cols["text_column"], cols["label_column"])]
        split = rows_to_split(list(table), spec.text_column, spec.label_column, source)
        return {"text": split.texts, "label": split.labels}

    parts = _splits(spec, raw, seed, check)
    train, test = (TextSplit(parts[s]["text"], parts[s]["label"]) for s in SPLITS)
    length = spec.resolved_max_length()
    rows = len(train) + len(test)
    check_fits("data.max_length", rows * length * _BYTES_PER_TOKEN, f"{rows} rows of {length} tokens while tokenizing")
    tok, trained = _tokenizer_for(spec, train.texts, raw.lexicon, tokenizer, run_dir)
    return DataModule(train, test, tok, length, num_labels=num_labels, seed=seed, trained_tokenizer=trained,
                      cache_dir=_cache(run_dir))


def language_data(spec, raw, seed, run_dir, tokenizer, num_labels, hints) -> LanguageModelData:
    """A corpus cut into windows of ``block_size`` tokens every ``stride``."""
    def check(table, source) -> Columns:
        return {"text": _texts(columns_of(table, {"text_column": spec.text_column}, source)["text_column"], source, "data.text_column")}

    parts = _splits(spec, raw, seed, check, ordered=True, subset=False)  # n_train/n_test count windows
    documents = {s: parts[s]["text"] for s in SPLITS}
    chars = sum(len(d) for s in SPLITS for d in documents[s])
    check_fits("data.dataset", chars * _BYTES_PER_TOKEN, f"a corpus of {chars} characters while tokenizing")
    tok, trained = _tokenizer_for(spec, documents["train"], raw.lexicon, tokenizer, run_dir)
    limits = {"train": spec.n_train, "test": spec.n_test}
    return LanguageModelData(documents, tok, spec.resolved_block_size(), spec.resolved_stride(), limits, seed, trained,
                             _cache(run_dir), reference=raw.reference)


def seq2seq_data(spec, raw, seed, run_dir, tokenizer, num_labels, hints) -> Seq2SeqData:
    """Source/target pairs of ``max_length``/``max_target_length`` tokens."""
    def check(table, source) -> Columns:
        cols = columns_of(table, {"source_column": spec.source_column, "target_column": spec.target_column}, source)
        return {"source": _texts(cols["source_column"], source, "data.source_column"),
                "target": _texts(cols["target_column"], source, "data.target_column")}

    parts = _splits(spec, raw, seed, check)
    pairs = {s: (parts[s]["source"], parts[s]["target"]) for s in SPLITS}
    length = spec.resolved_max_length("seq2seq-lm")
    target = spec.max_target_length or length
    rows = sum(len(pairs[s][0]) for s in SPLITS)
    check_fits("data.max_length", rows * (length + target) * _BYTES_PER_TOKEN, f"{rows} pairs of {length}+{target} tokens")
    tok, trained = _tokenizer_for(spec, pairs["train"][0] + pairs["train"][1], raw.lexicon, tokenizer, run_dir)
    return Seq2SeqData(pairs, tok, length, target, seed, trained, _cache(run_dir))


def _labels(values: list, source: str, classes: tuple[str, ...]) -> list[int]:
    """Integer labels; class names (strings) become their index in ``classes``."""
    labels = []
    for row, v in enumerate(values, start=1):
        if isinstance(v, str) and v in classes:
            labels.append(classes.index(v))
        elif isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise UserError(f"{source}, row {row}: label {v!r} is not an integer class index or one of the class names"[:300])
        else:
            labels.append(int(v))
    return labels


def image_data(spec, raw, seed, run_dir, tokenizer, num_labels, hints) -> ImageData:
    """Images (resized to ``image_size``) and their labels, class names given as strings included."""
    classes = raw.classes or _class_names(raw, spec)

    def check(table, source) -> Columns:
        cols = columns_of(table, {"image_column": spec.image_column, "label_column": spec.label_column}, source)
        images = [to_chw(x, f"{source}, row {i + 1}") for i, x in enumerate(cols["image_column"])]
        return {"image": images, "label": _labels(list(cols["label_column"]), source, classes)}

    parts = _splits(spec, raw, seed, check)
    images = {s: parts[s]["image"] for s in SPLITS}
    sizes = {tuple(x.shape[1:]) for s in SPLITS for x in images[s]}
    native = sizes.pop()[0] if len(sizes) == 1 and len(set(next(iter(sizes or {(0, 1)})))) == 1 else None
    size = spec.image_size or hints.get("image_size") or native or DEFAULT_IMAGE_SIZE
    grey = all(x.shape[0] == 1 for s in SPLITS for x in images[s])
    channels = hints.get("num_channels") or (1 if grey else 3)
    n = sum(len(images[s]) for s in SPLITS)
    check_fits("data.image_size", n * channels * size * size * 2, f"{n} images of {channels}x{size}x{size}")
    labels = {s: parts[s]["label"] for s in SPLITS}
    return ImageData(images, labels, classes, size, channels, num_labels, hints.get("normalisation"), seed)


def _class_names(raw: RawData, spec: DataSpec) -> tuple[str, ...]:
    """Sorted string labels across the splits (a hub ``ClassLabel`` gives integers, so none)."""
    names = set()
    for split, table in raw.splits.items():
        values = columns_of(table, {"label_column": spec.label_column}, raw.sources[split])["label_column"]
        names |= {v for v in values if isinstance(v, str)}
    return tuple(sorted(names))


def build_data(
    spec: DataSpec | dict | None = None,
    *,
    task: str = "sequence-classification",
    seed: int = 0,
    run_dir: Path | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    num_labels: int | None = None,
    hints: dict[str, Any] | None = None,
) -> SplitData:
    """Read, check and prepare the data ``spec`` names for ``task``; writes nothing (see ``persist``).

    A text task's tokenizer is ``tokenizer`` when given (a pretrained model's), else ``spec.tokenizer``,
    else a WordPiece tokenizer trained on the train split. ``hints`` carry what the model already fixes
    for images: ``image_size``, ``num_channels``, ``normalisation`` (an image processor's mean and std).
    """
    spec = validate_section(DataSpec, spec, "data")
    entry = get_task(task)
    check_task_fields(spec, task)
    seed = spec.seed if spec.seed is not None else seed
    raw = read_raw(spec, task, seed, run_dir)
    return entry.build_data(spec, raw, seed, run_dir, tokenizer, num_labels, hints or {})
