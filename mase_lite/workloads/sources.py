"""Where rows come from: local JSON/CSV/text files or a hub dataset, as tables of named columns.

Every source gives ``{split: table}``; each task picks its columns downstream (labelled texts become
a :class:`TextSplit`), and tokenization or resizing is done once, whatever the source.

Example::

    train, test = read_local("csv", Path("reviews.csv"), "text", "label", test_fraction=0.2, seed=0)
    tables = local_tables("txt", Path("corpus"), "train", "test", test_fraction=0.1, seed=0)
"""

from __future__ import annotations

import csv
import io
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mase_lite.infra.errors import UserError, short
from mase_lite.infra.files import check_inside, read_regular
from mase_lite.infra.jsonio import loads
from mase_lite.infra.limits import TEXT_PER_BYTE
from mase_lite.workloads.hub import hub_access, hub_endpoint
from mase_lite.workloads.synthetic import generate_sentiment

logger = logging.getLogger(__name__)

LOCAL_EXTENSIONS = {"json": (".json", ".jsonl"), "csv": (".csv",), "txt": (".txt",)}


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


MAX_LABEL = 2**31 - 1  # a class index; more classes than this no classifier here could hold


def _as_label(value: Any, where: str, column: str) -> int:
    """An integer label from a JSON number, a whole float or a CSV string of digits, at most :data:`MAX_LABEL`."""
    label = None
    if isinstance(value, bool):
        label = int(value)
    elif isinstance(value, int):
        label = value
    elif isinstance(value, float) and value.is_integer():
        label = int(value)
    elif isinstance(value, str) and len(value) < 32:
        try:
            label = int(value.strip())
        except ValueError:
            pass
    if label is None or label > MAX_LABEL:
        raise UserError(f"{where}: label column {column!r} holds {short(value)}; labels must be integers 0, 1, ... "
                        f"up to {MAX_LABEL}")
    return label


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


def _json_rows(raw: bytes, path: Path) -> list[dict]:
    """A JSON array of objects, or JSON Lines (one object per line), read strictly (see :mod:`mase_lite.infra.jsonio`)."""
    text = raw.decode("utf-8")
    try:
        data = loads(text, str(path))
    except UserError:
        data = None
    if isinstance(data, list):
        rows = data
    else:
        rows = [loads(line, f"{path}, line {n}") for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    for n, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise UserError(f"{path}: row {n} is {short(row)}, not an object of columns")
    return rows


def _csv_rows(raw: bytes, path: Path) -> list[dict]:
    """CSV rows, decoded as they are read (a byte-order mark is not part of the first column's name)."""
    reader = csv.DictReader(io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8-sig", newline=""))
    try:
        return list(reader)
    except csv.Error as err:
        raise UserError(f"{path}, line {reader.line_num}: not CSV the reader takes ({err})") from None


def _text_rows(raw: bytes, path: Path) -> list[dict]:
    """A plain text file: one row ``{"text": line}`` per non-empty line."""
    return [{"text": line} for line in raw.decode("utf-8").splitlines() if line.strip()]


def read_rows(fmt: str, path: Path) -> list[dict]:
    """One local ``json``/``jsonl``/``csv``/``txt`` file as rows; an error for an empty one, and for one whose rows
    would not fit in memory (from its size, before it is read)."""
    read = {"csv": _csv_rows, "txt": _text_rows}.get(fmt, _json_rows)
    try:
        rows = read(read_regular(path, f"a {fmt} file", per_byte=TEXT_PER_BYTE), path)
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte {err.start})") from None
    if not rows:
        raise UserError(f"{path}: no rows")
    return rows


def read_file(fmt: str, path: Path, text_column: str, label_column: str) -> TextSplit:
    """One local ``json``/``jsonl``/``csv`` file as a split of labelled texts."""
    return rows_to_split(read_rows(fmt, path), text_column, label_column, str(path))


def _split_file(directory: Path, fmt: str, split: str) -> Path:
    """The file named ``split`` with one of the format's extensions inside ``directory``."""
    for ext in LOCAL_EXTENSIONS[fmt]:
        candidate = directory / f"{split}{ext}"
        if candidate.is_file():
            check_inside(candidate, directory, "data.path")
            return candidate
    present = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
    wanted = " or ".join(f"{split}{ext}" for ext in LOCAL_EXTENSIONS[fmt])
    raise UserError(f"data.path = {str(directory)!r}: a directory must hold {wanted}; it holds {present}")


def local_tables(fmt: str, path: Path, train_split: str, test_split: str) -> dict[str, tuple[str, list[dict]]]:
    """``{"train"|"test": (source, rows)}`` from a directory of split files, or ``{"all": ...}`` from one file
    (the run splits it by ``data.test_fraction``)."""
    if path.is_dir():
        found = {s: _split_file(path, fmt, name) for s, name in (("train", train_split), ("test", test_split))}
        return {s: (str(f), read_rows(fmt, f)) for s, f in found.items()}
    if not path.is_file():
        raise UserError(f"data.path = {str(path)!r} does not exist (give a {fmt} file or a directory of split files)")
    if path.suffix not in LOCAL_EXTENSIONS[fmt]:
        raise UserError(
            f"data.path = {str(path)!r}: dataset {fmt!r} reads files ending in {', '.join(LOCAL_EXTENSIONS[fmt])}"
        )
    return {"all": (str(path), read_rows(fmt, path))}


def divide(n: int, test_fraction: float, seed: int, source: str, ordered: bool = False) -> tuple[list[int], list[int]]:
    """``(train, test)`` row indices of one table: a seeded random ``test_fraction`` of the rows (each part in
    file order), or its tail when ``ordered`` (a corpus).

    >>> divide(5, 0.4, seed=0, source="x.txt", ordered=True)
    ([0, 1, 2], [3, 4])
    """
    n_test = round(n * test_fraction)
    if n_test == 0 or n_test == n:
        raise UserError(f"data.test_fraction = {test_fraction} of {n} rows in {source} leaves an empty split")
    if ordered:
        return list(range(n - n_test)), list(range(n - n_test, n))
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[n_test:]), sorted(order[:n_test])


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
    """Train and test splits of labelled texts from a directory of split files, or from one file split at random."""
    tables = local_tables(fmt, path, train_split, test_split, test_fraction, seed)
    train, test = (rows_to_split(rows, text_column, label_column, source) for source, rows in tables.values())
    return train, test


