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
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from mase_lite.infra.errors import Scope, UserError
from mase_lite.passes.registry import PassError, get_pass
from mase_lite.pipeline.preflight import check_targets, has_checks
from mase_lite.pipeline.spec import PipelineSpec, check_pipeline, load_spec
from mase_lite.search.spec import IncludeParam, NodeSelector

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
    """Set ``value`` at ``keys`` in ``pipeline``, creating missing dicts on the way; a list where a key is needed
    raises a ``PathError`` located at the list."""
    target: Any = pipeline
    for depth, key in enumerate(keys):
        if isinstance(target, list) and not isinstance(key, int):
            where = ".".join(map(str, keys))
            raise PathError(f"a list, where the space sets {where} (an object of fields)", location=tuple(keys[:depth]))
        if depth == len(keys) - 1:
            target[key] = copy.deepcopy(value)
        elif isinstance(target, list) or isinstance(target.get(key), (dict, list)):
            target = target[key]
        else:
            target[key] = {}
            target = target[key]


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


_CAPTURE_KEYS = ("plugins", "model", "data", "inputs", "example_inputs", "capture", "seed")  # what a captured graph depends on


def captured_nodes(pipeline: dict) -> list[Node]:
    """The nodes of the pipeline's model as a run captures it (or holds it, in module mode) before any step
    (cached per model, data, inputs and capture mode)."""
    key = json.dumps({k: pipeline[k] for k in _CAPTURE_KEYS if k in pipeline}, sort_keys=True, default=str)
    return _capture(key)


@lru_cache(maxsize=1)
def _built(key: str):
    """The model of a pipeline's capture keys, built as a run builds it before any step (the last one kept)."""
    from mase_lite.pipeline.runner import build_graph

    spec = load_spec({**json.loads(key), "device": "cpu"})  # the same nodes on any device
    with tempfile.TemporaryDirectory() as scratch:  # the data's caches, not kept
        mg, _ = build_graph(spec, Path(scratch))
    return mg


