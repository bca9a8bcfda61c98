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
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model

from mase_lite.infra.errors import Scope, UserError, validation_problems
from mase_lite.layers.quant_config import explain_format_error
from mase_lite.pipeline.plugins import import_plugins
from mase_lite.passes.manager import BASE_FACTS, MissingRequirement, check_requirements
from mase_lite.passes.registry import MODULE_MODE
from mase_lite.passes.registry import all_passes, get_pass, pass_names
from mase_lite.workloads.data import DataSpec, check_task_fields
from mase_lite.workloads.devices import DEVICE_PATTERN, resolve_device
from mase_lite.workloads.models import ModelSpec, check_head
from mase_lite.infra.jsonio import check_value, read_json
from mase_lite.infra.trust import admit_recorded, admit_spec


class InputSpec(BaseModel):
    """An example input for a model that is not a transformers model."""

    model_config = ConfigDict(extra="forbid")

    shape: list[int] = Field(description="example shape; dim 0 is the (dynamic) batch")
    dtype: str = Field("float32", description="torch dtype name")


class StepSpec(BaseModel):
    """One pipeline step: a registered pass and its params (one subclass per pass, tagged by ``pass``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    pass_name: str = Field(alias="pass", description="a registered pass (see `mase-lite passes`)")
    params: Any = Field(default_factory=dict, description="the pass's params")
    label: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w-]*$",
        description="the step's name in report metrics and search paths (default: the pass's own label, else its name)",
    )
    draw_after: bool = Field(False, description="draw the graph to <output_dir>/step<N>_<pass>.svg after this step")


def _step_model(name: str, params: type[BaseModel], doc: str) -> type[StepSpec]:
    return create_model(
        f"{name}_step",
        __base__=StepSpec,
        __doc__=doc or f"A `{name}` step.",
        pass_name=(Literal[name], Field(alias="pass", description=doc)),
        params=(params, Field(default_factory=params, description=f"params of the `{name}` pass")),
    )


class _PipelineBase(BaseModel):
    """A whole run: the model, its data, the ordered steps and where results go."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("pipeline", description="run name")
    seed: int = Field(0, ge=0, lt=2**32, description="seed for torch, python, numpy and data order")
    plugins: list[str] = Field(
        default_factory=list, description="modules or .py files to import first (they register passes)"
    )
    model: ModelSpec = Field(default_factory=ModelSpec, description="what to capture")
    inputs: list[str] | None = Field(None, description="model input names (default: the data's inputs)")
    example_inputs: dict[str, InputSpec] | None = Field(
        None, description="example inputs of a model that is not a transformers model"
    )
    data: DataSpec | None = Field(default_factory=DataSpec, description="the run's data; null for none")
    capture: Literal["graph", "modules", "auto"] = Field(
        "graph", description="graph: capture with torch.export; modules: run the passes on the plain nn.Module "
        "(module mode: passes that need no graph); auto: graph, else modules when torch.export refuses the model",
    )
    steps: list[StepSpec] = Field(default_factory=list, description="passes, run in order")
    device: str = Field(
        "auto", pattern=DEVICE_PATTERN,
        description="where the model, the data and every pass run: auto (CUDA when visible), cpu, cuda, cuda:N",
    )
    verify_each: bool = Field(False, description="verify the graph after every step (names the step that broke it)")
    output_dir: str = Field("runs/pipeline", min_length=1, description="where report.json and artifacts are written")
    _recorded: bool = PrivateAttr(False)

    @property
    def recorded(self) -> bool:
        """Whether the spec was read from a report (data, maybe someone else's): its run writes only inside output_dir."""
        return self._recorded


@lru_cache(maxsize=64)
def _pipeline_model(names: tuple[str, ...]) -> type[BaseModel]:
    passes = [get_pass(name) for name in names]
    steps = [_step_model(info.name, info.params, info.summary) for info in passes]
    step = Annotated[Union[tuple(steps)], Field(discriminator="pass_name")]
    return create_model(
        "PipelineSpec",
        __base__=_PipelineBase,
        steps=(list[step], Field(default_factory=list, description="passes, run in order")),
    )


def pipeline_model(names: list[str] | None = None) -> type[BaseModel]:
    """The pydantic model of pipeline specs, with one step type per registered pass (plug-ins included).

    With ``names``, only those passes' step types (a spec is validated against the passes it names,
    so a run imports no other pass); unknown names are left out and reported by validation.
    """
    known = set(pass_names())
    chosen = sorted({n for n in names if n in known}) if names is not None else []
    return _pipeline_model(tuple(chosen or all_passes()))


# What callers annotate with; instances are of :func:`pipeline_model`'s class.
PipelineSpec = _PipelineBase


def _explain(error: dict) -> UserError | None:
    """An unknown pass gets a did-you-mean and the list of passes instead of a union-tag error."""
    loc = error["loc"]
    if error["type"] == "union_tag_invalid" and len(loc) == 2 and loc[0] == "steps":
        return _unknown_pass(loc[1], error["ctx"]["tag"], pass_names())
    if error["type"] == "union_tag_not_found" and len(loc) == 2 and loc[0] == "steps":
        return UserError(f"required; registered passes: {', '.join(pass_names())}", location=("steps", loc[1], "pass"))
    return None


def spec_error(err: ValidationError, source: str, model: type[BaseModel], document: Any = None) -> UserError:
    """The spec's problems, one per line; ``document`` (what was validated) lets a format's unknown key be named
    with the format's keys."""
    explain = lambda e: _explain(e) or explain_format_error(e, document)  # noqa: E731
    return UserError(f"invalid pipeline spec {source}:", problems=validation_problems(err, model=model, explain=explain))


