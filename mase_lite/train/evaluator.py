"""Accuracy, loss and per-class counts of a classifier on one split of a :class:`DataModule`.

Example::

    metrics = evaluate_model(mg.model, data, split="test", input_names=mg.input_names)
    metrics["accuracy"], metrics["per_class"]["1"]["correct"]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from mase_lite.errors import UserError
from mase_lite.train.batches import logits_of, model_device, model_inputs


def evaluate_model(
    model: nn.Module,
    data,
    *,
    split: str = "test",
    batch_size: int = 64,
    input_names: Sequence[str] | None = None,
    progress: bool = True,
) -> dict:
    """Metrics of ``model`` (run in eval mode, restored afterwards) over every row of ``split``.

    ``loss`` is the mean cross-entropy per row; ``per_class[c]`` counts rows labelled ``c``
    (``support``), rows predicted ``c`` (``predicted``) and rows both (``correct``);
    ``confusion[true][predicted]`` counts rows.
    """
    input_names = list(input_names or data.input_names)
    loader = data.loader(split, batch_size)
    device = model_device(model)
    num_classes = data.num_labels
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)
    total_loss, rows = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in tqdm(loader, desc=f"evaluate {split}", unit="batch", disable=None if progress else True):
                logits = logits_of(model(**model_inputs(batch, input_names, device))).float()
                labels = batch["labels"].to(logits.device)
                if logits.ndim != 2 or logits.shape[-1] != num_classes:
                    raise UserError(
                        f"the model gives logits of shape {list(logits.shape)}; the data has {num_classes} classes, "
                        f"so [batch, {num_classes}] is expected"
                    )
                total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
                rows += len(labels)
                pairs = labels.cpu() * num_classes + logits.argmax(-1).cpu()
                confusion += torch.bincount(pairs, minlength=num_classes**2).reshape(num_classes, num_classes)
    finally:
        model.train(was_training)
    correct = confusion.diag()
    return {
        "accuracy": correct.sum().item() / rows,
        "loss": total_loss / rows,
        "n": rows,
        "split": split,
        "per_class": {
            str(c): {
                "support": int(confusion[c].sum()),
                "predicted": int(confusion[:, c].sum()),
                "correct": int(correct[c]),
            }
            for c in range(num_classes)
        },
        "confusion": confusion.tolist(),
    }