def _data_files(card: Path) -> list[str]:
    """The ``data_files`` a dataset card's YAML header names (``configs: [{data_files: ...}]``), as written."""
    import yaml

    text = card.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return []
    header = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(header)
    except yaml.YAMLError:
        return []  # the datasets library refuses it itself
    found: list[str] = []

    def collect(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            for item in value:
                collect(item)
        elif isinstance(value, dict):
            collect(value.get("path", []))

    configs = meta.get("configs", []) if isinstance(meta, dict) else []
    for config in configs if isinstance(configs, list) else []:
        if isinstance(config, dict):
            collect(config.get("data_files", []))
    return found


def _check_local_dataset(directory: Path) -> None:
    """A local dataset directory is read only inside itself: no link out of it, no ``data_files`` of its card
    that is absolute, climbs out (``..``) or is a URL."""
    for path in directory.rglob("*"):
        check_inside(path, directory, "data.dataset")
    card = directory / "README.md"
    for pattern in _data_files(card) if card.is_file() else []:
        if os.path.isabs(pattern) or ".." in Path(pattern).parts or "://" in pattern:
            raise UserError(f"{card}: data_files {pattern!r} lies outside {directory}; a local dataset's files are "
                            "inside its directory", location=("data.dataset",))


def hub_tables(
    name: str,
    config: str | None,
    train_split: str,
    test_split: str,
    cache_dir: Path | None,
) -> dict[str, tuple[str, Any]]:
    """``{"train"|"test": (source, datasets.Dataset)}`` of a hub dataset (or one already in ``cache_dir``); ``name``
    may be a local directory of split files the ``datasets`` library reads (text, CSV, JSON, image folders)."""
    import datasets

    if Path(name).is_dir():
        _check_local_dataset(Path(name))
    with hub_access() as online:
        try:
            ds = datasets.load_dataset(name, config, cache_dir=str(cache_dir) if cache_dir else None)
        except Exception as err:  # datasets raises many types for "not found" and "no network"
            reason = (str(err).splitlines() or [err.__class__.__name__])[0]
            if Path(name).is_dir() or "script" in reason.lower():  # the hub is not the cause
                raise UserError(f"data.dataset = {name!r}: the datasets library does not read it: {reason}") from None
            if not online:
                raise UserError(
                    f"data.dataset = {name!r}: the Hugging Face hub ({hub_endpoint()}) is unreachable and the "
                    f"dataset is not in the cache {str(cache_dir or 'of datasets')!r} ({reason}). Offline, use "
                    "the task's synthetic dataset or local files (data.path)"
                ) from None
            raise UserError(f"data.dataset = {name!r}: could not load it from the hub: {reason}") from None
    tables = {}
    for key, split, field in (("train", train_split, "train_split"), ("test", test_split, "test_split")):
        if split not in ds:
            raise UserError(f"data.{field} = {split!r}: dataset {name!r} has the splits {', '.join(ds)}")
        tables[key] = (f"dataset {name!r}, split {split!r}", ds[split])
    return tables
