"""A model's metrics on one split of the run's data, for the data's task.

Classifiers: accuracy, loss, per-class counts and the confusion matrix (images: top-5 too); language
models: the token-weighted loss over the whole split, its perplexity and next-token accuracy, beside
the best reachable perplexity when the data knows it. Batches stream through: memory does not grow
with the split.

Example::

    metrics = evaluate_model(mg.model, data, split="test", input_names=mg.input_names)
    metrics["accuracy"], metrics.get("perplexity")
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn as nn
from tqdm import tqdm

from mase_lite.workloads.perplexity import chunks, sliding
from mase_lite.workloads.batches import causal_logits, logits_of, model_device, model_inputs
from mase_lite.workloads.tasks import TASKS
from mase_lite.infra.progress import Ticker, bars_disabled


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode without gradients, its mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


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

    ``loss`` is the mean cross-entropy per row (classifiers) or per predicted token (language
    models, ``perplexity = exp(loss)``); ``per_class[c]`` counts rows labelled ``c`` (``support``),
    rows predicted ``c`` (``predicted``) and rows both (``correct``); ``confusion[true][predicted]``
    counts rows.
    """
    input_names = list(input_names or data.input_names)
    loader = data.loader(split, batch_size)
    device = model_device(model)
    meter = TASKS[data.task].meter(getattr(data, "num_labels", None))
    with evaluating(model):
        ticker = Ticker(f"evaluate {split}", len(loader), "batch")
        for batch in tqdm(loader, desc=f"evaluate {split}", unit="batch", disable=bars_disabled() if progress else True):
            meter.update(logits_of(model(**model_inputs(batch, input_names, device))), batch)
            if progress:
                ticker.tick()
    return {**meter.result(), "split": split, **data.reference_metrics(split)}


def stream_perplexity(model: nn.Module, ids: torch.Tensor, input_names: Sequence[str], protocol: str, context: int,
                      stride: int | None = None, bos: int | None = None, batch_size: int = 64) -> dict:
    """A causal LM's perplexity over the token stream ``ids`` by ``protocol`` (``sliding`` or ``chunks``; see
    :mod:`mase_lite.workloads.perplexity`), the model in eval mode and restored afterwards."""
    logits = causal_logits(model, input_names)
    with evaluating(model):
        if protocol == "sliding":
            return sliding(logits, ids, context, stride)
        return chunks(logits, ids, context, bos, batch=batch_size)
