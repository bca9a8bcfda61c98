"""Others' quantized checkpoints as models of this tool: ``"model": {"pretrained": ...}`` on a compressed-tensors
directory (as llm-compressor writes it) or a GGUF file gives a model whose quantized layers carry the equivalent
formats and hold the stored values, so evaluate, draw, count, avg_bits and a search work on it. The files are
data: nothing they name is imported or run.

>>> kind_of("not/a/checkpoint") is None
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from mase_lite.importers import compressed_tensors, gguf
from mase_lite.deploy.layers import record_quantized


def kind_of(pretrained: str | Path) -> str | None:
    """``"compressed-tensors"``, ``"gguf"``, or None for anything else (a plain checkpoint, a hub name). A directory of
    another tool's quantization (gptq, awq...) counts as compressed-tensors: its reader refuses it by name, where
    transformers would load it with its quantized layers at random."""
    if compressed_tensors.is_checkpoint(pretrained):
        return "compressed-tensors"
    if gguf.is_gguf(pretrained):
        return "gguf"
    return None


def read_model(pretrained: str | Path, auto_class: Any) -> nn.Module:
    """The quantized model ``pretrained`` holds (``auto_class``: the task's transformers Auto class)."""
    reader = compressed_tensors.read if kind_of(pretrained) == "compressed-tensors" else gguf.read
    return record_quantized(reader(pretrained, auto_class))


def read_tokenizer(pretrained: str | Path):
    """A GGUF file's own vocabulary as a tokenizer (a compressed-tensors directory keeps its tokenizer files)."""
    return gguf.read_tokenizer(pretrained) if kind_of(pretrained) == "gguf" else None
