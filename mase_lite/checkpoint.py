"""Rebuilding a saved graph's model from its recipe, under the trust policy (:mod:`mase_lite.infra.trust`).

A checkpoint's ``recipe.json`` is data, possibly someone else's: a factory it names is called only
when registered, named or trusted; a transformers class only when transformers' auto registry lists
it for the config's model type (or the user trusts the file); leaf-module classes are looked up
among the rebuilt model's own modules. The recipe's format and the files are the IR's
(:mod:`mase_lite.ir.serialize`).

Weights: :func:`save_checkpoint` stores each quantized weight and bias as its codes and shared scales
(:mod:`mase_lite.layers.storage`; ``weights="float"`` keeps the float values a layer quantizes on every call, as
training needs them, but for parameters that already hold stored values); :func:`load_weights` decodes them
bit for bit into the rebuilt model and holds them.

Example::

    recipe, model, capture_args = read_checkpoint("runs/bert")
    mg = MaseGraph(model, **capture_args)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.infra.files import check_regular, recover
from mase_lite.ir.export import dynamic_shapes_of
from mase_lite.ir.serialize import (
    RECIPE,
    WEIGHTS,
    FactoryRecipe,
    HFRecipe,
    ModelRecipe,
    example_inputs_from_specs,
    read_recipe,
    read_weights,
    save,
    validate,
)
from mase_lite.infra.limits import check_fits, model_bytes
from mase_lite.layers.storage import check_stored_names, flatten, restore_codes, stored_codes, unflatten
from mase_lite.infra.trust import TRUST_HINT, call_factory, qualname, resolve_factory, resolve_leaf_module, trusted


def build_from_recipe(recipe: dict[str, Any] | FactoryRecipe | HFRecipe) -> nn.Module:
    """A freshly initialised model from a recipe written by :func:`model_recipe` or a factory.

    A factory is called only when registered or trusted (see :mod:`mase_lite.infra.trust`); a transformers
    class only when transformers' auto registry lists it for the config's model type.
    """
    if isinstance(recipe, dict):
        recipe = validate(ModelRecipe, recipe, "model")
    if isinstance(recipe, FactoryRecipe):
        return call_factory(resolve_factory(recipe.factory, "model.factory"), recipe.factory, recipe.kwargs)
    cls, config = _hf_class_and_config(recipe)
    kwargs = {"attn_implementation": recipe.attn_implementation} if recipe.attn_implementation else {}
    check_fits("model.hf_config", model_bytes(lambda c: cls._from_config(c, **kwargs), config, "model.hf_config"), "the model")
    return cls._from_config(config, **kwargs)


def _registered_hf_classes(model_type: str) -> set[str]:
    """Model class names transformers' auto mappings list for ``model_type``."""
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for attr in dir(modeling_auto):
        mapping = getattr(modeling_auto, attr)
        if attr.endswith("_MAPPING_NAMES") and isinstance(mapping, dict):
            found = mapping.get(model_type)
            names.update([found] if isinstance(found, str) else list(found or ()))
    return names


def _hf_class_and_config(recipe: HFRecipe) -> tuple[type, Any]:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = recipe.hf_config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise UserError(f"model.hf_config.model_type = {model_type!r} is not a model type transformers knows")
    if recipe.hf_class not in _registered_hf_classes(model_type) and not trusted():
        raise UserError(
            f"model.hf_class = {recipe.hf_class!r} is not a {model_type} model class in transformers' auto "
            f"registry, so it is not looked up; {TRUST_HINT} to load it anyway"
        )
    cls = getattr(transformers, recipe.hf_class, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise UserError(f"model.hf_class: transformers has no model class {recipe.hf_class!r}")
    try:
        config = CONFIG_MAPPING[model_type].from_dict(recipe.hf_config)
    except Exception as err:  # the config's own field checks (ValueError, TypeError, huggingface_hub's strict dataclasses)
        raise UserError(f"model.hf_config: not a valid {model_type} config: {err}") from None
    return cls, config


def read_checkpoint(directory: str | Path, model: nn.Module | None = None) -> tuple[dict[str, Any], nn.Module, dict[str, Any]]:
    """The recipe saved in ``directory``, the model to capture (rebuilt unless given) and the capture's arguments.

    Nothing the recipe names is imported or called unless registered or trusted (:mod:`mase_lite.infra.trust`):
    leaf-module classes are looked up among the model's own modules.
    """
    directory = Path(directory)
    recover(directory)
    check_regular(directory, "a saved graph")
    parsed = read_recipe(directory)
    if model is None:
        if parsed.model is None:
            raise UserError(
                f"{directory}: no recipe to rebuild the model was saved; pass the model: MaseGraph.load(dir, model=...)"
            )
        model = build_from_recipe(parsed.model)
    model.eval()
    known = {qualname(type(m)): type(m) for m in model.modules()}
    found = (resolve_leaf_module(q, f"leaf_modules.{i}", known) for i, q in enumerate(parsed.leaf_modules))
    leaf = tuple(cls for cls in found if cls is not None)
    recipe = parsed.model_dump(mode="json", by_alias=True)
    if parsed.hf_input_names is not None:
        inputs: dict[str, Any] = {"hf_input_names": parsed.hf_input_names}
        names = parsed.hf_input_names
    else:
        inputs = {"example_inputs": example_inputs_from_specs(recipe["input_specs"])}
        names = list(inputs["example_inputs"])
    dynamic = dynamic_shapes_of(parsed.dynamic_dims, names) if parsed.dynamic_dims is not None else None
    return recipe, model, {**inputs, "leaf_modules": leaf, "dynamic_shapes": dynamic, "recipe": recipe["model"]}


Weights = Literal["codes", "float"]


def save_checkpoint(mg, directory: str | Path, weights: Weights = "codes") -> Path:
    """Write ``mg`` (a graph or a module-mode model) to ``directory``: the recipe, and the weights with each
    quantized parameter as its stored codes (``weights="codes"``), or as its float values but for those
    already holding stored values (``"float"``, what training on needs)."""
    if weights not in ("codes", "float"):
        raise UserError(f"weights={weights!r} is unknown; allowed: codes, float")
    return save(mg, directory, flatten(stored_codes(mg.model, held_only=weights == "float")))


def load_weights(mg, directory: str | Path) -> None:
    """Load the saved weights into the (captured, transformed) graph or module-mode model, decoding stored
    codes bit for bit (their parameters then hold those values), and put it in eval mode."""
    directory = Path(directory)
    manifest = {name: entry.model_dump() for name, entry in read_recipe(directory).stored.items()}
    path = directory / WEIGHTS
    try:
        check_stored_names(mg.model, list(manifest))
    except UserError as err:
        raise UserError(f"{directory / RECIPE}: {err}") from None
    tensors = read_weights(mg.model, path, set(manifest))
    stored = unflatten(tensors, manifest, str(path))
    state = {k: v for k, v in tensors.items() if k.rpartition(".")[0] not in manifest}
    missing, unexpected = mg.model.load_state_dict(state, strict=False)
    left = sorted(set(missing) - set(manifest))
    if left or unexpected:
        raise UserError(f"{path}: the checkpoint does not fit the model ({', '.join((left or unexpected)[:5])})")
    try:
        restore_codes(mg.model, stored)
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    except (ValueError, RuntimeError, IndexError) as err:  # side tensors of the wrong shape or values
        raise UserError(f"{path}: stored codes do not decode: {err}") from None
    mg.model.eval()
