"""Search plots (matplotlib, Agg): best-so-far per objective, the Pareto front, metric versus a swept
parameter. Every plot overlays the studies of one search, one curve each; each curve has its own colour
*and* marker (and line style past twenty), and the legend sits outside the axes, so any number of
curves stays readable.

Example::

    paths = best_so_far(tables, objectives, Path("runs/s"))    # runs/s/best_<metric>.png
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from mase_lite.infra.files import staged_file  # noqa: E402


_MARKERS = "osD^vP*X<>hp"
MAX_LABELLED = 40
"""A scatter names its points' trials up to this many points per curve."""
_LINES = ("-", "--", ":", "-.")


def styles(n: int) -> list[dict[str, Any]]:
    """``n`` distinct curve styles: a colour (tab10 up to ten curves, else tab20, dark shades first), a
    marker, and past twenty curves a line style, so no two curves look alike.

    >>> [sorted(s) for s in styles(1)]
    [['color', 'linestyle', 'marker']]
    >>> len({(str(s["color"]), s["marker"], s["linestyle"]) for s in styles(90)})
    90
    """
    if n <= 10:
        colors = list(plt.get_cmap("tab10").colors)
    else:
        pairs = plt.get_cmap("tab20").colors
        colors = list(pairs[0::2] + pairs[1::2])  # ten dark shades, then their light ones
    return [{"color": colors[k % len(colors)], "marker": _MARKERS[k % len(_MARKERS)],
             "linestyle": _LINES[(k // len(colors)) % len(_LINES)]} for k in range(n)]


def _legend(ax) -> None:
    """The legend right of the axes (never over the data), in columns of at most twenty entries."""
    entries = len(ax.get_legend_handles_labels()[1])
    if entries:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, frameon=False,
                  fontsize=8 if entries <= 10 else 7, ncol=-(-entries // 20))


def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text).strip("_")


def _save(fig, path: Path) -> Path:
    with staged_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _complete(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["state"] == "COMPLETE"]


def best_so_far(tables: dict[str, list[dict]], objectives: list, out: Path) -> list[Path]:
    """One plot per objective: the best value so far versus trial number, a step curve per study."""
    paths = []
    for obj in objectives:
        fig, ax = plt.subplots(figsize=(6, 4))
        pick = max if obj.direction == "maximize" else min
        prefix = _common_prefix(list(tables))
        for (name, rows), style in zip(tables.items(), styles(len(tables))):
            xs, ys, values, best = [], [], [], None
            for r in sorted(_complete(rows), key=lambda r: r["number"]):
                value = r["metrics"].get(obj.metric)
                if value is None:
                    continue
                best = value if best is None else pick(best, value)
                xs.append(r["number"])
                ys.append(best)
                values.append(value)
            ax.step(xs, ys, where="post", markersize=4, label=name.removeprefix(prefix), **style)
            ax.scatter(xs, values, s=12, alpha=0.35, color=style["color"], marker=style["marker"])  # each trial
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("trial")
        ax.set_ylabel(f"{obj.metric}: best so far (line), each trial (points)")
        ax.grid(alpha=0.3)
        _legend(ax)
        paths.append(_save(fig, out / f"best_{_slug(obj.metric)}.png"))
    return paths


def pareto(tables: dict[str, list[dict]], fronts: dict[str, list[int]], objectives: list, out: Path) -> Path:
    """The first two objectives of every complete trial, with each study's front drawn as a line."""
    x_metric, y_metric = objectives[0].metric, objectives[1].metric
    fig, ax = plt.subplots(figsize=(6, 4))
    prefix = _common_prefix(list(tables))
    every, on_fronts = [], []
    for (full, rows), style in zip(tables.items(), styles(len(tables))):
        name = full.removeprefix(prefix)
        points = [(r["metrics"].get(x_metric), r["metrics"].get(y_metric), r["number"]) for r in _complete(rows)]
        points = [p for p in points if p[0] is not None and p[1] is not None]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=14, alpha=0.45, color=style["color"],
                   marker=style["marker"], label=f"{name} trials")
        front = sorted((p for p in points if p[2] in set(fronts.get(full, []))), key=lambda p: p[0])
        ax.plot([p[0] for p in front], [p[1] for p in front], label=f"{name} front", **style)
        for (x, y), numbers in _same_points(front).items():  # trials at one point are named together
            ax.annotate(_numbers(numbers), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7,
                        color=style["color"])
        every += points
        on_fronts += front
    hidden = _zoom(ax, every, on_fronts)
    ax.set_xlabel(f"{x_metric} ({objectives[0].direction})")
    ax.set_ylabel(f"{y_metric} ({objectives[1].direction})")
    if hidden:
        ax.set_title(f"{hidden} trial{'s lie' if hidden > 1 else ' lies'} far from the fronts, outside the axes "
                     "(see trials.csv)", fontsize=8)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, out / "pareto.png")


def _same_points(points: list[tuple]) -> dict[tuple, list[int]]:
    """Trial numbers by the point they lie on."""
    at: dict[tuple, list[int]] = {}
    for x, y, number in points:
        at.setdefault((x, y), []).append(number)
    return at


def _numbers(numbers: list[int]) -> str:
    """``#3`` or ``#3 #7 (2 trials)``: which trials a point is."""
    shown = " ".join(f"#{n}" for n in sorted(numbers)[:4]) + (" …" if len(numbers) > 4 else "")
    return shown if len(numbers) == 1 else f"{shown} ({len(numbers)} trials)"


def _zoom(ax, points: list[tuple], front: list[tuple], spread: float = 10.0) -> int:
    """Limit the axes to the fronts and the trials near the bulk when a few far-off trials (a diverged run at
    chance accuracy) would squeeze the fronts into a corner: on each axis, what lies more than ``spread`` median
    absolute deviations from the median, and outside the fronts' range, is left out. Returns how many trials were."""
    if not front or len(points) <= len(front):
        return 0
    limits = []
    for axis in (0, 1):
        values = sorted(p[axis] for p in points)
        middle = statistics.median(values)
        deviation = statistics.median(abs(v - middle) for v in values)
        if not deviation:
            return 0
        limits.append((min(min(p[axis] for p in front), middle - spread * deviation),
                       max(max(p[axis] for p in front), middle + spread * deviation)))
    inside = [p for p in points if all(low <= p[a] <= high for a, (low, high) in enumerate(limits))]
    hidden = len(points) - len(inside)
    if hidden:
        for axis, setter in ((0, ax.set_xlim), (1, ax.set_ylim)):
            low, high = min(p[axis] for p in inside), max(p[axis] for p in inside)
            pad = 0.05 * ((high - low) or abs(high) or 1.0)
            setter(low - pad, high + pad)
    return hidden


def short_labels(values: list[Any]) -> list[str]:
    """Tick labels for the values of a swept parameter that are not numbers (a number format, a string, a list):
    only the leaves in which they differ.

    >>> short_labels([{"name": "integer", "width": 8, "frac_width": 4}, {"name": "integer", "width": 4, "frac_width": 4}])
    ['width=8', 'width=4']
    >>> short_labels(["minmax", None])
    ['minmax', 'None']
    """
    def leaves(value: Any, path: str = "") -> dict[str, Any]:
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in leaves(item, f"{path}.{key}" if path else str(key)).items()}
        return {path: value}

    flat = [leaves(v) if isinstance(v, dict) else None for v in values]
    if any(f is None for f in flat):
        return [str(v) if not isinstance(v, (list, tuple)) else "[" + ", ".join(map(str, v)) + "]" for v in values]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    differ = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1] or keys
    return [", ".join(f"{k}={f.get(k)}" for k in differ if k in f) or "{}" for f in flat]


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metric_vs_param(tables: dict[str, list[dict]], param: str, objectives: list, out: Path) -> list[Path]:
    """For a sweep over one parameter: each objective versus that parameter, a curve per study; a parameter whose
    values are not numbers (a number format) is drawn over its values in the order first swept, each labelled by
    what sets it apart (:func:`short_labels`)."""
    paths = []
    swept = [r["params"][param] for rows in tables.values() for r in _complete(rows) if param in r["params"]]
    categories = [] if all(_numeric(v) for v in swept) else list({repr(v): v for v in swept}.values())
    position = {repr(v): k for k, v in enumerate(categories)}
    for obj in objectives:
        fig, ax = plt.subplots(figsize=(6, 4))
        prefix = _common_prefix(list(tables))
        for (name, rows), style in zip(tables.items(), styles(len(tables))):
            points = sorted(
                (position[repr(r["params"][param])] if categories else r["params"][param], r["metrics"][obj.metric])
                for r in _complete(rows) if param in r["params"] and obj.metric in r["metrics"]
            )
            ax.plot([p[0] for p in points], [p[1] for p in points], label=name.removeprefix(prefix), **style)
        if categories:
            labels = short_labels(categories)
            ax.set_xticks(range(len(categories)), labels, rotation=20 if max(map(len, labels)) > 12 else 0,
                          ha="right" if max(map(len, labels)) > 12 else "center", fontsize=7)
        ax.set_xlabel(param)
        ax.set_ylabel(obj.metric)
        ax.grid(alpha=0.3)
        _legend(ax)
        paths.append(_save(fig, out / f"{_slug(obj.metric)}_vs_{_slug(param)}.png"))
    return paths


