"""Search plots (matplotlib, Agg): best-so-far per objective, the Pareto front, metric versus a swept
parameter. Every plot overlays the studies of one search, one curve each; each curve has its own colour
*and* marker (and line style past twenty), and the legend sits outside the axes, so any number of
curves stays readable.

Example::

    paths = best_so_far(tables, objectives, Path("runs/s"))    # runs/s/best_<metric>.png
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from mase_lite.files import staged_file  # noqa: E402


_MARKERS = "osD^vP*X<>hp"
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
            xs, ys, best = [], [], None
            for r in sorted(_complete(rows), key=lambda r: r["number"]):
                value = r["metrics"].get(obj.metric)
                if value is None:
                    continue
                best = value if best is None else pick(best, value)
                xs.append(r["number"])
                ys.append(best)
            ax.step(xs, ys, where="post", markersize=4, label=name.removeprefix(prefix), **style)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("trial")
        ax.set_ylabel(f"best {obj.metric} so far")
        ax.grid(alpha=0.3)
        _legend(ax)
        paths.append(_save(fig, out / f"best_{_slug(obj.metric)}.png"))
    return paths


def pareto(tables: dict[str, list[dict]], fronts: dict[str, list[int]], objectives: list, out: Path) -> Path:
    """The first two objectives of every complete trial, with each study's front drawn as a line."""
    x_metric, y_metric = objectives[0].metric, objectives[1].metric
    fig, ax = plt.subplots(figsize=(6, 4))
    prefix = _common_prefix(list(tables))
    for (name, rows), style in zip(tables.items(), styles(len(tables))):
        name = name.removeprefix(prefix)
        points = [(r["metrics"].get(x_metric), r["metrics"].get(y_metric), r["number"]) for r in _complete(rows)]
        points = [p for p in points if p[0] is not None and p[1] is not None]
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=14, alpha=0.45, color=style["color"],
                   marker=style["marker"], label=f"{name} trials")
        front = sorted((p for p in points if p[2] in set(fronts.get(name, []))), key=lambda p: p[0])
        ax.plot([p[0] for p in front], [p[1] for p in front], label=f"{name} front", **style)
    ax.set_xlabel(f"{x_metric} ({objectives[0].direction})")
    ax.set_ylabel(f"{y_metric} ({objectives[1].direction})")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, out / "pareto.png")


def metric_vs_param(tables: dict[str, list[dict]], param: str, objectives: list, out: Path) -> list[Path]:
    """For a sweep over one parameter: each objective versus that parameter, a curve per study."""
    paths = []
    for obj in objectives:
        fig, ax = plt.subplots(figsize=(6, 4))
        prefix = _common_prefix(list(tables))
        for (name, rows), style in zip(tables.items(), styles(len(tables))):
            points = sorted(
                (r["params"][param], r["metrics"][obj.metric])
                for r in _complete(rows)
                if param in r["params"] and obj.metric in r["metrics"] and isinstance(r["params"][param], (int, float))
            )
            ax.plot([p[0] for p in points], [p[1] for p in points], label=name.removeprefix(prefix), **style)
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
