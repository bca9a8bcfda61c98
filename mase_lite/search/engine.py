"""Run a search: every trial materializes a pipeline from sampled values and runs it with the runner.

Example::

    result = run_search("pipelines/search_ptq.json")     # also `mase-lite search pipelines/search_ptq.json`
    result.report["studies"][0]["best"]["metrics"]

Rerunning continues a study until ``n_trials`` trials ran to an end in total (complete, or failed by
their own error); a trial lost with a killed worker is failed by heartbeat and run again.
"""

from __future__ import annotations

import copy
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from tqdm import tqdm

from mase_lite.errors import UserError, ensure_dir
from mase_lite.pipeline.runner import json_safe, run_pipeline
from mase_lite.pipeline.spec import read_json
from mase_lite.search.cache import PrefixCache, prefix_length
from mase_lite.search.space import Space
from mase_lite.search.spec import SearchSpec, StudySpec, load_search_spec
from mase_lite.search.storage import fail_stale, heartbeat_thread, open_storage

logger = logging.getLogger(__name__)

TRIAL_SECONDS = "trial.seconds"


@dataclass
class Study:
    """One study of a search, bound to its space, sampler and storage."""

    name: str
    spec: SearchSpec
    variant: StudySpec
    space: Space
    output_dir: Path
    sampler: optuna.samplers.BaseSampler
    study: optuna.Study | None = None
    cache: PrefixCache | None = None  # the prefix cache (None: off, or the space varies every step's input)
    overhead: list[float] = field(default_factory=list)  # seconds per trial spent outside the pipeline run
    loop_seconds: list[float] = field(default_factory=list)  # seconds per trial, from the stale check to tell

    @property
    def n_trials(self) -> int:
        return self.variant.n_trials or self.spec.n_trials


@dataclass
class SearchResult:
    """What a search leaves: the Optuna studies, the report dict and the output directory."""

    studies: list[Study]
    report: dict[str, Any]
    output_dir: Path


def flatten_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Numeric report metrics as ``{"<label>.<key>[.<subkey>]": value}``.

    >>> flatten_metrics({"ptq": {"accuracy": 0.5, "per_class": {"0": 3}, "confusion": [[1]]}})
    {'ptq.accuracy': 0.5, 'ptq.per_class.0': 3}
    """
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[prefix] = value

    for label, value in metrics.items():
        walk(label, value)
    return flat


def _pipeline_dict(source: str | dict, base_dir: Path, where: str) -> dict:
    if isinstance(source, dict):
        return copy.deepcopy(source)
    path = Path(source)
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_file():
        raise UserError(f"{where}: no such pipeline spec: {path}")
    data = read_json(path)
    if isinstance(data, dict) and "spec" in data and "versions" in data:
        data = data["spec"]
    return data


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler; the engine's loop (not ``Study.stop``) ends a walked-through grid."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def make_sampler(spec: SearchSpec, variant: StudySpec, space: Space, where: str) -> optuna.samplers.BaseSampler:
    """The Optuna sampler the spec names, seeded, with its options and the spec's constraints."""
    sampler_spec = variant.sampler or spec.sampler
    options = sampler_spec.options()
    name, seed = sampler_spec.name, sampler_spec.seed
    if spec.constraints and name in ("tpe", "nsga2"):
        options.setdefault("constraints_func", _constraints_func(spec))
    kinds = {
        "random": optuna.samplers.RandomSampler,
        "tpe": optuna.samplers.TPESampler,
        "nsga2": optuna.samplers.NSGAIISampler,
        "qmc": optuna.samplers.QMCSampler,
        "cmaes": optuna.samplers.CmaEsSampler,
    }
    try:
        if name == "grid":
            return GridSampler(space.grid(), seed=seed, **options)
        if name == "cmaes":
            import cmaes  # noqa: F401  (optional package)
        return kinds[name](seed=seed, **options)
    except ImportError as err:
        raise UserError(f"{where}.name: sampler {name!r} needs a package that is not installed ({err.name})") from None
    except TypeError as err:
        raise UserError(f"{where}: bad option for sampler {name!r}: {err}") from None


def _constraints_func(spec: SearchSpec):
    def constraints(trial: optuna.trial.FrozenTrial) -> list[float]:
        metrics = trial.user_attrs.get("metrics", {})
        out = []
        for c in spec.constraints:
            value = metrics.get(c.metric, math.inf)
            if c.max is not None:
                out.append(value - c.max)
            if c.min is not None:
                out.append(c.min - value)
        return out

    return constraints


