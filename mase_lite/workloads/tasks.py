"""Tasks: what a model of each task predicts (its transformers head, its loss from logits, its metrics), its
default model and dataset, and how its data is shaped; one registry entry each (``register_task``; the built-in
ones in :mod:`mase_lite.workloads.builtin_tasks`).

A model that computes its own loss (every transformers head given ``labels``) trains on that; any
other model (a factory's plain ``nn.Module``) gets the task's loss from its logits. Metrics
accumulate batch by batch, so evaluation memory does not grow with the split.

Example::

    >>> import torch
    >>> task = TASKS["causal-lm"]
    >>> logits = torch.zeros(1, 3, 4)                  # uniform over 4 tokens
    >>> batch = {"labels": torch.tensor([[0, 1, 2]])}
    >>> round(float(task.loss(logits, batch)), 4)      # log 4, over the 2 predicted tokens
    1.3863
    >>> meter = task.meter(num_labels=None)
    >>> meter.update(logits, batch)
    >>> round(meter.result()["perplexity"], 6), meter.result()["tokens"]
    (4.0, 2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from mase_lite.infra.errors import UserError

IGNORE = -100  # labels at this value are not predicted (padding, context already scored)


def _token_pairs(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened ``(logits, labels)`` of the predicted positions: ``logits[t]`` predicts ``labels[t + 1]`` when shifted."""
    labels = labels.to(logits.device)
    if logits.ndim != 3 or labels.shape != logits.shape[:2]:
        raise UserError(
            f"the model gives logits of shape {list(logits.shape)} for labels of shape {list(labels.shape)}; "
            "a language model gives [batch, tokens, vocabulary]"
        )
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)


class ClassificationMeter:
    """Accuracy, loss, top-5 accuracy and per-class counts over rows; ``confusion[true][predicted]``."""

    def __init__(self, num_classes: int, top5: bool):
        self.num_classes = num_classes
        self.top5 = top5
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)
        self.loss = 0.0
        self.rows = 0
        self.in_top5 = 0

    def update(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        logits = logits.float()
        labels = batch["labels"].to(logits.device)
        if logits.ndim != 2 or logits.shape[-1] != self.num_classes:
            raise UserError(
                f"the model gives logits of shape {list(logits.shape)}; the data has {self.num_classes} classes, "
                f"so [batch, {self.num_classes}] is expected"
            )
        self.loss += F.cross_entropy(logits, labels, reduction="sum").item()
        self.rows += len(labels)
        pairs = labels.cpu() * self.num_classes + logits.argmax(-1).cpu()
        self.confusion += torch.bincount(pairs, minlength=self.num_classes**2).reshape(self.num_classes, self.num_classes)
        if self.top5:
            k = min(5, self.num_classes)
            self.in_top5 += int((logits.topk(k, -1).indices == labels[:, None]).any(-1).sum())

    def result(self) -> dict:
        correct = self.confusion.diag()
        rows = max(self.rows, 1)
        metrics = {"accuracy": correct.sum().item() / rows, "loss": self.loss / rows, "n": self.rows}
        if self.top5:
            metrics["top5"] = self.in_top5 / rows
        metrics["per_class"] = {
            str(c): {"support": int(self.confusion[c].sum()), "predicted": int(self.confusion[:, c].sum()),
                     "correct": int(correct[c])}
            for c in range(self.num_classes)
        }
        metrics["confusion"] = self.confusion.tolist()
        return metrics


class TokenMeter:
    """Token-weighted loss over a whole split, its perplexity ``exp(loss)``, and next-token accuracy."""

    def __init__(self, shift: bool):
        self.shift = shift
        self.loss = 0.0
        self.tokens = 0
        self.correct = 0
        self.rows = 0

    def update(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        flat, labels = _token_pairs(logits, batch["labels"], self.shift)
        keep = labels != IGNORE
        flat, labels = flat[keep].float(), labels[keep]
        self.loss += F.cross_entropy(flat, labels, reduction="sum").item()
        self.tokens += len(labels)
        self.correct += int((flat.argmax(-1) == labels).sum())
        self.rows += len(batch["labels"])

    def result(self) -> dict:
        if self.tokens == 0:
            raise UserError("the split has no token to predict (every label is padding)")
        loss = self.loss / self.tokens
        return {"loss": loss, "perplexity": math.exp(loss), "accuracy": self.correct / self.tokens,
                "tokens": self.tokens, "n": self.rows}


@dataclass(frozen=True)
class Task:
    """One task, everything about it in one entry: its transformers head (``auto_class``; ``head_mapping``:
    transformers' list of model types that have it), the inputs its data gives, how logits are scored
    (``per_token``, ``shift``, ``top5``) and the metrics evaluation reports, the default model
    (``default_hf_config``) and dataset, the data fields it reads beside the common ones (``data_fields``),
    whether it has classes (``classification``: ``num_labels``), and ``build_data(spec, raw, seed, run_dir,
    tokenizer, num_labels, hints)``, which shapes a dataset's tables into its splits."""

    name: str
    auto_class: str
    head_mapping: str
    input_names: tuple[str, ...]
    per_token: bool  # labels per token (language models) or per row (classifiers)
    default_dataset: str
    default_hf_config: Mapping[str, Any]
    build_data: Callable[..., Any]
    metrics: tuple[str, ...]
    data_fields: tuple[str, ...] = ()
    shift: bool = False  # logits[t] predicts labels[t + 1] (causal language models)
    classification: bool = False
    top5: bool = False

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The mean loss over the batch's predicted rows or tokens, as the task's transformers heads compute it."""
        if self.per_token:
            flat, labels = _token_pairs(logits, batch["labels"], self.shift)
            return F.cross_entropy(flat.float(), labels, ignore_index=IGNORE)
        return F.cross_entropy(logits.float(), batch["labels"].to(logits.device))

    def meter(self, num_labels: int | None) -> ClassificationMeter | TokenMeter:
        if self.per_token:
            return TokenMeter(self.shift)
        return ClassificationMeter(num_labels, top5=self.top5)


_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Make ``task`` a value of ``model.task`` (a plug-in's task included); returns it."""
    if task.name in _TASKS and _TASKS[task.name] != task:
        raise UserError(f"a task named {task.name!r} is already registered")
    _TASKS[task.name] = task
    return task


def task_names() -> list[str]:
    """The registered tasks' names, built-in ones first."""
    return list(_TASKS)


def get_task(name: str) -> Task:
    """The registered task ``name``; a ``UserError`` listing the tasks otherwise."""
    if name not in _TASKS:
        raise UserError(f"task must be one of {', '.join(_TASKS)}; got {name!r}"[:300])
    return _TASKS[name]


class _Tasks(Mapping):
    """``TASKS[name]``: the registry as a read-only mapping."""

    def __getitem__(self, name: str) -> Task:
        return _TASKS[name]

    def __iter__(self):
        return iter(task_names())

    def __len__(self) -> int:
        return len(task_names())


TASKS: Mapping[str, Task] = _Tasks()
