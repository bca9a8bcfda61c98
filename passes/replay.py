"""Loading a saved graph whose structural transforms must be re-applied, through the pass registry.

A checkpoint saved in module mode (``"capture": "modules"`` in its recipe) loads as a
:class:`~mase_lite.ir.module_model.ModuleModel`: no capture, its transforms replayed on its modules.

The IR saves and loads weights and captures; it knows no pass. This module sits above both.

>>> import tempfile, torch, mase_lite as ml
>>> from mase_lite.passes.replay import load_graph
>>> make = lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
>>> mg = ml.MaseGraph(make(), example_inputs={"input": torch.randn(2, 4)})
>>> mg, _ = ml.passes.remove_dropout(mg)
>>> with tempfile.TemporaryDirectory() as d:
...     _ = mg.save(d)
...     loaded = load_graph(d, model=make())
>>> [step["pass"] for step in loaded.history]
['remove_dropout']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.ir.graph import MaseGraph
from mase_lite.ir.module_model import ModuleModel
from mase_lite.checkpoint import load_weights, read_checkpoint
from mase_lite.ir.serialize import saved_capture
from mase_lite.passes.manager import PassContext, run_pass
from mase_lite.passes.registry import PassError, get_pass
from mase_lite.infra.trust import trusted, trusting


def replay_transforms(mg, transforms: list[dict[str, Any]]):
    """Re-apply saved transforms in order; each must be a registered structural (replayable) pass."""
    for i, step in enumerate(transforms):
        name = step.get("pass")
        try:
            info = get_pass(name)
        except PassError:
            module = step.get("module") or "an unknown module"
            raise UserError(
                f"this graph was saved after pass {name!r} from {module}, which is not registered here; install "
                "the package that provides it, or name the module with --plugin (or `plugins` in the spec)",
                location=("transforms", i),
            ) from None
        if not info.replay:
            raise UserError(f"pass {name!r} is not a structural transform and is never replayed", location=("transforms", i))
        mg, _ = run_pass(info, mg, step.get("params", {}), PassContext(), where=f"transforms.{i}")
    return mg


def load_graph(directory: str | Path, model: nn.Module | None = None, trust_code: bool = False):
    """The graph saved in ``directory`` with its transforms replayed and its weights loaded.

    Code the checkpoint names (a model factory, leaf-module classes) is used only when registered,
    or when ``trust_code`` is true (see :mod:`mase_lite.infra.trust`); replay runs structural transforms only.
    """
    with trusting(trusted() or trust_code):
        if saved_capture(directory) == "modules":
            return _load_modules(directory, model)
        return MaseGraph.load(directory, model=model, replay=replay_transforms)


def _load_modules(directory: str | Path, model: nn.Module | None) -> ModuleModel:
    """A module-mode checkpoint: the model rebuilt, its transforms replayed on its modules, its weights loaded."""
    recipe, model, capture = read_checkpoint(directory, model)
    examples = capture.get("example_inputs") or None
    mm = replay_transforms(ModuleModel(model, example_inputs=examples, recipe=recipe["model"]), recipe["transforms"])
    load_weights(mm, directory)
    return mm
