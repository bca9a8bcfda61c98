"""The ``model`` section of a pipeline spec: a HF config, a pretrained checkpoint, or a factory.

Example::

    ModelSpec()                                                   # bert-tiny's shape, from scratch
    ModelSpec(hf_config={"num_hidden_layers": 4}, num_labels=3)
    ModelSpec(pretrained="prajjwal1/bert-tiny")                   # hub name or local directory
    ModelSpec(factory="my_pkg.nets:make_cnn", kwargs={"width": 32})
    model = build_model(ModelSpec(), num_labels=2, vocab_size=200, seed=0)
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn as nn
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mase_lite.errors import UserError
from mase_lite.limits import check_fits, model_bytes
from mase_lite.trust import call_factory
from mase_lite.train.hub import hub_access, hub_cache_dir
from mase_lite.train.validation import validate_section

logger = logging.getLogger(__name__)

DEFAULT_HF_CONFIG: dict[str, Any] = {
    "model_type": "bert",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 512,
}
Task = Literal["sequence-classification"]
_BYTES_PER_LABEL_NAME = 200  # a config's id2label and label2id entries, as Python objects


class ModelSpec(BaseModel):
    """What model a run builds. With no source given: a BERT of bert-tiny's shape, from scratch.

    Exactly one of ``hf_config`` (``model_type`` defaults to ``"bert"``; ``vocab_size`` defaults to
    the trained tokenizer's size), ``pretrained`` or ``factory`` (``"package.module:function"``
    called with ``kwargs``, returning an ``nn.Module``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hf_config: dict[str, Any] | None = Field(None, description="transformers config fields (model_type defaults to bert)")
    pretrained: str | None = Field(None, description="hub model name or local directory")
    factory: str | None = Field(None, description="'package.module:function' returning an nn.Module")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the factory")
    task: Task = Field("sequence-classification", description="the head on top of a transformers model")
    num_labels: int | None = Field(None, ge=1, description="classes (default: the data's, else 2)")
    attn_implementation: Literal["sdpa", "eager"] = Field("sdpa", description="transformers attention kernel")
    cache_dir: str | None = Field(None, description="hub download cache (default: <run dir>/hf_cache)")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        given = [k for k in ("hf_config", "pretrained", "factory") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of hf_config, pretrained, factory; got {', '.join(given)}")
        if self.kwargs and self.factory is None:
            raise ValueError("'kwargs' is for 'factory' models only")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"factory must look like 'package.module:function', got {self.factory!r}")
        return self

    @property
    def source(self) -> Literal["hf_config", "pretrained", "factory"]:
        if self.pretrained is not None:
            return "pretrained"
        if self.factory is not None:
            return "factory"
        return "hf_config"

    def recipe(self) -> dict[str, Any] | None:
        """How ``MaseGraph.load`` rebuilds a factory model; transformers models describe themselves."""
        if self.factory is None:
            return None
        return {"factory": self.factory, "kwargs": dict(self.kwargs)}


def _hf_config(spec: ModelSpec, num_labels: int, vocab_size: int | None):
    """A transformers config from ``spec.hf_config`` with unknown keys rejected."""
    from transformers import AutoConfig

    fields = dict(DEFAULT_HF_CONFIG if spec.hf_config is None else spec.hf_config)
    model_type = fields.pop("model_type", "bert")
    try:
        defaults = AutoConfig.for_model(model_type).to_dict()
    except ValueError:
        raise UserError(f"model.hf_config.model_type = {model_type!r} is not a transformers model type") from None
    if "num_labels" in fields:
        raise UserError("model.hf_config.num_labels: give the number of classes as model.num_labels")
    unknown = sorted(set(fields) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(k for k in defaults if not k.startswith("_")))
        raise UserError(f"model.hf_config: unknown {model_type} config key(s) {', '.join(unknown)}; allowed: {allowed}")
    for key, value in fields.items():  # sizes and counts (positive by default) stay positive
        default = defaults[key]
        if _is_int(default) and default > 0 and _is_int(value) and value < 1:
            raise UserError(f"model.hf_config.{key} = {value}: must be at least 1 ({model_type}'s default is {default})")
    if vocab_size is not None:
        given = fields.setdefault("vocab_size", vocab_size)
        if given < vocab_size:
            raise UserError(
                f"model.hf_config.vocab_size = {given} is smaller than the tokenizer's vocabulary ({vocab_size} tokens)"
            )
    check_fits("model.num_labels", num_labels * _BYTES_PER_LABEL_NAME, f"the names of {num_labels} labels")
    try:
        return AutoConfig.for_model(model_type, num_labels=num_labels, **fields)
    except Exception as err:  # the config's own field checks (ValueError, TypeError, huggingface_hub's strict dataclasses)
        raise UserError(f"model.hf_config: not a valid {model_type} config: {err}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _from_config(spec: ModelSpec, num_labels: int, vocab_size: int | None) -> nn.Module:
    from transformers import AutoModelForSequenceClassification

    config = _hf_config(spec, num_labels, vocab_size)

    def build() -> nn.Module:
        return AutoModelForSequenceClassification.from_config(config, attn_implementation=spec.attn_implementation)

    check_fits("model.hf_config", model_bytes(build, "model.hf_config"), f"a {config.model_type} model of this config")
    try:
        return build()
    except ValueError as err:
        raise UserError(f"model.hf_config: {config.model_type} cannot build a sequence classifier: {err}") from None


def _pretrained(spec: ModelSpec, num_labels: int, run_dir: Path | None) -> nn.Module:
    from transformers import AutoModelForSequenceClassification

    local = Path(spec.pretrained).is_dir()
    cache = None if local else hub_cache_dir(spec.cache_dir, run_dir)
    try:
        with hub_access():
            return AutoModelForSequenceClassification.from_pretrained(
                spec.pretrained,
                num_labels=num_labels,
                attn_implementation=spec.attn_implementation,
                cache_dir=cache,
                ignore_mismatched_sizes=True,
            )
    except (OSError, ValueError) as err:
        reason = (str(err).splitlines() or [err.__class__.__name__])[0]
        raise UserError(
            f"model.pretrained = {spec.pretrained!r}: could not load it ({reason}). Offline, give a local "
            "directory or use model.hf_config"
        ) from None


def _factory(spec: ModelSpec) -> nn.Module:
    module_name, _, attr = spec.factory.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise UserError(f"model.factory = {spec.factory!r}: cannot import it ({err})") from None
    return call_factory(fn, spec.factory, spec.kwargs)


def build_model(
    spec: ModelSpec | dict | None = None,
    *,
    num_labels: int = 2,
    vocab_size: int | None = None,
    seed: int = 0,
    run_dir: Path | None = None,
) -> nn.Module:
    """A freshly built (seeded) or loaded model in eval mode.

    ``vocab_size`` (a trained tokenizer's size) fills ``hf_config.vocab_size`` when it is absent.
    """
    spec = validate_section(ModelSpec, spec, "model")
    torch.manual_seed(seed)
    if spec.source == "factory":
        model = _factory(spec)
    elif spec.source == "pretrained":
        model = _pretrained(spec, num_labels, run_dir)
    else:
        model = _from_config(spec, num_labels, vocab_size)
    logger.info("built %s (%d parameters)", type(model).__name__, sum(p.numel() for p in model.parameters()))
    return model.eval()
