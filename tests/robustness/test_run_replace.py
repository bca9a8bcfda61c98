"""A run directory is replaced whole: a new run takes the old one's place only when complete (failed
runs included), a killed run leaves the previous one as it was, and a directory that is not a run's
is never replaced."""

import json
import os
import signal
import subprocess

from mase_lite.cli import main
from mase_lite.infra.lock import lock_path
from mase_lite.pipeline.runner import run_pipeline
from tests.robustness.waiting_run import start_waiting_run, wait_step


def _spec(tmp_path, name, steps, data=None):
    return {"name": name, "data": data, "model": {"factory": "tests.robustness.nets:tiny"},
            "example_inputs": {"input": {"shape": [2, 4]}}, "steps": steps, "output_dir": str(tmp_path / "out")}


def _write(tmp_path, spec):
    path = tmp_path / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    return str(path)


def _files(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _report(tmp_path):
    return json.loads((tmp_path / "out" / "report.json").read_text())


def _nodes(stem):
    return {"pass": "report", "params": {"path": stem, "console": False}}


def test_a_second_run_replaces_the_first_whole(tmp_path):
    run_pipeline(_spec(tmp_path, "first", [_nodes("first_nodes")]))
    assert sorted(_files(tmp_path / "out")) == ["first_nodes.json", "first_nodes.md", "report.json"]
    run_pipeline(_spec(tmp_path, "second", [_nodes("second_nodes")]))
    assert sorted(_files(tmp_path / "out")) == ["report.json", "second_nodes.json", "second_nodes.md"]
    assert _report(tmp_path)["name"] == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_tokenized_data_cache_is_kept_for_the_next_run(tmp_path, caplog):
    spec = _spec(tmp_path, "data", [], data={"dataset": "synthetic-sentiment", "n_train": 16, "n_test": 8, "max_length": 8})
    run_pipeline(spec)
    [cached] = (tmp_path / "out" / "data_cache").iterdir()
    before = cached.stat().st_ino
    caplog.set_level("INFO", logger="mase_lite.workloads.splits")
    run_pipeline(spec)
    assert (tmp_path / "out" / "data_cache" / cached.name).stat().st_ino == before
    assert f"tokenized data from the cache {tmp_path}/.out.staging-" in caplog.text


def test_a_killed_run_leaves_the_previous_run_untouched(tmp_path):
    run_pipeline(_spec(tmp_path, "before", [_nodes("nodes"), {"pass": "save", "params": {"path": "checkpoint"}}]))
    before = _files(tmp_path / "out")
    killed = _write(tmp_path, _spec(tmp_path, "killed", [_nodes("killed_nodes"), wait_step(tmp_path)]))
    proc = start_waiting_run(tmp_path, killed, stdout=subprocess.DEVNULL)
    try:
        [staging] = tmp_path.glob(f".out.staging-{proc.pid}-*")
        assert (staging / "killed_nodes.md").is_file()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert _files(tmp_path / "out") == before
    assert main(["run", _write(tmp_path, _spec(tmp_path, "after", []))]) == 0
    assert _report(tmp_path)["name"] == "after"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert not lock_path(tmp_path / "out").exists()


def test_a_failed_run_replaces_the_previous_one_and_names_the_final_directory(tmp_path, capsys):
    run_pipeline(_spec(tmp_path, "before", [_nodes("old_nodes")]))
    out = tmp_path / "out"
    steps = [_nodes("nodes"), {"pass": "save", "params": {"path": "nodes.json/checkpoint"}}]
    assert main(["run", _write(tmp_path, _spec(tmp_path, "failing", steps))]) == 2
    message = f"steps.1.params.path: cannot create directory {str(out / 'nodes.json')!r} (File exists)"
    assert capsys.readouterr().err.strip() == f"mase-lite: error: {message}"
    report = _report(tmp_path)
    assert (report["name"], report["status"], report["failed_step"]) == ("failing", "failed", "steps.1 (save)")
    assert report["error"] == f"UserError: {message}"
    assert sorted(_files(out)) == ["nodes.json", "nodes.md", "report.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failing.json", "out"]


def test_paths_in_the_report_name_the_final_directory(tmp_path):
    steps = [{"pass": "save", "params": {"path": "checkpoint"}}, {"pass": "load", "params": {"path": "checkpoint"}},
             {"pass": "draw", "params": {"path": "graph.dot"}, "draw_after": True}, _nodes("nodes")]
    result = run_pipeline(_spec(tmp_path, "paths", steps))
    out = tmp_path / "out"
    assert result.output_dir == out
    infos = [step["info"] for step in result.report["steps"]]
    assert [infos[0]["path"], infos[1]["path"], infos[2]["path"]] == [str(out / "checkpoint")] * 2 + [str(out / "graph.dot")]
    assert (infos[3]["markdown"], infos[3]["json"]) == (str(out / "nodes.md"), str(out / "nodes.json"))
    assert result.report["steps"][2]["drawing"] == str(out / "step02_draw.svg")
    assert _report(tmp_path)["steps"] == result.report["steps"]
    assert all((out / name).is_file() for name in ("graph.dot", "step02_draw.svg", "nodes.md", "checkpoint/recipe.json"))
    assert ".staging-" not in (out / "report.json").read_text()


def test_a_directory_that_is_not_a_run_is_never_replaced(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["run", _write(tmp_path, _spec(tmp_path, "refused", []))]) == 2
    assert capsys.readouterr().err.strip() == (
        f"mase-lite: error: output_dir: {out} exists and is not a run directory (no report.json in it); "
        "a run replaces its output_dir whole, so choose a new or empty directory, or move this one away"
    )
    assert _files(out) == {"notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "refused.json"]


def test_the_working_directory_is_never_an_output_dir(tmp_path, capsys, monkeypatch):
    (tmp_path / "report.json").write_text("{}")
    spec = _write(tmp_path, _spec(tmp_path, "here", []))
    monkeypatch.chdir(tmp_path)
    assert main(["run", spec, "--output-dir", "."]) == 2
    assert capsys.readouterr().err.strip() == (
        "mase-lite: error: output_dir: '.' is or contains the current directory; choose a directory inside it"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here.json", "report.json"]
