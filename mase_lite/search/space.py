"""A search space over paths into a pipeline spec: resolve, expand per layer, check, sample, materialize.

Paths address the pipeline dict: ``steps.<index|label|pass>.params...``, ``model.hf_config.<field>``,
``data.<field>``, ``seed``. Per-layer entries carry a ``nodes`` selector and expand to one
parameter per matched node of the captured model, ``{node}`` in the path standing for its name.

Example::

    space = Space(base_pipeline_dict, spec.space)
    space.check()                                 # UserError naming space.<i>... before any trial
    values = space.suggest(trial)                 # {param name: value}, through Optuna
    pipeline = space.materialize(values)          # a fresh pipeline dict for this trial
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mase_lite.errors import UserError
from mase_lite.passes.registry import PassError, get_pass
from mase_lite.pipeline.spec import PipelineSpec, check_pipeline, load_spec
from mase_lite.search.spec import ChoiceParam, ConstParam, FloatParam, IncludeParam, IntParam, LogFloatParam, NodeSelector

PRIMITIVE = (type(None), bool, int, float, str)
MAX_GRID = 10**6  # points of a grid sampler's grid (Optuna lists them all)


class PathError(UserError):
    """A space path that does not address anything the pipeline has."""


def _step_index(steps: list[dict], key: str) -> int:
    if re.fullmatch(r"-?\d+", key):
        i = int(key)
        if not -len(steps) <= i < len(steps):
            raise PathError(f"steps.{key}: the pipeline has {len(steps)} steps")
        return i % len(steps)
    labelled = [i for i, s in enumerate(steps) if s.get("label") == key]
    if labelled:
        return labelled[0]
    named = [i for i, s in enumerate(steps) if s.get("pass") == key and not s.get("label")]
    named = named or [i for i, s in enumerate(steps) if s.get("pass") == key]
    listing = ", ".join(f"{i} {s.get('pass')}" + (f" ({s['label']})" if s.get("label") else "") for i, s in enumerate(steps))
    if not named:
        raise PathError(f"steps.{key}: no step has this label or pass; steps: {listing}")
    if len(named) > 1:
        raise PathError(f"steps.{key}: {len(named)} steps run {key!r} ({', '.join(map(str, named))}); use an index or a label; steps: {listing}")
    return named[0]


def resolve(pipeline: dict, path: str) -> list[str | int]:
    """The concrete keys ``path`` stands for in ``pipeline`` (steps by index), checked as far as knowable.

    >>> resolve({"steps": [{"pass": "train"}, {"pass": "quantize", "label": "q"}]}, "steps.q.params.rules")
    ['steps', 1, 'params', 'rules']
    """
    parts = path.split(".")
    top = parts[0]
    allowed = sorted(PipelineSpec.model_fields)
    if top not in allowed:
        raise PathError(f"{path}: {top!r} is not a pipeline key; allowed: {', '.join(allowed)}")
    if top != "steps":
        if top == "model" and len(parts) >= 3 and parts[1] == "hf_config":
            _check_config_field(pipeline.get("model") or {}, parts[2], path)
        return list(parts)
    if len(parts) < 3:
        raise PathError(f"{path}: say which step and which of its fields, e.g. steps.<index|label|pass>.params.<name>")
    steps = pipeline.get("steps") or []
    i = _step_index(steps, parts[1])
    field = parts[2]
    if field not in ("params", "pass", "label", "draw_after"):
        raise PathError(f"{path}: a step has pass, params, label and draw_after; got {field!r}")
    if field == "params" and len(parts) > 3:
        try:
            fields = get_pass(steps[i].get("pass", "")).params.model_fields
        except PassError as err:
            raise PathError(f"{path}: {err}") from None
        if parts[3] not in fields:
            raise PathError(
                f"{path}: pass {steps[i]['pass']!r} has no parameter {parts[3]!r}; its parameters: {', '.join(fields)}"
            )
    return ["steps", i, *parts[2:]]


def _check_config_field(model: dict, field: str, path: str) -> None:
    from transformers import AutoConfig

    config = model.get("hf_config") or {}
    if model.get("pretrained") or model.get("factory"):
        raise PathError(f"{path}: the pipeline's model is not built from hf_config")
    model_type = config.get("model_type", "bert")
    try:
        known = AutoConfig.for_model(model_type).to_dict()
    except ValueError:
        return  # the model section's own check names the bad model_type
    if field not in known:
        raise PathError(f"{path}: {model_type} configs have no field {field!r}")


def set_path(pipeline: dict, keys: list[str | int], value: Any) -> None:
    """Set ``value`` at ``keys`` in ``pipeline``, creating missing dicts on the way."""
    target: Any = pipeline
    for key in keys[:-1]:
        if isinstance(target, list):
            target = target[key]
            continue
        if not isinstance(target.get(key), (dict, list)):
            target[key] = {}
        target = target[key]
    target[keys[-1]] = copy.deepcopy(value)


def get_path(pipeline: dict, keys: list[str | int]) -> Any:
    target: Any = pipeline
    for key in keys:
        if isinstance(target, list):
            target = target[key]
        elif isinstance(target, dict) and key in target:
            target = target[key]
        else:
            return None
    return target


@dataclass(frozen=True)
class Node:
    """What a node selector can see of a captured node."""

    name: str
    op: str | None
    module: str | None
    weight_shape: tuple[int, ...] | None


def select(nodes: list[Node], selector: NodeSelector) -> list[str]:
    """Names of the nodes ``selector`` matches, in graph order."""
    chosen = []
    for n in nodes:
        if selector.op is not None and selector.op not in (n.op, n.module):
            continue
        if selector.regex is not None and re.fullmatch(selector.regex, n.name) is None:
            continue
        if selector.square and not (n.weight_shape and len(n.weight_shape) == 2 and n.weight_shape[0] == n.weight_shape[1]):
            continue
        chosen.append(n.name)
    return chosen


def captured_nodes(pipeline: dict) -> list[Node]:
    """The nodes of the pipeline's model as captured before any step (cached per model section)."""
    key = json.dumps({k: pipeline.get(k) for k in ("model", "inputs", "example_inputs", "capture")}, sort_keys=True, default=str)
    return _capture(key)


