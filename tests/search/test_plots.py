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
