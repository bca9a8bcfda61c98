"""Save and load a MaseGraph: safetensors weights plus a JSON recipe; nothing is pickled.

The recipe says how to rebuild the model (HF class and config, or a factory), which inputs it
was captured with, and which structural transforms to replay before the weights are loaded.
Rebuilding a model from it, and what a recipe may name, is :mod:`mase_lite.checkpoint`'s job.

Example::

    mg.save("runs/bert.v1")            # dots in paths are fine
    mg = MaseGraph.load("runs/bert.v1")   # a graph saved as captured
    mg = mase_lite.load("runs/bert.v1")   # also replays its transforms through the pass registry
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import safetensors
import safetensors.torch
import torch
import torch.nn as nn
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError

from mase_lite.errors import UserError, format_validation_error
from mase_lite.jsonio import read_json
from mase_lite.files import follow_umask, recover, staged_directory
from mase_lite.limits import check_fits

RECIPE = "recipe.json"
WEIGHTS = "model.safetensors"
FORMAT_VERSION = 1


class FactoryRecipe(BaseModel):
    """A model built by calling a registered factory with JSON keyword arguments."""

    model_config = ConfigDict(extra="forbid", strict=True)

    factory: str = Field(description="'package.module:function' (imported only when registered or trusted)")
    kwargs: dict[str, Any] = Field(default_factory=dict)


class HFRecipe(BaseModel):
    """A transformers model rebuilt from its class name and config through transformers' registry."""

    model_config = ConfigDict(extra="forbid", strict=True)

    hf_class: str = Field(pattern=r"^[A-Za-z_]\w*$")
    hf_config: dict[str, Any]
    attn_implementation: str | None = Field(None, pattern=r"^[\w-]+$")


ModelRecipe = Annotated[
    Annotated[FactoryRecipe, Tag("factory")] | Annotated[HFRecipe, Tag("hf")],
    Discriminator(
        lambda v: ("factory" if "factory" in v else "hf") if isinstance(v, dict) else
        "factory" if isinstance(v, FactoryRecipe) else "hf" if isinstance(v, HFRecipe) else None,
        custom_error_type="model_recipe", custom_error_message="expected an object with 'factory' or 'hf_class'",
    ),
]


class InputRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    shape: list[Annotated[int, Field(ge=0)]]
    dtype: str


class TransformRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    pass_name: str = Field(alias="pass")
    params: dict[str, Any] = Field(default_factory=dict)
    module: str | None = None


class Recipe(BaseModel):
    """``recipe.json``: everything a load needs besides the weights. Names in it are data, not code."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal[1]
    model: ModelRecipe | None
    hf_input_names: list[str] | None
    input_specs: dict[str, InputRecipe]
    dynamic_dims: dict[str, list[Annotated[int, Field(ge=0)]]] | None = None
    leaf_modules: list[str] = Field(default_factory=list)
    transforms: list[TransformRecipe] = Field(default_factory=list)
    capture: Literal["graph", "modules"] = Field("graph", description="a captured graph, or a plain module (module mode)")


def validate(kind: Any, data: Any, where: str) -> Any:
    try:
        return TypeAdapter(kind).validate_python(data)
    except ValidationError as err:
        raise UserError(f"{where}: malformed recipe:\n" + format_validation_error(err, model=kind)) from None


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


def example_inputs_from_specs(specs: dict[str, dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Example tensors from ``{name: {"shape": [...], "dtype": "float32"}}``: random floats, integer zeros."""
    inputs = {}
    for name, spec in specs.items():
        dtype = getattr(torch, spec["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise UserError(f"example_inputs.{name}.dtype: {spec['dtype']!r} is not a torch dtype (e.g. float32, int64)")
        numel = 1
        for size in spec["shape"]:
            if size < 0:
                raise UserError(f"example_inputs.{name}.shape: sizes must be >= 0, got {spec['shape']}")
            numel *= size
        check_fits(f"example_inputs.{name}.shape", numel * dtype.itemsize, f"an example input of shape {spec['shape']}")
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
        "leaf_modules": [f"{c.__module__}:{c.__qualname__}" for c in mg.leaf_modules],
        "transforms": mg.history,
        "capture": getattr(mg, "capture", "graph"),
    }
    with staged_directory(directory) as tmp:  # one name per tied tensor; the model ties the rest again
        safetensors.torch.save_model(mg.model, str(tmp / WEIGHTS), metadata={"format": "pt"})
        follow_umask(tmp / WEIGHTS)
        (tmp / RECIPE).write_text(json.dumps(recipe, indent=2, default=str))
    return directory


def read_recipe(directory: Path) -> Recipe:
    path = directory / RECIPE
    if not path.is_file():
        raise UserError(f"{directory} is not a saved MaseGraph: {RECIPE} is missing")
    recipe = read_json(path, "recipe")
    if not isinstance(recipe, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(recipe).__name__}")
    if recipe.get("format") != FORMAT_VERSION:
        raise UserError(f"{path}: unsupported format {recipe.get('format')!r} (expected {FORMAT_VERSION})")
    return validate(Recipe, recipe, str(path))


def _load_weights(model: nn.Module, path: Path) -> None:
    """Every tensor checked (names, shapes, dtypes, some finite value) before any is written into
    ``model``; then ``safetensors.torch.load_model``, which ties shared tensors again."""
    expected = model.state_dict()
    try:
        with safetensors.safe_open(str(path), "pt", device="cpu") as saved:
            names = set(saved.keys())
            unexpected = sorted(names - set(expected))
            if unexpected:
                raise UserError(f"{path}: checkpoint has tensors the model lacks: {', '.join(unexpected[:5])}")
            for name in (n for n in expected if n in names):  # in the model's order
                _check_tensor(path, name, saved.get_tensor(name), expected[name])
    except (safetensors.SafetensorError, OSError, ValueError) as err:
        raise UserError(f"{path} is not a readable safetensors checkpoint: {err}") from None
    missing = [group[0] for group in _tie_groups(model) if not names.intersection(group)]
    if missing:
        raise UserError(f"{path}: checkpoint lacks tensors the model needs: {', '.join(missing[:5])}")
    safetensors.torch.load_model(model, str(path), strict=True)


def _check_tensor(path: Path, name: str, saved: torch.Tensor, target: torch.Tensor) -> None:
    if tuple(saved.shape) != tuple(target.shape):
        raise UserError(f"{path}: tensor {name!r} has shape {list(saved.shape)} in the checkpoint "
                        f"but {list(target.shape)} in the model")
    if saved.dtype != target.dtype:
        raise UserError(f"{path}: tensor {name!r} is {saved.dtype} in the checkpoint but {target.dtype} in the model")
    if saved.is_floating_point() and saved.numel() and not saved.isfinite().any():
        raise UserError(f"{path}: tensor {name!r} holds no finite value (all NaN or infinite)")


def _tie_groups(model: nn.Module) -> list[list[str]]:
    """The model's state-dict names, grouped by the tensor they name (tied weights share a group)."""
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    return list(groups.values())


def saved_capture(directory: str | Path) -> str:
    """``"graph"`` for a checkpoint of a captured graph, ``"modules"`` for one of a plain module (module mode);
    a checkpoint a crash left mid-replace is recovered first."""
    recover(Path(directory))
    return read_recipe(Path(directory)).capture


def load_weights(mg, directory: str | Path) -> None:
    """Load the saved weights into the (captured, transformed) graph and put it in eval mode."""
    _load_weights(mg.model, Path(directory) / WEIGHTS)
    mg.model.eval()