@lru_cache(maxsize=8)
def _capture(key: str) -> list[Node]:
    from mase_lite.ir.capture import CaptureError
    from mase_lite.ir.graph import MaseGraph
    from mase_lite.ir.module_model import ModuleModel
    from mase_lite.ir.serialize import example_inputs_from_specs
    from mase_lite.pipeline.runner import capture_inputs
    from mase_lite.train.models import build_model

    sections = json.loads(key)
    spec = load_spec({k: v for k, v in sections.items() if v is not None} | {"model": sections["model"] or {}})
    model = build_model(spec.model)
    if spec.example_inputs is not None:
        specs = {name: s.model_dump() for name, s in spec.example_inputs.items()}
        inputs = {"example_inputs": example_inputs_from_specs(specs)}
    else:
        inputs = capture_inputs(model, None, spec.model.task, spec.inputs)
    try:  # module mode's nodes are the model's leaf modules, named as a capture names them
        mg = ModuleModel(model) if spec.capture == "modules" else MaseGraph(model, **inputs)
    except CaptureError:
        if spec.capture == "graph":
            raise
        mg = ModuleModel(model)
    nodes = []
    for n in mg.nodes:
        meta = n.meta.get("mase", {})
        weight = (meta.get("params") or {}).get("weight")
        shape = tuple(weight["shape"]) if weight and all(isinstance(d, int) for d in weight["shape"]) else None
        nodes.append(Node(n.name, meta.get("op"), meta.get("module"), shape))
    return nodes


def _param_name(entry, node: str | None) -> str:
    base = entry.name or entry.path
    if node is None:
        return base
    return base.replace("{node}", node) if "{node}" in base else f"{base}.{node}"


def _encoded(entry: ChoiceParam) -> bool:
    """Choices that are not plain scalars go to Optuna as indices."""
    return not all(isinstance(v, PRIMITIVE) for v in entry.values)


