"""Save and load a MaseGraph: safetensors weights plus a JSON recipe; nothing is pickled.

The recipe says how to rebuild the model (HF class and config, or a factory), which inputs it
was captured with, which structural transforms to replay before the weights are loaded, and which
parameters the weights file holds as stored codes (``stored``: their format, bits, shape and dtype;
the tensors ``<name>.codes`` and ``<name>.<scale ...>``). Rebuilding a model from it, what a recipe
may name, and the codes themselves are :mod:`mase_lite.checkpoint`'s job; this module reads and writes
the files.

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

from mase_lite.infra.errors import UserError, format_validation_error
from mase_lite.infra.files import RECIPE
from mase_lite.infra.jsonio import read_json
from mase_lite.infra.files import follow_umask, recover, staged_directory
from mase_lite.infra.limits import check_fits

WEIGHTS = "model.safetensors"
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)  # 1: every tensor stored as it is in the model (no stored codes)


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


class StoredRecipe(BaseModel):
    """One parameter stored as codes: its number format, bits per code, shape, dtype and side tensors."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: dict[str, Any]
    bits: Annotated[int, Field(ge=1, le=32)]
    shape: list[Annotated[int, Field(ge=0)]]
    dtype: Literal["float32", "float16", "bfloat16"]
    side: list[Annotated[str, Field(pattern=r"^[a-z_]+$")]]


class Recipe(BaseModel):
    """``recipe.json``: everything a load needs besides the weights. Names in it are data, not code."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal[1, 2]
    model: ModelRecipe | None
    hf_input_names: list[str] | None
    input_specs: dict[str, InputRecipe]
    dynamic_dims: dict[str, list[Annotated[int, Field(ge=0)]]] | None = None
    leaf_modules: list[str] = Field(default_factory=list)
    transforms: list[TransformRecipe] = Field(default_factory=list)
    capture: Literal["graph", "modules"] = Field("graph", description="a captured graph, or a plain module (module mode)")
    stored: dict[str, StoredRecipe] = Field(default_factory=dict, description="parameters stored as codes")


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


def save(mg, directory: str | Path, stored: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None) -> Path:
    """Write ``model.safetensors`` and ``recipe.json`` into ``directory`` (replaced atomically).

    ``stored``: the tensors of parameters stored as codes and their manifest (``recipe.stored``); those
    parameters' float values are left out. Tied tensors are written once, under one of their names."""
    directory = Path(directory)
    tensors, manifest = stored if stored is not None else ({}, {})
    recipe = {
        "format": FORMAT_VERSION,
        "model": mg.recipe or model_recipe(mg.source_model),
        "hf_input_names": mg.hf_input_names,
        "input_specs": mg.input_specs,
        "dynamic_dims": mg.dynamic_dims,
        "leaf_modules": [f"{c.__module__}:{c.__qualname__}" for c in mg.leaf_modules],
        "transforms": mg.history,
        "capture": getattr(mg, "capture", "graph"),
        "stored": manifest,
    }
    written = _one_name_per_tensor(mg.model, set(manifest))
    clash = sorted(set(written) & set(tensors))
    if clash:
        raise UserError(f"the model has a tensor named {clash[0]!r}, which is also the name of stored codes")
    with staged_directory(directory) as tmp:
        safetensors.torch.save_file({**written, **tensors}, str(tmp / WEIGHTS), metadata={"format": "pt"})
        follow_umask(tmp / WEIGHTS)
        (tmp / RECIPE).write_text(json.dumps(recipe, indent=2, default=str))
    return directory


def _one_name_per_tensor(model: nn.Module, leave_out: set[str]) -> dict[str, torch.Tensor]:
    """The state dict, each tied group under its first name, without ``leave_out``; tensors that share
    memory otherwise (views) are copied, as safetensors writes each tensor's own bytes."""
    state = model.state_dict()
    out, storages = {}, set()
    for group in _tie_groups(model):
        name = group[0]
        if name in leave_out:
            continue
        tensor = state[name].detach()
        key = (tensor.untyped_storage().data_ptr(), tensor.device) if tensor.numel() else None
        if key in storages:
            tensor = tensor.clone()
        elif key is not None:
            storages.add(key)
        out[name] = tensor.contiguous()
    return out


def read_recipe(directory: Path) -> Recipe:
    path = directory / RECIPE
    if not path.is_file():
        raise UserError(f"{directory} is not a saved MaseGraph: {RECIPE} is missing")
    recipe = read_json(path, "recipe")
    if not isinstance(recipe, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(recipe).__name__}")
    if recipe.get("format") not in READABLE_FORMATS:
        raise UserError(f"{path}: unsupported format {recipe.get('format')!r} (this version reads "
                        f"{' and '.join(map(str, READABLE_FORMATS))})")
    return validate(Recipe, recipe, str(path))


def read_weights(model: nn.Module, path: Path, stored_names: set[str]) -> dict[str, torch.Tensor]:
    """Every tensor of ``path``, checked against ``model`` before any is used: names, shapes, dtypes, some
    finite value; a name of each tied group. ``stored_names``: parameters stored as codes (their tensors are
    named ``<name>.<...>`` and checked by whoever decodes them). Returns the state dict to load (every name
    of a tied group filled) plus the stored codes' tensors."""
    expected = model.state_dict()
    try:
        with safetensors.safe_open(str(path), "pt", device="cpu") as saved:
            names = set(saved.keys())
            coded = {n for n in names if n.rpartition(".")[0] in stored_names}
            unexpected = sorted(names - set(expected) - coded)
            if unexpected:
                raise UserError(f"{path}: checkpoint has tensors the model lacks: {', '.join(unexpected[:5])}")
            tensors = {name: saved.get_tensor(name) for name in sorted(names)}
    except (safetensors.SafetensorError, OSError, ValueError) as err:
        raise UserError(f"{path} is not a readable safetensors checkpoint: {err}") from None
    for name in expected:
        if name in tensors:
            _check_tensor(path, name, tensors[name], expected[name])
    state = {}
    for group in _tie_groups(model):
        found = [n for n in group if n in tensors]
        if not found:
            if group[0] not in stored_names:
                raise UserError(f"{path}: checkpoint lacks tensors the model needs: {group[0]}")
            continue
        for name in group:
            state[name] = tensors[found[0]]
    return {**state, **{n: tensors[n] for n in coded}}


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
