"""Example inputs for a HF model, made from its config for the input names a user asks for.

Example::

    inputs = hf_example_inputs(model, ["input_ids", "attention_mask", "labels"])
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn as nn

from mase_lite.infra.errors import UserError

# An odd batch and sequence length keep export from confusing them with other sizes.
BATCH, SEQ = 3, 13
# Inputs whose dims 0 and 1 are (batch, sequence).
TOKEN_INPUTS = {
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "position_ids",
    "decoder_input_ids",
    "decoder_attention_mask",
    "inputs_embeds",
    "input_values",
}


def sequence_dims(inputs: dict[str, Any]) -> dict[str, dict[int, str]]:
    """Which dims of each input are the batch and the sequence.

    Dim 0 of every tensor is the batch; dim 1 of token inputs is the sequence, and so is dim 1
    of ``labels`` when it has the token inputs' length (per-token labels).

    >>> x = torch.zeros(2, 5, dtype=torch.long)
    >>> sequence_dims({"input_ids": x, "labels": x, "pixel_values": torch.zeros(2, 3, 4, 4)})
    {'input_ids': {0: 'batch', 1: 'seq'}, 'labels': {0: 'batch', 1: 'seq'}, 'pixel_values': {0: 'batch'}}
    """
    token_lengths = {
        v.shape[1] for k, v in inputs.items() if k in TOKEN_INPUTS and isinstance(v, torch.Tensor) and v.dim() >= 2
    }
    dims: dict[str, dict[int, str]] = {}
    for name, value in inputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        dims[name] = {0: "batch"}
        if value.dim() >= 2 and (name in TOKEN_INPUTS or (name == "labels" and value.shape[1] in token_lengths)):
            dims[name][1] = "seq"
    return dims


def _vocab(config) -> int:
    return int(getattr(config, "vocab_size", None) or 1000)


# Heads that predict one label per example; every other head with labels predicts one per position.
EXAMPLE_HEADS = (
    "ForSequenceClassification",
    "ForImageClassification",
    "ForImageClassificationWithTeacher",
    "ForAudioClassification",
    "ForMultipleChoice",
)


def _labels(model: nn.Module, gen: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """Labels shaped for the model's head: (batch,) per example, (batch, seq) per token."""
    config = model.config
    cls = type(model).__name__
    num_labels = int(getattr(config, "num_labels", 2))
    if cls.endswith(EXAMPLE_HEADS):
        if getattr(config, "problem_type", None) == "regression" or num_labels == 1:
            return torch.randn(batch, num_labels if num_labels > 1 else 1, generator=gen).squeeze(-1)
        if getattr(config, "problem_type", None) == "multi_label_classification":
            return torch.randint(0, 2, (batch, num_labels), generator=gen).float()
        return torch.randint(0, num_labels, (batch,), generator=gen)
    if cls.endswith("ForTokenClassification"):
        return torch.randint(0, num_labels, (batch, seq), generator=gen)
    if cls.endswith("ForCTC"):  # blank (0) is never a target
        return torch.randint(1, _vocab(config), (batch, max(1, seq // 4)), generator=gen)
    return torch.randint(0, _vocab(config), (batch, seq), generator=gen)


def _audio_samples(seq: int) -> int:
    return 32 * seq


def _makers(model: nn.Module, gen: torch.Generator, batch: int, seq: int, pad: bool) -> dict[str, Callable[[], torch.Tensor]]:
    config = model.config
    hidden = int(getattr(config, "hidden_size", getattr(config, "n_embd", 64)))
    channels = int(getattr(config, "num_channels", 3))
    size = getattr(config, "image_size", 32)
    size = size if isinstance(size, int) else size[0]

    def mask() -> torch.Tensor:
        m = torch.ones(batch, seq, dtype=torch.long)
        if pad and seq > 2:  # the first example is padded to half its length
            m[0, seq // 2 :] = 0
        return m

    def token_ids() -> torch.Tensor:
        """Random ids, each row ending with the end-of-text token and holding no other (encoder-decoder
        classifiers read the sentence at its one end-of-text token)."""
        ids = torch.randint(0, _vocab(config), (batch, seq), generator=gen)
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, int) and 0 <= eos < _vocab(config):
            ids[ids == eos] = (eos + 1) % _vocab(config)
            ids[:, -1] = eos
        return ids

    return {
        "input_ids": token_ids,
        "decoder_input_ids": lambda: torch.randint(0, _vocab(config), (batch, seq), generator=gen),
        "attention_mask": mask,
        "decoder_attention_mask": lambda: torch.ones(batch, seq, dtype=torch.long),
        "token_type_ids": lambda: torch.zeros(batch, seq, dtype=torch.long),
        "position_ids": lambda: torch.arange(seq).expand(batch, seq).clone(),
        "inputs_embeds": lambda: torch.randn(batch, seq, hidden, generator=gen),
        "pixel_values": lambda: torch.randn(batch, channels, size, size, generator=gen),
        "input_values": lambda: torch.randn(batch, _audio_samples(seq), generator=gen),
        "labels": lambda: _labels(model, gen, batch, seq),
    }


def forward_parameters(model: nn.Module) -> list[str]:
    """Names the model's forward accepts as keywords."""
    params = inspect.signature(model.forward).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def hf_example_inputs(
    model: nn.Module, names: list[str], seed: int = 0, batch: int = BATCH, seq: int = SEQ, pad: bool = False
) -> dict[str, Any]:
    """Example tensors for ``names``; a clear error for a name the model or mase_lite does not know.

    ``seq`` is the token length (audio gets ``32 * seq`` samples); ``pad`` masks out the second
    half of the first example's ``attention_mask``.
    """
    if not hasattr(model, "config"):
        raise UserError(
            f"hf_input_names needs a transformers model (one with a .config); {type(model).__name__} has none: "
            "pass example_inputs={name: tensor} instead"
        )
    accepted = forward_parameters(model)
    gen = torch.Generator().manual_seed(seed)
    makers = _makers(model, gen, batch, seq, pad)
    inputs: dict[str, Any] = {}
    for name in names:
        if name not in accepted:
            raise UserError(
                f"hf_input_names: {type(model).__name__}.forward takes no input {name!r}; "
                f"it accepts: {', '.join(accepted)}"
            )
        if name not in makers:
            raise UserError(
                f"hf_input_names: mase_lite cannot make an example for {name!r}; "
                f"supported names: {', '.join(makers)} (or pass example_inputs={{name: tensor}})"
            )
        inputs[name] = makers[name]()
    return inputs
