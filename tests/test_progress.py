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


def test_a_long_step_writes_where_it_is_every_few_seconds_and_logs_it(tmp_path, capsys, monkeypatch, caplog):
    """Within a step, a line every EVERY seconds (here every unit) with the step, epoch and loss, the elapsed time and
    the rate, on stderr where it is not a terminal and in the log."""
    import logging
    import re

    from mase_lite.infra import progress

    monkeypatch.setenv("MASE_LITE_PROGRESS", "1")
    monkeypatch.setattr(progress, "EVERY", 0.0)
    spec = {**SPEC, "steps": [{"pass": "train", "params": {"epochs": 2, "max_steps": 3, "batch_size": 4}}],
            "output_dir": str(tmp_path / "run")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    with caplog.at_level(logging.INFO, logger="mase_lite.infra.progress"):
        assert main(["run", str(tmp_path / "spec.json")]) == 0
    ticks = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train: ")]
    assert [line.split(",")[0] for line in ticks] == ["train: step 1/3 (33 %)", "train: step 2/3 (66 %)",
                                                       "train: step 3/3 (100 %)"]
    assert all(re.fullmatch(r"train: step \d/3 \(\d+ %\), epoch [01], loss \d+\.\d{4}; \d+ s elapsed, [\d.e+-]+ step/s", t)
               for t in ticks), ticks
    assert [r.getMessage() for r in caplog.records if r.name == "mase_lite.infra.progress"] == ticks
