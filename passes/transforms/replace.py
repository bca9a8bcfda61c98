"""``replace``: swap selected modules for ``Identity`` or a registered module constructor.

The new module must fit where the old one was: it is run on zeros shaped like the node's example
inputs and must return the node's output shape and dtype, or the pass fails naming both shapes.
Constructors are registered in ``mase_lite.layers.replacements``.

Example (the NAS "Linear -> Identity" choice)::

    mg, info = ml.passes.replace(mg, {"by": "name", "targets": ["bert_encoder_layer_1_output_dense"],
                                      "with": "identity"})
    mg, info = ml.passes.replace(mg, {"by": "type", "targets": ["linear"],
                                      "with": {"module": "low_rank_linear", "params": {"rank": 16}}})
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
import torch.fx as fx
import torch.nn as nn
from pydantic import ConfigDict, Field

from mase_lite.layers.replacements import build_replacement
from mase_lite.passes.registry import PassError, PassParams, PassResult, register_pass
from mase_lite.passes.select import Selection, select_nodes

logger = logging.getLogger(__name__)


class ModuleChoice(PassParams):
    """A registered replacement constructor and its keyword params."""

    module: str = Field(description="registered replacement name (see mase_lite.layers.replacements)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword params of the constructor")


class ReplaceParams(Selection):
    """Selection plus what to put in place of every selected module."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    with_: Literal["identity"] | ModuleChoice = Field(alias="with", description='"identity" or {"module", "params"}')


def _concrete_size(d: Any) -> int:
    if isinstance(d, torch.SymInt):
        hint = d.node.hint
        return int(hint) if hint is not None else 2
    return int(d)


def _shape(value: torch.Tensor) -> tuple[int, ...]:
    return tuple(_concrete_size(d) for d in value.shape)


def _example(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.zeros(_shape(value), dtype=value.dtype, device=device)
    return value


def _example_args(node: fx.Node, device: torch.device) -> tuple[tuple, dict]:
    def materialise(arg: Any) -> Any:
        return _example(arg.meta.get("val"), device) if isinstance(arg, fx.Node) else arg

    return fx.node.map_aggregate(node.args, materialise), fx.node.map_aggregate(node.kwargs, materialise)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"shape {list(_shape(value))} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    return type(value).__name__


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (_shape(value), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_signature(v) for v in value)
    return type(value).__name__


def check_fits(node: fx.Node, new: nn.Module, label: str) -> None:
    """Fail unless ``new`` takes ``node``'s example inputs and returns its output shapes and dtypes.

    In module mode the inputs and output are those of the module's first call on the example inputs
    (a model without examples is not checked)."""
    call = getattr(node, "call", None)
    if hasattr(node, "call") and call is None:
        logger.warning("replace: %s in place of %s is not checked: the model has no example inputs", label, node.name)
        return
    if call is not None:
        args, kwargs, expected = call
    else:
        reference = next(iter(list(new.parameters()) + list(new.buffers())), None)
        device = reference.device if reference is not None else torch.device("cpu")
        args, kwargs = _example_args(node, device)
        expected = node.meta.get("val")
    inputs = ", ".join(_describe(a) for a in args if isinstance(a, torch.Tensor))
    was_training = new.training
    try:
        new.eval()
        with torch.no_grad():
            got = new(*args, **kwargs)
    except Exception as err:
        raise PassError(f"replace: {label} cannot take the input of node {node.name!r} ({inputs}): {err}") from None
    finally:
        new.train(was_training)
    if expected is not None and _signature(got) != _signature(expected):
        raise PassError(
            f"replace: {label} does not fit node {node.name!r}: for input {inputs} the node returns "
            f"{_describe(expected)} but the replacement returns {_describe(got)}"
        )


@register_pass("replace", kind="transform", params=ReplaceParams, needs_graph=False)
def replace(mg, params: ReplaceParams):
    """Swap each selected module for ``Identity`` or a registered constructor's module, checking shapes."""
    nodes = select_nodes(mg, params.by, params.targets, params.allow_empty, modules_only=True)
    observe = getattr(mg, "observed_nodes", None)  # module mode: each module's call on the example inputs
    if observe is not None and nodes:
        observed = {n.target: n for n in observe()}
        nodes = [observed[n.target] for n in nodes]
    name, kwargs = ("identity", {}) if params.with_ == "identity" else (params.with_.module, params.with_.params)
    modules = mg.modules
    new_modules: dict[str, nn.Module] = {}
    replaced: dict[str, str] = {}
    for node in nodes:
        if node.target not in new_modules:
            new_modules[node.target] = build_replacement(name, modules[node.target], kwargs)
        new = new_modules[node.target]
        check_fits(node, new, f"{type(new).__name__} (from {name!r}) in place of {type(modules[node.target]).__name__}")
        replaced[node.name] = type(new).__name__
    for target, new in new_modules.items():
        new.train(modules[target].training)
        mg.replace_module(target, new)
    logger.info("replaced %d modules with %s", len(new_modules), name)
    return PassResult({"replaced": replaced})
