"""What every task's data has in common: tensors per split, batches, a fingerprint and a cache on disk.

Example::

    data.loader("train", batch_size=16, shuffle=True, seed=0)   # dicts keyed by data.input_names
    data.example_batch(3)                                       # the first rows, e.g. to capture a graph
    data.persist(run_dir)                                       # tokenizer and tensors for the next run
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
import logging
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from mase_lite.infra.errors import UserError
from mase_lite.infra.files import staged_directory, staged_file
from mase_lite.workloads.loader import BatchLoader

logger = logging.getLogger(__name__)

Split = Literal["train", "test"]
SPLITS = ("train", "test")
TOKENIZER_DIR = "tokenizer"
CACHE_DIR = "data_cache"


def digest(*parts: Any) -> str:
    """A short hex digest of strings, bytes and tensors."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            h.update(str((part.dtype, tuple(part.shape))).encode())
            h.update(part.contiguous().view(torch.uint8).numpy().tobytes() if part.numel() else b"")
        else:
            h.update(part if isinstance(part, bytes) else str(part).encode())
    return h.hexdigest()[:20]


def cached_tensors(cache_dir: Path | None, fingerprint: str, names: tuple[str, ...],
                   check: Callable[[dict], str | None] | None = None) -> dict | None:
    """The tensors a previous run saved under ``fingerprint``, or ``None``. An entry is data, checked before it is
    used: readable, its tensors' digest the one written beside them, every tensor an int64 CPU tensor of rows (the
    same count in a split), and what ``check``
    (the data's own: labels, shapes, a few rows tokenized again) finds it claims; a failed entry is removed
    with a warning and the data tokenized again."""
    path = cache_dir / f"{fingerprint}.safetensors" if cache_dir else None
    if path is None or not path.is_file() or path.is_symlink():
        return None
    try:
        with safe_open(str(path), "pt") as entry:
            written = (entry.metadata() or {}).get("digest")
        flat = load_file(str(path))
        tensors = {s: {n: flat[f"{s}.{n}"] for n in names} for s in SPLITS}
        problem = ("its tensors are not the bytes written (digest)" if written != _tensors_digest(flat) else
                   _structure_problem(tensors) or (check(tensors) if check is not None else None))
    except (SafetensorError, KeyError, OSError) as err:
        problem = f"unreadable ({err})"
    if problem:
        logger.warning("tokenized data cache %s: %s; tokenizing again", path, problem)
        path.unlink(missing_ok=True)
        return None
    logger.info("tokenized data from the cache %s", path)
    return tensors


def _tensors_digest(flat: dict[str, torch.Tensor]) -> str:
    """What a cache entry's tensors hold, names included: any byte changed since it was written changes it."""
    return digest(*(part for name in sorted(flat) for part in (name, flat[name])))


def _structure_problem(tensors: dict) -> str | None:
    for split, named in tensors.items():
        rows = {t.shape[0] if t.dim() else -1 for t in named.values()}
        for name, t in named.items():
            if t.dtype != torch.int64 or t.device.type != "cpu" or t.dim() not in (1, 2):
                return f"{split}.{name} is a {t.dtype} tensor of shape {list(t.shape)} on {t.device}"
        if len(rows) != 1 or rows == {0}:
            return f"the {split} tensors do not hold the same rows"
    return None


def differing_rows(cached: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor], rows: list[int]) -> str | None:
    """Which cached tensor differs at ``rows`` from the same rows computed afresh (``fresh``), if any."""
    for name, tensor in fresh.items():
        if cached[name].shape[1:] != tensor.shape[1:] or not torch.equal(cached[name][rows], tensor):
            return f"{name} differs from its data at rows {rows}"
    return None


def sample_rows(count: int, k: int = 4) -> list[int]:
    """Up to ``k`` rows spread over ``count`` (first and last included)."""
    return sorted({round(i * (count - 1) / max(k - 1, 1)) for i in range(k)}) if count else []


class SplitData:
    """Tensors per split (``self.tensors[split][name]``) with batches, a fingerprint and persistence.

    Subclasses set ``task``, ``tensors``, ``fingerprint``, ``seed`` and, for text, ``tokenizer``.
    """

    task: str
    tensors: dict[str, dict[str, torch.Tensor]]
    fingerprint: str
    seed: int = 0
    tokenizer: Any = None
    trained_tokenizer: bool = False
    cache_tensors: bool = True

    @property
    def input_names(self) -> list[str]:
        return list(self.tensors["train"])

    def _check_split(self, split: str) -> str:
        if split not in self.tensors:
            raise UserError(f"split must be one of: train, test; got {split!r}")
        return split

    def size(self, split: Split) -> int:
        """Rows (blocks of tokens for a language model) in ``split``."""
        return len(next(iter(self.tensors[self._check_split(split)].values())))

    def transform(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Stored tensors to the model's inputs (the identity unless the data is stored compactly)."""
        return batch

    def loader(self, split: Split, batch_size: int, shuffle: bool = False, seed: int = 0) -> BatchLoader:
        """Batches of ``split`` keyed by ``input_names``; the same order for the same ``seed``."""
        transform = None if type(self).transform is SplitData.transform else self.transform
        return BatchLoader(self.tensors[self._check_split(split)], batch_size, shuffle, seed, transform)

    def example_batch(self, batch_size: int = 2) -> dict[str, torch.Tensor]:
        """The first ``batch_size`` training rows, e.g. to capture a graph."""
        return self.transform({name: t[:batch_size] for name, t in self.tensors["train"].items()})

    def reference_metrics(self, split: Split) -> dict[str, float]:
        """What the data itself says about the best reachable metrics on ``split`` (none by default)."""
        return {}

    def save_tokenizer(self, directory: Path) -> Path:
        """Write the tokenizer to ``directory`` whole or not at all."""
        directory = Path(directory)
        with staged_directory(directory) as staging:
            self.tokenizer.save_pretrained(str(staging))
        return directory

    def persist(self, run_dir: Path) -> None:
        """Save what the run derived from its data: a trained tokenizer and the tokenized tensors."""
        run_dir = Path(run_dir)
        if self.trained_tokenizer:
            self.save_tokenizer(run_dir / TOKENIZER_DIR)
        if not self.cache_tensors:
            return
        target = run_dir / CACHE_DIR / f"{self.fingerprint}.safetensors"
        if target.is_file():
            return
        flat = {f"{s}.{n}": t.contiguous() for s, named in self.tensors.items() for n, t in named.items()}
        with staged_file(target) as staging:
            save_file(flat, str(staging), metadata={"task": self.task, "digest": _tensors_digest(flat)})
