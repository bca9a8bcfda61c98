"""Pre-flight: an export step whose target cannot hold what the quantize steps before it give is refused before the
first step runs, naming the layer, its shape, the constraint and the nearest scheme that fits — from the formats'
own mappings (:func:`mase_lite.numerics.registry.register_mapping`), not from the target's code at the end of a run;
so is a quantized head tied to the (float) embedding, which a weight file would write apart, and a quantize step's
``"storage": "packed"`` over a layer its packed layer cannot hold (a K-quant over inputs not a multiple of 256).
"""

from __future__ import annotations

from typing import Any

from mase_lite.deploy import target_module
from mase_lite.infra.errors import UserError
from mase_lite.numerics.registry import Unfit, mapped_formats, target_mapping


def has_checks(steps: list[Any]) -> bool:
    """Whether :func:`check_targets` has anything to check in ``steps``: an export step, or a quantize step with a
    ``"storage": "packed"`` rule (a search builds the model for the check only then)."""
    def packs(params) -> bool:
        return any(rule is not None and rule.storage == "packed" for rule in [*params.rules.values(), params.default])
    return any(step.pass_name == "export" or (step.pass_name == "quantize" and packs(step.params)) for step in steps)


def check_targets(steps: list[Any], mg) -> None:
    """One :class:`UserError` listing every Linear an export step's target cannot hold (``steps``: the validated
    pipeline steps; ``mg``: the model as built, before any step)."""
    from mase_lite.passes.transforms.quantize import layer_configs, tied_with, weight_formats

    modules = dict(mg.model.named_modules())
    formats: dict[str, dict[str, Any] | None] = {}
    problems = []
    for i, step in enumerate(steps):
        if step.pass_name == "quantize":
            configs = layer_configs(mg, step.params)
            problems += _unpackable(configs, modules, i)
            formats.update(weight_formats(configs))
        elif step.pass_name == "export":
            target = step.params.format
            for path, fmt in formats.items():
                weight = getattr(modules.get(path), "weight", None)
                if fmt is None or weight is None or weight.dim() != 2:
                    continue
                why = _unfit(fmt, tuple(weight.shape), target)
                shared = tied_with(mg.model, path) if why is None else []
                if shared and not getattr(target_module(target), "ANY_WEIGHT_FORMAT", False):
                    why = (f"it shares its weight with {shared[0]!r} (tied), which stays float: the export would write "
                           f"the two apart; leave it float (\"ignore\": [{path!r}]) or untie them")
                if why is not None:
                    problems.append(UserError(f"{target} cannot hold layer {path!r} {list(weight.shape)} in "
                                              f"{fmt['name']}: {why}", location=("steps", i, "params", "format")))
    if problems:
        raise UserError("pipeline check failed: a quantize step cannot pack a layer or an export step cannot write "
                        "what the quantize steps give (nothing has run):", problems=problems)


def _unpackable(configs: dict[str, Any], modules: dict[str, Any], step: int) -> list[UserError]:
    """Each Linear a quantize step's ``"storage": "packed"`` would give a packed layer that cannot hold it."""
    from mase_lite.layers.quantized import packed_class

    problems = []
    for path, config in configs.items():
        weight = config.get("weight") if config is not None and config.storage == "packed" else None
        module = modules.get(path)
        if weight is None or not hasattr(module, "in_features"):
            continue
        fmt = weight.format.as_dict(weight.params)
        try:
            packed_class(fmt).check_packable(fmt, module.in_features, config.activations)
        except UserError as err:
            shape = [module.out_features, module.in_features]
            problems.append(UserError(f"storage 'packed' cannot hold layer {path!r} {shape} in {fmt['name']}: "
                                      f"{err.message}", location=("steps", step, "params")))
    return problems


def _unfit(fmt: dict[str, Any], shape: tuple[int, ...], target: str) -> str | None:
    """Why ``target`` cannot hold a weight of ``shape`` in ``fmt`` (the constraint and what fits), or None. A target
    module with ``ANY_WEIGHT_FORMAT`` writes the values of a format it has no mapping for (ONNX, pt2)."""
    if getattr(target_module(target), "ANY_WEIGHT_FORMAT", False):
        return None
    mapping = target_mapping(fmt["name"], target)
    try:
        if mapping is None or mapping.scheme(fmt, shape) is None:
            described = ", ".join(f"{k}={v}" for k, v in fmt.items() if k != "name" and v is not None)
            return f"it has no type for {fmt['name']} ({described}); formats it holds: {', '.join(mapped_formats(target))}"
    except Unfit as unfit:
        return f"{unfit.why}; {unfit.nearest}"
    return None
