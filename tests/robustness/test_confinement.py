"""A run reproduced from a report writes only where the user's command says (--output-dir, else a new directory
beside the report), never to the directory the report records; a recorded draw, report or save step aimed elsewhere
is refused before it writes, and nothing outside changes."""

import json

import pytest

from mase_lite.cli import main

BASE = {"data": None, "model": {"factory": "tests.robustness.nets:tiny"}, "example_inputs": {"input": {"shape": [2, 4]}}}


def _reproduce(tmp_path, steps, *flags):
    spec = {**BASE, "steps": steps, "output_dir": str(tmp_path / "run")}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"spec": spec, "versions": {}, "metrics": {}}))
    return main(["--plugin", "tests.robustness.nets", "run", str(report), *flags])


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "report.json", "reproduced"]
    assert [p.name for p in elsewhere.rglob("*")] == ["checkpoint", "recipe.json"]
    assert (elsewhere / "checkpoint" / "recipe.json").read_text() == "a checkpoint of someone else's"
    assert not (tmp_path / outside).exists()


def test_recorded_paths_inside_the_run_are_written(tmp_path):
    steps = [{"pass": "draw", "params": {"path": "drawings/g.dot"}}, {"pass": "save", "params": {"path": "ckpt"}}]
    assert _reproduce(tmp_path, steps) == 0
    out = tmp_path / "reproduced"
    assert (out / "drawings" / "g.dot").is_file() and (out / "ckpt" / "recipe.json").is_file()
    assert _reproduce(tmp_path, steps, "--output-dir", str(tmp_path / "mine")) == 0
    assert (tmp_path / "mine" / "ckpt" / "recipe.json").is_file()


def test_a_foreign_report_naming_the_users_run_leaves_that_run_alone(tmp_path):
    """The report records the user's previous run as its output_dir: reproducing it writes a new directory beside
    the report, and the user's checkpoint is as it was."""
    mine = tmp_path / "my_run"
    (mine / "checkpoint").mkdir(parents=True)
    (mine / "checkpoint" / "recipe.json").write_text("my checkpoint")
    (mine / "report.json").write_text("my report")
    spec = {**BASE, "steps": [{"pass": "save", "params": {"path": "checkpoint"}}], "output_dir": str(mine)}
    (tmp_path / "foreign").mkdir()
    report = tmp_path / "foreign" / "report.json"
    report.write_text(json.dumps({"spec": spec, "versions": {}, "metrics": {}}))
    assert main(["--plugin", "tests.robustness.nets", "run", str(report)]) == 0
    assert (mine / "checkpoint" / "recipe.json").read_text() == "my checkpoint"
    assert (mine / "report.json").read_text() == "my report"
    assert (tmp_path / "foreign" / "reproduced" / "checkpoint" / "recipe.json").is_file()
    assert main(["--plugin", "tests.robustness.nets", "run", str(report)]) == 0
    assert (tmp_path / "foreign" / "reproduced-2" / "report.json").is_file()


def test_a_users_own_spec_writes_where_it_says(tmp_path):
    spec = {**BASE, "steps": [{"pass": "draw", "params": {"path": str(tmp_path / "mine.dot")}}], "output_dir": str(tmp_path / "run")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 0 and (tmp_path / "mine.dot").is_file()
