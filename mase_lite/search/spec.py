"""Search specs: a base pipeline, a space over paths into it, objectives, a sampler and a storage.

Example::

    {"pipeline": "ptq.json",
     "space": [{"path": "steps.quantize.params.rules.linear.weight_width", "type": "choice", "values": [4, 8]},
               {"path": "steps.quantize.params.rules.{node}.data_in_width", "nodes": {"op": "linear"},
                "type": "int", "low": 4, "high": 16, "step": 4}],
     "objectives": [{"metric": "ptq.accuracy", "direction": "maximize"}],
     "sampler": {"name": "tpe", "seed": 0}, "n_trials": 20, "output_dir": "runs/ptq_search"}

    spec = load_search_spec("search.json")    # UserError naming the JSON path of every problem
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from mase_lite.infra.errors import UserError, short, validation_problems
from mase_lite.infra.jsonio import check_value, read_json
from mase_lite.pipeline.spec import is_report
from mase_lite.search.samplers import SAMPLERS, SamplerSpec, TPESamplerSpec

MAX_CHOICES = 1000  # candidates of one choice entry: each is checked against the pipeline before the first trial
Int64 = Annotated[int, Field(ge=-(2**63), lt=2**63)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class NodeSelector(_Strict):
    """Which nodes of the captured model a per-layer entry expands over."""

    op: str | None = Field(None, description="op type (as in node metadata, e.g. linear) or module class name")
    regex: str | None = Field(None, description="regex that must match the whole node name")
    square: bool = Field(False, description="only modules whose weight is square (in_features == out_features)")

    @model_validator(mode="after")
    def _something(self) -> "NodeSelector":
        if self.op is None and self.regex is None:
            raise ValueError("give 'op', 'regex' or both")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as err:
                raise ValueError(f"regex {short(self.regex)} is not a regular expression: {err}") from None
        return self


class Tied(_Strict):
    """Another path that receives the entry's value, times ``scale`` (an int value stays an int)."""

    path: str = Field(description="like the entry's path; '{node}' stands for the same node")
    scale: float = Field(1.0, ge=-1e6, le=1e6, description="factor, e.g. 0.5 for a fraction width half the width")


GRID_KINDS = "the grid sampler needs choices, unlogged ints or floats with a step"


class _Param(_Strict):
    """An entry of a search space. Each type knows how it is sampled (:meth:`suggest`), walked by a grid
    sampler (:meth:`grid_values`), checked before the first trial (:meth:`candidates`) and whether it is
    the same in every trial (:attr:`fixed`)."""

    sampled: ClassVar[bool] = True  # a study parameter (a const entry is not)

    path: str = Field(
        description="where the value goes: steps.<index|pass|label>.params..., model..., data..., seed; "
        "with `nodes`, '{node}' in the path stands for each matched node's name"
    )
    name: str | None = Field(None, description="the parameter's name in the study (default: the path)")
    nodes: NodeSelector | None = Field(None, description="one parameter per matched node of the captured model")
    also: list[Tied] = Field(default_factory=list, description="other paths set from the same value")

    @model_validator(mode="after")
    def _node_placeholder(self) -> "_Param":
        if self.nodes is not None and "{node}" not in self.path and self.type != "include":
            raise ValueError("a per-layer entry's path must contain '{node}'")
        if self.nodes is None and any("{node}" in p for p in [self.path, *(t.path for t in self.also)]):
            raise ValueError("'{node}' in the path needs a `nodes` selector")
        return self

    def suggest(self, trial, name: str) -> Any:
        """The value of parameter ``name`` for ``trial`` (an Optuna trial), sampled through it."""
        raise NotImplementedError

    def grid_count(self) -> int:
        """How many values a grid sampler walks (counted, not listed); a ``UserError`` if it cannot walk them."""
        raise UserError(GRID_KINDS)

    def grid_values(self) -> list[Any]:
        """The values a grid sampler walks, as Optuna stores them."""
        raise UserError(GRID_KINDS)

    def candidates(self) -> list[tuple[tuple[str | int, ...], Any]]:
        """``(location in the entry, value)`` of the values a static check tries: the first and the last matter."""
        raise NotImplementedError

    @property
    def fixed(self) -> bool:
        """Whether every trial gets the same value."""
        return False


class ChoiceParam(_Param):
    """One of ``values`` (any JSON values: numbers, strings, whole configs)."""

    type: Literal["choice"]
    values: list[Any] = Field(min_length=1, max_length=MAX_CHOICES, description="the candidates")

    @property
    def encoded(self) -> bool:
        """Whether the choices go to Optuna as indices (values that are not plain scalars)."""
        return not all(isinstance(v, (type(None), bool, int, float, str)) for v in self.values)

    def suggest(self, trial, name: str) -> Any:
        if self.encoded:
            return self.values[trial.suggest_categorical(name, list(range(len(self.values))))]
        return trial.suggest_categorical(name, list(self.values))

    def grid_count(self) -> int:
        return len(self.values)

    def grid_values(self) -> list[Any]:
        return list(range(len(self.values))) if self.encoded else list(self.values)

    def candidates(self) -> list[tuple[tuple[str | int, ...], Any]]:
        return [(("values", j), v) for j, v in enumerate(self.values)]

    @property
    def fixed(self) -> bool:
        return len({json.dumps(v, sort_keys=True, default=str) for v in self.values}) == 1