def candidates(entry) -> list[tuple[str, Any]]:
    """(JSON path suffix, value) of the values a static check tries for ``entry``."""
    if isinstance(entry, ChoiceParam):
        return [(f"values.{j}", v) for j, v in enumerate(entry.values)]
    if isinstance(entry, IncludeParam):
        return [("nodes", True)]
    if isinstance(entry, ConstParam):
        return [("value", entry.value)]
    return [("low", entry.low), ("high", entry.high)]


def grid_count(entry, where: str) -> int:
    """How many values a grid sampler walks for ``entry`` (counted, not listed)."""
    if isinstance(entry, ChoiceParam):
        return len(entry.values)
    if isinstance(entry, IncludeParam):
        return 2
    if isinstance(entry, IntParam) and not entry.log:
        return (entry.high - entry.low) // entry.step + 1
    if isinstance(entry, FloatParam) and entry.step is not None:
        return int(round((entry.high - entry.low) / entry.step)) + 1
    raise UserError(f"{where}: the grid sampler needs choices, unlogged ints or floats with a step")


def grid_values(entry, where: str) -> list[Any]:
    """The values a grid sampler walks for ``entry`` (as Optuna stores them)."""
    if isinstance(entry, ChoiceParam):
        return list(range(len(entry.values))) if _encoded(entry) else list(entry.values)
    if isinstance(entry, IncludeParam):
        return [False, True]
    if isinstance(entry, IntParam) and not entry.log:
        return list(range(entry.low, entry.high + 1, entry.step))
    if isinstance(entry, FloatParam) and entry.step is not None:
        count = int(round((entry.high - entry.low) / entry.step)) + 1
        return [entry.low + k * entry.step for k in range(count)]
    raise UserError(f"{where}: the grid sampler needs choices, unlogged ints or floats with a step")


def _well_formed(pipeline: Any) -> bool:
    """Whether paths can be looked up in ``pipeline``: an object whose steps (if any) are a list of objects."""
    steps = pipeline.get("steps", []) if isinstance(pipeline, dict) else None
    return isinstance(steps, list) and all(isinstance(s, dict) for s in steps)