@lru_cache(maxsize=8)
def _capture(key: str) -> list[Node]:
    mg = _built.__wrapped__(key)  # not kept: only its nodes are
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
                problems.append(err.within(where, i, "path"))
            tied = []
            for j, t in enumerate(entry.also):
                try:
                    tied.append((resolve(pipeline, t.path), t.scale))
                except PathError as err:
                    problems.append(err.within(where, i, "also", j, "path"))
            self.tied.append(tied)
        if problems:
            raise UserError("search space check failed:", problems=problems)

    def nodes(self, entry, pipeline: dict | None = None) -> list[str]:
        """The nodes a per-layer entry expands over for ``pipeline``'s model (default: the base)."""
        return select(captured_nodes(pipeline or self.pipeline), entry.nodes)

    def _set(self, pipeline: dict, i: int, value: Any, nodes: dict[str, Any] | None = None) -> None:
        entry, keys = self.entries[i], self.keys[i]
        try:
            if isinstance(entry, IncludeParam):
                current = get_path(pipeline, keys)
                chosen = [n for n, keep in (nodes or {}).items() if keep]
                set_path(pipeline, keys, list(current or []) + chosen)
            elif entry.nodes is not None:
                for node, v in (nodes or {}).items():
                    for path, scale in [(keys, 1.0), *self.tied[i]]:
                        at = [k.replace("{node}", node) if isinstance(k, str) else k for k in path]
                        set_path(pipeline, at, scaled(v, scale))
            else:
                for path, scale in [(keys, 1.0), *self.tied[i]]:
                    set_path(pipeline, path, scaled(value, scale))
        except PathError as err:  # the base pipeline's shape
            raise UserError(str(err), location=(self.source,)) from None

    def _fill(self, pipeline: dict, i: int, value: Any, names: list[str]) -> None:
        self._set(pipeline, i, value, {n: value for n in names} if self.entries[i].nodes is not None else None)

    def check(self) -> None:
        """Try each entry's candidates (others at their first, then their last value) against the pipeline
        checks; raise one UserError naming ``space.<i>.<values.j|low|high>`` and the pass's message."""
        nodes = {i: self.nodes(e) for i, e in enumerate(self.entries) if e.nodes is not None}
        problems = []
        for i, entry in enumerate(self.entries):
            if entry.nodes is not None and not nodes[i]:
                problems.append(UserError("matches no node of the captured model", location=(self.where, i, "nodes")))
        if problems:
            raise UserError("search space check failed:", problems=problems)
        contexts = [[e.candidates()[0][1] for e in self.entries], [e.candidates()[-1][1] for e in self.entries]]
        self._check_base(self._filled(contexts[0], nodes))
        if not nodes and not self._varies_the_model():
            self._build_base()
        for i, entry in enumerate(self.entries):
            failed, candidates = [], _distinct(entry.candidates())
            for suffix, value in candidates:
                errors = []
                for context in contexts:
                    try:
                        self._validate(self._filled([*context[:i], value, *context[i + 1:]], nodes))
                    except UserError as err:
                        errors.append(str(err))
                    else:
                        break
                if len(errors) == len(contexts):
                    failed.append((suffix, value, errors[0]))
            if len(failed) > 1 and len(failed) == len(candidates) and len({m for _, _, m in failed}) == 1:
                problems.append(UserError(failed[0][2], location=(self.where, i, Scope(f"({entry.path}, every value)"))))
                continue  # one mistake, said once (a path typo fails every value alike)
            for suffix, value, message in failed:
                tried = Scope(f"({entry.path} = {_shown(value)})")
                problems.append(UserError(message, location=(self.where, i, *suffix, tried)))
        _built.cache_clear()  # the model the checks built: not held through the trials
        if problems:
            raise UserError("search space check failed:", problems=problems)

    def _filled(self, values: list[Any], nodes: dict[int, list[str]]) -> dict:
        pipeline = copy.deepcopy(self.pipeline)
        for k in self.order():
            self._fill(pipeline, k, values[k], nodes.get(k, []))
        return pipeline

    def _validate(self, pipeline: Any) -> PipelineSpec:
        spec = load_spec(pipeline, recorded=self.recorded, name=self.source)
        check_pipeline(spec)
        if not self._varies_the_model() and has_checks(spec.steps):
            key = json.dumps({k: pipeline[k] for k in _CAPTURE_KEYS if k in pipeline}, sort_keys=True, default=str)
            check_targets(spec.steps, _built(key))  # an export or a packed layer that cannot be, before any trial
        return spec

    def _varies_the_model(self) -> bool:
        """Whether an entry sets what the captured model depends on (its config, data, inputs, ...)."""
        paths = [*self.keys, *(keys for tied in self.tied for keys, _ in tied)]
        return any(keys and keys[0] in _CAPTURE_KEYS for keys in paths)

    def _build_base(self) -> None:
        """Build and capture the base pipeline's model once (as every trial will), so that a model it cannot
        build (a size beyond memory, a config transformers refuses) stops the search before its first trial."""
        try:
            captured_nodes(self.pipeline)
        except UserError as err:
            raise UserError(str(err), location=(self.source,)) from None

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
                raise UserError(base_error, location=(self.source,)) from None

    def valid_pipeline(self) -> PipelineSpec | None:
        """A pipeline of the space that validates (its first, else last, values), as a spec; ``None`` if neither does."""
        nodes = {i: self.nodes(e) for i, e in enumerate(self.entries) if e.nodes is not None}
        for pick in (0, -1):
            try:
                return self._validate(self._filled([e.candidates()[pick][1] for e in self.entries], nodes))
            except UserError:
                continue
        return None

    def grid_names(self) -> list[str]:
        """Every parameter's name, per-layer entries expanded over the base model."""
        return [
            _param_name(e, node)
            for e in self.entries
            if e.sampled
            for node in (self.nodes(e) if e.nodes is not None else [None])
        ]

    def grid(self) -> dict[str, list[Any]]:
        """Optuna's GridSampler search space (per-layer entries expanded over the base model); a grid of
        more than :data:`MAX_GRID` points is refused before any is listed."""
        points, space = 1, {}
        sampled = [(i, e, self.nodes(e) if e.nodes is not None else [None]) for i, e in enumerate(self.entries) if e.sampled]
        for i, entry, names in sampled:
            try:
                count = entry.grid_count()
            except UserError as err:
                raise err.within(self.where, i) from None
            points *= count ** len(names)
            if points > MAX_GRID:
                raise UserError(
                    f"the grid would have more than {MAX_GRID} points ({count} values of this entry"
                    f"{f' for each of {len(names)} nodes' if len(names) > 1 else ''}); use a step, fewer values or "
                    "another sampler",
                    location=(self.where, i),
                )
        for i, entry, names in sampled:
            for node in names:
                space[_param_name(entry, node)] = entry.grid_values()
        return space

    def suggest(self, trial) -> dict[str, Any]:
        """Sample every parameter through ``trial``; per-layer entries expand over the trial's model."""
        values: dict[str, Any] = {}
        flat = [i for i, e in enumerate(self.entries) if e.nodes is None]
        for i in flat:
            if self.entries[i].sampled:
                values[_param_name(self.entries[i], None)] = self.entries[i].suggest(trial, _param_name(self.entries[i], None))
        model_pipeline = self.materialize(values)
        for i in self.order()[len(flat) :]:
            entry = self.entries[i]
            if not entry.sampled:
                continue
            for node in self.nodes(entry, model_pipeline):
                name = _param_name(entry, node)
                values[name] = entry.suggest(trial, name)
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
            if not entry.sampled:
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
