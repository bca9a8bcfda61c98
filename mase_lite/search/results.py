"""A search's results: ``search_report.json`` (spec, versions, best trial or Pareto front, every trial),
``trials.csv`` and the plots, all written whole or not at all.

Example::

    report = write_results(spec, studies, Path("runs/s"))
    report["studies"][0]["pareto_front"]      # multi-objective: the non-dominated complete trials
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from mase_lite.infra.files import staged_file
from mase_lite.pipeline.runner import package_versions, write_json_atomic
from mase_lite.search import plots
from mase_lite.search.spec import SearchSpec


def trial_rows(study) -> list[dict[str, Any]]:
    """One dict per trial: number, state, params (as the pipeline got them), metrics, values, error."""
    rows = []
    for t in study.study.get_trials(deepcopy=False):
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "params": t.user_attrs.get("params", {}),
                "metrics": t.user_attrs.get("metrics", {}),
                "values": t.values,
                "error": t.user_attrs.get("error"),
                "retry_of": t.system_attrs.get("failed_trial"),
            }
        )
    return rows


def dominates(a: list[float], b: list[float], signs: list[int]) -> bool:
    """Whether ``a`` is at least as good as ``b`` everywhere and better somewhere (signs: +1 maximize).

    >>> dominates([0.9, 4.0], [0.8, 4.0], [1, -1])
    True
    """
    better = [s * x > s * y for x, y, s in zip(a, b, signs)]
    worse = [s * x < s * y for x, y, s in zip(a, b, signs)]
    return any(better) and not any(worse)


def pareto_front(rows: list[dict], spec: SearchSpec) -> list[dict]:
    """The complete, feasible trials no other complete, feasible trial dominates."""
    signs = [1 if o.direction == "maximize" else -1 for o in spec.objectives]
    pool = [r for r in rows if r["state"] == "COMPLETE" and spec.feasible(r["metrics"])]
    return [r for r in pool if not any(dominates(o["values"], r["values"], signs) for o in pool if o is not r)]


def best_trial(rows: list[dict], spec: SearchSpec) -> dict | None:
    pool = [r for r in rows if r["state"] == "COMPLETE" and spec.feasible(r["metrics"])]
    if not pool:
        return None
    sign = 1 if spec.objectives[0].direction == "maximize" else -1
    return max(pool, key=lambda r: (sign * r["values"][0], -r["number"]))


def _write_csv(path: Path, tables: dict[str, list[dict]]) -> None:
    params = sorted({k for rows in tables.values() for r in rows for k in r["params"]})
    metrics = sorted({k for rows in tables.values() for r in rows for k in r["metrics"]})
    with staged_file(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["study", "number", "state", *params, *metrics, "error"])
        for name, rows in tables.items():
            for r in rows:
                cells = [json.dumps(r["params"][p]) if isinstance(r["params"].get(p), (dict, list)) else r["params"].get(p, "") for p in params]
                writer.writerow([name, r["number"], r["state"], *cells, *(r["metrics"].get(m, "") for m in metrics), r["error"] or ""])


def write_results(spec: SearchSpec, studies: list, out: Path) -> dict[str, Any]:
    """Write the report, the table and the plots of every study into ``out``; return the report."""
    tables = {s.name: trial_rows(s) for s in studies}
    written = [str(p) for p in plots.best_so_far(tables, spec.objectives, out)]
    fronts: dict[str, list[int]] = {}
    entries = []
    for s in studies:
        rows = tables[s.name]
        entry: dict[str, Any] = {
            "name": s.name,
            "output_dir": str(s.output_dir),
            "sampler": (s.variant.sampler or spec.sampler).model_dump(),
            "n_trials": s.n_trials,
            "states": {state: sum(r["state"] == state for r in rows) for state in sorted({r["state"] for r in rows})},
        }
        if len(spec.objectives) == 1:
            entry["best"] = best_trial(rows, spec)
        else:
            front = pareto_front(rows, spec)
            fronts[s.name] = [r["number"] for r in front]
            entry["pareto_front"] = front
        entry["trials"] = rows
        entries.append(entry)
    if len(spec.objectives) > 1:
        written.append(str(plots.pareto(tables, fronts, spec.objectives, out)))
    swept = {name for s in studies for name in s.space.grid_names()}
    if len(swept) == 1 and all((s.variant.sampler or spec.sampler).name == "grid" for s in studies):
        written += [str(p) for p in plots.metric_vs_param(tables, swept.pop(), spec.objectives, out)]
    written += [str(plots.requested(tables, plot, out)) for plot in spec.plots]
    _write_csv(out / "trials.csv", tables)
    report = {
        "spec": spec.model_dump(mode="json"),
        "versions": package_versions(),
        "studies": entries,
        "plots": written,
        "storage": spec.storage or str(out / "study.journal"),
    }
    write_json_atomic(out / "search_report.json", report)
    return report
