"""Pipeline specs: JSON validated by pydantic, checked as a whole before anything runs.

Example (``pipelines/quickstart.json``)::

    {"name": "quickstart", "seed": 0,
     "steps": [{"pass": "profile", "params": {"num_batches": 2}},
               {"pass": "report"}, {"pass": "draw", "params": {"path": "graph.svg"}}],
     "output_dir": "runs/quickstart"}

    spec = load_spec("pipelines/quickstart.json")
    check_pipeline(spec)        # every pass exists, params validate, requirements are met
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mase_lite.errors import UserError
from mase_lite.passes.registry import PassError, PassParams, all_passes, format_validation_error, get_pass
from mase_lite.train.data import DataSpec
from mase_lite.train.models import ModelSpec

# Facts every captured graph has before the first step.
BASE_FACTS = ("graph", "metadata")


class InputSpec(BaseModel):
    """An example input for a model that is not a transformers model."""

    model_config = ConfigDict(extra="forbid")

    shape: list[int] = Field(description="example shape; dim 0 is the (dynamic) batch")
    dtype: str = Field("float32", description="torch dtype name")


class StepSpec(BaseModel):
    """One pipeline step: a registered pass and its params."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    pass_name: str = Field(alias="pass", description="a registered pass (see `mase-lite passes`)")
    params: dict[str, Any] = Field(default_factory=dict, description="the pass's params")
    label: str | None = Field(
        None, pattern=r"^[A-Za-z_][\w-]*$", description="the step's name in report metrics and search paths (default: the pass's own label, else its name)"
    )
    draw_after: bool = Field(False, description="draw the graph to <output_dir>/step<N>_<pass>.svg after this step")


class PipelineSpec(BaseModel):
    """A whole run: the model, its data, the ordered steps and where results go."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("pipeline", description="run name")
    seed: int = Field(0, description="seed for torch, python and data order")
    model: ModelSpec = Field(default_factory=ModelSpec, description="what to capture")
    inputs: list[str] | None = Field(None, description="model input names (default: the data's inputs)")
    example_inputs: dict[str, InputSpec] | None = Field(
        None, description="example inputs of a model that is not a transformers model"
    )
    data: DataSpec | None = Field(default_factory=DataSpec, description="the run's data; null for none")
    steps: list[StepSpec] = Field(default_factory=list, description="passes, run in order")
    output_dir: str = Field("runs/pipeline", description="where report.json and artifacts are written")


def spec_error(err: ValidationError, source: str) -> UserError:
    return UserError(f"invalid pipeline spec {source}:\n" + format_validation_error(err, model=PipelineSpec))


def read_json(path: str | Path) -> Any:
    """JSON from ``path`` with an error naming the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no such spec file: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None


def load_spec(source: str | Path | dict | PipelineSpec) -> PipelineSpec:
    """A validated spec from a path, a dict, a ``report.json`` (its recorded spec) or a spec."""
    if isinstance(source, PipelineSpec):
        return source
    name = "<dict>"
    if isinstance(source, (str, Path)):
        name = str(source)
        source = read_json(source)
    if isinstance(source, dict) and "spec" in source and "versions" in source:
        source = source["spec"]
    try:
        return PipelineSpec.model_validate(source)
    except ValidationError as err:
        raise spec_error(err, name) from None


def _unknown_pass(index: int, name: str) -> str:
    known = sorted(all_passes())
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"steps.{index}.pass: unknown pass {name!r}{hint}; registered passes: {', '.join(known)}"


def check_pipeline(spec: PipelineSpec) -> list[PassParams]:
    """Validate every step before anything runs; returns each step's frozen params.

    Raises one UserError listing every problem: unknown passes, invalid params (with their
    JSON path), and requirements no earlier step provides (naming the passes that do).
    """
    problems: list[str] = []
    validated: list[PassParams] = []
    provided = set(BASE_FACTS) | ({"data"} if spec.data is not None else set())
    for i, step in enumerate(spec.steps):
        try:
            info = get_pass(step.pass_name)
        except PassError:
            problems.append(_unknown_pass(i, step.pass_name))
            continue
        try:
            validated.append(info.validate(step.params))
        except PassError as err:
            problems.append(str(err).replace(f"pass '{info.name}' params", f"steps.{i}.params"))
        for need in info.requires:
            if need not in provided:
                providers = [p.name for p in all_passes().values() if need in p.provides]
                where = f"run one of: {', '.join(providers)} before it" if providers else "no registered pass provides it"
                if need == "data":
                    where = "give the pipeline a `data` section"
                problems.append(f"steps.{i} ({info.name}) needs {need!r}, which no earlier step provides; {where}")
        provided.update(info.provides)
    if problems:
        raise UserError("pipeline check failed:\n" + "\n".join(problems))
    return validated


def pipeline_schema() -> dict[str, Any]:
    """The JSON Schema of pipeline specs."""
    return PipelineSpec.model_json_schema(by_alias=True)
