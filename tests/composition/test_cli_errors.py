"""User mistakes in a pipeline's paths end with one message and exit code 2, and leave no files behind."""

import json

import pytest

from mase_lite.cli import main

STEPS = {
    "save": [{"pass": "save", "params": {"path": "{blocker}/checkpoint"}}],
    "draw": [{"pass": "draw", "params": {"path": "{blocker}/graph.svg"}}],
    "report": [{"pass": "report", "params": {"path": "{blocker}/graph_report", "console": False}}],
}


def _spec(tmp_path, steps, output_dir):
    spec = {
        "name": "mistake",
        "model": {"factory": "tests.ir.models:small_cnn"},
        "example_inputs": {"x": {"shape": [2, 3, 8, 8]}},
        "data": None,
        "steps": steps,
        "output_dir": str(output_dir),
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("step", sorted(STEPS))
def test_step_path_under_a_file(tmp_path, capsys, step):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    steps = json.loads(json.dumps(STEPS[step]).replace("{blocker}", str(blocker)))
    out = tmp_path / "run"
    assert main(["run", str(_spec(tmp_path, steps, out))]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"mase-lite: error: steps.0.params.path: cannot create directory {str(blocker)!r} (File exists)"
    ]
    assert blocker.read_text() == "not a directory"
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]
    assert json.loads((out / "report.json").read_text())["status"] == "failed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "run", "spec.json"]


def test_output_dir_under_a_file(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["run", str(_spec(tmp_path, [{"pass": "count"}], blocker / "run"))]) == 2
    assert capsys.readouterr().err.strip() == (
        f"mase-lite: error: output_dir: cannot create directory {str(blocker / 'run')!r} (Not a directory)"
    )
