"""``data=`` of a pass call given as a dataset: a registered or hub dataset's name, or a whole data section
(``{"dataset": "csv", "path": "texts.csv", "block_size": 128}``), built for the model's own task.

The task is the one whose transformers head the model is; a text task's tokenizer is the section's
``tokenizer``, else the model's own (its ``name_or_path`` directory); images take the model config's size
and channels. Nothing is written: the data lives in memory for the call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from mase_lite.errors import UserError
from mase_lite.train.data import build_data
from mase_lite.train.tasks import get_task, task_names


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


def dataset_data(section: str | dict[str, Any], model: nn.Module, seed: int = 0):
    """The data ``section`` (or the dataset it names) builds for ``model``'s task, as a run's data."""
    section = {"dataset": section} if isinstance(section, str) else dict(section)
    task = task_of(model)
    config = getattr(model, "config", None)
    if "tokenizer" in get_task(task).data_fields and section.get("tokenizer") is None:
        own = getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "")
        if not own or not Path(own).is_dir():
            raise UserError(f"data={section!r}: a {task} model needs its tokenizer to read text: give data.tokenizer "
                            "(the model's tokenizer directory or hub name)"[:300])
        section["tokenizer"] = own
    hints = {}
    if config is not None and "image_size" in get_task(task).data_fields:
        size = getattr(config, "image_size", None)
        hints = {"image_size": size[0] if isinstance(size, (list, tuple)) else size,
                 "num_channels": getattr(config, "num_channels", None)}
        hints = {k: v for k, v in hints.items() if v is not None}
    num_labels = getattr(config, "num_labels", None) if get_task(task).classification else None
    return build_data(section, task=task, seed=seed, num_labels=num_labels, hints=hints)