def feasible(spec: SearchSpec, metrics: dict[str, float]) -> bool:
    """Whether ``metrics`` satisfy every constraint of the spec."""
    for c in spec.constraints:
        value = metrics.get(c.metric)
        if value is None or (c.max is not None and value > c.max) or (c.min is not None and value < c.min):
            return False
    return True


def prepare_studies(spec: SearchSpec) -> list[Study]:
    """Every study's space, statically checked, and its sampler; nothing runs yet."""
    variants = spec.studies or [StudySpec(name=spec.study_name)]
    out = Path(spec.output_dir)
    studies = []
    for k, variant in enumerate(variants):
        where = f"studies.{k}" if spec.studies else ""
        prefix = f"{where}." if where else ""
        pipeline = _pipeline_dict(variant.pipeline or spec.pipeline, spec.base_dir, f"{prefix}pipeline")
        entries = variant.space if variant.space is not None else spec.space
        space = Space(pipeline, entries, where=f"{prefix}space" if variant.space is not None else "space")
        space.check()
        sampler = make_sampler(spec, variant, space, f"{prefix}sampler" if variant.sampler else "sampler")
        name = f"{spec.study_name}.{variant.name}" if spec.studies else spec.study_name
        k = prefix_length(pipeline, space) if spec.cache else None
        cache = PrefixCache(out / "cache", k) if k is not None else None
        studies.append(Study(name, spec, variant, space, out / variant.name if spec.studies else out, sampler, cache=cache))
    return studies


def _counts(study: optuna.Study) -> tuple[int, int, int]:
    """(trials that ran to an end, running, waiting)."""
    trials = study.get_trials(deepcopy=False)
    done = sum(t.state == TrialState.COMPLETE or (t.state == TrialState.FAIL and "error" in t.user_attrs) for t in trials)
    running = sum(t.state == TrialState.RUNNING for t in trials)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    return done, running, waiting


def _grid_left(study: Study) -> bool:
    """Whether a grid point is neither finished nor running (always true for other samplers)."""
    if not isinstance(study.sampler, optuna.samplers.GridSampler):
        return True
    seen = set()
    for t in study.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)):
        if "grid_id" in t.system_attrs:
            seen.add(t.system_attrs["grid_id"])
    return len(seen) < len(study.sampler._all_grids)


def _grid_point_taken(study: Study, trial: optuna.Trial) -> bool:
    """Whether another trial holds ``trial``'s grid point: running, complete or failed by its own error.

    Optuna's grid sampler hands out a visited point again when two workers ask at the same moment
    (the last free point goes to one; the other gets a random one). A point whose trial a killed
    worker left is not held: it is queued again (a retry carries fixed params, not a grid point).
    """
    if not isinstance(study.sampler, optuna.samplers.GridSampler):
        return False
    grid_id = study.study._storage.get_trial_system_attrs(trial._trial_id).get("grid_id")
    if grid_id is None:
        return False
    states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL)
    return any(
        t.number != trial.number and t.system_attrs.get("grid_id") == grid_id
        and (t.state != TrialState.FAIL or "error" in t.user_attrs)
        for t in study.study.get_trials(deepcopy=False, states=states)
    )


def run_trial(study: Study, trial: optuna.Trial) -> tuple[TrialState, list[float] | None, float]:
    """Sample, materialize, run; record params, metrics and status as user attributes.

    Returns the state, the objective values and the seconds spent inside the pipeline run."""
    spec = study.spec
    trial_dir = study.output_dir / "trials" / str(trial.number)
    t0 = time.perf_counter()
    run_seconds = 0.0
    try:
        values = study.space.suggest(trial)
        trial.set_user_attr("params", json_safe(values))
        pipeline = study.space.materialize(values)
        pipeline["output_dir"] = str(trial_dir)
        t1 = time.perf_counter()
        try:
            result = run_pipeline(pipeline, output_dir=trial_dir, cache=study.cache)
        finally:
            run_seconds = time.perf_counter() - t1
        metrics = flatten_metrics(result.report["metrics"])
        metrics[TRIAL_SECONDS] = time.perf_counter() - t0
        missing = [o.metric for o in spec.objectives if o.metric not in metrics]
        if missing:
            raise UserError(f"objectives: the trial reported no metric {', '.join(missing)}; it reported: {', '.join(sorted(metrics))}")
        trial.set_user_attr("metrics", metrics)
        trial.set_user_attr("status", "complete")
        trial.set_user_attr("report", str(trial_dir / "report.json"))
        return TrialState.COMPLETE, [float(metrics[o.metric]) for o in spec.objectives], run_seconds
    except Exception as err:  # a trial's own failure: recorded, and the study goes on
        reason = f"{type(err).__name__}: {err}"
        logger.warning("trial %d failed: %s", trial.number, reason)
        trial.set_user_attr("status", "failed")
        trial.set_user_attr("error", reason[:2000])
        return TrialState.FAIL, None, run_seconds