class _Range(_Param):
    """A numeric range: ``low`` must not lie above ``high``."""

    @model_validator(mode="after")
    def _bounds(self) -> "_Range":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")
        return self

    def candidates(self) -> list[tuple[tuple[str | int, ...], Any]]:
        return [(("low",), self.low), (("high",), self.high)]

    @property
    def fixed(self) -> bool:
        return self.low == self.high


class IntParam(_Range):
    type: Literal["int"]
    low: Int64
    high: Int64
    step: int = Field(1, ge=1, lt=2**63)
    log: bool = False

    def suggest(self, trial, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, step=self.step, log=self.log)

    def grid_count(self) -> int:
        return (self.high - self.low) // self.step + 1 if not self.log else super().grid_count()

    def grid_values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step)) if not self.log else super().grid_values()


class FloatParam(_Range):
    type: Literal["float"]
    low: float
    high: float
    step: float | None = Field(None, gt=0)

    def suggest(self, trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, step=self.step)

    def grid_count(self) -> int:
        return int(round((self.high - self.low) / self.step)) + 1 if self.step is not None else super().grid_count()

    def grid_values(self) -> list[float]:
        return [self.low + k * self.step for k in range(self.grid_count())]


class LogFloatParam(_Range):
    type: Literal["log_float"]
    low: float = Field(gt=0)
    high: float = Field(gt=0)

    def suggest(self, trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=True)


class IncludeParam(_Param):
    """Per-layer keep-or-not: each matched node whose choice is true is appended to the list at ``path``."""

    type: Literal["include"]

    @model_validator(mode="after")
    def _per_layer(self) -> "IncludeParam":
        if self.nodes is None:
            raise ValueError("an 'include' entry needs a `nodes` selector")
        if self.also:
            raise ValueError("an 'include' entry has no value to tie: give no `also`")
        return self

    def suggest(self, trial, name: str) -> bool:
        return trial.suggest_categorical(name, [False, True])

    def grid_count(self) -> int:
        return 2

    def grid_values(self) -> list[bool]:
        return [False, True]

    def candidates(self) -> list[tuple[tuple[str | int, ...], Any]]:
        return [(("nodes",), True)]


class ConstParam(_Param):
    """A fixed value written at ``path`` (per layer with ``nodes``); not sampled, not a study parameter."""

    sampled: ClassVar[bool] = False

    type: Literal["const"]
    value: Any = Field(description="the value every trial gets")

    def candidates(self) -> list[tuple[tuple[str | int, ...], Any]]:
        return [(("value",), self.value)]

    @property
    def fixed(self) -> bool:
        return True


Param = Annotated[
    ChoiceParam | IntParam | FloatParam | LogFloatParam | IncludeParam | ConstParam, Field(discriminator="type")
]


class Objective(_Strict):
    metric: str = Field(description="a report metric '<step label or pass>.<key>', or 'trial.seconds'")
    direction: Literal["maximize", "minimize"] = "maximize"


class Constraint(_Strict):
    """A bound on a metric; samplers that support constraints (tpe, nsga2) prefer trials within it."""

    metric: str
    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> "Constraint":
        if self.max is None and self.min is None:
            raise ValueError("give 'max', 'min' or both")
        return self

    def holds(self, value: float | None) -> bool:
        """Whether a trial's ``value`` of the metric lies within the bound (a missing value does not)."""
        return value is not None and (self.max is None or value <= self.max) and (self.min is None or value >= self.min)


class PlotSpec(_Strict):
    """A plot of trial results: ``y`` metrics against ``x`` (a parameter or a metric), one curve per study
    and metric; ``baseline`` draws a metric's (or several metrics') mean over the complete trials as a horizontal line."""

    kind: Literal["line", "scatter"] = Field("line", description="line: joined points sorted by x (repeats averaged)")
    x: str = Field(description="a study parameter's name, or a metric")
    y: list[str] = Field(min_length=1, description="metrics")
    baseline: str | list[str] | None = Field(
        None, description="a metric drawn as a horizontal line (a list: one line each, e.g. the float model and a bound)"
    )

    def baselines(self) -> list[str]:
        return [self.baseline] if isinstance(self.baseline, str) else list(self.baseline or [])
    log_x: bool = False
    log_y: bool = Field(False, description="a logarithmic y axis (a perplexity that explodes at low bits)")
    title: str | None = None
    file: str = Field(pattern=r"^[\w.-]+\.png$", description="file name in output_dir")


