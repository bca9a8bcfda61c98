"""Run a search: every trial materializes a pipeline from sampled values and runs it with the runner.

Example::

    result = run_search("pipelines/search_ptq.json")     # also `mase-lite search pipelines/search_ptq.json`
    result.report["studies"][0]["best"]["metrics"]

Rerunning continues a study until ``n_trials`` trials ran to an end in total (complete, or failed by
their own error); a trial lost with a killed worker is failed by heartbeat and run again.
"""

from __future__ import annotations

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

from mase_lite.infra.errors import UserError, describe, ensure_dir, short
from mase_lite.infra.faults import ToolFault, as_fault
from mase_lite.infra.files import check_writable
from mase_lite.pipeline.runner import beside_report, json_safe, run_pipeline
from mase_lite.search.base import base_pipeline
from mase_lite.search.cache import PrefixCache, prefix_length
from mase_lite.search.identity import adopt, made_by
from mase_lite.search.internals import grid_id, grid_size, storage_of, trial_id
from mase_lite.search.preflight import TRIAL_SECONDS, check_metrics
from mase_lite.search.space import Space
from mase_lite.search.spec import SearchSpec, StudySpec, load_search_spec
from mase_lite.search.storage import JOURNAL, fail_stale, heartbeat, hidden_url, open_storage
from mase_lite.infra import progress
from mase_lite.infra.progress import bars_disabled

logger = logging.getLogger(__name__)


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
    recorded: bool = False  # the pipeline is a report's: data, whose runs write only inside their directory
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


def make_sampler(spec: SearchSpec, variant: StudySpec, space: Space, where: str) -> optuna.samplers.BaseSampler:
    """The Optuna sampler the spec names, seeded, with its options and the spec's constraints."""
    sampler = variant.sampler or spec.sampler
    warning = sampler.startup_warning(variant.n_trials or spec.n_trials, len(space.grid_names()))
    if warning:
        logger.warning("%s: %s", where, warning)
    try:
        return sampler.build(space, _constraints_func(spec) if spec.constraints else None)
    except ImportError as err:
        raise UserError(f"{where}.name: sampler {sampler.name!r} needs a package that is not installed ({err.name})") from None
    except (TypeError, ValueError) as err:
        raise UserError(f"{where}: bad option for sampler {sampler.name!r}: {err}") from None


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


def prepare_studies(spec: SearchSpec) -> list[Study]:
    """Every study's space, statically checked, its metrics and its sampler; nothing runs yet."""
    variants = spec.studies or [StudySpec(name=spec.study_name)]
    out = Path(spec.output_dir)
    studies = []
    for k, variant in enumerate(variants):
        prefix = f"studies.{k}." if spec.studies else ""
        source = variant.pipeline or spec.pipeline
        base = base_pipeline(source, spec.base_dir, f"{prefix if variant.pipeline else ''}pipeline", spec.recorded)
        entries = variant.space if variant.space is not None else spec.space
        space = Space(base.spec, entries, where=f"{prefix}space" if variant.space is not None else "space",
                      source=base.name, recorded=base.recorded)
        space.check()
        sampler = make_sampler(spec, variant, space, f"{prefix}sampler" if variant.sampler else "sampler")
        name = f"{spec.study_name}.{variant.name}" if spec.studies else spec.study_name
        k = prefix_length(base.spec, space) if spec.cache else None
        cache = PrefixCache(out / "cache", k) if k is not None else None
        studies.append(Study(name, spec, variant, space, out / variant.name if spec.studies else out, sampler,
                             cache=cache, recorded=base.recorded))
    check_metrics(spec, studies)
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
    return len(seen) < grid_size(study.sampler)


def _grid_point_taken(study: Study, trial: optuna.Trial) -> bool:
    """Whether another trial holds ``trial``'s grid point: an earlier trial still running, or one complete
    or failed by its own error.

    Optuna's grid sampler hands out a visited point again when two workers ask at the same moment
    (the last free point goes to one; the other gets a random one). Of two running trials on one point
    the earlier keeps it: were each to yield to the other, both would be pruned, the point left with no
    trial, and the sampler (which counts pruned points as visited) would hand out taken points until it
    drew that one by chance. A point whose trial a killed worker left is not held: it is queued again
    (a retry carries fixed params, not a grid point).
    """
    if not isinstance(study.sampler, optuna.samplers.GridSampler):
        return False
    point = grid_id(study.study, trial)
    if point is None:
        return False
    states = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL)
    return any(
        t.number != trial.number and t.system_attrs.get("grid_id") == point
        and (t.state != TrialState.RUNNING or t.number < trial.number)
        and (t.state != TrialState.FAIL or "error" in t.user_attrs)
        for t in study.study.get_trials(deepcopy=False, states=states)
    )


