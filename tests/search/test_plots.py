"""Every plot stays readable with many curves: each curve has its own colour and marker, and the legend
sits right of the axes, never over the data (lab 3 draws thirteen studies)."""

import random
from pathlib import Path

import pytest

from mase_lite.search import plots
from mase_lite.search.spec import Objective, PlotSpec


def _tables(n: int) -> dict[str, list[dict]]:
    rng = random.Random(0)
    return {
        f"lab3.format{k}": [
            {"number": t, "state": "COMPLETE", "params": {"width": 4 + 2 * t},
             "metrics": {"acc": rng.random(), "bits": 4 + 2 * t + rng.random()}}
            for t in range(4)
        ]
        for k in range(n)
    }


@pytest.fixture
def figures(monkeypatch):
    kept = []
    monkeypatch.setattr(plots.plt, "close", kept.append)  # keep each figure for a look after it is saved
    return kept


def _check(fig, curves: int) -> None:
    (ax,) = fig.axes
    fig.canvas.draw()
    legend = ax.get_legend()
    assert legend is not None and len(legend.get_texts()) >= curves
    renderer = fig.canvas.get_renderer()
    assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # outside, to the right
    looks = {(str(h.get_color()), h.get_marker(), h.get_linestyle()) for h in ax.get_lines()}
    assert len(looks) == len(ax.get_lines()) >= curves


@pytest.mark.parametrize("n", [1, 13, 25])
def test_each_plot_tells_every_curve_apart(tmp_path, figures, n):
    tables = _tables(n)
    objectives = [Objective(metric="acc"), Objective(metric="bits", direction="minimize")]
    paths = plots.best_so_far(tables, objectives[:1], tmp_path)
    paths += plots.metric_vs_param(tables, "width", objectives[:1], tmp_path)
    paths.append(plots.pareto(tables, {name: [0, 1] for name in tables}, objectives, tmp_path))
    paths.append(plots.requested(tables, PlotSpec(x="bits", y=["acc"], file="acc_vs_bits.png"), tmp_path))
    assert all(Path(p).read_bytes().startswith(b"\x89PNG") for p in paths)
    for fig in figures:
        _check(fig, n)


def test_every_docs_plot_is_regenerated_by_the_labs_script():
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("labs_script", root / "benchmarks" / "labs.py")
    labs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(labs)
    shown = {target for plots_of in labs.PLOTS.values() for target in plots_of.values()}
    assert shown == {p.name for p in (root / "docs" / "labs").glob("*.png")}
    assert all((root / "pipelines" / "labs" / f"{lab}.json").is_file() for lab in labs.PLOTS)


def _rows(points):
    return [{"number": n, "state": "COMPLETE", "params": params, "metrics": metrics} for n, (params, metrics) in enumerate(points)]


def test_a_swept_number_format_is_drawn_over_its_values_each_labelled_by_what_differs(tmp_path, figures):
    formats = [{"weight": {"name": "scaled_integer", "width": w, "granularity": "group"}} for w in (4, 3)]
    formats.append({"weight": {"name": "scaled_integer", "width": 8, "granularity": "channel"},
                    "data_in": {"name": "scaled_integer", "width": 8}})
    tables = {"s": _rows([({"format": f}, {"ppl": 14.0 + k}) for k, f in enumerate(formats)])}
    plots.metric_vs_param(tables, "format", [Objective(metric="ppl", direction="minimize")], tmp_path)
    (fig,) = figures
    (ax,) = fig.axes
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [0, 1, 2] and list(line.get_ydata()) == [14.0, 15.0, 16.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "weight.width=4, weight.granularity=group",  # what a format does not set is not shown
        "weight.width=3, weight.granularity=group",
        "weight.width=8, weight.granularity=channel, data_in.name=scaled_integer, data_in.width=8"]


def test_the_pareto_plot_names_its_trials_and_is_not_squeezed_by_a_far_off_one(tmp_path, figures):
    points = [(4, 0.80), (6, 0.85), (6, 0.85), (8, 0.88), (32, 0.5), (5, 0.79)]
    tables = {"s": _rows([({}, {"bits": b, "acc": a}) for b, a in points])}
    objectives = [Objective(metric="bits", direction="minimize"), Objective(metric="acc")]
    plots.pareto(tables, {"s": [0, 1, 2, 3]}, objectives, tmp_path)
    (fig,) = figures
    (ax,) = fig.axes
    assert sorted(t.get_text() for t in ax.texts) == ["#0", "#1 #2 (2 trials)", "#3"]
    assert ax.get_xlim()[1] < 32 and ax.get_ylim()[0] > 0.5  # trial 4 left out of the view, and said so
    assert ax.get_title() == "1 trial lies far from the fronts, outside the axes (see trials.csv)"
    assert ax.get_xlim()[0] < 4 < 8 < ax.get_xlim()[1] and ax.get_ylim()[0] < 0.79  # trial 5 (near) still shown


def test_best_so_far_shows_every_trial_beside_the_running_best(tmp_path, figures):
    tables = {"s": _rows([({}, {"acc": a}) for a in (0.5, 0.9, 0.7, 0.95)])}
    plots.best_so_far(tables, [Objective(metric="acc")], tmp_path)
    (fig,) = figures
    (ax,) = fig.axes
    (best,) = ax.get_lines()
    assert list(best.get_ydata()) == [0.5, 0.9, 0.9, 0.95]
    (each,) = ax.collections
    assert each.get_offsets().tolist() == [[0, 0.5], [1, 0.9], [2, 0.7], [3, 0.95]]


def test_a_requested_scatter_names_its_trials(tmp_path, figures):
    tables = {"s": _rows([({}, {"bits": b, "acc": a}) for b, a in [(4, 0.8), (8, 0.9), (8, 0.9)]])}
    plots.requested(tables, PlotSpec(x="bits", y=["acc"], kind="scatter", file="x.png"), tmp_path)
    (fig,) = figures
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["#0", "#1 #2 (2 trials)"]