class Space:
    """The entries of a search spec bound to one base pipeline dict.

    ``source`` names the base pipeline in errors that are its own (not the space's); a ``recorded``
    pipeline came from a report (see :func:`mase_lite.pipeline.spec.load_spec`).
    """

    def __init__(self, pipeline: dict, entries: list, where: str = "space", source: str = "pipeline",
                 recorded: bool = False):
        self.pipeline = pipeline
        self.entries = entries
        self.where = where
        self.source = source
        self.recorded = recorded
        if not _well_formed(pipeline):
            self._validate(pipeline)  # raises the base pipeline's own error
        self.keys: list[list[str | int]] = []
        self.tied: list[list[tuple[list[str | int], float]]] = []  # (keys, scale) of each entry's `also`
        problems = []
        for i, entry in enumerate(entries):
            try:
                self.keys.append(resolve(pipeline, entry.path))
            except PathError as err:
                problems.append(f"{where}.{i}.path: {err}")
            tied = []
            for j, t in enumerate(entry.also):
                try:
                    tied.append((resolve(pipeline, t.path), t.scale))
                except PathError as err:
                    problems.append(f"{where}.{i}.also.{j}.path: {err}")
            self.tied.append(tied)
        if problems:
            raise UserError("search space check failed:\n" + "\n".join(problems))

    def nodes(self, entry, pipeline: dict | None = None) -> list[str]:
        """The nodes a per-layer entry expands over for ``pipeline``'s model (default: the base)."""
        return select(captured_nodes(pipeline or self.pipeline), entry.nodes)

    def _set(self, pipeline: dict, i: int, value: Any, nodes: dict[str, Any] | None = None) -> None:
        entry, keys = self.entries[i], self.keys[i]
        if isinstance(entry, IncludeParam):
            current = get_path(pipeline, keys)
            chosen = [n for n, keep in (nodes or {}).items() if keep]
            set_path(pipeline, keys, list(current or []) + chosen)
        elif entry.nodes is not None:
            for node, v in (nodes or {}).items():
                for path, scale in [(keys, 1.0), *self.tied[i]]:
                    set_path(pipeline, [k.replace("{node}", node) if isinstance(k, str) else k for k in path], scaled(v, scale))
        else:
            for path, scale in [(keys, 1.0), *self.tied[i]]:
                set_path(pipeline, path, scaled(value, scale))

    def _fill(self, pipeline: dict, i: int, value: Any, names: list[str]) -> None:
        self._set(pipeline, i, value, {n: value for n in names} if self.entries[i].nodes is not None else None)

    def check(self) -> None:
        """Try each entry's candidates (others at their first, then their last value) against the pipeline
        checks; raise one UserError naming ``space.<i>.<values.j|low|high>`` and the pass's message."""
        nodes = {i: self.nodes(e) for i, e in enumerate(self.entries) if e.nodes is not None}
        problems = []
        for i, entry in enumerate(self.entries):
            if entry.nodes is not None and not nodes[i]:
                problems.append(f"{self.where}.{i}.nodes: matches no node of the captured model")
        if problems:
            raise UserError("search space check failed:\n" + "\n".join(problems))
        contexts = [[candidates(e)[0][1] for e in self.entries], [candidates(e)[-1][1] for e in self.entries]]
        self._check_base(self._filled(contexts[0], nodes))
        for i, entry in enumerate(self.entries):
            for suffix, value in _distinct(candidates(entry)):
                errors = []
                for context in contexts:
                    try:
                        self._validate(self._filled([*context[:i], value, *context[i + 1:]], nodes))
                    except UserError as err:
                        errors.append(str(err))
                    else:
                        break
                if len(errors) == len(contexts):
                    problems.append(f"{self.where}.{i}.{suffix} ({entry.path} = {_shown(value)}): {errors[0]}")
        if problems:
            raise UserError("search space check failed:\n" + "\n".join(problems))

    def _filled(self, values: list[Any], nodes: dict[int, list[str]]) -> dict:
        pipeline = copy.deepcopy(self.pipeline)
        for k in self.order():
            self._fill(pipeline, k, values[k], nodes.get(k, []))
        return pipeline

    def _validate(self, pipeline: Any) -> PipelineSpec:
        spec = load_spec(pipeline, recorded=self.recorded, name=self.source)
        check_pipeline(spec)
        return spec

    def _check_base(self, first: dict) -> None:
        """Blame the base pipeline for an error it has whatever the space sets (first values tried)."""
        try:
            self._validate(self.pipeline)
        except UserError as err:
            base_error = str(err)
        else:
            return
        try:
            self._validate(first)
        except UserError as err:
            if str(err) == base_error:
                raise UserError(f"{self.source}: {base_error}") from None

    def valid_pipeline(self) -> PipelineSpec | None:
        """A pipeline of the space that validates (its first, else last, values), as a spec; ``None`` if neither does."""
        nodes = {i: self.nodes(e) for i, e in enumerate(self.entries) if e.nodes is not None}
        for pick in (0, -1):
            try:
                return self._validate(self._filled([candidates(e)[pick][1] for e in self.entries], nodes))
            except UserError:
                continue
        return None

    def grid_names(self) -> list[str]:
        """Every parameter's name, per-layer entries expanded over the base model."""
        return [
            _param_name(e, node)
            for e in self.entries
            if not isinstance(e, ConstParam)
            for node in (self.nodes(e) if e.nodes is not None else [None])
        ]

    def grid(self) -> dict[str, list[Any]]:
        """Optuna's GridSampler search space (per-layer entries expanded over the base model); a grid of
        more than :data:`MAX_GRID` points is refused before any is listed."""
        points, space = 1, {}
        for i, entry in enumerate(self.entries):
            if isinstance(entry, ConstParam):
                continue
            where = f"{self.where}.{i}"
            names = self.nodes(entry) if entry.nodes is not None else [None]
            points *= grid_count(entry, where) ** len(names)
            if points > MAX_GRID:
                raise UserError(
                    f"{where}: the grid would have more than {MAX_GRID} points ({grid_count(entry, where)} values of "
                    f"this entry{f' for each of {len(names)} nodes' if len(names) > 1 else ''}); use a step, fewer "
                    "values or another sampler"
                )
        for i, entry in enumerate(self.entries):
            if not isinstance(entry, ConstParam):
                for node in self.nodes(entry) if entry.nodes is not None else [None]:
                    space[_param_name(entry, node)] = grid_values(entry, f"{self.where}.{i}")
        return space

    def suggest(self, trial) -> dict[str, Any]:
        """Sample every parameter through ``trial``; per-layer entries expand over the trial's model."""
        values: dict[str, Any] = {}
        flat = [i for i, e in enumerate(self.entries) if e.nodes is None]
        for i in flat:
            if not isinstance(self.entries[i], ConstParam):
                values[_param_name(self.entries[i], None)] = _suggest(trial, self.entries[i], _param_name(self.entries[i], None))
        model_pipeline = self.materialize(values)
        for i in self.order()[len(flat) :]:
            entry = self.entries[i]
            if isinstance(entry, ConstParam):
                continue
            for node in self.nodes(entry, model_pipeline):
                name = _param_name(entry, node)
                values[name] = _suggest(trial, entry, name)
        return values

    def order(self) -> list[int]:
        """Entries in the order they are applied: whole-pipeline entries first, then per-layer ones."""
        return [i for i, e in enumerate(self.entries) if e.nodes is None] + [
            i for i, e in enumerate(self.entries) if e.nodes is not None
        ]

    def materialize(self, values: dict[str, Any]) -> dict:
        """A fresh pipeline dict with ``values`` (from :meth:`suggest`) set at their paths."""
        pipeline = copy.deepcopy(self.pipeline)
        for i in self.order():
            entry = self.entries[i]
            if isinstance(entry, ConstParam):
                self._fill(pipeline, i, entry.value, self.nodes(entry, pipeline) if entry.nodes is not None else [])
                continue
            if entry.nodes is None:
                name = _param_name(entry, None)
                if name in values:
                    self._set(pipeline, i, values[name])
                continue
            names = self.nodes(entry, pipeline)
            self._set(pipeline, i, None, {n: values[_param_name(entry, n)] for n in names if _param_name(entry, n) in values})
        return pipeline


