"""Module mode: a plain ``nn.Module`` that passes work on without a captured graph.

A model ``torch.export`` refuses (a branch on a tensor's value, a Python loop over a runtime value)
still runs the passes that need modules only: quantize, prune, LoRA, replace, train, evaluate, save.
:class:`ModuleModel` gives them what they read of a :class:`~mase_lite.ir.graph.MaseGraph`: ``model``,
``modules``, ``replace_module``, ``save``, and ``nodes`` — one :class:`ModuleNode` per leaf module (the
modules a capture makes ``call_module`` nodes), named as a capture names them, so one selection
language serves both modes: ``fc1``, ``encoder.layer.0.query`` and ``encoder_layer_0_query`` all work.

>>> from collections import OrderedDict
>>> import torch.nn as nn
>>> mm = ModuleModel(nn.Sequential(OrderedDict(block=nn.Sequential(nn.Linear(4, 4), nn.ReLU()), head=nn.Linear(4, 2))))
>>> [(n.name, n.target, n.meta["mase"]["op"]) for n in mm.nodes]
[('block_0', 'block.0', 'linear'), ('block_1', 'block.1', 'relu'), ('head', 'head', 'linear')]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.ir.inputs import forward_parameters
from mase_lite.ir.meta import logical_name, module_class, tensor_meta
from mase_lite.ir.ops import is_leaf_class, op_of_module


class ModuleNode:
    """A leaf module seen as a graph's ``call_module`` node: ``name``, ``target`` (its dotted path) and
    ``meta["mase"]`` (op, module class, parameters with their formats, and the shapes of its first
    input and output when the model ran on its example inputs)."""

    op = "call_module"
    args: tuple = ()
    all_input_nodes: tuple = ()

    def __init__(self, target: str, module: nn.Module, head: bool, call: tuple[tuple, dict, Any] | None):
        self.target = target
        self.name = target.replace(".", "_")
        self.head = head
        self.call = call  # (args, kwargs, output) of its first call on the example inputs, when observed
        self.meta = {"mase": _module_meta(module, call)}

    def __repr__(self) -> str:
        return f"ModuleNode({self.target})"


def _module_meta(module: nn.Module, call: tuple[tuple, dict, Any] | None) -> dict[str, Any]:
    formats = module.quant_formats() if hasattr(module, "quant_formats") else {}
    params = {}
    for raw, p in module.named_parameters():
        name = logical_name(raw)
        params[name] = tensor_meta(p, {}, formats.get(name)) | {"trainable": p.requires_grad}
    for raw, b in module.named_buffers():
        params[logical_name(raw)] = tensor_meta(b, {}) | {"buffer": True}
    if hasattr(module, "mase_weight_meta"):
        params["weight"] = module.mase_weight_meta()
    args, _, out = call if call is not None else ((), {}, None)
    first_in = args[0] if args else None
    inputs = [tensor_meta(first_in, {}, formats.get("data_in"))] if isinstance(first_in, torch.Tensor) else []
    results = [tensor_meta(out, {}, formats.get("data_out"))] if isinstance(out, torch.Tensor) else []
    return {"type": "module", "op": op_of_module(module), "module": module_class(module).__name__,
            "params": params, "args": inputs, "results": results}


def leaf_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules a capture keeps as single nodes (Linear, Conv, norms, activations, quantized layers, ...),
    by dotted path, outermost first: a leaf's own submodules (a quantized layer's quantizers) are left out."""
    leaves: dict[str, nn.Module] = {}
    inside = None  # the last leaf: named_modules lists its submodules right after it
    for name, module in model.named_modules():
        if inside is not None and name.startswith(inside):
            continue
        if name and is_leaf_class(type(module)):
            leaves[name], inside = module, name + "."
    return leaves


def _head(model: nn.Module, leaves: dict[str, nn.Module]) -> str | None:
    """The output head: a transformers model's output embeddings, else the last leaf Linear."""
    getter = getattr(model, "get_output_embeddings", None)
    found = getter() if callable(getter) else None
    for name, module in leaves.items():
        if found is not None and module is found:
            return name
    linears = [name for name, module in leaves.items() if op_of_module(module) in ("linear", "hf_conv1d")]
    return linears[-1] if linears else None


def inputs_taken(model: nn.Module, offered: list[str] | tuple[str, ...]) -> list[str]:
    """The names of ``offered`` (a batch's inputs) that ``model``'s forward takes; all of them when it takes
    none by name (``**kwargs``).

    >>> inputs_taken(nn.Linear(2, 2), ["input", "labels"])
    ['input']
    """
    accepted = forward_parameters(model)
    return [n for n in offered if n in accepted] or list(offered)


