"""Running a model on a batch of a :class:`DataModule`: the inputs it takes, its loss and logits.

Works for a captured graph (which takes exactly its captured inputs) and a plain model alike.

Example::

    loss, logits = forward_batch(mg.model, batch, mg.input_names)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from mase_lite.infra.errors import UserError


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def model_inputs(batch: dict[str, torch.Tensor], input_names: Sequence[str], device: torch.device) -> dict:
    """The tensors of ``batch`` that the model takes, on ``device``; a clear error for a missing one."""
    missing = [n for n in input_names if n not in batch]
    if missing:
        raise UserError(
            f"the model takes input(s) {', '.join(missing)} that the data does not provide "
            f"(it provides {', '.join(batch)}); capture the graph with the data's inputs"
        )
    return {n: batch[n].to(device, non_blocking=True) for n in input_names}


def logits_of(outputs) -> torch.Tensor:
    """The scores in a model's output: ``.logits``, a ``"logits"`` entry or a bare tensor."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, dict):
        logits = outputs.get("logits")
    if not isinstance(logits, torch.Tensor):
        raise UserError(f"cannot find logits in the model's output ({type(outputs).__name__}); "
                        "return a tensor or an object with .logits")
    return logits


def logit_inputs(mg, data) -> list[str]:
    """What a forward for a causal LM's logits feeds ``mg``: a captured graph its captured inputs; modules the ids
    alone (labels would add a loss over the whole vocabulary)."""
    if mg.model is getattr(mg, "source_model", mg.model):
        return ["input_ids"]
    return list(mg.input_names or data.input_names)


def causal_logits(model: nn.Module, input_names: Sequence[str]):
    """``ids -> logits`` of a causal LM over token ids ``[batch, length]`` (on the CPU) fed as ``input_names``
    (a graph's captured inputs): the attention mask all ones, the labels the ids."""
    device = model_device(model)

    def logits(ids: torch.Tensor) -> torch.Tensor:
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        return logits_of(model(**model_inputs(batch, input_names, device))).cpu()
    return logits


def loss_of(outputs) -> torch.Tensor | None:
    """The loss a model computed itself (``.loss`` or a ``"loss"`` entry), if any."""
    loss = getattr(outputs, "loss", None)
    if loss is None and isinstance(outputs, dict):
        loss = outputs.get("loss")
    return loss


def forward_batch(
    model: nn.Module, batch: dict[str, torch.Tensor], input_names: Sequence[str], task: str = "sequence-classification"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, logits)`` for ``batch``: the model's own loss when it computes one, else the task's loss."""
    from mase_lite.workloads.tasks import TASKS

    device = model_device(model)
    outputs = model(**model_inputs(batch, input_names, device))
    logits = logits_of(outputs)
    loss = loss_of(outputs)
    if loss is None:
        loss = TASKS[task].loss(logits, batch)
    return loss, logits


class GivenBatches:
    """Batches given as they are (model-input dicts), seen as the run's data by the passes that take data:
    every split and batch size gives these batches, in order.

    >>> data = GivenBatches([{"input_ids": torch.tensor([[1, 2]])}])
    >>> data.input_names, len(list(data.loader("train", 8)))
    (['input_ids'], 1)
    """

    def __init__(self, batches: list[dict]):
        self.batches = batches
        self.input_names = [k for k, v in batches[0].items() if isinstance(v, torch.Tensor)]

    def loader(self, split: str, batch_size: int, shuffle: bool = False, seed: int = 0) -> list[dict]:
        return self.batches


def as_data(data, model: nn.Module | None = None):
    """``data=`` of a pass call: the pipeline's data (an object with ``loader(split, batch_size)``, passed on), a
    list of model-input dicts (the batches, as :class:`GivenBatches`), or a dataset — its name or a data section
    dict — built for ``model``'s task (:mod:`mase_lite.workloads.named_data`); a number, a tensor or a list of
    other things is refused in one line."""
    if isinstance(data, (list, tuple)) and data and all(isinstance(b, dict) and b for b in data):
        return GivenBatches(list(data))
    section = isinstance(data, dict) and data and not any(isinstance(v, torch.Tensor) for v in data.values())
    if (isinstance(data, str) and data.strip()) or section:
        if model is None:
            raise UserError("data= names a dataset: the pass needs the model to build it for")
        from mase_lite.workloads.named_data import dataset_data

        return dataset_data(data, model)
    if isinstance(data, (list, tuple, dict, str, bytes, int, float, torch.Tensor)):
        raise UserError(f"data= takes the run's data (a DataModule, e.g. result.data), a list of model-input dicts "
                        f"(batches such as {{'input_ids': tensor}}) or a dataset (a name, or a data section such as "
                        f"{{'dataset': 'csv', 'path': 'texts.csv'}}), got {type(data).__name__}")
    return data
