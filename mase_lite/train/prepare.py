"""Build a run's data and model from the spec's ``data`` and ``model`` sections.

Example::

    model, data = prepare(ModelSpec(), DataSpec(), Path("runs/x"), seed=0)
    mg = MaseGraph(model, hf_input_names=data.input_names)
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch.nn as nn

from mase_lite.errors import UserError
from mase_lite.train.data import DataModule, DataSpec, build_data
from mase_lite.train.hub import hub_cache_dir
from mase_lite.train.models import ModelSpec, build_model
from mase_lite.train.seeding import seed_everything
from mase_lite.train.tokenizer import load_tokenizer
from mase_lite.train.validation import validate_section

logger = logging.getLogger(__name__)


def _check_fit(model: nn.Module, data: DataModule) -> None:
    """The data's token ids and lengths fit the model's embeddings."""
    config = getattr(model, "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and data.max_length > positions:
        raise UserError(f"data.max_length = {data.max_length} exceeds the model's max_position_embeddings ({positions})")
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and data.vocab_size > vocab:
        raise UserError(
            f"the tokenizer has {data.vocab_size} tokens but the model's vocab_size is {vocab}; "
            "use the model's own tokenizer or a larger vocab_size"
        )


def prepare(
    model_spec: ModelSpec | dict | None,
    data_spec: DataSpec | dict | None,
    run_dir: str | Path,
    seed: int,
) -> tuple[nn.Module, DataModule | None]:
    """Data first (its tokenizer decides the vocabulary), then the seeded model; nothing is written
    under ``run_dir`` (the trained tokenizer, the tokenized tensors) until both were built.

    ``data_spec=None`` builds the model alone.
    """
    model_spec = validate_section(ModelSpec, model_spec, "model")
    if data_spec is not None:
        data_spec = validate_section(DataSpec, data_spec, "data")
    run_dir = Path(run_dir)
    seed_everything(seed)
    data = None
    if data_spec is not None:
        tokenizer = None
        if model_spec.source == "pretrained" and data_spec.tokenizer is None:
            tokenizer = load_tokenizer(
                model_spec.pretrained, hub_cache_dir(model_spec.cache_dir, run_dir), field="model.pretrained"
            )
        data = build_data(data_spec, seed=seed, run_dir=run_dir, tokenizer=tokenizer, num_labels=model_spec.num_labels)
    num_labels = model_spec.num_labels or (data.num_labels if data is not None else 2)
    vocab_size = data.vocab_size if data is not None and model_spec.source == "hf_config" else None
    model = build_model(model_spec, num_labels=num_labels, vocab_size=vocab_size, seed=seed, run_dir=run_dir)
    if data is not None:
        _check_fit(model, data)
        data.persist(run_dir)
    seed_everything(seed)
    return model, data
