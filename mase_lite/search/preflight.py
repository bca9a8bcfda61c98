"""What a search checks before its first trial, beyond the spec and its space: that every metric it
names (objectives, constraints, plots) is one its pipelines report, that its samplers can run and
and will leave their random start-up.

Metric names come from the passes' declared outputs (``register_pass(..., metrics=...)``); a pass
that declares none may report anything under its label.

Example::

    check_metrics(spec, studies)     # UserError: objectives.0.metric: 'quantised.accuracy' is not a metric ...
"""

from __future__ import annotations

import difflib
import logging

from mase_lite.infra.errors import UserError
from mase_lite.passes.registry import get_pass

logger = logging.getLogger(__name__)

TRIAL_SECONDS = "trial.seconds"
_LISTED = 40  # metric names listed in a message


def reported_metrics(pipeline) -> dict[str, set[str] | None]:
    """``{label: declared metric keys}`` of a validated pipeline spec's steps (``None``: the pass does not say)."""
    labels: dict[str, set[str] | None] = {}
    for step in pipeline.steps:
        label = step.label or getattr(step.params, "label", None) or step.pass_name
        keys = get_pass(step.pass_name).metric_names(step.params, pipeline.model.task)
        before = labels.get(label, set())
        labels[label] = None if keys is None or before is None else before | keys
    return labels


def known(metric: str, labels: dict[str, set[str] | None]) -> bool:
    """Whether a pipeline reporting ``labels`` may report ``metric``."""
    if metric == TRIAL_SECONDS:
        return True
    for label, keys in labels.items():
        rest = metric[len(label) + 1:] if metric.startswith(f"{label}.") else None
        if rest and (keys is None or any(rest == k or (k.endswith(".*") and rest.startswith(k[:-1])) for k in keys)):
            return True
    return False


def _names(labels: dict[str, set[str] | None]) -> list[str]:
    return sorted(f"{label}.{k}" for label, keys in labels.items() for k in (keys if keys is not None else ["<any>"]))


def check_metrics(spec, studies) -> None:
    """Raise one ``UserError`` naming every objective, constraint or plot metric no study's pipeline reports
    (objectives and constraints: every study must report them; plots: at least one)."""
    reports = [(s, reported_metrics(p)) for s in studies if (p := s.space.valid_pipeline()) is not None]
    params = sorted({name for s in studies for name in s.space.grid_names()})
    problems: list[str] = []

    def check(metric: str, where: str, every: bool, is_param: bool = False) -> None:
        missing = [(s, labels) for s, labels in reports if not known(metric, labels)]
        if is_param or not missing or (not every and len(missing) < len(reports)):
            return
        study, labels = missing[0]
        names = _names(labels) + [TRIAL_SECONDS]
        close = difflib.get_close_matches(metric, names + (params if where.endswith(".x") else []), n=1)
        whose = f"the pipeline of study {study.variant.name!r}" if len(studies) > 1 else "the pipeline"
        listing = ", ".join(names[:_LISTED]) + (f", ... ({len(names)} in all)" if len(names) > _LISTED else "")
        problems.append(
            f"{where}: {metric!r} is not a metric {whose} reports" + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; it reports: {listing}" + (f"; parameters: {', '.join(params)}" if where.endswith(".x") else "")
        )

    for i, objective in enumerate(spec.objectives):
        check(objective.metric, f"objectives.{i}.metric", every=True)
    for i, constraint in enumerate(spec.constraints):
        check(constraint.metric, f"constraints.{i}.metric", every=True)
    for i, plot in enumerate(spec.plots):
        check(plot.x, f"plots.{i}.x", every=False, is_param=plot.x in params)
        for j, metric in enumerate(plot.y):
            check(metric, f"plots.{i}.y.{j}", every=False)
        for j, metric in enumerate(plot.baselines()):
            check(metric, f"plots.{i}.baseline" + (f".{j}" if isinstance(plot.baseline, list) else ""), every=False)
    if problems:
        raise UserError("the search names metrics its pipeline does not report:\n" + "\n".join(problems))
