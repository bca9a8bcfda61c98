import copy
import json

import pytest

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.pipeline.runner import run_pipeline
from mase_lite.search.engine import flatten_metrics
from tests.search.conftest import TINY_PIPELINE, WIDTH, write_spec

PNG = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = open(path, "rb").read()
    assert data.startswith(PNG) and len(data) > 1000


def test_spec_errors_name_paths_and_exit_2(tmp_path, tiny_search, capsys):
    spec = tiny_search(
        space=[
            {"path": "steps.quantise.params.by", "type": "choice", "values": ["type"]},
            {"path": "steps.quantize.params.rulez", "type": "choice", "values": [{}]},
        ]
    )
    assert main(["search", str(write_spec(tmp_path, spec))]) == 2
    err = capsys.readouterr().err
    assert "space.0.path: steps.quantise: no step has this label or pass; steps: 0 train, 1 quantize, 2 avg_bits, 3 evaluate" in err
    assert "space.1.path: steps.quantize.params.rulez: pass 'quantize' has no parameter 'rulez'; its parameters: by, rules" in err

    spec = tiny_search(space=[{"path": WIDTH, "type": "choice", "values": [8, 2]}])
    assert main(["search", str(write_spec(tmp_path, spec))]) == 2
    err = capsys.readouterr().err
    assert "space.0.values.1 (steps.quantize.params.rules.linear.weight_width = 2)" in err
    assert "frac_width=4 must be <= width=2" in err and "values.0" not in err

    spec = tiny_search(space=[{"path": WIDTH, "type": "choise", "values": [8]}], n_trial=3)
    with pytest.raises(ml.UserError) as info:
        ml.run_search(spec)
    assert "space.0: Input tag 'choise' found using 'type' does not match any of the expected tags" in str(info.value)
    assert "n_trial: unknown key; allowed keys:" in str(info.value)
    assert not (tmp_path / "search").exists()


def test_grid_over_widths_matches_standalone_runs(tmp_path, tiny_search):
    result = ml.run_search(tiny_search())
    out = tmp_path / "search"
    report = json.loads((out / "search_report.json").read_text())
    trials = report["studies"][0]["trials"]
    assert sorted(t["params"][WIDTH] for t in trials) == [4, 8]
    assert all(t["state"] == "COMPLETE" for t in trials) and len(trials) == 2
    for t in trials:
        pipeline = copy.deepcopy(TINY_PIPELINE)
        pipeline["steps"][1]["params"]["rules"]["linear"]["weight_width"] = t["params"][WIDTH]
        path = write_spec(tmp_path, pipeline, f"standalone{t['number']}.json")
        assert main(["run", str(path), "--output-dir", str(tmp_path / f"run{t['number']}")]) == 0
        standalone = json.loads((tmp_path / f"run{t['number']}" / "report.json").read_text())["metrics"]
        metrics = {k: v for k, v in t["metrics"].items() if k != "trial.seconds"}
        assert metrics == flatten_metrics(standalone)  # the prefix cache (on by default) changes no figure
    # the shared prefix (train) ran once; the other trial restored it from the cache
    steps = [json.loads((out / "trials" / str(t["number"]) / "report.json").read_text())["steps"] for t in trials]
    assert sorted([s.get("cached", False) for s in run] for run in steps) == [[False] * 4, [True, False, False, False]]
    assert len(list((out / "cache").iterdir())) == 1
    # 4-bit weights cost fewer bits; the report names the best trial by the objective
    bits = {t["params"][WIDTH]: t["metrics"]["avg_bits.weights"] for t in trials}
    assert bits[4] < bits[8]
    best = min(trials, key=lambda t: t["values"][0])
    assert report["studies"][0]["best"]["number"] == best["number"]
    rows = (out / "trials.csv").read_text().splitlines()
    assert rows[0].startswith("study,number,state,") and len(rows) == 3
    for name in ("best_ptq.loss.png", f"ptq.loss_vs_{WIDTH}.png"):
        assert_png(out / name)
    assert result.report["studies"][0]["states"] == {"COMPLETE": 2}

    # rerunning continues the study: both trials are complete, so nothing runs again
    again = ml.run_search(tiny_search())
    assert len(again.report["studies"][0]["trials"]) == 2


def test_pareto_front_is_the_non_dominated_set(tmp_path, tiny_search):
    spec = tiny_search(
        space=[
            {"path": WIDTH, "type": "choice", "values": [5, 6, 8, 12]},
            {"path": "steps.quantize.params.rules.linear.data_in_width", "type": "choice", "values": [6, 12]},
        ],
        objectives=[
            {"metric": "ptq.loss", "direction": "minimize"},
            {"metric": "avg_bits.weights", "direction": "minimize"},
        ],
        sampler={"name": "random", "seed": 3},
        n_trials=4,
    )
    report = ml.run_search(spec).report
    trials = [t for t in report["studies"][0]["trials"] if t["state"] == "COMPLETE"]
    assert len(trials) == 4
    points = {t["number"]: (t["metrics"]["ptq.loss"], t["metrics"]["avg_bits.weights"]) for t in trials}
    expected = {
        n for n, (loss, bits) in points.items()
        if not any(l2 <= loss and b2 <= bits and (l2, b2) != (loss, bits) for l2, b2 in points.values())
    }
    assert {t["number"] for t in report["studies"][0]["pareto_front"]} == expected
    assert_png(tmp_path / "search" / "pareto.png")


def test_same_seed_gives_same_params_and_metrics(tmp_path, tiny_search):
    runs = []
    for k in range(2):
        spec = tiny_search(
            space=[{"path": WIDTH, "type": "int", "low": 4, "high": 12}],
            sampler={"name": "tpe", "seed": 7, "n_startup_trials": 1},
            n_trials=2,
            output_dir=str(tmp_path / f"s{k}"),
        )
        trials = ml.run_search(spec).report["studies"][0]["trials"]
        runs.append([(t["params"], {m: v for m, v in t["metrics"].items() if m != "trial.seconds"}) for t in trials])
    assert runs[0] == runs[1] and len(runs[0]) == 2


def test_failing_trial_is_recorded_and_the_study_goes_on(tmp_path, tiny_search):
    spec = tiny_search(
        space=[{"path": "model.hf_config.num_attention_heads", "type": "choice", "values": [2, 3]}],
        objectives=[{"metric": "ptq.accuracy"}],
    )
    report = ml.run_search(spec).report
    study = report["studies"][0]
    by_heads = {t["params"]["model.hf_config.num_attention_heads"]: t for t in study["trials"]}
    assert by_heads[2]["state"] == "COMPLETE"
    assert by_heads[3]["state"] == "FAIL" and "not a multiple of the number of attention heads (3)" in by_heads[3]["error"]
    assert study["best"]["number"] == by_heads[2]["number"]