def _value(row: dict[str, Any], key: str) -> Any:
    """A trial's parameter ``key``, else its metric ``key``."""
    return row["params"].get(key, row["metrics"].get(key))


def _common_prefix(names: list[str]) -> str:
    """The ``<study_name>.`` every study name starts with, when there are several studies."""
    heads = {n.split(".", 1)[0] + "." for n in names if "." in n}
    return heads.pop() if len(names) > 1 and len(heads) == 1 and all("." in n for n in names) else ""


def requested(tables: dict[str, list[dict]], plot, out: Path) -> Path:
    """A plot a search spec asks for (a :class:`~mase_lite.search.spec.PlotSpec`): each ``y`` metric
    against ``x``, one curve per study and metric, and the ``baseline`` metric's mean as a line."""
    fig, ax = plt.subplots(figsize=(6, 4))
    prefix = _common_prefix(list(tables))
    xs_seen: set[float] = set()
    curves = [(name, rows, metric) for name, rows in tables.items() for metric in plot.y]
    for (name, rows, metric), style in zip(curves, styles(len(curves))):
        label = name.removeprefix(prefix) if len(plot.y) == 1 else f"{name.removeprefix(prefix)}: {metric}"
        points = [(_value(r, plot.x), r["metrics"].get(metric)) for r in _complete(rows)]
        points = [p for p in points if isinstance(p[0], (int, float)) and not isinstance(p[0], bool) and p[1] is not None]
        if plot.kind == "scatter":
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=16, alpha=0.8, label=label,
                       color=style["color"], marker=style["marker"])
            drawn = set(points)
            numbered = [(_value(r, plot.x), r["metrics"].get(metric), r["number"]) for r in _complete(rows)]
            at = _same_points([p for p in numbered if (p[0], p[1]) in drawn])
            if len(at) <= MAX_LABELLED:  # which trial is which, without trials.csv
                for (x, y), numbers in at.items():
                    ax.annotate(_numbers(numbers), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7,
                                color=style["color"])
            continue
        groups: dict[float, list[float]] = {}
        for x, y in points:
            groups.setdefault(x, []).append(y)
        xs = sorted(groups)
        xs_seen.update(xs)
        ax.plot(xs, [sum(groups[x]) / len(groups[x]) for x in xs], label=label, **style)
    for k, baseline in enumerate(plot.baselines()):
        values = [r["metrics"][baseline] for rows in tables.values() for r in _complete(rows) if baseline in r["metrics"]]
        if values:
            ax.axhline(sum(values) / len(values), color="black", linestyle=("--", ":", "-.")[k % 3], linewidth=1,
                       label=f"{baseline} (mean)")
    if plot.log_x:
        ax.set_xscale("log", base=2)
        if plot.kind == "line" and xs_seen:
            ax.set_xticks(sorted(xs_seen), [f"{x:g}" for x in sorted(xs_seen)])
    if plot.log_y:
        ax.set_yscale("log")
    ax.set_xlabel(plot.x)
    suffixes = {m.rsplit(".", 1)[-1] for m in plot.y}
    ax.set_ylabel(plot.y[0] if len(plot.y) == 1 else suffixes.pop() if len(suffixes) == 1 else "metric")
    if plot.title:
        ax.set_title(plot.title)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, out / plot.file)