def clear_leftovers(study: Study) -> None:
    """Remove what killed workers left beside the directories of trials that are over (their staging
    directories and lock files): such a trial is never run again under its number, so nothing else
    would. The storage says which trials are over, for workers on any machine."""
    trials_dir = study.output_dir / "trials"
    if not trials_dir.is_dir():
        return
    over = {str(t.number) for t in study.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))}
    for path in trials_dir.glob(".*"):  # .<number>.staging-<pid>-<random>, .<number>.lock, ...
        if path.name[1:].split(".", 1)[0] in over:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def optimize(study: Study, deadline: float | None) -> None:
    """This worker's share of ``study``: trials until ``n_trials`` ran to an end in total."""
    storage = study.study._storage
    done, running, _ = _counts(study.study)
    best = None
    bar = tqdm(total=study.n_trials, initial=min(done, study.n_trials), desc=study.name, unit="trial", disable=None)
    try:
        while deadline is None or time.time() < deadline:
            t0 = time.perf_counter()
            fail_stale(study.study)
            clear_leftovers(study)
            done, running, waiting = _counts(study.study)
            bar.n = min(done, study.n_trials)
            bar.refresh()
            if done >= study.n_trials:
                break
            if done + running >= study.n_trials or (not waiting and not _grid_left(study)):
                if not running:
                    break
                time.sleep(min(1.0, study.spec.heartbeat_interval))  # others' trials may still fail
                continue
            trial = study.study.ask()
            if _grid_point_taken(study, trial):  # another worker asked at the same moment
                trial.set_user_attr("status", "duplicate grid point")
                study.study.tell(trial, state=TrialState.PRUNED)
                continue
            with heartbeat_thread(storage, trial._trial_id):
                state, values, run_seconds = run_trial(study, trial)
            try:
                study.study.tell(trial, values, state=state)
            except optuna.exceptions.UpdateFinishedTrialError:
                logger.warning("trial %d was failed as stale by another worker; its result is dropped", trial.number)
                continue
            study.loop_seconds.append(time.perf_counter() - t0)
            study.overhead.append(study.loop_seconds[-1] - run_seconds)
            if values is not None and len(values) == 1:
                better = best is None or (values[0] > best if study.spec.objectives[0].direction == "maximize" else values[0] < best)
                best = values[0] if better else best
                bar.set_postfix_str(f"best {best:.4g}")
    finally:
        bar.close()


def run_search(source: str | Path | dict | SearchSpec) -> SearchResult:
    """Check the spec and its space, run (or continue) every study, write the results."""
    from mase_lite.search.results import write_results

    spec = load_search_spec(source)
    studies = prepare_studies(spec)
    out = ensure_dir(spec.output_dir, "output_dir")
    storage = open_storage(spec.storage, out, spec.heartbeat_interval, spec.grace_period)
    directions = [o.direction for o in spec.objectives]
    deadline = time.time() + spec.timeout if spec.timeout else None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for study in studies:
        ensure_dir(study.output_dir, "output_dir")
        try:
            study.study = optuna.create_study(
                storage=storage, sampler=study.sampler, study_name=study.name, directions=directions, load_if_exists=True
            )
        except ValueError as err:
            raise UserError(f"study {study.name!r}: {err}") from None
        if list(study.study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
            raise UserError(f"study {study.name!r} exists in the storage with other objective directions")
        optimize(study, deadline)
    report = write_results(spec, studies, out)
    return SearchResult(studies=studies, report=report, output_dir=out)
