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

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from mase_lite.errors import UserError, format_validation_error
from mase_lite.pipeline.spec import read_json

SAMPLERS = ("grid", "random", "tpe", "nsga2", "qmc", "cmaes")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodeSelector(_Strict):
    """Which nodes of the captured model a per-layer entry expands over."""

    op: str | None = Field(None, description="op type (as in node metadata, e.g. linear) or module class name")
    regex: str | None = Field(None, description="regex that must match the whole node name")
    square: bool = Field(False, description="only modules whose weight is square (in_features == out_features)")

    @model_validator(mode="after")
    def _something(self) -> "NodeSelector":
        if self.op is None and self.regex is None:
            raise ValueError("give 'op', 'regex' or both")
        return self


class Tied(_Strict):
    """Another path that receives the entry's value, times ``scale`` (an int value stays an int)."""

    path: str = Field(description="like the entry's path; '{node}' stands for the same node")
    scale: float = Field(1.0, description="factor, e.g. 0.5 for a fraction width half the width")


class _Param(_Strict):
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


class ChoiceParam(_Param):
    """One of ``values`` (any JSON values: numbers, strings, whole configs)."""

    type: Literal["choice"]
    values: list[Any] = Field(min_length=1, description="the candidates")


class _Range(_Param):
    """A numeric range: ``low`` must not lie above ``high``."""

    @model_validator(mode="after")
    def _bounds(self) -> "_Range":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")
        return self


class IntParam(_Range):
    type: Literal["int"]
    low: int
    high: int
    step: int = Field(1, ge=1)
    log: bool = False


class FloatParam(_Range):
    type: Literal["float"]
    low: float
    high: float
    step: float | None = Field(None, gt=0)


class LogFloatParam(_Range):
    type: Literal["log_float"]
    low: float = Field(gt=0)
    high: float = Field(gt=0)


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


class ConstParam(_Param):
    """A fixed value written at ``path`` (per layer with ``nodes``); not sampled, not a study parameter."""

    type: Literal["const"]
    value: Any = Field(description="the value every trial gets")


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


class SamplerSpec(BaseModel):
    """An Optuna sampler by name; other keys are that sampler's options."""

    model_config = ConfigDict(extra="allow")

    name: Literal["grid", "random", "tpe", "nsga2", "qmc", "cmaes"] = "tpe"
    seed: int = 0

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class StudySpec(_Strict):
    """One study of several run side by side; unset fields come from the search spec."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][\w.-]*$", description="the study's name (suffix of study_name, subdirectory)")
    pipeline: str | dict[str, Any] | None = None
    space: list[Param] | None = None
    sampler: SamplerSpec | None = None
    n_trials: int | None = Field(None, ge=1)


class SearchSpec(_Strict):
    """A whole search; see the module docstring."""

    pipeline: str | dict[str, Any] = Field(description="pipeline spec path (relative to this file) or inline spec")
    space: list[Param] = Field(default_factory=list, description="what each trial varies")
    objectives: list[Objective] = Field(min_length=1)
    constraints: list[Constraint] = Field(default_factory=list)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    n_trials: int = Field(10, ge=1, description="trials that run to an end, in total over every run and worker")
    timeout: float | None = Field(None, gt=0, description="stop starting trials after this many seconds")
    storage: str | None = Field(None, description="Optuna storage URL (default: a journal file in output_dir)")
    study_name: str = Field("search", pattern=r"^[A-Za-z0-9_][\w.-]*$")
    output_dir: str = "runs/search"
    studies: list[StudySpec] | None = Field(None, min_length=1, description="several studies run side by side")
    plots: list[PlotSpec] = Field(default_factory=list, description="plots beyond the automatic ones")
    cache: bool = Field(True, description="reuse the state after steps trials share (prefix cache)")
    heartbeat_interval: int = Field(10, ge=1, description="seconds between a running trial's heartbeats")
    grace_period: int | None = Field(None, ge=1, description="a trial silent this long is failed and retried (default 3 heartbeats)")
    _base_dir: Path = PrivateAttr(default_factory=Path)  # where relative pipeline paths are read from

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @model_validator(mode="after")
    def _unique_studies(self) -> "SearchSpec":
        names = [s.name for s in self.studies or []]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"study names must be unique; repeated: {', '.join(dup)}")
        return self


def load_search_spec(source: str | Path | dict | SearchSpec) -> SearchSpec:
    """A validated search spec from a path, a dict or a spec."""
    if isinstance(source, SearchSpec):
        return source
    name, base = "<dict>", "."
    if isinstance(source, (str, Path)):
        name, base = str(source), str(Path(source).parent)
        source = read_json(source)
    if isinstance(source, dict) and "spec" in source and "versions" in source:
        source = source["spec"]
    if not isinstance(source, dict):
        raise UserError(f"search spec {name}: expected a JSON object")
    try:
        spec = SearchSpec.model_validate(source)
    except ValidationError as err:
        raise UserError(f"invalid search spec {name}:\n" + format_validation_error(err, model=SearchSpec)) from None
    spec._base_dir = Path(base)
    return spec


def search_schema() -> dict[str, Any]:
    """The JSON Schema of search specs."""
    return SearchSpec.model_json_schema(by_alias=True)
