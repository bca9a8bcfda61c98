"""Progress of a command whose output is not a terminal: one line per step when it starts and when it ends, on stderr,
the error last; none with --quiet or MASE_LITE_PROGRESS=0."""

import json

from mase_lite.cli import main

SPEC = {"name": "lines", "model": {"task": "image-classification", "hf_config": {"model_type": "resnet",
        "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]}}, "data": {"n_train": 8, "n_test": 8,
        "image_size": 8}, "steps": [{"pass": "count"}, {"pass": "evaluate", "params": {"progress": True}}]}


def test_one_line_per_step_then_none_when_quiet(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MASE_LITE_PROGRESS", "1")
    (tmp_path / "spec.json").write_text(json.dumps({**SPEC, "output_dir": str(tmp_path / "run")}))
    assert main(["run", str(tmp_path / "spec.json")]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "lines: steps.0 (count) of 2 ..." and lines[-1].startswith("lines: steps.1 (evaluate) done in ")
    assert len(lines) == 4
    assert main(["--quiet", "run", str(tmp_path / "spec.json")]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("MASE_LITE_PROGRESS", "0")
    assert main(["run", str(tmp_path / "spec.json")]) == 0
    assert capsys.readouterr().err == ""


def test_an_error_comes_last(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MASE_LITE_PROGRESS", "1")
    spec = {**SPEC, "steps": [{"pass": "count"}, {"pass": "save", "params": {"path": "/proc/nope/x"}}],
            "output_dir": str(tmp_path / "run")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "lines: steps.0 (count) of 2 ..." and lines[-1].startswith("mase-lite: error: steps.1")