def _shown(value: Any) -> str:
    """``value`` as JSON, cut short."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 72 else f"{text[:72]}... ({len(text)} characters)"


def _distinct(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``(suffix, value)`` pairs with repeated values left out (each is checked once)."""
    seen, out = set(), []
    for suffix, value in pairs:
        key = json.dumps(value, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append((suffix, value))
    return out


def scaled(value: Any, scale: float) -> Any:
    """``value`` times ``scale`` for a tied path; an int stays an int (rounded down), other values pass.

    >>> scaled(12, 0.5), scaled(0.3, 1.0), scaled("l1-norm", 1.0)
    (6, 0.3, 'l1-norm')
    """
    if scale == 1.0 or isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return int(value * scale) if isinstance(value, int) else value * scale


def _suggest(trial, entry, name: str) -> Any:
    if isinstance(entry, ChoiceParam):
        if _encoded(entry):
            return entry.values[trial.suggest_categorical(name, list(range(len(entry.values))))]
        return trial.suggest_categorical(name, list(entry.values))
    if isinstance(entry, IncludeParam):
        return trial.suggest_categorical(name, [False, True])
    if isinstance(entry, IntParam):
        return trial.suggest_int(name, entry.low, entry.high, step=entry.step, log=entry.log)
    if isinstance(entry, FloatParam):
        return trial.suggest_float(name, entry.low, entry.high, step=entry.step)
    if isinstance(entry, LogFloatParam):
        return trial.suggest_float(name, entry.low, entry.high, log=True)
    raise TypeError(entry)
