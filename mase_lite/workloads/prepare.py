"""Build a run's data and model from the spec's ``data`` and ``model`` sections.

Example::

    model, data = prepare(ModelSpec(), DataSpec(), Path("runs/x"), seed=0)
    mg = MaseGraph(model, hf_input_names=data.input_names)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.infra.limits import check_fits
from mase_lite.workloads.data import DataSpec, build_data
from mase_lite.workloads.hub import hub_access, hub_cache_dir
from mase_lite.workloads.models import ModelSpec, build_model, check_head
from mase_lite.workloads.seeding import seed_everything
from mase_lite.workloads.splits import SplitData
from mase_lite.workloads.tokenizer import load_tokenizer
from mase_lite.workloads.validation import validate_section
from mase_lite.infra.trust import trusted

logger = logging.getLogger(__name__)


def _positions(config) -> int | None:
    """The longest sequence a model's position embeddings cover (None: no limit known)."""
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


# memory per attention head and pair of tokens of one sequence: float32 scores and probabilities and their
# gradients (a lower bound: T5 training takes ~60 bytes, measured)
ATTENTION_BYTES = 16


def _length_field(data: SplitData) -> str:
    """The field that sets ``data.sequence_length``."""
    if data.task == "causal-lm":
        return "data.block_size"
    longer_target = getattr(data, "max_target_length", 0) > getattr(data, "max_length", 0)
    return "data.max_target_length" if longer_target else "data.max_length"


def _check_fit(model: nn.Module, data: SplitData) -> None:
    """The data's token ids and lengths fit the model's embeddings; a model without a limit on positions (relative
    ones, as T5's) has room for the attention of one sequence."""
    config = getattr(model, "config", None)
    length = getattr(data, "sequence_length", None)
    positions = _positions(config)
    if positions is not None and length is not None and length > positions:
        raise UserError(f"{_length_field(data)} = {length} exceeds the model's max_position_embeddings ({positions})")
    heads = getattr(config, "num_attention_heads", None)
    if positions is None and length is not None and isinstance(heads, int):
        check_fits(_length_field(data), ATTENTION_BYTES * heads * length**2,
                   f"the attention of one sequence of {length} tokens ({heads} heads)")
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and getattr(data, "tokenizer", None) is not None and data.vocab_size > vocab:
        raise UserError(
            f"the tokenizer has {data.vocab_size} tokens but the model's vocab_size is {vocab}; "
            "use the model's own tokenizer or a larger vocab_size"
        )


def image_hints(model_spec: ModelSpec, run_dir: Path) -> dict[str, Any]:
    """What the model fixes about its images: a config's ``image_size``/``num_channels``, and a pretrained
    model's image processor (its size, mean and standard deviation)."""
    hints = {k: v for k, v in (model_spec.hf_config or {}).items() if k in ("image_size", "num_channels")}
    if isinstance(hints.get("image_size"), (list, tuple)):
        hints["image_size"] = hints["image_size"][0]
    if model_spec.source != "pretrained":
        return hints
    from transformers import AutoConfig, AutoImageProcessor

    cache = None if Path(model_spec.pretrained).is_dir() else hub_cache_dir(model_spec.cache_dir, run_dir)
    with hub_access():
        try:
            config = AutoConfig.from_pretrained(model_spec.pretrained, cache_dir=cache, trust_remote_code=trusted())
        except (OSError, ValueError):
            return hints  # building the model says what is wrong with it
        try:
            processor = AutoImageProcessor.from_pretrained(model_spec.pretrained, cache_dir=cache, trust_remote_code=trusted())
        except (OSError, ValueError) as err:
            logger.info("no image processor for %s (%s); normalising with the data's statistics", model_spec.pretrained, err)
            processor = None
    size = getattr(config, "image_size", None)
    hints.setdefault("image_size", size[0] if isinstance(size, (list, tuple)) else size)
    hints.setdefault("num_channels", getattr(config, "num_channels", None))
    if processor is not None and getattr(processor, "image_mean", None) is not None:
        hints["normalisation"] = (list(processor.image_mean), list(processor.image_std))
        size = getattr(processor, "size", None) or {}
        side = size.get("height") or size.get("shortest_edge") if isinstance(size, dict) else None
        if side and not hints.get("image_size"):
            hints["image_size"] = side
    return {k: v for k, v in hints.items() if v is not None}


def data_fields(data: SplitData) -> dict[str, Any]:
    """The config fields the data decides: vocabulary and token ids, or image size and channels."""
    tok = getattr(data, "tokenizer", None)
    if tok is not None:
        return {"vocab_size": data.vocab_size, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id,
                "eos_token_id": tok.eos_token_id}
    if data.task == "image-classification":
        return {"image_size": data.image_size, "num_channels": data.channels}
    return {}


def prepare(
    model_spec: ModelSpec | dict | None,
    data_spec: DataSpec | dict | None,
    run_dir: str | Path,
    seed: int,
) -> tuple[nn.Module, SplitData | None]:
    """Data first (its tokenizer decides the vocabulary, its images the input size), then the seeded
    model; nothing is written under ``run_dir`` (the trained tokenizer, the tokenized tensors) until
    both were built.

    ``data_spec=None`` builds the model alone.
    """
    model_spec = validate_section(ModelSpec, model_spec, "model")
    check_head(model_spec)  # before the data: its images take the model's channels
    if data_spec is not None:
        data_spec = validate_section(DataSpec, data_spec, "data")
    run_dir = Path(run_dir)
    task = model_spec.task
    seed_everything(seed)
    data = None
    if data_spec is not None:
        tokenizer = None
        if model_spec.source == "pretrained" and data_spec.tokenizer is None and task != "image-classification":
            from mase_lite.importers.hub import read_tokenizer

            tokenizer = read_tokenizer(model_spec.pretrained) or load_tokenizer(  # a GGUF file holds its vocabulary
                model_spec.pretrained, hub_cache_dir(model_spec.cache_dir, run_dir), field="model.pretrained"
            )
        hints = image_hints(model_spec, run_dir) if task == "image-classification" else {}
        data = build_data(data_spec, task=task, seed=seed, run_dir=run_dir, tokenizer=tokenizer,
                          num_labels=model_spec.num_labels, hints=hints)
    num_labels = model_spec.num_labels or getattr(data, "num_labels", None) or 2
    fields = data_fields(data) if data is not None else {}
    model = build_model(model_spec, num_labels=num_labels, seed=seed, run_dir=run_dir, data_fields=fields)
    if data is not None:
        _check_fit(model, data)
        data.persist(run_dir)
    seed_everything(seed)
    return model, data
