"""Modules by the names they had before the layout of 2026-11: ``import mase_lite.train.generation`` still works.

An old name gives the module it moved to (the same object: its classes and functions are the same) and warns once, a
``FutureWarning`` naming the new path. ``mase_lite.nn``, whose modules went to three places, is an empty package
whose old submodules resolve the same way.

>>> MOVED["mase_lite.train.generation"], MOVED["mase_lite.nn.quantized"]
('mase_lite.runtime.generation', 'mase_lite.layers.quantized')
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

_INFRA = ("cores", "errors", "faults", "files", "heap", "jsonio", "limits", "lock", "progress", "signing", "trust")
_LAYERS = ("lora", "presets", "pruning", "quant_config", "quant_functional", "quant_op", "quantized", "replacements",
           "storage")
_WORKLOADS = ("batches", "builtin_datasets", "builtin_tasks", "data", "datasets", "devices", "evaluator", "grammar", "hub",
              "image_classification", "images", "language", "lm_harness", "loader", "models", "named_data", "perplexity",
              "prepare", "seeding", "shapes", "sources", "splits", "synthetic", "tasks", "text_classification",
              "tokenizer", "trainer", "validation")

MOVED: dict[str, str] = {
    **{f"mase_lite.{name}": f"mase_lite.infra.{name}" for name in _INFRA},
    "mase_lite.plugins": "mase_lite.pipeline.plugins",
    **{f"mase_lite.nn.{name}": f"mase_lite.layers.{name}" for name in _LAYERS},
    "mase_lite.nn.gptq": "mase_lite.algorithms.gptq",
    "mase_lite.nn.decoder": "mase_lite.runtime.decoder",
    "mase_lite.nn.disk_weights": "mase_lite.runtime.disk_weights",
    "mase_lite.kernels.int8_activations.decoder_step": "mase_lite.runtime.decoder_step",
    "mase_lite.train": "mase_lite.workloads",
    "mase_lite.train.generation": "mase_lite.runtime.generation",
    **{f"mase_lite.train.{name}": f"mase_lite.workloads.{name}" for name in _WORKLOADS},
    "mase_lite.deploy.compressed_tensors_import": "mase_lite.importers.compressed_tensors",
    "mase_lite.deploy.hub": "mase_lite.importers.hub",
    "mase_lite.deploy.shards": "mase_lite.importers.shards",
}
EMPTIED = {"mase_lite.nn"}  # old packages with no module of their own now


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names first (before the path finder) and loads them as the modules they moved to."""

    def __init__(self):
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED or fullname in EMPTIED:
            return importlib.util.spec_from_loader(fullname, self, is_package=fullname in EMPTIED)
        return None

    def create_module(self, spec):
        if spec.name in EMPTIED:
            module = types.ModuleType(spec.name, "Moved: see mase_lite.infra.moved.")
            module.__path__ = []
            return module
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", FutureWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[new] = module.__spec__  # the import system gives it the old name's spec next: put back after
        return module

    def exec_module(self, module):
        if module.__name__ in self._specs:
            module.__spec__ = self._specs.pop(module.__name__)


def install() -> None:
    """Put the old names' finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _OldNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldNames())
