"""One run per output directory: a second run on it while the first is alive exits 2 naming the
first's pid; a lock left by a killed run is taken over; the lock file (beside the directory) goes when the run ends."""

import json
import subprocess
import sys

from mase_lite.cli import main
from mase_lite.infra.lock import lock_path
from tests.robustness.waiting_run import start_waiting_run, wait_step
from tests.conftest import PATIENCE


def _spec(tmp_path, name, steps):
    spec = {"name": name, "data": None, "model": {"factory": "tests.robustness.nets:tiny"},
            "example_inputs": {"input": {"shape": [2, 4]}}, "steps": steps, "output_dir": str(tmp_path / "out")}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_two_concurrent_runs_on_one_directory(tmp_path, capsys):
    first = _spec(tmp_path, "first", [wait_step(tmp_path)])
    second = _spec(tmp_path, "second", [])
    proc = start_waiting_run(tmp_path, first)
    try:
        assert main(["run", second]) == 2
        err = capsys.readouterr().err
        assert f"output_dir: {tmp_path / 'out'} is in use by another run (pid {proc.pid}); wait for it to finish" in err
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=PATIENCE)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (report["name"], report["metrics"]) == ("first", {"wait_for_go": {"waited": True}})
    assert not lock_path(tmp_path / "out").exists()
    assert main(["run", second]) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["name"] == "second"


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    (tmp_path / "out").mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock_path(tmp_path / "out").write_text(dead.stdout.strip())
    assert main(["run", _spec(tmp_path, "after", [])]) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["status"] == "ok"
    assert not lock_path(tmp_path / "out").exists()
