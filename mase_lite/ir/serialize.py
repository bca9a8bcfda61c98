"""Save and load a MaseGraph: safetensors weights plus a JSON recipe; nothing is pickled.

The recipe says how to rebuild the model (HF class and config, or a factory), which inputs it
was captured with, and which structural transforms to replay before the weights are loaded.

Example::

    mg.save("runs/bert.v1")            # dots in paths are fine
    mg = MaseGraph.load("runs/bert.v1")   # a graph saved as captured
    mg = mase_lite.load("runs/bert.v1")   # also replays its transforms through the pass registry
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
import torch.nn as nn

from mase_lite.errors import UserError
from mase_lite.ir.capture import dynamic_shapes_of
from mase_lite.files import recover, staged_directory

RECIPE = "recipe.json"
WEIGHTS = "model.safetensors"
FORMAT_VERSION = 1


def _qualname(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(qualname: str) -> Any:
    module_name, _, attr = qualname.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise UserError(f"cannot import {qualname!r}: {err}") from None
    return obj


def model_recipe(model: nn.Module) -> dict[str, Any] | None:
    """How to rebuild ``model`` without its weights; ``None`` when mase_lite cannot tell."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict") and type(model).__module__.startswith("transformers"):
        return {
            "hf_class": type(model).__name__,
            "hf_config": config.to_dict(),
            "attn_implementation": getattr(config, "_attn_implementation", None),
        }
    return None


def build_from_recipe(recipe: dict[str, Any]) -> nn.Module:
    """A freshly initialised model from a recipe written by :func:`model_recipe` or a factory."""
    if "factory" in recipe:
        factory = _import(recipe["factory"])
        return factory(**recipe.get("kwargs", {}))
    import transformers

    cls = getattr(transformers, recipe["hf_class"], None)
    if cls is None:
        raise UserError(f"recipe: transformers has no model class {recipe['hf_class']!r}")
    config = cls.config_class.from_dict(recipe["hf_config"])
    kwargs = {"attn_implementation": recipe["attn_implementation"]} if recipe.get("attn_implementation") else {}
    return cls._from_config(config, **kwargs)


def example_inputs_from_specs(specs: dict[str, dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Example tensors from ``{name: {"shape": [...], "dtype": "float32"}}``: random floats, integer zeros."""
    inputs = {}
    for name, spec in specs.items():
        dtype = getattr(torch, spec["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise UserError(f"example_inputs.{name}.dtype: {spec['dtype']!r} is not a torch dtype (e.g. float32, int64)")
        make = torch.randn if dtype.is_floating_point else torch.zeros
        inputs[name] = make(spec["shape"], dtype=dtype)
    return inputs


def save(mg, directory: str | Path) -> Path:
    """Write ``model.safetensors`` and ``recipe.json`` into ``directory`` (replaced atomically)."""
    directory = Path(directory)
    recipe = {
        "format": FORMAT_VERSION,
        "model": mg.recipe or model_recipe(mg.source_model),
        "hf_input_names": mg.hf_input_names,
        "input_specs": mg.input_specs,
        "dynamic_dims": mg.dynamic_dims,
        "leaf_modules": [_qualname(c) for c in mg.leaf_modules],
        "transforms": mg.history,
    }
    state = {k: v.detach().to("cpu") for k, v in mg.model.state_dict().items()}
    with staged_directory(directory) as tmp:
        safetensors.torch.save_file(_drop_aliases(state), str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / RECIPE).write_text(json.dumps(recipe, indent=2, default=str))
    return directory


def _drop_aliases(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keep one name per shared tensor (tied weights); the rest are restored by the model itself."""
    seen: dict[tuple, str] = {}
    unique = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if t.numel() and key in seen:
            continue
        seen[key] = name
        unique[name] = t.contiguous()
    return unique


def _read_recipe(directory: Path) -> dict[str, Any]:
    path = directory / RECIPE
    if not path.is_file():
        raise UserError(f"{directory} is not a saved MaseGraph: {RECIPE} is missing")
    try:
        recipe = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON: {err}") from None
    if recipe.get("format") != FORMAT_VERSION:
        raise UserError(f"{path}: unsupported format {recipe.get('format')!r} (expected {FORMAT_VERSION})")
    return recipe


def _load_weights(model: nn.Module, path: Path) -> None:
    try:
        state = safetensors.torch.load_file(str(path), device="cpu")
    except (safetensors.SafetensorError, OSError, ValueError) as err:
        raise UserError(f"{path} is not a readable safetensors checkpoint: {err}") from None
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise UserError(f"{path}: checkpoint has tensors the model lacks: {', '.join(unexpected[:5])}")
    missing = []
    for name, target in expected.items():
        if name not in state:
            missing.append(name)
            continue
        if tuple(state[name].shape) != tuple(target.shape):
            raise UserError(
                f"{path}: tensor {name!r} has shape {list(state[name].shape)} in the checkpoint "
                f"but {list(target.shape)} in the model"
            )
    tied = _tied_names(model)
    really_missing = [m for m in missing if m not in tied]
    if really_missing:
        raise UserError(f"{path}: checkpoint lacks tensors the model needs: {', '.join(really_missing[:5])}")
    model.load_state_dict(state, strict=False)


def _tied_names(model: nn.Module) -> set[str]:
    names: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        names.setdefault(id(t), []).append(name)
    return {n for group in names.values() if len(group) > 1 for n in group}


def read_checkpoint(directory: str | Path, model: nn.Module | None = None) -> tuple[dict[str, Any], nn.Module, dict[str, Any]]:
    """The recipe saved in ``directory``, the model to capture (rebuilt unless given) and the capture's arguments."""
    directory = Path(directory)
    recover(directory)
    recipe = _read_recipe(directory)
    if model is None:
        if recipe["model"] is None:
            raise UserError(
                f"{directory}: no recipe to rebuild the model was saved; pass the model: MaseGraph.load(dir, model=...)"
            )
        model = build_from_recipe(recipe["model"])
    model.eval()
    leaf = tuple(_import(q) for q in recipe["leaf_modules"])
    if recipe["hf_input_names"] is not None:
        inputs: dict[str, Any] = {"hf_input_names": recipe["hf_input_names"]}
        names = recipe["hf_input_names"]
    else:
        inputs = {"example_inputs": example_inputs_from_specs(recipe["input_specs"])}
        names = list(inputs["example_inputs"])
    dynamic = dynamic_shapes_of(recipe["dynamic_dims"], names) if "dynamic_dims" in recipe else None
    return recipe, model, {**inputs, "leaf_modules": leaf, "dynamic_shapes": dynamic, "recipe": recipe["model"]}


def load_weights(mg, directory: str | Path) -> None:
    """Load the saved weights into the (captured, transformed) graph and put it in eval mode."""
    _load_weights(mg.model, Path(directory) / WEIGHTS)
    mg.model.eval()