class ModuleModel:
    """A plain module under passes (module mode). ``example_inputs`` (optional, ``{name: tensor}``) let
    passes see each leaf's input and output (``replace`` checks fits, ``avg_bits`` sizes activations).

    Args:
        model: any ``nn.Module``.
        example_inputs: keyword inputs of one forward call.
        input_names: the inputs a batch feeds it (default: those of ``example_inputs``).
        recipe: how to rebuild the model on load (as for ``MaseGraph``).
    """

    capture = "modules"

    def __init__(self, model: nn.Module, example_inputs: dict[str, Any] | None = None,
                 input_names: list[str] | tuple[str, ...] | None = None, recipe: dict[str, Any] | None = None):
        if not isinstance(model, nn.Module):
            raise UserError(f"module mode needs an nn.Module, got {type(model).__name__}")
        self.model = self.source_model = model
        self.example_inputs = dict(example_inputs) if example_inputs else None
        names = input_names if input_names is not None else list(self.example_inputs or ())
        self.input_names = tuple(names) if names else None
        self.recipe = recipe
        # the structural transforms a model went through before it came here (a quantized checkpoint of another
        # tool, read as quantized layers, says so in ``mase_transforms``): a save records them for the load
        self.history: list[dict[str, Any]] = [dict(step) for step in getattr(model, "mase_transforms", ())]
        self.facts: set[str] = set()
        self.analyses: dict[str, Any] = {}
        # what a saved checkpoint's recipe records of a capture: nothing was captured
        self.hf_input_names = None
        self.input_specs = {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
                            for k, v in (self.example_inputs or {}).items() if isinstance(v, torch.Tensor)}
        self.dynamic_dims = None
        self.leaf_modules = ()

    @property
    def modules(self) -> dict[str, nn.Module]:
        """Every submodule by qualified name."""
        return dict(self.model.named_modules())

    @property
    def nodes(self) -> list[ModuleNode]:
        """One node per leaf module, in module order (see the module docstring); no shapes of inputs."""
        return self._nodes(observe=False)

    def observed_nodes(self) -> list[ModuleNode]:
        """:attr:`nodes` with the shapes of each leaf's first input and output (``meta["mase"]["args"]``,
        ``["results"]``) from one eval-mode run on the example inputs (none without examples)."""
        return self._nodes(observe=True)

    def _nodes(self, observe: bool) -> list[ModuleNode]:
        leaves = leaf_modules(self.model)
        calls = self._calls(leaves) if observe else {}
        head = _head(self.model, leaves)
        return [ModuleNode(name, module, name == head, calls.get(name)) for name, module in leaves.items()]

    def _calls(self, leaves: dict[str, nn.Module]) -> dict[str, tuple[tuple, dict, Any]]:
        """``{path: (args, kwargs, output)}`` of each leaf's first call in one eval-mode forward call on the example inputs."""
        if not self.example_inputs:
            return {}
        seen: dict[str, tuple[tuple, dict, Any]] = {}

        def record(name: str):
            def hook(module, args, kwargs, output):
                seen.setdefault(name, (args, kwargs, output))
            return hook

        handles = [m.register_forward_hook(record(name), with_kwargs=True) for name, m in leaves.items()]
        training = self.model.training
        try:
            self.model.eval()
            with torch.no_grad():
                self.model(**self.example_inputs)
        finally:
            self.model.train(training)
            for handle in handles:
                handle.remove()
        return seen

    def replace_module(self, target: str, new_module: nn.Module) -> None:
        """Swap submodule ``target`` for ``new_module``."""
        modules = self.modules
        if target not in modules or not target:
            raise UserError(f"no submodule named {target!r} in the model")
        parent_name, _, child = target.rpartition(".")
        setattr(modules[parent_name] if parent_name else self.model, child, new_module)

    def record_transform(self, name: str, params: dict[str, Any], module: str = "") -> None:
        """Append a structural transform to the history a load replays."""
        self.history.append({"pass": name, "params": params, "module": module})

    def recompile(self) -> None:
        """Nothing to regenerate: a plain module runs its own forward."""

    def refresh_metadata(self) -> None:
        """Nothing to refresh: ``nodes`` are derived from the modules when asked for."""

    def to(self, device: torch.device | str) -> "ModuleModel":
        self.model.to(device)
        if self.example_inputs:
            self.example_inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                                   for k, v in self.example_inputs.items()}
        return self

    def save(self, directory: str | Path, weights: str = "codes") -> Path:
        """Write weights (safetensors; quantized ones as stored codes, or ``weights="float"``) and the recipe
        (``"capture": "modules"``) to ``directory``."""
        from mase_lite.checkpoint import save_checkpoint

        return save_checkpoint(self, directory, weights)

    def __repr__(self) -> str:
        return f"ModuleModel({type(self.model).__name__}, leaves={len(leaf_modules(self.model))})"
