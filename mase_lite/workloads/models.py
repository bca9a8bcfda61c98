"""The ``model`` section of a pipeline spec: a HF config, a pretrained checkpoint, or a factory.

Example::

    ModelSpec()                                                   # bert-tiny's shape, from scratch
    ModelSpec(hf_config={"num_hidden_layers": 4}, num_labels=3)
    ModelSpec(task="causal-lm", hf_config={"model_type": "qwen3", "hidden_size": 256, ...})
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
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mase_lite.infra.errors import UserError, short
from mase_lite.infra.limits import check_fits, model_bytes
from mase_lite.infra.trust import call_factory, trusted
from mase_lite.workloads.hub import hub_access, hub_cache_dir
from mase_lite.workloads.tasks import get_task, task_names
from mase_lite.workloads.validation import validate_section

logger = logging.getLogger(__name__)

# config fields the run's data decides unless hf_config gives them; token ids may be absent from a config's defaults
TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
_BYTES_PER_LABEL_NAME = 200  # a config's id2label and label2id entries, as Python objects


def head_model_types(task: str) -> list[str]:
    """The ``model_type`` values transformers can build a ``task`` head for."""
    from transformers.models.auto import modeling_auto

    return sorted(getattr(modeling_auto, get_task(task).head_mapping))


class ModelSpec(BaseModel):
    """What model a run builds for its ``task``. With no source given, a small model from scratch: a BERT of
    bert-tiny's shape (sequence-classification), a Llama (causal-lm), a ResNet (image-classification), a T5
    (seq2seq-lm).

    Exactly one of ``hf_config`` (``model_type`` defaults to the task's; ``vocab_size``, token ids,
    ``image_size`` and ``num_channels`` default to the run's data), ``pretrained`` or ``factory``
    (``"package.module:function"`` called with ``kwargs``, returning an ``nn.Module`` that takes the
    task's inputs by name and returns logits or an object with ``.logits``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hf_config: dict[str, Any] | None = Field(
        None, description="transformers config fields (model_type defaults to the task's: bert, llama, resnet, t5)"
    )
    pretrained: str | None = Field(None, description="hub model name, local directory (a compressed-tensors one "
                                   "included) or GGUF file")
    factory: str | None = Field(None, description="'package.module:function' returning an nn.Module for the task")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the factory")
    task: str = Field(
        "sequence-classification", description="what the model predicts (sequence-classification, causal-lm, "
        "image-classification, seq2seq-lm or a plug-in's): the head of a transformers model, the loss and metrics of "
        "train and evaluate, the shape of the data"
    )
    num_labels: int | None = Field(None, ge=1, description="classifiers: classes (default: the data's, else 2)")
    attn_implementation: Literal["sdpa", "eager"] = Field("sdpa", description="transformers attention kernel")
    cache_dir: str | None = Field(None, description="hub download cache (default: <run dir>/hf_cache)")
    stream: bool = Field(False, description="keep a local safetensors directory's weights on disk: the model is built "
                         "without them and the steps that stream (quantize, gptq, export) load one decoder block at a "
                         "time, so a model larger than the free memory can be quantized (needs capture: modules)")

    @field_validator("task")
    @classmethod
    def _registered(cls, task: str) -> str:
        if task not in task_names():
            raise ValueError(f"task must be one of {', '.join(task_names())}; got {task!r}"[:300])
        return task

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        given = [k for k in ("hf_config", "pretrained", "factory") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of hf_config, pretrained, factory; got {', '.join(given)}")
        if self.kwargs and self.factory is None:
            raise ValueError("'kwargs' is for 'factory' models only")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"factory must look like 'package.module:function', got {self.factory!r}")
        if self.stream and self.pretrained is None:
            raise ValueError("stream reads a local safetensors directory: give it as pretrained")
        if self.num_labels is not None and not get_task(self.task).classification:
            raise ValueError(f"num_labels is for classifiers; a {self.task} model predicts tokens")
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


def check_head(spec: ModelSpec) -> None:
    """A ``hf_config`` model type that transformers knows and can build the task's head for, dropout probabilities in
    [0, 1), images of 1 or 3 channels, and classes whose names and confusion matrix fit in memory."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if spec.hf_config is None and spec.source != "hf_config":
        return
    model_type = (spec.hf_config or {}).get("model_type", get_task(spec.task).default_hf_config["model_type"])
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise UserError(f"model.hf_config.model_type = {model_type!r} is not a transformers model type")
    if model_type not in head_model_types(spec.task):
        raise UserError(
            f"model.hf_config.model_type = {model_type!r}: transformers has no {spec.task} head for {model_type} "
            f"(model.task); model types with one: {', '.join(head_model_types(spec.task))}"
        )
    for key, value in (spec.hf_config or {}).items():
        if key.endswith(("dropout", "dropout_prob", "dropout_rate")) and value is not None and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1):
            raise UserError(f"model.hf_config.{key} = {value!r}: a dropout probability is a number in [0, 1)")
    channels = (spec.hf_config or {}).get("num_channels", 3)
    if channels not in (1, 3) or isinstance(channels, bool):
        raise UserError(f"model.hf_config.num_channels = {channels!r}: images have 1 (grey) or 3 (colour) channels")
    if spec.num_labels is not None:
        check_fits("model.num_labels", spec.num_labels * _BYTES_PER_LABEL_NAME + 8 * spec.num_labels**2,
                   f"the names of {spec.num_labels} labels and their confusion matrix")


def _hf_config(spec: ModelSpec, num_labels: int, data_fields: dict[str, Any]):
    """A transformers config from ``spec.hf_config`` with unknown keys rejected; fields the data decides
    (vocabulary, token ids, image size and channels) are filled in unless given."""
    from transformers import AutoConfig

    check_head(spec)
    task_config = get_task(spec.task).default_hf_config
    fields = dict(task_config if spec.hf_config is None else spec.hf_config)
    model_type = fields.pop("model_type", task_config["model_type"])
    defaults = AutoConfig.for_model(model_type).to_dict()
    if "num_labels" in fields:
        raise UserError("give the number of classes as model.num_labels", location=("model", "hf_config", "num_labels"))
    unknown = sorted(set(fields) - set(defaults) - set(TOKEN_FIELDS))
    if unknown:
        allowed = ", ".join(sorted(k for k in defaults if not k.startswith("_")))
        raise UserError(f"unknown {model_type} config key(s) {', '.join(unknown)}; allowed: {allowed}", location=("model", "hf_config"))
    for key, value in fields.items():  # sizes and counts (positive by default) stay positive
        default = defaults.get(key)
        if _is_int(default) and default > 0 and _is_int(value) and value < 1:
            raise UserError(f"model.hf_config.{key} = {value}: must be at least 1 ({model_type}'s default is {default})")

    vocab_size = data_fields.get("vocab_size")
    if vocab_size is not None and "vocab_size" in defaults:
        given = fields.setdefault("vocab_size", vocab_size)
        if _is_int(given) and given < vocab_size:
            raise UserError(
                f"model.hf_config.vocab_size = {given} is smaller than the tokenizer's vocabulary ({vocab_size} tokens)"
            )
    for key in ("image_size", "num_channels"):
        if key in data_fields and key in defaults:
            fields.setdefault(key, data_fields[key])
    tokens = {k: data_fields[k] for k in TOKEN_FIELDS if data_fields.get(k) is not None and k not in fields}
    if get_task(spec.task).classification:
        check_fits("model.num_labels", num_labels * _BYTES_PER_LABEL_NAME + 8 * num_labels**2,
                   f"the names of {num_labels} labels and their confusion matrix")
        fields["num_labels"] = num_labels
    vocab = fields.get("vocab_size", defaults.get("vocab_size"))
    _check_token_ids(fields, vocab)
    for key in TOKEN_FIELDS:  # a default id past the run's vocabulary (GPT-2's 50256): the data's token, else none
        if key not in fields and _is_int(defaults.get(key)) and _is_int(vocab) and defaults[key] >= vocab:
            fields[key] = tokens.pop(key, None)
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except Exception as err:  # the config's own field checks (ValueError, TypeError, huggingface_hub's strict dataclasses)
        raise UserError(f"not a valid {model_type} config: {err}", location=("model", "hf_config")) from None
    if getattr(config, "is_encoder_decoder", False) and "decoder_start_token_id" not in fields:
        # T5 starts decoding at the padding token, BART at the end-of-text token
        start = "eos_token_id" if defaults.get("decoder_start_token_id") == defaults.get("eos_token_id") is not None else "pad_token_id"
        tokens["decoder_start_token_id"] = tokens.get(start, getattr(config, start, None))
    for key, value in tokens.items():
        setattr(config, key, value)
    return config


def _check_token_ids(fields: dict[str, Any], vocab: Any) -> None:
    """The token ids ``fields`` gives are ids of the vocabulary: 0 .. vocab_size - 1 (a list of them, or null)."""
    top = vocab - 1 if _is_int(vocab) else None
    for key in TOKEN_FIELDS:
        value = fields.get(key)
        ids = value if isinstance(value, list) else [value]
        if value is not None and not all(_is_int(i) and 0 <= i and (top is None or i <= top) for i in ids):
            span = f"0 .. {top} (vocab_size {vocab})" if top is not None else "0 or more"
            raise UserError(f"model.hf_config.{key} = {short(value)}: a token id is an integer {span}, or null")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _auto_class(task: str):
    import transformers

    return getattr(transformers, get_task(task).auto_class)


def _attention(auto, config, requested: str) -> dict[str, str]:
    """``attn_implementation`` for models with attention (an SDPA request is dropped where the model has none)."""
    try:
        cls = auto._model_mapping[type(config)]
    except KeyError:
        return {"attn_implementation": requested}
    if requested == "sdpa" and not getattr(cls, "_supports_sdpa", False):
        return {}
    return {"attn_implementation": requested}


def _from_config(spec: ModelSpec, num_labels: int, data_fields: dict[str, Any]) -> nn.Module:
    config = _hf_config(spec, num_labels, data_fields)
    auto = _auto_class(spec.task)
    attention = _attention(auto, config, spec.attn_implementation)

    def build(config) -> nn.Module:
        return auto.from_config(config, **attention)

    check_fits("model.hf_config", model_bytes(build, config, "model.hf_config"), f"a {config.model_type} model of this config")
    try:
        return build(config)
    except ValueError as err:
        raise UserError(f"{config.model_type} cannot build a {spec.task} model: {err}", location=("model", "hf_config")) from None


def _pretrained(spec: ModelSpec, num_labels: int, run_dir: Path | None, data_fields: dict[str, Any]) -> nn.Module:
    from mase_lite.importers.hub import kind_of, read_model

    if kind_of(spec.pretrained) is not None:  # another tool's quantized checkpoint: its layers in our formats
        if spec.stream:
            raise UserError(f"model.stream: {spec.pretrained} is a quantized checkpoint; stream a float safetensors directory")
        return read_model(spec.pretrained, _auto_class(spec.task))
    model = _streamed(spec, run_dir) if spec.stream else _loaded(spec, num_labels, run_dir)
    if getattr(model.config, "pad_token_id", None) is None and data_fields.get("pad_token_id") is not None:
        model.config.pad_token_id = data_fields["pad_token_id"]  # decoders used as classifiers find the last token by it
    return model


def _loaded(spec: ModelSpec, num_labels: int, run_dir: Path | None) -> nn.Module:
    from transformers import AutoConfig

    local = Path(spec.pretrained).is_dir()
    cache = None if local else hub_cache_dir(spec.cache_dir, run_dir)
    extra = {"num_labels": num_labels, "ignore_mismatched_sizes": True} if get_task(spec.task).classification else {}
    auto = _auto_class(spec.task)
    try:
        with hub_access():
            config = AutoConfig.from_pretrained(spec.pretrained, cache_dir=cache, trust_remote_code=trusted())
            attention = _attention(auto, config, spec.attn_implementation)
            check_fits("model.pretrained", model_bytes(lambda c: auto.from_config(c, **attention), config,
                                                       "model.pretrained"), f"a {config.model_type} model of this config")
            model, info = auto.from_pretrained(
                spec.pretrained, cache_dir=cache, trust_remote_code=trusted(), **attention, **extra,
                output_loading_info=True,
            )
        _check_loaded(spec.pretrained, info)
    except UserError:
        raise
    except Exception as err:  # its files are data: a config of the wrong types or sizes (transformers' and
        # huggingface_hub's checks), damaged safetensors, torch refusing a pickle, a directory that is not a model
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        reason = (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])[:200]  # "field 'x':" and what of it
        raise UserError(
            f"model.pretrained = {spec.pretrained!r}: could not load it ({reason}). Offline, give a local "
            "directory or use model.hf_config"
        ) from None
    return model


def _check_loaded(pretrained: str, info: dict[str, Any]) -> None:
    """Refuse a checkpoint holding, for a module, other tensors than the weights it lacks (a quantized checkpoint
    whose config.json has no quantization_config: transformers would leave those layers at random)."""
    stored = {key.rpartition(".")[0]: key for key in info["unexpected_keys"]}
    for key in sorted(info["missing_keys"]):
        if key.rpartition(".")[0] in stored:
            raise UserError(f"model.pretrained = {pretrained!r}: the checkpoint holds {stored[key.rpartition('.')[0]]} "
                            f"but not {key}, which would be left at random (quantized weights whose config.json has no "
                            "quantization_config?)")


def _streamed(spec: ModelSpec, run_dir: Path | None) -> nn.Module:
    """The model of a local safetensors directory built on the meta device, its tensors left on disk
    (:mod:`mase_lite.runtime.disk_weights`; what passes change is written under ``<run dir>/stream``)."""
    from transformers import AutoConfig

    from mase_lite.runtime.disk_weights import ATTRIBUTE, DiskWeights

    if not Path(spec.pretrained).is_dir():
        raise UserError(f"model.stream reads a local safetensors directory; {spec.pretrained!r} is not a directory")
    if run_dir is None:
        raise UserError("model.stream writes the blocks it changes into the run's directory: give run_dir")
    if get_task(spec.task).classification:
        raise UserError("model.stream: a classifier's new head has no weights on disk; stream language models")
    auto = _auto_class(spec.task)
    try:
        config = AutoConfig.from_pretrained(spec.pretrained, trust_remote_code=trusted())
        with torch.device("meta"):
            model = auto.from_config(config, **_attention(auto, config, spec.attn_implementation))
    except Exception as err:  # the config is data: transformers' and huggingface_hub's checks
        raise UserError(f"model.pretrained = {spec.pretrained!r}: could not build its model ({str(err).splitlines()[0][:200]})") from None
    for key, buffer in list(model.named_non_persistent_buffers()):  # computed (rotary frequencies), not on disk
        owner, _, attr = key.rpartition(".")
        model.get_submodule(owner)._buffers[attr] = torch.empty_like(buffer, device="cpu")
    model.initialize_weights()  # fills the computed buffers; the meta parameters cost nothing
    setattr(model, ATTRIBUTE, DiskWeights(model, spec.pretrained, Path(run_dir) / "stream"))
    return model


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
    data_fields: dict[str, Any] | None = None,
) -> nn.Module:
    """A freshly built (seeded) or loaded model in eval mode.

    ``data_fields`` (the run's data: ``vocab_size``, token ids, ``image_size``, ``num_channels``) fill a
    ``hf_config``'s fields it does not give; ``vocab_size`` alone may be given for a tokenizer's size.
    """
    spec = validate_section(ModelSpec, spec, "model")
    data_fields = dict(data_fields or {})
    if vocab_size is not None:
        data_fields["vocab_size"] = vocab_size
    torch.manual_seed(seed)
    if spec.source == "factory":
        model = _factory(spec)
    elif spec.source == "pretrained":
        model = _pretrained(spec, num_labels, run_dir, data_fields)
    else:
        model = _from_config(spec, num_labels, data_fields)
    logger.info("built %s (%d parameters)", type(model).__name__, sum(p.numel() for p in model.parameters()))
    return model.eval()