def is_report(source: Any) -> bool:
    """Whether ``source`` is a run's ``report.json`` (or a search's ``search_report.json``): data that records a spec."""
    return isinstance(source, dict) and "spec" in source and "versions" in source


def _refuse_search_spec(source: Any, name: str) -> None:
    if isinstance(source, dict) and "objectives" in source and "steps" not in source:
        raise UserError(f"{name} is a search spec (it has objectives); run it with `mase-lite search {name}`")


def load_spec(source: str | Path | dict | BaseModel, plugins: list[str] = (), recorded: bool = False,
              name: str = "<dict>") -> PipelineSpec:
    """A validated spec from a path, a dict, a ``report.json`` (its recorded spec) or a spec.

    ``plugins`` (e.g. from ``--plugin``) and the spec's own ``plugins`` are imported before the
    steps are validated, so their passes can be used. A spec recorded in a report (or ``recorded``:
    taken from one) is data: it is admitted by :func:`mase_lite.infra.trust.admit_recorded` (its code
    needs the user's word, its trust decisions are dropped) and its run writes only inside its
    ``output_dir`` (``spec.recorded``). ``name`` names a dict in messages.
    """
    base = None
    if isinstance(source, BaseModel):
        source = source.model_dump(mode="json", by_alias=True)
    if isinstance(source, (str, Path)):
        name = str(source)
        base = Path(source).parent
        source = read_json(source)
    else:
        check_value(source, name)
    if is_report(source):
        source, recorded = source["spec"], True
    _refuse_search_spec(source, name)
    import_plugins(list(plugins))
    if recorded:
        source = admit_recorded(source, name, base)  # a report's plug-ins and factory need the user's word
    else:
        admit_spec(source)
    if isinstance(source, dict) and isinstance(source.get("plugins"), list):
        import_plugins(source["plugins"], base)
    model = pipeline_model(_named_passes(source))
    try:  # as JSON, strictly: `true` is not a number and "8" is not an integer
        spec = model.model_validate_json(json.dumps(source, default=str), strict=True)
    except ValidationError as err:
        raise spec_error(err, name, model, source) from None
    spec._recorded = recorded
    return spec


def _named_passes(source: Any) -> list[str]:
    steps = source.get("steps") if isinstance(source, dict) else None
    if not isinstance(steps, list):
        return []
    return [s["pass"] for s in steps if isinstance(s, dict) and isinstance(s.get("pass"), str)]


def _unknown_pass(index: int, name: str, known: list[str]) -> UserError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return UserError(f"unknown pass {name!r}{hint}; registered passes: {', '.join(known)}", location=("steps", index, "pass"))


def check_pipeline(spec: PipelineSpec) -> None:
    """Check what the spec's validation cannot see before anything runs: the device exists, the data
    section fits the model's task, and the order of the steps (their params are validated by the spec).

    Raises one UserError listing every step whose requirement no earlier step provides (or a
    later transform invalidated), naming the passes that provide it.
    """
    resolve_device(spec.device)
    check_head(spec.model)
    if spec.data is not None:
        check_task_fields(spec.data, spec.model.task)
    problems: list[UserError] = graph_steps(spec) if spec.capture == "modules" else []
    if spec.model.stream:
        problems += stream_problems(spec)
    facts = set(BASE_FACTS) | ({"data"} if spec.data is not None else set())
    for i, step in enumerate(spec.steps):
        info = get_pass(step.pass_name)
        try:
            check_requirements(info, facts, f"steps.{i} ({info.name})", "no earlier step provides (or a transform since invalidated)",
                               params=step.params)
        except MissingRequirement as err:
            if err.fact == "data":
                err = UserError(f"steps.{i} ({info.name}) needs 'data': give the pipeline a `data` section")
            problems.append(err)
        facts = info.facts_after(facts)
    if problems:
        raise UserError("pipeline check failed:", problems=problems)


def graph_steps(spec: PipelineSpec) -> list[UserError]:
    """One problem per step whose pass needs the captured graph, which module mode does not have."""
    return [UserError(MODULE_MODE, location=("steps", i, Scope(f"({step.pass_name})")))
            for i, step in enumerate(spec.steps) if get_pass(step.pass_name).needs_graph]


def stream_problems(spec: PipelineSpec) -> list[UserError]:
    """What a run streaming its weights from disk cannot do: a graph capture, another device than the CPU,
    steps whose pass needs the whole model in memory."""
    problems = []
    if spec.capture == "graph":
        problems.append(UserError("model.stream runs in module mode: set capture to modules", location=("capture",)))
    if resolve_device(spec.device).type != "cpu":
        problems.append(UserError("model.stream reads blocks onto the CPU: set device to cpu", location=("device",)))
    able = ", ".join(sorted(p.name for p in all_passes().values() if p.streams))
    problems += [UserError(f"needs the whole model in memory; with model.stream a pipeline runs {able} "
                           "(export: to compressed-tensors)", location=("steps", i, Scope(f"({step.pass_name})")))
                 for i, step in enumerate(spec.steps) if not get_pass(step.pass_name).streams_with(step.params)]
    return problems


def pipeline_schema() -> dict[str, Any]:
    """The JSON Schema of pipeline specs: every pass's params and every number format's fields."""
    return pipeline_model().model_json_schema(by_alias=True)
