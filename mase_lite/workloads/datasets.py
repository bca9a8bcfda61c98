"""Named datasets: what a spec's ``data.dataset`` may name besides a hub dataset.

A loader takes the data section and the run's seed and returns the raw splits: a mapping from split
name to a table (a list of row dicts, a dict of columns, or a ``datasets.Dataset``), one table (rows
or a ``datasets.Dataset``) that the run divides by ``test_fraction``, or a :class:`RawData` that also carries a reference model of the data (exact perplexity bounds) or words
a trained tokenizer must keep whole. The run then picks the task's columns (``data.text_column``,
``label_column``, ``image_column``, ``source_column``, ``target_column``), subsets, tokenizes or
resizes, exactly as for the built-in and hub datasets; the prefix cache of a search keys on the
data section, so a plug-in dataset needs nothing more. Plug-in packages register through the
entry-point group ``mase_lite.datasets`` (the entry point's object is called with no arguments and
registers its datasets), or call :func:`register_dataset` from a ``--plugin`` module.

Example::

    >>> def colours(spec, seed):
    ...     rows = [{"text": f"{c} is a colour", "label": i % 2} for i, c in enumerate(["red", "blue"] * 8)]
    ...     return {"train": rows[:12], "test": rows[12:]}
    >>> register_dataset("colours", colours, tasks=("sequence-classification",))
    >>> get_dataset("colours").tasks
    ('sequence-classification',)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from mase_lite.infra.errors import UserError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mase_lite.datasets"


@dataclass
class RawData:
    """A loader's result: ``splits`` maps a split name to a table; the rest is optional knowledge."""

    splits: dict[str, Any]
    reference: Any = None  # a model of the data that scores windows exactly (e.g. the grammar)
    lexicon: tuple[str, ...] = ()  # words a tokenizer trained in the run keeps as single tokens
    classes: tuple[str, ...] = ()  # class names, in label order
    sources: dict[str, str] = field(default_factory=dict)  # split -> where its rows came from (for messages)


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    loader: Callable[[Any, int], RawData | Mapping[str, Any]]
    tasks: tuple[str, ...]
    needs_path: bool = False
    description: str = ""
    module: str = field(default="", compare=False)


_REGISTRY: dict[str, DatasetEntry] = {}
_ENTRY_POINTS_LOADED = [False]


def register_dataset(
    name: str,
    loader: Callable[[Any, int], RawData | Mapping[str, Any]],
    tasks: tuple[str, ...] | None = None,
    needs_path: bool = False,
    description: str = "",
) -> None:
    """Make ``name`` a value of ``data.dataset`` for ``tasks`` (default: every registered task); ``needs_path``:
    the spec must give ``data.path``."""
    from mase_lite.workloads.tasks import task_names

    if not isinstance(name, str) or not name.strip():
        raise UserError(f"register_dataset: the name must be a non-empty string, got {name!r}")
    known = task_names()
    tasks = tuple(known) if tasks is None else tasks
    unknown = [t for t in tasks if t not in known]
    if unknown or not tasks:
        raise UserError(f"register_dataset({name!r}): tasks must be among {', '.join(known)}; got {list(tasks)}")
    _REGISTRY[name] = DatasetEntry(name, loader, tuple(tasks), needs_path, description, getattr(loader, "__module__", ""))


def _load_entry_points() -> None:
    if _ENTRY_POINTS_LOADED[0]:
        return
    _ENTRY_POINTS_LOADED[0] = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()()
        except Exception as err:  # a broken plug-in must not break the tool
            logger.warning("could not load dataset plug-in %s (%s): %s", ep.name, ep.value, err)


def get_dataset(name: str) -> DatasetEntry | None:
    """The registered dataset ``name`` (built-ins included), or ``None`` for a hub dataset name."""
    _load_entry_points()
    return _REGISTRY.get(name)


def dataset_names(task: str | None = None) -> list[str]:
    """Registered dataset names, for ``task`` only when given."""
    get_dataset("")
    return sorted(n for n, e in _REGISTRY.items() if task is None or task in e.tasks)


def as_raw(result: RawData | Mapping[str, Any] | Any, name: str) -> RawData:
    """A loader's result as :class:`RawData`: a mapping of splits, or one table (rows or a ``datasets.Dataset``)."""
    if isinstance(result, RawData):
        return result
    if isinstance(result, Mapping):
        return RawData(splits=dict(result))
    if isinstance(result, (list, tuple)) or hasattr(result, "column_names"):
        return RawData(splits={"all": result})
    raise UserError(f"data.dataset = {name!r}: its loader returned {type(result).__name__}, not splits or a table")


def columns_of(table: Any, wanted: dict[str, str], source: str) -> dict[str, Any]:
    """``{spec field: column values}`` of the columns ``wanted`` names (``{field: column}``) in a table of
    row dicts, a dict of columns or a ``datasets.Dataset``; a missing column names its field and the
    columns there are, a row without it names the row."""
    if hasattr(table, "column_names") and hasattr(table, "__getitem__"):  # datasets.Dataset
        columns = list(table.column_names)
    elif isinstance(table, Mapping):
        columns = list(table)
        lengths = {k: len(v) for k, v in table.items()}
        if len(set(lengths.values())) > 1:
            raise UserError(f"{source}: its columns differ in length ({lengths})")
    elif isinstance(table, (list, tuple)):
        bad = next((i for i, row in enumerate(table) if not isinstance(row, Mapping)), None)
        if bad is not None:
            raise UserError(f"{source}, row {bad + 1}: expected an object with named columns, got {table[bad]!r}"[:300])
        columns = list(table[0]) if table else []
    else:
        raise UserError(f"{source}: expected rows or columns, got {type(table).__name__}")
    for field_name, column in wanted.items():
        if column not in columns:
            there = ", ".join(map(str, columns)) or "none"
            raise UserError(f"{source}: no column {column!r} (data.{field_name}); its columns are: {there}")
    if not isinstance(table, (list, tuple)):
        return {f: table[c] for f, c in wanted.items()}
    picked: dict[str, list] = {f: [] for f in wanted}
    for i, row in enumerate(table):
        for f, c in wanted.items():
            if c not in row:
                raise UserError(f"{source}, row {i + 1}: needs the columns {', '.join(map(repr, wanted.values()))}")
            picked[f].append(row[c])
    return picked
