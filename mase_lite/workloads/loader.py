"""Batches of a split's rows as dicts of tensors, in a seeded order.

Example::

    >>> import torch
    >>> loader = BatchLoader({"x": torch.arange(5)}, batch_size=2, shuffle=False, seed=0)
    >>> [b["x"].tolist() for b in loader]
    [[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from mase_lite.infra.errors import UserError


class BatchLoader:
    """Batches of rows as dicts of tensors; shuffled by a seeded ``torch.Generator`` when asked.

    ``transform`` turns each batch's stored tensors into the model's (e.g. uint8 images into
    normalised floats), so a split is kept in its compact form.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], batch_size: int, shuffle: bool, seed: int,
                 transform: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None):
        if batch_size < 1:
            raise UserError(f"batch_size must be a positive integer, got {batch_size}")
        self.tensors = tensors
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.transform = transform
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
            batch = {name: t[index] for name, t in self.tensors.items()}
            yield self.transform(batch) if self.transform is not None else batch
