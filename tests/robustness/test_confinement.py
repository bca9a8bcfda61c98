"""A run reproduced from a report writes only inside its own output_dir: a recorded draw, report or save
step aimed elsewhere is refused before it writes, and nothing outside changes."""

import json

import pytest

from mase_lite.cli import main

BASE = {"data": None, "model": {"factory": "tests.robustness.nets:tiny"}, "example_inputs": {"input": {"shape": [2, 4]}}}


def _reproduce(tmp_path, steps, *flags):
    spec = {**BASE, "steps": steps, "output_dir": str(tmp_path / "run")}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"spec": spec, "versions": {}, "metrics": {}}))
    return main(["--plugin", "tests.robustness.nets", *flags, "run", str(report)])


@pytest.mark.parametrize("step, outside", [
    ({"pass": "draw", "params": {"path": "{outside}/pwned.svg"}}, "pwned.svg"),
    ({"pass": "report", "params": {"path": "../pwned_report", "console": False}}, "pwned_report.json"),
    ({"pass": "save", "params": {"path": "{outside}/checkpoint"}}, "checkpoint/recipe.json"),
])
def test_recorded_paths_outside_the_run_are_refused(tmp_path, capsys, step, outside):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "checkpoint").mkdir(parents=True)
    (elsewhere / "checkpoint" / "recipe.json").write_text("a checkpoint of someone else's")
    step = json.loads(json.dumps(step).replace("{outside}", str(elsewhere)))
    assert _reproduce(tmp_path, [step]) == 2
    err = capsys.readouterr().err
    assert f"steps.0.params.path: '{step['params']['path']}' lies outside the run's output_dir" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "report.json", "run"]
    assert [p.name for p in elsewhere.rglob("*")] == ["checkpoint", "recipe.json"]
    assert (elsewhere / "checkpoint" / "recipe.json").read_text() == "a checkpoint of someone else's"
    assert not (tmp_path / outside).exists()


def test_recorded_paths_inside_the_run_are_written(tmp_path):
    steps = [{"pass": "draw", "params": {"path": "drawings/g.dot"}}, {"pass": "save", "params": {"path": "ckpt"}}]
    assert _reproduce(tmp_path, steps) == 0
    assert (tmp_path / "run" / "drawings" / "g.dot").is_file() and (tmp_path / "run" / "ckpt" / "recipe.json").is_file()


def test_a_users_own_spec_writes_where_it_says(tmp_path):
    spec = {**BASE, "steps": [{"pass": "draw", "params": {"path": str(tmp_path / "mine.dot")}}], "output_dir": str(tmp_path / "run")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 0 and (tmp_path / "mine.dot").is_file()