class StudySpec(_Strict):
    """One study of several run side by side; unset fields come from the search spec."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][\w.-]*$", description="the study's name (suffix of study_name, subdirectory)")
    pipeline: str | dict[str, Any] | None = None
    space: list[Param] | None = None
    sampler: SamplerSpec | None = None
    n_trials: int | None = Field(None, ge=1, le=10**9)


class SearchSpec(_Strict):
    """A whole search; see the module docstring."""

    pipeline: str | dict[str, Any] = Field(description="pipeline spec path (relative to this file) or inline spec")
    space: list[Param] = Field(default_factory=list, description="what each trial varies")
    objectives: list[Objective] = Field(min_length=1)
    constraints: list[Constraint] = Field(default_factory=list)
    sampler: SamplerSpec = Field(default_factory=TPESamplerSpec)
    n_trials: int = Field(10, ge=1, le=10**9, description="trials that run to an end, in total over every run and worker")
    timeout: float | None = Field(None, gt=0, description="stop starting trials after this many seconds")
    storage: str | None = Field(None, min_length=1, description="Optuna storage URL (default: a journal file in output_dir)")
    study_name: str = Field("search", pattern=r"^[A-Za-z0-9_][\w.-]*$")
    output_dir: str = Field("runs/search", min_length=1)
    studies: list[StudySpec] | None = Field(None, min_length=1, description="several studies run side by side")
    plots: list[PlotSpec] = Field(default_factory=list, description="plots beyond the automatic ones")
    cache: bool = Field(True, description="reuse the state after steps trials share (prefix cache)")
    heartbeat_interval: int = Field(10, ge=1, le=86400, description="seconds between a running trial's heartbeats")
    grace_period: int | None = Field(None, ge=1, le=10**7, description="a trial silent this long is failed and retried (default 3 heartbeats)")
    storage_retry: float = Field(
        60, ge=0, le=86400, description="seconds an unreachable storage (a restarting database) is retried before the worker stops"
    )
    _base_dir: Path = PrivateAttr(default_factory=Path)  # where relative pipeline paths are read from
    _recorded: bool = PrivateAttr(False)  # read from a search_report.json: data, not the user's own spec

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def recorded(self) -> bool:
        """Whether the spec was read from a search report (its pipelines are then data too)."""
        return self._recorded

    def feasible(self, metrics: dict[str, float]) -> bool:
        """Whether a trial's ``metrics`` satisfy every constraint."""
        return all(c.holds(metrics.get(c.metric)) for c in self.constraints)

    @field_validator("storage")
    @classmethod
    def _on_disk(cls, url: str | None) -> str | None:
        low = (url or "").lower()
        if low.startswith("sqlite") and (low.rstrip("/") in ("sqlite:", "sqlite:/") or ":memory:" in low or "mode=memory" in low):
            raise ValueError("an in-memory database ends with its worker and no other worker sees it; give a file "
                             "(sqlite:///runs/x/study.db) or leave storage out (a journal file in output_dir)")
        return url

    @model_validator(mode="after")
    def _unique_studies(self) -> "SearchSpec":
        names = [s.name for s in self.studies or []]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"study names must be unique; repeated: {', '.join(dup)}")
        return self


def _explain(error: dict) -> UserError | None:
    """An unknown sampler name gets the list of samplers."""
    loc = error["loc"]
    if error["type"] == "union_tag_invalid" and loc and loc[-1] == "sampler":
        return UserError(f"unknown sampler {short(error['ctx']['tag'])}; samplers: {', '.join(SAMPLERS)}", location=(*loc, "name"))
    return None


def load_search_spec(source: str | Path | dict | SearchSpec) -> SearchSpec:
    """A validated search spec from a path, a dict, a ``search_report.json`` (its recorded spec) or a spec.

    Validated as strict JSON (``true`` is not a number, ``"1"`` not an integer), like pipeline specs.
    """
    if isinstance(source, SearchSpec):
        return source
    name, base = "<dict>", "."
    if isinstance(source, (str, Path)):
        name, base = str(source), str(Path(source).parent)
        source = read_json(source)
    else:
        check_value(source, name)
    recorded = is_report(source) and isinstance(source.get("spec"), dict) and "objectives" in source["spec"]
    if recorded:
        source = source["spec"]
    elif is_report(source) or (isinstance(source, dict) and "steps" in source and "objectives" not in source):
        kind = "a run's report" if is_report(source) else "a pipeline spec (it has steps)"
        raise UserError(f"{name} is {kind}; run it with `mase-lite run {name}`")
    if not isinstance(source, dict):
        raise UserError(f"search spec {name}: expected a JSON object")
    try:
        spec = SearchSpec.model_validate_json(json.dumps(source, default=str), strict=True)
    except ValidationError as err:
        raise UserError(f"invalid search spec {name}:", problems=validation_problems(err, model=SearchSpec, explain=_explain)) from None
    spec._base_dir = Path(base)
    spec._recorded = recorded
    return spec


def search_schema() -> dict[str, Any]:
    """The JSON Schema of search specs."""
    return SearchSpec.model_json_schema(by_alias=True)
