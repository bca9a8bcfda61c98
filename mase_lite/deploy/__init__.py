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
from importlib.metadata import entry_points
from typing import Any

from mase_lite.deploy.destination import check_destination
from mase_lite.deploy.errors import ExportError

ENTRY_POINT_GROUP = "mase_lite.export_targets"  # name = a module path, as register_target takes it
_TARGETS: dict[str, str] = {}
_ENTRY_POINTS_LOADED = [False]


def register_target(name: str, module: str) -> None:
    """Make ``name`` an export target written by ``module`` (a module path, imported when first used). The module
    defines ``write(mg, path, tokenizer=None, **options)`` (what was written, as a dict) and ``is_export(path)``
    (whether ``path`` is its own earlier export, which ``overwrite`` may replace). A format says how this target
    holds it with :func:`mase_lite.numerics.registry.register_mapping` (``name`` as the target); an installed
    package adds a target with an entry point in the ``mase_lite.export_targets`` group."""
    if not isinstance(name, str) or not name.strip() or not isinstance(module, str) or not module.strip():
        raise ExportError(f"register_target: a target name and a module path, got {name!r} and {module!r}")
    if _TARGETS.get(name, module) != module:
        raise ExportError(f"register_target: export target {name!r} is already written by {_TARGETS[name]}")
    _TARGETS[name] = module


def target_names() -> list[str]:
    """Every export target, built-in, registered or installed as an entry point (loaded once)."""
    if not _ENTRY_POINTS_LOADED[0]:
        _ENTRY_POINTS_LOADED[0] = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in _TARGETS:
                _TARGETS[ep.name] = ep.value
    return list(_TARGETS)


def target_module(name: str):
    """The module writing export target ``name``; an :class:`ExportError` listing the targets otherwise."""
    if name not in target_names():
        raise ExportError(f"format {name!r} is unknown; allowed: {', '.join(target_names())}")
    try:
        module = importlib.import_module(_TARGETS[name])
    except ImportError as err:
        raise ExportError(f"export target {name!r}: cannot import {_TARGETS[name]}: {err}") from None
    if not callable(getattr(module, "write", None)) or not callable(getattr(module, "is_export", None)):
        raise ExportError(f"export target {name!r}: {_TARGETS[name]} defines no write(mg, path, ...) and is_export(path)")
    return module


for _name, _module in (("compressed-tensors", "mase_lite.deploy.compressed_tensors"), ("gguf", "mase_lite.deploy.gguf"),
                       ("onnx", "mase_lite.deploy.onnx"), ("pt2", "mase_lite.deploy.pt2")):
    register_target(_name, _module)


def export(mg, format: str, path: str | Path, tokenizer: Any = None, *, overwrite: bool = False,
           sources: Iterable[str | Path] = (), field: str = "path", **options: Any) -> dict[str, Any]:
    """Write ``mg`` (a graph, a module-mode model or a plain ``nn.Module``) to ``path`` in ``format``; returns
    what was written. ``tokenizer``: the run's tokenizer, written beside the model where the format keeps one;
    ``overwrite``: replace a previous export of this format at ``path``; ``sources``: what the model was read
    from (never written over); ``field``: how errors name ``path``.
    """
    import torch.nn as nn  # here: the command line checks its arguments with this package before torch loads

    from mase_lite.ir.module_model import ModuleModel

    if isinstance(mg, nn.Module):
        mg = ModuleModel(mg)
    writer = target_module(format)
    unknown = [k for k in options if k not in inspect.signature(writer.write).parameters]
    if unknown:
        raise ExportError(f"the {format} export takes no option {unknown[0]!r}")
    check_destination(path, format, writer.is_export, overwrite=overwrite, field=field, sources=sources)
    return writer.write(mg, Path(path), tokenizer=tokenizer, **options)


__all__ = ["ExportError", "export", "register_target", "target_module", "target_names"]
