"""``data=`` of a pass call given as a dataset: a registered or hub dataset's name, or a whole data section
(``{"dataset": "csv", "path": "texts.csv", "block_size": 128}``), built for the model's own task.

The task is the one whose transformers head the model is; a text task's tokenizer is the section's
``tokenizer``, else the model's own (its ``name_or_path`` directory), else — a model built from a config in
Python has none — one trained on the data, within the model's ``vocab_size``; images take the model config's
size and channels. Nothing is written: the data lives in memory for the call.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.workloads.data import DataSpec, build_data
from mase_lite.workloads.tasks import get_task, task_names

logger = logging.getLogger(__name__)


def task_of(model: nn.Module) -> str:
    """The registered task whose transformers head ``model`` is; a ``UserError`` for any other model."""
    from transformers.models.auto import modeling_auto

    name = type(model).__name__
    for task in task_names():
        heads = getattr(modeling_auto, get_task(task).head_mapping, {}).values()
        if any(name == h or (isinstance(h, (tuple, list)) and name in h) for h in heads):
            return task
    raise UserError(f"data= names a dataset, which is built for a transformers model's task; a {name} has none: "
                    "give a list of model-input dicts instead")


def _fit_trained_vocabulary(section: dict[str, Any], config) -> None:
    """A model built from a config (no ``name_or_path``) has no tokenizer: the data trains one, as a run does for
    a model of ``hf_config``, its vocabulary no larger than the model's ``vocab_size``."""
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):
        return
    default = DataSpec.model_fields["vocab_size"].default
    asked = section.get("vocab_size")
    if isinstance(asked, int) and asked > vocab:
        raise UserError(f"data.vocab_size = {asked} exceeds the model's vocab_size ({vocab}); give at most {vocab}, "
                        "or data.tokenizer")
    section.setdefault("vocab_size", min(default, vocab))
    logger.info("the model has no tokenizer (it was built from a config): training a WordPiece tokenizer of at most "
                "%d tokens on the data (give data.tokenizer to use another)", section["vocab_size"])


def dataset_data(section: str | dict[str, Any], model: nn.Module, seed: int = 0):
    """The data ``section`` (or the dataset it names) builds for ``model``'s task, as a run's data."""
    section = {"dataset": section} if isinstance(section, str) else dict(section)
    task = task_of(model)
    config = getattr(model, "config", None)
    if "tokenizer" in get_task(task).data_fields and section.get("tokenizer") is None:
        own = getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "")
        if own:
            if not Path(own).is_dir():
                raise UserError(f"data={section!r}: a {task} model needs its tokenizer to read text: give data.tokenizer "
                                f"(the model's tokenizer directory or hub name; it was loaded from {own!r})"[:300])
            section["tokenizer"] = own
        else:
            _fit_trained_vocabulary(section, config)
    hints = {}
    if config is not None and "image_size" in get_task(task).data_fields:
        size = getattr(config, "image_size", None)
        hints = {"image_size": size[0] if isinstance(size, (list, tuple)) else size,
                 "num_channels": getattr(config, "num_channels", None)}
        hints = {k: v for k, v in hints.items() if v is not None}
    num_labels = getattr(config, "num_labels", None) if get_task(task).classification else None
    return build_data(section, task=task, seed=seed, num_labels=num_labels, hints=hints)
