"""Example inputs for a HF model, made from its config for the input names a user asks for.

Example::

    inputs = hf_example_inputs(model, ["input_ids", "attention_mask", "labels"])
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import torch.nn as nn

from mase_lite.errors import UserError

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
}


def _vocab(config) -> int:
    return int(getattr(config, "vocab_size", None) or 1000)


def _labels(model: nn.Module, gen: torch.Generator) -> torch.Tensor:
    config = model.config
    cls = type(model).__name__
    if cls.endswith("ForSequenceClassification"):
        num_labels = int(getattr(config, "num_labels", 2))
        if getattr(config, "problem_type", None) == "regression" or num_labels == 1:
            return torch.randn(BATCH, num_labels if num_labels > 1 else 1, generator=gen).squeeze(-1)
        if getattr(config, "problem_type", None) == "multi_label_classification":
            return torch.randint(0, 2, (BATCH, num_labels), generator=gen).float()
        return torch.randint(0, num_labels, (BATCH,), generator=gen)
    if cls.endswith(("ForTokenClassification",)):
        return torch.randint(0, int(config.num_labels), (BATCH, SEQ), generator=gen)
    if cls.endswith(("ForMultipleChoice",)):
        return torch.randint(0, 2, (BATCH,), generator=gen)
    return torch.randint(0, _vocab(config), (BATCH, SEQ), generator=gen)


def _makers(model: nn.Module, gen: torch.Generator) -> dict[str, Callable[[], torch.Tensor]]:
    config = model.config
    hidden = int(getattr(config, "hidden_size", getattr(config, "n_embd", 64)))
    channels = int(getattr(config, "num_channels", 3))
    size = getattr(config, "image_size", 32)
    size = size if isinstance(size, int) else size[0]
    return {
        "input_ids": lambda: torch.randint(0, _vocab(config), (BATCH, SEQ), generator=gen),
        "decoder_input_ids": lambda: torch.randint(0, _vocab(config), (BATCH, SEQ), generator=gen),
        "attention_mask": lambda: torch.ones(BATCH, SEQ, dtype=torch.long),
        "decoder_attention_mask": lambda: torch.ones(BATCH, SEQ, dtype=torch.long),
        "token_type_ids": lambda: torch.zeros(BATCH, SEQ, dtype=torch.long),
        "position_ids": lambda: torch.arange(SEQ).expand(BATCH, SEQ).clone(),
        "inputs_embeds": lambda: torch.randn(BATCH, SEQ, hidden, generator=gen),
        "pixel_values": lambda: torch.randn(BATCH, channels, size, size, generator=gen),
        "labels": lambda: _labels(model, gen),
    }


def forward_parameters(model: nn.Module) -> list[str]:
    """Names the model's forward accepts as keywords."""
    params = inspect.signature(model.forward).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def hf_example_inputs(model: nn.Module, names: list[str], seed: int = 0) -> dict[str, Any]:
    """Example tensors for ``names``; a clear error for a name the model or mase_lite does not know."""
    if not hasattr(model, "config"):
        raise UserError(
            f"hf_input_names needs a transformers model (one with a .config); {type(model).__name__} has none: "
            "pass example_inputs={name: tensor} instead"
        )
    accepted = forward_parameters(model)
    gen = torch.Generator().manual_seed(seed)
    makers = _makers(model, gen)
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
