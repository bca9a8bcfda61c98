"""Where labelled texts come from: the synthetic generator, local JSON/CSV files, or a hub dataset.

Every source returns the same thing, a train and a test :class:`TextSplit`; tokenization is
done once, downstream, whatever the source.

Example::

    train, test = read_local("csv", Path("reviews.csv"), "text", "label", test_fraction=0.2, seed=0)
"""

from __future__ import annotations

import csv
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mase_lite.errors import UserError
from mase_lite.train.hub import hub_access, hub_endpoint
from mase_lite.train.synthetic import generate_sentiment

logger = logging.getLogger(__name__)

LOCAL_EXTENSIONS = {"json": (".json", ".jsonl"), "csv": (".csv",)}


@dataclass(frozen=True)
class TextSplit:
    """Texts and their integer labels, in order."""

    texts: list[str]
    labels: list[int]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise UserError(f"{len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices: list[int]) -> "TextSplit":
        return TextSplit([self.texts[i] for i in indices], [self.labels[i] for i in indices])


def synthetic_splits(n_train: int, n_test: int, seed: int) -> tuple[TextSplit, TextSplit]:
    """Train and test sentences from one seeded stream (the test rows follow the train rows)."""
    texts, labels = generate_sentiment(n_train + n_test, seed)
    return TextSplit(texts[:n_train], labels[:n_train]), TextSplit(texts[n_train:], labels[n_train:])


def _as_label(value: Any, where: str, column: str) -> int:
    """An integer label from a JSON number, a whole float or a CSV string of digits."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise UserError(f"{where}: label column {column!r} holds {value!r}; labels must be integers 0, 1, ...")


def rows_to_split(rows: list[dict], text_column: str, label_column: str, source: str) -> TextSplit:
    """Pick the text and label columns out of ``rows`` (dicts), checking every row."""
    if rows:
        columns = list(rows[0])
        for key, name in ((text_column, "text_column"), (label_column, "label_column")):
            if key not in columns:
                raise UserError(
                    f"{source}: no column {key!r} (data.{name}); its columns are: {', '.join(map(str, columns))}"
                )
    texts, labels = [], []
    for i, row in enumerate(rows):
        where = f"{source}, row {i + 1}"
        if not isinstance(row, dict) or text_column not in row or label_column not in row:
            raise UserError(f"{where}: needs the columns {text_column!r} and {label_column!r}, got {row!r}")
        text = row[text_column]
        if not isinstance(text, str):
            raise UserError(f"{where}: text column {text_column!r} holds {text!r}, not a string")
        texts.append(text)
        labels.append(_as_label(row[label_column], where, label_column))
    return TextSplit(texts, labels)


def _read_json_rows(path: Path) -> list[dict]:
    """A JSON array of objects, or JSON Lines (one object per line)."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, list):
        return data
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise UserError(f"{path}: line {n} is not JSON ({err.msg}); expected an array of objects or JSON Lines") from None
    return rows


def _read_csv_rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_file(fmt: str, path: Path, text_column: str, label_column: str) -> TextSplit:
    """One local ``json``/``jsonl``/``csv`` file as a split."""
    rows = _read_csv_rows(path) if fmt == "csv" else _read_json_rows(path)
    if not rows:
        raise UserError(f"{path}: no rows")
    return rows_to_split(rows, text_column, label_column, str(path))


def _split_file(directory: Path, fmt: str, split: str) -> Path:
    """The file named ``split`` with one of the format's extensions inside ``directory``."""
    for ext in LOCAL_EXTENSIONS[fmt]:
        candidate = directory / f"{split}{ext}"
        if candidate.is_file():
            return candidate
    present = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
    wanted = " or ".join(f"{split}{ext}" for ext in LOCAL_EXTENSIONS[fmt])
    raise UserError(f"data.path = {str(directory)!r}: a directory must hold {wanted}; it holds {present}")


def read_local(
    fmt: str,
    path: Path,
    text_column: str,
    label_column: str,
    test_fraction: float,
    seed: int,
    train_split: str = "train",
    test_split: str = "test",
) -> tuple[TextSplit, TextSplit]:
    """Train and test splits from a directory of split files, or from one file split at random."""
    if path.is_dir():
        train = read_file(fmt, _split_file(path, fmt, train_split), text_column, label_column)
        test = read_file(fmt, _split_file(path, fmt, test_split), text_column, label_column)
        return train, test
    if not path.is_file():
        raise UserError(f"data.path = {str(path)!r} does not exist (give a {fmt} file or a directory of split files)")
    if path.suffix not in LOCAL_EXTENSIONS[fmt]:
        raise UserError(
            f"data.path = {str(path)!r}: dataset {fmt!r} reads files ending in {', '.join(LOCAL_EXTENSIONS[fmt])}"
        )
    everything = read_file(fmt, path, text_column, label_column)
    order = list(range(len(everything)))
    random.Random(seed).shuffle(order)
    n_test = round(len(everything) * test_fraction)
    if n_test == 0 or n_test == len(everything):
        raise UserError(
            f"data.test_fraction = {test_fraction} of {len(everything)} rows in {path} leaves an empty split"
        )
    return everything.take(order[n_test:]), everything.take(order[:n_test])


def read_hub(
    name: str,
    config: str | None,
    text_column: str,
    label_column: str,
    train_split: str,
    test_split: str,
    cache_dir: Path | None,
) -> tuple[TextSplit, TextSplit]:
    """Train and test splits of a dataset on the Hugging Face hub (or already in ``cache_dir``)."""
    import datasets

    with hub_access() as online:
        try:
            ds = datasets.load_dataset(name, config, cache_dir=str(cache_dir) if cache_dir else None)
        except Exception as err:  # datasets raises many types for "not found" and "no network"
            reason = (str(err).splitlines() or [err.__class__.__name__])[0]
            if not online:
                raise UserError(
                    f"data.dataset = {name!r}: the Hugging Face hub ({hub_endpoint()}) is unreachable and the "
                    f"dataset is not in the cache {str(cache_dir or 'of datasets')!r} ({reason}). Offline, use "
                    "'synthetic-sentiment' or local files ('json'/'csv' with data.path)"
                ) from None
            raise UserError(f"data.dataset = {name!r}: could not load it from the hub: {reason}") from None
    splits = {}
    for split, field in ((train_split, "train_split"), (test_split, "test_split")):
        if split not in ds:
            raise UserError(f"data.{field} = {split!r}: dataset {name!r} has the splits {', '.join(ds)}")
        part = ds[split]
        for column, col_field in ((text_column, "text_column"), (label_column, "label_column")):
            if column not in part.column_names:
                raise UserError(
                    f"dataset {name!r}, split {split!r}: no column {column!r} (data.{col_field}); "
                    f"its columns are: {', '.join(part.column_names)}"
                )
        source = f"dataset {name!r}, split {split!r}"
        rows = [{text_column: t, label_column: y} for t, y in zip(part[text_column], part[label_column])]
        splits[field] = rows_to_split(rows, text_column, label_column, source)
    return splits["train_split"], splits["test_split"]