def run_trial(study: Study, trial: optuna.Trial) -> tuple[TrialState, list[float] | None, float]:
    """Sample, materialize, run; record params, metrics and status as user attributes.

    Returns the state, the objective values and the seconds spent inside the pipeline run. A failure of
    the tool's own I/O is raised as a :class:`~mase_lite.infra.faults.ToolFault`, not recorded."""
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
            result = run_pipeline(pipeline, output_dir=trial_dir, cache=study.cache, recorded=study.recorded)
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
        fault = as_fault(err, trial_dir)
        if fault is err:  # the storage, unreachable
            raise
        if fault is not None:  # the tool's own I/O (a full disk): not the trial's failure
            raise fault from err
        reason = f"{type(err).__name__}: {describe(err)}"
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
    storage = storage_of(study.study)
    done, running, _ = _counts(study.study)
    best = None
    bar = tqdm(total=study.n_trials, initial=min(done, study.n_trials), desc=study.name, unit="trial", disable=bars_disabled())
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
            try:
                with heartbeat(storage, trial_id(trial)):
                    state, values, run_seconds = run_trial(study, trial)
            except ToolFault:
                _requeue(study, trial)
                raise
            try:
                study.study.tell(trial, values, state=state)
            except optuna.exceptions.UpdateFinishedTrialError:
                logger.warning("trial %d was failed as stale by another worker; its result is dropped", trial.number)
                continue
            study.loop_seconds.append(time.perf_counter() - t0)
            study.overhead.append(study.loop_seconds[-1] - run_seconds)
            shown = "" if values is None else " " + ", ".join(f"{v:.4g}" for v in values)
            progress.line(f"{study.name}: trial {trial.number} {state.name.lower()}{shown} in {run_seconds:.1f} s")
            if values is not None and len(values) == 1:
                better = best is None or (values[0] > best if study.spec.objectives[0].direction == "maximize" else values[0] < best)
                best = values[0] if better else best
                bar.set_postfix_str(f"best {best:.4g}")
    finally:
        bar.close()


def _requeue(study: Study, trial: optuna.Trial) -> None:
    """A trial the tool's own I/O failure stopped: failed without an error of its own, with a copy queued
    to run when the search resumes. Best effort: when the storage cannot take it either, the trial
    stays running and its silent heartbeat fails and requeues it on resume."""
    try:
        study.study.tell(trial, state=TrialState.FAIL)
        frozen = study.study.get_trials(deepcopy=False)[trial.number]
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study.study, frozen)
    except Exception as err:
        logger.warning("trial %d could not be queued again now (%s); it is on resume", trial.number, err)


def _open(study: Study, storage, directions: list[str], where: str) -> None:
    """Create or load ``study``'s Optuna study, which another search spec must not have made."""
    try:
        study.study = optuna.create_study(
            storage=storage, sampler=study.sampler, study_name=study.name, directions=directions, load_if_exists=True
        )
    except ValueError as err:
        raise UserError(f"study {study.name!r}: {err}") from None
    if list(study.study.directions) != [optuna.study.StudyDirection[d.upper()] for d in directions]:
        raise UserError(f"study {study.name!r} exists in the storage with other objective directions")
    adopt(study, made_by(study.spec, study), where)


def _all_failed(studies: list[Study]) -> str | None:
    """When no trial of the search is complete but some failed by their own error: a line per study
    naming its first error (a study with none complete beside others that have some is only logged)."""
    lines, complete = [], False
    for study in studies:
        ended = [t for t in study.study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE or "error" in t.user_attrs]
        complete = complete or any(t.state == TrialState.COMPLETE for t in ended)
        if ended and all(t.state == TrialState.FAIL for t in ended):
            first = ended[0]
            lines.append(f"study {study.name!r}: all {len(ended)} trials failed; trial {first.number}: "
                         f"{short(first.user_attrs['error'], 300)}")
    for line in lines if complete else []:
        logger.warning(line)
    return None if complete else "\n".join(lines) or None


def run_search(source: str | Path | dict | SearchSpec, output_dir: str | Path | None = None) -> SearchResult:
    """Check the spec, its space and metrics, run (or continue) every study, write the results.

    Raises a ``UserError`` (CLI exit 2) before any trial for anything the spec gets wrong, and after
    writing the results when every trial failed; a :class:`~mase_lite.infra.faults.ToolFault`
    when the tool's own I/O fails (the running trial runs again on resume). ``output_dir`` overrides the spec's;
    a search reproduced from a ``search_report.json`` writes there, else in a new directory beside the report,
    with its own journal: never to the directory or storage the report records.
    """

    spec = load_search_spec(source)
    if spec.recorded:
        out = output_dir if output_dir is not None else beside_report(source, "output_dir")
        spec = spec.model_copy(update={"output_dir": str(out), "storage": None})
    elif output_dir is not None:
        spec = spec.model_copy(update={"output_dir": str(output_dir)})
    studies = prepare_studies(spec)
    check_writable(spec.output_dir, "output_dir")
    out = ensure_dir(spec.output_dir, "output_dir")
    storage = open_storage(spec.storage, out, spec.heartbeat_interval, spec.grace_period, spec.storage_retry)
    where = _hidden_storage(spec, out)
    directions = [o.direction for o in spec.objectives]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for study in studies:
        _open(study, storage, directions, where)
    deadline = time.time() + spec.timeout if spec.timeout else None
    for study in studies:
        ensure_dir(study.output_dir, "output_dir")
        optimize(study, deadline)
    from mase_lite.search.results import write_results  # matplotlib, imported when there are results to plot

    report = write_results(spec, studies, out)
    failed = _all_failed(studies)
    if failed:
        raise UserError(f"{failed}\nsee {out / 'search_report.json'}")
    return SearchResult(studies=studies, report=report, output_dir=out)


def _hidden_storage(spec: SearchSpec, out: Path) -> str:
    """The storage as messages name it: the journal file, or the URL without its password."""
    return str(out / JOURNAL) if spec.storage is None else hidden_url(spec.storage)
