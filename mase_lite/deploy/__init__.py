"""Take a compressed model to the runtimes people serve with, and open what other tools wrote.

Export (:func:`export`, the ``export`` pass, ``mase-lite export``):

- ``compressed-tensors``: a Hugging Face directory for transformers (with the ``compressed-tensors``
  package), vLLM and SGLang (:mod:`.compressed_tensors`);
- ``gguf``: a llama.cpp file for decoder LMs (:mod:`.gguf`);
- ``onnx``: an ONNX model with QuantizeLinear/DequantizeLinear for onnxruntime (:mod:`.onnx`);
- ``pt2``: the ``torch.export`` program of the quantized graph (:mod:`.pt2`).

Each writes from the weights' stored codes (:mod:`mase_lite.numerics.codes`), so the runtime decodes the
values the tool computed with; a layer whose format the target cannot hold is refused before anything is
written, naming the layer, its format and the target's nearest scheme.

An export never destroys what stands at its path (:mod:`.destination`): a new path, or a previous export of the
same kind (each target's ``is_export`` recognises its marker) replaced when ``overwrite`` is given; a link, a
device, the model's source, or a file or folder the tool did not write is refused.

Import (:mod:`.hub`): a compressed-tensors directory or a GGUF file as a model whose layers carry the
equivalent formats; nothing such a file names is imported or run.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch.nn as nn

from mase_lite.deploy.destination import check_destination
from mase_lite.deploy.layers import ExportError
from mase_lite.ir.module_model import ModuleModel

ExportFormat = Literal["compressed-tensors", "gguf", "onnx", "pt2"]
EXPORT_FORMATS: dict[str, str] = {
    "compressed-tensors": "mase_lite.deploy.compressed_tensors",
    "gguf": "mase_lite.deploy.gguf",
    "onnx": "mase_lite.deploy.onnx",
    "pt2": "mase_lite.deploy.pt2",
}


def export(mg, format: str, path: str | Path, tokenizer: Any = None, *, overwrite: bool = False,
           sources: Iterable[str | Path] = (), field: str = "path", **options: Any) -> dict[str, Any]:
    """Write ``mg`` (a graph, a module-mode model or a plain ``nn.Module``) to ``path`` in ``format``; returns
    what was written. ``tokenizer``: the run's tokenizer, written beside the model where the format keeps one;
    ``overwrite``: replace a previous export of this format at ``path``; ``sources``: what the model was read
    from (never written over); ``field``: how errors name ``path``.
    """
    if isinstance(mg, nn.Module):
        mg = ModuleModel(mg)
    if format not in EXPORT_FORMATS:
        raise ExportError(f"format {format!r} is unknown; allowed: {', '.join(EXPORT_FORMATS)}")
    writer = importlib.import_module(EXPORT_FORMATS[format])
    unknown = [k for k in options if k not in inspect.signature(writer.write).parameters]
    if unknown:
        raise ExportError(f"the {format} export takes no option {unknown[0]!r}")
    check_destination(path, format, writer.is_export, overwrite=overwrite, field=field, sources=sources)
    return writer.write(mg, Path(path), tokenizer=tokenizer, **options)


__all__ = ["EXPORT_FORMATS", "ExportError", "ExportFormat", "export"]
