"""``quantize``: replace Linear/Conv modules and matmul/bmm/add/mul nodes with quantized versions.

Rules map a selector — an op type (``by: "type"``), a node name (``"name"``) or a regex on node
names (``"regex"``) — to a layer config (flat MASE keys or the nested per-operand form, see
:mod:`mase_lite.layers.quant_config`). The first matching rule wins; ``null`` or ``{"name": null}``
leaves the node alone. ``default`` applies to the Linear/Conv modules no rule matched; matmul, bmm,
add and mul nodes are quantized only when a rule selects them. ``bypass: true`` skips the pass.
Every config is validated against every node it applies to before the graph changes.

Canonical form::

    mg, info = ml.passes.quantize(mg, {
        "by": "type",
        "rules": {"linear": {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4,
                             "weight_width": 8, "weight_frac_width": 4}},
        "default": None})

MASE's form (rules as top-level keys, each wrapped in ``{"config": ...}``) is accepted too::

    {"by": "type", "default": {"config": {"name": None}},
     "linear": {"config": {"name": "integer", "data_in_width": 8, ...}}}

PTQ: run the pass, then evaluate. QAT: run the pass, then train (gradients are straight-through).
Calibrated PTQ: a format parameter ``"auto"`` (integer ``frac_width``, scaled_integer ``scale``, nvfp4
``tensor_amax``) is chosen per node and operand from its values — a weight's own, an activation's from
the ``calibrate`` pass run before — by ``calibration.method`` (minmax, percentile, mse).
``{"name": "mxint", "element_width": 8, "storage": "packed"}`` on a Linear gives a packed
``MXInt8Linear`` instead of a fake-quantized layer (``"activations": "int8"`` beside it: the layer's input
quantized to int8 per block of 32, integer dot products, for inference). A ``preset`` (W4A16, W8A16, W8A8, MXINT8, MXFP4, NVFP4;
:mod:`mase_lite.layers.presets`) is the rules a user would write for every Linear; ``ignore`` leaves nodes alone by
name, module path or ``re:`` regex::

    {"pass": "quantize", "params": {"preset": "W4A16", "ignore": ["lm_head"]}}
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx as fx
import torch.nn as nn
from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mase_lite.infra.errors import UserError
from mase_lite.ir.meta import module_class
from mase_lite.ir.ops import function_packet_name
from mase_lite.infra.heap import return_free_memory
from mase_lite.layers.presets import MIXED_PRESETS, PRESETS, mixed_rules, tied_with
from mase_lite.layers.quant_config import FUNCTION_OPERANDS, LAYER_OPERANDS, OperandFormat, QuantConfig, QuantSpec, resolve
from mase_lite.numerics.calibration import Method, auto_keys, choose
from mase_lite.layers.quant_functional import QUANTIZED_FUNCTIONS, QuantizedFunction
from mase_lite.layers.quantized import is_quantizable_layer, quantize_module
from mase_lite.passes.registry import PassError, PassParams, PassResult, register_pass
from mase_lite.passes.select import SelectBy, is_output_head, node_matches

logger = logging.getLogger(__name__)

# aten packet names of the functional ops that can be quantized, and the op each becomes.
FUNCTION_TARGETS = {"matmul": "matmul", "mm": "matmul", "bmm": "bmm", "add": "add", "mul": "mul"}
QUANTIZABLE = "Linear, Conv1d, Conv2d and transformers' Conv1D modules, and matmul, bmm, add and mul nodes"


class Calibration(PassParams):
    """How an ``"auto"`` format parameter (integer ``frac_width``, scaled_integer ``scale``, nvfp4 ``tensor_amax``)
    is chosen from the values an operand takes (see :mod:`mase_lite.numerics.calibration`)."""

    method: Method = Field("minmax", description="minmax: cover every value; percentile: cover that percentile of the "
                           "magnitudes; mse: the candidate with the least squared error")
    percentile: float = Field(99.99, gt=0, le=100, description="the percentile of method 'percentile'")
    grid: int = Field(100, ge=2, le=10_000, description="clipping ratios tried by method 'mse'")


class QuantizeParams(PassParams):
    """Which nodes to quantize, and how."""

    by: SelectBy = Field("type", description="match rule keys against op types, node names, or regexes on node names")
    rules: dict[str, QuantSpec | None] = Field(
        default_factory=dict, description="selector -> layer config (nested, or MASE's flat keys); null skips the node"
    )
    default: QuantSpec | None = Field(
        None, description="config for the Linear/Conv modules no rule matched; null: leave them alone"
    )
    bypass: bool = Field(False, description="do nothing")
    allow_unmatched: bool = Field(
        False, description="warn instead of failing when a rule (or the default) matches no quantizable node"
    )
    calibration: Calibration = Field(
        default_factory=lambda: Calibration(),
        description="how 'auto' format parameters are chosen: from the weight itself, and from the calibrate pass's "
        "activation statistics",
    )
    preset: Literal[tuple(PRESETS) + tuple(MIXED_PRESETS)] | None = Field(  # type: ignore[valid-type]
        None, description="a named scheme for every Linear (W4A16, W8A16, W8A8, MXINT8, MXFP4, NVFP4, or llama.cpp's Q8_0, "
        "Q4_0, Q4_K, Q5_K, Q6_K; the mixed Q4_K_M and Q5_K_M choose per layer as llama-quantize does): expands to "
        "by 'type' and rules {'linear': its config}"
    )
    ignore: list[str] = Field(default_factory=list, description="nodes left alone whatever the rules say: node names "
                              "or module paths, or 're:<regex>' on either (e.g. ['lm_head'])")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """A preset is exactly the rules a user would write for it (on a copy)."""
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        preset = data["preset"]
        if preset not in PRESETS and preset not in MIXED_PRESETS:
            raise PydanticCustomError("quant_preset", "preset {preset!r} is unknown; allowed: {allowed}",
                                      {"preset": preset, "allowed": ", ".join([*PRESETS, *MIXED_PRESETS])})
        given = sorted(k for k in ("rules", "default") if data.get(k)) + (["by"] if data.get("by", "type") != "type" else [])
        if given:
            raise PydanticCustomError("quant_preset", "give a preset or rules, not both (got preset and {given})",
                                      {"given": ", ".join(given)})
        if preset in MIXED_PRESETS:  # chosen per layer: see for_model
            return data
        return {**{k: v for k, v in data.items() if k != "preset"}, "by": "type",
                "rules": {"linear": copy.deepcopy(dict(PRESETS[preset]))}}

    def for_model(self, mg) -> "QuantizeParams":
        """These params with a mixed preset (Q4_K_M, Q5_K_M) expanded into rules by module path for ``mg``'s
        Linears (:func:`mase_lite.layers.presets.mixed_rules`); the params themselves otherwise."""
        if self.preset not in MIXED_PRESETS:
            return self
        modules = mg.modules
        columns = {str(n.target): modules[n.target].weight.shape[-1] for n in mg.nodes
                   if _kind(n, modules) == "layer" and isinstance(modules[n.target], nn.Linear)}
        head = next((str(n.target) for n in mg.nodes if _kind(n, modules) == "layer" and is_output_head(n)), None)
        rules = mixed_rules(self.preset, columns, head, tied=head is not None and bool(tied_with(mg.model, head)))
        return type(self).model_validate({**self.model_dump(exclude={"preset", "rules", "by"}), "by": "name",
                                          "rules": rules})

    @model_validator(mode="before")
    @classmethod
    def _mase_rules(cls, data: Any) -> Any:
        """MASE puts rules next to ``by`` and ``default``: move them into ``rules`` (on a copy)."""
        if not isinstance(data, dict):
            return data
        extra = {k: v for k, v in data.items() if k not in cls.model_fields}
        if not extra:
            return data
        rules = dict(data.get("rules") or {})
        for key, value in extra.items():
            if key in rules:
                raise PydanticCustomError(
                    "quant_rules", f"rule {key!r} is given twice: as a top-level key and in 'rules'"
                )
            rules[key] = value
        return {**{k: v for k, v in data.items() if k in cls.model_fields}, "rules": rules}

    @field_validator("rules", mode="before")
    @classmethod
    def _unwrap_rules(cls, rules: Any) -> Any:
        if not isinstance(rules, dict):
            return rules
        return {key: _unwrapped(value) for key, value in rules.items()}

    @field_validator("default", mode="before")
    @classmethod
    def _unwrap_default(cls, default: Any) -> Any:
        return _unwrapped(default)

    @model_validator(mode="after")
    def _usable_configs(self) -> "QuantizeParams":
        """Each config must fit a layer or a functional op (which one is decided per node)."""
        configs = {f"rules.{key}": spec for key, spec in self.rules.items()} | {"default": self.default}
        for where, spec in configs.items():
            if spec is None:
                continue
            try:
                resolve(spec, LAYER_OPERANDS, where)
            except ValueError as layer_error:
                try:
                    resolve(spec, FUNCTION_OPERANDS, where)
                except ValueError:
                    raise PydanticCustomError("quant_config", str(layer_error).replace("{", "{{").replace("}", "}}")) from None
        return self

    @model_validator(mode="after")
    def _valid_regexes(self) -> "QuantizeParams":
        if self.by == "regex":
            for key in self.rules:
                try:
                    re.compile(key)
                except re.error as err:
                    raise PydanticCustomError("quant_regex", f"rules.{key}: not a valid regex ({err})") from None
        for i, entry in enumerate(self.ignore):
            if entry.startswith("re:"):
                try:
                    re.compile(entry[3:])
                except re.error as err:
                    raise PydanticCustomError("quant_regex", f"ignore.{i}: not a valid regex ({err})") from None
        return self


def _unwrapped(value: Any) -> Any:
    """MASE wraps each config as ``{"config": {...}}``; ``{"name": null}`` means "leave alone"."""
    if isinstance(value, dict) and set(value) == {"config"}:
        value = value["config"]
    if isinstance(value, dict) and "name" in value and value["name"] is None:
        return None
    return value


@dataclass
class _Planned:
    """One replacement decided before anything changes."""

    nodes: list[fx.Node]
    rule: str
    config: QuantConfig
    module: nn.Module
    kind: str  # "layer" or "function"


def _kind(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """``"layer"``, ``"function"`` or ``None`` (not quantizable)."""
    if node.op == "call_module":
        module = modules.get(node.target)
        if module is not None and is_quantizable_layer(module):
            return "layer"
        return "function" if isinstance(module, QuantizedFunction) else None
    if node.op == "call_function" and isinstance(node.meta.get("val"), torch.Tensor):
        return "function" if function_packet_name(node.target) in FUNCTION_TARGETS else None
    return None


def _function_op(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    if node.op == "call_module":
        return modules[node.target].mase_op
    return FUNCTION_TARGETS[function_packet_name(node.target)]


def _matches(node: fx.Node, by: str, key: str) -> bool:
    """A rule's selector; by type, ``linear`` also takes transformers' ``Conv1D`` (GPT-2's Linear)."""
    if by == "type" and key == "linear" and node.meta.get("mase", {}).get("op") == "hf_conv1d":
        return True
    return node_matches(node, by, key)


def _ignored(node: fx.Node, ignore: list[str]) -> bool:
    """Whether ``node`` (by its name or module path) is in ``ignore``: a name, or ``re:`` and a regex."""
    names = [node.name] + ([str(node.target)] if node.op == "call_module" else [])
    return any(re.fullmatch(entry[3:], name) if entry.startswith("re:") else entry == name
               for entry in ignore for name in names)


def _rule_of(node: fx.Node, params: QuantizeParams) -> str | None:
    return next((key for key in params.rules if _matches(node, params.by, key)), None)


def _check_rules_matched(mg, params: QuantizeParams, matched: set[str], modules: dict[str, nn.Module]) -> None:
    for key in params.rules:
        if key in matched:
            continue
        hits = [n for n in mg.nodes if _matches(n, params.by, key)]
        quantizable_hits = [n.name for n in hits if _kind(n, modules)]
        if quantizable_hits:
            problem = PassError(f"every node it matches ({', '.join(quantizable_hits[:5])}) is taken by an earlier rule",
                                location=("rules", key))
        elif hits:
            ops = sorted({str(n.meta.get("mase", {}).get("op")) for n in hits})
            raise PassError(
                f"matches only nodes that cannot be quantized ({', '.join(n.name for n in hits[:5])}; "
                f"ops {', '.join(ops)}); quantizable: {QUANTIZABLE}",
                location=("rules", key),
            )
        else:
            quantizable = sorted({n.name for n in mg.nodes if _kind(n, modules)})
            listed = ", ".join(quantizable[:40]) or "none"
            problem = PassError(f"matches no node (by {params.by}); quantizable nodes: {listed}", location=("rules", key))
        if not params.allow_unmatched:
            raise problem
        logger.warning("%s", problem)


def _check_default_applies(mg, params: QuantizeParams, modules: dict[str, nn.Module]) -> None:
    """A ``default`` on a graph without any Linear/Conv node (e.g. all wrapped by LoRA) quantizes nothing: say so."""
    if params.default is None or any(_kind(n, modules) == "layer" for n in mg.nodes):
        return
    ops = sorted({str(n.meta["mase"]["op"]) for n in mg.nodes if n.op == "call_module"})
    problem = PassError(
        f"the graph has no Linear/Conv1d/Conv2d node for it to quantize "
        f"(module ops: {', '.join(ops) or 'none'}); merge LoRA adapters first (lora_merge), or set allow_unmatched",
        location=("default",),
    )
    if not params.allow_unmatched:
        raise problem
    logger.warning("%s", problem)


def _plan(mg, params: QuantizeParams) -> tuple[list[_Planned], list[str], list[dict[str, str]]]:
    """Every replacement, built and validated, without touching the graph."""
    modules = mg.modules
    layers: dict[str, _Planned] = {}
    functions: list[_Planned] = []
    skipped: list[str] = []
    integers: list[dict[str, str]] = []  # integer operands (ids, indices) a rule selected and left alone
    quantizing: set[str] = set()  # the rules that quantize some node
    matched: set[str] = set()
    parsed: dict[tuple[str, str], QuantConfig | None] = {}
    for node in mg.nodes:
        kind = _kind(node, modules)
        if kind is None:
            continue
        rule = _rule_of(node, params)
        if params.ignore and _ignored(node, params.ignore):
            skipped.append(node.name)
            if rule is not None:
                matched.add(rule)
            continue
        if rule is not None:
            matched.add(rule)
            raw, where = params.rules[rule], f"rules.{rule}"
        elif kind == "layer" and params.default is not None:
            raw, where = params.default, "default"
        else:
            continue
        if (where, kind) not in parsed:
            operands = LAYER_OPERANDS if kind == "layer" else FUNCTION_OPERANDS
            try:
                parsed[where, kind] = resolve(raw, operands, where) if raw is not None else None
            except UserError as err:
                raise PassError(f"{err.message} (for node {node.name!r})", err.location, err.problems) from None
            except ValueError as err:
                raise PassError(f"{err} (for node {node.name!r})") from None
        config = parsed[where, kind]
        if config is None:
            skipped.append(node.name)
            continue
        config = _calibrated(mg, node, modules, config, params.calibration, where)
        if kind == "layer":
            planned = layers.get(node.target)
            if planned is not None and planned.config != config:
                raise PassError(
                    f"module {node.target!r} is called by nodes {planned.nodes[0].name!r} and {node.name!r} "
                    f"with different configs ({planned.rule} and {where}); one module has one config"
                )
            if planned is None:
                if config.storage == "packed":
                    _check_weight_unshared(mg, node, where)
                try:
                    module = quantize_module(modules[node.target], config)
                except ValueError as err:
                    raise PassError(f"node {node.name!r}: {err}", location=(where,)) from None
                layers[node.target] = _Planned([node], where, config, module, kind)
                quantizing.add(where)
            else:
                planned.nodes.append(node)
        else:
            config, left = _float_operands(node, config)
            integers.extend({"node": node.name, "operand": operand, "rule": where} for operand in left)
            if config is None:
                skipped.append(node.name)
                continue
            quantizing.add(where)
            val = node.meta["val"]
            module = QUANTIZED_FUNCTIONS[_function_op(node, modules)](config, device=val.device, dtype=val.dtype)
            module.train(mg.model.training)
            functions.append(_Planned([node], where, config, module, kind))
    _check_only_integers(mg, integers, quantizing)
    _check_rules_matched(mg, params, matched, modules)
    _check_default_applies(mg, params, modules)
    return list(layers.values()) + functions, skipped, [{k: e[k] for k in ("node", "operand")} for e in integers]


def layer_configs(mg, params: QuantizeParams) -> dict[str, QuantConfig | None]:
    """The config each Linear/Conv module would get (module path -> config, None: left float), decided as the pass
    decides but without changing anything; a config the pass would refuse is left out (the pass names it). What a
    pipeline checks its packed layers and export targets against before its first step."""
    configs: dict[str, QuantConfig | None] = {}
    if params.bypass:
        return configs
    params = params.for_model(mg)
    for node in mg.nodes:
        if _kind(node, mg.modules) != "layer":
            continue
        rule = _rule_of(node, params)
        raw = params.rules[rule] if rule is not None else params.default
        if raw is None or (params.ignore and _ignored(node, params.ignore)):
            configs[node.target] = None
            continue
        try:
            configs[node.target] = resolve(raw, LAYER_OPERANDS, "rules")
        except (UserError, ValueError):
            continue
    return configs


def weight_formats(configs: dict[str, QuantConfig | None]) -> dict[str, dict[str, Any] | None]:
    """The weight format dict of each of :func:`layer_configs`' configs (module path -> format, None: left float)."""
    formats: dict[str, dict[str, Any] | None] = {}
    for path, config in configs.items():
        weight = config.get("weight") if config is not None else None
        formats[path] = weight.format.as_dict(weight.params) if weight is not None else None
    return formats


def _operand_values(mg, node: fx.Node, modules: dict[str, nn.Module], operand: str, where: str) -> torch.Tensor:
    """The values an operand takes: a parameter itself, or the calibrate pass's sample of an activation."""
    module = modules.get(node.target) if node.op == "call_module" else None
    if operand in ("weight", "bias") and module is not None and getattr(module, operand, None) is not None:
        value = getattr(module, operand)
        return value.t() if operand == "weight" and getattr(module, "mase_op", None) == "hf_conv1d" else value
    kind = "data_out" if operand == "data_out" else "data_in"
    record = (mg.analyses.get("calibration") or {}).get(node.name, {}).get(kind)
    if record is None:
        raise PassError(
            f"'auto' for node {node.name!r} needs the calibrate pass's statistics of its {kind}; "
            "run calibrate (selecting this node) before quantize",
            location=(where, operand),
        )
    return record["samples"]


def _calibrated(mg, node: fx.Node, modules: dict[str, nn.Module], config: QuantConfig, how: Calibration,
                where: str) -> QuantConfig:
    """``config`` with every ``"auto"`` parameter chosen for this node's operand values."""
    operands = dict(config.operands)
    for operand, spec in config.operands.items():
        fmt = spec.as_dict()
        keys = auto_keys(fmt)
        if not keys:
            continue
        values = _operand_values(mg, node, modules, operand, where)
        chosen = choose(fmt["name"], fmt, values, how.method, how.percentile, how.grid)
        params = spec.format.validate({**{k: v for k, v in fmt.items() if k != "name"}, keys[0]: chosen})
        operands[operand] = OperandFormat(spec.format, params, spec.ste)
    return config if operands == dict(config.operands) else dataclasses.replace(config, operands=operands)


def _check_weight_unshared(mg, node: fx.Node, where: str) -> None:
    """A packed layer has no float weight: refuse when the graph reads that weight elsewhere (tied weights)."""
    readers = [n for n in mg.nodes if n.op == "get_attr" and n.target == f"{node.target}.weight"]
    if readers:
        users = ", ".join(u.name for r in readers for u in r.users) or readers[0].name
        raise PassError(
            f"node {node.name!r}: its weight is also read by {users} (tied weights), and a packed layer "
            "keeps no float weight; leave this layer fake-quantized (a rule without storage 'packed') or null",
            location=(where,),
        )


def _float_operands(node: fx.Node, config: QuantConfig) -> tuple[QuantConfig | None, list[str]]:
    """``config`` without the operands of a functional op that are tensors of integers (position ids, indices: no
    number format holds them), and those operands; None when no quantized input is left."""
    left, floats = [], set()
    for arg, operand in zip(node.args, ("data_in_0", "data_in_1")):
        val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if isinstance(val, torch.Tensor) and val.is_floating_point():
            floats.add(operand)
        elif config.get(operand) is not None and isinstance(val, torch.Tensor):
            left.append(operand)
    if not left:
        return config, []
    kept = {k: v for k, v in config.operands.items() if k in floats or k == "data_out"}
    if not set(kept) - {"data_out"}:
        return None, left
    return dataclasses.replace(config, operands=kept), left


def _check_only_integers(mg, integers: list[dict[str, str]], quantizing: set[str]) -> None:
    """A rule that selected integer operands only (it quantizes nothing) is refused, naming its first node."""
    for entry in integers:
        if entry["rule"] in quantizing:
            continue
        node = next(n for n in mg.nodes if n.name == entry["node"])
        arg = node.args[("data_in_0", "data_in_1").index(entry["operand"])]
        raise PassError(
            f"node {node.name!r}: its {entry['operand']} ({arg.name}) is a tensor of "
            f"{str(arg.meta['val'].dtype).removeprefix('torch.')} values (ids or indices), which a number format "
            "cannot quantize, and the rule selects no float operand; exclude the node (a null rule)",
            location=(entry["rule"],),
        )


def _free_name(mg, base: str) -> str:
    modules = mg.modules
    name, i = base, 1
    while name in modules or hasattr(mg.model, name):
        name, i = f"{base}_{i}", i + 1
    return name


def _apply(mg, planned: _Planned) -> None:
    node = planned.nodes[0]
    if planned.kind == "layer" or node.op == "call_module":
        mg.replace_module(node.target, planned.module)
        return
    name = _free_name(mg, f"{node.name}_quantized")
    mg.model.add_submodule(name, planned.module)
    node.op = "call_module"
    node.target = name


def _apply_all(mg, plan: list[_Planned]) -> None:
    """Every replacement, or none: when one fails, the modules and nodes already changed are put back."""
    modules = mg.modules
    saved_modules = {p.nodes[0].target: modules[p.nodes[0].target] for p in plan if p.nodes[0].op == "call_module"}
    saved_nodes = [(p.nodes[0], p.nodes[0].op, p.nodes[0].target) for p in plan]
    added = set(modules)
    try:
        for planned in plan:
            _apply(mg, planned)
    except Exception as err:
        for target, module in saved_modules.items():
            mg.replace_module(target, module)
        for node, op, target in saved_nodes:
            node.op, node.target = op, target
        for name in set(mg.modules) - added:
            if "." not in name:
                delattr(mg.model, name)
        if isinstance(err, PassError):
            raise
        raise PassError(f"quantizing failed, the graph is as before: {type(err).__name__}: {err}") from err


def _operand_of_inputs(node: fx.Node, kind: str) -> dict[fx.Node, str]:
    names = ("data_in",) if kind == "layer" else ("data_in_0", "data_in_1")
    operands: dict[fx.Node, str] = {}
    for arg, operand in zip(node.args, names):
        if isinstance(arg, fx.Node):
            operands.setdefault(arg, operand)
    return operands


def _annotate(node: fx.Node, planned: _Planned) -> dict[str, Any]:
    """Write the operand formats into ``node.meta["mase"]`` (dtype names where not quantized), under the
    new module's class, so the pass manager's metadata refresh keeps them. The metadata is copied first:
    a copied graph (``copy.deepcopy``) shares its nodes' metadata dicts with the original until a refresh."""
    formats = planned.config.formats()
    meta = node.meta["mase"] = copy.deepcopy(node.meta["mase"])
    meta["module"] = module_class(planned.module).__name__
    inputs = _operand_of_inputs(node, planned.kind)
    for inp, entry in zip(node.all_input_nodes, meta["args"]):
        if entry is not None:
            entry["format"] = formats.get(inputs.get(inp), entry["dtype"])
    for entry in meta["results"][:1]:
        if entry is not None:
            entry["format"] = formats.get("data_out", entry["dtype"])
    for pname in ("weight", "bias"):
        entry = meta["params"].get(pname)
        if entry is not None:
            entry["format"] = formats.get(pname, entry["dtype"])
    return formats


@register_pass("quantize", kind="transform", params=QuantizeParams, needs_graph=False, streams=True)
def quantize(mg, params: QuantizeParams):
    """Swap matched Linear/Conv modules and matmul/bmm/add/mul nodes for quantized ones; formats go to metadata.

    On a plain module (module mode) the Linear/Conv modules are quantized; matmul, bmm, add and mul are
    functions there, not modules, so rules can select modules only."""
    if params.bypass:
        return PassResult({"bypassed": True, "replaced": [], "skipped": []}, changed=False)
    params = params.for_model(mg)
    plan, skipped, integers = _plan(mg, params)
    _apply_all(mg, plan)
    if any(p.config.storage == "packed" for p in plan):
        gc.collect()
        return_free_memory()  # the float weights of packed layers: back to the operating system
    replaced, resolved = [], {}
    for planned in plan:
        for node in planned.nodes:
            resolved[node.name] = _spec_of(planned.config)
            formats = _annotate(node, planned)
            replaced.append(
                {
                    "node": node.name,
                    "target": str(node.target),
                    "op": node.meta["mase"]["op"],
                    "module": type(planned.module).__name__,
                    "rule": planned.rule,
                    "formats": formats,
                }
            )
    logger.info("quantized %d nodes (%d left alone by a null config)", len(replaced), len(skipped))
    chose = any(auto_keys(f) for rule in [*params.rules.values(), params.default] if rule is not None
                for f in rule.model_dump().values() if isinstance(f, dict))
    replay = {"by": "name", "rules": resolved} if chose else None  # a load replays what calibration chose
    if integers:
        logger.info("left %d integer operands (ids, indices) unquantized", len(integers))
    return PassResult({"replaced": replaced, "skipped": skipped, "count": len(replaced), "integer_operands": integers},
                      replay_params=replay, changed=bool(replaced))


def _spec_of(config: QuantConfig) -> dict[str, Any]:
    """The nested spec that gives ``config`` back."""
    operands = {name: {**spec.as_dict(), "ste": spec.ste} for name, spec in config.operands.items()}
    activations = {"activations": config.activations} if config.activations != "float" else {}
    return {"storage": config.storage, **activations, **operands}
